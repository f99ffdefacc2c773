// Per-worker datapath counters. Plain fields with one writer (the worker
// thread); readers on the slow path may see slightly stale values. Names
// follow Linux rxe's hw counters where one exists.
#pragma once

#include <cstdint>

namespace droce {

#define DROCE_COUNTERS(X)                                                                   \
  X(sent_pkts, "RoCE packets transmitted")                                                 \
  X(rcvd_pkts, "RoCE packets received and accepted by a QP")                               \
  X(tx_dropped, "frames the link refused after retries; the transport retransmits")        \
  X(link_downed, "times the port's link went down (IBV_EVENT_PORT_ERR)")                   \
  X(srq_err, "SRQs put in error because their shared ring was corrupt (IBV_EVENT_SRQ_ERR)") \
  X(icrc_err, "received packets dropped because their ICRC was wrong")                     \
  X(malformed_pkts, "received frames to UDP 4791 dropped as malformed (bad length, opcode...)") \
  X(unknown_qp, "received packets for a QPN that does not exist")                          \
  X(qp_state_drop, "received packets dropped because the QP was not in RTR/RTS")          \
  X(duplicate_request, "duplicate requests received (re-acknowledged, not re-executed)")   \
  X(out_of_seq_request, "requests received with a PSN ahead of the expected one")          \
  X(rcvd_seq_err, "PSN sequence error NAKs received")                                      \
  X(rcvd_rnr_err, "RNR NAKs received")                                                     \
  X(send_rnr_err, "RNR NAKs sent because no receive WQE was posted")                      \
  X(rcvd_inv_req_err, "invalid request NAKs received")                                     \
  X(send_inv_req_err, "invalid request NAKs sent (bad opcode sequence, length, unsupported)") \
  X(retry_exceeded_err, "send WQEs failed after retry_cnt transport retries")              \
  X(rnr_nak_retry_err, "send WQEs failed after rnr_retry RNR retries")                     \
  X(completer_retry_err, "ACK timeouts that caused a retransmission")                     \
  X(stale_ack, "ACKs outside the outstanding PSN window, ignored")                         \
  X(bad_wqe, "work requests completed in error because the WQE was invalid")               \
  X(cq_overflow, "completions that could not be entered because the CQ was full")          \
  X(arp_requests, "ARP requests sent while resolving a destination")                       \
  X(arp_replies, "ARP replies sent for the device's own address")                          \
  X(non_roce_drop, "received frames that were neither RoCEv2 nor ARP, dropped")           \
  X(qkey_viol, "UD packets dropped because their Q_Key did not match the QP's")           \
  X(mcast_rcvd_pkts, "multicast packets received for a group with attached QPs (once per packet; each QP then counts its own)") \
  X(mcast_no_group_drop, "multicast packets dropped because no QP of the device is attached to their group") \
  X(mcast_bad_drop, "multicast packets dropped because they were not UD SENDs to the multicast QPN 0xFFFFFF") \
  X(dropped_msgs, "UC/UD messages dropped (no receive WQE, PSN gap, bad key or length)")   \
  X(send_rem_access_err, "remote access error NAKs sent (bad rkey, rights or bounds)")    \
  X(ack_coalesced, "ACKs merged into a pending one instead of being sent separately")

struct Counters {
#define DROCE_COUNTER_FIELD(name, desc) uint64_t name = 0;
  DROCE_COUNTERS(DROCE_COUNTER_FIELD)
#undef DROCE_COUNTER_FIELD
};

struct CounterInfo {
  const char* name;
  const char* description;
  uint64_t Counters::*field;
};

inline constexpr CounterInfo kCounterInfo[] = {
#define DROCE_COUNTER_INFO(name, desc) {#name, desc, &Counters::name},
    DROCE_COUNTERS(DROCE_COUNTER_INFO)
#undef DROCE_COUNTER_INFO
};

}  // namespace droce
