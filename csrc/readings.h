/* What one boundary reads: a read call's enter or exit, or a task switch.  The
 * wall window is innermost (read_boundary sets r->t): at enter the helpers' CPU,
 * the rusage, then the run queue, the CPU time and the wall clock; at exit the
 * reverse.  The SDK's reads, and a preemption one of them triggers (reading a
 * running thread's CPU clock brings its scheduler accounting up to date, and a
 * thread whose slice is spent is preempted right there), fall outside the call's
 * wall time and its run-queue time, which are read together at the window's
 * edges.  Where CPU time comes from CLOCK_THREAD_CPUTIME_ID (no task-clock), it
 * is read outside the run queue's window; its own CPU is calibrate()'s bias. */
#ifndef INSTRUMENT_READINGS_H
#define INSTRUMENT_READINGS_H

#include "stats.h"
#include "threads.h"

typedef struct {
    int64_t t;                  /* now_ns() at the wall window's edge, with the run queue */
    int64_t tq;                 /* what the quantities' window is timed by: t (a task switch's caller may move t) */
    int64_t q[Q_SCALARS];       /* the scalar quantities, cumulative (Q_CPU ... Q_HELPERS); -1: not read */
    uint8_t cpu_src;            /* where q[Q_CPU] came from: 0 nowhere, 1 the thread CPU clock, 2 task-clock */
    uint8_t full;               /* everything the configuration reads was read (else only the time) */
    uint32_t ctr_gen;           /* g_ctr_gen of c; 0: counters not read */
    uint32_t epoch;             /* g_epoch: a forked child's readings are not its parent's */
    perf_reading c;
} Reading;

#define HELPERS_MAX 32   /* beyond this many threads that run no stage, a read call does not read their CPU (too costly) */

#pragma GCC visibility push(hidden)

/* Everything the configuration reads, into r, with the wall clock at its edge; exit != 0: in exit order. */
void read_boundary(ThreadState *ts, Reading *r, int exit);
/* Only the time: what a task switch reads when no read call is open in the contexts it switches. */
void read_time(Reading *r);
int64_t sched_run_delay(ThreadState *ts);   /* ns this thread waited in the run queue, cumulative; -1 */
int64_t helpers_cpu(ThreadState *ts);       /* CPU of the process's threads that run no stage, cumulative; -1 */
int helpers_over_cap(int forget);           /* the most threads seen running no stage while more than the 32 whose
                                             * clocks a read call reads (helpers_cpu is then not read); 0: never;
                                             * forget: from now on (reset()) */

#pragma GCC visibility pop

#endif
