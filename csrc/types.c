/* The Python types of the hot path and stage enter/exit: Stage (with its cached
 * __enter__/__exit__ callables, StageCall and StageMethod), Region, and the
 * per-context stack of open stages. */
#include "types.h"   /* first: Python.h sets the feature macros */

#include <string.h>
#include <structmember.h>

#include "nodes.h"
#include "stats.h"
#include "threads.h"
#include "hist.h"
#include "nvtx_emit.h"
#include "tasks.h"
#include "exemplars.h"
#include "rootexit.h"

PyObject *g_stack_var = NULL;                /* context variable holding the Stack */
static PyObject *g_get_running_loop = NULL;  /* asyncio.events._get_running_loop, once asyncio is imported */

/* ------------------------------------------------------------- stack type */

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
    tasks_stack_free(st);   /* a context that died with stages open: recorded as abandoned */
    if (st->xm) xm_stack_gone(st);
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

/* The stack of the current context.  A context copied from another (asyncio
 * task, copy_context) first sees its parent's stack: it then gets its own,
 * nesting under the parent's innermost stage. */
Stack *stack_current(int create) {
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
    ns->suspended = 0, ns->taint = ns->chg_mark = 0, ns->clk = NULL;   /* tasks.c */
    ns->xm = NULL;                                                      /* exemplars.c */
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

#define MIN_READ_CHANCE (1.0 / 65536)

/* Whether this call of `node` is read under the overhead budget; *w: the weight of its readings. */
static inline int budget_read(ThreadState *ts, int32_t node, double *w) {
    *w = 1.0;
    if (g_budget <= 0 || g_read_cost <= 0) return 1;
    NodeStats *s = stats_get(&ts->stats, node);
    if (!s || !s->calls) return 1;                        /* the first call on this thread: read */
    double p = g_budget * ((double)s->wall_total / (double)s->calls) / g_read_cost;
    if (p >= 1.0) return 1;                               /* long enough for a read on every call */
    if (p < MIN_READ_CHANCE) p = MIN_READ_CHANCE;
    if (ts_uniform(ts) >= p) return 0;
    *w = 1.0 / p;
    return 1;
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
    f->sys0 = -1;
    f->child_sys = 0;
    f->child_est = 0;
    f->skipped = 0;
    f->w = 0;
    f->t0 = now_ns();
    if (g_xm_k) xm_enter(st, f);   /* exemplars: a root stage starts its call's breakdown (exemplars.c) */
    if (g_hook_enter) {
        uint64_t seq = f->seq;
        PyObject *h = PyObject_CallOneArg(g_hook_enter, self->name);
        if (!h) internal_failure("integration enter hook");
        if (!(f = frame_by_seq(st, seq))) { Py_XDECREF(h); return; }   /* closed by the hook itself */
        f->hook = h;
    }
    if (g_nvtx) nvtx_open(self, f, loop);
    double w;
    if (!budget_read(ts, node, &w)) {
        f->skipped = 1;
    } else if (g_ctr_n && counters_ready(ts)) {
        perf_set_read(&ts->perf, &f->c0);
        f->ctr_gen = g_ctr_gen;
        memset(f->child_c, 0, sizeof(double) * (size_t)g_ctr_n);
        if (g_ctr_taskclock >= 0 && f->c0.running[g_ctr_taskclock]) {
            f->cpu0 = (int64_t)f->c0.value[g_ctr_taskclock];
            f->cpu_src = 2;
        }
    }
    if (!f->skipped && f->cpu_src == 0 && g_cpu_clock && (f->cpu0 = thread_cpu(ts)) >= 0) f->cpu_src = 1;
    if (f->cpu_src && g_cpu_split) f->sys0 = thread_sys_ns();
    if (f->cpu_src || f->ctr_gen) f->w = w;
    tasks_frame_enter(ts, st, f);   /* readings relative to this context's task (tasks.c) */
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
    int64_t sys1 = fp->sys0 >= 0 && same_thread ? thread_sys_ns() : -1;   /* inside the counters' window */
    if (have_ctr) perf_set_read(&ts->perf, &c1);
    /* CPU time only from the clock cpu0 came from, on the thread that read it */
    if (fp->cpu_src == 2 && have_ctr && c1.running[g_ctr_taskclock]) cpu1 = (int64_t)c1.value[g_ctr_taskclock];
    else if (fp->cpu_src == 1 && same_thread) cpu1 = thread_cpu(ts);
    int64_t susp = 0;   /* asyncio: task-relative readings, time suspended, overlap with other tasks (tasks.c) */
    int overlapped = tasks_frame_exit(ts, st, fp, have_ctr ? &c1 : NULL, &cpu1, &susp);
    if (overlapped) cpu1 = -1, have_ctr = 0;
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
    if (cpu >= 0) {
        /* the reads' own cost inside the CPU window (calibrate()) is not the stage's; a call on one thread
         * cannot use more CPU than its wall time */
        cpu -= g_cpu_bias[f.cpu_src];
        if (cpu < 0 && g_cpu_clamp) cpu = 0;
        if (cpu > wall && g_cpu_clamp) cpu = wall;
        if (f.cpu_src == 2 && have_ctr && cval[g_ctr_taskclock] >= 0) cval[g_ctr_taskclock] = (double)cpu;
    }
    /* system time: not across a suspension (other tasks' kernel time would be in it) */
    int64_t sys = cpu >= 0 && sys1 >= 0 && f.sys0 >= 0 && susp == 0 ? sys1 - f.sys0 : -1;
    if (sys > cpu) sys = cpu;
    double w = f.w;
    if (i > 0) {
        Frame *p = &st->frames[i - 1];
        p->child_wall += wall;
        p->child_susp += susp;
        if (w != 1.0) p->child_est = 1;
        if (cpu >= 0) p->child_cpu += (int64_t)((double)cpu * w + 0.5);
        if (sys >= 0) p->child_sys += (int64_t)((double)sys * w + 0.5);
        if (have_ctr && p->ctr_gen == f.ctr_gen)
            for (int k = 0; k < g_ctr_n; k++) if (cval[k] >= 0) p->child_c[k] += cval[k] * w;
    }
    /* calls the budget left unread stand for what they would have read: the same checks as a read call */
    int stand_in = f.skipped && same_thread && !overlapped;
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
                s->cpu_reads++;
                s->cpu_wsum += w;
                s->cpu_wall_w += (double)wall * w;
                s->cpu_cov_wall += wall;
                s->cpu_total += (int64_t)((double)cpu * w + 0.5);
                int64_t self_cpu = cpu - f.child_cpu;
                if (self_cpu < 0 && !f.child_est) self_cpu = 0;   /* estimates of children may exceed it */
                s->cpu_self += (int64_t)((double)self_cpu * w + (self_cpu < 0 ? -0.5 : 0.5));
                if (sys >= 0) {
                    int64_t self_sys = sys - f.child_sys;
                    if (self_sys < 0 && !f.child_est) self_sys = 0;
                    s->sys_reads++;
                    s->sys_total += (int64_t)((double)sys * w + 0.5);
                    s->sys_self += (int64_t)((double)self_sys * w + (self_sys < 0 ? -0.5 : 0.5));
                    s->sys_cpu_total += (int64_t)((double)cpu * w + 0.5);
                    s->sys_cpu_self += (int64_t)((double)self_cpu * w + (self_cpu < 0 ? -0.5 : 0.5));
                }
            } else if (stand_in && ((g_ctr_taskclock >= 0 && ts->perf_gen == g_ctr_gen && ts->perf.fd[g_ctr_taskclock] >= 0)
                                    || g_cpu_clock)) {
                s->cpu_calls++;
                s->cpu_cov_wall += wall;
            }
            if (hist_add(&s->h, wall > 0 ? (uint64_t)wall : 0) < 0) g_internal++;
            tasks_record(s, &f, susp, overlapped);
            if (have_ctr && (s->ctr || (s->ctr = calloc(PERF_MAX_EVENTS, sizeof(CounterStat))))) {
                for (int k = 0; k < g_ctr_n; k++) {
                    if (cval[k] < 0) continue;
                    CounterStat *c = &s->ctr[k];
                    c->total += cval[k] * w;
                    double self_c = cval[k] - f.child_c[k];
                    if (self_c < 0 && !f.child_est) self_c = 0;
                    c->self += self_c * w;
                    c->enabled += cen[k];
                    c->running += crun[k];
                    c->counted++;
                    c->covered++;
                    c->wsum += w;
                    c->scaled += crun[k] != cen[k];
                }
            } else if (stand_in && g_ctr_n && ts->perf_gen == g_ctr_gen
                       && (s->ctr || (s->ctr = calloc(PERF_MAX_EVENTS, sizeof(CounterStat))))) {
                for (int k = 0; k < g_ctr_n; k++) if (ts->perf.fd[k] >= 0) s->ctr[k].covered++;
            }
            if (g_ring_cap) trace_add(f.node, (uint32_t)ts->native_id, f.t0, wall, cpu >= 0 ? f.cpu0 : -1, cpu);
        } else {
            g_internal++;
        }
    }
    if (st->xm) xm_exit(st, &f, wall, ts);   /* exemplars: self time into the open root call (exemplars.c) */
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
    if (i == 0 && g_root_exit_hook) root_exit_notify();   /* rootexit.c: an outermost call is complete */
}

/* ----------------------------------------------------------- Stage methods */

int check_name(PyObject *name) {
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

PyObject *stage_new_named(PyObject *name) { return stage_new(name, NULL, 0); }

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

PyTypeObject Stage_Type = {
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

PyTypeObject Region_Type = {
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

int types_init(void) {
    if (stage_type_ready() < 0 || PyType_Ready(&Region_Type) < 0 || PyType_Ready(&Stack_Type) < 0) return -1;
    g_stack_var = PyContextVar_New("instrument_stack", NULL);
    return g_stack_var ? 0 : -1;
}

/* ------------------------------------------------ the innermost open stage */

int32_t current_node(void) {
    PyObject *val;
    if (PyContextVar_Get(g_stack_var, NULL, &val) < 0) { PyErr_Clear(); return 0; }
    if (!val) return 0;
    Stack *st = (Stack *)val;
    Py_DECREF(val);   /* the context keeps it alive */
    return st->depth ? st->frames[st->depth - 1].node : stack_base(st);
}

/* ------------------------------------------------------------ calibration */

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int64_t median_i64(int64_t *v, int n) {
    qsort(v, (size_t)n, sizeof(int64_t), cmp_i64);
    return v[n / 2];
}

/* Measures, on the calling thread, what the configuration in force costs, the way stage_enter/exit spend it:
 * the reads of one call (both boundaries), the part of them inside the CPU window (the bias subtracted from
 * each call's CPU time), and a stage call without reads.  Sets g_read_cost and g_cpu_bias.  The calibration
 * stage runs with integrations, NVTX, exemplars and the trace ring off, into slots of its own that are freed;
 * it is only timed when no stage is open in the calling context (else base_ns is None). */
PyObject *stage_calibrate(int n) {
    if (n < 9) n = 9;
    ThreadState *ts = ts_get();
    if (!ts) return NULL;
    int64_t *v = malloc(sizeof(int64_t) * (size_t)n);
    if (!v) return PyErr_NoMemory();
    if (g_ctr_n) counters_ready(ts);
    int ctr = g_ctr_n && ts->perf_gen == g_ctr_gen;
    perf_reading r0, r1;
    int src = 0;
    if (ctr && g_ctr_taskclock >= 0) {
        perf_set_read(&ts->perf, &r0);
        if (r0.running[g_ctr_taskclock]) src = 2;
    }
    /* the thread CPU clock without a system call, where the kernel offers it and it agrees with the clock */
    g_cpu_fast = 0;
    if (ts->clk_state == 0) ts->clk_state = perf_clock_open(&ts->clk) == 0 ? 1 : -1;
    if (ts->clk_state == 1) {
        int64_t a = perf_clock_read(&ts->clk), b = thread_cpu_ns(), x = 0;
        for (int64_t end = b + 2000000; thread_cpu_ns() < end;) x++;   /* 2 ms of this thread's CPU */
        int64_t da = perf_clock_read(&ts->clk) - a, db = thread_cpu_ns() - b;
        g_cpu_fast = a >= 0 && da > 0 && db > 0 && (double)llabs(da - db) <= 0.02 * (double)db;
        (void)x;
    }
    if (!src && g_cpu_clock && thread_cpu(ts) >= 0) src = 1;
    int split = src && g_cpu_split;
    int64_t read_ns = 0, bias = 0, sys_ok = split ? thread_sys_ns() >= 0 : 0;
    if (ctr || src) {
        for (int pass = 0; pass < 2; pass++) {
            for (int k = 0; k < n; k++) {
                int64_t a = now_ns(), c0 = -1, c1 = -1;
                if (ctr) perf_set_read(&ts->perf, &r0);          /* stage_enter's reads, in its order */
                if (src == 2) c0 = (int64_t)r0.value[g_ctr_taskclock];
                else if (src == 1) c0 = thread_cpu(ts);
                if (split) (void)thread_sys_ns();
                int64_t t0 = now_ns(), t1 = now_ns();
                if (split) (void)thread_sys_ns();                /* stage_exit's */
                if (ctr) perf_set_read(&ts->perf, &r1);
                if (src == 2) c1 = (int64_t)r1.value[g_ctr_taskclock];
                else if (src == 1) c1 = thread_cpu(ts);
                int64_t b = now_ns();
                v[k] = pass == 0 ? (b - a) - (t1 - t0) : (src ? (c1 - c0) - (t1 - t0) : 0);
            }
            if (pass == 0) read_ns = median_i64(v, n); else bias = median_i64(v, n);
        }
    }
    if (bias < 0) bias = 0;
    g_read_cost = (double)read_ns;
    g_cpu_bias[0] = 0;
    g_cpu_bias[1] = src == 1 ? bias : 0;
    g_cpu_bias[2] = src == 2 ? bias : 0;

    /* a stage call without reads */
    PyObject *base = Py_None;
    Py_INCREF(base);
    Stack *st = stack_current(1);
    if (!st) { free(v); Py_DECREF(base); return NULL; }
    if (st->depth == 0 && !st->xm) {
        PyObject *name = PyUnicode_FromString("(instrument calibration)");
        Stage *cal = name ? (Stage *)stage_new(name, NULL, 0) : NULL;
        Py_XDECREF(name);
        if (!cal || node_uncounted(stack_base(st), cal->name) < 0) {   /* not one of the user's max_stages */
            Py_XDECREF(cal);
            free(v);
            Py_DECREF(base);
            return cal ? PyErr_NoMemory() : NULL;
        }
        int enabled = g_enabled, nvtx = g_nvtx, ctr_n = g_ctr_n, cpu_clock = g_cpu_clock, cpu_split = g_cpu_split;
        int32_t xm_k = g_xm_k;
        size_t ring = g_ring_cap;
        PyObject *he = g_hook_enter, *hx = g_hook_exit, *re = g_root_exit_hook;
        StatsArray saved = ts->stats;
        ts->stats.v = NULL;
        ts->stats.n = 0;
        g_enabled = 1, g_nvtx = 0, g_ctr_n = 0, g_cpu_clock = 0, g_cpu_split = 0, g_xm_k = 0, g_ring_cap = 0;
        g_hook_enter = g_hook_exit = g_root_exit_hook = NULL;
        const int batch = 32;
        for (int k = 0; k < n; k++) {
            int64_t a = now_ns();
            for (int j = 0; j < batch; j++) {
                stage_enter(cal);
                stage_exit(cal, 0);
            }
            v[k] = now_ns() - a;
        }
        int64_t empty = now_ns();
        empty = now_ns() - empty;   /* the clock read that closes each batch */
        double cost = (double)(median_i64(v, n) - empty) / batch;
        /* the bias as the real enter/exit spend it (the frame's bookkeeping between the reads and the wall
         * clock is in the CPU window too): CPU less wall time of empty calls read on every call */
        g_ctr_n = ctr_n, g_cpu_clock = cpu_clock, g_cpu_split = cpu_split;
        if (src) {
            double budget = g_budget;
            int64_t b1 = g_cpu_bias[1], b2 = g_cpu_bias[2];
            g_budget = 0, g_cpu_bias[1] = g_cpu_bias[2] = 0, g_cpu_clamp = 0;
            int32_t node = node_find(stack_base(st), cal->name);
            int m = 0;
            for (int k = 0; k < n; k++) {
                NodeStats *cs = node >= 0 ? stats_get(&ts->stats, node) : NULL;
                int64_t c0 = cs ? cs->cpu_total : 0, w0 = cs ? cs->wall_total : 0;
                uint64_t r0 = cs ? cs->cpu_reads : 0;
                stage_enter(cal);
                stage_exit(cal, 0);
                if (node < 0 || !(cs = stats_get(&ts->stats, node)) || cs->cpu_reads != r0 + 1) continue;
                v[m++] = (cs->cpu_total - c0) - (cs->wall_total - w0);
            }
            g_budget = budget, g_cpu_clamp = 1;
            if (m >= 5) {
                bias = median_i64(v, m);
                if (bias < 0) bias = 0;
                b1 = src == 1 ? bias : 0;
                b2 = src == 2 ? bias : 0;
            }
            g_cpu_bias[1] = b1, g_cpu_bias[2] = b2;
        }
        g_enabled = enabled, g_nvtx = nvtx, g_ctr_n = ctr_n, g_cpu_clock = cpu_clock, g_cpu_split = cpu_split;
        g_xm_k = xm_k, g_ring_cap = ring;
        g_hook_enter = he, g_hook_exit = hx, g_root_exit_hook = re;
        stats_array_clear(&ts->stats);
        ts->stats = saved;
        Py_DECREF(cal);
        Py_DECREF(base);
        base = PyFloat_FromDouble(cost);
        if (!base) { free(v); return NULL; }
    }
    free(v);
    static const char *names[3] = {"none", "thread-clock", "task-clock"};
    return Py_BuildValue("{s:d,s:N,s:L,s:s,s:O,s:s}", "read_ns", (double)read_ns, "base_ns", base, "cpu_bias_ns",
                         (long long)bias, "cpu_source", names[src], "sys", sys_ok ? Py_True : Py_False, "thread_clock",
                         g_cpu_fast ? "perf mmap page (cap_user_time)" : ts->clk_state == 1 ?
                         "clock_gettime (the mmap page disagreed with it)" : "clock_gettime (no cap_user_time)");
}
