#include "client_memory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace droce::provider {
namespace {

constexpr uint64_t kPage = 4096;

struct Vma {
  uint64_t start = 0, end = 0, offset = 0, inode = 0;
  unsigned dev_major = 0, dev_minor = 0;
  int prot = 0;
  bool shared = false;
  std::string path;
};

// The mappings overlapping [lo, hi), in address order.
std::vector<Vma> vmas_in(uint64_t lo, uint64_t hi) {
  std::vector<Vma> out;
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return out;
  char line[4096];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    Vma v;
    char perms[8] = {};
    int path_at = 0;
    if (std::sscanf(line, "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64 " %x:%x %" SCNu64 " %n", &v.start, &v.end, perms,
                    &v.offset, &v.dev_major, &v.dev_minor, &v.inode, &path_at) < 7) {
      continue;
    }
    if (v.end <= lo || v.start >= hi) continue;
    v.prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) | (perms[2] == 'x' ? PROT_EXEC : 0);
    v.shared = perms[3] == 's';
    v.path = line + path_at;
    while (!v.path.empty() && (v.path.back() == '\n' || v.path.back() == ' ')) v.path.pop_back();
    out.push_back(v);
  }
  std::fclose(f);
  return out;
}

// A range of private pages moved onto a memfd by this module.
struct Chunk {
  uint64_t start = 0, len = 0;
  int fd = -1;
  uint64_t inode = 0;
  uint32_t refs = 0;
};

std::mutex g_mu;
std::map<uint64_t, Chunk> g_chunks;  // by inode

// Copies whole pages of this process with the kernel (process_vm_readv on
// ourselves, as a raw system call): the pages around a registered buffer
// are copied too, and they may hold what a sanitizer's interceptors would
// call out of bounds (malloc's redzones).
bool copy_pages(void* dst, const void* src, size_t len) {
  iovec local{dst, len}, remote{const_cast<void*>(src), len};
  return syscall(SYS_process_vm_readv, getpid(), &local, 1ul, &remote, 1ul, 0ul) == static_cast<long>(len);
}

// Runs fn on another thread while the calling one waits. Moving pages copies
// them and then maps the copy over them; if they hold the calling thread's
// stack (a registered stack buffer), whatever that thread pushed between
// the copy and the mapping (a return address) would be lost. A thread
// blocked in join pushes nothing.
template <typename Fn>
void off_this_stack(Fn fn) {
  std::thread t(fn);
  t.join();
}

bool remap_allowed() {
  const char* v = std::getenv("DROCE_REMAP");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// Moves [start, start+len) (private, `prot`) onto a new sealed memfd mapped
// at the same address. The pages are copied first: a thread writing them
// during the copy would lose that write (docs/ARCHITECTURE.md).
Chunk* move_pages(uint64_t start, uint64_t len, int prot) {
  const int fd = memfd_create("droce-mr", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return nullptr;
  auto fail = [&] {
    close(fd);
    return nullptr;
  };
  if (ftruncate(fd, static_cast<off_t>(len)) != 0) return fail();
  // Unreadable pages (PROT_NONE) cannot be copied: not movable.
  if ((prot & PROT_READ) == 0) return fail();
  void* tmp = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (tmp == MAP_FAILED) return fail();
  const bool copied = copy_pages(tmp, reinterpret_cast<void*>(start), len);
  munmap(tmp, len);
  if (!copied) return fail();
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) return fail();
  if (mmap(reinterpret_cast<void*>(start), len, prot, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) return fail();
  // rdma-core's fork support: registered pages are not inherited.
  madvise(reinterpret_cast<void*>(start), len, MADV_DONTFORK);
  struct stat st;
  fstat(fd, &st);
  Chunk c;
  c.start = start;
  c.len = len;
  c.fd = fd;
  c.inode = st.st_ino;
  return &(g_chunks[c.inode] = c);
}

// Moves a chunk's pages that are still mapped from it back to private
// anonymous memory (its last registration went), and forgets it.
void restore_chunk(Chunk& c) {
  for (const Vma& v : vmas_in(c.start, c.start + c.len)) {
    if (!v.shared || v.inode != c.inode) continue;  // unmapped or replaced by the application meanwhile
    const uint64_t len = v.end - v.start;
    void* tmp = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (tmp == MAP_FAILED) continue;  // stays shared: still correct for this process
    if (!copy_pages(tmp, reinterpret_cast<void*>(v.start), len)) {
      munmap(tmp, len);
      continue;  // stays shared: still correct for this process
    }
    if (v.prot != (PROT_READ | PROT_WRITE)) mprotect(tmp, len, v.prot);
    if (mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(v.start)) == MAP_FAILED) {
      munmap(tmp, len);
    }
  }
  close(c.fd);
  g_chunks.erase(c.inode);
}

// The fd of a shared memfd mapping, if this process still holds one, sealed
// against shrinking; -1 if there is none or it cannot be sealed.
int shared_fd(const Vma& v) {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int found = -1;
  while (dirent* e = readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd == dirfd(d)) continue;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_ino != v.inode || major(st.st_dev) != v.dev_major ||
        minor(st.st_dev) != v.dev_minor) {
      continue;
    }
    const int seals = fcntl(fd, F_GET_SEALS);
    if (seals >= 0 && ((seals & F_SEAL_SHRINK) || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0)) found = fd;
    break;
  }
  closedir(d);
  return found;
}

}  // namespace

absl::StatusOr<Registration> PrepareMemory(uint64_t addr, uint64_t len) {
  Registration r;
  if (!remap_allowed() || len == 0) return r;  // tier C
  const uint64_t lo = addr & ~(kPage - 1), hi = (addr + len + kPage - 1) & ~(kPage - 1);
  std::lock_guard<std::mutex> l(g_mu);
  const std::vector<Vma> vmas = vmas_in(lo, hi);
  // The pages must be mapped without holes.
  uint64_t at = lo;
  for (const Vma& v : vmas) {
    if (v.start > at) return absl::InvalidArgumentError("the range is not mapped");
    at = v.end;
  }
  if (at < hi || vmas.empty()) return absl::InvalidArgumentError("the range is not mapped");
  bool moved = false;
  std::vector<Chunk*> taken;
  auto fail_copy = [&] {
    // Whatever cannot be mapped goes to tier C; undo the references taken.
    for (Chunk* c : taken) {
      if (--c->refs == 0) off_this_stack([&] { restore_chunk(*c); });
    }
    return Registration{};
  };
  for (const Vma& v : vmas) {
    const uint64_t s = std::max(v.start, lo), e = std::min(v.end, hi);
    ctl::Piece p{};
    p.start = s;
    p.len = e - s;
    int fd = -1;
    auto chunk = g_chunks.find(v.inode);
    if (v.shared && v.inode != 0 && chunk != g_chunks.end() && v.start >= chunk->second.start &&
        v.end <= chunk->second.start + chunk->second.len) {
      Chunk& c = chunk->second;
      fd = c.fd;
      p.offset = s - c.start;
      ++c.refs;
      taken.push_back(&c);
      moved = true;
    } else if (v.shared) {
      fd = v.path.starts_with("/memfd:") ? shared_fd(v) : -1;
      if (fd < 0) return fail_copy();
      p.offset = v.offset + (s - v.start);
    } else {
      Chunk* c = nullptr;
      off_this_stack([&] { c = move_pages(s, e - s, v.prot); });
      if (c == nullptr) return fail_copy();
      c->refs = 1;
      taken.push_back(c);
      fd = c->fd;
      p.offset = 0;
      moved = true;
    }
    // One fd per piece, merged with the previous piece when contiguous in it.
    if (!r.pieces.empty() && r.fds[r.pieces.back().fd] == fd &&
        r.pieces.back().offset + r.pieces.back().len == p.offset) {
      r.pieces.back().len += p.len;
      continue;
    }
    if (r.pieces.size() == ctl::kMaxPieces) return fail_copy();
    p.fd = static_cast<uint32_t>(r.fds.size());
    r.fds.push_back(fd);
    r.pieces.push_back(p);
  }
  r.tier = moved ? ctl::kTierMoved : ctl::kTierShared;
  for (Chunk* c : taken) r.chunks.push_back(c->inode);
  return r;
}

void ReleaseMemory(const Registration& r) {
  std::lock_guard<std::mutex> l(g_mu);
  for (uint64_t inode : r.chunks) {
    auto it = g_chunks.find(inode);
    if (it != g_chunks.end() && --it->second.refs == 0) off_this_stack([&] { restore_chunk(it->second); });
  }
}

}  // namespace droce::provider
