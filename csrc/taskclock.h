/* asyncio attribution: what a thread measures charged to the context (the
 * asyncio task) that runs on it, not to every stage open on the thread; and a
 * suspended task's wall time split into awaiting and waiting for the loop.
 *
 * Each stack (one per context, stack.c) has a virtual clock: the thread's
 * readings less what they advanced while the context was suspended.  The switch
 * hook (steps.c) suspends the context that is left and resumes the one entered,
 * with one reading per switch (the full readings only where a read call is open
 * in either context: switches are sampled with the calls); a frame's readings
 * are made task-relative at enter and exit, so enter/exit deltas and self/total
 * follow the task's own stage tree.  A step of a context with no stage open goes
 * to the stack around the loop (if it has a stage open on this thread), which
 * stops only while the step's context has one.  A context that dies with stages
 * open has them recorded up to its last step (abandoned).
 *
 * A suspended task is awaiting until it is woken (loop.call_soon of its step,
 * or the due time of the timer that wakes it), then ready until the loop runs
 * it: that wait is its loop-ready time, and the stages whose steps ran on the
 * loop meanwhile are its blockers.
 *
 * Where no hook sees a switch (another loop, a context entered by hand), a
 * stage boundary that finds the thread in another context than the last one
 * counts a change; a frame whose stack was running while a change happened is
 * "overlapped": its CPU time and counters are left out, never summed.
 */
#ifndef INSTRUMENT_TASKCLOCK_H
#define INSTRUMENT_TASKCLOCK_H

#include "frame.h"
#include "record.h"
#include "threads.h"

/* The sums of what the thread's readings advanced while the context was suspended with a read call open (its
 * TaskTime, frame.h, keeps the rest). */
typedef struct TaskClock {
    int valid;           /* out is the reading of the stack's latest suspension */
    uint32_t s_gen;
    Reading out;         /* the reading the context was suspended at */
    int64_t s_q[Q_SCALARS];
    perf_reading s;
} TaskClock;

/* The latest segments of the steps of a thread's loop: who held it while a task waited.  A step adds one segment
 * per stage that was innermost-open in it (1 + its stage boundaries at most; a stage that goes on across a boundary
 * or from one step to the next without a gap keeps one), so 512 hold e.g. the last 120 steps of two nested stages;
 * a ready task's window that began before the oldest one has its older blockers left out (under-counted).  A resume
 * walks the segments of its window: at most 512 (+0.5 us a task step with 5,000 tasks ready at once, 3 stages). */
#define STEP_RING 512

typedef struct { int64_t t0, t1; int32_t node; } StepSpan;

/* Per thread (ThreadState.tasks): the switch hook's state. */
typedef struct TaskThread {
    PyObject *ctx;       /* context of the last stage boundary or switch (borrowed: compared, never used) */
    uint64_t changes;    /* context changes no switch hook accounted for */
    int32_t batch;       /* loop iterations of a hooked loop open on the thread */
    int chain;           /* `last` is the latest reading and only the loop's dispatch ran since */
    Stack *step_outer;   /* the stack around the step that runs (held by the runner): it runs while the step's */
    PyObject *step_ctx;  /* context (borrowed) has no stage open, and is suspended while it has */
    PyObject *step_handle;   /* the handle whose step runs (borrowed), for the time the tasks it wakes were ready */
    int64_t step_t0;     /* when it started (0: no step runs, or none recorded: no stage was open anywhere) */
    int64_t seg_t0;      /* the step's segment that runs: since when, and the stage innermost-open in it (0: none) */
    int32_t seg_node;
    int64_t batch_t0;    /* when the loop iteration's first step started (after its poll) */
    Reading last;
    StepSpan *spans;     /* STEP_RING of them, allocated at the first (on a loop's thread only); NULL: none */
    uint64_t n_spans;    /* spans recorded, the latest at (n_spans - 1) % STEP_RING */
} TaskThread;

#pragma GCC visibility push(hidden)

extern uint64_t g_task_steps, g_task_reads, g_task_changes, g_task_overlapped, g_task_abandoned;

static inline TaskThread *tt_get(ThreadState *ts) {
    if (__builtin_expect(ts->tasks != NULL, 1)) return ts->tasks;
    return ts->tasks = calloc(1, sizeof(TaskThread));
}

/* Frame enter/exit (enter_exit.c): readings made task-relative.  exit (given the call's end in m->t1) returns 1
 * when the call overlapped other contexts' work on its thread (then nothing but its wall time is attributable) and
 * sets the call's suspended and loop-ready time in m. */
void taskclock_frame_enter(ThreadState *ts, Stack *st, Frame *f);
int taskclock_frame_exit(ThreadState *ts, Stack *st, const Frame *f, Reading *r1, CallMeasure *m);
/* A frame of a dying stack as a call that ended at the stack's last task switch (stack.c records it). */
void taskclock_abandoned(Stack *st, const Frame *f, CallMeasure *m);
void taskclock_free(Stack *st);

/* The switch hook's primitives (steps.c). */
void take_reading(ThreadState *ts, Reading *r, int full, int exit_order);
void suspend(ThreadState *ts, TaskThread *tt, Stack *st, const Reading *r);
void resume(ThreadState *ts, TaskThread *tt, Stack *st, const Reading *r);
/* The running step's segment ends at t (recorded as a span where a stage was innermost-open in it); the next one,
 * from t, is charged to `next`. */
void step_segment(TaskThread *tt, int64_t t, int32_t next);

int taskclock_collect(PyObject *res);         /* adds collect()["tasks"] */

#pragma GCC visibility pop

#endif
