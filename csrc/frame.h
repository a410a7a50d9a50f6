/* What an open stage call keeps (Frame) and the per-context stack of open calls
 * (Stack).  Data only: stack.c owns the Stack type, enter_exit.c fills frames,
 * record.c turns a closed one into statistics, taskclock.c makes its readings
 * relative to its asyncio task, exemplars.c keeps a root call's breakdown. */
#ifndef INSTRUMENT_FRAME_H
#define INSTRUMENT_FRAME_H

#include "core.h"
#include "nodes.h"
#include "readings.h"

struct Stage;          /* stage.h */
struct TaskClock;      /* taskclock.h */
struct ExemplarCall;   /* exemplars.h */

#define STACK_EARLY 4   /* stages closed early, per stack, whose later exits are expected */

/* What a read call keeps beside its frame: its readings at enter and its closed children's estimates.  Only read
 * calls have one (the overhead budget reads few), so a frame stays small: a stack of unread calls is a few hundred
 * bytes, however many counters a reading holds. */
typedef struct FrameRead {
    struct FrameRead *next;              /* in the free list (stack.c) */
    Reading r0;                          /* at enter, task-relative */
    double child[Q_MAX];                 /* the children's per-call estimates of each quantity, summed */
} FrameRead;

typedef struct {
    struct Stage *stage;
    uint64_t ts_serial;  /* thread that entered it: CPU times and counters are only comparable on it */
    PyObject *hook;      /* what the enter hook returned */
    int32_t node;
    uint32_t epoch;
    uint64_t seq;        /* identifies the frame after Python code may have moved it */
    uint8_t nvtx;        /* 0 none, 1 push/pop, 2 start/end */
    uint8_t skipped;     /* left unread by the overhead budget (its quantities are estimated) */
    uint64_t nvtx_id;
    int32_t mem;         /* a read call's memory slot (memory.h); -1: none */
    uint32_t mem_serial;
    double w;            /* 1 / its chance of being read; 0: not read */
    uint32_t sw0;        /* the thread's switch sequence at enter (ts_switches) */
    uint32_t sw_in;      /* a read call's, after its reads at enter: its wall window's start (CallMeasure.switched_in) */
    int64_t spent;       /* a read call's: ns its reads at enter took; -1: its thread left the CPU in them */
    int64_t t0;          /* starts the wall window (every call reads the time): rd->r0.t where it was read */
    FrameRead *rd;       /* a read call's readings (NULL: not read; then w is 0) */
    uint64_t taint0;     /* the stack's taint at entry (taskclock.c): changed at exit = overlapped */
    int64_t susp0, loop0;                  /* the stack's suspended and loop-ready sums at entry */
    int64_t child_wall, child_susp, child_loop;   /* of the closed children in the same stack */
} Frame;

/* A stack's virtual clock (taskclock.c): when it was suspended, and the wall time it spent so.  The sums of what a
 * read call's quantities advanced meanwhile are apart (TaskClock), made only once a stack suspends with one open. */
typedef struct {
    uint64_t serial;         /* thread it is of; 0: never suspended */
    uint32_t epoch, out_epoch;
    int64_t out_t, out_tq;   /* the reading it was suspended at: its wall clock, and what the quantities are timed by */
    int64_t s_wall;          /* wall time suspended */
    int64_t s_loop;          /* of it, woken and waiting for the loop */
} TaskTime;

typedef struct {
    PyObject_HEAD
    PyObject *owner;     /* the Context this stack was made for: held, so its address cannot be reused */
    int32_t base;        /* node under which the stack's outermost stages nest */
    uint32_t base_gen;   /* g_node_gen when base was taken */
    int32_t depth, cap;
    Frame *frames;
    int32_t n_read;      /* open frames that were read at enter: a task switch reads for them (taskclock.c) */
    int suspended;       /* asyncio attribution (taskclock.c): left by a task switch, not resumed yet */
    int64_t ready;       /* when the suspended task was woken (it waits for the loop since); 0: not woken */
    uint64_t taint, chg_mark;
    TaskTime tt;
    struct TaskClock *clk;
    struct ExemplarCall *exemplar;   /* the root call open in this stack, for its exemplar (exemplars.c) */
    struct Stage *early[STACK_EARLY];   /* stages closed with an outer one that exited first: their own exits, */
    int32_t n_early;                    /* when they come, are ignored (held references, oldest first) */
} Stack;

#pragma GCC visibility push(hidden)
FrameRead *frame_read_get(void);        /* NULL: out of memory */
void frame_read_put(FrameRead *rd);     /* NULL is ignored */
#pragma GCC visibility pop

static inline int32_t stack_base(const Stack *st) { return st->base_gen == g_node_gen ? st->base : 0; }

/* The innermost open stage of a stack, or the node its outermost stages nest under. */
static inline int32_t stack_top_node(const Stack *st) {
    return st->depth ? st->frames[st->depth - 1].node : stack_base(st);
}

#endif
