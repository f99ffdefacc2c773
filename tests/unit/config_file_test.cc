// droced's configuration file (src/daemon/config_file.h): each section and
// key, the [[device]] tables as per-device lists, and the refusals, each
// naming FILE:LINE: key.
#include "daemon/config_file.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace droce::daemon {
namespace {

using config::Setting;

config::CpuSet Cpus() {
  config::CpuSet c;
  c.set(0);
  c.set(1);
  return c;
}

FileConfig Parse(const std::string& text) {
  auto f = ParseConfigFile(text, "t.toml", Cpus());
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? *f : FileConfig{};
}

std::string Error(const std::string& text) {
  auto f = ParseConfigFile(text, "t.toml", Cpus());
  EXPECT_FALSE(f.ok()) << text;
  return f.ok() ? "" : std::string(f.status().message());
}

const std::string& Raw(const FileConfig& f, Setting s) { return f.settings[static_cast<size_t>(s)]; }

TEST(ConfigFile, EmptyFileSetsNothing) {
  FileConfig f = Parse("");
  for (const std::string& v : f.settings) EXPECT_EQ(v, "");
  EXPECT_FALSE(f.socket.has_value());
  EXPECT_FALSE(f.socket_mode.has_value());
  EXPECT_EQ(f.limits.max_qps, ClientLimits{}.max_qps);
}

TEST(ConfigFile, DaemonSection) {
  FileConfig f = Parse(
      "[daemon]\n"
      "socket = \"/tmp/x.sock\"\n"
      "socket_group = \"0\"\n"
      "socket_mode = \"0660\"\n"
      "metrics_address = \"0.0.0.0\"\n"
      "metrics_port = 9100\n"
      "log_level = \"debug\"\n");
  EXPECT_EQ(f.socket, "/tmp/x.sock");
  EXPECT_EQ(f.socket_group, "0");
  EXPECT_EQ(f.socket_mode, 0660u);
  EXPECT_EQ(f.metrics_address, "0.0.0.0");
  EXPECT_EQ(f.metrics_port, 9100);
  EXPECT_EQ(Raw(f, Setting::kLogLevel), "debug");
}

TEST(ConfigFile, Limits) {
  FileConfig f = Parse("[limits]\nmax_qps = 8\nmax_cqs = 0\nmax_mrs = 3\nmax_cqes = 100\nmax_mr_bytes = 1073741824\n");
  EXPECT_EQ(f.limits.max_qps, 8u);
  EXPECT_EQ(f.limits.max_cqs, 0u);
  EXPECT_EQ(f.limits.max_mrs, 3u);
  EXPECT_EQ(f.limits.max_cqes, 100u);
  EXPECT_EQ(f.limits.max_mr_bytes, 1073741824u);
}

TEST(ConfigFile, EngineSettingsAsTheirVariables) {
  FileConfig f = Parse(
      "[engine]\nmtu = 4096\nvlan = \"100:3\"\nhugepages = \"off\"\nprogress = \"thread\"\n"
      "poll_yield = 0\nstats = true\ntelemetry = false\nctl = true\n");
  EXPECT_EQ(Raw(f, Setting::kMtu), "4096");
  EXPECT_EQ(Raw(f, Setting::kVlan), "100:3");
  EXPECT_EQ(Raw(f, Setting::kHugepages), "off");
  EXPECT_EQ(Raw(f, Setting::kProgress), "thread");
  EXPECT_EQ(Raw(f, Setting::kPollYield), "0");
  EXPECT_EQ(Raw(f, Setting::kStats), "1");
  EXPECT_EQ(Raw(f, Setting::kTelemetry), "0");
  EXPECT_EQ(Raw(f, Setting::kCtl), "1");
  EXPECT_EQ(Raw(Parse("[engine]\nvlan = 7\n"), Setting::kVlan), "7");
  EXPECT_EQ(Raw(Parse("[engine]\nrate = \"1gbit,burst=64k\"\n"), Setting::kRate), "1gbit,burst=64k");
  EXPECT_EQ(Raw(Parse("[engine]\ncc = \"off\"\n"), Setting::kCc), "off");
  EXPECT_EQ(Raw(Parse("[engine]\ndcqcn = \"rpg_ai_rate=10\"\n"), Setting::kDcqcn), "rpg_ai_rate=10");
  EXPECT_EQ(Raw(Parse("[engine]\nsr = \"on,window=128\"\n"), Setting::kSr), "on,window=128");
  EXPECT_EQ(Raw(Parse("[engine]\nadp_retrans = \"on,min=1ms\"\n"), Setting::kAdpRetrans), "on,min=1ms");
  EXPECT_EQ(Raw(Parse("[engine]\nwatch_us = 50\n"), Setting::kWatch), "50");
}

TEST(ConfigFile, DevicesBecomePerDeviceLists) {
  FileConfig f = Parse(
      "[[device]]\n"
      "link = \"net_memif0,role=server\"\n"
      "ip = \"10.1.0.1/16\"\n"
      "workers = 2\n"
      "worker_cpu = [0, 1]\n"
      "[[device]]\n"
      "link = \"net_memif1,role=client\"\n"
      "ip6 = \"fd00::2/64\"\n"
      "mac = \"02:00:00:00:00:02\"\n"
      "worker_cpu = 1\n");
  EXPECT_EQ(Raw(f, Setting::kLink), "net_memif0,role=server;net_memif1,role=client");
  EXPECT_EQ(Raw(f, Setting::kIp), "10.1.0.1/16;");
  EXPECT_EQ(Raw(f, Setting::kIp6), ";fd00::2/64");
  EXPECT_EQ(Raw(f, Setting::kMac), ";02:00:00:00:00:02");
  EXPECT_EQ(Raw(f, Setting::kWorkers), "2;");
  EXPECT_EQ(Raw(f, Setting::kWorkerCpu), "0,1;1");
  // What the engine makes of them: two devices, the second with defaults.
  auto s = config::ParseSettings(f.settings, Cpus());
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->devices.size(), 2u);
  EXPECT_EQ(s->devices[0].workers, 2);
  EXPECT_EQ(s->devices[1].workers, 1);
  EXPECT_EQ(s->devices[1].ip, (10u << 24) | (77u << 16) | (1u << 8) | 1u);
  EXPECT_TRUE(s->devices[1].has_ip6);
}

TEST(ConfigFile, OneLoopbackDevice) {
  FileConfig f = Parse("[[device]]\nip = \"10.9.0.1/24\"\n");
  EXPECT_EQ(Raw(f, Setting::kLink), "");
  EXPECT_EQ(Raw(f, Setting::kIp), "10.9.0.1/24");
  // A device on the loopback link before another is an empty entry.
  EXPECT_EQ(Raw(Parse("[[device]]\n[[device]]\nlink = \"b\"\n"), Setting::kLink), ";b");
}

TEST(ConfigFile, GatewayCheckedAgainstTheFilesAddresses) {
  FileConfig f = Parse("[engine]\ngateway = \"10.9.0.254\"\n[[device]]\nip = \"10.9.0.1/24\"\n");
  EXPECT_EQ(Raw(f, Setting::kGateway), "10.9.0.254");
  EXPECT_EQ(Error("[engine]\ngateway = \"10.8.0.254\"\n[[device]]\nip = \"10.9.0.1/24\"\n"),
            "t.toml:2: engine.gateway: '10.8.0.254' is not another address on the port's subnet "
            "(droce0: 10.9.0.1/24)");
}

TEST(ConfigFile, SyntaxError) {
  EXPECT_EQ(Error("[daemon]\nsocket = \n").substr(0, 23), "t.toml:2: syntax error:");
  EXPECT_EQ(Error("[daemon\n").substr(0, 23), "t.toml:1: syntax error:");
}

TEST(ConfigFile, UnknownKeysAndSections) {
  EXPECT_EQ(Error("[daemon]\n\nsockets = \"x\"\n"), "t.toml:3: daemon.sockets: unknown key");
  EXPECT_EQ(Error("[deamon]\nsocket = \"x\"\n"), "t.toml:1: deamon: unknown section");
  EXPECT_EQ(Error("socket = \"x\"\n"), "t.toml:1: socket: unknown key");
  EXPECT_EQ(Error("[limits]\nmax_pds = 1\n"), "t.toml:2: limits.max_pds: unknown key");
  EXPECT_EQ(Error("[engine]\nlink = \"x\"\n"), "t.toml:2: engine.link: unknown key");
  EXPECT_EQ(Error("[[device]]\nlink = \"a\"\n[[device]]\nlnk = \"b\"\n"), "t.toml:4: device.lnk: unknown key");
  EXPECT_EQ(Error("[[device]]\nmtu = 1024\n"),
            "t.toml:2: device.mtu: one value for every device (the engine has one): set it in [engine]");
  EXPECT_EQ(Error("[engine]\nlog_level = \"info\"\n"), "t.toml:2: engine.log_level: set it in [daemon]");
  EXPECT_EQ(Error("[[device]]\ncc = \"off\"\n"),
            "t.toml:2: device.cc: set it in [engine]: one value for every device, or a ';' list with one entry per device");
}

// cc, dcqcn and sr in [engine]: one value, or one entry per [[device]],
// each entry checked alone and their count against the devices.
TEST(ConfigFile, PerDeviceListsInEngine) {
  const std::string two = "[[device]]\nlink = \"net_ring0\"\n[[device]]\nlink = \"net_ring1\"\n";
  FileConfig f = Parse("[engine]\ncc = \"dcqcn;off\"\nsr = \"on;\"\ndcqcn = \";rpg_ai_rate=10\"\n" + two);
  EXPECT_EQ(Raw(f, Setting::kCc), "dcqcn;off");
  EXPECT_EQ(Raw(f, Setting::kSr), "on;");
  EXPECT_EQ(Raw(f, Setting::kDcqcn), ";rpg_ai_rate=10");
  EXPECT_EQ(Error("[engine]\ncc = \"dcqcn;ecn\"\n" + two), "t.toml:2: engine.cc: 'ecn' is not dcqcn or off");
  const std::string three = Error("[engine]\nsr = \"on;on;on\"\n" + two);
  EXPECT_NE(three.find("has 3 entries, one per device, but there are 2 devices"), std::string::npos) << three;
}

TEST(ConfigFile, WrongTypes) {
  EXPECT_EQ(Error("[daemon]\nsocket = 3\n"), "t.toml:2: daemon.socket: expected a string, got an integer");
  EXPECT_EQ(Error("[daemon]\nmetrics_port = \"80\"\n"),
            "t.toml:2: daemon.metrics_port: expected an integer, got a string");
  EXPECT_EQ(Error("[daemon]\nsocket_mode = 0o660\n"),
            "t.toml:2: daemon.socket_mode: write the mode as a string of octal digits, e.g. \"0660\"");
  EXPECT_EQ(Error("[engine]\nstats = 1\n"), "t.toml:2: engine.stats: expected true or false, got an integer");
  EXPECT_EQ(Error("[engine]\nmtu = 1024.0\n"), "t.toml:2: engine.mtu: expected an integer, got a float");
  EXPECT_EQ(Error("[[device]]\nworker_cpu = [0, \"1\"]\n"),
            "t.toml:2: device.worker_cpu: expected CPU numbers (integers), got a string");
  EXPECT_EQ(Error("daemon = 1\n"), "t.toml:1: daemon: expected a [daemon] table, got an integer");
  EXPECT_EQ(Error("[device]\nlink = \"a\"\n"), "t.toml:1: device: expected [[device]] tables, one per device");
}

TEST(ConfigFile, BadValuesWithTheSettingsReasons) {
  EXPECT_EQ(Error("[daemon]\nsocket_mode = \"0968\"\n"),
            "t.toml:2: daemon.socket_mode: '0968' is not an octal mode (e.g. 0660)");
  EXPECT_EQ(Error("[daemon]\nsocket_mode = \"10660\"\n"),
            "t.toml:2: daemon.socket_mode: '10660' is not an octal mode (e.g. 0660)");
  EXPECT_EQ(Error("[daemon]\nmetrics_port = 65536\n"),
            "t.toml:2: daemon.metrics_port: 65536 is out of range (0 to 65535)");
  EXPECT_EQ(Error("[daemon]\nmetrics_address = \"localhost\"\n"),
            "t.toml:2: daemon.metrics_address: 'localhost' is not an IPv4 address");
  EXPECT_EQ(Error("[daemon]\nsocket_group = \"no-such-group-droce\"\n"),
            "t.toml:2: daemon.socket_group: no group 'no-such-group-droce'");
  EXPECT_EQ(Error("[daemon]\nsocket = \"\"\n"),
            "t.toml:2: daemon.socket: '' is empty or too long for a unix socket (107 bytes)");
  EXPECT_EQ(Error("[daemon]\nlog_level = \"loud\"\n").substr(0, 28), "t.toml:2: daemon.log_level: ");
  EXPECT_EQ(Error("[limits]\nmax_qps = -1\n"), "t.toml:2: limits.max_qps: -1 is out of range (0 to 4294967295)");
  EXPECT_EQ(Error("[limits]\nmax_qps = 4294967296\n"),
            "t.toml:2: limits.max_qps: 4294967296 is out of range (0 to 4294967295)");
  EXPECT_EQ(Error("[engine]\nmtu = 1000\n").substr(0, 22), "t.toml:2: engine.mtu: ");
  EXPECT_EQ(Error("[engine]\nvlan = 4095\n").substr(0, 22), "t.toml:2: engine.vlan:");
  EXPECT_EQ(Error("[engine]\ngateway = \"10.0.0.1/24\"\n"),
            "t.toml:2: engine.gateway: '10.0.0.1/24' has a prefix length: a gateway is one address (the subnet "
            "is the port's)");
  EXPECT_EQ(Error("[[device]]\nip = \"10.0.0.256\"\n"), "t.toml:2: device.ip: invalid IPv4 address '10.0.0.256'");
  EXPECT_EQ(Error("[[device]]\nip6 = \"zz\"\n"), "t.toml:2: device.ip6: invalid IPv6 address 'zz'");
  EXPECT_EQ(Error("[[device]]\nworkers = 0\n"), "t.toml:2: device.workers: '0' is not a worker count (1 to 16)");
  EXPECT_EQ(Error("[[device]]\nworker_cpu = 7\n"),
            "t.toml:2: device.worker_cpu: '7' is not a CPU this process may run on");
  EXPECT_EQ(Error("[[device]]\nip = \"10.0.0.1/24;10.0.1.1/24\"\n"),
            "t.toml:2: device.ip: '10.0.0.1/24;10.0.1.1/24' has a ';': one [[device]] table per device");
  EXPECT_EQ(Error("[[device]]\nlink = \"a;b\"\n"),
            "t.toml:2: device.link: 'a;b' has a ';': one [[device]] table per device");
  EXPECT_EQ(Error("[[device]]\nip = \"\"\n"), "t.toml:2: device.ip: empty (leave the key out for the default)");
  EXPECT_EQ(Error("[[device]]\nlink = \"a\"\n[[device]]\nip = \"10.0.0.1\"\n"),
            "t.toml:3: device.link: the last of several devices needs a link (only a device before others can be "
            "the internal loopback link)");
}

TEST(ConfigFile, TooManyDevices) {
  std::string text;
  for (int i = 0; i < 17; ++i) text += "[[device]]\nlink = \"l" + std::to_string(i) + "\"\n";
  EXPECT_EQ(Error(text), "t.toml:33: device: 17 devices, at most 16");
}

TEST(ConfigFile, MissingFile) {
  auto f = LoadConfigFile("/nonexistent/droced.toml", Cpus());
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().message(), "/nonexistent/droced.toml: cannot read: No such file or directory");
}

// The example shipped in tools/droced/ loads, and says what it shows.
TEST(ConfigFile, ShippedExampleLoads) {
  const char* path = std::getenv("DROCE_EXAMPLE_CONFIG");
  ASSERT_NE(path, nullptr) << "meson sets DROCE_EXAMPLE_CONFIG";
  auto f = LoadConfigFile(path, Cpus());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->socket, "/run/droce/droced.sock");
  EXPECT_EQ(f->socket_mode, 0660u);
  EXPECT_EQ(Raw(*f, Setting::kIp), "10.77.1.1/24");
  EXPECT_TRUE(config::ParseSettings(f->settings, Cpus()).ok());
}

TEST(SocketOptions, Parsers) {
  EXPECT_EQ(*ParseSocketMode("660"), 0660u);
  EXPECT_EQ(*ParseSocketMode("0777"), 0777u);
  EXPECT_FALSE(ParseSocketMode("").ok());
  EXPECT_FALSE(ParseSocketMode("u+rw").ok());
  EXPECT_EQ(*ResolveGroup("root"), 0u);
  EXPECT_EQ(*ResolveGroup("0"), 0u);
  EXPECT_EQ(*ResolveGroup(std::to_string(getgid())), getgid());
  EXPECT_FALSE(ResolveGroup("").ok());
  EXPECT_EQ(*ParseMetricsPort("0"), 0);
  EXPECT_EQ(*ParseMetricsPort("65535"), 65535);
  EXPECT_FALSE(ParseMetricsPort("-1").ok());
  EXPECT_FALSE(ParseMetricsPort("65536").ok());
  EXPECT_TRUE(CheckMetricsAddress("127.0.0.1").ok());
  EXPECT_FALSE(CheckMetricsAddress("::1").ok());
}

}  // namespace
}  // namespace droce::daemon
