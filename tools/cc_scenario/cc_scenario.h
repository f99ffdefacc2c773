// `droce cc-scenario`: the congestion-control experiments of src/transport/sim/cc_scenario.h
// from the command line: seeded, CSV out, a PNG plot through gnuplot.
// See docs/LAB.md ("Congestion control").
#pragma once

namespace droce::cc_scenario {

// argv[0] is "cc-scenario". Returns the exit status.
int Main(int argc, char** argv);

}  // namespace droce::cc_scenario
