/* perf_event counter sets for the calling thread.
 *
 * A set holds up to PERF_MAX_EVENTS events split into at most PERF_MAX_GROUPS
 * groups (core-PMU events together, software events together, an event that
 * cannot join its group alone).  Readings are raw, unscaled and cumulative;
 * callers take deltas and scale them with enabled/running.
 */
#ifndef INSTRUMENT_PERF_H
#define INSTRUMENT_PERF_H

#include <stdint.h>
#include <pthread.h>
#include <linux/perf_event.h>

#define PERF_MAX_EVENTS 16
#define PERF_MAX_GROUPS 4

typedef struct { uint32_t type; uint64_t config; } perf_event_desc; /* perf_event_attr.type/.config */

typedef struct {
    uint64_t value[PERF_MAX_EVENTS], enabled[PERF_MAX_EVENTS], running[PERF_MAX_EVENTS];
} perf_reading; /* raw, unscaled, cumulative */

typedef struct {
    int leader_fd;
    int nr;                          /* events in the group, leader first */
    int cls;                         /* grouping class: 0 core PMU, 1 software, else 2+type */
    int rdpmc;                       /* every member has a user-readable mmap page */
    int idx[PERF_MAX_EVENTS];        /* set index of each member, in group read order */
    uint64_t id[PERF_MAX_EVENTS];    /* PERF_EVENT_IOC_ID of each member */
} perf_group;

typedef struct perf_set {
    int n;                           /* events requested */
    int ngroups;
    int exclude_kernel;              /* what was actually used (exclude_hv follows it) */
    int rdpmc;                       /* at least one group is read with rdpmc */
    pthread_t owner;                 /* rdpmc is only meaningful on the opening thread */
    perf_event_desc ev[PERF_MAX_EVENTS];
    int fd[PERF_MAX_EVENTS];         /* -1 when not open */
    int status[PERF_MAX_EVENTS];     /* 0 = open, else errno of the last attempt */
    struct perf_event_mmap_page *page[PERF_MAX_EVENTS]; /* NULL unless mapped for rdpmc */
    perf_group group[PERF_MAX_GROUPS];
} perf_set;

/* Opens ev[0..n) for the calling thread (pid=0, cpu=-1), counting immediately.
 * exclude_kernel=0 asks for kernel+user and falls back to user-only on EACCES/EPERM.
 * Returns the number of events opened (-1 with errno=EINVAL when n is out of range);
 * per-event errno is in s->status.  The set is always left safe to read and close. */
int perf_set_open(perf_set *s, const perf_event_desc *ev, int n, int exclude_kernel);

/* Fills r->*[0..s->n): one read() per group, or rdpmc through the mmap pages for
 * core-PMU groups on the owning thread.  Events not open read as 0/0/0.
 * Returns 0, or -1 (errno set) when a group read failed; that group reads as 0/0/0. */
int perf_set_read(perf_set *s, perf_reading *r);

void perf_set_close(perf_set *s); /* closes fds, munmaps; idempotent */
int perf_set_uses_rdpmc(const perf_set *s);

/* Self-monitoring read of one mmap page (the protocol libperf's perf_mmap__read_self
 * follows), with rdpmc injected.  value = offset + sign-extended counter (unscaled);
 * enabled/running are extrapolated to now_tsc whenever cap_user_time is set.
 * Returns 0, or -1 when the page says a user read is impossible (index==0 or !cap_user_rdpmc). */
int perf_mmap_read_self(const volatile struct perf_event_mmap_page *pc,
                        uint64_t (*rdpmc_fn)(uint32_t counter, void *ctx), void *ctx,
                        uint64_t now_tsc, uint64_t *value, uint64_t *enabled, uint64_t *running);

/* The time of one mmap page without a system call, where the page offers cap_user_time: time_enabled
 * extrapolated to now_tsc (the protocol of libperf's perf_mmap__read_self).  For a task-clock event of the
 * calling thread that is the thread's CPU time since the event was enabled.  Returns 0, or -1 when the page
 * does not offer cap_user_time (or its lock never settles). */
int perf_mmap_time_self(const volatile struct perf_event_mmap_page *pc, uint64_t now_tsc, uint64_t *ns);

/* The calling thread's CPU time from its own task-clock event: its mmap page where it offers cap_user_time (no
 * system call), else read() on its fd.  Neither brings the scheduler's accounting up to date, as reading
 * CLOCK_THREAD_CPUTIME_ID does (a thread whose slice is spent is preempted inside that read). */
typedef struct { int fd; struct perf_event_mmap_page *page; int user_time; } perf_clock;
int perf_clock_open(perf_clock *c);      /* 0; -1 (nothing kept open) where perf_event_open is refused */
int64_t perf_clock_read(perf_clock *c);  /* ns since the open, or -1 */
void perf_clock_close(perf_clock *c);    /* idempotent */

/* Whether the calling thread was switched out, without a system call: the kernel rewrites a perf event's mmap page
 * (its seqlock moves) each time the thread is scheduled back in, so the lock read before and after a call differs
 * exactly when the thread left the CPU in between (preempted, or blocked).  A software context-switches event. */
int perf_switch_open(perf_clock *c);     /* 0, or -1 (nothing kept open) */
static inline uint32_t perf_switch_seq(const perf_clock *c) {
    return ((const volatile struct perf_event_mmap_page *)c->page)->lock;
}

/* Registers instrument._native.CounterGroup and _perf_mmap_decode; 0 or -1 with an exception. */
struct _object;
int perf_add_types(struct _object *module);

#endif
