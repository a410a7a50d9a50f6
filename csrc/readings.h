/* What one boundary reads: a read call's enter or exit, or a task switch.  The
 * order keeps each window inside the one before it (the caller takes the wall
 * clock outside them all): at enter the run queue, the helpers' CPU, the rusage,
 * the counters and CPU clock; at exit the reverse.  A preemption inside a read
 * then lands in the run-queue time and the wall time of the call, never outside;
 * the CPU window, innermost, holds as little of the reads' own cost as it can. */
#ifndef INSTRUMENT_READINGS_H
#define INSTRUMENT_READINGS_H

#include "stats.h"
#include "threads.h"

typedef struct {
    int64_t t;                  /* now_ns(), taken by the caller: a call's wall window */
    int64_t tq;                 /* now_ns() right at the CPU read: what the quantities' window is timed by */
    int64_t q[Q_SCALARS];       /* the scalar quantities, cumulative (Q_CPU ... Q_HELPERS); -1: not read */
    uint8_t cpu_src;            /* where q[Q_CPU] came from: 0 nowhere, 1 the thread CPU clock, 2 task-clock */
    uint8_t full;               /* everything the configuration reads was read (else only the time) */
    uint32_t ctr_gen;           /* g_ctr_gen of c; 0: counters not read */
    uint32_t epoch;             /* g_epoch: a forked child's readings are not its parent's */
    perf_reading c;
} Reading;

#pragma GCC visibility push(hidden)

/* Everything the configuration reads, into r (r->t is the caller's); exit != 0: in exit order. */
void read_boundary(ThreadState *ts, Reading *r, int exit);
/* Only the time: what a task switch reads when no read call is open in the contexts it switches. */
void read_time(Reading *r);
int64_t sched_run_delay(ThreadState *ts);   /* ns this thread waited in the run queue, cumulative; -1 */
int64_t helpers_cpu(ThreadState *ts);       /* CPU of the process's threads that run no stage, cumulative; -1 */

#pragma GCC visibility pop

#endif
