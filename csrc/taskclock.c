/* asyncio attribution (see taskclock.h): task-relative readings, loop-ready
 * time and its blockers, the overlap fallback, and the frames of contexts that
 * died with stages open. */
#include "taskclock.h"   /* first: Python.h sets the feature macros */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "stats.h"

uint64_t g_task_steps = 0, g_task_reads = 0, g_task_changes = 0, g_task_overlapped = 0, g_task_abandoned = 0;

/* ---------------------------------------------------------------- helpers */

/* A stage boundary or a switch in another context than the last one, with no hook to account for it. */
static inline void boundary(TaskThread *tt) {
    PyObject *cur = PyThreadState_GET()->context;
    if (cur != tt->ctx) {
        if (tt->ctx) tt->changes++, g_task_changes++;
        tt->ctx = cur;
    }
}

/* Changes while the stack ran (not suspended) taint its open frames. */
static inline void fold(TaskThread *tt, Stack *st) {
    if (!st->suspended && st->chg_mark != tt->changes) {
        st->taint++;
        st->chg_mark = tt->changes;
    }
}

/* full: what a read call reads (a stack switched has a read call open); else only the time.  The reading's own
 * cost falls on the side of its CPU read that is not the task's: a task resumed starts after it (enter order,
 * the CPU read last), a task suspended stops before it (exit order, the CPU read first); the stage around the
 * loop pays it, as loop overhead. */
void take_reading(ThreadState *ts, Reading *r, int full, int exit_order) {
    if (full) {
        read_boundary(ts, r, exit_order);
        r->t = now_ns();
        g_task_reads++;
    } else {
        read_time(r);
    }
}

static void clock_reset(Stack *st, ThreadState *ts) {
    memset(&st->tt, 0, sizeof(st->tt));
    st->tt.serial = ts->serial;
    st->tt.epoch = g_epoch;
    if (st->clk) memset(st->clk, 0, sizeof(TaskClock));
}

static inline int clock_foreign(const Stack *st, const ThreadState *ts) {
    return st->tt.serial != ts->serial || st->tt.epoch != g_epoch;
}

/* The stack's clock as it applies to readings on this thread now; NULL when it was never suspended. */
static inline TaskTime *clock_for(Stack *st, ThreadState *ts) {
    if (!st->tt.serial) return NULL;
    if (__builtin_expect(clock_foreign(st, ts), 0)) {
        clock_reset(st, ts);   /* moved to another thread, or a forked child: older frames are not comparable anyway */
        st->taint++;
    }
    return &st->tt;
}

void suspend(ThreadState *ts, TaskThread *tt, Stack *st, const Reading *r) {
    fold(tt, st);
    if (clock_foreign(st, ts)) clock_reset(st, ts);
    st->tt.out_t = r->t, st->tt.out_tq = r->tq, st->tt.out_epoch = r->epoch;
    if (st->n_read) {   /* its read calls' quantities: what advances until it resumes is taken out of them */
        if (!st->clk && !(st->clk = calloc(1, sizeof(TaskClock)))) { st->taint++; return; }
        st->clk->out = *r;
        st->clk->valid = 1;
    } else if (st->clk) {
        st->clk->valid = 0;
    }
    st->suspended = 1;
    st->ready = 0;
}

void step_segment(TaskThread *tt, int64_t t, int32_t next) {
    int32_t node = tt->seg_node;
    if (node && t > tt->seg_t0 && (tt->spans || (tt->spans = calloc(STEP_RING, sizeof(StepSpan))))) {
        StepSpan *p = tt->n_spans ? &tt->spans[(tt->n_spans - 1) % STEP_RING] : NULL;
        if (p && p->node == node && p->t1 == tt->seg_t0) p->t1 = t;   /* the same stage goes on */
        else tt->spans[tt->n_spans++ % STEP_RING] = (StepSpan){tt->seg_t0, t, node};
    }
    tt->seg_t0 = t;
    tt->seg_node = next;
}

/* The segments that ran on the loop between `from` and `to`, charged as blockers of `node` on this thread, oldest
 * first (the high-water mark of each blocker entry counts each moment once, stats.h). */
static void charge_blockers(ThreadState *ts, TaskThread *tt, int32_t node, int64_t from, int64_t to) {
    NodeStats *s = tt->spans ? stats_get(&ts->stats, node) : NULL;
    if (!s) return;
    uint64_t lo = 0, hi = tt->n_spans < STEP_RING ? tt->n_spans : STEP_RING;   /* spans that end after `from`: */
    while (lo < hi) {   /* the latest k, found by halving (they end in time order) */
        uint64_t mid = (lo + hi + 1) / 2;
        if (tt->spans[(tt->n_spans - mid) % STEP_RING].t1 > from) lo = mid; else hi = mid - 1;
    }
    for (uint64_t k = lo; k > 0; k--) {
        const StepSpan *p = &tt->spans[(tt->n_spans - k) % STEP_RING];
        int64_t a = p->t0 > from ? p->t0 : from, b = p->t1 < to ? p->t1 : to;
        Blocker *e = b > a ? stats_blocker(s, p->node) : NULL;
        if (!e) continue;
        e->waited += b - a;
        if (b > e->mark) e->held += b - (a > e->mark ? a : e->mark), e->mark = b;
    }
}

/* What the readings advanced while the stack was suspended joins its sums (where the stack reads at all). */
static void add_suspension(Stack *st, const Reading *r) {
    TaskClock *c = st->clk;
    if (!c || !c->valid) { st->taint++; return; }   /* a read call opened while no hook saw it run */
    for (int k = 0; k < Q_SCALARS; k++) {
        if ((c->out.q[k] >= 0) != (r->q[k] >= 0) || (k == Q_CPU && c->out.cpu_src != r->cpu_src)) st->taint++;
        else if (r->q[k] >= 0) c->s_q[k] += r->q[k] - c->out.q[k];
    }
    if (c->out.ctr_gen && c->out.ctr_gen == r->ctr_gen) {
        if (c->s_gen != r->ctr_gen) {
            memset(&c->s, 0, sizeof(c->s));
            c->s_gen = r->ctr_gen;
        }
        for (int k = 0; k < g_ctr_n; k++) {
            c->s.value[k] += r->c.value[k] - c->out.c.value[k];
            c->s.enabled[k] += r->c.enabled[k] - c->out.c.enabled[k];
            c->s.running[k] += r->c.running[k] - c->out.c.running[k];
        }
    } else if (c->out.ctr_gen != r->ctr_gen) {
        st->taint++;
    }
}

void resume(ThreadState *ts, TaskThread *tt, Stack *st, const Reading *r) {
    TaskTime *c = &st->tt;
    if (!st->suspended || clock_foreign(st, ts) || c->out_epoch != r->epoch) {
        st->taint++;   /* it ran where no hook saw it leave, or elsewhere: its open frames are not attributable */
        if (clock_foreign(st, ts)) clock_reset(st, ts);
    } else {
        c->s_wall += r->tq - c->out_tq;   /* timed at the CPU reads: running time and CPU time stay comparable */
        int64_t ready = st->ready > c->out_tq ? st->ready : c->out_tq;
        if (st->ready && r->tq > ready) {
            c->s_loop += r->tq - ready;
            if (st->depth) charge_blockers(ts, tt, st->frames[st->depth - 1].node, ready, r->tq);
        }
        if (st->n_read) add_suspension(st, r);
    }
    st->suspended = 0;
    st->ready = 0;
    st->chg_mark = tt->changes;
}

/* A reading made relative to the stack's task: what advanced while it was suspended taken out (NULL: nothing did
 * while a read call was open). */
static void relative(Reading *r, const TaskClock *c) {
    if (!c) return;
    for (int k = 0; k < Q_SCALARS; k++) if (r->q[k] >= 0) r->q[k] -= c->s_q[k];
    if (r->ctr_gen && c->s_gen == r->ctr_gen) {
        for (int k = 0; k < g_ctr_n; k++) {
            r->c.value[k] -= c->s.value[k];
            r->c.enabled[k] -= c->s.enabled[k];
            r->c.running[k] -= c->s.running[k];
        }
    }
    if (r->cpu_src == 2) r->q[Q_CPU] = (int64_t)r->c.value[g_ctr_taskclock];
}

/* ------------------------------------------------------- frame enter/exit */

/* The stage innermost-open in a running step once st has no stage open: the one around the step for the step's
 * own context; a context copied by hand in the step nests where it was copied. */
static int32_t around(const TaskThread *tt, const Stack *st) {
    if (st->owner != tt->step_ctx) return stack_base(st);
    const Stack *o = tt->step_outer;
    return o && o->depth ? o->frames[o->depth - 1].node : 0;
}

void taskclock_frame_enter(ThreadState *ts, Stack *st, Frame *f) {
    TaskThread *tt = tt_get(ts);
    if (!tt) return;   /* no state: the call stays as frame_push left it, not attributable */
    boundary(tt);
    fold(tt, st);
    tt->chain = 0;
    Stack *o = tt->step_outer;
    if (o && st->depth == 1 && st != o && !o->suspended && st->owner == tt->step_ctx) {
        Reading r;   /* the step's context opens its first stage: the stage around the step stops here */
        if (!f->w || !o->n_read) take_reading(ts, &r, o->n_read > 0, 0);
        else r = f->rd->r0;   /* this call's own readings serve */
        suspend(ts, tt, o, &r);
    }
    if (tt->step_t0) step_segment(tt, f->t0, f->node);   /* who holds the loop in this step */
    TaskTime *c = clock_for(st, ts);
    f->taint0 = st->taint;
    if (!c) return;
    f->susp0 = c->s_wall;
    f->loop0 = c->s_loop;
    if (f->rd) relative(&f->rd->r0, st->clk);
}

int taskclock_frame_exit(ThreadState *ts, Stack *st, const Frame *f, Reading *r1, CallMeasure *m) {
    m->susp = m->loop = 0;
    TaskThread *tt = ts ? tt_get(ts) : NULL;
    if (!tt) return 0;   /* no thread state: nothing was measured on this exit anyway */
    boundary(tt);
    fold(tt, st);
    tt->chain = 0;
    Stack *o = tt->step_outer;
    if (o && st->depth == 1 && st != o && o->suspended && st->owner == tt->step_ctx) {
        Reading r;   /* its last stage closes: the stage around the step resumes here */
        if (!r1 || !o->n_read) take_reading(ts, &r, o->n_read > 0, 1);
        else r = *r1;
        resume(ts, tt, o, &r);
    }
    if (tt->step_t0) step_segment(tt, m->t1, st->depth > 1 ? st->frames[st->depth - 2].node : around(tt, st));
    TaskTime *c = clock_for(st, ts);
    if (c) {
        if (r1) relative(r1, st->clk);
        m->susp = c->s_wall - f->susp0;
        m->loop = c->s_loop - f->loop0;
        if (m->susp < 0) m->susp = 0;
        if (m->loop < 0) m->loop = 0;
    }
    if (st->taint != f->taint0) {
        g_task_overlapped++;
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------ abandoned frames */

/* A context died with stages open (a task destroyed while pending): each open frame is a call that ended at the
 * context's last task switch, with what it had used by then, so nothing it used is lost. */
void taskclock_abandoned(Stack *st, const Frame *f, CallMeasure *m) {
    const TaskTime *c = &st->tt;
    int known = st->suspended && c->serial && c->epoch == g_epoch && c->out_t;   /* (a clock reset since: not) */
    int attributable = known && st->taint == f->taint0 && f->ts_serial == c->serial;
    for (int q = 0; q < Q_MAX; q++) m->x[q] = NAN;
    m->t1 = known ? c->out_t : now_ns();
    m->wall = m->t1 - f->t0;
    m->inner = 0;
    m->susp = known ? c->s_wall - f->susp0 : 0;
    m->loop = known ? c->s_loop - f->loop0 : 0;
    if (m->susp < 0) m->susp = 0;
    if (m->loop < 0) m->loop = 0;
    m->have_ctr = m->read = m->error = 0;
    m->overlapped = known && !attributable;
    m->stand_in = attributable && f->skipped;
    m->abandoned = 1;
    g_task_abandoned++;
    if (!attributable || !f->rd || !st->clk || !st->clk->valid) return;
    Reading r1 = st->clk->out;
    relative(&r1, st->clk);
    call_quantities(&f->rd->r0, &r1, m);
    m->inner = r1.tq - f->rd->r0.tq;   /* what predicts it, as a closed read call's (enter_exit.c read_exit) */
    m->read = 1;
}

void taskclock_free(Stack *st) {
    free(st->clk);
    st->clk = NULL;
}

/* ------------------------------------------------------------- collect */

int taskclock_collect(PyObject *res) {
    PyObject *t = Py_BuildValue("{s:K,s:K,s:K,s:K,s:K}", "steps", (unsigned long long)g_task_steps,
        "switch_reads", (unsigned long long)g_task_reads, "unhooked_changes", (unsigned long long)g_task_changes,
        "overlapped_calls", (unsigned long long)g_task_overlapped, "abandoned_calls", (unsigned long long)g_task_abandoned);
    if (!t) return -1;
    int r = PyDict_SetItemString(res, "tasks", t);
    Py_DECREF(t);
    return r;
}
