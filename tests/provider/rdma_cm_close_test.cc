// Closing an event channel while another thread is still on its way back
// to rdma_get_cm_event (providers/rdma_cm.cc, "Which thread last fetched a
// channel's events"). rping's server does exactly this: its main thread
// destroys the channel, and frees it, as soon as the event thread has
// acknowledged the last event, trusting that thread to be asleep in the
// kernel by then. Linked with Debian's librdmacm and libdroce.so, embedded
// mode on the default loopback link.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace {

sockaddr_in addr_of(const char* ip) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

// A channel with one id resolving the port's own address: one
// ADDR_RESOLVED event is on its way.
void ResolvingId(rdma_event_channel** ch, rdma_cm_id** id) {
  *ch = rdma_create_event_channel();
  ASSERT_NE(*ch, nullptr) << errno;
  ASSERT_EQ(rdma_create_id(*ch, id, nullptr, RDMA_PS_TCP), 0) << errno;
  sockaddr_in src = addr_of("10.77.0.1"), dst = addr_of("10.77.0.1");
  ASSERT_EQ(rdma_resolve_addr(*id, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst), 1000), 0)
      << errno;
}

TEST(RdmaCmClose, WaitsForTheEventThreadToBeBackInGetEvent) {
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
  ASSERT_NO_FATAL_FAILURE(ResolvingId(&ch, &id));

  std::atomic<int> handled{0}, calling_again{0};
  int channel_fd = ch->fd;
  // rping's event thread: handle, acknowledge, and (late, as on a busy
  // machine) come back for the next event. Never returns once back.
  std::thread events([&] {
    rdma_cm_event* e = nullptr;
    if (rdma_get_cm_event(ch, &e) != 0) return;
    handled = e->event == RDMA_CM_EVENT_ADDR_RESOLVED ? 1 : -1;
    rdma_ack_cm_event(e);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    calling_again = 1;
    // The channel is still whole here: close() waited for this call.
    (void)rdma_get_cm_event(ch, &e);
    calling_again = 2;  // never: the closed channel has no more events
  });
  while (handled == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  ASSERT_EQ(handled, 1);
  ASSERT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);  // close(), then free(ch)
  EXPECT_EQ(calling_again, 1);
  EXPECT_EQ(fcntl(channel_fd, F_GETFD), -1);
  // The thread sleeps in the closed channel's wait until the process ends,
  // as on the kernel's device.
  events.detach();
}

// A thread that fetched events and has ended is not waited for.
TEST(RdmaCmClose, NoWaitWhenTheEventThreadHasEnded) {
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
  ASSERT_NO_FATAL_FAILURE(ResolvingId(&ch, &id));
  int event = -1;
  std::thread events([&] {
    rdma_cm_event* e = nullptr;
    if (rdma_get_cm_event(ch, &e) != 0) return;
    event = e->event;
    rdma_ack_cm_event(e);
  });
  events.join();
  EXPECT_EQ(event, RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_EQ(rdma_destroy_id(id), 0);
  const auto t0 = std::chrono::steady_clock::now();
  rdma_destroy_event_channel(ch);
  // 50 ms is the grace; an ended thread gets none (a bound, not a speed).
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(40));
}

}  // namespace
