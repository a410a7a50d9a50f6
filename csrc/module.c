/* The module: its functions (stage, configure, configuration, calibrate,
 * set_counters, set_hooks, collect, reset, after_fork_child, now_ns, thread_cpu_ns, hist_index,
 * current_path, add, set_root_exit_hook) and its init, which also adds the NVTX
 * functions (nvtx_emit.c), CounterGroup (perf.c) and the asyncio runners
 * (steps.c). */
#include "core.h"   /* first: Python.h sets the feature macros */

#include <string.h>

#include "enter_exit.h"
#include "exemplars.h"
#include "gil.h"
#include "memory.h"
#include "hist.h"
#include "items.h"
#include "nodes.h"
#include "nvtx_emit.h"
#include "rootexit.h"
#include "sigwake.h"
#include "stack.h"
#include "stage.h"
#include "stats.h"
#include "steps.h"
#include "taskclock.h"
#include "threads.h"

static PyObject *g_stage_cache = NULL;   /* name -> Stage */

/* ------------------------------------------------------------ stage, add */

static PyObject *mod_stage(PyObject *m, PyObject *name) {
    PyObject *s = PyDict_GetItemWithError(g_stage_cache, name);   /* borrowed */
    if (s) { Py_INCREF(s); return s; }
    if (PyErr_Occurred()) {
        /* unhashable name: report it the way a bad name is reported */
        PyErr_Clear();
        check_name(name);
        return NULL;
    }
    s = stage_new(name, NULL, 0);
    if (!s) return NULL;
    if (PyDict_GET_SIZE(g_stage_cache) < 100000 && PyDict_SetItem(g_stage_cache, ((Stage *)s)->name, s) < 0) PyErr_Clear();
    return s;
}

/* add(name, value=1): items of the innermost open stage of this context (node 0 outside any stage). */
static PyObject *mod_add(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *name;
    int64_t n;
    double x;
    int is_float;
    if (items_parse(args, nargs, kwnames, &name, &n, &x, &is_float) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_MemoryError)) return NULL;   /* a bad argument raises at the call site */
        internal_failure("add");
        Py_RETURN_NONE;
    }
    if (g_enabled) {
        ThreadState *ts = ts_get();
        NodeStats *s = ts ? stats_get(&ts->stats, current_node()) : NULL;
        if (!s || items_add(s, name, n, x, is_float) < 0) internal_failure("add");
    }
    Py_DECREF(name);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------ configure */

/* The hot-path options (config.py marks them `hot`): each validates its value (apply 0) or applies it (apply 1);
 * 0, or -1 with an exception naming the option and what is allowed. */
typedef int (*OptionSet)(PyObject *v, int apply);

static int set_flag(PyObject *v, int apply, int *target, const char *name) {
    int b = PyObject_IsTrue(v);
    if (b < 0) return -1;
    if (apply) *target = b;
    (void)name;
    return 0;
}

static int long_in(PyObject *v, long lo, long hi, const char *name, long *out) {
    long x = PyLong_Check(v) && !PyBool_Check(v) ? PyLong_AsLong(v) : -1;
    if (PyErr_Occurred() || !PyLong_Check(v) || PyBool_Check(v) || x < lo || x > hi) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be an integer from %ld to %ld, got %R", name, lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

static int opt_enabled(PyObject *v, int apply) { return set_flag(v, apply, &g_enabled, "enabled"); }
static int opt_cpu_clock(PyObject *v, int apply) { return set_flag(v, apply, &g_cpu_clock, "cpu_clock"); }
static int opt_cpu_split(PyObject *v, int apply) { return set_flag(v, apply, &g_cpu_split, "cpu_split"); }
static int opt_run_queue(PyObject *v, int apply) { return set_flag(v, apply, &g_run_queue, "run_queue"); }
static int opt_helper_cpu(PyObject *v, int apply) { return set_flag(v, apply, &g_helper_cpu, "helper_cpu"); }

/* The GIL sampler (gil.h): learning where the GIL lies happens on the first configure that turns it on. */
static int opt_gil_wait(PyObject *v, int apply) {
    int on;
    if (set_flag(v, 1, &on, "gil_wait") < 0) return -1;
    if (apply) gil_enable(on);
    return 0;
}

static int opt_memory(PyObject *v, int apply) { return mem_configure(v, apply); }

static int opt_nvtx(PyObject *v, int apply) {
    int on;
    if (set_flag(v, 1, &on, "nvtx") < 0) return -1;
    if (apply) g_nvtx = on && nvtx_emit_available();
    return 0;
}

static int opt_max_stages(PyObject *v, int apply) {
    long x;
    if (long_in(v, 1, 10000000, "max_stages", &x) < 0) return -1;
    if (apply) g_max_nodes = (int32_t)x;
    return 0;
}

static int opt_trace_events(PyObject *v, int apply) {
    long x;
    if (long_in(v, 0, 100000000, "trace_events", &x) < 0) return -1;
    if (apply && (size_t)x != g_ring_cap && trace_resize((size_t)x) < 0) { PyErr_NoMemory(); return -1; }
    return 0;
}

static int opt_exemplars(PyObject *v, int apply) {
    long x;
    if (long_in(v, 0, EXEMPLAR_MAX_K, "exemplars", &x) < 0) return -1;
    if (apply) exemplar_set_k((int32_t)x);
    return 0;
}

/* None reads every call (0 here) */
static int opt_overhead_budget(PyObject *v, int apply) {
    double x = v == Py_None ? 0.0 : PyFloat_AsDouble(v);
    if ((x == -1.0 && PyErr_Occurred()) || PyBool_Check(v) || !(x >= 0 && x <= 1)) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "overhead_budget must be None (read every call) or a number from 0 to 1, "
                     "got %R", v);
        return -1;
    }
    if (apply) g_budget = x;
    return 0;
}

static const struct { const char *name; OptionSet set; } OPTIONS[] = {
    {"enabled", opt_enabled}, {"cpu_clock", opt_cpu_clock}, {"cpu_split", opt_cpu_split}, {"nvtx", opt_nvtx},
    {"max_stages", opt_max_stages}, {"trace_events", opt_trace_events}, {"exemplars", opt_exemplars},
    {"overhead_budget", opt_overhead_budget}, {"run_queue", opt_run_queue}, {"helper_cpu", opt_helper_cpu},
    {"gil_wait", opt_gil_wait}, {"memory", opt_memory},
};
#define N_OPTIONS ((int)(sizeof(OPTIONS) / sizeof(OPTIONS[0])))

static OptionSet option_setter(PyObject *key) {
    for (int k = 0; k < N_OPTIONS; k++)
        if (PyUnicode_Check(key) && PyUnicode_CompareWithASCIIString(key, OPTIONS[k].name) == 0) return OPTIONS[k].set;
    return NULL;
}

/* configure(**options): every value checked before any is applied. */
static PyObject *mod_configure(PyObject *m, PyObject *args, PyObject *kw) {
    if (args && PyTuple_GET_SIZE(args)) return PyErr_Format(PyExc_TypeError, "configure() takes keyword arguments only");
    for (int apply = 0; kw && apply < 2; apply++) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(kw, &pos, &key, &value)) {
            OptionSet set = option_setter(key);
            if (!set) {
                PyObject *names = PyUnicode_FromString("");
                for (int k = 0; names && k < N_OPTIONS; k++)
                    Py_SETREF(names, PyUnicode_FromFormat("%U%s%s", names, k ? ", " : "", OPTIONS[k].name));
                if (names) PyErr_Format(PyExc_TypeError, "configure() got an unknown option %R; the hot-path options "
                                        "are: %U", key, names);
                Py_XDECREF(names);
                return NULL;
            }
            if (set(value, apply) < 0) return NULL;
        }
    }
    Py_RETURN_NONE;
}

/* configuration(): the hot-path options in force, as configure() takes them. */
static PyObject *mod_configuration(PyObject *m, PyObject *unused) {
    return Py_BuildValue("{s:O,s:O,s:O,s:O,s:i,s:n,s:i,s:N,s:O,s:O,s:O}", "enabled", g_enabled ? Py_True : Py_False,
                         "cpu_clock", g_cpu_clock ? Py_True : Py_False, "cpu_split", g_cpu_split ? Py_True : Py_False,
                         "nvtx", g_nvtx ? Py_True : Py_False, "max_stages", (int)g_max_nodes,
                         "trace_events", (Py_ssize_t)g_ring_cap, "exemplars", (int)g_exemplar_k, "overhead_budget",
                         g_budget > 0 ? PyFloat_FromDouble(g_budget) : Py_NewRef(Py_None),
                         "run_queue", g_run_queue ? Py_True : Py_False, "helper_cpu", g_helper_cpu ? Py_True : Py_False,
                         "gil_wait", g_gil ? Py_True : Py_False);
}

static PyObject *mod_gil_status(PyObject *m, PyObject *unused) { return gil_status(); }
static PyObject *mod_memory_status(PyObject *m, PyObject *unused) { return mem_status(); }
static PyObject *mod_memory_reset_seen(PyObject *m, PyObject *names) {
    if (mem_reset_seen(names) < 0) return NULL;
    Py_RETURN_NONE;
}

/* The sums of the old events dropped, and room made for n new ones. */
static void forget_counters(StatsArray *a, int n) {
    for (int32_t i = 0; i < a->n; i++) {
        NodeStats *s = a->v[i];
        if (!s) continue;
        free(s->ctr);
        s->ctr = NULL;
        s->n_ctr = 0;
        if (!s->reads) continue;
        if (stats_reserve(s, Q_CTR + n) < 0) { g_internal++; continue; }
        memset(&s->reads[Q_CTR], 0, (size_t)(s->n_q - Q_CTR) * sizeof(uint64_t));
        for (int b = 0; b < STRATA; b++) {
            CellPair *c = s->cells[b] || s->un[b] ? stats_cells(s, b) : NULL;
            if (!c) { g_internal += s->un[b] != 0; continue; }
            for (int q = Q_CTR; q < s->n_q; q++) {   /* the calls left unread so far are none of the new events' */
                memset(&c[q], 0, sizeof(CellPair));
                c[q].tot.un = c[q].own.un = -s->un[b];
                c[q].tot.uw = -s->uw[b], c[q].own.uw = -s->uws[b];
            }
        }
    }
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
    for (ThreadState *ts = g_threads; ts; ts = ts->next) forget_counters(&ts->stats, (int)n);
    forget_counters(&g_retired, (int)n);
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

/* --------------------------------------------------------------- collect */

/* Appends a new reference to a list; -1 (and the reference dropped) on failure. */
static int append_new(PyObject *l, PyObject *item) {
    if (!item) return -1;
    int r = PyList_Append(l, item);
    Py_DECREF(item);
    return r;
}

static PyObject *hist_to_list(const hist *h) {
    PyObject *l = PyList_New(0);
    for (int b = 0; l && b < HIST_BLOCKS; b++) {
        const uint64_t *blk = hist_block_of(h, b);
        if (!blk) continue;
        for (int s = 0; s < HIST_SUB; s++) {
            uint64_t c = blk[s];
            if (c && append_new(l, Py_BuildValue("(iK)", (b << HIST_SUB_BITS) | s, (unsigned long long)c)) < 0) {
                Py_CLEAR(l);
                break;
            }
        }
    }
    return l;
}

/* An estimate's row (an _EstimateRow in _native.pyi); None when nothing measured it. */
static PyObject *estimate_row(const NodeStats *s, int q) {
    if (!stats_reads(s, q)) Py_RETURN_NONE;
    double total, self, var, var_self;
    stats_estimate(s, q, &total, &self, &var, &var_self);
    return Py_BuildValue("{s:d,s:d,s:d,s:d,s:K}", "total", total, "self", self, "var", var, "var_self", var_self,
                         "reads", (unsigned long long)stats_reads(s, q));
}

static PyObject *counters_to_list(const NodeStats *s) {
    PyObject *l = PyList_New(0);
    for (int k = 0; l && k < g_ctr_n; k++) {
        PyObject *e = estimate_row(s, Q_CTR + k);
        if (e && e != Py_None && k < s->n_ctr) {
            const CounterStat *c = &s->ctr[k];
            PyObject *mux = Py_BuildValue("{s:K,s:K,s:K}", "enabled", (unsigned long long)c->enabled,
                                          "running", (unsigned long long)c->running, "scaled", (unsigned long long)c->scaled);
            if (!mux || PyDict_Update(e, mux) < 0) Py_CLEAR(e);
            Py_XDECREF(mux);
        }
        if (append_new(l, e) < 0) Py_CLEAR(l);
    }
    return l;
}

static PyObject *estimates(const NodeStats *s) {
    static const char *names[Q_SCALARS] = {"cpu", "sys", "vcsw", "ivcsw", "runqueue", "helpers", "off_samples",
                                           "gil_samples"};
    PyObject *d = PyDict_New();
    for (int q = 0; d && q < Q_SCALARS; q++) {
        PyObject *e = estimate_row(s, q);
        if (!e || PyDict_SetItemString(d, names[q], e) < 0) Py_CLEAR(d);
        Py_XDECREF(e);
    }
    return d;
}

static PyObject *blockers_to_list(const NodeStats *s) {
    PyObject *l = PyList_New(0);
    for (int32_t k = 0; l && k < s->n_blockers; k++)
        if (append_new(l, Py_BuildValue("(iLL)", s->blockers[k].node, (long long)s->blockers[k].held,
                                        (long long)s->blockers[k].waited)) < 0) Py_CLEAR(l);
    return l;
}

/* One collect() stats row (a StatsRow in _native.pyi). */
static PyObject *stats_row(int32_t id, const NodeStats *s) {
    PyObject *d = Py_BuildValue("{s:i,s:K,s:K,s:L,s:L,s:L,s:L,s:K,s:K,s:L,s:L,s:L,s:L}", "node", id,
        "calls", (unsigned long long)s->calls, "errors", (unsigned long long)s->errors,
        "wall_total", (long long)s->wall_total, "wall_self", (long long)s->wall_self,
        "wall_min", (long long)s->wall_min, "wall_max", (long long)s->wall_max,
        "overlapped", (unsigned long long)s->overlapped, "abandoned", (unsigned long long)s->abandoned,
        "susp_total", (long long)s->susp_total, "susp_self", (long long)s->susp_self,
        "loop_total", (long long)s->loop_total, "loop_self", (long long)s->loop_self);
    PyObject *more = d ? Py_BuildValue("{s:K,s:L,s:L,s:d,s:N,s:N,s:N,s:N,s:N,s:N}", "covered", (unsigned long long)s->covered,
        "cov_run", (long long)s->cov_run, "cov_run_self", (long long)s->cov_run_self, "cpu_bound", s->cpu_bound,
        "hist", hist_to_list(&s->h),
        "estimates", estimates(s), "counters", counters_to_list(s), "blockers", blockers_to_list(s),
        "items", items_to_list(s), "memory", mem_stat_list(s->mem, s->n_mem)) : NULL;
    if (!more || PyDict_Update(d, more) < 0) Py_CLEAR(d);
    Py_XDECREF(more);
    return d;
}

static PyObject *collect_nodes(void) {
    PyObject *l = PyList_New(0);
    for (int32_t id = 1; l && id < g_n_nodes; id++)
        if (append_new(l, Py_BuildValue("(iiOi)", id, g_nodes[id].parent, g_nodes[id].name, (int)g_nodes[id].other)) < 0)
            Py_CLEAR(l);
    return l;
}

static PyObject *collect_stats(const StatsArray *all) {
    PyObject *l = PyList_New(0);
    for (int32_t id = 0; l && id < all->n; id++) {
        const NodeStats *s = all->v[id];
        if (!s || (!s->calls && !s->n_items)) continue;   /* node 0: items added outside any stage */
        if (append_new(l, stats_row(id, s)) < 0) Py_CLEAR(l);
    }
    return l;
}

static PyObject *collect_events(void) {
    size_t n = g_ring_total < g_ring_cap ? (size_t)g_ring_total : g_ring_cap;
    size_t start = g_ring_total < g_ring_cap ? 0 : g_ring_next;
    PyObject *l = PyList_New(0);
    for (size_t k = 0; l && k < n; k++) {
        TraceEvent *e = &g_ring[(start + k) % g_ring_cap];
        if (append_new(l, Py_BuildValue("(iILLLL)", e->node, e->tid, (long long)e->t0, (long long)e->dur,
                                        (long long)e->cpu0, (long long)e->cpu)) < 0) Py_CLEAR(l);
    }
    return l;
}

static PyObject *collect_counter_status(void) {
    PyObject *l = PyList_New(0);
    for (int k = 0; l && k < g_ctr_n; k++)
        if (append_new(l, g_ctr_status_known ? PyLong_FromLong(g_ctr_status[k]) : Py_NewRef(Py_None)) < 0) Py_CLEAR(l);
    return l;
}

/* The parts of collect() beyond the stages: exemplars, their memory, how the counters opened, the tasks. */
static int collect_extras(PyObject *res) {
    if (PyDict_SetItemString(res, "exemplars", Py_None) < 0) return -1;
    PyObject *x = exemplar_collect();
    if (!x || PyDict_SetItemString(res, "exemplars", x) < 0) { Py_XDECREF(x); return -1; }
    Py_DECREF(x);
    x = Py_BuildValue("(nn)", (Py_ssize_t)exemplar_bytes(), (Py_ssize_t)exemplar_pool_bytes());
    if (!x || PyDict_SetItemString(res, "exemplar_bytes", x) < 0) { Py_XDECREF(x); return -1; }
    Py_DECREF(x);
    if (g_ctr_status_known) {
        x = Py_BuildValue("{s:O,s:O}", "exclude_kernel", g_ctr_excl_used ? Py_True : Py_False,
                          "rdpmc", g_ctr_rdpmc ? Py_True : Py_False);
        if (!x || PyDict_SetItemString(res, "counter_open", x) < 0) { Py_XDECREF(x); return -1; }
        Py_DECREF(x);
    }
    return taskclock_collect(res);
}

/* Everything recorded so far, merged over threads, as plain Python data (a CollectResult in _native.pyi). */
static PyObject *mod_collect(PyObject *m, PyObject *unused) {
    StatsArray all = {NULL, 0};
    int failed = stats_array_merge(&all, &g_retired, -1) < 0;
    size_t live = 0;
    for (ThreadState *ts = g_threads; ts; ts = ts->next, live++) {
        struct timespec t;   /* each thread's CPU clock now: its slots' calls took no more */
        int64_t cpu = clock_gettime(ts->cpu_clock_id, &t) == 0 ? (int64_t)t.tv_sec * 1000000000 + t.tv_nsec : -2;
        failed |= stats_array_merge(&all, &ts->stats, cpu == -2 ? INT64_MAX / 2 : cpu) < 0;
    }
    if (failed) {
        stats_array_clear(&all);
        return PyErr_NoMemory();
    }
    size_t kept = g_ring_total < g_ring_cap ? (size_t)g_ring_total : g_ring_cap;
    PyObject *res = Py_BuildValue("{s:N,s:N,s:N,s:N,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:n,s:L,s:d,s:K,s:i}",
        "counter_errno", collect_counter_status(), "nodes", collect_nodes(), "stats", collect_stats(&all),
        "events", collect_events(), "events_dropped", (unsigned long long)(g_ring_total - kept),
        "unmatched_exits", (unsigned long long)g_unmatched, "out_of_order_exits", (unsigned long long)g_out_of_order,
        "cross_thread_exits", (unsigned long long)g_cross_thread, "internal_failures", (unsigned long long)g_internal,
        "folded_calls", (unsigned long long)g_folded, "max_stages", (unsigned long long)g_max_nodes,
        "threads", (Py_ssize_t)live, "clock_ns", (long long)now_ns(),
        "read_cost_ns", read_cost(), "read_cost_calls", (unsigned long long)g_read_spent_calls,
        "helpers_over_cap", helpers_over_cap(0));
    stats_array_clear(&all);
    if (res && collect_extras(res) < 0) Py_CLEAR(res);
    return res;
}

/* ---------------------------------------------------------- reset, fork */

static void zero_all(void) {
    for (ThreadState *ts = g_threads; ts; ts = ts->next) stats_array_clear(&ts->stats);
    stats_array_clear(&g_retired);
    exemplar_reset();
    g_ring_next = 0;
    g_ring_total = 0;
    g_unmatched = g_out_of_order = g_cross_thread = g_internal = g_folded = 0;
    g_task_steps = g_task_reads = g_task_changes = g_task_overlapped = g_task_abandoned = 0;
}

static PyObject *mod_reset(PyObject *m, PyObject *unused) {
    zero_all();
    drop_nodes();
    helpers_over_cap(1);   /* the calls it spoke of are gone */
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
        if (ts->clk_state == 1) perf_clock_close(&ts->clk);
        ts->clk_state = 0;
        perf_clock_close(&ts->sw);
        if (ts == tls_ts && perf_switch_open(&ts->sw) < 0) ts->sw.page = NULL;
    }
    g_ctr_status_known = 0;
    g_epoch++;
    g_probe_due = 0;   /* a fork while another thread ran the probe would leave it never due */
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------ the rest */

static PyObject *mod_now_ns(PyObject *m, PyObject *unused) { return PyLong_FromLongLong(now_ns()); }

/* The calling thread's CPU time from the hot path's source (its task-clock where it has one: a read that does not
 * update the scheduler's accounting, so it preempts nothing).  Only differences on one thread mean anything. */
static PyObject *mod_thread_cpu_ns(PyObject *m, PyObject *unused) { return PyLong_FromLongLong(thread_cpu(tls_ts)); }

static PyObject *mod_hist_index(PyObject *m, PyObject *v) {
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    return PyLong_FromLong(hist_index(x));
}

static PyObject *mod_current_path(PyObject *m, PyObject *unused) {
    Stack *st = stack_current(0);
    int32_t node = st ? stack_top_node(st) : 0;
    PyObject *l = PyList_New(0);
    for (; l && node > 0; node = g_nodes[node].parent) {
        if (PyList_Insert(l, 0, g_nodes[node].name) < 0) Py_CLEAR(l);
    }
    if (!l) return NULL;
    PyObject *t = PyList_AsTuple(l);
    Py_DECREF(l);
    return t;
}

/* calibrate(n=200): the configuration's costs on this thread (calibrate.c), for the budget and meta.overhead. */
static PyObject *mod_calibrate(PyObject *m, PyObject *args) {
    int n = 200;
    if (!PyArg_ParseTuple(args, "|i:calibrate", &n)) return NULL;
    if (n < 1 || n > 1000000) return PyErr_Format(PyExc_ValueError, "calibrate needs 1 to 1000000 rounds, got %d", n);
    return stage_calibrate(n);
}

static PyMethodDef native_methods[] = {
    {"stage", (PyCFunction)mod_stage, METH_O, "stage(name) -> Stage, one object per name"},
    {"configure", (PyCFunction)(void (*)(void))mod_configure, METH_VARARGS | METH_KEYWORDS,
     "configure(**options): the hot-path options (those config.py marks hot)"},
    {"configuration", (PyCFunction)mod_configuration, METH_NOARGS, "the hot-path options in force"},
    {"gil_status", (PyCFunction)mod_gil_status, METH_NOARGS, "the GIL sampler: mechanism, period, its own CPU time"},
    {"memory_status", (PyCFunction)mod_memory_status, METH_NOARGS,
     "the memory sources: name, how the peak is measured, reads and their cost"},
    {"memory_reset_seen", (PyCFunction)mod_memory_reset_seen, METH_O,
     "another party resets these sources' peaks now: the open calls keep theirs, and are marked"},
    {"calibrate", (PyCFunction)mod_calibrate, METH_VARARGS, NULL},
    {"set_counters", (PyCFunction)mod_set_counters, METH_VARARGS, "set_counters(events, exclude_kernel, taskclock_index)"},
    {"set_hooks", (PyCFunction)mod_set_hooks, METH_VARARGS, "set_hooks(enter, exit): called around every stage; None, None clears"},
    {"collect", (PyCFunction)mod_collect, METH_NOARGS, "everything recorded, merged over threads"},
    {"reset", (PyCFunction)mod_reset, METH_NOARGS, NULL},
    {"after_fork_child", (PyCFunction)mod_after_fork_child, METH_NOARGS, NULL},
    {"now_ns", (PyCFunction)mod_now_ns, METH_NOARGS, "the hot path's clock (CLOCK_MONOTONIC)"},
    {"thread_cpu_ns", (PyCFunction)mod_thread_cpu_ns, METH_NOARGS, "this thread's CPU time, read as the hot path reads it"},
    {"hist_index", (PyCFunction)mod_hist_index, METH_O, "bucket of a value in the histogram"},
    {"current_path", (PyCFunction)mod_current_path, METH_NOARGS, "names of the open stages of this context"},
    {"add", (PyCFunction)(void (*)(void))mod_add, METH_FASTCALL | METH_KEYWORDS,
     "add(name, value=1): items (tokens, samples, bytes, ...) of the innermost open stage of this context"},
    {"set_root_exit_hook", (PyCFunction)mod_set_root_exit_hook, METH_O, "set_root_exit_hook(f): f() after every outermost stage exit; None clears"},
    {"set_decorator", (PyCFunction)mod_set_decorator, METH_O, "set_decorator(f): `@stage` on a function returns f(stage, function)"},
    {"sigwake_chain", (PyCFunction)mod_sigwake_chain, METH_VARARGS,
     "sigwake_chain(signum, fd) -> bool: a handler in front of CPython's for signum writes its number to fd first"},
    {"sigwake_fd", (PyCFunction)mod_sigwake_fd, METH_O, "sigwake_fd(fd): the pipe the chained handlers write to"},
    {"set_probe_hook", (PyCFunction)mod_set_probe_hook, METH_O, "set_probe_hook(f): f() after an outermost stage exit once it is due; f returns the ns until the next; None clears"},
    {NULL}
};

static struct PyModuleDef native_module = {PyModuleDef_HEAD_INIT, "instrument._native", "The compiled hot path of instrument.", -1, native_methods};

PyMODINIT_FUNC PyInit__native(void) {
    if (stage_types_init() < 0 || stack_init() < 0 || threads_init() < 0) return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (!m) return NULL;
    g_stage_cache = PyDict_New();
    g_warn_once = PySet_New(NULL);
    if (nvtx_add_functions(m) < 0 || perf_add_types(m) < 0 || steps_add_functions(m) < 0) return NULL;
    if (!g_stage_cache || !g_warn_once) return NULL;
    if (nodes_init() < 0) return NULL;   /* node 0 is the root */
    Py_INCREF(&Stage_Type);
    Py_INCREF(&Region_Type);
    if (PyModule_AddObject(m, "Stage", (PyObject *)&Stage_Type) < 0 || PyModule_AddObject(m, "Region", (PyObject *)&Region_Type) < 0)
        return NULL;
    PyModule_AddIntConstant(m, "MAX_NAME_LEN", MAX_NAME_LEN);
    PyModule_AddIntConstant(m, "HIST_SUB_BITS", HIST_SUB_BITS);
    PyModule_AddIntConstant(m, "HIST_BLOCKS", HIST_BLOCKS);
    PyModule_AddIntConstant(m, "HELPERS_MAX", HELPERS_MAX);
    return m;
}
