#include "wire/opcode.h"

#include <array>

namespace droce::wire {
namespace {

struct Entry {
  uint8_t op;
  const char* name;
  uint32_t mask;
};

// Header order after the BTH (IBA 9.2): XRCETH, DETH, RETH, AtomicETH,
// AETH, AtomicAckETH, ImmDt, IETH, payload.
constexpr OpcodeInfo make(const char* name, uint32_t mask) {
  OpcodeInfo i{name, mask, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  unsigned off = kBthLen;
  if (mask & kMaskXrceth) { i.xrceth = static_cast<uint8_t>(off); off += kXrcEthLen; }
  if (mask & kMaskDeth) { i.deth = static_cast<uint8_t>(off); off += kDethLen; }
  if (mask & kMaskReth) { i.reth = static_cast<uint8_t>(off); off += kRethLen; }
  if (mask & kMaskAtomicEth) { i.atomic_eth = static_cast<uint8_t>(off); off += kAtomicEthLen; }
  if (mask & kMaskAeth) { i.aeth = static_cast<uint8_t>(off); off += kAethLen; }
  if (mask & kMaskAtomicAckEth) { i.atomic_ack_eth = static_cast<uint8_t>(off); off += kAtomicAckEthLen; }
  if (mask & kMaskImmDt) { i.immdt = static_cast<uint8_t>(off); off += kImmDtLen; }
  if (mask & kMaskIeth) { i.ieth = static_cast<uint8_t>(off); off += kIethLen; }
  i.length = static_cast<uint8_t>(off);
  i.payload = static_cast<uint8_t>(off);
  return i;
}

constexpr uint32_t kSendReq = kMaskSend | kMaskRequest | kMaskPayload | kMaskRecvWqe;
constexpr uint32_t kWriteReq = kMaskWrite | kMaskRequest | kMaskPayload;
constexpr uint32_t kReadResp = kMaskRead | kMaskResponse | kMaskPayload;

constexpr Entry kEntries[] = {
    {kRcSendFirst, "RC_SEND_FIRST", kSendReq | kMaskFirst},
    {kRcSendMiddle, "RC_SEND_MIDDLE", kSendReq | kMaskMiddle},
    {kRcSendLast, "RC_SEND_LAST", kSendReq | kMaskLast},
    {kRcSendLastImm, "RC_SEND_LAST_WITH_IMMEDIATE", kSendReq | kMaskLast | kMaskImmDt},
    {kRcSendOnly, "RC_SEND_ONLY", kSendReq | kMaskOnly},
    {kRcSendOnlyImm, "RC_SEND_ONLY_WITH_IMMEDIATE", kSendReq | kMaskOnly | kMaskImmDt},
    {kRcWriteFirst, "RC_RDMA_WRITE_FIRST", kWriteReq | kMaskFirst | kMaskReth},
    {kRcWriteMiddle, "RC_RDMA_WRITE_MIDDLE", kWriteReq | kMaskMiddle},
    {kRcWriteLast, "RC_RDMA_WRITE_LAST", kWriteReq | kMaskLast},
    {kRcWriteLastImm, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
     kWriteReq | kMaskLast | kMaskImmDt | kMaskRecvWqe},
    {kRcWriteOnly, "RC_RDMA_WRITE_ONLY", kWriteReq | kMaskOnly | kMaskReth},
    {kRcWriteOnlyImm, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
     kWriteReq | kMaskOnly | kMaskReth | kMaskImmDt | kMaskRecvWqe},
    {kRcReadRequest, "RC_RDMA_READ_REQUEST", kMaskRead | kMaskRequest | kMaskOnly | kMaskReth},
    {kRcReadResponseFirst, "RC_RDMA_READ_RESPONSE_FIRST", kReadResp | kMaskFirst | kMaskAeth},
    {kRcReadResponseMiddle, "RC_RDMA_READ_RESPONSE_MIDDLE", kReadResp | kMaskMiddle},
    {kRcReadResponseLast, "RC_RDMA_READ_RESPONSE_LAST", kReadResp | kMaskLast | kMaskAeth},
    {kRcReadResponseOnly, "RC_RDMA_READ_RESPONSE_ONLY", kReadResp | kMaskOnly | kMaskAeth},
    {kRcAck, "RC_ACKNOWLEDGE", kMaskResponse | kMaskOnly | kMaskAeth},
    {kRcAtomicAck, "RC_ATOMIC_ACKNOWLEDGE",
     kMaskResponse | kMaskAtomic | kMaskOnly | kMaskAeth | kMaskAtomicAckEth},
    {kRcCompareSwap, "RC_COMPARE_SWAP", kMaskAtomic | kMaskRequest | kMaskOnly | kMaskAtomicEth},
    {kRcFetchAdd, "RC_FETCH_ADD", kMaskAtomic | kMaskRequest | kMaskOnly | kMaskAtomicEth},
    {kRcSendLastInv, "RC_SEND_LAST_WITH_INVALIDATE", kSendReq | kMaskLast | kMaskIeth},
    {kRcSendOnlyInv, "RC_SEND_ONLY_WITH_INVALIDATE", kSendReq | kMaskOnly | kMaskIeth},
    {kRcAtomicWrite, "RC_ATOMIC_WRITE", kWriteReq | kMaskOnly | kMaskReth | kMaskAtomicWrite},
    {kUcSendFirst, "UC_SEND_FIRST", kSendReq | kMaskFirst},
    {kUcSendMiddle, "UC_SEND_MIDDLE", kSendReq | kMaskMiddle},
    {kUcSendLast, "UC_SEND_LAST", kSendReq | kMaskLast},
    {kUcSendLastImm, "UC_SEND_LAST_WITH_IMMEDIATE", kSendReq | kMaskLast | kMaskImmDt},
    {kUcSendOnly, "UC_SEND_ONLY", kSendReq | kMaskOnly},
    {kUcSendOnlyImm, "UC_SEND_ONLY_WITH_IMMEDIATE", kSendReq | kMaskOnly | kMaskImmDt},
    {kUcWriteFirst, "UC_RDMA_WRITE_FIRST", kWriteReq | kMaskFirst | kMaskReth},
    {kUcWriteMiddle, "UC_RDMA_WRITE_MIDDLE", kWriteReq | kMaskMiddle},
    {kUcWriteLast, "UC_RDMA_WRITE_LAST", kWriteReq | kMaskLast},
    {kUcWriteLastImm, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
     kWriteReq | kMaskLast | kMaskImmDt | kMaskRecvWqe},
    {kUcWriteOnly, "UC_RDMA_WRITE_ONLY", kWriteReq | kMaskOnly | kMaskReth},
    {kUcWriteOnlyImm, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
     kWriteReq | kMaskOnly | kMaskReth | kMaskImmDt | kMaskRecvWqe},
    {kUdSendOnly, "UD_SEND_ONLY", kSendReq | kMaskOnly | kMaskDeth},
    {kUdSendOnlyImm, "UD_SEND_ONLY_WITH_IMMEDIATE", kSendReq | kMaskOnly | kMaskDeth | kMaskImmDt},
    {kCnp, "CNP", kMaskCnp},
};

// XRC (IBA 9.2 table 35, transport 101b): every RC operation but ATOMIC
// WRITE (IBA 1.5 defines it for RC and RD only), named as Wireshark names
// them; requests gain the XRCETH.
constexpr Entry kXrcEntries[] = {
    {kXrcBase | kRcSendFirst, "XRC_SEND_FIRST", 0},
    {kXrcBase | kRcSendMiddle, "XRC_SEND_MIDDLE", 0},
    {kXrcBase | kRcSendLast, "XRC_SEND_LAST", 0},
    {kXrcBase | kRcSendLastImm, "XRC_SEND_LAST_WITH_IMMEDIATE", 0},
    {kXrcBase | kRcSendOnly, "XRC_SEND_ONLY", 0},
    {kXrcBase | kRcSendOnlyImm, "XRC_SEND_ONLY_WITH_IMMEDIATE", 0},
    {kXrcBase | kRcWriteFirst, "XRC_RDMA_WRITE_FIRST", 0},
    {kXrcBase | kRcWriteMiddle, "XRC_RDMA_WRITE_MIDDLE", 0},
    {kXrcBase | kRcWriteLast, "XRC_RDMA_WRITE_LAST", 0},
    {kXrcBase | kRcWriteLastImm, "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 0},
    {kXrcBase | kRcWriteOnly, "XRC_RDMA_WRITE_ONLY", 0},
    {kXrcBase | kRcWriteOnlyImm, "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 0},
    {kXrcBase | kRcReadRequest, "XRC_RDMA_READ_REQUEST", 0},
    {kXrcBase | kRcReadResponseFirst, "XRC_RDMA_READ_RESPONSE_FIRST", 0},
    {kXrcBase | kRcReadResponseMiddle, "XRC_RDMA_READ_RESPONSE_MIDDLE", 0},
    {kXrcBase | kRcReadResponseLast, "XRC_RDMA_READ_RESPONSE_LAST", 0},
    {kXrcBase | kRcReadResponseOnly, "XRC_RDMA_READ_RESPONSE_ONLY", 0},
    {kXrcBase | kRcAck, "XRC_ACKNOWLEDGE", 0},
    {kXrcBase | kRcAtomicAck, "XRC_ATOMIC_ACKNOWLEDGE", 0},
    {kXrcBase | kRcCompareSwap, "XRC_COMPARE_SWAP", 0},
    {kXrcBase | kRcFetchAdd, "XRC_FETCH_ADD", 0},
    {kXrcBase | kRcSendLastInv, "XRC_SEND_LAST_WITH_INVALIDATE", 0},
    {kXrcBase | kRcSendOnlyInv, "XRC_SEND_ONLY_WITH_INVALIDATE", 0},
};

constexpr std::array<OpcodeInfo, 256> build_table() {
  std::array<OpcodeInfo, 256> t{};
  for (const Entry& e : kEntries) t[e.op] = make(e.name, e.mask);
  // An XRC opcode has its RC twin's headers, plus the XRCETH on requests.
  for (const Entry& e : kXrcEntries) {
    uint32_t mask = t[e.op & 0x1F].mask;
    if (mask & kMaskRequest) mask |= kMaskXrceth;
    t[e.op] = make(e.name, mask);
  }
  // RoCEv2 annex A17.9.4: a CNP's BTH is followed by 16 reserved bytes.
  t[kCnp].length = static_cast<uint8_t>(t[kCnp].length + kCnpPayloadLen);
  t[kCnp].payload = t[kCnp].length;
  return t;
}

constexpr std::array<OpcodeInfo, 256> kTable = build_table();

static_assert(kTable[kRcWriteOnlyImm].reth == 12 && kTable[kRcWriteOnlyImm].immdt == 28);
static_assert(kTable[kRcAtomicAck].aeth == 12 && kTable[kRcAtomicAck].atomic_ack_eth == 16);
static_assert(kTable[kUdSendOnlyImm].deth == 12 && kTable[kUdSendOnlyImm].length == 24);
static_assert(kTable[kRcAtomicWrite].reth == 12 && kTable[kRcAtomicWrite].payload == 28);
static_assert(kTable[kXrcBase | kRcWriteOnlyImm].xrceth == 12 && kTable[kXrcBase | kRcWriteOnlyImm].reth == 16 &&
              kTable[kXrcBase | kRcWriteOnlyImm].immdt == 32);
static_assert(kTable[kXrcBase | kRcCompareSwap].atomic_eth == 16 && kTable[kXrcBase | kRcCompareSwap].length == 44);
static_assert(kTable[kXrcBase | kRcAck].xrceth == 0 && kTable[kXrcBase | kRcAck].aeth == 12);

}  // namespace

const OpcodeInfo& opcode_info(uint8_t opcode) { return kTable[opcode]; }

}  // namespace droce::wire
