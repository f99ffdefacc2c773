// Datapath counters, per device and per QP (docs/COUNTERS.md). Plain fields
// with one writer (each worker has its own copy of the device's). The writer
// counts with Bump, a relaxed atomic load and store (no locked instruction:
// on x86 the same code as ++), so that a reader on another thread may Peek
// at them while the worker runs — `droce ctl stat`, the metrics endpoint —
// without stopping it. Names follow Linux rxe's hw counters where one exists.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>

namespace droce {

// One event more (or n), by the counter's only writer.
inline void Bump(uint64_t& c, uint64_t n = 1) {
  std::atomic_ref<uint64_t> r(c);
  r.store(r.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}
// The counter's value as another thread sees it now (never torn).
inline uint64_t Peek(const uint64_t& c) {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(c)).load(std::memory_order_relaxed);
}

#define DROCE_COUNTERS(X)                                                                   \
  X(sent_pkts, "RoCE packets transmitted")                                                 \
  X(rcvd_pkts, "RoCE packets received for an existing QP (requests, responses, duplicates)") \
  X(tx_dropped, "responses a responder could not queue (READ responses or ACKs beyond its queue of owed responses); the requester retransmits") \
  X(tx_link_full, "times the link stopped taking frames (its transmit ring full: the peer not draining it, or not there yet); they wait, in order, and go when it takes them again") \
  X(engine_stalls, "times a worker's engine ran no turn for more than 10 ms (its CPU taken by other threads, a control call, a stopped process, or a hypervisor that froze the virtual CPU); a peer waiting for an ACK meanwhile may reach its local ACK timeout") \
  X(engine_stalled_us, "microseconds the engine_stalls lasted in all") \
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
  X(other_host_drop, "received frames addressed to another station (a unicast MAC, or a RoCEv2 IP address, not the port's), dropped uncounted elsewhere") \
  X(qkey_viol, "UD packets dropped because their Q_Key did not match the QP's")           \
  X(mcast_rcvd_pkts, "multicast packets received for a group with attached QPs (once per packet; each QP then counts its own)") \
  X(mcast_no_group_drop, "multicast packets dropped because no QP of the device is attached to their group") \
  X(mcast_bad_drop, "multicast packets dropped because they were not UD SENDs to the multicast QPN 0xFFFFFF") \
  X(dropped_msgs, "UC/UD messages dropped (no receive WQE, PSN gap, bad key or length)")   \
  X(send_rem_access_err, "remote access error NAKs sent (bad rkey, rights or bounds)")    \
  X(ack_coalesced, "ACKs merged into a pending one instead of being sent separately")      \
  X(self_loop_pkts, "frames sent to the port's own address, delivered inside the device instead of the link") \
  X(handoff_pkts, "received packets handed to the worker that owns their QP (DROCE_WORKERS > 1)") \
  X(handoff_drop, "received packets dropped because the owning worker's hand-off ring was full") \
  X(foreign_doorbells, "droced: doorbells a client rang for a QP that is not its own (ignored)") \
  X(gsi_rcvd, "MADs received on QP1 (the GSI QP) and passed to the connection manager")    \
  X(gsi_sent, "MADs sent from QP1 by the connection manager")                               \
  X(gsi_drop, "packets to QP1 dropped: not a UD SEND of a 256-byte MAD with Q_Key 0x80010000, no connection manager, or no MAC for the destination within 3 s") \
  X(implied_nak_seq_err, "ConnectX: READ responses whose PSN was beyond the expected one (an implied NAK: responses were lost, the rest is asked again)") \
  X(req_cqe_error, "ConnectX: send completions with an error status other than flushed")  \
  X(req_cqe_flush_error, "ConnectX: send completions flushed (IBV_WC_WR_FLUSH_ERR) by a QP in error") \
  X(resp_cqe_error, "ConnectX: receive completions with an error status other than flushed") \
  X(resp_cqe_flush_error, "ConnectX: receive completions flushed (IBV_WC_WR_FLUSH_ERR) by a QP in error") \
  X(rx_read_requests, "ConnectX: RDMA READ requests received and executed (not duplicates)") \
  X(rx_write_requests, "ConnectX: RDMA WRITE messages received (their FIRST or ONLY packet, not duplicates)") \
  X(rx_atomic_requests, "ConnectX: atomic requests received and executed (not duplicates)") \
  X(xrc_bad_srqn, "XRC requests whose XRCETH named no SRQ of the target QP's XRC domain (or another SRQ mid-message): NAK invalid request") \
  X(out_of_buffer, "ConnectX: messages that found no receive WQE (an RNR NAK sent on RC/XRC, the message dropped on UC/UD)") \
  X(req_remote_access_errors, "ConnectX: remote access error NAKs received by a requester (bad rkey, rights or bounds at the peer)") \
  X(resp_local_length_error, "ConnectX: receive completions with IBV_WC_LOC_LEN_ERR (a message longer than its receive WQE, or a malformed receive WQE)") \
  X(np_ecn_marked_roce_packets, "ConnectX: RoCE packets received with ECN CE (congestion met on the way); with DCQCN on, the QP answers with CNPs") \
  X(np_cnp_sent, "ConnectX: CNPs sent by a notification point, at most one per min_time_between_cnps per QP") \
  X(rp_cnp_handled, "ConnectX: CNPs received and acted on by a reaction point (DCQCN cut the QP's rate)") \
  X(rp_cnp_ignored, "ConnectX: CNPs received by a QP with congestion control off (not acted on)") \
  X(retransmitted_pkts, "request packets sent again (a go-back-N rewind, a timeout, a selective-repeat resend)") \
  X(gbn_window_cuts, "go-back-N: losses (a NAK sequence error or READ response gap, once per window of data, or a timeout) that cut the requester's window of packets in flight") \
  X(sr_sack_sent, "selective repeat: SACKs sent for requests received out of order and held") \
  X(sr_sack_rcvd, "selective repeat: SACKs received by a requester") \
  X(sr_held_pkts, "selective repeat: requests received out of order and held until the missing ones arrived") \
  X(sr_timeouts, "selective repeat: retransmission timeouts (the oldest unacknowledged packet resent; not a transport retry)") \
  X(sr_spurious_resends, "selective repeat: resent requests the responder had already received, as its ACKs report them (DSACK-style): resends that were not needed") \
  X(roce_adp_retrans, "ConnectX: adaptive retransmissions (DROCE_ADP_RETRANS): go-back-N resends from the oldest unacknowledged packet when the round-trip timer expired before the QP's local ACK timeout (no retry spent)") \
  X(roce_adp_retrans_to, "ConnectX: local ACK timeouts reached by a QP with adaptive retransmission on: its adaptive resends brought no acknowledgement (each also in completer_retry_err)")

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
inline constexpr size_t kNumCounters = std::size(kCounterInfo);

// ConnectX (mlx5) hw_counters names for counters droce already has under
// rxe's name with the same meaning: the sysfs view lists both names, and
// both read the one counter (docs/COUNTERS.md).
struct CounterAlias {
  const char* name;    // ConnectX's
  const char* target;  // the counter above
};
inline constexpr CounterAlias kCounterAliases[] = {
    {"out_of_sequence", "out_of_seq_request"},
    {"packet_seq_err", "rcvd_seq_err"},
    {"local_ack_timeout_err", "completer_retry_err"},
    {"req_remote_invalid_request", "rcvd_inv_req_err"},
    {"resp_remote_access_error", "send_rem_access_err"},
    {"rx_icrc_encapsulated", "icrc_err"},
};

// Per-QP counters: the device counters that count one QP's events, with the
// same names and meanings (docs/COUNTERS.md). The transport counts each event
// in its QP and in the device (Qp::Count). The QP's worker is their only
// writer, and they are read by a control call while every worker is stopped,
// so they are plain fields.
#define DROCE_QP_COUNTERS(X) \
  X(sent_pkts)               \
  X(rcvd_pkts)               \
  X(duplicate_request)       \
  X(out_of_seq_request)      \
  X(rcvd_seq_err)            \
  X(rcvd_rnr_err)            \
  X(send_rnr_err)            \
  X(rcvd_inv_req_err)        \
  X(send_inv_req_err)        \
  X(send_rem_access_err)     \
  X(retry_exceeded_err)      \
  X(rnr_nak_retry_err)       \
  X(completer_retry_err)     \
  X(stale_ack)               \
  X(ack_coalesced)           \
  X(tx_dropped)              \
  X(malformed_pkts)          \
  X(qp_state_drop)           \
  X(qkey_viol)               \
  X(dropped_msgs)            \
  X(bad_wqe)                 \
  X(cq_overflow)             \
  X(implied_nak_seq_err)     \
  X(req_cqe_error)           \
  X(req_cqe_flush_error)     \
  X(resp_cqe_error)          \
  X(resp_cqe_flush_error)    \
  X(rx_read_requests)        \
  X(rx_write_requests)       \
  X(rx_atomic_requests)      \
  X(xrc_bad_srqn)            \
  X(out_of_buffer)           \
  X(req_remote_access_errors) \
  X(resp_local_length_error) \
  X(np_ecn_marked_roce_packets) \
  X(np_cnp_sent)             \
  X(rp_cnp_handled)          \
  X(rp_cnp_ignored)          \
  X(retransmitted_pkts)      \
  X(gbn_window_cuts)         \
  X(sr_sack_sent)            \
  X(sr_sack_rcvd)            \
  X(sr_held_pkts)            \
  X(sr_timeouts)             \
  X(sr_spurious_resends)     \
  X(roce_adp_retrans)        \
  X(roce_adp_retrans_to)

enum class QpCounter : uint8_t {
#define DROCE_QP_COUNTER_ENUM(name) name,
  DROCE_QP_COUNTERS(DROCE_QP_COUNTER_ENUM)
#undef DROCE_QP_COUNTER_ENUM
};

// The device counter of the same name; a name that is not one fails to compile.
constexpr const CounterInfo& device_counter(std::string_view name) {
  for (const CounterInfo& i : kCounterInfo) {
    if (name == i.name) return i;
  }
  throw "not a device counter";
}

// In QpCounter order: name, description and the device field.
inline constexpr CounterInfo kQpCounterInfo[] = {
#define DROCE_QP_COUNTER_INFO(name) device_counter(#name),
    DROCE_QP_COUNTERS(DROCE_QP_COUNTER_INFO)
#undef DROCE_QP_COUNTER_INFO
};
inline constexpr size_t kNumQpCounters = std::size(kQpCounterInfo);

struct QpCounters {
  uint64_t values[kNumQpCounters] = {};
  uint64_t operator[](QpCounter c) const { return values[static_cast<size_t>(c)]; }
};

}  // namespace droce
