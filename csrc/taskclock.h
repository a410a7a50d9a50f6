/* asyncio attribution: CPU time and counters of a thread charged to the context
 * (the asyncio task) that runs on it, not to every stage open on the thread.
 *
 * Each stack (one per context, stack.c) has a virtual clock: the thread's
 * readings (CPU clock, counter group, monotonic time) less what they advanced
 * while the context was suspended.  The switch hook (steps.c) suspends the
 * context that is left and resumes the one entered, with one reading per
 * switch; a frame's readings are made task-relative at enter and exit, so
 * enter/exit deltas and self/total follow the task's own stage tree.  A step
 * of a context with no stage open goes to the stack around the loop (if it
 * has a stage open on this thread), which stops only while the step's context
 * has one.  A context that dies with stages open has them recorded up to its
 * last step (abandoned).
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

typedef struct {
    int64_t t, cpu;      /* now_ns(); thread CPU clock or -1 when task-clock gives CPU time */
    uint32_t ctr_gen;    /* g_ctr_gen of c; 0: counters not read */
    uint32_t epoch;      /* g_epoch: a forked child's counters are not its parent's */
    perf_reading c;
} TaskReading;

/* The sums of what the thread's readings advanced while the context was suspended. */
typedef struct TaskClock {
    uint64_t serial;     /* thread the sums are of */
    uint32_t s_gen, epoch;
    TaskReading out;     /* the reading the context was suspended at */
    int64_t s_wall, s_cpu;
    perf_reading s;
} TaskClock;

/* Per thread (ThreadState.tasks): the switch hook's state. */
typedef struct TaskThread {
    PyObject *ctx;       /* context of the last stage boundary or switch (borrowed: compared, never used) */
    uint64_t changes;    /* context changes no switch hook accounted for */
    int32_t batch;       /* loop iterations of a hooked loop open on the thread */
    int chain;           /* `last` is the latest reading and only the loop's dispatch ran since */
    Stack *step_outer;   /* the stack around the step that runs (held by the runner): it runs while the step's */
    PyObject *step_ctx;  /* context (borrowed) has no stage open, and is suspended while it has */
    TaskReading last;
} TaskThread;

#pragma GCC visibility push(hidden)

extern uint64_t g_task_steps, g_task_reads, g_task_changes, g_task_overlapped, g_task_abandoned;

static inline TaskThread *tt_get(ThreadState *ts) {
    if (__builtin_expect(ts->tasks != NULL, 1)) return ts->tasks;
    return ts->tasks = calloc(1, sizeof(TaskThread));
}

/* Frame enter/exit (enter_exit.c): readings made task-relative.  exit returns 1 when the call overlapped other
 * contexts' work on its thread (then no CPU time or counters are recorded for it) and sets *susp to the wall
 * time it was suspended. */
void taskclock_frame_enter(ThreadState *ts, Stack *st, Frame *f);
int taskclock_frame_exit(ThreadState *ts, Stack *st, const Frame *f, perf_reading *c1, int64_t *cpu1, int64_t *susp);
/* A frame of a dying stack as a call that ended at the stack's last task switch (stack.c records it). */
void taskclock_abandoned(Stack *st, const Frame *f, CallMeasure *m);
void taskclock_free(Stack *st);

/* The switch hook's primitives (steps.c). */
void take_reading(ThreadState *ts, TaskReading *r);
void suspend(ThreadState *ts, TaskThread *tt, Stack *st, const TaskReading *r);
void resume(ThreadState *ts, TaskThread *tt, Stack *st, const TaskReading *r);

int taskclock_collect(PyObject *res);         /* adds collect()["tasks"] */

#pragma GCC visibility pop

#endif
