// The admin interface of an embedded process (DROCE_CTL=1, src/admin/): this
// test process is the engine and asks itself over its own abstract socket,
// as `droce ctl --pid` does. The live views (read while the workers run)
// must equal the exact snapshot of droce_query_qp_counters at rest; the
// Prometheus text must be well formed; bad requests get an error, never a
// crash, and a connection that breaks the protocol is closed.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ctl/protocol.h"
#include "loopback_fixture.h"
#include "nlohmann/json.hpp"

namespace droce::test {
namespace {

using Json = nlohmann::ordered_json;

class AdminCtl : public Loopback {
 protected:
  // A connected admin socket to this process.
  static int Dial() {
    const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    const std::string name = std::string(1, '\0') + "droce-ctl." + std::to_string(getpid());
    std::memcpy(sa.sun_path, name.data(), name.size());
    const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
    // The socket's thread starts with the first device: wait for it.
    for (int i = 0; i < 200; ++i) {
      if (connect(s, reinterpret_cast<sockaddr*>(&sa), len) == 0) return s;
      usleep(10000);
    }
    close(s);
    return -1;
  }

  // Sends one raw message; returns the answer's JSON, or nullopt if the
  // connection was closed instead.
  static std::optional<Json> Exchange(int s, const void* msg, size_t len) {
    if (send(s, msg, len, MSG_NOSIGNAL) != static_cast<ssize_t>(len)) return std::nullopt;
    struct {
      ctl::Reply r;
      ctl::AdminRep a;
    } rep{};
    alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))];
    iovec iov{&rep, sizeof(rep)};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf;
    mh.msg_controllen = sizeof(cbuf);
    const ssize_t n = recvmsg(s, &mh, MSG_CMSG_CLOEXEC);
    if (n <= 0) return std::nullopt;
    EXPECT_EQ(n, static_cast<ssize_t>(sizeof(rep)));
    EXPECT_EQ(rep.r.err, 0);
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    if (c == nullptr || c->cmsg_type != SCM_RIGHTS) {
      ADD_FAILURE() << "no memfd with the answer";
      return std::nullopt;
    }
    int fd;
    std::memcpy(&fd, CMSG_DATA(c), sizeof(fd));
    struct stat st{};
    EXPECT_EQ(fstat(fd, &st), 0);
    EXPECT_GE(static_cast<uint64_t>(st.st_size), rep.a.len);
    void* p = mmap(nullptr, rep.a.len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return std::nullopt;
    Json j = Json::parse(std::string_view(static_cast<const char*>(p), rep.a.len));
    munmap(p, rep.a.len);
    return j;
  }

  static std::vector<uint8_t> Request(const std::string& json, uint32_t seq) {
    struct {
      ctl::Header h;
      ctl::AdminReq a;
    } m{};
    m.h = {ctl::kMagic, ctl::kAdmin, 0, seq, sizeof(m)};
    m.a.len = static_cast<uint32_t>(json.size());
    std::memcpy(m.a.json, json.data(), std::min(json.size(), sizeof(m.a.json)));
    std::vector<uint8_t> v(sizeof(m));
    std::memcpy(v.data(), &m, sizeof(m));
    return v;
  }

  // One question on a fresh connection: the answer's "result" (or the
  // whole document if it is an error).
  static Json Ask(const Json& req) {
    const int s = Dial();
    EXPECT_GE(s, 0);
    auto m = Request(req.dump(), 1);
    auto doc = Exchange(s, m.data(), m.size());
    close(s);
    EXPECT_TRUE(doc.has_value());
    if (!doc) return Json();
    return (*doc)["ok"].get<bool>() ? (*doc)["result"] : *doc;
  }

  // Two connected RC QPs that exchanged `n` SENDs of `len` bytes.
  void Traffic(ibv_qp** a, ibv_qp** b, int n, uint32_t len) {
    *a = CreateQp(scq_, rcq_);
    *b = CreateQp(scq_, rcq_);
    ASSERT_NE(*a, nullptr);
    ASSERT_NE(*b, nullptr);
    Connect(*a, *b);
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(PostRecv(*b, i, 0, len), 0);
      ASSERT_EQ(PostSend(*a, i, len, len), 0);
      ASSERT_EQ(Poll(scq_, 1).size(), 1u);
      ASSERT_EQ(Poll(rcq_, 1).size(), 1u);
    }
  }

  static std::map<std::string, uint64_t> Exact(ibv_qp* qp) {
    std::map<std::string, uint64_t> m;
    const int n = droce_query_qp_counters(qp, nullptr, 0);
    std::vector<uint64_t> v(n);
    EXPECT_EQ(droce_query_qp_counters(qp, v.data(), n), n);
    for (int i = 0; i < n; ++i) m[droce_qp_counter_name(i)] = v[i];
    return m;
  }
};

TEST_F(AdminCtl, ResourcesAndCountersMatchTheVerbsObjects) {
  ibv_qp *a, *b;
  Traffic(&a, &b, 20, 3000);
  const Json qps = Ask({{"cmd", "res"}, {"kind", "qp"}});
  ASSERT_TRUE(qps.is_array()) << qps;
  ASSERT_EQ(qps.size(), 2u) << qps;
  std::set<uint32_t> qpns;
  for (const Json& q : qps) {
    EXPECT_EQ(q["ifname"], "droce0");
    EXPECT_EQ(q["type"], "RC");
    EXPECT_EQ(q["state"], "RTS");
    EXPECT_EQ(q["pid"], getpid());
    // The retransmission timer in force: neither selective repeat nor
    // adaptive retransmission here, so the local ACK timeout 14's 67 ms.
    EXPECT_EQ(q["retrans"], "local-ack");
    EXPECT_EQ(q["rto-us"], (uint64_t{4096} << 14) / 1000);
    qpns.insert(q["lqpn"].get<uint32_t>());
  }
  EXPECT_EQ(qpns, (std::set<uint32_t>{a->qp_num, b->qp_num}));
  EXPECT_EQ(qps[0]["rqpn"], qps[1]["lqpn"]);
  const Json mrs = Ask({{"cmd", "res"}, {"kind", "mr"}});
  ASSERT_EQ(mrs.size(), 1u) << mrs;
  EXPECT_EQ(mrs[0]["mrlen"], buf_.size());
  char lkey[16];
  std::snprintf(lkey, sizeof(lkey), "0x%x", mr_->lkey);
  EXPECT_EQ(mrs[0]["lkey"], lkey);
  EXPECT_EQ(Ask({{"cmd", "res"}, {"kind", "cq"}}).size(), 2u);
  const Json summary = Ask({{"cmd", "res"}});
  EXPECT_EQ(summary[0]["qp"], 2);
  EXPECT_EQ(summary[0]["pd"], 1);

  // The live per-QP view equals the stopped-worker snapshot at rest.
  for (ibv_qp* qp : {a, b}) {
    const Json st = Ask({{"cmd", "stat"}, {"qpn", qp->qp_num}});
    ASSERT_EQ(st.size(), 1u) << st;
    for (const auto& [name, v] : Exact(qp)) EXPECT_EQ(st[0][name], v) << name << " of QP " << qp->qp_num;
  }
  // DROCE_LATENCY=1 (this test's environment): the sender's 20 SENDs, post
  // to completion.
  const Json sa = Ask({{"cmd", "stat"}, {"qpn", a->qp_num}});
  ASSERT_TRUE(sa[0].contains("latency")) << sa;
  const Json& lat = sa[0]["latency"]["send"];
  EXPECT_EQ(lat["count"], 20);
  EXPECT_GT(lat["p50_us"].get<double>(), 0);
  EXPECT_LE(lat["p50_us"].get<double>(), lat["p99.99_us"].get<double>());
  EXPECT_LE(lat["p99.99_us"].get<double>(), lat["max_us"].get<double>() + 1e-9);
  EXPECT_FALSE(Ask({{"cmd", "stat"}, {"qpn", b->qp_num}})[0].contains("latency"));  // it sent nothing
  const auto ea = Exact(a);
  EXPECT_GE(ea.at("sent_pkts"), 20u * 3);  // 3000 B at MTU 1024: 3 packets each
  // The device view is at least the sum of its QPs.
  const Json dev = Ask({{"cmd", "stat"}, {"dev", "droce0"}});
  EXPECT_GE(dev[0]["sent_pkts"].get<uint64_t>(), ea.at("sent_pkts") + Exact(b).at("sent_pkts"));

  const Json clients = Ask({{"cmd", "client"}});
  ASSERT_EQ(clients.size(), 1u);
  EXPECT_EQ(clients[0]["pid"], getpid());
  EXPECT_EQ(clients[0]["qp"], 2);
  EXPECT_EQ(clients[0]["mr_bytes"], buf_.size());
}

// DROCE_LATENCY=1: destroying a QP prints the engine's span (post to
// completion entered) and the application's (post to the poll that returned
// it, what perftest times), with the same count; every completion is polled
// after the engine entered it, so each percentile of the second is at least
// the first's. A send completion's src_qp (the stamp's carrier) reads 0.
TEST_F(AdminCtl, PostToPollLatencyIsPrintedWhenTheQpGoes) {
  ibv_qp* a = CreateQp(scq_, rcq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(a, b);
  for (int i = 0; i < 30; ++i) {
    ASSERT_EQ(PostRecv(b, i, 0, 64), 0);
    ASSERT_EQ(PostSend(a, i, 64, 64), 0);
    const auto wc = Poll(scq_, 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc[0].src_qp, 0u);
    ASSERT_EQ(Poll(rcq_, 1).size(), 1u);
  }
  const uint32_t qpn = a->qp_num;
  qps_.erase(std::find(qps_.begin(), qps_.end(), a));
  testing::internal::CaptureStderr();
  ASSERT_EQ(ibv_destroy_qp(a), 0);
  const std::string err = testing::internal::GetCapturedStderr();
  const std::regex line(R"(droce: droce0 QP (\d+) send latency, (post to completion entered|post to poll) \(us\): )"
                        R"(n (\d+) mean [0-9.]+ p50 ([0-9.]+) p90 ([0-9.]+) p99 ([0-9.]+) p99.9 [0-9.]+ p99.99 [0-9.]+ )"
                        R"(max ([0-9.]+)\n)");
  std::map<std::string, std::vector<double>> got;  // span: p50, p90, p99, max
  for (auto it = std::sregex_iterator(err.begin(), err.end(), line); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    EXPECT_EQ(std::stoul(m[1]), qpn);
    EXPECT_EQ(m[3], "30") << m[0];
    got[m[2]] = {std::stod(m[4]), std::stod(m[5]), std::stod(m[6]), std::stod(m[7])};
  }
  ASSERT_EQ(got.size(), 2u) << err;
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_GE(got["post to poll"][i], got["post to completion entered"][i]) << i << "\n" << err;
  }
}

TEST_F(AdminCtl, PrometheusTextIsWellFormedAndMatches) {
  ibv_qp *a, *b;
  Traffic(&a, &b, 5, 100);
  const Json text = Ask({{"cmd", "metrics"}});
  ASSERT_TRUE(text.is_string()) << text;
  std::istringstream in(text.get<std::string>());
  const std::regex sample(R"(^([a-z_]+)(\{[a-z_]+="[^"\\]*"(,[a-z_]+="[^"\\]*")*\})? [0-9]+$)");
  const std::regex type(R"(^# TYPE ([a-z_]+) (counter|gauge)$)");
  std::set<std::string> typed;
  std::string line;
  const std::string want = "droce_qp_sent_pkts_total{device=\"droce0\",qpn=\"" + std::to_string(a->qp_num) +
                           "\",pid=\"" + std::to_string(getpid()) + "\"} " + std::to_string(Exact(a).at("sent_pkts"));
  bool found = false;
  int samples = 0;
  while (std::getline(in, line)) {
    std::smatch m;
    if (line.starts_with("# HELP ")) continue;
    if (std::regex_match(line, m, type)) {
      EXPECT_TRUE(typed.insert(m[1]).second) << "two TYPE lines for " << m[1];
      continue;
    }
    ASSERT_TRUE(std::regex_match(line, m, sample)) << "not a sample: " << line;
    EXPECT_TRUE(typed.count(m[1])) << "no TYPE before " << line;
    ++samples;
    found |= line == want;
  }
  EXPECT_TRUE(found) << "no line " << want;
  EXPECT_GT(samples, 50);
}

TEST_F(AdminCtl, BadRequestsGetErrors) {
  auto err = [&](const Json& req) {
    const Json d = Ask(req);
    EXPECT_EQ(d.value("ok", true), false) << req << " -> " << d;
    return d.value("code", std::string());
  };
  EXPECT_EQ(err({{"cmd", "frob"}}), "INVALID_ARGUMENT");
  EXPECT_EQ(err({{"nocmd", 1}}), "INVALID_ARGUMENT");
  EXPECT_EQ(err({{"cmd", "res"}, {"kind", "zz"}}), "INVALID_ARGUMENT");
  EXPECT_EQ(err({{"cmd", "res"}, {"qpn", -1}}), "INVALID_ARGUMENT");
  EXPECT_EQ(err({{"cmd", "dev"}, {"dev", "droce7"}}), "INVALID_ARGUMENT");
  EXPECT_EQ(err({{"cmd", "dev"}, {"dev", "droce0/2"}}), "INVALID_ARGUMENT");
  EXPECT_EQ(err({{"cmd", "kill"}, {"pid", 1}}), "FAILED_PRECONDITION");
  EXPECT_EQ(err(Json::array({1, 2})), "INVALID_ARGUMENT");
  // Not JSON at all.
  const int s = Dial();
  ASSERT_GE(s, 0);
  auto m = Request("{not json", 1);
  auto d = Exchange(s, m.data(), m.size());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ((*d)["ok"], false);
  // The same connection goes on with the next sequence number...
  m = Request(R"({"cmd":"dev"})", 2);
  d = Exchange(s, m.data(), m.size());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ((*d)["result"][0]["ifname"], "droce0");
  // ...and is closed on a replayed one.
  m = Request(R"({"cmd":"dev"})", 2);
  EXPECT_FALSE(Exchange(s, m.data(), m.size()).has_value());
  close(s);
}

TEST_F(AdminCtl, ProtocolViolationsCloseTheConnectionOnly) {
  // A verbs op, a too-long length, a short message: each closes the
  // connection; the next one is answered.
  {
    const int s = Dial();
    ASSERT_GE(s, 0);
    ctl::Header h{ctl::kMagic, ctl::kAllocPd, 0, 1, sizeof(ctl::Header)};
    EXPECT_FALSE(Exchange(s, &h, sizeof(h)).has_value());
    close(s);
  }
  {
    const int s = Dial();
    ASSERT_GE(s, 0);
    auto m = Request(R"({"cmd":"dev"})", 1);
    ctl::AdminReq r;
    std::memcpy(&r, m.data() + sizeof(ctl::Header), sizeof(r));
    r.len = ctl::kAdminMaxReq + 1;
    std::memcpy(m.data() + sizeof(ctl::Header), &r, sizeof(r));
    EXPECT_FALSE(Exchange(s, m.data(), m.size()).has_value());
    close(s);
  }
  {
    const int s = Dial();
    ASSERT_GE(s, 0);
    auto m = Request(R"({"cmd":"dev"})", 1);
    EXPECT_FALSE(Exchange(s, m.data(), m.size() - 8).has_value());
    close(s);
  }
  EXPECT_EQ(Ask({{"cmd", "dev"}})[0]["ifname"], "droce0");
}

}  // namespace
}  // namespace droce::test
