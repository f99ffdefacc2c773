// The per-QP event trace (src/lab/trace.h, src/transport/trace.h): the
// option parser, the ring (order, wrap, a full ring drops and counts), the
// JSON and CSV lines of every kind of event, and a binary trace written by
// the writer thread and printed back by DumpTrace with times in the wall
// clock's range. No DPDK.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "lab/trace.h"
#include "transport/qp.h"

namespace droce::lab {
namespace {

using transport::TraceEvent;
using transport::TraceKind;
using transport::TraceSink;

TraceEvent Ev(TraceKind k, uint8_t op, uint32_t psn, uint32_t arg = 0, uint32_t len = 0, uint64_t ns = 1000) {
  return {ns, 17, k, op, 0, psn, arg, len, 0};
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "droce_trace_" + std::to_string(getpid()) + "_" + name;
}

uint64_t MonoNs() {
  timespec m{};
  clock_gettime(CLOCK_MONOTONIC, &m);
  return static_cast<uint64_t>(m.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(m.tv_nsec);
}

TEST(TraceSpec, ParsesAndRefuses) {
  auto o = ParseTraceSpec("/tmp/t.json");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->format, TraceFormat::kJson);
  EXPECT_FALSE(o->has_qp);
  EXPECT_EQ(o->ring, 1u << 16);
  auto c = ParseTraceSpec("/tmp/t.csv,format=csv,qp=0x11,ring=4096");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->format, TraceFormat::kCsv);
  EXPECT_TRUE(c->has_qp);
  EXPECT_EQ(c->qp, 17u);
  EXPECT_EQ(c->ring, 4096u);
  EXPECT_EQ(ParseTraceSpec("/t,qp=18")->qp, 18u);
  EXPECT_EQ(ParseTraceSpec("/t,format=binary")->format, TraceFormat::kBinary);
  auto msg = [](const char* s) {
    auto r = ParseTraceSpec(s);
    EXPECT_FALSE(r.ok()) << s;
    return r.ok() ? std::string() : std::string(r.status().message());
  };
  EXPECT_EQ(msg(""), "no file to trace to (PATH[,format=json|csv,...])");
  EXPECT_EQ(msg("/t,format=xml"), "'format' is json, csv or binary, not 'xml'");
  EXPECT_EQ(msg("/t,qp=x"), "'qp' needs a number, not 'x'");
  EXPECT_EQ(msg("/t,qp=0x1000000"), "'qp' is a 24-bit QP number");
  EXPECT_EQ(msg("/t,ring=1000"), "'ring' is a power of two from 1024 to 16777216 events");
  EXPECT_EQ(msg("/t,size=1"), "unknown trace option 'size' (format, qp, ring, clock)");
  EXPECT_FALSE(o->turn_clock);
  EXPECT_TRUE(ParseTraceSpec("/t,clock=turn")->turn_clock);
  EXPECT_FALSE(ParseTraceSpec("/t,clock=turn,clock=event")->turn_clock);
  EXPECT_EQ(msg("/t,clock=tsc"), "'clock' is event or turn, not 'tsc'");
}

// clock=turn: inside a turn every event takes the turn's stamp; outside one
// (a control call's state change) the clock's own; clock=event never the
// turn's.
TEST(TraceRing, TurnClockStampsEventsWithTheirTurn) {
  TraceSink turn(16, /*turn_clock=*/true), event(16);
  EXPECT_TRUE(turn.turn_clock());
  EXPECT_FALSE(event.turn_clock());
  turn.StartTurn();
  const uint64_t start = turn.Stamp();
  const uint64_t deadline = transport::TraceClock() + 1000;
  while (transport::TraceClock() < deadline) {
  }
  EXPECT_EQ(turn.Stamp(), start);   // the same stamp however late in the turn
  EXPECT_GT(event.Stamp(), start);  // a clock reading of its own
  turn.EndTurn();
  EXPECT_GT(turn.Stamp(), start);  // between turns: the clock
  turn.StartTurn();
  EXPECT_GT(turn.Stamp(), start);  // the next turn's stamp
}

TEST(TraceRing, KeepsOrderAcrossTheWrapAndCountsWhatAFullRingDrops) {
  TraceSink r(4);
  std::vector<uint32_t> got;
  auto drain = [&] {
    return r.Drain([&](TraceEvent* e, size_t n) {
      for (size_t i = 0; i < n; ++i) got.push_back(e[i].psn);
    });
  };
  for (uint32_t i = 0; i < 3; ++i) r.Record(Ev(TraceKind::kTx, 4, i));
  EXPECT_EQ(drain(), 3u);
  for (uint32_t i = 3; i < 9; ++i) r.Record(Ev(TraceKind::kTx, 4, i));  // 4 fit, 2 dropped
  EXPECT_EQ(r.dropped(), 2u);
  EXPECT_EQ(drain(), 4u);  // 3..6, wrapping from slot 3 to slot 2
  EXPECT_EQ(drain(), 0u);
  EXPECT_EQ(got, (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6}));
}

TEST(TraceFormat, EveryKindInJsonAndCsv) {
  const std::string d = "droce0";
  auto j = [&](const TraceEvent& e) { return FormatTraceEvent(e, TraceFormat::kJson, d, 5); };
  auto c = [&](const TraceEvent& e) { return FormatTraceEvent(e, TraceFormat::kCsv, d, 5); };
  EXPECT_EQ(j(Ev(TraceKind::kTx, 0x04, 7, 0, 1082)),
            R"({"time_ns":1005,"dev":"droce0","qpn":17,"event":"tx","opcode":"RC_SEND_ONLY","psn":7,"bytes":1082})");
  EXPECT_EQ(c(Ev(TraceKind::kTx, 0x04, 7, 0, 1082)), "1005,droce0,17,tx,RC_SEND_ONLY,7,,1082");
  EXPECT_EQ(j(Ev(TraceKind::kTx, 0x11, 9, 0x60, 62)),
            R"({"time_ns":1005,"dev":"droce0","qpn":17,"event":"tx","opcode":"RC_ACKNOWLEDGE","psn":9,"nak":"PSN sequence error","bytes":62})");
  EXPECT_EQ(c(Ev(TraceKind::kTx, 0x11, 9, 0x2E, 62)), "1005,droce0,17,tx,RC_ACKNOWLEDGE,9,rnr_timer 14,62");
  EXPECT_EQ(j(Ev(TraceKind::kRx, 0x0A, 3, 0, 4096)),
            R"({"time_ns":1005,"dev":"droce0","qpn":17,"event":"rx","opcode":"RC_RDMA_WRITE_ONLY","psn":3,"bytes":4096})");
  EXPECT_EQ(j(Ev(TraceKind::kAck, 0x11, 3, 12)),
            R"({"time_ns":1005,"dev":"droce0","qpn":17,"event":"ack","opcode":"RC_ACKNOWLEDGE","psn":3,"msn":12})");
  EXPECT_EQ(j(Ev(TraceKind::kNak, 0x11, 3, 2)),
            R"({"time_ns":1005,"dev":"droce0","qpn":17,"event":"nak","opcode":"RC_ACKNOWLEDGE","psn":3,"nak":"remote access error"})");
  EXPECT_EQ(c(Ev(TraceKind::kRnr, 0x11, 3, 14)), "1005,droce0,17,rnr,RC_ACKNOWLEDGE,3,rnr_timer 14,");
  EXPECT_EQ(j(Ev(TraceKind::kRetransmit, 0, 3)), R"({"time_ns":1005,"dev":"droce0","qpn":17,"event":"retransmit","psn":3})");
  EXPECT_EQ(c(Ev(TraceKind::kTimeout, 0, 3, 6)), "1005,droce0,17,timeout,,3,retries_left 6,");
  EXPECT_EQ(j(Ev(TraceKind::kState, 0, 0, static_cast<uint32_t>(transport::QpState::kRts))),
            R"({"time_ns":1005,"dev":"droce0","qpn":17,"event":"state","state":"RTS"})");
  EXPECT_EQ(c(Ev(TraceKind::kState, 0, 0, static_cast<uint32_t>(transport::QpState::kErr))),
            "1005,droce0,17,state,,,state ERR,");
  EXPECT_EQ(c(Ev(TraceKind::kRx, 0xEE, 1)), "1005,droce0,17,rx,0xee,1,,0");
  EXPECT_EQ(TraceCsvHeader(), "time_ns,dev,qpn,event,opcode,psn,detail,bytes");
}

TEST(Trace, BinaryFileRoundTripsWithCalibratedTimes) {
  const std::string path = TempPath("t.bin");
  auto o = ParseTraceSpec(path + ",format=binary,qp=17");
  ASSERT_TRUE(o.ok());
  // Epoch offset 0: the times come out as CLOCK_MONOTONIC (the device
  // passes realtime - monotonic).
  auto t = Trace::Start(*o, "droce0", 2, 0);
  ASSERT_TRUE(t.ok()) << t.status();
  // The filter: QP 17 has a sink, others none.
  EXPECT_EQ((*t)->SinkFor(18, 0), nullptr);
  TraceSink* s0 = (*t)->SinkFor(17, 0);
  TraceSink* s1 = (*t)->SinkFor(17, 1);
  ASSERT_NE(s0, nullptr);
  ASSERT_NE(s1, nullptr);
  EXPECT_NE(s0, s1);
  const uint64_t before = MonoNs();
  for (uint32_t i = 0; i < 100; ++i) s0->Record(Ev(TraceKind::kTx, 0x04, i, 0, 100, transport::TraceClock()));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // drained by the thread meanwhile
  s1->Record(Ev(TraceKind::kState, 0, 0, 3, 0, transport::TraceClock()));
  const uint64_t after = MonoNs();
  const TraceStatus st = (*t)->Status();
  EXPECT_EQ(st.events, 101u);
  EXPECT_EQ(st.dropped, 0u);
  EXPECT_FALSE(st.failed);
  t->reset();
  const std::string out = TempPath("t.txt");
  std::FILE* f = std::fopen(out.c_str(), "w");
  auto n = DumpTrace(path, TraceFormat::kCsv, f);
  std::fclose(f);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 101u);
  std::ifstream in(out);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, TraceCsvHeader());
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  ASSERT_EQ(lines.size(), 101u);
  // Each time within the span the events were recorded in (the clock's
  // rate is calibrated over the trace's life; 100 us of slack).
  uint64_t prev = 0;
  for (size_t i = 0; i < 100; ++i) {
    const uint64_t ts = std::stoull(lines[i].substr(0, lines[i].find(',')));
    EXPECT_GE(ts + 100'000, before);
    EXPECT_LE(ts, after + 100'000);
    EXPECT_GE(ts, prev);
    prev = ts;
    EXPECT_EQ(lines[i].substr(lines[i].find(',')), ",droce0,17,tx,RC_SEND_ONLY," + std::to_string(i) + ",,100");
  }
  EXPECT_NE(lines[100].find(",state,,,state RTS,"), std::string::npos);
  std::remove(out.c_str());
  std::remove(path.c_str());
}

TEST(Trace, DumpRefusesWhatIsNotATrace) {
  const std::string path = TempPath("not.bin");
  std::ofstream(path) << "hello, this is not a trace file at all, not even close to one....";
  auto n = DumpTrace(path, TraceFormat::kJson, stdout);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().message(), path + ": not a binary droce trace (format=binary)");
  std::remove(path.c_str());
  EXPECT_FALSE(DumpTrace("/nonexistent/droce.trace", TraceFormat::kJson, stdout).ok());
}

TEST(Trace, JsonFileHasALinePerEvent) {
  const std::string path = TempPath("t.json");
  auto t = Trace::Start(*ParseTraceSpec(path), "droce1", 1, 0);
  ASSERT_TRUE(t.ok());
  (*t)->SinkFor(5, 0)->Record(Ev(TraceKind::kRetransmit, 0, 77, 0, 0, transport::TraceClock()));
  t->reset();
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_NE(line.find(R"("dev":"droce1","qpn":17,"event":"retransmit","psn":77})"), std::string::npos) << line;
  EXPECT_FALSE(std::getline(in, line));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace droce::lab
