/* The switch hook of asyncio attribution (see taskclock.h): stand-ins for
 * asyncio.events.Handle._run (every task step) and BaseEventLoop._run_once
 * (one loop iteration). */
#include "steps.h"   /* first: Python.h sets the feature macros */

#include <string.h>
#include <structmember.h>

#include "memory.h"
#include "stack.h"
#include "taskclock.h"

static PyObject *str_context = NULL, *str_when = NULL;

/* An attribute that a type keeps in a slot (Handle's __slots__), read at its offset once the type is known: a task
 * step reads its handle's context without the generic attribute lookup.  Anything else goes through getattr, and
 * so does everything once the type's attributes changed (its version tag moved). */
typedef struct { PyTypeObject *type; unsigned int version; Py_ssize_t offset; } SlotOf;

static void slot_learn(SlotOf *c, PyTypeObject *t, PyObject *name) {
    PyObject *d = PyObject_GetAttr((PyObject *)t, name);   /* the class attribute: its member descriptor */
    int slot = d && Py_TYPE(d) == &PyMemberDescr_Type && PyType_IsSubtype(t, PyDescr_TYPE(d)) &&
               ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX && t->tp_getattro == PyObject_GenericGetAttr &&
               (t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG);
    c->offset = slot ? ((PyMemberDescrObject *)d)->d_member->offset : -1;   /* -1: getattr's */
    c->version = t->tp_version_tag;
    if (c->type != t) {
        Py_XSETREF(c->type, (PyTypeObject *)Py_NewRef(t));   /* held: its address is never another type's */
    }
    Py_XDECREF(d);
    PyErr_Clear();
}

static PyObject *slot_get(PyObject *obj, PyObject *name, SlotOf *cache, int n) {
    PyTypeObject *t = Py_TYPE(obj);
    for (int k = 0; k < n; k++) {
        SlotOf *c = &cache[k];
        if (c->type && c->type != t) continue;
        if (!c->type || c->version != t->tp_version_tag || !(t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG))
            slot_learn(c, t, name);
        PyObject *v = c->offset >= 0 ? *(PyObject **)((char *)obj + c->offset) : NULL;
        return v ? Py_NewRef(v) : PyObject_GetAttr(obj, name);
    }
    return PyObject_GetAttr(obj, name);
}
static SlotOf g_context_slot[2], g_when_slot[1];   /* Handle and TimerHandle; TimerHandle */

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

static inline int needs_reads(const Stack *a, const Stack *b) { return (a && a->n_read) || (b && b->n_read); }

/* Switch in: when the handle's context has stages open, the stack around the step (the running context's, its own
 * or inherited, with its innermost stage on this thread) leaves and the handle's enters, at one reading; otherwise
 * the one around keeps running until the step opens a stage (taskclock_frame_enter).  *node: the stage the step
 * runs in, for the loop's record of who held it. */
static void switch_in(ThreadState *ts, TaskThread *tt, PyObject *ctx, Stack **outer, int32_t *node) {
    Stack *o = NULL, *in = NULL;
    *node = 0;
    if (g_mem_n) mem_note_owner(ctx);   /* another task's step: the open calls of others overlap it (memory.h) */
    if (g_open_frames > 0) {   /* no stage open anywhere: nothing to suspend or resume */
        o = stack_visible();
        in = stack_owned_by(ctx);
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
    Stack *in = g_open_frames > 0 ? stack_owned_by(ctx) : NULL;
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

/* What a step saves of the one it runs inside (a step inside a step: the running one pauses). */
typedef struct {
    PyObject *ctx, *prev, *prev_step_ctx, *prev_handle;
    Stack *outer, *prev_outer;
    int64_t prev_t0;
    int32_t prev_seg;
} StepSave;

/* A step of ctx begins (called in the context around it): ctx's stack switches in, the loop's record starts. */
static void step_begin(ThreadState *ts, TaskThread *tt, PyObject *ctx, PyObject *handle, StepSave *sv) {
    g_task_steps++;
    int32_t node;
    int64_t t0 = g_open_frames > 0 ? now_ns() : 0;
    sv->ctx = ctx;
    sv->prev_seg = tt->seg_node;
    if (tt->step_t0 && t0) step_segment(tt, t0, 0);   /* a step inside a step: the running one pauses */
    switch_in(ts, tt, ctx, &sv->outer, &node);
    Py_XINCREF(sv->outer);
    sv->prev = tt->ctx, sv->prev_step_ctx = tt->step_ctx, sv->prev_handle = tt->step_handle;
    sv->prev_outer = tt->step_outer;
    sv->prev_t0 = tt->step_t0;
    tt->ctx = tt->step_ctx = ctx;
    tt->step_outer = sv->outer;
    tt->step_handle = handle;
    tt->step_t0 = t0;
    tt->seg_t0 = t0, tt->seg_node = node;
    if (!tt->batch_t0) tt->batch_t0 = t0;
}

/* The step ends (called in the context around it, with the step's exception, if any, pending). */
static void step_end(ThreadState *ts, StepSave *sv) {
    PyObject *et, *ev, *tb;
    TaskThread *tt;
    PyErr_Fetch(&et, &ev, &tb);
    if ((tt = ts->tasks)) {
        int64_t t1 = switch_out(ts, tt, sv->ctx, sv->outer);
        tt->ctx = sv->prev;
        tt->step_ctx = sv->prev_step_ctx;
        tt->step_outer = sv->prev_outer;
        tt->step_handle = sv->prev_handle;
        tt->step_t0 = sv->prev_t0;
        tt->seg_t0 = t1 ? t1 : sv->prev_t0 ? now_ns() : 0;   /* the one paused goes on */
        tt->seg_node = sv->prev_t0 ? sv->prev_seg : 0;
    }
    PyErr_Restore(et, ev, tb);
    Py_XDECREF(sv->outer);
}

static PyObject *run_step(Runner *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    ThreadState *ts = ts_get();
    TaskThread *tt = ts ? tt_get(ts) : NULL;
    PyObject *ctx = tt ? slot_get(args[0], str_context, g_context_slot, 2) : NULL;
    if (!ctx || !PyContext_CheckExact(ctx)) {
        PyErr_Clear();
        Py_XDECREF(ctx);
        return PyObject_Vectorcall(self->run, args, nargsf, kwnames);
    }
    StepSave sv;
    step_begin(ts, tt, ctx, args[0], &sv);
    PyObject *res = PyObject_Vectorcall(self->run, args, nargsf, kwnames);
    step_end(ts, &sv);
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
        PyObject *when = slot_get(h, str_when, g_when_slot, 1);
        double s = when ? PyFloat_AsDouble(when) : -1.0;
        Py_XDECREF(when);
        if (s < 0) { PyErr_Clear(); return now; }
        int64_t due = (int64_t)(s * 1e9);
        return due < now ? due : now;
    }
    Stack *st = tt->step_ctx ? stack_owned_by(tt->step_ctx) : NULL;
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
    Stack *st = tt && args[3] != tt->step_ctx ? stack_owned_by(args[3]) : NULL;   /* (the running task: not suspended) */
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

/* ---------------------------------------------------- the coroutine wrapper */

#if PY_VERSION_HEX >= 0x030A0000   /* am_send: Python 3.10+ (on 3.9 uvloop stays unhooked, and is named) */

/* Wraps a task's coroutine where no Handle stand-in sees its steps (uvloop runs them in its own C code): each
 * send/throw is one step of the task, whose context is the current one; the step's bookkeeping runs in the
 * context around it, as run_step's does. */
typedef struct {
    PyObject_HEAD
    PyObject *coro;
} Stepped;

static PyTypeObject Stepped_Type;

/* Before a send/throw: 1 when the step is timed (sv filled), 0 when it runs as it is (no context entered around
 * it, or a Handle stand-in timed it already). */
static int stepped_begin(ThreadState **pts, StepSave *sv) {
    if (!g_enabled) return 0;
    ThreadState *ts = ts_get();
    TaskThread *tt = ts ? tt_get(ts) : NULL;
    PyObject *ctx = PyThreadState_GET()->context;
    if (!tt) PyErr_Clear();
    if (!tt || !ctx || ctx == tt->step_ctx) return 0;
    Py_INCREF(ctx);   /* leaving it drops the thread's reference */
    if (PyContext_Exit(ctx) < 0) { PyErr_Clear(); Py_DECREF(ctx); return 0; }
    step_begin(ts, tt, ctx, NULL, sv);
    if (PyContext_Enter(ctx) < 0) PyErr_Clear();   /* cannot fail: it was just left */
    *pts = ts;
    return 1;
}

static void stepped_end(ThreadState *ts, StepSave *sv) {
    PyObject *et, *ev, *tb, *ctx = sv->ctx;
    PyErr_Fetch(&et, &ev, &tb);
    int left = PyContext_Exit(ctx) == 0;
    if (!left) PyErr_Clear();
    step_end(ts, sv);
    if (left && PyContext_Enter(ctx) < 0) PyErr_Clear();
    Py_DECREF(ctx);
    PyErr_Restore(et, ev, tb);
}

/* Whether the wrapper lost its coroutine (cleared by the garbage collector): then an error, never a crash. */
static int cleared(Stepped *self) {
    if (self->coro) return 0;
    PyErr_SetString(PyExc_RuntimeError, "instrument: this task's coroutine was already cleared");
    return 1;
}

static PySendResult Stepped_am_send(Stepped *self, PyObject *arg, PyObject **result) {
    ThreadState *ts = NULL;
    StepSave sv;
    *result = NULL;
    if (cleared(self)) return PYGEN_ERROR;
    int timed = stepped_begin(&ts, &sv);
    PySendResult r = PyIter_Send(self->coro, arg, result);
    if (timed) stepped_end(ts, &sv);
    return r;
}

/* A send's outcome as a method returns it: the value yielded, or StopIteration carrying the value returned. */
static PyObject *send_result(PySendResult r, PyObject *res) {
    if (r != PYGEN_RETURN) return res;
    if (res == Py_None) PyErr_SetNone(PyExc_StopIteration);
    else {
        PyObject *e = PyObject_CallOneArg(PyExc_StopIteration, res);
        if (e) PyErr_SetObject(PyExc_StopIteration, e);
        Py_XDECREF(e);
    }
    Py_DECREF(res);
    return NULL;
}

static PyObject *Stepped_send(Stepped *self, PyObject *arg) {
    PyObject *res = NULL;
    PySendResult r = Stepped_am_send(self, arg, &res);
    return send_result(r, res);
}

static PyObject *Stepped_iternext(Stepped *self) { return Stepped_send(self, Py_None); }

static PyObject *Stepped_throw(Stepped *self, PyObject *args) {
    ThreadState *ts = NULL;
    StepSave sv;
    if (cleared(self)) return NULL;
    PyObject *throw = PyObject_GetAttrString(self->coro, "throw");
    if (!throw) return NULL;
    int timed = stepped_begin(&ts, &sv);
    PyObject *res = PyObject_Call(throw, args, NULL);
    if (timed) stepped_end(ts, &sv);
    Py_DECREF(throw);
    return res;
}

static PyObject *Stepped_close(Stepped *self, PyObject *unused) {
    if (!self->coro) Py_RETURN_NONE;   /* nothing left to close */
    return PyObject_CallMethod(self->coro, "close", NULL);
}

static PyObject *Stepped_await(Stepped *self) { Py_INCREF(self); return (PyObject *)self; }

/* What the coroutine has (cr_frame, cr_code, __qualname__: asyncio's task repr and stacks) reads through. */
static PyObject *Stepped_getattro(Stepped *self, PyObject *name) {
    PyObject *v = PyObject_GenericGetAttr((PyObject *)self, name);
    if (v || !PyErr_ExceptionMatches(PyExc_AttributeError) || !self->coro) return v;
    PyErr_Clear();
    return PyObject_GetAttr(self->coro, name);
}

static PyObject *Stepped_repr(Stepped *self) { return PyObject_Repr(self->coro); }
static int Stepped_traverse(Stepped *self, visitproc visit, void *arg) { Py_VISIT(self->coro); return 0; }
static int Stepped_clear(Stepped *self) { Py_CLEAR(self->coro); return 0; }
static void Stepped_dealloc(Stepped *self) {
    PyObject_GC_UnTrack(self);
    Stepped_clear(self);
    PyObject_GC_Del(self);
}

static PyMethodDef Stepped_methods[] = {
    {"send", (PyCFunction)Stepped_send, METH_O, "one step of the task, timed as its own"},
    {"throw", (PyCFunction)Stepped_throw, METH_VARARGS, "one step of the task, timed as its own"},
    {"close", (PyCFunction)Stepped_close, METH_NOARGS, "closes the coroutine"},
    {NULL}
};

static PyMemberDef Stepped_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(Stepped, coro), READONLY, "the task's coroutine"},
    {NULL}
};

static PyAsyncMethods Stepped_async = {
    .am_await = (unaryfunc)Stepped_await,
    .am_send = (sendfunc)Stepped_am_send,
};

static PyTypeObject Stepped_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._native._Stepped",
    .tp_basicsize = sizeof(Stepped),
    .tp_dealloc = (destructor)Stepped_dealloc,
    .tp_repr = (reprfunc)Stepped_repr,
    .tp_as_async = &Stepped_async,
    .tp_getattro = (getattrofunc)Stepped_getattro,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Stepped_traverse,
    .tp_clear = (inquiry)Stepped_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Stepped_iternext,
    .tp_methods = Stepped_methods,
    .tp_members = Stepped_members,
};

/* stepped(coro): the coroutine wrapped so that each of its steps is timed as its task's; anything else as it is. */
static PyObject *mod_stepped(PyObject *m, PyObject *coro) {
    if (!PyCoro_CheckExact(coro)) { Py_INCREF(coro); return coro; }
    Stepped *w = PyObject_GC_New(Stepped, &Stepped_Type);
    if (!w) return NULL;
    Py_INCREF(coro);
    w->coro = coro;
    PyObject_GC_Track(w);
    return (PyObject *)w;
}
#endif

/* ------------------------------------------------------------ the runners */

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
#if PY_VERSION_HEX >= 0x030A0000
    {"stepped", (PyCFunction)mod_stepped, METH_O,
     "stepped(coro) -> the coroutine wrapped so that each send/throw is timed as a step of its task"},
#endif
    {NULL}
};

int steps_add_functions(PyObject *module) {
    if (PyType_Ready(&Runner_Type) < 0) return -1;
#if PY_VERSION_HEX >= 0x030A0000
    if (PyType_Ready(&Stepped_Type) < 0) return -1;
#endif
    if (!(str_context = PyUnicode_InternFromString("_context"))) return -1;
    if (!(str_when = PyUnicode_InternFromString("_when"))) return -1;
    return PyModule_AddFunctions(module, task_methods);
}

