#include "engine/config.h"

#include <cstdlib>
#include <string>
#include <utility>

namespace droce::engine {

int ConfiguredDeviceCount() {
  const char* links = std::getenv(config::Info(config::Setting::kLink).var);
  const size_t n = config::SplitDevices(links == nullptr ? std::string() : std::string(links)).size();
  return n == 0 ? 1 : static_cast<int>(n);
}

absl::StatusOr<Config> ConfigFromEnv(int index) {
  absl::StatusOr<config::Settings> s = config::ParseSettings(config::RawSettingsFromEnv(), config::AllowedCpus());
  if (!s.ok()) return s.status();
  if (index < 0 || static_cast<size_t>(index) >= s->devices.size()) return absl::NotFoundError("no such device");
  Config c;
  static_cast<config::GlobalSettings&>(c) = s->global;
  static_cast<config::DeviceSettings&>(c) = std::move(s->devices[static_cast<size_t>(index)]);
  c.index = index;
  return c;
}

}  // namespace droce::engine
