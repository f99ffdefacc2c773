#include "cm/engine_port.h"

#include <infiniband/verbs.h>

#include <cstring>

namespace droce::cm {
EnginePort::EnginePort(Ucma* ucma, int dev, engine::Device* device) : ucma_(ucma), dev_(dev), device_(device) {
  const engine::PortInfo& p = device->port();
  LocalPort lp;
  lp.dev = dev;
  lp.node_guid = engine::node_guid(p);
  lp.ip4 = p.ip;
  lp.prefix_len = p.prefix_len;
  lp.has_ip6 = p.gid_count > 1;
  std::memcpy(lp.ip6.data(), p.gids[1], 16);
  lp.active_mtu = p.active_mtu;
  ucma->AddPort(lp, this);
  device->SetGsiSink(this);
  device->AddDeviceSink(this);
}

EnginePort::~EnginePort() {
  device_->RemoveDeviceSink(this);
  device_->SetGsiSink(nullptr);
}

void EnginePort::DeviceEvent(int event_type) {
  if (event_type == IBV_EVENT_DEVICE_FATAL) ucma_->RemovePort(dev_);
}

void EnginePort::SendMad(const Gid& sgid, const Gid& dgid, uint32_t dqpn, uint8_t tclass,
                         std::span<const uint8_t, kMadSize> mad) {
  device_->SendGsi(sgid, dgid, dqpn, tclass, mad.data());  // a Gid is a wire::Ipv6Addr
}

int EnginePort::Resolve(const Gid& dgid) { return device_->ResolveNeighbor(dgid); }

void EnginePort::OnGsi(const engine::GsiMad& mad) {
  MadSource src;
  src.sgid = mad.sgid;
  src.dgid = mad.dgid;
  src.src_qpn = mad.src_qpn;
  src.tclass = mad.tclass;
  src.hop_limit = mad.hop_limit;
  ucma_->Inbound(dev_, src, mad.mad);
}

std::vector<std::unique_ptr<EnginePort>> AttachPorts(Ucma* ucma, std::span<engine::Device* const> devices) {
  std::vector<std::unique_ptr<EnginePort>> ports;
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] != nullptr) ports.push_back(std::make_unique<EnginePort>(ucma, static_cast<int>(i), devices[i]));
  }
  return ports;
}

}  // namespace droce::cm
