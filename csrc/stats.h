/* Per-node aggregates (one slot per node, per thread) and the bounded trace ring.
 *
 * Wall time, calls, the histogram, suspended and loop-ready time are exact sums
 * over every call.  The quantities a read call measures (CPU time, system time,
 * context switches, run-queue time, helper threads' CPU, the perf counters) are
 * estimated over the calls they cover with a difference estimator (record.c): an
 * unread call counts r * w, a read one r * w + (x - r * w) / p, where w is the
 * call's running wall time (off its task's suspensions), r the quantity per
 * running ns of the calls read before it, and p its chance of being read; the
 * estimate is unbiased and its variance is estimated with it (`CellPair`). */
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
    Q_OFF,        /* the GIL sampler's samples that found the thread blocked (gil.h) */
    Q_GIL,        /* of them, those that found it waiting for the GIL */
    Q_SCALARS,
    Q_CTR = Q_SCALARS,
    Q_MAX = Q_CTR + PERF_MAX_EVENTS
};

/* Strata of a call's running wall time, in steps of 64 from 16 µs (< 16 µs, 16 µs-1 ms, 1-66 ms, >= 66 ms): a
 * call is predicted from the read calls of its own length, so a rare long call is not predicted from short ones,
 * and the estimate's variance is that of each stratum's calls.  Few and wide: a read call's running time carries
 * the spread of its reads' cost (a few µs), an unread one's does not. */
#define STRATA_RUN 4
#define STRATA (2 * STRATA_RUN)   /* and whether the thread left the CPU during the call: a preempted call's running
                                   * time is not its CPU time, and it is predicted from the read calls that were */

static inline int stratum(double run, int switched) {
    int b = 0;
    if (run >= 16000) b = 1 + (63 - __builtin_clzll((unsigned long long)(run / 16000))) / 6;
    return (b < STRATA_RUN ? b : STRATA_RUN - 1) + (switched ? STRATA_RUN : 0);
}

/* One stratum's sums for a quantity: of its read calls, plain and weighted by 1 / p (p a call's chance of being
 * read), with the quantity x over the running time w; and of its calls that were read but did not measure the
 * quantity (they count as unread for it). */
typedef struct {
    double n, x, w, xx, xw, ww;    /* read calls: number, sums of x, w, x^2, x * w, w^2 */
    double Wn, Wx, Ww;             /* sums of 1 / p, x / p, w / p */
    double un, uw;                 /* calls read that did not measure it: number, running time */
} Cell;

/* A quantity's sums in one stratum (stats_estimate): of the calls' totals over their running time, and of self (the
 * quantity less the children's, over running self time). */
typedef struct {
    Cell tot, own;
} CellPair;

typedef struct CounterStat {
    uint64_t enabled, running; /* summed time enabled/running of the read calls (multiplexing) */
    uint64_t scaled;           /* read calls whose value was scaled for multiplexing */
} CounterStat;

/* A stage that held the loop while calls of this one were ready to run (node -1: the "(other)" of a full list).
 * waited: the ready time of the calls it cost, summed over them; held: the time it held the loop while any was
 * ready, each moment once, kept by a high-water mark: a stretch before the mark that no call charged before it
 * passed (a call ready since earlier that resumes later) is left out, so held can only under-count. */
typedef struct { int32_t node; int64_t held, waited, mark; } Blocker;
#define BLOCKERS_MAX 8

typedef struct ItemStat ItemStat;   /* items.h */
typedef struct MemStat MemStat;     /* memory.h */

typedef struct {
    uint64_t calls, errors;
    int64_t wall_total, wall_self, wall_min, wall_max;
    hist h;
    uint64_t overlapped, abandoned;   /* asyncio attribution (taskclock.c) */
    int64_t susp_total, susp_self;    /* wall time the call's task was suspended (awaiting or ready) */
    int64_t loop_total, loop_self;    /* of it, ready but waiting for the event loop to run it */
    uint64_t covered;                 /* calls the estimates stand for: read, and left unread by the budget */
    uint64_t entered;                 /* calls entered under the overhead budget (budget_read) */
    int64_t cov_run, cov_run_self;    /* their running wall time (wall less suspended), total and self */
    double un[STRATA], uw[STRATA], uws[STRATA];   /* covered calls left unread, by stratum: number, running time,
                                                   * running self time */
    double run_b[STRATA], calls_b[STRATA];   /* covered calls by stratum: running time, number */
    double off_cpu[STRATA];           /* by stratum: the read calls' share of running time off a CPU (none read: 0) */
    double cpu_pred;                  /* sum over strata of (1 - off_cpu) * run_b: the covered calls' CPU, predicted */
    int64_t cpu0;                     /* a thread's slot: the thread's CPU clock before its first call (cpu0_set) */
    uint8_t cpu0_set;
    double cpu_bound;                 /* merged slots: what their calls' CPU time cannot exceed (stats_array_merge) */
    CellPair *cells[STRATA];          /* the estimates' sums by stratum, n_q quantities each: a stratum's from its
                                       * first read call (a stage's calls fill one or two of them) */
    uint64_t *reads;                  /* n_q entries: the read calls that measured each quantity; NULL before the
                                       * first read call */
    int32_t n_q;                      /* quantities the sums have room for (stats_reserve) */
    CounterStat *ctr;                 /* n_ctr entries (the events in use), from the first counted call */
    int32_t n_ctr;
    Blocker *blockers;                /* stages that ran on the loop while this one was ready, with the time:
                                       * BLOCKERS_MAX entries, from the first */
    int32_t n_blockers;
    MemStat *mem;                     /* memory per source (memory.h): n_mem entries, from the first measured call */
    int32_t n_mem;
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
/* Adds the slots of `from` into `into`: a live thread's, whose CPU clock reads cpu_now (the bound of a slot's
 * calls' CPU time is what the thread spent since the slot's cpu0), or merged ones (cpu_now < 0).  0, or -1 when
 * out of memory. */
int stats_array_merge(StatsArray *into, const StatsArray *from, int64_t cpu_now);
int stats_quantities(void);                        /* quantities in use: the scalars and g_ctr_n counters */
/* An array p of *n entries of `size` bytes grown to `need` entries, the new ones zeroed: the array (and *n
 * updated), or NULL when out of memory (p unchanged). */
void *stats_room(void *p, int32_t *n, int32_t need, size_t size);
int stats_reserve(NodeStats *s, int nq);           /* room for nq quantities' sums; 0, or -1 when out of memory */
CellPair *stats_cells(NodeStats *s, int b);        /* stratum b's sums, made on first use; NULL when out of memory */
double stats_predict(const NodeStats *s, int q, double run, int switched);   /* a call's value of q, predicted */
double stats_read_sum(const NodeStats *s, int q);  /* the read calls' sum of quantity q */
double stats_read_run(const NodeStats *s, int q);  /* and of their running time */
/* A quantity's estimate over the node's covered calls, total and self, with their variances. */
void stats_estimate(const NodeStats *s, int q, double *total, double *self, double *var, double *var_self);
double stats_mean_cpu(const NodeStats *s);         /* a call's CPU time, predicted from its stage's so far */
void stats_mark_start(NodeStats *s, int64_t back);   /* a thread's slot: cpu0 is its CPU clock less `back` ns */
/* The blocker entry of `node` (the "(other)" one when the list is full); NULL only when the list is inconsistent. */
Blocker *stats_blocker(NodeStats *s, int32_t node);

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

/* The read calls that measured quantity q. */
static inline uint64_t stats_reads(const NodeStats *s, int q) { return q < s->n_q ? s->reads[q] : 0; }

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
