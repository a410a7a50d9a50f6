/* The switch hook of asyncio attribution (see taskclock.h): stand-ins for
 * asyncio.events.Handle._run (every task step) and BaseEventLoop._run_once
 * (one loop iteration). */
#include "steps.h"   /* first: Python.h sets the feature macros */

#include <string.h>
#include <structmember.h>

#include "stack.h"
#include "taskclock.h"

static PyObject *str_context = NULL, *str_when = NULL;

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

static inline int needs_reads(const Stack *a, const Stack *b) { return (a && a->n_read) || (b && b->n_read); }

/* Switch in: when the handle's context has stages open, the stack around the step (the running context's, its own
 * or inherited, with its innermost stage on this thread) leaves and the handle's enters, at one reading; otherwise
 * the one around keeps running until the step opens a stage (taskclock_frame_enter).  *node: the stage the step
 * runs in, for the loop's record of who held it. */
static void switch_in(ThreadState *ts, TaskThread *tt, PyObject *ctx, Stack **outer, int32_t *node) {
    Stack *o = NULL, *in = NULL;
    *node = 0;
    if (g_open_frames > 0) {   /* no stage open anywhere: nothing to suspend or resume */
        o = stack_visible();
        in = stack_of(ctx);
        if (o && (!o->depth || o->suspended || o->frames[o->depth - 1].ts_serial != ts->serial)) o = NULL;
        if (in && !in->depth) in = NULL;
        *node = in ? stack_top_node(in) : o ? stack_top_node(o) : 0;
    }
    if (in) {
        Reading r;
        int full = needs_reads(o, in);
        if (tt->chain && tt->batch > 0 && tt->last.epoch == g_epoch && (tt->last.full || !full) &&
            tt->last.ctr_gen == (full && g_ctr_n && ts->perf_gen == g_ctr_gen ? g_ctr_gen : tt->last.ctr_gen))
            r = tt->last;   /* only the loop's dispatch ran since the last switch-out: it goes to this step */
        else
            take_reading(ts, &r, full, 0);
        if (o) suspend(ts, tt, o, &r);
        resume(ts, tt, in, &r);
    }
    tt->chain = 0;
    *outer = o;
}

/* Switch out: the handle's context (its stack may be new) leaves, the outer one resumes.  The step's last segment
 * ends (the loop's record of who held it).  Returns when the step ended (0: not timed, no step recorded). */
static int64_t switch_out(ThreadState *ts, TaskThread *tt, PyObject *ctx, Stack *outer) {
    Stack *in = g_open_frames > 0 ? stack_of(ctx) : NULL;
    if (in && (!in->depth || in->suspended)) in = NULL;
    int64_t t1 = 0;
    if (in || (outer && outer->suspended)) {
        take_reading(ts, &tt->last, needs_reads(in, outer && outer->suspended ? outer : NULL), 1);
        t1 = tt->last.t;
        if (in) suspend(ts, tt, in, &tt->last);
        if (outer && outer->suspended) resume(ts, tt, outer, &tt->last);
        tt->chain = 1;
    } else {
        tt->chain = 0;
    }
    if (!tt->step_t0) return 0;
    if (!t1) t1 = now_ns();
    step_segment(tt, t1, 0);
    return t1;
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
    Stack *outer;
    int32_t node;
    int64_t t0 = g_open_frames > 0 ? now_ns() : 0;
    int32_t prev_seg = tt->seg_node;
    if (tt->step_t0 && t0) step_segment(tt, t0, 0);   /* a step inside a step: the running one pauses */
    switch_in(ts, tt, ctx, &outer, &node);
    Py_XINCREF(outer);
    PyObject *prev = tt->ctx, *prev_step_ctx = tt->step_ctx, *prev_handle = tt->step_handle;
    Stack *prev_outer = tt->step_outer;
    int64_t prev_t0 = tt->step_t0;
    tt->ctx = tt->step_ctx = ctx;
    tt->step_outer = outer;
    tt->step_handle = args[0];
    tt->step_t0 = t0;
    tt->seg_t0 = t0, tt->seg_node = node;
    if (!tt->batch_t0) tt->batch_t0 = t0;
    PyObject *res = PyObject_Vectorcall(self->run, args, nargsf, kwnames);
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    if ((tt = ts->tasks)) {
        int64_t t1 = switch_out(ts, tt, ctx, outer);
        tt->ctx = prev;
        tt->step_ctx = prev_step_ctx;
        tt->step_outer = prev_outer;
        tt->step_handle = prev_handle;
        tt->step_t0 = prev_t0;
        tt->seg_t0 = t1 ? t1 : prev_t0 ? now_ns() : 0, tt->seg_node = prev_t0 ? prev_seg : 0;   /* the one paused goes on */
    }
    PyErr_Restore(et, ev, tb);
    Py_XDECREF(outer);
    Py_DECREF(ctx);
    return res;
}

/* When what the running step wakes counts as ready: at the due time of the timer it runs (the sleep it ends), now
 * for a task's own step, else from the start of the loop iteration's steps (an I/O or plain callback became ready
 * at the latest then: a lower bound of the wait); now outside any step (another thread). */
static int64_t ready_since(TaskThread *tt) {
    int64_t now = now_ns();
    PyObject *h = tt->step_handle;
    if (!h) return now;
    if (strcmp(Py_TYPE(h)->tp_name, "TimerHandle") == 0) {
        PyObject *when = PyObject_GetAttr(h, str_when);
        double s = when ? PyFloat_AsDouble(when) : -1.0;
        Py_XDECREF(when);
        if (s < 0) { PyErr_Clear(); return now; }
        int64_t due = (int64_t)(s * 1e9);
        return due < now ? due : now;
    }
    Stack *st = tt->step_ctx ? stack_of(tt->step_ctx) : NULL;
    if (st) return now;
    return tt->batch_t0 && tt->batch_t0 < now ? tt->batch_t0 : now;
}

/* Stands in for BaseEventLoop._call_soon(callback, args, context): a suspended task whose step is scheduled is
 * ready from then on (taskclock.c counts its wait for the loop). */
static PyObject *run_call_soon(Runner *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyObject *res = PyObject_Vectorcall(self->run, args, nargsf, kwnames);
    if (!res || g_open_frames <= 0 || PyVectorcall_NARGS(nargsf) < 4 || !PyContext_CheckExact(args[3])) return res;
    ThreadState *ts = ts_get();
    TaskThread *tt = ts ? tt_get(ts) : NULL;
    Stack *st = tt ? stack_of(args[3]) : NULL;
    if (!tt) PyErr_Clear();
    if (st && st->depth && st->suspended && !st->ready) st->ready = ready_since(tt);
    return res;
}

static PyObject *Runner_vectorcall(Runner *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (!g_enabled || PyVectorcall_NARGS(nargsf) < 1) return PyObject_Vectorcall(self->run, args, nargsf, kwnames);
    if (self->kind == 0) return run_step(self, args, nargsf, kwnames);
    if (self->kind == 2) return run_call_soon(self, args, nargsf, kwnames);
    ThreadState *ts = ts_get();
    TaskThread *tt = ts ? tt_get(ts) : NULL;
    if (!tt) {
        PyErr_Clear();
        return PyObject_Vectorcall(self->run, args, nargsf, kwnames);
    }
    /* one loop iteration: readings are never carried across its wait for events */
    tt->chain = 0;
    tt->batch++;
    tt->batch_t0 = 0;
    PyObject *res = PyObject_Vectorcall(self->run, args, nargsf, kwnames);
    if ((tt = ts->tasks)) {
        tt->batch--;
        tt->chain = 0;
        tt->batch_t0 = 0;
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

static const char *RUNNERS[3] = {"step_runner", "iteration_runner", "ready_runner"};

static PyObject *Runner_repr(Runner *self) {
    return PyUnicode_FromFormat("<instrument %s of %R>", RUNNERS[self->kind], self->run);
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
        PyErr_Format(PyExc_TypeError, "%s needs the method it stands in for, not %.100s", RUNNERS[kind],
                     Py_TYPE(run)->tp_name);
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
static PyObject *mod_ready_runner(PyObject *m, PyObject *run) { return runner_new(run, 2); }

static PyMethodDef task_methods[] = {
    {"step_runner", (PyCFunction)mod_step_runner, METH_O,
     "step_runner(Handle._run) -> a stand-in for asyncio.events.Handle._run that charges each task step to its context"},
    {"iteration_runner", (PyCFunction)mod_iteration_runner, METH_O,
     "iteration_runner(BaseEventLoop._run_once) -> a stand-in that marks one loop iteration"},
    {"ready_runner", (PyCFunction)mod_ready_runner, METH_O,
     "ready_runner(BaseEventLoop._call_soon) -> a stand-in that marks when a suspended task is woken"},
    {NULL}
};

int steps_add_functions(PyObject *module) {
    if (PyType_Ready(&Runner_Type) < 0) return -1;
    if (!(str_context = PyUnicode_InternFromString("_context"))) return -1;
    if (!(str_when = PyUnicode_InternFromString("_when"))) return -1;
    return PyModule_AddFunctions(module, task_methods);
}

