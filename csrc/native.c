/* instrument._native: the hot path.
 *
 * Stage enter/exit, the per-context stage stack, per-thread aggregation into
 * per-node slots, and the bounded trace ring.  Everything else (formats,
 * percentiles, configuration parsing, torch) lives in Python.
 *
 * Concurrency model: every call here runs with the GIL held.  Each thread
 * aggregates into its own slots (ThreadState.stats), so the hot path touches no
 * shared counters; collect() merges the slots.  The stage stack lives in a
 * context variable, so asyncio tasks interleaving on one thread each see their
 * own nesting, and new threads start with an empty stack.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>
#include <stdint.h>
#include <string.h>

#include "hist.h"
#include "nvtx_emit.h"
#include "perf.h"

#define MAX_NAME_LEN 1024
#define OTHER_NAME "(other)"

/* ------------------------------------------------------------------ clocks */

static inline int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline int64_t thread_cpu_ns(void) {
    struct timespec t;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) != 0) return -1;
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* ------------------------------------------------------------ global state */

static int g_enabled = 1;
static int g_cpu_clock = 1;
static int g_nvtx = 0;             /* emit an NVTX range per stage */
static PyObject *g_get_running_loop = NULL;
/* perf_event counters: the events asked for, opened lazily per thread */
static int g_ctr_n = 0;
static perf_event_desc g_ctr_desc[PERF_MAX_EVENTS];
static int g_ctr_exclude_kernel = 0;
static int g_ctr_taskclock = -1;   /* index of task-clock: CPU time comes from it */
static uint32_t g_ctr_gen = 1;     /* bumped when the events change: threads reopen */
static int g_ctr_status[PERF_MAX_EVENTS];  /* errno per event on the first thread that opened them */
static int g_ctr_status_known = 0;
static int g_ctr_excl_used = 0;
static int g_ctr_rdpmc = 0;   /* asyncio.events._get_running_loop, once asyncio is imported */        /* read CLOCK_THREAD_CPUTIME_ID at each boundary */
static int32_t g_max_nodes = 10000;
static uint32_t g_epoch = 1;       /* bumped in a forked child: frames from the parent are not recorded */
static PyObject *g_hook_enter = NULL, *g_hook_exit = NULL;  /* integrations (torch ranges, GPU events) */
static PyObject *g_stack_var = NULL;
static PyObject *g_ts_key = NULL;
static PyObject *g_stage_cache = NULL;   /* name -> Stage */
static PyObject *g_warn_once = NULL;     /* set of warning keys already shown */

static int64_t g_open_frames = 0;
static uint32_t g_node_gen = 1;    /* bumped when the node table is rebuilt: older node ids are void */  /* frames open in any stack: the node table can only be rebuilt at 0 */
static uint64_t g_unmatched = 0, g_out_of_order = 0, g_cross_thread = 0, g_internal = 0, g_folded = 0;

/* ----------------------------------------------------------------- warnings */

/* Warn once per key; never lets a warning (even one turned into an error) escape. */
static void warn_once(const char *key, const char *fmt, ...) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *k = PyUnicode_FromString(key);
    if (k && g_warn_once && PySet_Contains(g_warn_once, k) == 0 && PySet_Add(g_warn_once, k) == 0) {
        va_list ap;
        va_start(ap, fmt);
        PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
        va_end(ap);
        const char *text = msg ? PyUnicode_AsUTF8(msg) : NULL;
        if (text && PyErr_WarnEx(PyExc_RuntimeWarning, text, 1) < 0) PyErr_Clear();
        Py_XDECREF(msg);
    }
    Py_XDECREF(k);
    PyErr_Clear();
    PyErr_Restore(et, ev, tb);
}

static void internal_failure(const char *what) {
    g_internal++;
    PyErr_Clear();
    warn_once(what, "instrument: internal failure in %s; measurement goes on without it", what);
}

/* -------------------------------------------------------------------- nodes */

typedef struct {
    PyObject *name;      /* interned str; NULL for the root */
    int32_t parent;
    uint8_t other;       /* the "(other)" overflow node */
} Node;

static Node *g_nodes = NULL;
static int32_t g_n_nodes = 0, g_cap_nodes = 0;
static int32_t g_n_named = 0;           /* nodes counted against the cap */
static int32_t *g_table = NULL;         /* open addressing: (parent, name) -> node id, -1 empty */
static size_t g_table_mask = 0;

static inline size_t node_hash(int32_t parent, PyObject *name) {
    uint64_t h = ((uint64_t)(uintptr_t)name >> 4) * 0x9E3779B97F4A7C15ull ^ (uint64_t)parent * 0xC2B2AE3D27D4EB4Full;
    return (size_t)(h ^ (h >> 29));
}

static int table_grow(void) {
    size_t ncap = g_table_mask ? (g_table_mask + 1) * 2 : 256;
    int32_t *t = malloc(ncap * sizeof(int32_t));
    if (!t) return -1;
    memset(t, 0xff, ncap * sizeof(int32_t));
    for (int32_t id = 1; id < g_n_nodes; id++) {
        size_t i = node_hash(g_nodes[id].parent, g_nodes[id].name) & (ncap - 1);
        while (t[i] >= 0) i = (i + 1) & (ncap - 1);
        t[i] = id;
    }
    free(g_table);
    g_table = t;
    g_table_mask = ncap - 1;
    return 0;
}

static int32_t node_new(int32_t parent, PyObject *name, int other) {
    if (g_n_nodes == g_cap_nodes) {
        int32_t ncap = g_cap_nodes ? g_cap_nodes * 2 : 64;
        Node *n = realloc(g_nodes, (size_t)ncap * sizeof(Node));
        if (!n) return -1;
        g_nodes = n;
        g_cap_nodes = ncap;
    }
    if ((size_t)(g_n_nodes + 1) * 2 > g_table_mask + 1 && table_grow() < 0) return -1;
    int32_t id = g_n_nodes++;
    Py_INCREF(name);
    g_nodes[id].name = name;
    g_nodes[id].parent = parent;
    g_nodes[id].other = (uint8_t)other;
    size_t i = node_hash(parent, name) & g_table_mask;
    while (g_table[i] >= 0) i = (i + 1) & g_table_mask;
    g_table[i] = id;
    return id;
}

static inline int32_t node_find(int32_t parent, PyObject *name) {
    size_t i = node_hash(parent, name) & g_table_mask;
    int32_t id;
    while ((id = g_table[i]) >= 0) {
        if (g_nodes[id].parent == parent && g_nodes[id].name == name) return id;
        i = (i + 1) & g_table_mask;
    }
    return -1;
}

static PyObject *g_other_name = NULL;

/* The child of `parent` for `name`; past the cardinality cap, the parent's "(other)" child. */
static int32_t node_child(int32_t parent, PyObject *name) {
    int32_t id = node_find(parent, name);
    if (__builtin_expect(id >= 0, 1)) return id;
    if (g_n_named < g_max_nodes) {
        id = node_new(parent, name, 0);
        if (id >= 0) g_n_named++;
        return id;
    }
    g_folded++;
    if (g_nodes[parent].other) return parent;   /* everything under (other) folds into it */
    id = node_find(parent, g_other_name);
    if (id < 0) {
        id = node_new(parent, g_other_name, 1);
        warn_once("cardinality", "instrument: more than %d distinct stages; new ones are folded into '" OTHER_NAME
                  "' (configure(max_stages=...) raises the cap)", (int)g_max_nodes);
    }
    return id;
}

/* -------------------------------------------------------------- node stats */

typedef struct {
    uint64_t calls, errors, cpu_calls;
    int64_t wall_total, wall_self, wall_min, wall_max;
    int64_t cpu_total, cpu_self;
    hist h;
    struct CounterStat *ctr;   /* g_ctr_n entries, allocated on the first counted call */
} NodeStats;

typedef struct CounterStat {
    double total, self;        /* scaled estimates, summed over the calls that counted */
    uint64_t enabled, running; /* summed time enabled/running of those calls */
    uint64_t counted;          /* calls whose counter ran */
    uint64_t scaled;           /* calls whose value was scaled for multiplexing */
} CounterStat;

typedef struct {
    NodeStats **v;
    int32_t n;
} StatsArray;

static NodeStats *stats_get(StatsArray *a, int32_t node) {
    if (node >= a->n) {
        int32_t nn = a->n ? a->n : 16;
        while (nn <= node) nn *= 2;
        NodeStats **v = realloc(a->v, (size_t)nn * sizeof(NodeStats *));
        if (!v) return NULL;
        memset(v + a->n, 0, (size_t)(nn - a->n) * sizeof(NodeStats *));
        a->v = v;
        a->n = nn;
    }
    NodeStats *s = a->v[node];
    if (!s) {
        s = calloc(1, sizeof(NodeStats));
        if (!s) return NULL;
        s->wall_min = INT64_MAX;
        a->v[node] = s;
    }
    return s;
}

static int stats_merge(NodeStats *d, const NodeStats *s) {
    if (!s->calls) return 0;
    d->calls += s->calls;
    d->errors += s->errors;
    d->cpu_calls += s->cpu_calls;
    d->wall_total += s->wall_total;
    d->wall_self += s->wall_self;
    d->cpu_total += s->cpu_total;
    d->cpu_self += s->cpu_self;
    if (s->wall_min < d->wall_min) d->wall_min = s->wall_min;
    if (s->wall_max > d->wall_max) d->wall_max = s->wall_max;
    if (s->ctr) {
        if (!d->ctr && !(d->ctr = calloc(PERF_MAX_EVENTS, sizeof(CounterStat)))) return -1;
        for (int k = 0; k < PERF_MAX_EVENTS; k++) {
            d->ctr[k].total += s->ctr[k].total;
            d->ctr[k].self += s->ctr[k].self;
            d->ctr[k].enabled += s->ctr[k].enabled;
            d->ctr[k].running += s->ctr[k].running;
            d->ctr[k].counted += s->ctr[k].counted;
            d->ctr[k].scaled += s->ctr[k].scaled;
        }
    }
    return hist_merge(&d->h, &s->h);
}

static void stats_array_clear(StatsArray *a) {
    for (int32_t i = 0; i < a->n; i++) {
        if (a->v[i]) {
            hist_clear(&a->v[i]->h);
            free(a->v[i]->ctr);
            free(a->v[i]);
        }
    }
    free(a->v);
    a->v = NULL;
    a->n = 0;
}

static int stats_array_merge(StatsArray *into, const StatsArray *from) {
    for (int32_t i = 0; i < from->n; i++) {
        if (!from->v[i] || !from->v[i]->calls) continue;
        NodeStats *d = stats_get(into, i);
        if (!d || stats_merge(d, from->v[i]) < 0) return -1;
    }
    return 0;
}

static StatsArray g_retired = {NULL, 0};   /* slots of threads that have ended */

/* ------------------------------------------------------------- trace ring */

typedef struct {
    int32_t node;
    uint32_t tid;
    int64_t t0, dur, cpu0, cpu;
} TraceEvent;

static TraceEvent *g_ring = NULL;
static size_t g_ring_cap = 0, g_ring_next = 0;
static uint64_t g_ring_total = 0;

/* ----------------------------------------------------------- thread state */

typedef struct ThreadState {
    PyObject_HEAD
    StatsArray stats;
    perf_set perf;
    uint32_t perf_gen;           /* g_ctr_gen the set was opened for; 0 = not open */
    uint64_t serial;             /* unique per thread state: addresses are reused after a thread ends */
    unsigned long native_id;
    struct ThreadState *prev, *next;
} ThreadState;

static ThreadState *g_threads = NULL;         /* registry of live thread states */
static _Thread_local ThreadState *tls_ts = NULL;

static void ThreadState_dealloc(ThreadState *ts) {
    /* Runs on the ending thread when its thread dict is cleared: fold its slots. */
    if (stats_array_merge(&g_retired, &ts->stats) < 0) g_internal++;
    stats_array_clear(&ts->stats);
    if (ts->perf_gen) perf_set_close(&ts->perf);
    if (ts->prev) ts->prev->next = ts->next; else if (g_threads == ts) g_threads = ts->next;
    if (ts->next) ts->next->prev = ts->prev;
    if (tls_ts == ts) tls_ts = NULL;
    PyObject_Free(ts);
}

static PyTypeObject ThreadState_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._native._ThreadState",
    .tp_basicsize = sizeof(ThreadState),
    .tp_dealloc = (destructor)ThreadState_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
};

static ThreadState *ts_create(void) {
    PyObject *d = PyThreadState_GetDict();
    if (!d) return NULL;
    ThreadState *ts = PyObject_New(ThreadState, &ThreadState_Type);
    if (!ts) return NULL;
    ts->stats.v = NULL;
    ts->stats.n = 0;
    ts->perf_gen = 0;
    static uint64_t next_serial = 0;
    ts->serial = ++next_serial;
    ts->native_id = PyThread_get_thread_native_id();
    ts->prev = NULL;
    ts->next = g_threads;
    if (g_threads) g_threads->prev = ts;
    g_threads = ts;
    if (PyDict_SetItem(d, g_ts_key, (PyObject *)ts) < 0) {
        Py_DECREF(ts);
        return NULL;
    }
    Py_DECREF(ts);          /* the thread dict owns it */
    tls_ts = ts;
    return ts;
}

static inline ThreadState *ts_get(void) {
    ThreadState *ts = tls_ts;
    return __builtin_expect(ts != NULL, 1) ? ts : ts_create();
}

/* -------------------------------------------------------------- Stage type */

typedef struct {
    PyObject_HEAD
    PyObject *name;
    PyObject *bound[2];   /* cached __enter__/__exit__ callables, so `with` allocates nothing */
    void *nvtx_message;   /* registered string in the current NVTX domain */
    uint32_t nvtx_gen;    /* domain generation the message was registered in */
    uint32_t color, category;
} Stage;

static PyTypeObject Stage_Type;

/* ------------------------------------------------------------- stack type */

typedef struct {
    Stage *stage;
    uint64_t ts_serial;  /* thread that entered it: CPU times and counters are only comparable on it */
    uint8_t cpu_src;     /* where cpu0 came from: 0 nowhere, 1 the thread CPU clock, 2 task-clock */
    PyObject *hook;      /* what the enter hook returned */
    int32_t node;
    uint32_t epoch;
    uint64_t seq;        /* identifies the frame after Python code may have moved it */
    uint8_t nvtx;        /* 0 none, 1 push/pop, 2 start/end */
    uint64_t nvtx_id;
    uint32_t ctr_gen;    /* 0: no counter reading at entry */
    int64_t t0, cpu0;
    perf_reading c0;
    double child_c[PERF_MAX_EVENTS];
    int64_t child_wall, child_cpu;
} Frame;

typedef struct {
    PyObject_HEAD
    PyObject *owner;     /* the Context this stack was made for: held, so its address cannot be reused */
    int32_t base;        /* node under which the stack's outermost stages nest */
    uint32_t base_gen;   /* g_node_gen when base was taken */
    int32_t depth, cap;
    Frame *frames;
} Stack;

static int Stack_traverse(Stack *st, visitproc visit, void *arg) {
    Py_VISIT(st->owner);
    for (int32_t i = 0; i < st->depth; i++) Py_VISIT(st->frames[i].hook);
    return 0;
}

static int Stack_clear(Stack *st) {
    Py_CLEAR(st->owner);
    return 0;
}

static void Stack_dealloc(Stack *st) {
    PyObject_GC_UnTrack(st);
    g_open_frames -= st->depth;
    for (int32_t i = 0; i < st->depth; i++) {
        Py_XDECREF(st->frames[i].hook);
        Py_DECREF(st->frames[i].stage);
    }
    free(st->frames);
    Py_CLEAR(st->owner);
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

static inline int32_t stack_base(const Stack *st) { return st->base_gen == g_node_gen ? st->base : 0; }

/* The stack of the current context.  A context copied from another (asyncio
 * task, copy_context) first sees its parent's stack: it then gets its own,
 * nesting under the parent's innermost stage. */
static Stack *stack_current(int create) {
    PyObject *val;
    if (PyContextVar_Get(g_stack_var, NULL, &val) < 0) return NULL;
    PyObject *ctx = PyThreadState_GET()->context;
    Stack *st = (Stack *)val;
    if (st) {
        Py_DECREF(val);   /* the context keeps it alive */
        if (st->owner == ctx) return st;
    }
    if (!create) return NULL;
    Stack *ns = PyObject_GC_New(Stack, &Stack_Type);
    if (!ns) return NULL;
    ns->owner = NULL;
    ns->base = st ? (st->depth ? st->frames[st->depth - 1].node : stack_base(st)) : 0;
    ns->base_gen = g_node_gen;
    ns->depth = 0;
    ns->cap = 0;
    ns->frames = NULL;
    PyObject_GC_Track(ns);
    PyObject *tok = PyContextVar_Set(g_stack_var, (PyObject *)ns);
    Py_DECREF(ns);
    if (!tok) return NULL;
    Py_DECREF(tok);
    ns->owner = Py_XNewRef(PyThreadState_GET()->context);   /* set() creates the context if there was none */
    return ns;
}

/* ------------------------------------------------------------ enter / exit */

/* Inside a running asyncio loop a stage may be closed after other tasks have
 * opened theirs on the same thread: a start/end range survives that, a push/pop
 * one would corrupt the thread's range stack. */
static int in_event_loop(void) {
    if (!g_get_running_loop) {
        PyObject *ev = PyDict_GetItemString(PyImport_GetModuleDict(), "asyncio.events");   /* borrowed */
        if (!ev) return 0;
        g_get_running_loop = PyObject_GetAttrString(ev, "_get_running_loop");
        if (!g_get_running_loop) { PyErr_Clear(); return 0; }
    }
    PyObject *loop = PyObject_CallNoArgs(g_get_running_loop);
    if (!loop) { PyErr_Clear(); return 0; }
    int r = loop != Py_None;
    Py_DECREF(loop);
    return r;
}

static void nvtx_open(Stage *self, Frame *f, int in_loop) {
    uint32_t gen = nvtx_emit_generation();
    if (self->nvtx_gen != gen || !self->nvtx_message) {
        const char *utf8 = PyUnicode_AsUTF8(self->name);
        if (!utf8) { internal_failure("NVTX"); return; }
        self->nvtx_message = nvtx_emit_register(utf8);
        self->nvtx_gen = gen;
    }
    if (in_loop) {
        f->nvtx = 2;
        f->nvtx_id = nvtx_emit_start(self->nvtx_message, self->color, self->category);
    } else {
        f->nvtx = 1;
        nvtx_emit_push(self->nvtx_message, self->color, self->category);
    }
}

/* The thread's counters, opened on its first stage (or after the events changed). */
static int counters_ready(ThreadState *ts) {
    if (__builtin_expect(ts->perf_gen == g_ctr_gen, 1)) return 1;
    if (ts->perf_gen) perf_set_close(&ts->perf);
    perf_set_open(&ts->perf, g_ctr_desc, g_ctr_n, g_ctr_exclude_kernel);
    ts->perf_gen = g_ctr_gen;
    if (!g_ctr_status_known) {
        memcpy(g_ctr_status, ts->perf.status, sizeof(int) * (size_t)g_ctr_n);
        g_ctr_excl_used = ts->perf.exclude_kernel;
        g_ctr_rdpmc = perf_set_uses_rdpmc(&ts->perf);
        g_ctr_status_known = 1;
    }
    return 1;
}

static uint64_t g_frame_seq = 0;

/* Our frame after Python code ran (a hook may enter, exit or grow the stack). */
static Frame *frame_by_seq(Stack *st, uint64_t seq) {
    for (int32_t j = st->depth - 1; j >= 0; j--)
        if (st->frames[j].seq == seq) return &st->frames[j];
    return NULL;
}

static void stage_enter(Stage *self) {
    if (!g_enabled) return;
    ThreadState *ts = ts_get();
    Stack *st = ts ? stack_current(1) : NULL;
    if (!st) { internal_failure("stage enter"); return; }
    int loop = g_nvtx ? in_event_loop() : 0;   /* may run Python: before any frame pointer is taken */
    int32_t parent = st->depth ? st->frames[st->depth - 1].node : stack_base(st);
    int32_t node = node_child(parent, self->name);
    if (node < 0) { internal_failure("stage enter"); return; }
    if (st->depth == st->cap) {
        int32_t ncap = st->cap ? st->cap * 2 : 8;
        Frame *nf = realloc(st->frames, (size_t)ncap * sizeof(Frame));
        if (!nf) { internal_failure("stage enter"); return; }
        st->frames = nf;
        st->cap = ncap;
    }
    Frame *f = &st->frames[st->depth++];
    g_open_frames++;
    Py_INCREF(self);
    f->stage = self;
    f->ts_serial = ts->serial;
    f->node = node;
    f->epoch = g_epoch;
    f->seq = ++g_frame_seq;
    f->child_wall = f->child_cpu = 0;
    f->hook = NULL;
    f->nvtx = 0;
    f->ctr_gen = 0;
    f->cpu0 = -1;
    f->cpu_src = 0;
    f->t0 = now_ns();
    if (g_hook_enter) {
        uint64_t seq = f->seq;
        PyObject *h = PyObject_CallOneArg(g_hook_enter, self->name);
        if (!h) internal_failure("integration enter hook");
        if (!(f = frame_by_seq(st, seq))) { Py_XDECREF(h); return; }   /* closed by the hook itself */
        f->hook = h;
    }
    if (g_nvtx) nvtx_open(self, f, loop);
    if (g_ctr_n && counters_ready(ts)) {
        perf_set_read(&ts->perf, &f->c0);
        f->ctr_gen = g_ctr_gen;
        memset(f->child_c, 0, sizeof(double) * (size_t)g_ctr_n);
        if (g_ctr_taskclock >= 0 && f->c0.running[g_ctr_taskclock]) {
            f->cpu0 = (int64_t)f->c0.value[g_ctr_taskclock];
            f->cpu_src = 2;
        }
    }
    if (f->cpu_src == 0 && g_cpu_clock && (f->cpu0 = thread_cpu_ns()) >= 0) f->cpu_src = 1;
    f->t0 = now_ns();
}

static void stage_exit(Stage *self, int error) {
    int64_t t1 = now_ns();
    Stack *st = stack_current(0);
    int32_t i = -1;
    if (st) {
        for (i = st->depth - 1; i >= 0 && st->frames[i].stage != self; i--) {}
    }
    if (i < 0) {
        if (!g_enabled) return;   /* entered while disabled */
        g_unmatched++;
        warn_once("unmatched", "instrument: stage '%U' exited on a different thread or task than it was entered "
                  "on (or exited twice); that call is not recorded", self->name);
        return;
    }
    int64_t cpu1 = -1;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);   /* a Region exit carries the function's exception */
    ThreadState *ts = ts_get();   /* a thread given another's context may not have its own slots yet */
    if (!ts) PyErr_Clear();
    PyErr_Restore(et, ev, tb);
    uint64_t serial = ts ? ts->serial : 0;
    Frame *fp = &st->frames[i];
    perf_reading c1;
    int same_thread = ts && fp->ts_serial == serial;
    int have_ctr = fp->ctr_gen && fp->ctr_gen == g_ctr_gen && same_thread && ts->perf_gen == fp->ctr_gen;
    if (have_ctr) perf_set_read(&ts->perf, &c1);
    /* CPU time only from the clock cpu0 came from, on the thread that read it */
    if (fp->cpu_src == 2 && have_ctr && c1.running[g_ctr_taskclock]) cpu1 = (int64_t)c1.value[g_ctr_taskclock];
    else if (fp->cpu_src == 1 && same_thread) cpu1 = thread_cpu_ns();
    double cval[PERF_MAX_EVENTS];
    uint64_t cen[PERF_MAX_EVENTS], crun[PERF_MAX_EVENTS];
    if (have_ctr) {
        for (int k = 0; k < g_ctr_n; k++) {
            uint64_t dv = c1.value[k] - fp->c0.value[k];
            cen[k] = c1.enabled[k] - fp->c0.enabled[k];
            crun[k] = c1.running[k] - fp->c0.running[k];
            /* multiplexed: scale by enabled/running; never ran: no value (not 0) */
            cval[k] = crun[k] == 0 ? -1.0 : crun[k] == cen[k] ? (double)dv : (double)dv * ((double)cen[k] / (double)crun[k]);
        }
    }
    Frame f = *fp;
    if (i != st->depth - 1) {
        g_out_of_order++;
        warn_once("order", "instrument: stage '%U' exited while an inner stage was still open; both are kept "
                  "and recorded as they close", self->name);
        memmove(&st->frames[i], &st->frames[i + 1], (size_t)(st->depth - i - 1) * sizeof(Frame));
    }
    st->depth--;
    g_open_frames--;
    if (!same_thread) {
        g_cross_thread++;
        warn_once("thread", "instrument: stage '%U' was exited on another thread than it was entered on; its CPU "
                  "time is not recorded for that call", self->name);
    }
    int64_t wall = t1 - f.t0;
    int64_t cpu = (cpu1 >= 0 && f.cpu0 >= 0) ? cpu1 - f.cpu0 : -1;
    if (i > 0) {
        Frame *p = &st->frames[i - 1];
        p->child_wall += wall;
        if (cpu >= 0) p->child_cpu += cpu;
        if (have_ctr && p->ctr_gen == f.ctr_gen)
            for (int k = 0; k < g_ctr_n; k++) if (cval[k] >= 0) p->child_c[k] += cval[k];
    }
    if (f.epoch == g_epoch && ts) {
        NodeStats *s = stats_get(&ts->stats, f.node);
        if (s) {
            s->calls++;
            s->errors += error != 0;
            s->wall_total += wall;
            int64_t self_wall = wall - f.child_wall;
            s->wall_self += self_wall > 0 ? self_wall : 0;
            if (wall < s->wall_min) s->wall_min = wall;
            if (wall > s->wall_max) s->wall_max = wall;
            if (cpu >= 0) {
                s->cpu_calls++;
                s->cpu_total += cpu;
                int64_t self_cpu = cpu - f.child_cpu;
                s->cpu_self += self_cpu > 0 ? self_cpu : 0;
            }
            if (hist_add(&s->h, wall > 0 ? (uint64_t)wall : 0) < 0) g_internal++;
            if (have_ctr && (s->ctr || (s->ctr = calloc(PERF_MAX_EVENTS, sizeof(CounterStat))))) {
                for (int k = 0; k < g_ctr_n; k++) {
                    if (cval[k] < 0) continue;
                    CounterStat *c = &s->ctr[k];
                    c->total += cval[k];
                    double self_c = cval[k] - f.child_c[k];
                    c->self += self_c > 0 ? self_c : 0;
                    c->enabled += cen[k];
                    c->running += crun[k];
                    c->counted++;
                    c->scaled += crun[k] != cen[k];
                }
            }
            if (g_ring_cap) {
                TraceEvent *e = &g_ring[g_ring_next];
                e->node = f.node;
                e->tid = (uint32_t)ts->native_id;
                e->t0 = f.t0;
                e->dur = wall;
                e->cpu0 = cpu >= 0 ? f.cpu0 : -1;
                e->cpu = cpu;
                g_ring_next = (g_ring_next + 1) % g_ring_cap;
                g_ring_total++;
            }
        } else {
            g_internal++;
        }
    }
    if (f.hook) {
        if (g_hook_exit) {
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            PyObject *r = PyObject_CallOneArg(g_hook_exit, f.hook);
            if (!r) internal_failure("integration exit hook"); else Py_DECREF(r);
            PyErr_Restore(et, ev, tb);
        }
        Py_DECREF(f.hook);
    }
    if (f.nvtx == 2) nvtx_emit_end(f.nvtx_id);
    else if (f.nvtx == 1 && same_thread) nvtx_emit_pop();   /* a pop on another thread would close its range */
    Py_DECREF(f.stage);
}

/* ----------------------------------------------------------- Stage methods */

static int check_name(PyObject *name) {
    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError, "stage name must be a str, not %.100s", Py_TYPE(name)->tp_name);
        return -1;
    }
    Py_ssize_t n = PyUnicode_GetLength(name);
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "stage name must not be empty");
        return -1;
    }
    if (n > MAX_NAME_LEN) {
        PyErr_Format(PyExc_ValueError, "stage name is %zd characters long; at most %d are allowed", n, MAX_NAME_LEN);
        return -1;
    }
    return 0;
}

static PyObject *stage_new(PyObject *name, PyObject *color, uint32_t category) {
    if (check_name(name) < 0) return NULL;
    uint32_t argb;
    if (color && color != Py_None) {
        unsigned long c = PyLong_Check(color) ? PyLong_AsUnsignedLong(color) : (unsigned long)-1;
        if (c == (unsigned long)-1 || c > 0xFFFFFFFFul) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "color must be an int 0xRRGGBB or 0xAARRGGBB, got %R", color);
            return NULL;
        }
        argb = c <= 0xFFFFFFul ? (uint32_t)c | 0xFF000000u : (uint32_t)c;
    } else {
        Py_ssize_t n;
        const char *utf8 = PyUnicode_AsUTF8AndSize(name, &n);
        if (!utf8) return NULL;
        argb = nvtx_emit_color(utf8, (size_t)n);
    }
    Stage *s = PyObject_GC_New(Stage, &Stage_Type);
    if (!s) return NULL;
    Py_INCREF(name);
    PyUnicode_InternInPlace(&name);
    s->name = name;
    s->bound[0] = s->bound[1] = NULL;
    s->nvtx_message = NULL;
    s->nvtx_gen = 0;
    s->color = argb;
    s->category = category;
    PyObject_GC_Track(s);
    return (PyObject *)s;
}

static PyObject *stage_new_named(PyObject *name) { return stage_new(name, NULL, 0); }

static PyObject *Stage_tp_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *name, *color = Py_None;
    unsigned int category = 0;
    static char *kwlist[] = {"name", "color", "category", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$I:Stage", kwlist, &name, &color, &category)) return NULL;
    return stage_new(name, color, category);
}

static int Stage_traverse(Stage *s, visitproc visit, void *arg) {
    Py_VISIT(s->bound[0]);
    Py_VISIT(s->bound[1]);
    return 0;
}

static int Stage_clear(Stage *s) {
    Py_CLEAR(s->bound[0]);
    Py_CLEAR(s->bound[1]);
    return 0;
}

static void Stage_dealloc(Stage *s) {
    PyObject_GC_UnTrack(s);
    Stage_clear(s);
    Py_DECREF(s->name);
    PyObject_GC_Del(s);
}

static PyObject *Stage_repr(Stage *self) { return PyUnicode_FromFormat("instrument.stage(%R)", self->name); }

static PyObject *Stage_get_name(Stage *self, void *c) { Py_INCREF(self->name); return self->name; }

static PyObject *Stage_get_color(Stage *self, void *c) { return PyLong_FromUnsignedLong(self->color); }
static PyObject *Stage_get_category(Stage *self, void *c) { return PyLong_FromUnsignedLong(self->category); }

static PyGetSetDef Stage_getset[] = {
    {"name", (getter)Stage_get_name, NULL, "the stage's name", NULL},
    {"color", (getter)Stage_get_color, NULL, "ARGB colour of its NVTX range", NULL},
    {"category", (getter)Stage_get_category, NULL, "NVTX category id (0: none)", NULL},
    {NULL}
};

/* __enter__ and __exit__: a descriptor in the type that hands out a callable
 * cached on the stage, instead of a new bound method at every `with`. */
typedef struct {
    PyObject_HEAD
    Stage *stage;
    int which;           /* 0 enter, 1 exit */
    vectorcallfunc vectorcall;
} StageCall;

static PyObject *stage_call_impl(Stage *st, int which, PyObject *const *args, Py_ssize_t nargs) {
    if (which == 0) {
        stage_enter(st);
        Py_INCREF(st);
        return (PyObject *)st;
    }
    stage_exit(st, nargs > 0 && args[0] != Py_None);
    Py_RETURN_FALSE;
}

static PyObject *StageCall_vectorcall(StageCall *c, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    return stage_call_impl(c->stage, c->which, args, PyVectorcall_NARGS(nargsf));
}

static int StageCall_traverse(StageCall *c, visitproc visit, void *arg) { Py_VISIT(c->stage); return 0; }
static int StageCall_clear(StageCall *c) { Py_CLEAR(c->stage); return 0; }
static void StageCall_dealloc(StageCall *c) {
    PyObject_GC_UnTrack(c);
    StageCall_clear(c);
    PyObject_GC_Del(c);
}

static PyTypeObject StageCall_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._native._StageCall",
    .tp_basicsize = sizeof(StageCall),
    .tp_dealloc = (destructor)StageCall_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_traverse = (traverseproc)StageCall_traverse,
    .tp_clear = (inquiry)StageCall_clear,
    .tp_vectorcall_offset = offsetof(StageCall, vectorcall),
};

typedef struct {
    PyObject_HEAD
    int which;
    vectorcallfunc vectorcall;
} StageMethod;

static PyObject *StageMethod_get(StageMethod *m, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None || !PyObject_TypeCheck(obj, &Stage_Type)) { Py_INCREF(m); return (PyObject *)m; }
    Stage *st = (Stage *)obj;
    PyObject *b = st->bound[m->which];
    if (!b) {
        StageCall *c = PyObject_GC_New(StageCall, &StageCall_Type);
        if (!c) return NULL;
        Py_INCREF(st);
        c->stage = st;
        c->which = m->which;
        c->vectorcall = (vectorcallfunc)StageCall_vectorcall;
        PyObject_GC_Track(c);
        st->bound[m->which] = b = (PyObject *)c;
    }
    Py_INCREF(b);
    return b;
}

/* Stage.__enter__(stage) called on the class */
static PyObject *StageMethod_vectorcall(StageMethod *m, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n < 1 || !PyObject_TypeCheck(args[0], &Stage_Type))
        return PyErr_Format(PyExc_TypeError, "Stage.%s needs a Stage as its first argument", m->which ? "__exit__" : "__enter__");
    return stage_call_impl((Stage *)args[0], m->which, args + 1, n - 1);
}

static PyTypeObject StageMethod_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._native._StageMethod",
    .tp_basicsize = sizeof(StageMethod),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_descr_get = (descrgetfunc)StageMethod_get,
    .tp_vectorcall_offset = offsetof(StageMethod, vectorcall),
};

static PyTypeObject Stage_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._native.Stage",
    .tp_doc = "A named stage: `with stage:` times the block and nests it under the enclosing stage.",
    .tp_basicsize = sizeof(Stage),
    .tp_dealloc = (destructor)Stage_dealloc,
    .tp_repr = (reprfunc)Stage_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Stage_traverse,
    .tp_clear = (inquiry)Stage_clear,
    .tp_getset = Stage_getset,
    .tp_new = Stage_tp_new,
};

static int stage_type_ready(void) {
    if (PyType_Ready(&StageCall_Type) < 0 || PyType_Ready(&StageMethod_Type) < 0 || PyType_Ready(&Stage_Type) < 0) return -1;
    static const char *names[2] = {"__enter__", "__exit__"};
    for (int w = 0; w < 2; w++) {
        StageMethod *m = PyObject_New(StageMethod, &StageMethod_Type);
        if (!m) return -1;
        m->which = w;
        m->vectorcall = (vectorcallfunc)StageMethod_vectorcall;
        int r = PyDict_SetItemString(Stage_Type.tp_dict, names[w], (PyObject *)m);
        Py_DECREF(m);
        if (r < 0) return -1;
    }
    PyType_Modified(&Stage_Type);
    return 0;
}

/* ------------------------------------------------------------- Region type */

/* A function wrapped in a stage: calls it between enter and exit, in C. */
typedef struct {
    PyObject_HEAD
    Stage *stage;
    PyObject *func;
    PyObject *dict;
    vectorcallfunc vectorcall;
} Region;

static PyObject *Region_vectorcall(Region *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    stage_enter(self->stage);
    PyObject *r = PyObject_Vectorcall(self->func, args, nargsf, kwnames);
    stage_exit(self->stage, r == NULL);
    return r;
}

static PyObject *Region_tp_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *stage, *func;
    if (!PyArg_ParseTuple(args, "O!O:Region", &Stage_Type, &stage, &func)) return NULL;
    if (!PyCallable_Check(func)) {
        PyErr_Format(PyExc_TypeError, "region() needs a callable, not %.100s", Py_TYPE(func)->tp_name);
        return NULL;
    }
    Region *r = (Region *)type->tp_alloc(type, 0);
    if (!r) return NULL;
    Py_INCREF(stage);
    Py_INCREF(func);
    r->stage = (Stage *)stage;
    r->func = func;
    r->dict = NULL;
    r->vectorcall = (vectorcallfunc)Region_vectorcall;
    return (PyObject *)r;
}

static int Region_traverse(Region *self, visitproc visit, void *arg) {
    Py_VISIT(self->func);
    Py_VISIT(self->dict);
    return 0;
}

static int Region_clear(Region *self) {
    Py_CLEAR(self->func);
    Py_CLEAR(self->dict);
    return 0;
}

static void Region_dealloc(Region *self) {
    PyObject_GC_UnTrack(self);
    Region_clear(self);
    Py_CLEAR(self->stage);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *Region_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) { Py_INCREF(self); return self; }
    return PyMethod_New(self, obj);
}

static PyObject *Region_call(Region *self, PyObject *args, PyObject *kw) {
    stage_enter(self->stage);
    PyObject *r = PyObject_Call(self->func, args, kw);
    stage_exit(self->stage, r == NULL);
    return r;
}

static PyObject *Region_repr(Region *self) { return PyUnicode_FromFormat("<instrument.region %R of %R>", self->stage->name, self->func); }

static PyMemberDef Region_members[] = {
    {"stage", T_OBJECT, offsetof(Region, stage), READONLY, "the stage the calls are timed in"},
    {"__wrapped__", T_OBJECT, offsetof(Region, func), READONLY, "the wrapped function"},
    {NULL}
};

static PyTypeObject Region_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._native.Region",
    .tp_doc = "Region(stage, func): func called inside stage.",
    .tp_basicsize = sizeof(Region),
    .tp_dealloc = (destructor)Region_dealloc,
    .tp_repr = (reprfunc)Region_repr,
    .tp_call = (ternaryfunc)Region_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_traverse = (traverseproc)Region_traverse,
    .tp_clear = (inquiry)Region_clear,
    .tp_descr_get = Region_get,
    .tp_dictoffset = offsetof(Region, dict),
    .tp_vectorcall_offset = offsetof(Region, vectorcall),
    .tp_members = Region_members,
    .tp_new = Region_tp_new,
};

/* ------------------------------------------------------- module functions */

static PyObject *mod_stage(PyObject *m, PyObject *name) {
    PyObject *s = PyDict_GetItemWithError(g_stage_cache, name);   /* borrowed */
    if (s) { Py_INCREF(s); return s; }
    if (PyErr_Occurred()) {
        /* unhashable name: report it the way a bad name is reported */
        PyErr_Clear();
        check_name(name);
        return NULL;
    }
    s = stage_new_named(name);
    if (!s) return NULL;
    if (PyDict_GET_SIZE(g_stage_cache) < 100000 && PyDict_SetItem(g_stage_cache, ((Stage *)s)->name, s) < 0) PyErr_Clear();
    return s;
}

static PyObject *mod_configure(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"enabled", "cpu_clock", "max_stages", "trace_events", "nvtx", NULL};
    int enabled = g_enabled, cpu_clock = g_cpu_clock, nvtx = g_nvtx;
    int max_nodes = g_max_nodes;
    Py_ssize_t trace = (Py_ssize_t)g_ring_cap;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$ppinp:configure", kwlist, &enabled, &cpu_clock, &max_nodes, &trace, &nvtx)) return NULL;
    if (max_nodes < 1) return PyErr_Format(PyExc_ValueError, "max_stages must be at least 1, got %d", max_nodes);
    if (trace < 0) return PyErr_Format(PyExc_ValueError, "trace_events must be 0 or more, got %zd", trace);
    if ((size_t)trace != g_ring_cap) {
        TraceEvent *r = NULL;
        if (trace && !(r = calloc((size_t)trace, sizeof(TraceEvent)))) return PyErr_NoMemory();
        free(g_ring);
        g_ring = r;
        g_ring_cap = (size_t)trace;
        g_ring_next = 0;
        g_ring_total = 0;
    }
    g_enabled = enabled;
    g_cpu_clock = cpu_clock;
    g_max_nodes = max_nodes;
    g_nvtx = nvtx && nvtx_emit_available();
    Py_RETURN_NONE;
}

/* set_counters([(type, config), ...], exclude_kernel, taskclock_index): the events every thread opens. */
static PyObject *mod_set_counters(PyObject *m, PyObject *args) {
    PyObject *events;
    int excl, tc;
    if (!PyArg_ParseTuple(args, "Opi:set_counters", &events, &excl, &tc)) return NULL;
    PyObject *seq = PySequence_Fast(events, "set_counters needs a list of (type, config) pairs");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > PERF_MAX_EVENTS) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "at most %d counters can be read per stage, got %zd", PERF_MAX_EVENTS, n);
    }
    perf_event_desc d[PERF_MAX_EVENTS];
    for (Py_ssize_t k = 0; k < n; k++) {
        unsigned int type;
        unsigned long long config;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, k), "IK", &type, &config)) { Py_DECREF(seq); return NULL; }
        d[k].type = type;
        d[k].config = config;
    }
    Py_DECREF(seq);
    if (tc >= n) tc = -1;
    /* counter slots of the old events would be misread under the new ones */
    for (ThreadState *ts = g_threads; ts; ts = ts->next)
        for (int32_t i = 0; i < ts->stats.n; i++) if (ts->stats.v[i]) { free(ts->stats.v[i]->ctr); ts->stats.v[i]->ctr = NULL; }
    for (int32_t i = 0; i < g_retired.n; i++) if (g_retired.v[i]) { free(g_retired.v[i]->ctr); g_retired.v[i]->ctr = NULL; }
    memcpy(g_ctr_desc, d, sizeof(perf_event_desc) * (size_t)n);
    g_ctr_n = (int)n;
    g_ctr_exclude_kernel = excl;
    g_ctr_taskclock = tc;
    g_ctr_gen++;
    g_ctr_status_known = 0;
    Py_RETURN_NONE;
}

static PyObject *mod_set_hooks(PyObject *m, PyObject *args) {
    PyObject *enter, *exit_;
    if (!PyArg_ParseTuple(args, "OO:set_hooks", &enter, &exit_)) return NULL;
    if ((enter == Py_None) != (exit_ == Py_None)) return PyErr_Format(PyExc_ValueError, "set_hooks needs both hooks or neither");
    Py_CLEAR(g_hook_enter);
    Py_CLEAR(g_hook_exit);
    if (enter != Py_None) {
        Py_INCREF(enter);
        Py_INCREF(exit_);
        g_hook_enter = enter;
        g_hook_exit = exit_;
    }
    Py_RETURN_NONE;
}

static PyObject *hist_to_list(const hist *h) {
    PyObject *l = PyList_New(0);
    if (!l) return NULL;
    for (int b = 0; b < HIST_BLOCKS; b++) {
        if (!h->block[b]) continue;
        for (int s = 0; s < HIST_SUB; s++) {
            uint64_t c = h->block[b][s];
            if (!c) continue;
            PyObject *t = Py_BuildValue("(iK)", (b << HIST_SUB_BITS) | s, (unsigned long long)c);
            if (!t || PyList_Append(l, t) < 0) { Py_XDECREF(t); Py_DECREF(l); return NULL; }
            Py_DECREF(t);
        }
    }
    return l;
}

/* Everything recorded so far, merged over threads, as plain Python data. */
static PyObject *mod_collect(PyObject *m, PyObject *unused) {
    StatsArray all = {NULL, 0};
    int failed = stats_array_merge(&all, &g_retired) < 0;
    size_t live = 0;
    for (ThreadState *ts = g_threads; ts; ts = ts->next, live++) failed |= stats_array_merge(&all, &ts->stats) < 0;
    PyObject *nodes = PyList_New(0), *stats = PyList_New(0), *events = PyList_New(0), *res = NULL;
    if (failed || !nodes || !stats || !events) { if (failed) PyErr_NoMemory(); goto done; }
    for (int32_t id = 1; id < g_n_nodes; id++) {
        PyObject *t = Py_BuildValue("(iiOi)", id, g_nodes[id].parent, g_nodes[id].name, (int)g_nodes[id].other);
        if (!t || PyList_Append(nodes, t) < 0) { Py_XDECREF(t); goto done; }
        Py_DECREF(t);
    }
    for (int32_t id = 0; id < all.n; id++) {
        NodeStats *s = all.v[id];
        if (!s || !s->calls) continue;
        PyObject *h = hist_to_list(&s->h);
        if (!h) goto done;
        PyObject *ctr = PyList_New(0);
        if (!ctr) { Py_DECREF(h); goto done; }
        for (int k = 0; s->ctr && k < g_ctr_n; k++) {
            CounterStat *c = &s->ctr[k];
            PyObject *t = Py_BuildValue("(ddKKKK)", c->total, c->self, (unsigned long long)c->enabled,
                (unsigned long long)c->running, (unsigned long long)c->counted, (unsigned long long)c->scaled);
            if (!t || PyList_Append(ctr, t) < 0) { Py_XDECREF(t); Py_DECREF(ctr); Py_DECREF(h); goto done; }
            Py_DECREF(t);
        }
        PyObject *t = Py_BuildValue("{s:i,s:K,s:K,s:L,s:L,s:L,s:L,s:K,s:L,s:L,s:N}", "node", id,
            "calls", (unsigned long long)s->calls, "errors", (unsigned long long)s->errors,
            "wall_total", (long long)s->wall_total, "wall_self", (long long)s->wall_self,
            "wall_min", (long long)s->wall_min, "wall_max", (long long)s->wall_max,
            "cpu_calls", (unsigned long long)s->cpu_calls, "cpu_total", (long long)s->cpu_total,
            "cpu_self", (long long)s->cpu_self, "hist", h);
        if (t && PyDict_SetItemString(t, "counters", ctr) < 0) Py_CLEAR(t);
        Py_DECREF(ctr);
        if (!t || PyList_Append(stats, t) < 0) { Py_XDECREF(t); goto done; }
        Py_DECREF(t);
    }
    size_t n = g_ring_total < g_ring_cap ? (size_t)g_ring_total : g_ring_cap;
    size_t start = g_ring_total < g_ring_cap ? 0 : g_ring_next;
    for (size_t k = 0; k < n; k++) {
        TraceEvent *e = &g_ring[(start + k) % g_ring_cap];
        PyObject *t = Py_BuildValue("(iILLLL)", e->node, e->tid, (long long)e->t0, (long long)e->dur, (long long)e->cpu0, (long long)e->cpu);
        if (!t || PyList_Append(events, t) < 0) { Py_XDECREF(t); goto done; }
        Py_DECREF(t);
    }
    PyObject *status = PyList_New(0);
    if (!status) goto done;
    for (int k = 0; k < g_ctr_n; k++) {
        PyObject *v = g_ctr_status_known ? PyLong_FromLong(g_ctr_status[k]) : Py_NewRef(Py_None);
        if (!v || PyList_Append(status, v) < 0) { Py_XDECREF(v); Py_DECREF(status); goto done; }
        Py_DECREF(v);
    }
    res = Py_BuildValue("{s:N,s:O,s:O,s:O,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:n,s:L}", "counter_errno", status, "nodes", nodes, "stats", stats, "events", events,
        "events_dropped", (unsigned long long)(g_ring_total - n), "unmatched_exits", (unsigned long long)g_unmatched,
        "out_of_order_exits", (unsigned long long)g_out_of_order, "cross_thread_exits", (unsigned long long)g_cross_thread,
        "internal_failures", (unsigned long long)g_internal, "folded_calls", (unsigned long long)g_folded,
        "max_stages", (unsigned long long)g_max_nodes, "threads", (Py_ssize_t)live, "clock_ns", (long long)now_ns());
    if (res && g_ctr_status_known) {
        PyObject *x = Py_BuildValue("{s:O,s:O}", "exclude_kernel", g_ctr_excl_used ? Py_True : Py_False,
                                    "rdpmc", g_ctr_rdpmc ? Py_True : Py_False);
        if (!x || PyDict_SetItemString(res, "counter_open", x) < 0) Py_CLEAR(res);
        Py_XDECREF(x);
    }
done:
    stats_array_clear(&all);
    Py_XDECREF(nodes);
    Py_XDECREF(stats);
    Py_XDECREF(events);
    return res;
}

static void zero_all(void) {
    for (ThreadState *ts = g_threads; ts; ts = ts->next) stats_array_clear(&ts->stats);
    stats_array_clear(&g_retired);
    g_ring_next = 0;
    g_ring_total = 0;
    g_unmatched = g_out_of_order = g_cross_thread = g_internal = g_folded = 0;
}

/* Forget the stage tree too, when no frame refers to it. */
static void drop_nodes(void) {
    if (g_open_frames != 0) return;
    for (int32_t id = 1; id < g_n_nodes; id++) Py_DECREF(g_nodes[id].name);
    g_n_nodes = 1;
    g_n_named = 0;
    g_node_gen++;
    memset(g_table, 0xff, (g_table_mask + 1) * sizeof(int32_t));
    size_t i = node_hash(-1, Py_None) & g_table_mask;
    g_table[i] = 0;
}

static PyObject *mod_reset(PyObject *m, PyObject *unused) {
    zero_all();
    drop_nodes();
    Py_RETURN_NONE;
}

/* In a forked child: drop the parent's data; frames opened before the fork are not recorded. */
static PyObject *mod_after_fork_child(PyObject *m, PyObject *unused) {
    zero_all();
    if (tls_ts) tls_ts->native_id = PyThread_get_thread_native_id();   /* the child's thread has a new id */
    for (ThreadState *ts = g_threads; ts; ts = ts->next) {
        /* the inherited fds count the parent's threads: close them, reopen lazily */
        if (ts->perf_gen) perf_set_close(&ts->perf);
        ts->perf_gen = 0;
    }
    g_ctr_status_known = 0;
    g_epoch++;
    Py_RETURN_NONE;
}

static PyObject *mod_now_ns(PyObject *m, PyObject *unused) { return PyLong_FromLongLong(now_ns()); }

static PyObject *mod_hist_index(PyObject *m, PyObject *v) {
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    return PyLong_FromLong(hist_index(x));
}

static PyObject *mod_current_path(PyObject *m, PyObject *unused) {
    Stack *st = stack_current(0);
    int32_t node = st ? (st->depth ? st->frames[st->depth - 1].node : stack_base(st)) : 0;
    PyObject *l = PyList_New(0);
    for (; l && node > 0; node = g_nodes[node].parent) {
        if (PyList_Insert(l, 0, g_nodes[node].name) < 0) Py_CLEAR(l);
    }
    if (!l) return NULL;
    PyObject *t = PyList_AsTuple(l);
    Py_DECREF(l);
    return t;
}

static PyMethodDef native_methods[] = {
    {"stage", (PyCFunction)mod_stage, METH_O, "stage(name) -> Stage, one object per name"},
    {"configure", (PyCFunction)(void (*)(void))mod_configure, METH_VARARGS | METH_KEYWORDS, NULL},
    {"set_counters", (PyCFunction)mod_set_counters, METH_VARARGS, "set_counters(events, exclude_kernel, taskclock_index)"},
    {"set_hooks", (PyCFunction)mod_set_hooks, METH_VARARGS, "set_hooks(enter, exit): called around every stage; None, None clears"},
    {"collect", (PyCFunction)mod_collect, METH_NOARGS, "everything recorded, merged over threads"},
    {"reset", (PyCFunction)mod_reset, METH_NOARGS, NULL},
    {"after_fork_child", (PyCFunction)mod_after_fork_child, METH_NOARGS, NULL},
    {"now_ns", (PyCFunction)mod_now_ns, METH_NOARGS, "the hot path's clock (CLOCK_MONOTONIC)"},
    {"hist_index", (PyCFunction)mod_hist_index, METH_O, "bucket of a value in the histogram"},
    {"current_path", (PyCFunction)mod_current_path, METH_NOARGS, "names of the open stages of this context"},
    {NULL}
};

static struct PyModuleDef native_module = {PyModuleDef_HEAD_INIT, "instrument._native", "The compiled hot path of instrument.", -1, native_methods};

PyMODINIT_FUNC PyInit__native(void) {
    if (stage_type_ready() < 0 || PyType_Ready(&Region_Type) < 0 || PyType_Ready(&Stack_Type) < 0 ||
        PyType_Ready(&ThreadState_Type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (!m) return NULL;
    g_stack_var = PyContextVar_New("instrument_stack", NULL);
    g_ts_key = PyUnicode_InternFromString("instrument._native.thread");
    g_other_name = PyUnicode_InternFromString(OTHER_NAME);
    g_stage_cache = PyDict_New();
    g_warn_once = PySet_New(NULL);
    if (nvtx_add_functions(m) < 0 || perf_add_types(m) < 0) return NULL;
    if (!g_stack_var || !g_ts_key || !g_other_name || !g_stage_cache || !g_warn_once) return NULL;
    /* node 0 is the root */
    if (table_grow() < 0 || node_new(-1, Py_None, 0) != 0) return PyErr_NoMemory();
    Py_INCREF(&Stage_Type);
    Py_INCREF(&Region_Type);
    if (PyModule_AddObject(m, "Stage", (PyObject *)&Stage_Type) < 0 || PyModule_AddObject(m, "Region", (PyObject *)&Region_Type) < 0)
        return NULL;
    PyModule_AddIntConstant(m, "MAX_NAME_LEN", MAX_NAME_LEN);
    PyModule_AddIntConstant(m, "HIST_SUB_BITS", HIST_SUB_BITS);
    PyModule_AddIntConstant(m, "HIST_BLOCKS", HIST_BLOCKS);
    return m;
}
