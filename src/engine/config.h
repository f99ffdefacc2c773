// Engine configuration, from DROCE_* environment variables (the launcher's
// flags set the same variables), parsed by config/settings.h: the one parser
// of droce's settings, which the launcher validates its flags with too. See
// docs/CONFIG.md.
#pragma once

#include "absl/status/statusor.h"
#include "config/settings.h"

namespace droce::engine {

// One device's configuration: the process-wide settings and the device's own
// entries of the per-device lists.
struct Config : config::GlobalSettings, config::DeviceSettings {
  int index = 0;  // device droce<index>
};

// Reads the DROCE_* variables (config::kSettings) and parses all of them, for
// every device, so that a bad entry for any device fails every device. The
// error message names the variable and the bad value.
absl::StatusOr<Config> ConfigFromEnv(int index = 0);
// Devices configured: one per ';'-separated DROCE_LINK entry (at least one).
int ConfiguredDeviceCount();

}  // namespace droce::engine
