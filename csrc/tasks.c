/* asyncio attribution (see tasks.h): the switch hook, task-relative readings,
 * the overlap fallback, and the frames of contexts that died with stages open. */
#include "tasks.h"   /* first: Python.h sets the feature macros */

#include <stdlib.h>
#include <string.h>
#include <structmember.h>

#include "hist.h"
#include "nodes.h"

uint64_t g_task_steps = 0, g_task_reads = 0, g_task_changes = 0, g_task_overlapped = 0, g_task_abandoned = 0;

static PyObject *str_context = NULL;

/* ---------------------------------------------------------------- helpers */

static inline TaskThread *tt_get(ThreadState *ts) {
    if (__builtin_expect(ts->tasks != NULL, 1)) return ts->tasks;
    return ts->tasks = calloc(1, sizeof(TaskThread));
}

void tasks_thread_free(ThreadState *ts) {
    free(ts->tasks);
    ts->tasks = NULL;
}

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
static void take_reading(ThreadState *ts, TaskReading *r) {
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

static void suspend(ThreadState *ts, TaskThread *tt, Stack *st, const TaskReading *r) {
    fold(tt, st);
    if (!st->clk && !(st->clk = calloc(1, sizeof(TaskClock)))) { st->taint++; return; }
    TaskClock *c = st->clk;
    if (c->serial != ts->serial || c->epoch != g_epoch) clock_reset(c, ts);
    c->out = *r;
    st->suspended = 1;
}

static void resume(ThreadState *ts, TaskThread *tt, Stack *st, const TaskReading *r) {
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

void tasks_frame_enter(ThreadState *ts, Stack *st, Frame *f) {
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

int tasks_frame_exit(ThreadState *ts, Stack *st, const Frame *f, perf_reading *c1, int64_t *cpu1, int64_t *susp) {
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

void tasks_record(NodeStats *s, const Frame *f, int64_t susp, int overlapped) {
    s->overlapped += overlapped != 0;
    s->susp_total += susp;
    int64_t self = susp - f->child_susp;
    s->susp_self += self > 0 ? self : 0;
}

void tasks_merge(NodeStats *d, const NodeStats *s) {
    d->overlapped += s->overlapped;
    d->abandoned += s->abandoned;
    d->susp_total += s->susp_total;
    d->susp_self += s->susp_self;
}

/* ------------------------------------------------------ abandoned frames */

/* A context died with stages open (a task destroyed while pending): each open
 * frame is recorded as a call that ended at the context's last task switch,
 * with the CPU time and counters it had by then, so nothing it used is lost. */
void tasks_stack_free(Stack *st) {
    ThreadState *ts = tls_ts;   /* never created here: this may run during finalisation */
    TaskClock *c = st->clk;
    if (st->depth && ts) {
        int known = st->suspended && c && c->serial && c->epoch == g_epoch;
        int64_t t_end = known ? c->out.t : now_ns();
        for (int32_t i = st->depth - 1; i >= 0; i--) {
            Frame *f = &st->frames[i];
            if (f->epoch != g_epoch) continue;
            int64_t wall = t_end - f->t0, cpu = -1, susp = known ? c->s_wall - f->susp0 : 0;
            if (wall < 0) wall = 0;
            if (susp < 0) susp = 0;
            int attributable = known && st->taint == f->taint0 && f->ts_serial == c->serial;
            double cval[PERF_MAX_EVENTS];
            uint64_t cen[PERF_MAX_EVENTS], crun[PERF_MAX_EVENTS];
            int have_ctr = attributable && f->ctr_gen && f->ctr_gen == g_ctr_gen && c->out.ctr_gen == f->ctr_gen;
            perf_reading c1;
            if (have_ctr) {
                c1 = c->out.c;
                if (c->s_gen == f->ctr_gen) subtract(&c1, &c->s);
                for (int k = 0; k < g_ctr_n; k++) {
                    uint64_t dv = c1.value[k] - f->c0.value[k];
                    cen[k] = c1.enabled[k] - f->c0.enabled[k];
                    crun[k] = c1.running[k] - f->c0.running[k];
                    cval[k] = crun[k] == 0 ? -1.0 : crun[k] == cen[k] ? (double)dv : (double)dv * ((double)cen[k] / (double)crun[k]);
                }
                if (f->cpu_src == 2) cpu = (int64_t)c1.value[g_ctr_taskclock] - f->cpu0;
            }
            if (attributable && f->cpu_src == 1 && c->out.cpu >= 0 && f->cpu0 >= 0) cpu = c->out.cpu - c->s_cpu - f->cpu0;
            if (cpu < -1) cpu = -1;
            if (cpu > wall) cpu = wall;
            double w = f->w;   /* the weight of its readings under the overhead budget (types.c) */
            if (i > 0) {
                Frame *p = &st->frames[i - 1];
                p->child_wall += wall;
                p->child_susp += susp;
                if (w != 1.0) p->child_est = 1;
                if (cpu >= 0) p->child_cpu += (int64_t)((double)cpu * w + 0.5);
                if (have_ctr && p->ctr_gen == f->ctr_gen)
                    for (int k = 0; k < g_ctr_n; k++) if (cval[k] >= 0) p->child_c[k] += cval[k] * w;
            }
            NodeStats *s = stats_get(&ts->stats, f->node);
            if (!s) { g_internal++; continue; }
            g_task_abandoned++;
            s->calls++;
            s->abandoned++;
            s->wall_total += wall;
            int64_t self_wall = wall - f->child_wall;
            s->wall_self += self_wall > 0 ? self_wall : 0;
            if (wall < s->wall_min) s->wall_min = wall;
            if (wall > s->wall_max) s->wall_max = wall;
            if (cpu >= 0) {
                s->cpu_calls++;
                s->cpu_reads++;
                s->cpu_wsum += w;
                s->cpu_wall_w += (double)wall * w;
                s->cpu_cov_wall += wall;
                s->cpu_total += (int64_t)((double)cpu * w + 0.5);
                int64_t self_cpu = cpu - f->child_cpu;
                if (self_cpu < 0 && !f->child_est) self_cpu = 0;
                s->cpu_self += (int64_t)((double)self_cpu * w + (self_cpu < 0 ? -0.5 : 0.5));
            } else if (attributable && f->skipped) {
                s->cpu_calls++;   /* left unread by the budget: the read calls stand for it */
                s->cpu_cov_wall += wall;
            }
            if (hist_add(&s->h, (uint64_t)wall) < 0) g_internal++;
            tasks_record(s, f, susp, !attributable && known);
            if (have_ctr && (s->ctr || (s->ctr = calloc(PERF_MAX_EVENTS, sizeof(CounterStat))))) {
                for (int k = 0; k < g_ctr_n; k++) {
                    if (cval[k] < 0) continue;
                    CounterStat *cs = &s->ctr[k];
                    cs->total += cval[k] * w;
                    double self_c = cval[k] - f->child_c[k];
                    if (self_c < 0 && !f->child_est) self_c = 0;
                    cs->self += self_c * w;
                    cs->enabled += cen[k];
                    cs->running += crun[k];
                    cs->counted++;
                    cs->covered++;
                    cs->wsum += w;
                    cs->scaled += crun[k] != cen[k];
                }
            }
        }
    }
    free(c);
    st->clk = NULL;
}

/* ------------------------------------------------------------ the hooks */

/* Installed as asyncio.events.Handle._run (kind 0: every task step runs in
 * one) and BaseEventLoop._run_once (kind 1: one loop iteration).  A method
 * descriptor, so `handle._run()` calls it with the handle and no bound method. */
typedef struct {
    PyObject_HEAD
    PyObject *run;       /* the method it stands in for */
    int kind;
    vectorcallfunc vectorcall;
} Runner;

/* The stack a context owns (borrowed: the context holds it), without making one. */
static Stack *stack_of(PyObject *ctx) {
    if (PyContext_Enter(ctx) < 0) { PyErr_Clear(); return NULL; }
    Stack *st = stack_current(0);
    if (!st) PyErr_Clear();
    if (PyContext_Exit(ctx) < 0) PyErr_Clear();
    return st;
}

/* The stack the running context sees, its own or inherited (borrowed). */
static Stack *stack_visible(void) {
    PyObject *val;
    if (PyContextVar_Get(g_stack_var, NULL, &val) < 0) { PyErr_Clear(); return NULL; }
    Py_XDECREF(val);   /* the context keeps it alive */
    return (Stack *)val;
}

static PyObject *run_step(Runner *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    ThreadState *ts = ts_get();
    TaskThread *tt = ts ? tt_get(ts) : NULL;
    PyObject *ctx = tt ? PyObject_GetAttr(args[0], str_context) : NULL;
    if (!ctx || !PyContext_CheckExact(ctx)) {
        PyErr_Clear();
        Py_XDECREF(ctx);
        return PyObject_Vectorcall(self->run, args, nargsf, kwnames);
    }
    g_task_steps++;
    /* switch in: when the handle's context has stages open, the stack around the step (the running context's,
     * its own or inherited, with its innermost stage on this thread) leaves and the handle's enters, at one
     * reading; otherwise the one around keeps running until the step opens a stage (tasks_frame_enter) */
    Stack *outer = NULL, *inner = NULL;
    if (g_open_frames > 0) {   /* no stage open anywhere: nothing to suspend or resume */
        outer = stack_visible();
        inner = stack_of(ctx);
        if (outer && (!outer->depth || outer->suspended || outer->frames[outer->depth - 1].ts_serial != ts->serial))
            outer = NULL;
        if (inner && !inner->depth) inner = NULL;
    }
    Py_XINCREF(outer);
    if (inner) {
        TaskReading r;
        if (tt->chain && tt->batch > 0 && tt->last.epoch == g_epoch && tt->last.ctr_gen == (ts->perf_gen == g_ctr_gen ? g_ctr_gen : 0))
            r = tt->last;   /* only the loop's dispatch ran since the last switch-out: it goes to this step */
        else
            take_reading(ts, &r);
        if (outer) suspend(ts, tt, outer, &r);
        if (inner) resume(ts, tt, inner, &r);
    }
    tt->chain = 0;
    PyObject *prev = tt->ctx, *prev_step_ctx = tt->step_ctx;
    Stack *prev_outer = tt->step_outer;
    tt->ctx = tt->step_ctx = ctx;
    tt->step_outer = outer;
    PyObject *res = PyObject_Vectorcall(self->run, args, nargsf, kwnames);
    /* switch out: the handle's context (its stack may be new) leaves, the outer one resumes */
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    if ((tt = ts->tasks)) {
        inner = g_open_frames > 0 ? stack_of(ctx) : NULL;
        if (inner && (!inner->depth || inner->suspended)) inner = NULL;
        if (inner || (outer && outer->suspended)) {
            take_reading(ts, &tt->last);
            if (inner) suspend(ts, tt, inner, &tt->last);
            if (outer && outer->suspended) resume(ts, tt, outer, &tt->last);
            tt->chain = 1;
        } else {
            tt->chain = 0;
        }
        tt->ctx = prev;
        tt->step_ctx = prev_step_ctx;
        tt->step_outer = prev_outer;
    }
    PyErr_Restore(et, ev, tb);
    Py_XDECREF(outer);
    Py_DECREF(ctx);
    return res;
}

static PyObject *Runner_vectorcall(Runner *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (!g_enabled || PyVectorcall_NARGS(nargsf) < 1) return PyObject_Vectorcall(self->run, args, nargsf, kwnames);
    if (self->kind == 0) return run_step(self, args, nargsf, kwnames);
    ThreadState *ts = ts_get();
    TaskThread *tt = ts ? tt_get(ts) : NULL;
    if (!tt) {
        PyErr_Clear();
        return PyObject_Vectorcall(self->run, args, nargsf, kwnames);
    }
    /* one loop iteration: readings are never carried across its wait for events */
    tt->chain = 0;
    tt->batch++;
    PyObject *res = PyObject_Vectorcall(self->run, args, nargsf, kwnames);
    if ((tt = ts->tasks)) {
        tt->batch--;
        tt->chain = 0;
    }
    return res;
}

static PyObject *Runner_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) { Py_INCREF(self); return self; }
    return PyMethod_New(self, obj);
}

static PyObject *Runner_call(Runner *self, PyObject *args, PyObject *kw) {
    return PyVectorcall_Call((PyObject *)self, args, kw);
}

static int Runner_traverse(Runner *self, visitproc visit, void *arg) { Py_VISIT(self->run); return 0; }
static int Runner_clear(Runner *self) { Py_CLEAR(self->run); return 0; }
static void Runner_dealloc(Runner *self) {
    PyObject_GC_UnTrack(self);
    Runner_clear(self);
    PyObject_GC_Del(self);
}

static PyObject *Runner_repr(Runner *self) {
    return PyUnicode_FromFormat("<instrument %s runner of %R>", self->kind ? "iteration" : "step", self->run);
}

static PyMemberDef Runner_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(Runner, run), READONLY, "the method it stands in for"},
    {NULL}
};

static PyTypeObject Runner_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._native._Runner",
    .tp_basicsize = sizeof(Runner),
    .tp_dealloc = (destructor)Runner_dealloc,
    .tp_repr = (reprfunc)Runner_repr,
    .tp_call = (ternaryfunc)Runner_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_traverse = (traverseproc)Runner_traverse,
    .tp_clear = (inquiry)Runner_clear,
    .tp_descr_get = Runner_get,
    .tp_vectorcall_offset = offsetof(Runner, vectorcall),
    .tp_members = Runner_members,
};

static PyObject *runner_new(PyObject *run, int kind) {
    if (!PyCallable_Check(run)) {
        PyErr_Format(PyExc_TypeError, "%s needs the method it stands in for, not %.100s",
                     kind ? "iteration_runner" : "step_runner", Py_TYPE(run)->tp_name);
        return NULL;
    }
    Runner *r = PyObject_GC_New(Runner, &Runner_Type);
    if (!r) return NULL;
    Py_INCREF(run);
    r->run = run;
    r->kind = kind;
    r->vectorcall = (vectorcallfunc)Runner_vectorcall;
    PyObject_GC_Track(r);
    return (PyObject *)r;
}

static PyObject *mod_step_runner(PyObject *m, PyObject *run) { return runner_new(run, 0); }
static PyObject *mod_iteration_runner(PyObject *m, PyObject *run) { return runner_new(run, 1); }

static PyMethodDef task_methods[] = {
    {"step_runner", (PyCFunction)mod_step_runner, METH_O,
     "step_runner(Handle._run) -> a stand-in for asyncio.events.Handle._run that charges each task step to its context"},
    {"iteration_runner", (PyCFunction)mod_iteration_runner, METH_O,
     "iteration_runner(BaseEventLoop._run_once) -> a stand-in that marks one loop iteration"},
    {NULL}
};

int tasks_add_functions(PyObject *module) {
    if (PyType_Ready(&Runner_Type) < 0) return -1;
    if (!(str_context = PyUnicode_InternFromString("_context"))) return -1;
    return PyModule_AddFunctions(module, task_methods);
}

/* ------------------------------------------------------------- collect */

int tasks_collect_stats(PyObject *d, const NodeStats *s) {
    PyObject *t = Py_BuildValue("(KKLL)", (unsigned long long)s->overlapped, (unsigned long long)s->abandoned,
                                (long long)s->susp_total, (long long)s->susp_self);
    if (!t) return -1;
    int r = PyDict_SetItemString(d, "tasks", t);
    Py_DECREF(t);
    return r;
}

int tasks_collect(PyObject *res) {
    PyObject *t = Py_BuildValue("{s:K,s:K,s:K,s:K,s:K}", "steps", (unsigned long long)g_task_steps,
        "switch_reads", (unsigned long long)g_task_reads, "unhooked_changes", (unsigned long long)g_task_changes,
        "overlapped_calls", (unsigned long long)g_task_overlapped, "abandoned_calls", (unsigned long long)g_task_abandoned);
    if (!t) return -1;
    int r = PyDict_SetItemString(res, "tasks", t);
    Py_DECREF(t);
    return r;
}
