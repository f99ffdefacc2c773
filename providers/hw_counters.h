// The live hw_counters files of the sysfs view (hw_counters.cc).
#pragma once

namespace droce::provider {

// The device counter's index in kCounterInfo, or -1 for an unknown name.
int hw_counter_index(const char* name);
// An fd whose every read gives counter `counter` of device `dev` at that
// moment (a memfd; reads are interposed), or with live = false the value
// now, fixed (for fopen, whose reads and close we do not see). Read-only:
// other access modes are EACCES, as sysfs's 0444 files.
int hw_counter_open(int dev, int counter, int flags, bool live = true);
// close() of any fd (rdma_cm.cc's interposed close calls it).
void hw_counter_closed(int fd);

}  // namespace droce::provider
