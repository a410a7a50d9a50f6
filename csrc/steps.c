/* The switch hook of asyncio attribution (see taskclock.h): stand-ins for
 * asyncio.events.Handle._run (every task step) and BaseEventLoop._run_once
 * (one loop iteration). */
#include "steps.h"   /* first: Python.h sets the feature macros */

#include <structmember.h>

#include "stack.h"
#include "taskclock.h"

static PyObject *str_context = NULL;

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

int steps_add_functions(PyObject *module) {
    if (PyType_Ready(&Runner_Type) < 0) return -1;
    if (!(str_context = PyUnicode_InternFromString("_context"))) return -1;
    return PyModule_AddFunctions(module, task_methods);
}

