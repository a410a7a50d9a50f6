/* GIL wait, sampled from outside the waiting threads.
 *
 * A thread that waits for the GIL sleeps in a futex call on one of the GIL's own condition variables or mutexes.
 * /proc/self/task/<tid>/syscall shows the call and its first argument (the futex's address) of a thread blocked in
 * the kernel, and "running" for one on a CPU or ready for one.  gil_learn() finds where the GIL lies once, by making
 * a thread wait for it on purpose; a native sampler thread (it never takes the GIL) then reads each stage thread's
 * syscall file at a rate that keeps its own CPU time within a share of one core, and counts per thread the samples
 * that found it blocked (off a CPU by its own doing) and, of them, those in a futex call on the GIL.  A stage reads
 * the two counts at its boundaries like its CPU time: its GIL wait is its blocked time times the share of its
 * blocked samples that were on the GIL. */
#ifndef INSTRUMENT_GIL_H
#define INSTRUMENT_GIL_H

#include "core.h"

typedef struct GilSlot GilSlot;   /* one stage thread's syscall file and counts */

#pragma GCC visibility push(hidden)

extern int g_gil;                 /* the sampler runs: stage threads get a slot and read its counts */
extern volatile int g_gil_idle;   /* it waits for a stage to open: the first to open one wakes it (gil_wake) */

/* Finds the GIL's futex addresses (once per process; with the GIL held).  0 found, -1 not: gil_status() says why. */
int gil_learn(void);
/* Starts the sampler (once learned), or makes it idle (on = 0); where it cannot run, g_gil stays 0 and gil_status()
 * says why. */
void gil_enable(int on);
GilSlot *gil_slot_new(void);      /* the calling thread's slot; NULL: not sampled */
void gil_slot_free(GilSlot *s);   /* at the thread's end */
/* The slot's cumulative counts: samples that found the thread blocked, and of them on the GIL.  A slot made before
 * a fork is stale in the child: 0 returned, and the caller makes a new one. */
int gil_read(GilSlot *s, int64_t *blocked, int64_t *gil);
void gil_wake(void);              /* a stage opened while the sampler was idle */
long gil_sampler_tid(void);       /* the sampler thread's id, 0 when none: it runs no stage and is no helper */
PyObject *gil_status(void);       /* what doctor and the snapshot's meta say: mechanism, rate, cost */

#pragma GCC visibility pop

#endif
