// The settings parser (config/settings.h) that the engine and the launcher
// share: every setting with good and bad values, per-device lists and their
// entry-count rule, the cross-checks, and the error's setting and message.
#include "config/settings.h"

#include <gtest/gtest.h>

#include <string>

namespace droce::config {
namespace {

// CPUs 0..3 allowed, as if under `taskset -c 0-3`.
CpuSet FourCpus() {
  CpuSet c;
  for (int i = 0; i < 4; ++i) c.set(i);
  return c;
}

class Raw {
 public:
  Raw& Set(Setting s, std::string v) {
    raw_[static_cast<size_t>(s)] = std::move(v);
    return *this;
  }
  absl::StatusOr<Settings> Parse(SettingError* error = nullptr) const {
    return ParseSettings(raw_, FourCpus(), error);
  }

 private:
  RawSettings raw_;
};

// The setting ParseSettings blames and the whole message for one bad value.
void ExpectRefused(const Raw& raw, Setting setting, const std::string& reason) {
  SettingError error;
  const absl::StatusOr<Settings> s = raw.Parse(&error);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(error.setting, setting);
  EXPECT_EQ(error.reason, reason);
  EXPECT_EQ(s.status().message(), std::string(Info(setting).var) + ": " + reason);
}

TEST(Settings, TableIsIndexedBySettingAndNamesEveryVariable) {
  for (size_t i = 0; i < kSettings.size(); ++i) {
    EXPECT_EQ(static_cast<size_t>(kSettings[i].setting), i);
    EXPECT_EQ(std::string(kSettings[i].var).rfind("DROCE_", 0), 0u) << kSettings[i].var;
  }
  EXPECT_STREQ(Info(Setting::kWorkerCpu).flag, "worker-cpu");
  EXPECT_EQ(Info(Setting::kPollYield).flag, nullptr);
  EXPECT_TRUE(Info(Setting::kIp6).per_device);
  EXPECT_FALSE(Info(Setting::kGateway).per_device);
}

TEST(Settings, DefaultsWithNothingSet) {
  const absl::StatusOr<Settings> s = Raw().Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->devices.size(), 1u);
  const DeviceSettings& d = s->devices[0];
  EXPECT_EQ(d.link, "");
  EXPECT_EQ(d.ip, 0x0A4D0001u);  // 10.77.0.1/24
  EXPECT_EQ(d.prefix_len, 24);
  EXPECT_FALSE(d.mac.has_value());
  EXPECT_FALSE(d.has_ip6);
  EXPECT_TRUE(d.worker_cpus.empty());
  EXPECT_EQ(d.workers, 1);
  const GlobalSettings& g = s->global;
  EXPECT_EQ(g.log_level, LogLevel::kError);
  EXPECT_TRUE(g.app_progress);
  EXPECT_EQ(g.mtu, 3);  // 1024
  EXPECT_EQ(g.gateway, 0u);
  EXPECT_EQ(g.vlan, 0);
  EXPECT_EQ(g.hugepages, HugepageMode::kAuto);
  EXPECT_EQ(g.poll_yield, 16u);
  EXPECT_EQ(g.watch_us, 20u);
  EXPECT_FALSE(g.stats);
}

TEST(Settings, SplitDevicesDropsTrailingEmptyEntriesOnly) {
  EXPECT_TRUE(SplitDevices("").empty());
  EXPECT_TRUE(SplitDevices(";").empty());
  EXPECT_EQ(SplitDevices("a"), (std::vector<std::string>{"a"}));
  EXPECT_EQ(SplitDevices("a;"), (std::vector<std::string>{"a"}));
  EXPECT_EQ(SplitDevices(";b"), (std::vector<std::string>{"", "b"}));
  EXPECT_EQ(SplitDevices("a;;c;;"), (std::vector<std::string>{"a", "", "c"}));
}

TEST(Settings, LinksMakeDevicesWithDefaultAddresses) {
  const absl::StatusOr<Settings> s = Raw().Set(Setting::kLink, "net_memif0,role=server;;net_tap0").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->devices.size(), 3u);
  EXPECT_EQ(s->devices[0].link, "net_memif0,role=server");
  EXPECT_EQ(s->devices[1].link, "");  // the internal loopback link
  EXPECT_EQ(s->devices[2].link, "net_tap0");
  for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(s->devices[i].ip, 0x0A4D0001u | (i << 8)) << i;
  // Only ';' separates devices: devargs use ','.
  EXPECT_EQ(Raw().Set(Setting::kLink, "a;").Parse()->devices.size(), 1u);
}

TEST(Settings, AtMostSixteenLinks) {
  std::string links;
  for (int i = 0; i < kMaxDevices; ++i) links += "net_ring" + std::to_string(i) + ";";
  EXPECT_EQ(Raw().Set(Setting::kLink, links).Parse()->devices.size(), 16u);
  links += "net_ring16";
  ExpectRefused(Raw().Set(Setting::kLink, links), Setting::kLink,
                "'" + links + "' lists 17 links, at most 16 devices");
}

TEST(Settings, Ipv4Address) {
  uint32_t ip = 0;
  uint8_t len = 0;
  ASSERT_TRUE(ParseIpv4Prefix("192.0.2.11", &ip, &len).ok());
  EXPECT_EQ(ip, 0xC000020Bu);
  EXPECT_EQ(len, 24);
  ASSERT_TRUE(ParseIpv4Prefix("10.1.2.3/0", &ip, &len).ok());
  EXPECT_EQ(len, 0);
  ASSERT_TRUE(ParseIpv4Prefix("10.1.2.3/32", &ip, &len).ok());
  EXPECT_EQ(len, 32);
  for (const char* bad : {"300.1.1.1", "10.0.0", "10.0.0.1.2", "010.0.0.1", " 10.0.0.1", "10.0.0.1 ", "0x0a.0.0.1",
                          "10.0.0.1,", "fd00::1"}) {
    EXPECT_EQ(ParseIpv4Prefix(bad, &ip, &len).message(), std::string("invalid IPv4 address '") + bad + "'") << bad;
  }
  for (const char* bad : {"10.0.0.1/33", "10.0.0.1/", "10.0.0.1/+24", "10.0.0.1/ 24", "10.0.0.1/-1", "10.0.0.1/2x"}) {
    EXPECT_EQ(ParseIpv4Prefix(bad, &ip, &len).message(),
              std::string("invalid prefix length in '") + bad + "' (0 to 32)")
        << bad;
  }
}

TEST(Settings, Ipv4PerDevice) {
  const absl::StatusOr<Settings> s =
      Raw().Set(Setting::kLink, "a;b;c").Set(Setting::kIp, "10.1.0.1/16;;10.3.0.1").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->devices[0].ip, 0x0A010001u);
  EXPECT_EQ(s->devices[0].prefix_len, 16);
  EXPECT_EQ(s->devices[1].ip, 0x0A4D0101u);  // no entry of its own: 10.77.1.1/24
  EXPECT_EQ(s->devices[2].ip, 0x0A030001u);
  EXPECT_EQ(s->devices[2].prefix_len, 24);
  // Fewer entries than devices: the rest get their defaults.
  EXPECT_EQ(Raw().Set(Setting::kLink, "a;b").Set(Setting::kIp, "10.1.0.1").Parse()->devices[1].ip, 0x0A4D0101u);
  // A bad entry of any device is refused, naming the entry.
  ExpectRefused(Raw().Set(Setting::kLink, "a;b").Set(Setting::kIp, "10.1.0.1;10.1.0"), Setting::kIp,
                "invalid IPv4 address '10.1.0'");
}

// More entries than devices: an address meant for a device that does not
// exist (a forgotten --link entry) is an error, not silently dropped.
TEST(Settings, PerDeviceListsHaveNoMoreEntriesThanDevices) {
  for (Setting s : {Setting::kIp, Setting::kIp6, Setting::kMac, Setting::kWorkers, Setting::kWorkerCpu}) {
    const std::string two = s == Setting::kIp    ? "10.0.0.1;10.0.0.2"
                            : s == Setting::kIp6 ? "fd00::1;fd00::2"
                            : s == Setting::kMac ? "02:00:00:00:00:01;02:00:00:00:00:02"
                                                 : "1;2";
    ExpectRefused(Raw().Set(s, two), s,
                  "'" + two + "' has 2 entries, one per device, but there is 1 device (one per link)");
    ExpectRefused(Raw().Set(Setting::kLink, "a;b").Set(s, two + ";" + two), s,
                  "'" + two + ";" + two + "' has 4 entries, one per device, but there are 2 devices (one per link)");
    EXPECT_TRUE(Raw().Set(Setting::kLink, "a;b").Set(s, two).Parse().ok()) << Info(s).var;
    // A trailing ';' adds no entry.
    EXPECT_TRUE(Raw().Set(Setting::kLink, "a;b").Set(s, two + ";").Parse().ok()) << Info(s).var;
  }
}

TEST(Settings, Ipv6Address) {
  wire::Ipv6Addr ip{};
  uint8_t len = 0;
  ASSERT_TRUE(ParseIpv6Prefix("fd78:1::11", &ip, &len).ok());
  EXPECT_EQ(ip[0], 0xFD);
  EXPECT_EQ(ip[15], 0x11);
  EXPECT_EQ(len, 64);
  ASSERT_TRUE(ParseIpv6Prefix("fd78:1::11/128", &ip, &len).ok());
  EXPECT_EQ(len, 128);
  ASSERT_TRUE(ParseIpv6Prefix("::ffff:10.0.0.1/96", &ip, &len).ok());
  for (const char* bad : {"zz", "fd78:1::11:", "10.0.0.1", "fd78::1::2", " fd78::1"}) {
    EXPECT_EQ(ParseIpv6Prefix(bad, &ip, &len).message(), std::string("invalid IPv6 address '") + bad + "'") << bad;
  }
  for (const char* bad : {"fd78::1/129", "fd78::1/", "fd78::1/+64"}) {
    EXPECT_EQ(ParseIpv6Prefix(bad, &ip, &len).message(),
              std::string("invalid prefix length in '") + bad + "' (0 to 128)")
        << bad;
  }
  for (const char* bad : {"::", "::/64", "ff02::1", "ff0e::1234/64"}) {
    EXPECT_EQ(ParseIpv6Prefix(bad, &ip, &len).message(), std::string("'") + bad + "' is not a unicast address") << bad;
  }
}

TEST(Settings, Ipv6PerDevice) {
  const absl::StatusOr<Settings> s =
      Raw().Set(Setting::kLink, "a;b;c").Set(Setting::kIp6, ";fd78:9::2/80").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->devices[0].has_ip6);  // no entry of its own: no IPv6 address
  EXPECT_TRUE(s->devices[1].has_ip6);
  EXPECT_EQ(s->devices[1].prefix6_len, 80);
  EXPECT_FALSE(s->devices[2].has_ip6);
  ExpectRefused(Raw().Set(Setting::kIp6, "ff02::1"), Setting::kIp6, "'ff02::1' is not a unicast address");
}

TEST(Settings, Mac) {
  wire::MacAddr mac{};
  ASSERT_TRUE(ParseMac("02:00:0a:4D:01:ff", &mac).ok());
  EXPECT_EQ(mac, (wire::MacAddr{0x02, 0x00, 0x0A, 0x4D, 0x01, 0xFF}));
  for (const char* bad : {"zz", "02:00:0a:00:00", "02:00:0a:00:00:00:00", "2:00:0a:00:00:01", "+2:00:0a:00:00:01",
                          " 2:00:0a:00:00:01", "02:00:0a:00:00:0g", "02-00-0a-00-00-01", "02:00:0a:00:00:01:",
                          "0x:00:0a:00:00:01"}) {
    EXPECT_EQ(ParseMac(bad, &mac).message(), std::string("invalid MAC '") + bad + "' (xx:xx:xx:xx:xx:xx, hex)")
        << bad;
  }
  const absl::StatusOr<Settings> s =
      Raw().Set(Setting::kLink, "a;b").Set(Setting::kMac, ";02:00:00:00:00:02").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->devices[0].mac.has_value());
  EXPECT_EQ(s->devices[1].mac, (wire::MacAddr{2, 0, 0, 0, 0, 2}));
}

TEST(Settings, Mtu) {
  const std::pair<const char*, uint8_t> good[] = {{"256", 1}, {"512", 2}, {"1024", 3}, {"2048", 4}, {"4096", 5}};
  for (const auto& [text, mtu] : good) {
    EXPECT_EQ(Raw().Set(Setting::kMtu, text).Parse()->global.mtu, mtu) << text;
  }
  for (const char* bad : {"1000", "128", "8192", " 1024", "+1024", "1024 ", "1k", "0x400"}) {
    ExpectRefused(Raw().Set(Setting::kMtu, bad), Setting::kMtu,
                  std::string("invalid MTU '") + bad + "' (one of 256, 512, 1024, 2048, 4096)");
  }
}

TEST(Settings, Gateway) {
  const absl::StatusOr<Settings> s =
      Raw().Set(Setting::kIp, "10.78.1.11/24").Set(Setting::kGateway, "10.78.1.2").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->global.gateway, 0x0A4E0102u);
  // The default address's subnet counts too.
  EXPECT_EQ(Raw().Set(Setting::kGateway, "10.77.0.254").Parse()->global.gateway, 0x0A4D00FEu);
  // A prefix length is refused: the subnet is the port's (DROCE_IP's).
  ExpectRefused(Raw().Set(Setting::kGateway, "10.77.0.254/24"), Setting::kGateway,
                "'10.77.0.254/24' has a prefix length: a gateway is one address (the subnet is the port's)");
  ExpectRefused(Raw().Set(Setting::kGateway, "10.77.0"), Setting::kGateway, "invalid IPv4 address '10.77.0'");
  ExpectRefused(Raw().Set(Setting::kGateway, "10.1.1.1"), Setting::kGateway,
                "'10.1.1.1' is not another address on the port's subnet (droce0: 10.77.0.1/24)");
  ExpectRefused(Raw().Set(Setting::kGateway, "10.77.0.1"), Setting::kGateway,
                "'10.77.0.1' is not another address on the port's subnet (droce0: 10.77.0.1/24)");
  // One gateway for every device: each port's subnet must hold it.
  EXPECT_TRUE(Raw()
                  .Set(Setting::kLink, "a;b")
                  .Set(Setting::kIp, "10.5.0.1/16;10.5.1.1/16")
                  .Set(Setting::kGateway, "10.5.0.254")
                  .Parse()
                  .ok());
  ExpectRefused(Raw().Set(Setting::kLink, "a;b").Set(Setting::kGateway, "10.77.0.254"), Setting::kGateway,
                "'10.77.0.254' is not another address on the port's subnet (droce1: 10.77.1.1/24)");
}

TEST(Settings, Vlan) {
  const absl::StatusOr<Settings> s = Raw().Set(Setting::kVlan, "100:5").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->global.vlan, 100);
  EXPECT_EQ(s->global.vlan_pcp, 5);
  EXPECT_EQ(Raw().Set(Setting::kVlan, "4094").Parse()->global.vlan, 4094);
  EXPECT_EQ(Raw().Set(Setting::kVlan, "1").Parse()->global.vlan_pcp, 0);
  for (const char* bad : {"0", "4095", "9999", "+5", " 5", "5:8", "5:", "5:1:2", ":3", "abc", "5:+1"}) {
    ExpectRefused(Raw().Set(Setting::kVlan, bad), Setting::kVlan,
                  std::string("invalid VLAN '") + bad + "' (ID 1..4094, optionally :PCP 0..7)");
  }
}

TEST(Settings, Workers) {
  EXPECT_EQ(Raw().Set(Setting::kWorkers, "16").Parse()->devices[0].workers, 16);
  const absl::StatusOr<Settings> s = Raw().Set(Setting::kLink, "a;b;c").Set(Setting::kWorkers, "2;;4").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->devices[0].workers, 2);
  EXPECT_EQ(s->devices[1].workers, 1);
  EXPECT_EQ(s->devices[2].workers, 4);
  for (const char* bad : {"0", "17", "abc", "+2", " 2", "2 ", "-1", "99999999999"}) {
    ExpectRefused(Raw().Set(Setting::kWorkers, bad), Setting::kWorkers,
                  std::string("'") + bad + "' is not a worker count (1 to 16)");
  }
}

TEST(Settings, WorkerCpus) {
  EXPECT_EQ(Raw().Set(Setting::kWorkerCpu, "3").Parse()->devices[0].worker_cpus, std::vector<int>{3});
  EXPECT_EQ(Raw().Set(Setting::kWorkerCpu, "2,3,2").Parse()->devices[0].worker_cpus, (std::vector<int>{2, 3, 2}));
  const absl::StatusOr<Settings> s = Raw().Set(Setting::kLink, "a;b").Set(Setting::kWorkerCpu, "0,1;2,3").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->devices[1].worker_cpus, (std::vector<int>{2, 3}));
  // Each element must be one of the process's CPUs (0..3 here); the message
  // names the bad element.
  for (const auto& [list, element] : std::vector<std::pair<std::string, std::string>>{
           {"4", "4"}, {"0,4096", "4096"}, {"1,+2", "+2"}, {"0,", ""}, {" 1", " 1"}, {"-1", "-1"}, {"a", "a"},
           {"99999999999", "99999999999"}}) {
    ExpectRefused(Raw().Set(Setting::kWorkerCpu, list), Setting::kWorkerCpu,
                  "'" + element + "' is not a CPU this process may run on");
  }
  CpuSet none;
  EXPECT_FALSE(ParseWorkerCpus("0", none).ok());
}

TEST(Settings, Modes) {
  EXPECT_EQ(Raw().Set(Setting::kHugepages, "on").Parse()->global.hugepages, HugepageMode::kOn);
  EXPECT_EQ(Raw().Set(Setting::kHugepages, "off").Parse()->global.hugepages, HugepageMode::kOff);
  EXPECT_EQ(Raw().Set(Setting::kHugepages, "auto").Parse()->global.hugepages, HugepageMode::kAuto);
  ExpectRefused(Raw().Set(Setting::kHugepages, "yes"), Setting::kHugepages, "invalid mode 'yes' (auto, on or off)");
  EXPECT_FALSE(Raw().Set(Setting::kProgress, "thread").Parse()->global.app_progress);
  EXPECT_TRUE(Raw().Set(Setting::kProgress, "app").Parse()->global.app_progress);
  ExpectRefused(Raw().Set(Setting::kProgress, "App"), Setting::kProgress, "invalid mode 'App' (app or thread)");
  const std::pair<const char*, LogLevel> levels[] = {
      {"error", LogLevel::kError}, {"warning", LogLevel::kWarning}, {"info", LogLevel::kInfo},
      {"debug", LogLevel::kDebug}};
  for (const auto& [text, level] : levels) {
    EXPECT_EQ(Raw().Set(Setting::kLogLevel, text).Parse()->global.log_level, level) << text;
  }
  ExpectRefused(Raw().Set(Setting::kLogLevel, "loud"), Setting::kLogLevel,
                "invalid level 'loud' (error, warning, info or debug)");
}

TEST(Settings, PollYieldAndStats) {
  EXPECT_EQ(Raw().Set(Setting::kPollYield, "0").Parse()->global.poll_yield, 0u);
  EXPECT_EQ(Raw().Set(Setting::kPollYield, "4294967295").Parse()->global.poll_yield, 4294967295u);
  for (const char* bad : {"abc", "-1", "16x", "4294967296", " 16"}) {
    ExpectRefused(Raw().Set(Setting::kPollYield, bad), Setting::kPollYield,
                  std::string("'") + bad + "' is not a count of empty polls (0 to 4294967295)");
  }
  EXPECT_TRUE(Raw().Set(Setting::kStats, "1").Parse()->global.stats);
  EXPECT_FALSE(Raw().Set(Setting::kStats, "0").Parse()->global.stats);
  for (const char* bad : {"yes", "2", "01"}) {
    ExpectRefused(Raw().Set(Setting::kStats, bad), Setting::kStats,
                  std::string("invalid value '") + bad + "' (0 or 1)");
  }
}

// DROCE_FAULT: lab/fault_rules.h parses it (tests/unit/lab_fault_test.cc has
// the rules); here, that it is a setting like the others.
TEST(Settings, Fault) {
  const auto s = Raw().Set(Setting::kFault, "loss random 10%; reorder 5% gap 3; duplicate 2%").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->global.fault.size(), 3u);
  EXPECT_DOUBLE_EQ(s->global.fault[0].loss_p[0], 0.10);
  EXPECT_EQ(s->global.fault[1].gap, 3u);
  EXPECT_TRUE(Raw().Parse()->global.fault.empty());
  ExpectRefused(Raw().Set(Setting::kFault, "loss randum 10%"), Setting::kFault,
                "rule 1 'loss randum 10%': unknown loss model 'randum' (random, state, gemodel or a percentage)");
  EXPECT_STREQ(Info(Setting::kFault).flag, "fault");
}

// DROCE_CAPTURE and DROCE_TRACE: lab/capture.h and lab/trace.h parse them
// (lab_capture_test, lab_trace_test); here, that they are settings whose
// bad values are refused before a device starts.
TEST(Settings, CaptureAndTrace) {
  const auto s = Raw().Set(Setting::kCapture, "/tmp/c.pcapng,count=10").Set(Setting::kTrace, "/tmp/t.csv,format=csv").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(s->global.capture.has_value());
  EXPECT_EQ(s->global.capture->count, 10u);
  ASSERT_TRUE(s->global.trace.has_value());
  EXPECT_EQ(s->global.trace->format, lab::TraceFormat::kCsv);
  EXPECT_FALSE(Raw().Parse()->global.capture.has_value());
  EXPECT_FALSE(Raw().Parse()->global.trace.has_value());
  ExpectRefused(Raw().Set(Setting::kCapture, "/tmp/c,files=2"), Setting::kCapture,
                "a ring of files ('files' above 1) needs 'size', the bytes of each file");
  ExpectRefused(Raw().Set(Setting::kTrace, "/tmp/t,format=xml"), Setting::kTrace,
                "'format' is json, csv or binary, not 'xml'");
  EXPECT_STREQ(Info(Setting::kCapture).flag, "capture");
  EXPECT_STREQ(Info(Setting::kTrace).flag, "trace");
}

// DROCE_RATE: tc's rate syntax, a burst in bytes with tc's k/m.
TEST(Settings, Rate) {
  auto s = Raw().Set(Setting::kRate, "1gbit").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->global.rate_kbps, 1'000'000u);
  EXPECT_EQ(s->global.rate_burst, 0u);
  s = Raw().Set(Setting::kRate, "250M,burst=64k").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->global.rate_kbps, 250'000u);
  EXPECT_EQ(s->global.rate_burst, 65536u);
  EXPECT_EQ(Raw().Parse()->global.rate_kbps, 0u);
  ExpectRefused(Raw().Set(Setting::kRate, "500"), Setting::kRate,
                "'500' is not a rate from 1kbit to 100gbit (e.g. 1gbit, 100M, 500kbit)");
  ExpectRefused(Raw().Set(Setting::kRate, "1gbit,size=3"), Setting::kRate,
                "'size=3': the only option is burst=BYTES");
  ExpectRefused(Raw().Set(Setting::kRate, "1gbit,burst=lots"), Setting::kRate,
                "'burst=lots': burst is a byte count (e.g. burst=65536 or burst=64k)");
  EXPECT_STREQ(Info(Setting::kRate).flag, "rate");
}

// DROCE_CC and DROCE_DCQCN: congestion control of every QP (cc/dcqcn.h).
TEST(Settings, CongestionControl) {
  auto s = Raw().Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->devices[0].cc, cc::CcMode::kDcqcn);  // on by default
  EXPECT_EQ(s->devices[0].dcqcn, cc::DcqcnParams{});
  s = Raw().Set(Setting::kCc, "off").Set(Setting::kDcqcn, "rpg_ai_rate=10,min_time_between_cnps=0").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->devices[0].cc, cc::CcMode::kOff);
  EXPECT_EQ(s->devices[0].dcqcn.rpg_ai_rate, 10u);
  EXPECT_EQ(s->devices[0].dcqcn.min_time_between_cnps, 0u);
  EXPECT_EQ(s->devices[0].dcqcn.rpg_time_reset, 300u);  // the others keep ConnectX's defaults
  ExpectRefused(Raw().Set(Setting::kCc, "ecn"), Setting::kCc, "'ecn' is not dcqcn or off");
  ExpectRefused(Raw().Set(Setting::kDcqcn, "rpg_gd=99"), Setting::kDcqcn, "rpg_gd='99': expected an integer from 1 to 15");
  // One value for every device, or one entry per device.
  s = Raw().Set(Setting::kLink, "net_ring0;net_ring1").Set(Setting::kCc, "off").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->devices[0].cc, cc::CcMode::kOff);
  EXPECT_EQ(s->devices[1].cc, cc::CcMode::kOff);
  s = Raw()
          .Set(Setting::kLink, "net_ring0;net_ring1")
          .Set(Setting::kCc, ";off")
          .Set(Setting::kDcqcn, "rpg_ai_rate=10;rpg_ai_rate=20")
          .Set(Setting::kSr, "on;")
          .Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->devices[0].cc, cc::CcMode::kDcqcn);
  EXPECT_EQ(s->devices[1].cc, cc::CcMode::kOff);
  EXPECT_EQ(s->devices[0].dcqcn.rpg_ai_rate, 10u);
  EXPECT_EQ(s->devices[1].dcqcn.rpg_ai_rate, 20u);
  EXPECT_TRUE(s->devices[0].sr.on);
  EXPECT_FALSE(s->devices[1].sr.on);
  ExpectRefused(Raw().Set(Setting::kLink, "net_ring0;net_ring1").Set(Setting::kCc, "off;ecn"), Setting::kCc,
                "droce1: 'ecn' is not dcqcn or off");
  ExpectRefused(Raw().Set(Setting::kCc, "off;off"), Setting::kCc,
                "'off;off' has 2 entries, one per device, but there is 1 device (one per link)");
  EXPECT_STREQ(Info(Setting::kCc).flag, "cc");
  EXPECT_STREQ(Info(Setting::kDcqcn).flag, "dcqcn");
}

// DROCE_SR: selective repeat (transport/selective_repeat.h), off by default.
TEST(Settings, SelectiveRepeat) {
  auto s = Raw().Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->devices[0].sr.on);
  s = Raw().Set(Setting::kSr, "on").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->devices[0].sr.on);
  EXPECT_EQ(s->devices[0].sr.window, 512u);
  EXPECT_EQ(s->devices[0].sr.rto_us, 0u) << "adaptive by default";
  s = Raw().Set(Setting::kSr, "on,window=64,rto=1ms").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->devices[0].sr.window, 64u);
  EXPECT_EQ(s->devices[0].sr.rto_us, 1000u);
  s = Raw().Set(Setting::kSr, "on,rto=auto").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->devices[0].sr.rto_us, 0u);
  EXPECT_FALSE(Raw().Set(Setting::kSr, "off").Parse()->devices[0].sr.on);
  ExpectRefused(Raw().Set(Setting::kSr, "yes"), Setting::kSr, "'yes' is not on or off");
  ExpectRefused(Raw().Set(Setting::kSr, "on,window=100"), Setting::kSr,
                "'window=100': the window is a power of two from 16 to 512 packets");
  ExpectRefused(Raw().Set(Setting::kSr, "on,window=1024"), Setting::kSr,
                "'window=1024': the window is a power of two from 16 to 512 packets");
  ExpectRefused(Raw().Set(Setting::kSr, "on,rto=1us"), Setting::kSr,
                "'rto=1us': the timeout is auto or a time from 10us to 1s (e.g. rto=500us)");
  ExpectRefused(Raw().Set(Setting::kSr, "on,sack=1"), Setting::kSr,
                "'sack=1': the options are window=PKTS and rto=TIME|auto");
  ExpectRefused(Raw().Set(Setting::kSr, "off,window=64"), Setting::kSr, "'off' takes no options");
  EXPECT_STREQ(Info(Setting::kSr).flag, "sr");
}

// DROCE_ADP_RETRANS: adaptive retransmission (transport/adaptive_retrans.h),
// off by default; one value for every device or one entry each.
TEST(Settings, AdaptiveRetrans) {
  auto s = Raw().Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->devices[0].adp.on);
  s = Raw().Set(Setting::kAdpRetrans, "on").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->devices[0].adp.on);
  EXPECT_EQ(s->devices[0].adp.min_us, 500u);
  EXPECT_EQ(s->devices[0].adp.init_us, 1000u);
  s = Raw().Set(Setting::kAdpRetrans, "on,min=100us,init=5ms").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->devices[0].adp.min_us, 100u);
  EXPECT_EQ(s->devices[0].adp.init_us, 5000u);
  s = Raw().Set(Setting::kLink, "net_ring0;net_ring1").Set(Setting::kAdpRetrans, ";on").Parse();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->devices[0].adp.on);
  EXPECT_TRUE(s->devices[1].adp.on);
  EXPECT_FALSE(Raw().Set(Setting::kAdpRetrans, "off").Parse()->devices[0].adp.on);
  ExpectRefused(Raw().Set(Setting::kAdpRetrans, "yes"), Setting::kAdpRetrans, "'yes' is not on or off");
  ExpectRefused(Raw().Set(Setting::kAdpRetrans, "on,min=1us"), Setting::kAdpRetrans,
                "'min=1us': a time from 10us to 1s (e.g. min=500us)");
  ExpectRefused(Raw().Set(Setting::kAdpRetrans, "on,init=2s"), Setting::kAdpRetrans,
                "'init=2s': a time from 10us to 1s (e.g. init=500us)");
  ExpectRefused(Raw().Set(Setting::kAdpRetrans, "on,rto=1ms"), Setting::kAdpRetrans,
                "'rto=1ms': the options are min=TIME and init=TIME");
  ExpectRefused(Raw().Set(Setting::kAdpRetrans, "on,min"), Setting::kAdpRetrans,
                "'min': the options are min=TIME and init=TIME");
  ExpectRefused(Raw().Set(Setting::kAdpRetrans, "off,min=1ms"), Setting::kAdpRetrans, "'off' takes no options");
  EXPECT_STREQ(Info(Setting::kAdpRetrans).flag, "adp-retrans");
}

TEST(Settings, Watch) {
  EXPECT_EQ(Raw().Set(Setting::kWatch, "0").Parse()->global.watch_us, 0u);
  EXPECT_EQ(Raw().Set(Setting::kWatch, "1000").Parse()->global.watch_us, 1000u);
  for (const char* bad : {"abc", "-1", "5us", "1001", " 5"}) {
    ExpectRefused(Raw().Set(Setting::kWatch, bad), Setting::kWatch,
                  std::string("'") + bad + "' is not a poll interval in microseconds (0 to 1000)");
  }
}

// The first bad setting in kSettings order is the one reported.
TEST(Settings, FirstBadSettingIsReported) {
  SettingError error;
  EXPECT_FALSE(Raw().Set(Setting::kMtu, "1").Set(Setting::kIp, "x").Parse(&error).ok());
  EXPECT_EQ(error.setting, Setting::kIp);
}

TEST(Settings, FromTheEnvironment) {
  setenv("DROCE_MTU", "2048", 1);
  setenv("DROCE_WORKER_CPU", "", 1);
  const RawSettings raw = RawSettingsFromEnv();
  EXPECT_EQ(raw[static_cast<size_t>(Setting::kMtu)], "2048");
  EXPECT_EQ(raw[static_cast<size_t>(Setting::kWorkerCpu)], "");
  unsetenv("DROCE_MTU");
  unsetenv("DROCE_WORKER_CPU");
  EXPECT_TRUE(AllowedCpus().any());
}

}  // namespace
}  // namespace droce::config
