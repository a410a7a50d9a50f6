/* The module: its functions (stage, configure, set_counters, set_hooks, collect,
 * reset, after_fork_child, now_ns, hist_index, current_path, add (items.c), set_root_exit_hook) and its
 * init, which
 * also adds the NVTX functions (nvtx_emit.c) and CounterGroup (perf.c). */
#include "core.h"   /* first: Python.h sets the feature macros */

#include <string.h>

#include "exemplars.h"
#include "hist.h"
#include "items.h"
#include "nodes.h"
#include "nvtx_emit.h"
#include "rootexit.h"
#include "stats.h"
#include "threads.h"
#include "types.h"
#include "tasks.h"

static PyObject *g_stage_cache = NULL;   /* name -> Stage */

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
    static char *kwlist[] = {"enabled", "cpu_clock", "max_stages", "trace_events", "nvtx", "exemplars", "budget",
                             "cpu_split", NULL};
    int enabled = g_enabled, cpu_clock = g_cpu_clock, nvtx = g_nvtx, cpu_split = g_cpu_split;
    int max_nodes = g_max_nodes, xm_k = g_xm_k;
    double budget = g_budget;
    Py_ssize_t trace = (Py_ssize_t)g_ring_cap;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$ppinpidp:configure", kwlist, &enabled, &cpu_clock, &max_nodes,
                                     &trace, &nvtx, &xm_k, &budget, &cpu_split)) return NULL;
    if (!(budget >= 0 && budget <= 1))
        return PyErr_Format(PyExc_ValueError, "budget must be a number from 0 (read every call) to 1");
    if (max_nodes < 1) return PyErr_Format(PyExc_ValueError, "max_stages must be at least 1, got %d", max_nodes);
    if (trace < 0) return PyErr_Format(PyExc_ValueError, "trace_events must be 0 or more, got %zd", trace);
    if (xm_k < 0 || xm_k > XM_MAX_K) return PyErr_Format(PyExc_ValueError, "exemplars must be from 0 to %d, got %d", XM_MAX_K, xm_k);
    xm_set_k(xm_k);
    if ((size_t)trace != g_ring_cap && trace_resize((size_t)trace) < 0) return PyErr_NoMemory();
    g_enabled = enabled;
    g_budget = budget;
    g_cpu_split = cpu_split;
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
        if (!s || (!s->calls && !s->n_items)) continue;   /* node 0: items added outside any stage */
        PyObject *h = hist_to_list(&s->h);
        if (!h) goto done;
        PyObject *ctr = PyList_New(0);
        if (!ctr) { Py_DECREF(h); goto done; }
        for (int k = 0; s->ctr && k < g_ctr_n; k++) {
            CounterStat *c = &s->ctr[k];
            PyObject *t = Py_BuildValue("(ddKKKKKd)", c->total, c->self, (unsigned long long)c->enabled,
                (unsigned long long)c->running, (unsigned long long)c->counted, (unsigned long long)c->scaled,
                (unsigned long long)c->covered, c->wsum);
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
        PyObject *cr = t ? Py_BuildValue("{s:K,s:d,s:d,s:L,s:K,s:L,s:L,s:L,s:L}", "cpu_reads", (unsigned long long)s->cpu_reads,
            "cpu_wsum", s->cpu_wsum, "cpu_wall_w", s->cpu_wall_w, "cpu_cov_wall", (long long)s->cpu_cov_wall,
            "sys_reads", (unsigned long long)s->sys_reads, "sys_total", (long long)s->sys_total,
            "sys_self", (long long)s->sys_self, "sys_cpu_total", (long long)s->sys_cpu_total,
            "sys_cpu_self", (long long)s->sys_cpu_self) : NULL;
        if (t && (!cr || PyDict_Update(t, cr) < 0)) Py_CLEAR(t);
        Py_XDECREF(cr);
        if (t && tasks_collect_stats(t, s) < 0) Py_CLEAR(t);
        Py_DECREF(ctr);
        PyObject *items = t ? items_to_list(s) : NULL;
        if (t && (!items || PyDict_SetItemString(t, "items", items) < 0)) Py_CLEAR(t);
        Py_XDECREF(items);
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
    PyObject *xm = res ? xm_collect() : NULL;
    if (res && (!xm || PyDict_SetItemString(res, "exemplars", xm) < 0)) Py_CLEAR(res);
    Py_XDECREF(xm);
    PyObject *xb = res ? Py_BuildValue("(nn)", (Py_ssize_t)xm_bytes(), (Py_ssize_t)xm_pool_bytes()) : NULL;
    if (res && (!xb || PyDict_SetItemString(res, "exemplar_bytes", xb) < 0)) Py_CLEAR(res);
    Py_XDECREF(xb);
    if (res && g_ctr_status_known) {
        PyObject *x = Py_BuildValue("{s:O,s:O}", "exclude_kernel", g_ctr_excl_used ? Py_True : Py_False,
                                    "rdpmc", g_ctr_rdpmc ? Py_True : Py_False);
        if (!x || PyDict_SetItemString(res, "counter_open", x) < 0) Py_CLEAR(res);
        Py_XDECREF(x);
    }
    if (res && tasks_collect(res) < 0) Py_CLEAR(res);
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
    xm_reset();
    g_ring_next = 0;
    g_ring_total = 0;
    g_unmatched = g_out_of_order = g_cross_thread = g_internal = g_folded = 0;
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
        if (ts->clk_state == 1) perf_clock_close(&ts->clk);
        ts->clk_state = 0;
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

/* calibrate(n=200): the configuration's costs on this thread (types.c), for the budget and meta.overhead. */
static PyObject *mod_calibrate(PyObject *m, PyObject *args) {
    int n = 200;
    if (!PyArg_ParseTuple(args, "|i:calibrate", &n)) return NULL;
    if (n < 1 || n > 1000000) return PyErr_Format(PyExc_ValueError, "calibrate needs 1 to 1000000 rounds, got %d", n);
    return stage_calibrate(n);
}

static PyMethodDef native_methods[] = {
    {"stage", (PyCFunction)mod_stage, METH_O, "stage(name) -> Stage, one object per name"},
    {"configure", (PyCFunction)(void (*)(void))mod_configure, METH_VARARGS | METH_KEYWORDS, NULL},
    {"calibrate", (PyCFunction)mod_calibrate, METH_VARARGS, NULL},
    {"set_counters", (PyCFunction)mod_set_counters, METH_VARARGS, "set_counters(events, exclude_kernel, taskclock_index)"},
    {"set_hooks", (PyCFunction)mod_set_hooks, METH_VARARGS, "set_hooks(enter, exit): called around every stage; None, None clears"},
    {"collect", (PyCFunction)mod_collect, METH_NOARGS, "everything recorded, merged over threads"},
    {"reset", (PyCFunction)mod_reset, METH_NOARGS, NULL},
    {"after_fork_child", (PyCFunction)mod_after_fork_child, METH_NOARGS, NULL},
    {"now_ns", (PyCFunction)mod_now_ns, METH_NOARGS, "the hot path's clock (CLOCK_MONOTONIC)"},
    {"hist_index", (PyCFunction)mod_hist_index, METH_O, "bucket of a value in the histogram"},
    {"current_path", (PyCFunction)mod_current_path, METH_NOARGS, "names of the open stages of this context"},
    {"add", (PyCFunction)(void (*)(void))mod_add, METH_FASTCALL | METH_KEYWORDS,
     "add(name, value=1): items (tokens, samples, bytes, ...) of the innermost open stage of this context"},
    {"set_root_exit_hook", (PyCFunction)mod_set_root_exit_hook, METH_O, "set_root_exit_hook(f): f() after every outermost stage exit; None clears"},
    {NULL}
};

static struct PyModuleDef native_module = {PyModuleDef_HEAD_INIT, "instrument._native", "The compiled hot path of instrument.", -1, native_methods};

PyMODINIT_FUNC PyInit__native(void) {
    if (types_init() < 0 || threads_init() < 0) return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (!m) return NULL;
    g_stage_cache = PyDict_New();
    g_warn_once = PySet_New(NULL);
    if (nvtx_add_functions(m) < 0 || perf_add_types(m) < 0 || tasks_add_functions(m) < 0) return NULL;
    if (!g_stage_cache || !g_warn_once) return NULL;
    if (nodes_init() < 0) return NULL;   /* node 0 is the root */
    Py_INCREF(&Stage_Type);
    Py_INCREF(&Region_Type);
    if (PyModule_AddObject(m, "Stage", (PyObject *)&Stage_Type) < 0 || PyModule_AddObject(m, "Region", (PyObject *)&Region_Type) < 0)
        return NULL;
    PyModule_AddIntConstant(m, "MAX_NAME_LEN", MAX_NAME_LEN);
    PyModule_AddIntConstant(m, "HIST_SUB_BITS", HIST_SUB_BITS);
    PyModule_AddIntConstant(m, "HIST_BLOCKS", HIST_BLOCKS);
    return m;
}
