/* Memory per stage: process-wide gauges read at a read call's boundaries.
 *
 * A source is a gauge with a high-water mark the process can reset: the resident set (the kernel's hiwater_rss,
 * read through getrusage and reset by writing 5 to /proc/self/clear_refs), or one a Python callable reads (the
 * traced Python heap, a CUDA device's allocator).  Every open measured call holds a slot with its start and its own
 * running peak, per source.  Before the SDK resets a mark (at every measured enter, and at an exit of the resident
 * set, whose reset is how its current value is read cheaply), it folds the mark into every open slot's peak; so
 * each call, nested or on another thread, keeps its own peak through every reset, and none of them resets another's.
 * A mark found below the highest value seen since the SDK's own last reset was reset by someone else (a user's
 * reset_peak_memory_stats): the calls open then are marked, their peaks are lower bounds.  The sources are the
 * process's, so a call during which another context (thread or asyncio task) entered or exited a stage, or ran an
 * asyncio step, is marked overlapped and its figures are kept apart (never credited to one stage); a context that
 * allocates without any stage event meanwhile is not seen. */
#ifndef INSTRUMENT_MEMORY_H
#define INSTRUMENT_MEMORY_H

#include "core.h"

#define MEM_SOURCES 8

/* One measured call's figures per source: its peak above its start, its net change (exit less entry). */
typedef struct {
    int64_t peak[MEM_SOURCES], net[MEM_SOURCES];
    uint32_t reset;       /* sources whose mark another party reset during the call (its peak is a lower bound) */
    uint8_t have;         /* measured at both ends */
    uint8_t overlapped;   /* another context had a stage event during it (mem_note_owner) */
} MemCall;

/* A node's sums per source.  W-sums weigh each read call by 1 / its chance of being read (the budget's), so their
 * ratios stand for every call; the plain sums give the spread. */
#define MEM_FRESH (1 << 20)   /* a call whose peak above its start is this or more took fresh memory (MemStat.fresh) */

typedef struct MemStat {
    uint64_t calls, overlapped, marked, fresh;
    double peak_max, w, w_peak, w_net, peak_sum, peak_sq, net_sum, net_sq;
} MemStat;

#pragma GCC visibility push(hidden)

extern int g_mem_n;   /* sources configured: read calls open a slot */
extern const void *g_mem_last_owner;   /* the context of the last stage event */
extern uint64_t g_mem_owner_changes;   /* how often the context of a stage event was not the last one's */

/* A stage event (enter, exit, an asyncio task's step) of context `owner`: a measured call of another context during
 * which this changes is overlapped (another context ran stages meanwhile, and the gauges are the process's). */
static inline void mem_note_owner(const void *owner) {
    if (owner != g_mem_last_owner) g_mem_last_owner = owner, g_mem_owner_changes++;
}

/* configure(memory=...): a sequence of "host" or (name, get, reset) with get() -> (current, peak) and reset() a
 * callable or None (reset with an earlier source).  0, or -1 with an exception naming what is wrong. */
int mem_configure(PyObject *spec, int apply);
/* A measured call's enter: its slot (and *serial, which names it), or -1 when no slot is free or a read is under
 * way (a source's Python code entered a stage).  owner: the call's context (its stack); NULL: calibration's reads,
 * which overlap no call. */
int32_t mem_enter(const void *owner, uint32_t *serial);
/* Its exit: the figures into *out (have 0 where the slot is not this call's, after a fork), the slot freed.
 * read 0: only freed (the call ended where its figures cannot be read). */
void mem_exit(int32_t slot, uint32_t serial, const void *owner, int read, MemCall *out);
int mem_indices(void);   /* the source indices used so far: the entries a node's sums need */
/* Adds a call's figures into a node's sums (mem_indices() of them), weighing by w; merges a's n sums into d. */
void mem_stat_add(MemStat *m, const MemCall *c, double w);
void mem_stat_merge(MemStat *d, const MemStat *a, int n);
PyObject *mem_stat_list(const MemStat *m, int n);   /* a stats row's "memory": per source a dict of its n sums */
PyObject *mem_status(void);
int mem_host_index(void);     /* the resident set's index in MemCall, -1 when it is not read */
/* Another party is about to reset these callable sources' marks (a user's reset_peak_memory_stats): each mark
 * folded into the open calls now, which are marked; the SDK's own detection waits for its next reset. */
int mem_reset_seen(PyObject *names);   /* the sources: name, how the peak is measured, reads and their cost */

#pragma GCC visibility pop

#endif
