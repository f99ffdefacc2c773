// 802.1Q on the port (DROCE_VLAN): every frame the engine sends is tagged
// just before it is queued (the transport writes untagged frames at fixed
// offsets, and the ICRC does not cover the Ethernet header, so the tag can go
// in last); received frames must carry the port's VLAN ID, in the frame or
// in the mbuf when the PMD stripped it (af_packet reports the kernel's
// out-of-band tag that way).
#include <rte_ether.h>
#include <rte_mbuf.h>

#include "engine/device.h"
#include "wire/bytes.h"

namespace droce::engine {

void Device::TagFrame(rte_mbuf* m, int pcp) {
  if (vlan_tci_ == 0) return;
  if (rte_pktmbuf_data_len(m) < wire::kEthLen ||
      wire::load_be16(rte_pktmbuf_mtod(m, const uint8_t*) + 12) == wire::kEtherTypeVlan) {
    return;  // already tagged (or too short to be a frame)
  }
  m->vlan_tci = pcp >= 0 ? static_cast<uint16_t>((vlan_tci_ & 0x1FFF) | (pcp & 7) << 13) : vlan_tci_;
  // Prepends 4 bytes into the mbuf's headroom and moves the MAC addresses
  // (the mbufs are the engine's own, never shared, so m stays the same).
  (void)rte_vlan_insert(&m);
}

bool Device::VlanAccepts(const rte_mbuf* m, const uint8_t* f, size_t len) const {
  int vid = -1;  // untagged
  if (m->ol_flags & RTE_MBUF_F_RX_VLAN_STRIPPED) {
    vid = m->vlan_tci & 0xFFF;
  } else if (len >= wire::kEthLen + wire::kVlanLen && wire::load_be16(f + 12) == wire::kEtherTypeVlan) {
    vid = wire::load_be16(f + 14) & 0xFFF;
  }
  if (vlan_tci_ == 0) return vid <= 0;  // untagged or priority-tagged (VID 0)
  return vid == (vlan_tci_ & 0xFFF);
}

}  // namespace droce::engine
