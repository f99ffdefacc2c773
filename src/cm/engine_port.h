// The connection manager on droce's engine: a port's QP1 (engine::Device's
// GSI sink and sender) as the manager's PortIo, one per device.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "cm/ucma.h"
#include "engine/device.h"

namespace droce::cm {

class EnginePort final : public PortIo, public engine::GsiSink, public engine::EventSink {
 public:
  EnginePort(Ucma* ucma, int dev, engine::Device* device);
  ~EnginePort() override;
  void SendMad(const Gid& sgid, const Gid& dgid, uint32_t dqpn, uint8_t tclass,
               std::span<const uint8_t, kMadSize> mad) override;
  int Resolve(const Gid& dgid) override;
  void OnGsi(const engine::GsiMad& mad) override;
  // The device died (engine failure, droced's stop): DEVICE_REMOVAL to
  // every id on it.
  void QpEvent(uint64_t, int) override {}
  void SrqEvent(uint64_t, int) override {}
  void DeviceEvent(int event_type) override;
  engine::Device* device() const { return device_; }

 private:
  Ucma* ucma_;
  int dev_;
  engine::Device* device_;
};

// Adds devices[i] as port droce<i> of `ucma` (nullptr entries skipped) and
// takes their QP1s; call before ucma->Start().
std::vector<std::unique_ptr<EnginePort>> AttachPorts(Ucma* ucma, std::span<engine::Device* const> devices);

}  // namespace droce::cm
