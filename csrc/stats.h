/* Per-node aggregates (one slot per node, per thread) and the bounded trace ring.
 *
 * Wall time, calls, the histogram, suspended and loop-ready time are exact sums
 * over every call.  The quantities a read call measures (CPU time, system time,
 * context switches, run-queue time, helper threads' CPU, the perf counters) are
 * estimated over the calls they cover with a difference estimator (record.c): an
 * unread call counts r * w, a read one r * w + (x - r * w) / p, where w is the
 * call's running wall time (off its task's suspensions), r the quantity per
 * running ns of the calls read before it, and p its chance of being read; the
 * estimate is unbiased and its variance is estimated with it (`Estimate`). */
#ifndef INSTRUMENT_STATS_H
#define INSTRUMENT_STATS_H

#include "core.h"
#include "hist.h"

/* The quantities a read call measures, by index: the scalars, then the counters (g_ctr_n of them). */
enum {
    Q_CPU,        /* this thread's CPU time in the call, task-relative, the SDK's own share taken out */
    Q_SYS,        /* of it, system (kernel) time: the thread's rusage */
    Q_VCSW,       /* voluntary context switches (rusage): the thread gave up the CPU */
    Q_IVCSW,      /* involuntary ones: the thread was preempted */
    Q_RQ,         /* time ready in the run queue, waiting for a CPU: /proc/thread-self/schedstat */
    Q_HELPERS,    /* CPU time of the process's threads that run no stage (torch/OpenMP pools, ...) */
    Q_SCALARS,
    Q_CTR = Q_SCALARS,
    Q_MAX = Q_CTR + PERF_MAX_EVENTS
};

/* A quantity's estimate over a node's covered calls (total and self), and the read calls' sums its prediction of
 * an unread call comes from: the quantity per running ns times the call's running time, or the mean per call,
 * whichever has predicted the read calls better so far (a choice made from past calls only: still unbiased). */
typedef struct {
    double est, est_self;    /* the estimated sums */
    double var, var_self;    /* unbiased estimates of their variance */
    double rx, rw;           /* read calls: sum of the quantity, of their running wall time */
    double rxs, rws;         /* the same of self: quantity less the children's, running self wall */
    double sse_w, sse_c;     /* read calls: squared errors of the per-running-ns and the per-call predictions */
    uint64_t reads;          /* read calls that measured it */
} Estimate;

typedef struct CounterStat {
    uint64_t enabled, running; /* summed time enabled/running of the read calls (multiplexing) */
    uint64_t scaled;           /* read calls whose value was scaled for multiplexing */
} CounterStat;

typedef struct { int32_t node; int64_t ns; } Blocker;   /* node -1: the "(other)" of a full list */
#define BLOCKERS_MAX 8

typedef struct ItemStat ItemStat;   /* items.h */

typedef struct {
    uint64_t calls, errors;
    int64_t wall_total, wall_self, wall_min, wall_max;
    hist h;
    uint64_t overlapped, abandoned;   /* asyncio attribution (taskclock.c) */
    int64_t susp_total, susp_self;    /* wall time the call's task was suspended (awaiting or ready) */
    int64_t loop_total, loop_self;    /* of it, ready but waiting for the event loop to run it */
    uint64_t covered;                 /* calls the estimates stand for: read, and left unread by the budget */
    int64_t cov_run, cov_run_self;    /* their running wall time (wall less suspended), total and self */
    double pend_w, pend_ws, pend_n;   /* unread covered calls not yet in `est`: running wall (total, self), count */
    Estimate *est;                    /* Q_MAX entries, allocated on the first covered call */
    CounterStat *ctr;                 /* PERF_MAX_EVENTS entries, allocated on the first counted call */
    Blocker blockers[BLOCKERS_MAX];   /* stages that ran on the loop while this one was ready, with the time */
    int32_t n_blockers;
    ItemStat *items;                  /* instrument.add() totals by item name (items.c); NULL until the first add */
    int32_t n_items, cap_items;
} NodeStats;

typedef struct {
    NodeStats **v;
    int32_t n;
} StatsArray;

typedef struct {
    int32_t node;
    uint32_t tid;
    int64_t t0, dur, cpu0, cpu;
} TraceEvent;

#pragma GCC visibility push(hidden)

NodeStats *stats_slot_new(StatsArray *a, int32_t node);   /* stats_get when the slot does not exist yet */
void stats_array_clear(StatsArray *a);
int stats_array_merge(StatsArray *into, const StatsArray *from);   /* 0, or -1 when out of memory */
int stats_quantities(void);                        /* quantities in use: the scalars and g_ctr_n counters */
double stats_predict(const Estimate *e, double run, int self);   /* an unread call's value of the quantity */
void stats_flush(NodeStats *s);                    /* the pending unread calls into `est` at the current r */
void stats_add_blocker(NodeStats *s, int32_t node, int64_t ns);

extern TraceEvent *g_ring;
extern size_t g_ring_cap, g_ring_next;
extern uint64_t g_ring_total;
int trace_resize(size_t cap);      /* empties the ring; 0, or -1 when out of memory (ring unchanged) */

#pragma GCC visibility pop

/* The slot of `node`, created (zeroed) on first use; NULL when out of memory. */
static inline NodeStats *stats_get(StatsArray *a, int32_t node) {
    if (__builtin_expect(node < a->n && a->v[node] != NULL, 1)) return a->v[node];
    return stats_slot_new(a, node);
}

/* Overwrites the oldest event once the ring is full; only with g_ring_cap > 0. */
static inline void trace_add(int32_t node, uint32_t tid, int64_t t0, int64_t dur, int64_t cpu0, int64_t cpu) {
    TraceEvent *e = &g_ring[g_ring_next];
    e->node = node;
    e->tid = tid;
    e->t0 = t0;
    e->dur = dur;
    e->cpu0 = cpu0;
    e->cpu = cpu;
    g_ring_next = (g_ring_next + 1) % g_ring_cap;
    g_ring_total++;
}

#endif
