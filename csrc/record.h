/* The one path that records a finished stage call: a normal exit
 * (enter_exit.c) and a call whose context died with it open (stack.c) both
 * describe the call as a CallMeasure and hand it to record_call(). */
#ifndef INSTRUMENT_RECORD_H
#define INSTRUMENT_RECORD_H

#include "frame.h"
#include "memory.h"
#include "threads.h"

typedef struct CallMeasure {
    int64_t wall;        /* t1 - t0 as read; record_call takes the SDK's own share out (then: the call's wall) */
    int64_t t1;          /* now_ns() at the exit */
    int64_t susp, loop;  /* wall time its task was suspended inside the call; of it, ready waiting for the loop */
    int64_t inner;       /* a read call: its wall window between its reads (Reading.tq), what its quantities span */
    uint32_t sw1;        /* the thread's switch sequence at the end of its wall window */
    int switched;        /* its thread left the CPU during it (or that is not known) */
    int switched_in;     /* of a read call, inside its wall window (its reads are outside it); else switched */
    double x[Q_MAX];     /* the call's quantities, task-relative (counters scaled); NAN: not measured */
    uint64_t cen[PERF_MAX_EVENTS], crun[PERF_MAX_EVENTS];   /* counters' time enabled/running in the call */
    int read;            /* read at both boundaries: its quantities are measured, the reads' cost is inside */
    int have_ctr;        /* the counters' deltas are in x[Q_CTR...], cen, crun */
    int overlapped;      /* it overlapped other contexts' work on its thread: nothing attributable */
    int stand_in;        /* left unread by the budget on its own thread: the read calls stand for it */
    int abandoned, error;
    MemCall mem;         /* its memory figures (mem.have 0: not measured) */
} CallMeasure;

#pragma GCC visibility push(hidden)

/* The quantities of the call between two readings (both task-relative, on the thread that entered): x[] of m. */
void call_quantities(const Reading *r0, const Reading *r1, CallMeasure *m);
/* Records the call of f into the thread's slot of its node and into `parent` (the frame below it in its stack,
 * or NULL); m->wall and the CPU time are corrected for the SDK's own cost on the way. */
void record_call(ThreadState *ts, const Frame *f, Frame *parent, CallMeasure *m);

#pragma GCC visibility pop

#endif
