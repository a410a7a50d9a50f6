/* The Stack type and the current context's stack.  A context that dies with
 * stages open (an asyncio task destroyed while pending) has them recorded as
 * calls that ended at its last task switch (abandoned). */
#include "stack.h"   /* first: Python.h sets the feature macros */

#include "exemplars.h"
#include "record.h"
#include "taskclock.h"
#include "threads.h"

PyObject *g_stack_var = NULL;

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

/* The live stacks by their owner context (open addressing, linear probing, under the GIL): the stack a context
 * owns is found without entering the context (which cannot be done while it runs, as when a task's step wakes
 * another) and without a context-variable lookup.  A stack holds its owner, so no other context has its address. */
static Stack **g_by_owner = NULL;
static size_t g_by_owner_cap = 0, g_by_owner_n = 0;   /* cap: a power of two, or 0 */

static inline size_t owner_slot(const PyObject *ctx, size_t cap) {
    return (size_t)(((uint64_t)(uintptr_t)ctx * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
}

static int by_owner_grow(void) {
    size_t cap = g_by_owner_cap ? g_by_owner_cap * 2 : 64;
    Stack **t = calloc(cap, sizeof(Stack *));
    if (!t) return -1;
    for (size_t i = 0; i < g_by_owner_cap; i++) {
        Stack *s = g_by_owner[i];
        if (!s) continue;
        size_t j = owner_slot(s->owner, cap);
        while (t[j]) j = (j + 1) & (cap - 1);
        t[j] = s;
    }
    free(g_by_owner);
    g_by_owner = t, g_by_owner_cap = cap;
    return 0;
}

/* st (its owner set) is the stack of its owner from now on; -1: out of memory (it is then found by nobody). */
static int by_owner_add(Stack *st) {
    if (2 * (g_by_owner_n + 1) > g_by_owner_cap && by_owner_grow() < 0) return -1;
    size_t j = owner_slot(st->owner, g_by_owner_cap);
    for (; g_by_owner[j]; j = (j + 1) & (g_by_owner_cap - 1))
        if (g_by_owner[j]->owner == st->owner) { g_by_owner[j] = st; return 0; }   /* a newer one of the same */
    g_by_owner[j] = st;
    g_by_owner_n++;
    return 0;
}

/* st leaves the map (before its owner is dropped); the entries after it move up to where a lookup finds them. */
static void by_owner_remove(Stack *st) {
    if (!st->owner || !g_by_owner_cap) return;
    size_t mask = g_by_owner_cap - 1, i = owner_slot(st->owner, g_by_owner_cap);
    for (; g_by_owner[i] != st; i = (i + 1) & mask) if (!g_by_owner[i]) return;
    for (size_t j = (i + 1) & mask; g_by_owner[j]; j = (j + 1) & mask) {
        size_t home = owner_slot(g_by_owner[j]->owner, g_by_owner_cap);
        if (((j - home) & mask) >= ((j - i) & mask)) {   /* its home is at or before the hole: it fills it */
            g_by_owner[i] = g_by_owner[j];
            i = j;
        }
    }
    g_by_owner[i] = NULL;
    g_by_owner_n--;
}

Stack *stack_owned_by(PyObject *ctx) {
    if (!ctx || !g_by_owner_n) return NULL;
    for (size_t j = owner_slot(ctx, g_by_owner_cap); g_by_owner[j]; j = (j + 1) & (g_by_owner_cap - 1))
        if (g_by_owner[j]->owner == ctx) return g_by_owner[j];
    return NULL;
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
    by_owner_remove(st);
    Py_CLEAR(st->owner);
    for (; st->n_early > 0; st->n_early--) Py_CLEAR(st->early[st->n_early - 1]);
    return 0;
}

static void Stack_dealloc(Stack *st) {
    PyObject_GC_UnTrack(st);
    by_owner_remove(st);   /* first: nothing finds a stack that is going */
    if (st->depth) stack_abandon(st);
    taskclock_free(st);
    if (st->exemplar) exemplar_stack_gone(st);
    g_open_frames -= st->depth;
    for (int32_t i = 0; i < st->depth; i++) {
        Py_XDECREF(st->frames[i].hook);
        Py_DECREF(st->frames[i].stage);
        frame_read_put(st->frames[i].rd);
    }
    free(st->frames);
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
    return (Stack *)val;
}

/* The stack of the current context.  A context copied from another (asyncio
 * task, copy_context) first sees its parent's stack: it then gets its own,
 * nesting under the parent's innermost stage. */
Stack *stack_current(int create) {
    Stack *own = stack_owned_by(PyThreadState_GET()->context);
    if (own || !create) return own;
    PyObject *val;
    if (PyContextVar_Get(g_stack_var, NULL, &val) < 0) return NULL;
    Stack *st = (Stack *)val;
    Py_XDECREF(val);   /* the context keeps it alive */
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
    if (ns->owner && by_owner_add(ns) < 0) return NULL;   /* (a stack no one finds records nothing) */
    return ns;
}

int32_t current_node(void) {
    Stack *st = stack_visible();
    return st ? stack_top_node(st) : 0;
}
