/* Per-node aggregates (one slot per node, per thread) and the bounded trace ring. */
#ifndef INSTRUMENT_STATS_H
#define INSTRUMENT_STATS_H

#include "core.h"
#include "hist.h"

typedef struct CounterStat {
    double total, self;        /* scaled estimates, summed over the calls that counted */
    uint64_t enabled, running; /* summed time enabled/running of those calls */
    uint64_t counted;          /* calls read whose counter ran */
    uint64_t covered;          /* calls the estimate stands for: those read, and those the budget left unread */
    double wsum;               /* summed weights of the calls read: covered / wsum scales total to all of them */
    uint64_t scaled;           /* calls whose value was scaled for multiplexing */
} CounterStat;

typedef struct ItemStat ItemStat;   /* items.h */

typedef struct {
    uint64_t calls, errors, cpu_calls;
    int64_t wall_total, wall_self, wall_min, wall_max;
    int64_t cpu_total, cpu_self;  /* over cpu_calls: read calls weighted by 1 / their chance of being read */
    uint64_t cpu_reads;           /* calls whose CPU time was read */
    double cpu_wsum;              /* their summed weights */
    double cpu_wall_w;            /* their weighted wall time: CPU is estimated as cpu_total / cpu_wall_w of ... */
    int64_t cpu_cov_wall;         /* ... the wall time of all cpu_calls (read or stood in for) */
    uint64_t sys_reads;           /* of those, calls whose system time was read too (not while suspended) */
    int64_t sys_total, sys_self, sys_cpu_total, sys_cpu_self;   /* system time and CPU time of those calls */
    hist h;
    uint64_t overlapped, abandoned;   /* asyncio attribution (taskclock.c) */
    int64_t susp_total, susp_self;
    CounterStat *ctr;          /* PERF_MAX_EVENTS entries (g_ctr_n used), allocated on the first counted call */
    ItemStat *items;           /* instrument.add() totals by item name (items.c); NULL until the first add */
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
