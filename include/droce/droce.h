/* droce: public extension API of the droce verbs provider (libdroce.so).
 * C-callable; include after <infiniband/verbs.h>. */
#ifndef DROCE_DROCE_H
#define DROCE_DROCE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ibv_cq;
struct ibv_qp;

/* Flags of droce_req_notify_cq; the values of the kernel's IB_CQ_*. */
enum {
  DROCE_CQ_SOLICITED = 1,
  DROCE_CQ_NEXT_COMP = 2,
  DROCE_CQ_REPORT_MISSED_EVENTS = 4,
};

/* Arms a CQ. `flags` holds exactly one of DROCE_CQ_SOLICITED and
 * DROCE_CQ_NEXT_COMP, optionally or'ed with DROCE_CQ_REPORT_MISSED_EVENTS.
 * Returns < 0 (a negative errno: -EINVAL for bad flags or a CQ that is not
 * droce's), 0 (armed; with REPORT_MISSED_EVENTS: no completion was missed, it
 * is safe to wait), or > 0 (only with REPORT_MISSED_EVENTS: a completion may
 * have arrived since the last poll without an event; poll again). */
int droce_req_notify_cq(struct ibv_cq *cq, unsigned int flags);

/* Per-QP counters (docs/COUNTERS.md lists them): the transport events of one
 * QP, with the names Linux rxe gives its device counters where one exists.
 * droce_query_qp_counters copies the first min(n, count) counters of `qp`
 * into values[] and returns count, the number of per-QP counters (call it
 * with n = 0 to learn it); values[i] is the counter named
 * droce_qp_counter_name(i). Returns -EINVAL if qp is not a live droce QP or
 * values is NULL with n > 0. The values are those of a moment while the call
 * runs; counting continues. */
int droce_query_qp_counters(struct ibv_qp *qp, uint64_t *values, unsigned int n);
/* The name and a one-line description of per-QP counter i; NULL when
 * i >= count. The strings are static. */
const char *droce_qp_counter_name(unsigned int i);
const char *droce_qp_counter_description(unsigned int i);

#ifdef __cplusplus
}
#endif

#endif /* DROCE_DROCE_H */
