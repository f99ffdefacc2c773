#include "lab/pcapng.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace droce::lab {
namespace {

constexpr uint32_t kShb = 0x0A0D0D0A;
constexpr uint32_t kIdb = 0x00000001;
constexpr uint32_t kEpb = 0x00000006;
constexpr uint32_t kByteOrderMagic = 0x1A2B3C4D;
constexpr uint16_t kLinkEthernet = 1;  // LINKTYPE_ETHERNET
constexpr uint16_t kOptEnd = 0, kOptComment = 1;
constexpr uint16_t kShbUserAppl = 4;
constexpr uint16_t kIfName = 2, kIfDescription = 3, kIfTsresol = 9;
constexpr uint16_t kEpbFlags = 2;

constexpr size_t Padded(size_t n) { return (n + 3) & ~size_t{3}; }
// An option's bytes in a block: code, length, value padded to 32 bits.
constexpr size_t OptionSize(size_t n) { return 4 + Padded(n); }

}  // namespace

absl::StatusOr<std::unique_ptr<PcapngWriter>> PcapngWriter::Create(const std::string& path,
                                                                   const std::vector<PcapngInterface>& ifs) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0640);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  std::unique_ptr<PcapngWriter> w(new PcapngWriter());
  w->f_ = fdopen(fd, "wb");
  if (w->f_ == nullptr) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  // Frames are written by the workers: a large buffer keeps them to one
  // write(2) per 256 KiB.
  std::setvbuf(w->f_, nullptr, _IOFBF, 256 * 1024);
  const std::string_view appl = "droce";
  const uint32_t shb_len = static_cast<uint32_t>(28 + OptionSize(appl.size()) + 4);
  const uint32_t shb[4] = {kShb, shb_len, kByteOrderMagic, 0x00000001};  // major 1, minor 0 (LE halves)
  w->Put(shb, sizeof(shb));
  const int64_t section_len = -1;  // unknown
  w->Put(&section_len, sizeof(section_len));
  w->Option(kShbUserAppl, appl);
  w->Option(kOptEnd, {});
  w->Put(&shb_len, 4);
  for (const PcapngInterface& i : ifs) {
    const uint8_t tsresol = 9;  // 10^-9 s
    const uint32_t len = static_cast<uint32_t>(
        20 + OptionSize(i.name.size()) + (i.description.empty() ? 0 : OptionSize(i.description.size())) +
        OptionSize(1) + 4);
    const uint32_t head[2] = {kIdb, len};
    w->Put(head, sizeof(head));
    const uint16_t lt[2] = {kLinkEthernet, 0};
    w->Put(lt, sizeof(lt));
    w->Put(&i.snaplen, 4);
    w->Option(kIfName, i.name);
    if (!i.description.empty()) w->Option(kIfDescription, i.description);
    w->Option(kIfTsresol, std::string_view(reinterpret_cast<const char*>(&tsresol), 1));
    w->Option(kOptEnd, {});
    w->Put(&len, 4);
    w->snaplens_.push_back(i.snaplen == 0 ? UINT32_MAX : i.snaplen);
  }
  if (w->failed_) return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  return w;
}

PcapngWriter::~PcapngWriter() {
  if (f_ != nullptr) std::fclose(f_);
}

void PcapngWriter::Put(const void* p, size_t n) {
  if (failed_) return;
  if (std::fwrite(p, 1, n, f_) != n) failed_ = true;
  bytes_ += n;
}

void PcapngWriter::Pad(size_t n) {
  static constexpr uint8_t kZero[4] = {};
  if (Padded(n) != n) Put(kZero, Padded(n) - n);
}

void PcapngWriter::Option(uint16_t code, std::string_view value) {
  const uint16_t h[2] = {code, static_cast<uint16_t>(value.size())};
  Put(h, sizeof(h));
  Put(value.data(), value.size());
  Pad(value.size());
}

bool PcapngWriter::Packet(uint32_t iface, uint64_t ts_ns, std::span<const uint8_t> data, uint32_t orig_len,
                          PcapngDir dir, std::string_view comment) {
  if (failed_ || iface >= snaplens_.size()) return false;
  const size_t cap = std::min<size_t>(data.size(), snaplens_[iface]);
  // An option's length is 16 bits.
  if (comment.size() > 0xFFF0) comment = comment.substr(0, 0xFFF0);
  const bool has_opts = dir != PcapngDir::kUnknown || !comment.empty();
  const uint32_t len = static_cast<uint32_t>(
      32 + Padded(cap) +
      (has_opts ? (comment.empty() ? 0 : OptionSize(comment.size())) +
                      (dir == PcapngDir::kUnknown ? 0 : OptionSize(4)) + 4
                : 0));
  const uint32_t head[7] = {kEpb,
                            len,
                            iface,
                            static_cast<uint32_t>(ts_ns >> 32),
                            static_cast<uint32_t>(ts_ns),
                            static_cast<uint32_t>(cap),
                            orig_len};
  Put(head, sizeof(head));
  Put(data.data(), cap);
  Pad(cap);
  if (has_opts) {
    if (!comment.empty()) Option(kOptComment, comment);
    if (dir != PcapngDir::kUnknown) {
      const uint32_t flags = static_cast<uint32_t>(dir);  // bits 0-1: inbound 1, outbound 2
      Option(kEpbFlags, std::string_view(reinterpret_cast<const char*>(&flags), 4));
    }
    Option(kOptEnd, {});
  }
  Put(&len, 4);
  return !failed_;
}

bool PcapngWriter::Flush() {
  if (!failed_ && std::fflush(f_) != 0) failed_ = true;
  return !failed_;
}

}  // namespace droce::lab
