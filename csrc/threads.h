/* Per-thread state: each thread aggregates into its own slots, found without a lookup. */
#ifndef INSTRUMENT_THREADS_H
#define INSTRUMENT_THREADS_H

#include "core.h"
#include "stats.h"

typedef struct ThreadState {
    PyObject_HEAD
    StatsArray stats;
    perf_set perf;
    uint32_t perf_gen;           /* g_ctr_gen the set was opened for; 0 = not open */
    uint64_t serial;             /* unique per thread state: addresses are reused after a thread ends */
    unsigned long native_id;
    uint64_t rng;                /* xorshift state: which calls of a short stage are read (overhead budget) */
    perf_clock clk;              /* the thread's task-clock: its CPU time (g_thread_taskclock) */
    int8_t clk_state;            /* 0 not tried, 1 open, -1 unavailable */
    perf_clock sw;               /* whether the thread left the CPU (perf_switch_seq); page NULL: unavailable */
    int sched_fd;                /* /proc/thread-self/schedstat of this thread; -1 not open, -2 unavailable */
    clockid_t cpu_clock_id;      /* this thread's CPU clock, readable from other threads (collect) */
    struct GilSlot *gil;         /* the GIL sampler's slot of this thread (gil.h); NULL: not sampled (yet) */
    struct TaskThread *tasks;    /* asyncio attribution (taskclock.c), allocated on first use */
    struct ThreadState *prev, *next;
} ThreadState;

#pragma GCC visibility push(hidden)

extern ThreadState *g_threads;           /* registry of live thread states */
extern uint64_t g_threads_gen;           /* changes whenever a thread state comes or goes */
extern _Thread_local ThreadState *tls_ts;
extern StatsArray g_retired;             /* slots of threads that have ended */
extern int32_t g_n_threads;              /* live thread states */

int threads_init(void);                  /* 0, or -1 with an exception */
ThreadState *ts_create(void);            /* ts_get on a thread's first stage; NULL on failure */

#pragma GCC visibility pop

/* The thread's switch sequence (perf_switch_seq): changes exactly when it left the CPU; 0 where unknown. */
static inline uint32_t ts_switches(const ThreadState *ts) {
    return g_switches && ts->sw.page ? perf_switch_seq(&ts->sw) : 0;
}

static inline ThreadState *ts_get(void) {
    ThreadState *ts = tls_ts;
    return __builtin_expect(ts != NULL, 1) ? ts : ts_create();
}

/* The thread's CPU time: from its own task-clock event (mmap page or read(): no scheduler update) where
 * calibrate() found it agrees with CLOCK_THREAD_CPUTIME_ID, else that clock (perf_event_open refused: a read
 * that can preempt a thread whose slice is spent).  -1 on failure. */
static inline int64_t thread_cpu(ThreadState *ts) {
    if (g_thread_taskclock && ts && ts->clk_state >= 0) {
        if (__builtin_expect(ts->clk_state == 0, 0)) ts->clk_state = perf_clock_open(&ts->clk) == 0 ? 1 : -1;
        if (ts->clk_state == 1) return perf_clock_read(&ts->clk);
    }
    return thread_cpu_ns();
}

/* A uniform double in [0, 1) from the thread's generator. */
static inline double ts_uniform(ThreadState *ts) {
    uint64_t x = ts->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    ts->rng = x;
    return (double)((x * 0x2545F4914F6CDD1DULL) >> 11) * (1.0 / 9007199254740992.0);
}

#endif
