/* The one path that records a finished stage call: a normal exit
 * (enter_exit.c) and a call whose context died with it open (stack.c) both
 * describe the call as a CallMeasure and hand it to record_call(). */
#ifndef INSTRUMENT_RECORD_H
#define INSTRUMENT_RECORD_H

#include "frame.h"
#include "threads.h"

typedef struct {
    int64_t wall;        /* t1 - t0 as read; record_call takes the SDK's own share out (then: the call's wall) */
    int64_t cpu, sys;    /* CPU and system time as read, task-relative; -1: not read */
    int64_t susp;        /* wall time its task was suspended inside the call */
    int read;            /* both boundaries read: the reads' own cost is inside the wall and CPU windows */
    int have_ctr;        /* cval, cen, crun hold the counters' deltas */
    double cval[PERF_MAX_EVENTS];     /* scaled deltas; -1: the counter never ran */
    uint64_t cen[PERF_MAX_EVENTS], crun[PERF_MAX_EVENTS];
    int overlapped;      /* it overlapped other contexts' work on its thread: no CPU time or counters */
    int stand_in;        /* left unread by the budget on its own thread: stands for what a read would give */
    int abandoned, error;
} CallMeasure;

#pragma GCC visibility push(hidden)

/* Counter deltas of c1 - c0 into m (multiplexed counts scaled by enabled/running). */
void counter_deltas(const perf_reading *c0, const perf_reading *c1, CallMeasure *m);
/* Records the call of f into the thread's slot of its node and into `parent` (the frame below it in its stack,
 * or NULL); m->wall and m->cpu are corrected for the reads' own cost on the way. */
void record_call(ThreadState *ts, const Frame *f, Frame *parent, CallMeasure *m);

#pragma GCC visibility pop

#endif
