// The calling thread becomes a background thread (SCHED_IDLE): it runs only
// on CPU time nothing else wants, so answering `droce ctl`, a Prometheus
// scrape or a telemetry command never delays a worker or an application
// thread that shares its CPU. For threads that only observe: they must hold
// no lock the datapath takes (the live statistics copy their snapshot under
// the control lock only, briefly).
#pragma once

#include <pthread.h>
#include <sched.h>

namespace droce {

inline void MakeThreadBackground() {
  thread_local bool done = false;
  if (done) return;
  done = true;
  sched_param p{};
  p.sched_priority = 0;
  pthread_setschedparam(pthread_self(), SCHED_IDLE, &p);
}

}  // namespace droce
