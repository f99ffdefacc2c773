/* droce: public extension API of the droce verbs provider (libdroce.so).
 * C-callable; include after <infiniband/verbs.h>. */
#ifndef DROCE_DROCE_H
#define DROCE_DROCE_H

#ifdef __cplusplus
extern "C" {
#endif

struct ibv_cq;

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

#ifdef __cplusplus
}
#endif

#endif /* DROCE_DROCE_H */
