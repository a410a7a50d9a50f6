/* The Stack type and the current context's stack.  A context that dies with
 * stages open (an asyncio task destroyed while pending) has them recorded as
 * calls that ended at its last task switch (abandoned). */
#include "stack.h"   /* first: Python.h sets the feature macros */

#include "exemplars.h"
#include "record.h"
#include "taskclock.h"
#include "threads.h"

PyObject *g_stack_var = NULL;
static PyTypeObject Stack_Type;

/* The stack variable's value as a stack: another library may have set it to anything (asgiref restores every
 * context variable). */
static inline Stack *as_stack(PyObject *v) { return v && Py_TYPE(v) == &Stack_Type ? (Stack *)v : NULL; }

/* Read calls' FrameReads, reused (under the GIL): a read call allocates nothing once as many are open as were. */
#define FRAME_READ_SPARE 256
static FrameRead *g_rd_free = NULL;
static int g_rd_n_free = 0;

FrameRead *frame_read_get(void) {
    FrameRead *rd = g_rd_free;
    if (!rd) return malloc(sizeof(FrameRead));
    g_rd_free = rd->next;
    g_rd_n_free--;
    return rd;
}

void frame_read_put(FrameRead *rd) {
    if (!rd) return;
    if (g_rd_n_free >= FRAME_READ_SPARE) { free(rd); return; }
    rd->next = g_rd_free;
    g_rd_free = rd;
    g_rd_n_free++;
}

/* The stack a context owns, found without entering the context (which cannot be done while it runs, as when a task's
 * step wakes another): the context variable read in the context's own mapping (no exception where it is unset). */
Stack *stack_owned_by(PyObject *ctx) {
    if (!ctx || !PyContext_CheckExact(ctx)) return NULL;
    int has = PyContext_Type.tp_as_sequence->sq_contains(ctx, g_stack_var);
    if (has <= 0) {
        if (has < 0) PyErr_Clear();
        return NULL;
    }
    PyObject *v = PyContext_Type.tp_as_mapping->mp_subscript(ctx, g_stack_var);
    if (!v) { PyErr_Clear(); return NULL; }
    Py_DECREF(v);   /* the context keeps it alive */
    Stack *st = as_stack(v);
    return st && st->owner == ctx ? st : NULL;   /* else inherited from the context it was copied from */
}

/* Each open frame of a dying stack, innermost first, through the one path that records a call. */
static void stack_abandon(Stack *st) {
    ThreadState *ts = tls_ts;   /* never created here: this may run during finalisation */
    if (!ts) return;
    for (int32_t i = st->depth - 1; i >= 0; i--) {
        Frame *f = &st->frames[i];
        if (f->epoch != g_epoch) continue;
        CallMeasure m;
        taskclock_abandoned(st, f, &m);
        mem_exit(f->mem, f->mem_serial, st, 0, &m.mem);   /* its slot freed: no exit reading */
        m.switched = m.switched_in = 1;
        record_call(ts, f, i > 0 ? &st->frames[i - 1] : NULL, &m);
    }
}

static int Stack_traverse(Stack *st, visitproc visit, void *arg) {
    Py_VISIT(st->owner);
    for (int32_t i = 0; i < st->depth; i++) Py_VISIT(st->frames[i].hook);
    for (int32_t i = 0; i < st->n_early; i++) Py_VISIT(st->early[i]);
    return 0;
}

static int Stack_clear(Stack *st) {
    Py_CLEAR(st->owner);
    for (; st->n_early > 0; st->n_early--) Py_CLEAR(st->early[st->n_early - 1]);
    return 0;
}

static void Stack_dealloc(Stack *st) {
    PyObject_GC_UnTrack(st);
    if (st->depth) stack_abandon(st);
    taskclock_free(st);
    if (st->exemplar) exemplar_stack_gone(st);
    g_open_frames -= st->depth;
    for (int32_t i = 0; i < st->depth; i++) {
        Py_XDECREF(st->frames[i].hook);
        Py_DECREF(st->frames[i].stage);
        frame_read_put(st->frames[i].rd);
    }
    PyMem_Free(st->frames);
    Stack_clear(st);
    PyObject_GC_Del(st);
}

static PyTypeObject Stack_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._native._Stack",
    .tp_basicsize = sizeof(Stack),
    .tp_dealloc = (destructor)Stack_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Stack_traverse,
    .tp_clear = (inquiry)Stack_clear,
};

int stack_init(void) {
    if (PyType_Ready(&Stack_Type) < 0) return -1;
    g_stack_var = PyContextVar_New("instrument_stack", NULL);
    return g_stack_var ? 0 : -1;
}

Stack *stack_visible(void) {
    PyObject *val;
    if (PyContextVar_Get(g_stack_var, NULL, &val) < 0) { PyErr_Clear(); return NULL; }
    Py_XDECREF(val);   /* the context keeps it alive */
    return as_stack(val);
}

/* The stack of the current context.  A context copied from another (asyncio
 * task, copy_context) first sees its parent's stack: it then gets its own,
 * nesting under the parent's innermost stage. */
Stack *stack_current(int create) {
    PyObject *val;   /* (CPython caches the lookup while the context and the variable stay as they are) */
    if (PyContextVar_Get(g_stack_var, NULL, &val) < 0) return NULL;
    Py_XDECREF(val);   /* the context keeps it alive */
    Stack *st = as_stack(val);
    if (st && st->owner == PyThreadState_GET()->context) return st;
    if (!create) return NULL;
    Stack *ns = PyObject_GC_New(Stack, &Stack_Type);
    if (!ns) return NULL;
    ns->owner = NULL;
    ns->base = st ? stack_top_node(st) : 0;
    ns->base_gen = g_node_gen;
    ns->depth = ns->cap = 0;
    ns->frames = NULL;
    ns->suspended = 0, ns->taint = ns->chg_mark = 0, ns->clk = NULL;   /* taskclock.c */
    memset(&ns->tt, 0, sizeof(ns->tt));
    ns->exemplar = NULL;                                                /* exemplars.c */
    ns->n_early = 0;
    ns->n_read = 0;
    ns->ready = 0;
    PyObject_GC_Track(ns);
    PyObject *tok = PyContextVar_Set(g_stack_var, (PyObject *)ns);
    Py_DECREF(ns);
    if (!tok) return NULL;
    Py_DECREF(tok);
    ns->owner = Py_XNewRef(PyThreadState_GET()->context);   /* set() creates the context if there was none */
    return ns;
}

int32_t current_node(void) {
    Stack *st = stack_visible();
    return st ? stack_top_node(st) : 0;
}
