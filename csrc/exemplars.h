/* Exemplars: per call of a root stage (a request), the self time of each stage
 * beneath it in that call; kept per root stage, bounded: the K slowest calls and
 * a uniform reservoir of K calls. */
#ifndef INSTRUMENT_EXEMPLARS_H
#define INSTRUMENT_EXEMPLARS_H

#include "core.h"
#include "threads.h"
#include "frame.h"

struct CallMeasure;   /* record.h */

#define EXEMPLAR_MAX_PARTS 64           /* distinct stages in one call's breakdown; more are added up as "(other)" */
#define EXEMPLAR_MAX_K 1024

/* A stage's self time in one root call, and how it went: on a CPU, waiting for one, awaiting, waiting for the
 * loop, waiting for the GIL (blocked is the rest); on_cpu and runqueue -1 where that stage was not read in the call,
 * gil -1 where the GIL sampler's counts were not; mem: the resident set's peak above a call's start, the largest of
 * that stage's calls in the root call (memory.h), -1 where none was measured.  Node -1: the "(other)" of a full
 * breakdown. */
typedef struct { int32_t node; int64_t ns, on_cpu, runqueue, awaiting, loop, gil, mem; } ExemplarPart;

/* A root call in progress: its breakdown so far.  Pooled: taken at the root's enter, given back at its exit. */
typedef struct ExemplarCall {
    uint64_t seq;                 /* the root frame's seq */
    int32_t n, cap;
    ExemplarPart *parts;
    struct ExemplarCall *next;          /* the free pool */
} ExemplarCall;

#pragma GCC visibility push(hidden)

extern int32_t g_exemplar_k;            /* K; 0 = off */

void exemplar_enter(Stack *st, const Frame *f);                     /* after a frame was pushed: a root call starts */
void exemplar_exit(Stack *st, const Frame *f, const struct CallMeasure *m, ThreadState *ts);   /* a frame closed */
void exemplar_stack_gone(Stack *st);                  /* the stack is freed with a root call open */
int exemplar_set_k(int32_t k);                               /* drops every store; 0, or -1 when out of memory */
void exemplar_reset(void);                                   /* drops every store (reset, fork) */
/* [(root, seq, slow, sample, wall, t0, tid, [(node, ns, on_cpu, rq, await, loop, gil, mem)])] */
PyObject *exemplar_collect(void);
size_t exemplar_bytes(void);                                 /* memory held by the stores (all root stages) */
size_t exemplar_pool_bytes(void);                            /* memory held by the calls, open or pooled */

#pragma GCC visibility pop

#endif
