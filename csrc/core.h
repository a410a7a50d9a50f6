/* instrument._native: the hot path.
 *
 * Stage enter/exit, the per-context stage stack, per-thread aggregation into
 * per-node slots, and the bounded trace ring.  Everything else (formats,
 * percentiles, configuration parsing, torch) lives in Python.
 *
 * Units, each calling only units listed before it (tests/test_c_units.py holds
 * this): core.c (the state below), hist.c, perf.c, nvtx_emit.c, rootexit.c, sigwake.c (a signal's wake-up),
 * gil.c (the GIL sampler), memory.c (memory per stage) (self-contained); nodes.c (the stage tree); items.c (items of a slot);
 * stats.c (per-node slots, trace ring); threads.c (per-thread state);
 * exemplars.c (a root call's breakdown); record.c (a finished call into the
 * slots: the one record path); taskclock.c (asyncio task-relative readings);
 * stack.c (the per-context stack; a dying one's calls recorded as abandoned);
 * enter_exit.c (stage enter and exit); steps.c (the asyncio switch hook);
 * stage.c (the Stage and Region types); calibrate.c (the configuration's
 * costs); module.c (module functions and init).  frame.h holds the data of an
 * open call and of a stack.
 *
 * Concurrency model: every call here runs with the GIL held.  Each thread
 * aggregates into its own slots (ThreadState.stats), so the hot path touches no
 * shared counters; collect() merges the slots.  The stage stack lives in a
 * context variable, so asyncio tasks interleaving on one thread each see their
 * own nesting, and new threads start with an empty stack.
 *
 * This header: the configuration and bookkeeping shared by the units, and the clocks.
 */
#ifndef INSTRUMENT_CORE_H
#define INSTRUMENT_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <time.h>
#include <sys/resource.h>

#include "perf.h"

#if PY_VERSION_HEX < 0x030A0000   /* Python 3.9: the new-reference helpers came in 3.10 */
static inline PyObject *Py_NewRef(PyObject *o) { Py_INCREF(o); return o; }
static inline PyObject *Py_XNewRef(PyObject *o) { Py_XINCREF(o); return o; }
#endif

#define MAX_NAME_LEN 1024
#define OTHER_NAME "(other)"

/* ------------------------------------------------------------------ clocks */

static inline int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline int64_t thread_cpu_ns(void) {
    struct timespec t;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) != 0) return -1;
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* System (kernel) CPU time of the calling thread, from its rusage (µs resolution); -1 on failure. */
static inline int64_t thread_sys_ns(void) {
    struct rusage r;
    if (getrusage(RUSAGE_THREAD, &r) != 0) return -1;
    return (int64_t)r.ru_stime.tv_sec * 1000000000 + (int64_t)r.ru_stime.tv_usec * 1000;
}

/* ------------------------------------------------------------ global state */

/* Hidden: shared between the units only, so accesses stay PC-relative and nothing is exported. */
#pragma GCC visibility push(hidden)

extern int g_enabled;
extern int g_cpu_clock;            /* read CLOCK_THREAD_CPUTIME_ID at each boundary */
extern int g_nvtx;                 /* emit an NVTX range per stage */
extern uint32_t g_epoch;           /* bumped in a forked child: frames from the parent are not recorded */
extern PyObject *g_hook_enter, *g_hook_exit;   /* integrations (torch ranges, GPU events) */

/* perf_event counters: the events asked for, opened lazily per thread */
extern int g_ctr_n;
extern perf_event_desc g_ctr_desc[PERF_MAX_EVENTS];
extern int g_ctr_exclude_kernel;
extern int g_ctr_taskclock;        /* index of task-clock: CPU time comes from it */
extern uint32_t g_ctr_gen;         /* bumped when the events change: threads reopen */
extern int g_ctr_status[PERF_MAX_EVENTS];  /* errno per event on the first thread that opened them */
extern int g_ctr_status_known;
extern int g_ctr_excl_used;        /* exclude_kernel that first thread ended up with */
extern int g_ctr_rdpmc;            /* whether that first thread reads some group with rdpmc */

/* The overhead budget (enter_exit.c): a stage whose calls are too short for its reads to fit the budget is read on
 * a random subset of calls, each read call weighted by the inverse of its chance (an unbiased estimate). */
extern double g_budget;            /* share of a stage's time its reads may cost; 0: every call is read */
extern double g_read_cost;         /* ns the reads of one call cost (both boundaries), from calibrate(); 0: unknown */
extern double g_read_spent;        /* ns the read calls spent in the SDK beyond their wall windows, through the run */
extern uint64_t g_read_spent_calls;   /* the read calls summed there (those whose thread kept the CPU in them) */
extern int64_t g_cpu_bias;         /* ns of CPU time an empty read call records: taken out of every read call */
extern int64_t g_inner_bias;
extern int g_switches;             /* calibrate() saw the switch page move when the thread slept: calls know it */       /* ns between an empty read call's CPU reads: out of a read call's running time */
extern int64_t g_wall_bias[2];     /* ns of the SDK's own work inside the wall window of an unread call [0], a read one [1] */
extern int g_cpu_split;            /* read the thread's rusage with the CPU time: system time, context switches */
extern int g_run_queue;            /* read the thread's run-queue time (schedstat) with the CPU time */
extern int g_helper_cpu;           /* read the CPU time of the process's threads that run no stage */
extern int g_thread_taskclock;     /* the thread CPU time from its task-clock event (mmap page or read()), validated
                                    * against CLOCK_THREAD_CPUTIME_ID by calibrate(); 0: clock_gettime */

extern int64_t g_open_frames;      /* frames open in any stack: the node table can only be rebuilt at 0 */
extern uint64_t g_unmatched, g_out_of_order, g_cross_thread, g_internal, g_folded;
extern PyObject *g_warn_once;      /* set of warning keys already shown */

/* Warn once per key; never lets a warning (even one turned into an error) escape. */
void warn_once(const char *key, const char *fmt, ...);
/* Counts and warns about a failure the measurement survives; clears the exception (a KeyboardInterrupt is handed
 * back to the program: raised again at its next check). */
void internal_failure(const char *what);
/* Where the pending exception is a KeyboardInterrupt (Ctrl-C inside the SDK's Python code): cleared and handed back
 * to the program, raised again at its next check; 1.  0 (the exception left as it is) otherwise. */
int interrupt_handed_back(void);

#pragma GCC visibility pop

/* What one call's reads cost the thread: the running figure once enough read calls were timed, else calibrate()'s. */
static inline double read_cost(void) {
    return g_read_spent_calls >= 16 ? g_read_spent / (double)g_read_spent_calls : g_read_cost;
}
static inline void read_cost_add(int64_t ns) {
    g_read_spent += (double)ns;
    g_read_spent_calls++;
}

#endif
