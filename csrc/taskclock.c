/* asyncio attribution (see taskclock.h): task-relative readings, the overlap
 * fallback, and the frames of contexts that died with stages open. */
#include "taskclock.h"   /* first: Python.h sets the feature macros */

#include <stdlib.h>
#include <string.h>

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

/* The readings a frame would take: the counter group when open, the CPU clock where task-clock gives none. */
void take_reading(ThreadState *ts, TaskReading *r) {
    r->ctr_gen = 0;
    r->cpu = -1;
    r->epoch = g_epoch;
    if (g_ctr_n && ts->perf_gen && ts->perf_gen == g_ctr_gen) {
        perf_set_read(&ts->perf, &r->c);
        r->ctr_gen = g_ctr_gen;
    }
    if (g_cpu_clock && !(r->ctr_gen && g_ctr_taskclock >= 0 && r->c.running[g_ctr_taskclock])) r->cpu = thread_cpu(ts);
    r->t = now_ns();
    g_task_reads++;
}

static void clock_reset(TaskClock *c, ThreadState *ts) {
    memset(c, 0, sizeof(*c));
    c->serial = ts->serial;
    c->epoch = g_epoch;
}

/* The sums as they apply to readings on this thread now; NULL when there are none. */
static inline TaskClock *clock_for(Stack *st, ThreadState *ts) {
    TaskClock *c = st->clk;
    if (!c) return NULL;
    if (__builtin_expect(c->serial != ts->serial || c->epoch != g_epoch, 0)) {
        clock_reset(c, ts);   /* moved to another thread, or a forked child: older frames are not comparable anyway */
        st->taint++;
    }
    return c;
}

void suspend(ThreadState *ts, TaskThread *tt, Stack *st, const TaskReading *r) {
    fold(tt, st);
    if (!st->clk && !(st->clk = calloc(1, sizeof(TaskClock)))) { st->taint++; return; }
    TaskClock *c = st->clk;
    if (c->serial != ts->serial || c->epoch != g_epoch) clock_reset(c, ts);
    c->out = *r;
    st->suspended = 1;
}

void resume(ThreadState *ts, TaskThread *tt, Stack *st, const TaskReading *r) {
    TaskClock *c = st->clk;
    if (!st->suspended || !c || c->serial != ts->serial || c->epoch != g_epoch || c->out.epoch != r->epoch) {
        st->taint++;   /* it ran where no hook saw it leave, or elsewhere: its open frames are not attributable */
        if (c && (c->serial != ts->serial || c->epoch != g_epoch)) clock_reset(c, ts);
    } else {
        c->s_wall += r->t - c->out.t;
        if (c->out.cpu >= 0 && r->cpu >= 0) c->s_cpu += r->cpu - c->out.cpu;
        else if ((c->out.cpu >= 0) != (r->cpu >= 0)) st->taint++;
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
    st->suspended = 0;
    st->chg_mark = tt->changes;
}

/* A frame's own raw readings as a switch reading (the stack around the step leaves or resumes there). */
static void frame_reading(TaskReading *r, uint32_t ctr_gen, const perf_reading *c, int cpu_src, int64_t cpu) {
    r->t = now_ns();
    r->epoch = g_epoch;
    r->ctr_gen = c ? ctr_gen : 0;
    if (c) r->c = *c;
    r->cpu = cpu_src == 1 ? cpu : -1;
}

static inline void subtract(perf_reading *r, const perf_reading *s) {
    for (int k = 0; k < g_ctr_n; k++) {
        r->value[k] -= s->value[k];
        r->enabled[k] -= s->enabled[k];
        r->running[k] -= s->running[k];
    }
}

/* ------------------------------------------------------- frame enter/exit */

void taskclock_frame_enter(ThreadState *ts, Stack *st, Frame *f) {
    f->child_susp = 0;
    f->susp0 = 0;
    TaskThread *tt = tt_get(ts);
    if (!tt) {
        f->taint0 = ~(uint64_t)0;   /* no state: the call is not attributable */
        return;
    }
    boundary(tt);
    fold(tt, st);
    tt->chain = 0;
    Stack *o = tt->step_outer;
    if (o && st->depth == 1 && st != o && !o->suspended && st->owner == tt->step_ctx) {
        TaskReading r;   /* the step's context opens its first stage: the stage around the step stops here */
        if (f->skipped) take_reading(ts, &r);   /* left unread by the overhead budget */
        else frame_reading(&r, f->ctr_gen, f->ctr_gen ? &f->c0 : NULL, f->cpu_src, f->cpu0);
        suspend(ts, tt, o, &r);
    }
    TaskClock *c = clock_for(st, ts);
    f->taint0 = st->taint;
    if (!c) return;
    f->susp0 = c->s_wall;
    if (f->ctr_gen && c->s_gen == f->ctr_gen) subtract(&f->c0, &c->s);
    if (f->cpu_src == 2) f->cpu0 = (int64_t)f->c0.value[g_ctr_taskclock];
    else if (f->cpu_src == 1) f->cpu0 -= c->s_cpu;
}

int taskclock_frame_exit(ThreadState *ts, Stack *st, const Frame *f, perf_reading *c1, int64_t *cpu1, int64_t *susp) {
    *susp = 0;
    TaskThread *tt = ts ? tt_get(ts) : NULL;
    if (!tt) return 0;   /* no thread state: nothing was measured on this exit anyway */
    boundary(tt);
    fold(tt, st);
    tt->chain = 0;
    Stack *o = tt->step_outer;
    if (o && st->depth == 1 && st != o && o->suspended && st->owner == tt->step_ctx) {
        TaskReading r;   /* its last stage closes: the stage around the step resumes here */
        if (f->skipped) take_reading(ts, &r);
        else frame_reading(&r, f->ctr_gen, c1, f->cpu_src, *cpu1);
        resume(ts, tt, o, &r);
    }
    TaskClock *c = clock_for(st, ts);
    if (c) {
        if (c1 && c->s_gen == f->ctr_gen) subtract(c1, &c->s);
        if (*cpu1 >= 0) {
            if (f->cpu_src == 2 && c1) *cpu1 = (int64_t)c1->value[g_ctr_taskclock];
            else if (f->cpu_src == 1) *cpu1 -= c->s_cpu;
        }
        *susp = c->s_wall - f->susp0;
        if (*susp < 0) *susp = 0;
    }
    if (st->taint != f->taint0) {
        g_task_overlapped++;
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------ abandoned frames */

/* A context died with stages open (a task destroyed while pending): each open frame is a call that ended at the
 * context's last task switch, with the CPU time and counters it had by then, so nothing it used is lost. */
void taskclock_abandoned(Stack *st, const Frame *f, CallMeasure *m) {
    TaskClock *c = st->clk;
    int known = st->suspended && c && c->serial && c->epoch == g_epoch;
    int attributable = known && st->taint == f->taint0 && f->ts_serial == c->serial;
    memset(m, 0, sizeof(*m));
    m->wall = (known ? c->out.t : now_ns()) - f->t0;
    m->susp = known ? c->s_wall - f->susp0 : 0;
    if (m->susp < 0) m->susp = 0;
    m->cpu = m->sys = -1;
    m->overlapped = known && !attributable;
    m->stand_in = attributable && f->skipped;
    m->abandoned = 1;
    g_task_abandoned++;
    if (!attributable) return;
    if (f->ctr_gen && f->ctr_gen == g_ctr_gen && c->out.ctr_gen == f->ctr_gen) {
        perf_reading c1 = c->out.c;
        if (c->s_gen == f->ctr_gen) subtract(&c1, &c->s);
        counter_deltas(&f->c0, &c1, m);
        if (f->cpu_src == 2) m->cpu = (int64_t)c1.value[g_ctr_taskclock] - f->cpu0;
    }
    if (f->cpu_src == 1 && c->out.cpu >= 0 && f->cpu0 >= 0) m->cpu = c->out.cpu - c->s_cpu - f->cpu0;
    m->read = m->cpu >= 0 || m->have_ctr;
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
