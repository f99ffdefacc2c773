// The raw-DPDK ping-pong latency ceiling for bench/run: sends one frame on
// port 0, busy-polls until it comes back (the peer is dpdk-testpmd in
// macswap forwarding mode), and repeats. Reports the median and the 99th
// percentile of half the round trip, the figure perftest's *_lat programs
// report, for each requested frame size.
//
//   memif_pingpong [EAL options] -- [--sizes 62,78] [--iters N] [--warmup N]
//                                   [--link-wait SECONDS]
//
// Output, one line per size:
//   pingpong size=62 iters=20000 lost=0 half_rtt_us p50=0.271 p99=0.402 min=0.240
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr uint16_t kDesc = 1024;

int Fail(const char* what) {
  std::fprintf(stderr, "memif_pingpong: %s\n", what);
  return 1;
}

double Percentile(std::vector<uint64_t>& v, double p) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(i), v.end());
  return static_cast<double>(v[i]);
}

}  // namespace

int main(int argc, char** argv) {
  const int eal = rte_eal_init(argc, argv);
  if (eal < 0) return Fail("EAL init failed");
  argc -= eal;
  argv += eal;
  std::vector<uint32_t> sizes = {62};
  unsigned iters = 20000, warmup = 2000;
  double link_wait = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--sizes" && v != nullptr) {
      sizes.clear();
      for (const char* p = v; *p != '\0';) {
        char* end = nullptr;
        sizes.push_back(static_cast<uint32_t>(std::strtoul(p, &end, 10)));
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p != '\0') return Fail("bad --sizes");
      }
      ++i;
    } else if (a == "--iters" && v != nullptr) {
      iters = static_cast<unsigned>(std::strtoul(v, nullptr, 10));
      ++i;
    } else if (a == "--warmup" && v != nullptr) {
      warmup = static_cast<unsigned>(std::strtoul(v, nullptr, 10));
      ++i;
    } else if (a == "--link-wait" && v != nullptr) {
      link_wait = std::strtod(v, nullptr);
      ++i;
    } else {
      return Fail("usage: memif_pingpong [EAL options] -- [--sizes A,B] [--iters N] [--warmup N] [--link-wait S]");
    }
  }
  for (uint32_t s : sizes) {
    if (s < 60 || s > 1500) return Fail("frame sizes must be 60..1500");
  }
  if (rte_eth_dev_count_avail() < 1) return Fail("no port (pass --vdev net_memif0,...)");
  const uint16_t port = 0;
  rte_mempool* pool = rte_pktmbuf_pool_create("pp", 4095, 256, 0, RTE_MBUF_DEFAULT_BUF_SIZE, static_cast<int>(rte_socket_id()));
  if (pool == nullptr) return Fail("mbuf pool");
  rte_eth_conf conf{};
  if (rte_eth_dev_configure(port, 1, 1, &conf) != 0) return Fail("configure");
  if (rte_eth_rx_queue_setup(port, 0, kDesc, rte_eth_dev_socket_id(port), nullptr, pool) != 0) return Fail("rx queue");
  if (rte_eth_tx_queue_setup(port, 0, kDesc, rte_eth_dev_socket_id(port), nullptr) != 0) return Fail("tx queue");
  if (rte_eth_dev_start(port) != 0) return Fail("start");

  const uint64_t hz = rte_get_tsc_hz();
  // memif reports link up once the peer has connected.
  const uint64_t wait_until = rte_rdtsc() + static_cast<uint64_t>(link_wait * static_cast<double>(hz));
  for (;;) {
    rte_eth_link link{};
    rte_eth_link_get_nowait(port, &link);
    if (link.link_status == RTE_ETH_LINK_UP) break;
    if (rte_rdtsc() > wait_until) return Fail("link did not come up");
    rte_delay_us_sleep(10000);
  }

  int rc = 0;
  for (uint32_t size : sizes) {
    // Ethernet header (broadcast to locally administered source, an
    // experimental EtherType), then a sequence number and filler.
    std::vector<uint8_t> tmpl(size, 0xA5);
    std::memset(tmpl.data(), 0xFF, 6);
    const uint8_t src[6] = {0x02, 0, 0, 0, 0, 0x01};
    std::memcpy(tmpl.data() + 6, src, 6);
    tmpl[12] = 0x88;
    tmpl[13] = 0xB5;
    std::vector<uint64_t> rtt;
    rtt.reserve(iters);
    unsigned lost = 0;
    for (uint32_t seq = 0; seq < warmup + iters && lost < 100; ++seq) {
      rte_mbuf* m = rte_pktmbuf_alloc(pool);
      if (m == nullptr) return Fail("mbuf alloc");
      uint8_t* d = reinterpret_cast<uint8_t*>(rte_pktmbuf_append(m, static_cast<uint16_t>(size)));
      std::memcpy(d, tmpl.data(), size);
      std::memcpy(d + 14, &seq, sizeof(seq));
      const uint64_t t0 = rte_rdtsc();
      while (rte_eth_tx_burst(port, 0, &m, 1) == 0) {
      }
      bool back = false;
      const uint64_t deadline = t0 + hz;  // a frame not back within 1 s is lost
      while (!back) {
        rte_mbuf* rx[32];
        const uint16_t n = rte_eth_rx_burst(port, 0, rx, 32);
        const uint64_t t1 = rte_rdtsc();
        for (uint16_t i = 0; i < n; ++i) {
          uint32_t got = 0;
          if (rte_pktmbuf_data_len(rx[i]) >= 18) std::memcpy(&got, rte_pktmbuf_mtod_offset(rx[i], uint8_t*, 14), 4);
          if (got == seq) {
            back = true;
            if (seq >= warmup) rtt.push_back(t1 - t0);
          }
          rte_pktmbuf_free(rx[i]);
        }
        if (!back && t1 > deadline) {
          ++lost;
          break;
        }
      }
    }
    if (rtt.empty()) {
      std::printf("pingpong size=%u iters=0 lost=%u\n", size, lost);
      rc = 1;
      continue;
    }
    // Half the round trip in microseconds.
    const double us = 1e6 / static_cast<double>(hz) / 2;
    const double p50 = Percentile(rtt, 0.50) * us;
    const double p99 = Percentile(rtt, 0.99) * us;
    const double mn = static_cast<double>(*std::min_element(rtt.begin(), rtt.end())) * us;
    std::printf("pingpong size=%u iters=%zu lost=%u half_rtt_us p50=%.3f p99=%.3f min=%.3f\n", size, rtt.size(), lost,
                p50, p99, mn);
    std::fflush(stdout);
  }
  rte_eth_dev_stop(port);
  rte_eth_dev_close(port);
  rte_eal_cleanup();
  return rc;
}
