/* Stage enter and exit: the frame pushed and popped on the context's stack, the
 * counter and CPU-clock reads (on the calls the overhead budget reads), the
 * integrations' hooks and NVTX ranges; a closed call goes to record.c. */
#include "enter_exit.h"   /* first: Python.h sets the feature macros */

#include <string.h>

#include "exemplars.h"
#include "gil.h"
#include "memory.h"
#include "nvtx_emit.h"
#include "record.h"
#include "rootexit.h"
#include "stack.h"
#include "stats.h"
#include "taskclock.h"

#define MIN_READ_CHANCE (1.0 / 65536)
#define FIRST_FRAMES 3   /* a stack's first frames: 3 nested stages in one block of Python's small-object allocator */
_Static_assert(FIRST_FRAMES * sizeof(Frame) <= 512, "a stack's first frames fit one small-object block");
#define FIRST_READS 8   /* a stage's first calls on a thread are read: its estimates start from them */

static PyObject *g_get_running_loop = NULL;  /* asyncio.events._get_running_loop, once asyncio is imported */
static PyObject *g_asyncio_events = NULL;    /* "asyncio.events", interned: a dict lookup without a new string */
static uint64_t g_frame_seq = 0;

/* Inside a running asyncio loop a stage may be closed after other tasks have
 * opened theirs on the same thread: a start/end range survives that, a push/pop
 * one would corrupt the thread's range stack. */
static int in_event_loop(void) {
    if (!g_get_running_loop) {
        if (!g_asyncio_events && !(g_asyncio_events = PyUnicode_InternFromString("asyncio.events"))) {
            PyErr_Clear();
            return 0;
        }
        PyObject *ev = PyDict_GetItemWithError(PyImport_GetModuleDict(), g_asyncio_events);   /* borrowed */
        if (!ev) { PyErr_Clear(); return 0; }
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

int counters_ready(ThreadState *ts) {
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

/* Whether this call of `node` is read under the overhead budget; *w: the weight of its readings (1 / its chance).
 * A stage's first calls on a thread are read, so that a stage with few calls has its figures from several.
 * The chance is the budget's share of the stage's mean CPU time per call so far (of its running wall time where
 * no CPU time is measured) over what one call's reads cost: the reads are judged against what the stage spends on
 * a CPU, so a stage that mostly awaits or is preempted is not read more for it.  Calls entered before any of the
 * first ones finished (many tasks in the same stage at once) are read with a chance of FIRST_READS / the calls
 * entered so far: a few dozen reads of 10,000 concurrent calls, until finished calls tell their CPU time. */
static inline int budget_read(ThreadState *ts, int32_t node, double *w) {
    *w = 1.0;
    double cost = read_cost();
    if (g_budget <= 0 || cost <= 0) return 1;
    NodeStats *s = stats_get(&ts->stats, node);
    if (!s) return 1;
    if (!s->cpu0_set) stats_mark_start(s, 0);   /* the CPU clock before the node's first call here */
    if (++s->entered <= FIRST_READS) return 1;
    double p = s->covered < FIRST_READS || !s->reads ? (double)FIRST_READS / (double)s->entered
                                                   : g_budget * stats_mean_cpu(s) / cost;
    if (p >= 1.0) return 1;                               /* long enough for a read on every call */
    if (p < MIN_READ_CHANCE) p = MIN_READ_CHANCE;
    if (ts_uniform(ts) >= p) return 0;
    *w = 1.0 / p;
    return 1;
}

/* ------------------------------------------------------------------ enter */

static Frame *frame_push(Stack *st, ThreadState *ts, Stage *self, int32_t node) {
    if (st->depth == st->cap) {   /* Python's small-object allocator (under the GIL): a task's first frames are one
                                   * block of it */
        int32_t ncap = st->cap ? st->cap * 2 : FIRST_FRAMES;
        Frame *nf = PyMem_Realloc(st->frames, (size_t)ncap * sizeof(Frame));
        if (!nf) return NULL;
        st->frames = nf;
        st->cap = ncap;
    }
    Frame *f = &st->frames[st->depth++];
    g_open_frames++;
    if (__builtin_expect(g_gil_idle, 0)) gil_wake();
    Py_INCREF(self);
    f->stage = self;
    f->ts_serial = ts->serial;
    f->node = node;
    f->epoch = g_epoch;
    f->seq = ++g_frame_seq;
    f->child_wall = 0;
    f->hook = NULL;
    f->nvtx = 0;
    f->skipped = 0;
    f->w = 0;
    f->rd = NULL;
    f->mem = -1;
    /* what a call closed by Python code run during its enter (a hook, a memory source: each sets t0 first) is
     * recorded with: nothing attributable, the stack's clock as it stands */
    f->taint0 = ~(uint64_t)0;
    f->susp0 = st->tt.s_wall, f->loop0 = st->tt.s_loop;
    f->child_susp = f->child_loop = 0;
    return f;
}

/* Our frame after Python code ran (a hook may enter, exit or grow the stack). */
static Frame *frame_by_seq(Stack *st, uint64_t seq) {
    for (int32_t j = st->depth - 1; j >= 0; j--)
        if (st->frames[j].seq == seq) return &st->frames[j];
    return NULL;
}

/* The integrations' enter hook (Python); our frame afterwards, NULL when the hook closed it. */
static Frame *call_enter_hook(Stack *st, Frame *f, Stage *self) {
    uint64_t seq = f->seq;
    f->t0 = now_ns();   /* a call the hook itself closes has this start */
    PyObject *h = PyObject_CallOneArg(g_hook_enter, self->name);
    if (!h) internal_failure("integration enter hook");
    if (!(f = frame_by_seq(st, seq))) { Py_XDECREF(h); return NULL; }
    f->hook = h;
    return f;
}

/* The frame's memory slot (memory.h); the frame afterwards (a source's Python code may enter stages and move the
 * frames), NULL when it is gone. */
static Frame *mem_open(Stack *st, Frame *f) {
    uint64_t seq = f->seq;
    uint32_t serial = 0;
    int32_t slot = mem_enter(st, &serial);
    if ((f = frame_by_seq(st, seq))) f->mem = slot, f->mem_serial = serial;
    else if (slot >= 0) { MemCall unused; mem_exit(slot, serial, st, 0, &unused); }
    return f;
}

void stage_enter(Stage *self) {
    if (!g_enabled) return;
    ThreadState *ts = ts_get();
    Stack *st = ts ? stack_current(1) : NULL;
    if (!st) { internal_failure("stage enter"); return; }
    int loop = g_nvtx && nvtx_emit_active() ? in_event_loop() : 0;   /* may run Python: before any frame pointer */
    if (g_mem_n) mem_note_owner(st->owner);
    int32_t node = node_child(stack_top_node(st), self->name);
    Frame *f = node >= 0 ? frame_push(st, ts, self, node) : NULL;
    if (!f) { internal_failure("stage enter"); return; }
    if (g_exemplar_k) exemplar_enter(st, f);   /* a root stage starts its call's breakdown */
    if (g_hook_enter && !(f = call_enter_hook(st, f, self))) return;
    if (g_nvtx && nvtx_emit_active()) nvtx_open(self, f, loop);
    double w;
    f->sw0 = ts_switches(ts);   /* a memory load: whether the thread leaves the CPU during the call */
    FrameRead *rd = NULL;
    if ((g_cpu_clock || g_ctr_n) && budget_read(ts, node, &w) && (rd = frame_read_get())) {   /* nothing is read
                                                                                  * without a CPU source */
        int64_t a = f->t0 = now_ns();   /* (a call the memory source's Python code closes has this start) */
        if (g_ctr_n) counters_ready(ts);
        if (g_mem_n && !(f = mem_open(st, f))) { frame_read_put(rd); return; }   /* outside the wall window */
        memset(rd->child, 0, sizeof(double) * (size_t)stats_quantities());
        f->rd = rd;
        read_boundary(ts, &rd->r0, 0);   /* r0.t after the reads: the wall window holds none of them */
        f->t0 = rd->r0.t;
        f->sw_in = ts_switches(ts);
        f->spent = f->sw_in == f->sw0 ? f->t0 - a : -1;   /* what they cost, where the thread kept the CPU */
        f->w = w;
        st->n_read++;
    } else {
        f->t0 = now_ns();
        f->skipped = 1;
    }
    taskclock_frame_enter(ts, st, f);   /* readings relative to this context's task */
}

/* ------------------------------------------------------------------- exit */

/* The readings at exit, on the thread that entered, in the reverse order of enter's, then the wall clock. */
static void read_exit(ThreadState *ts, Stack *st, const Frame *f, int same_thread, CallMeasure *m) {
    Reading r1;
    int read = f->w > 0 && same_thread;
    uint32_t sw_in = read ? ts_switches(ts) : 0;   /* before the reads: the end of the wall window */
    if (read) read_boundary(ts, &r1, 1);   /* r1.t before the reads ends the wall window */
    m->sw1 = sw_in;
    m->t1 = read ? r1.t : now_ns();
    m->overlapped = taskclock_frame_exit(ts, st, f, read ? &r1 : NULL, m);   /* task-relative, time suspended */
    m->wall = m->t1 - f->t0;
    m->switched = !same_thread || ts_switches(ts) != f->sw0;
    m->switched_in = read ? sw_in != f->sw_in : m->switched;
    m->read = read && !m->overlapped;
    m->have_ctr = 0;
    if (m->read) call_quantities(&f->rd->r0, &r1, m), m->inner = r1.tq - f->rd->r0.tq;
    m->stand_in = f->skipped && same_thread && !m->overlapped;
    m->abandoned = 0;
    m->mem.have = 0;   /* last: a source's Python code may move the frames (f is not used after) */
    if (f->mem >= 0) mem_exit(f->mem, f->mem_serial, st, read, &m->mem);
    m->mem.overlapped |= m->overlapped != 0;   /* its task shared the thread with others: the gauges are theirs too */
}

static int32_t frame_index(const Stack *st, const Stage *self) {
    int32_t i = st->depth - 1;
    while (i >= 0 && st->frames[i].stage != self) i--;
    return i;
}

/* A stage closed early with an outer one: its own exit, when it comes, is expected (and ignored). */
static void remember_early(Stack *st, Stage *s) {
    if (st->n_early == STACK_EARLY) {   /* the oldest is forgotten: its exit would count as unmatched */
        Py_DECREF(st->early[0]);
        memmove(&st->early[0], &st->early[1], (STACK_EARLY - 1) * sizeof(Stage *));
        st->n_early--;
    }
    Py_INCREF(s);
    st->early[st->n_early++] = s;
}

static int forget_early(Stack *st, const Stage *s) {
    for (int32_t k = st->n_early - 1; k >= 0; k--) {
        if (st->early[k] != s) continue;
        Py_DECREF(st->early[k]);
        memmove(&st->early[k], &st->early[k + 1], (size_t)(st->n_early - k - 1) * sizeof(Stage *));
        st->n_early--;
        return 1;
    }
    return 0;
}

static void exit_integrations(Frame *f, int same_thread) {
    if (f->hook) {
        if (g_hook_exit) {
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            PyObject *r = PyObject_CallOneArg(g_hook_exit, f->hook);
            if (!r) internal_failure("integration exit hook"); else Py_DECREF(r);
            PyErr_Restore(et, ev, tb);
        }
        Py_DECREF(f->hook);
    }
    if (f->nvtx == 2) nvtx_emit_end(f->nvtx_id);
    else if (f->nvtx == 1 && same_thread) nvtx_emit_pop();   /* a pop on another thread would close its range */
}

/* Closes the innermost frame of the stack: its readings, its record, its exemplar part, its integrations. */
static void close_top(Stack *st, int error) {
    int32_t i = st->depth - 1;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);   /* a Region exit carries the function's exception */
    ThreadState *ts = ts_get();   /* a thread given another's context may not have its own slots yet */
    if (!ts) PyErr_Clear();
    PyErr_Restore(et, ev, tb);
    int same_thread = ts && st->frames[i].ts_serial == ts->serial;
    if (g_mem_n) mem_note_owner(st->owner);
    CallMeasure m;
    uint64_t seq = st->frames[i].seq;
    read_exit(ts, st, &st->frames[i], same_thread, &m);
    for (i = st->depth - 1; i >= 0 && st->frames[i].seq != seq; i--) {}   /* a memory source's Python code may
                                                                          * have closed it, or opened stages */
    if (i < 0) return;   /* closed meanwhile, and recorded there */
    m.error = error;
    Frame f = st->frames[i];
    memmove(&st->frames[i], &st->frames[i + 1], (size_t)(st->depth - 1 - i) * sizeof(Frame));
    st->depth--;
    g_open_frames--;
    if (f.w > 0) st->n_read--;
    if (!same_thread) {
        g_cross_thread++;
        warn_once("thread", "instrument: stage '%U' was exited on another thread than it was entered on; its CPU "
                  "time is not recorded for that call", f.stage->name);
    }
    record_call(ts, &f, i > 0 ? &st->frames[i - 1] : NULL, &m);
    if (m.read && f.spent >= 0 && ts_switches(ts) == m.sw1) read_cost_add(f.spent + now_ns() - m.t1);
    if (st->exemplar) exemplar_exit(st, &f, &m, ts);   /* its part of the open root call */
    exit_integrations(&f, same_thread);
    frame_read_put(f.rd);
    Py_DECREF(f.stage);
    if (i == 0 && g_root_exit_hook) root_exit_notify();   /* an outermost call is complete */
    if (i == 0 && g_probe_hook && m.t1 >= g_probe_due) probe_notify();
}

void stage_exit(Stage *self, int error) {
    Stack *st = stack_current(0);
    int32_t i = st ? frame_index(st, self) : -1;
    if (i < 0) {
        if (!g_enabled || (st && forget_early(st, self))) return;   /* entered while disabled; closed early */
        g_unmatched++;
        warn_once("unmatched", "instrument: stage '%U' exited on a different thread or task than it was entered "
                  "on (or exited twice); that call is not recorded", self->name);
        return;
    }
    if (i != st->depth - 1) {   /* inner stages still open: they close with this one, so none outlives it */
        g_out_of_order++;
        warn_once("order", "instrument: stage '%U' exited while an inner stage was still open; the inner stages "
                  "are closed with it (their own exits later are ignored)", self->name);
        do {   /* the hooks of a closing frame may run Python: the stack is looked at again each time */
            remember_early(st, (Stage *)st->frames[st->depth - 1].stage);
            close_top(st, error);
        } while ((i = frame_index(st, self)) >= 0 && i != st->depth - 1);
        if (i < 0) return;
    }
    close_top(st, error);
}
