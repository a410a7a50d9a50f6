/* Memory per stage (memory.h): the sources, the open calls' slots, the folds. */
#include "memory.h"   /* first: Python.h sets the feature macros */

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define MEM_SLOTS 4096   /* measured calls open at once, over every thread and task; more are not measured */

typedef struct {
    PyObject *name;       /* NULL: a free index (an index keeps its name while the process runs: stats use it) */
    PyObject *get, *reset;   /* a callable source's (NULL: the resident set) */
    int active;
    int64_t floor;        /* the highest value seen since the SDK's own last reset: a mark below it was reset */
    int64_t last_mark;    /* the resident set without a reset: the mark at the previous read */
    int64_t max_seen;     /* the highest mark read: the process's peak, which the resets hide from its own gauge */
    uint64_t reads, read_ns, errors;
    PyObject *error;      /* why a callable source stopped (its exception's text) */
} Source;

typedef struct {
    const void *owner;
    uint32_t serial;      /* 0: free */
    int32_t pos;          /* its place in g_open */
    uint32_t reset;
    uint64_t changes;     /* g_mem_owner_changes at its enter: another context's stage event since = overlapped */
    int64_t start[MEM_SOURCES], peak[MEM_SOURCES];   /* -1: the source was not read at its enter */
} Slot;

int g_mem_n = 0;
static Source g_src[MEM_SOURCES];
static int g_n_idx = 0;                 /* indices used so far */
static Slot g_slots[MEM_SLOTS];
static int32_t g_free[MEM_SLOTS], g_n_free = -1, g_open[MEM_SLOTS], g_n_open = 0;
static uint32_t g_serial = 0, g_mem_epoch = 0, g_host_epoch = 0;   /* g_epoch of the slots, of the host's files */
static int g_busy = 0;                  /* a read of the sources is under way (its Python code may enter a stage) */
const void *g_mem_last_owner = NULL;    /* the context of the last stage enter or exit (mem_note_owner) */
uint64_t g_mem_owner_changes = 0;
static int g_refs_fd = -2, g_statm_fd = -2;   /* /proc/self/clear_refs, /proc/self/statm: -2 unopened, -1 refused */
static int64_t g_host_slack = 0;       /* the kernel's resident-set count is per-CPU batched: a mark this far below
                                         * the one read after the SDK's reset is still no one else's reset */
static int g_host_cur = 0;              /* 0: the current resident set read as the mark just after a reset (cheap);
                                         * 1: from statm (no reset allowed, or an exec'd parent's peak in the way) */

static void mem_slots_clear(void) {
    for (int32_t k = 0; k < MEM_SLOTS; k++) g_slots[k].serial = 0, g_free[k] = MEM_SLOTS - 1 - k;
    g_n_free = MEM_SLOTS;
    g_n_open = 0;
}

/* The kernel's high-water mark of the resident set, from getrusage: the larger of it and the peak the process
 * recorded when it was exec'd (its parent's, from a launcher with a large resident set), which no reset lowers.
 * Where that older peak is in the way (g_exec_peak), a mark at or below it is read from /proc/self/status. */
static int64_t g_exec_peak = 0;
static int g_status_fd = -2;

static int64_t mem_status_hwm(void) {
    char buf[4096];
    ssize_t n = g_status_fd >= 0 ? pread(g_status_fd, buf, sizeof(buf) - 1, 0) : -1;
    if (n <= 0) return -1;
    buf[n] = 0;
    const char *p = strstr(buf, "VmHWM:");
    long long kb;
    return p && sscanf(p + 6, "%lld", &kb) == 1 ? kb * 1024 : -1;
}

static int64_t mem_host_mark(void) {
    struct rusage u;
    int64_t m = getrusage(RUSAGE_THREAD, &u) == 0 ? (int64_t)u.ru_maxrss * 1024 : -1;
    return m >= 0 && g_exec_peak && m <= g_exec_peak ? mem_status_hwm() : m;
}

static int64_t mem_host_statm(void) {
    char buf[128];
    ssize_t n = g_statm_fd >= 0 ? pread(g_statm_fd, buf, sizeof(buf) - 1, 0) : -1;
    if (n <= 0) return -1;
    buf[n] = 0;
    long long size, rss;
    return sscanf(buf, "%lld %lld", &size, &rss) == 2 ? rss * (int64_t)sysconf(_SC_PAGESIZE) : -1;
}

static int mem_host_reset(void) { return g_refs_fd >= 0 && pwrite(g_refs_fd, "5", 1, 0) == 1; }

/* The files the resident set is read through, opened again in a forked child (they name the process). */
static void mem_host_open(void) {
    if (g_refs_fd >= 0) close(g_refs_fd);
    if (g_statm_fd >= 0) close(g_statm_fd);
    if (g_status_fd >= 0) close(g_status_fd);
    g_refs_fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
    g_statm_fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    g_status_fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (g_refs_fd < 0) g_refs_fd = -1;
    if (g_statm_fd < 0) g_statm_fd = -1;
    if (g_status_fd < 0) g_status_fd = -1;
    /* just after a reset the mark is the resident set, unless getrusage holds a higher peak from before an exec */
    long cpus = sysconf(_SC_NPROCESSORS_CONF);
    g_host_slack = (int64_t)(cpus > 0 ? cpus : 1) * 64 * sysconf(_SC_PAGESIZE) + (1 << 20);
    g_exec_peak = 0;
    int reset = mem_host_reset();
    if (!reset && g_refs_fd >= 0) close(g_refs_fd), g_refs_fd = -1;   /* opened but refused (an older kernel): blind */
    struct rusage u;
    int64_t st = mem_host_statm(), ru = getrusage(RUSAGE_THREAD, &u) == 0 ? (int64_t)u.ru_maxrss * 1024 : -1;
    if (reset && st >= 0 && ru > st + g_host_slack && g_status_fd >= 0) g_exec_peak = ru;   /* just after a reset */
    g_host_cur = !reset || g_exec_peak;   /* the current value: the mark just after a reset, else statm */
    g_host_epoch = g_epoch;
}

/* In a forked child, the parent's open calls are not here, nor a read it had under way: the slots start empty.
 * (The host's files are opened again at the child's first read of the resident set.) */
static void mem_fork_check(void) {
    if (g_mem_epoch == g_epoch) return;
    mem_slots_clear();
    g_busy = 0;
    g_mem_epoch = g_epoch;
}

/* A callable source's gauge: (current, peak).  0, or -1 and the source stopped (its error kept for the status). */
static int mem_call_get(Source *s, int64_t *cur, int64_t *mark) {
    PyObject *get = Py_NewRef(s->get);   /* held: a configure() on another thread may replace it meanwhile */
    PyObject *r = PyObject_CallNoArgs(get);
    Py_DECREF(get);
    long long a = -1, b = -1;
    if (r && PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2) {
        a = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 0));
        if (!PyErr_Occurred()) b = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 1));
    }
    if (!r || PyErr_Occurred() || a < 0 || b < 0) {
        Py_XDECREF(r);
        if (interrupt_handed_back()) return -1;   /* Ctrl-C during the read: the program's */
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "returned %R, not a pair of byte counts (current, peak)", r ? r : Py_None);
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyErr_NormalizeException(&et, &ev, &tb);
        Py_XSETREF(s->error, ev ? PyObject_Str(ev) : PyUnicode_FromString(et ? ((PyTypeObject *)et)->tp_name : "?"));
        PyErr_Clear();
        Py_XDECREF(et), Py_XDECREF(ev), Py_XDECREF(tb);
        s->active = 0, s->errors++;
        return -1;
    }
    Py_DECREF(r);
    *cur = a, *mark = b;
    return 0;
}

static void mem_call_reset(Source *s) {
    if (!s->reset || s->reset == Py_None) return;
    PyObject *reset = Py_NewRef(s->reset);
    PyObject *r = PyObject_CallNoArgs(reset);
    Py_DECREF(reset);
    if (!r && !interrupt_handed_back()) PyErr_Clear(), s->errors++;
    Py_XDECREF(r);
}

/* Every open slot's peak of source k raised to `mark`, or marked (bit k) where the mark was reset by another. */
static void mem_fold(int k, int64_t mark, int foreign_reset) {
    for (int32_t i = 0; i < g_n_open; i++) {
        Slot *o = &g_slots[g_open[i]];
        if (mark > o->peak[k]) o->peak[k] = mark;
        if (foreign_reset) o->reset |= 1u << k;
    }
}

/* Reads every source: each mark folded into the open slots, then each reset (at an enter: reset_all; the resident
 * set at every read, its reset is how its current value is read), cur[k] its value after (-1: not read). */
static void mem_sample(int reset_all, int64_t *cur) {
    int64_t mark[MEM_SOURCES];
    for (int k = 0; k < MEM_SOURCES; k++) cur[k] = mark[k] = -1;
    int n = g_n_idx;   /* sources added while a source's Python code runs are read from the next sample on */
    for (int k = 0; k < n; k++) {
        Source *s = &g_src[k];
        int64_t a = now_ns();
        if (!s->active) continue;
        if (!s->get && g_host_epoch != g_epoch) mem_host_open();   /* a forked child: its own files */
        if (!s->get) mark[k] = mem_host_mark();
        else if (mem_call_get(s, &cur[k], &mark[k]) < 0) continue;
        s->read_ns += (uint64_t)(now_ns() - a);
    }
    for (int k = 0; k < n; k++) {
        Source *s = &g_src[k];
        if (mark[k] < 0) continue;
        if (mark[k] > s->max_seen) s->max_seen = mark[k];
        int blind = !s->get && g_refs_fd < 0;   /* the resident set, no reset: only a rise of the mark is seen */
        if (!blind) mem_fold(k, mark[k], mark[k] < s->floor - (s->get ? 0 : g_host_slack));
        else if (mark[k] > s->last_mark) mem_fold(k, mark[k], 0);
        s->last_mark = mark[k];
    }
    for (int k = 0; k < n; k++) {
        Source *s = &g_src[k];
        if (mark[k] < 0) continue;
        int64_t a = now_ns();
        if (!s->get) {
            int reset = mem_host_reset();
            cur[k] = g_host_cur || !reset ? mem_host_statm() : mem_host_mark();
            s->floor = reset ? cur[k] : mark[k];
        } else if (reset_all) {
            mem_call_reset(s);
            s->floor = cur[k];
        } else if (mark[k] > s->floor) {
            s->floor = mark[k];
        }
        s->reads++;
        s->read_ns += (uint64_t)(now_ns() - a);
    }
}

int mem_host_index(void) {
    for (int k = 0; k < g_n_idx; k++)
        if (g_src[k].active && !g_src[k].get) return k;
    return -1;
}

int mem_reset_seen(PyObject *names) {
    PyObject *seq = PySequence_Fast(names, "memory_reset_seen() takes a sequence of source names");
    if (!seq) return -1;
    mem_fork_check();
    if (g_busy) { Py_DECREF(seq); return 0; }
    g_busy = 1;
    int64_t mark[MEM_SOURCES];
    for (int k = 0; k < g_n_idx; k++) {
        Source *s = &g_src[k];
        int hit = 0;
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++)
            hit |= PyUnicode_Check(PySequence_Fast_GET_ITEM(seq, i)) &&
                   PyUnicode_Compare(PySequence_Fast_GET_ITEM(seq, i), s->name) == 0;
        int64_t cur;
        if (!hit || !s->active || !s->get || mem_call_get(s, &cur, &mark[k]) < 0) continue;
        mem_fold(k, mark[k], 1);
        if (mark[k] > s->max_seen) s->max_seen = mark[k];
        s->floor = 0;   /* reset now by its caller: nothing is known of it until the SDK's next reset */
    }
    PyErr_Clear();
    g_busy = 0;
    Py_DECREF(seq);
    return 0;
}

/* mem_sample with the caller's exception kept (a stage may exit by one) and no other read entered meanwhile. */
static void mem_read_all(int reset_all, int64_t *cur) {
    g_busy = 1;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    mem_sample(reset_all, cur);
    PyErr_Restore(et, ev, tb);
    g_busy = 0;
}

int32_t mem_enter(const void *owner, uint32_t *serial) {
    mem_fork_check();
    if (g_busy || !g_n_free) return -1;
    int64_t cur[MEM_SOURCES];
    mem_read_all(1, cur);
    if (!g_n_free) return -1;   /* a source's Python code took the last slot meanwhile */
    int32_t id = g_free[--g_n_free];
    Slot *s = &g_slots[id];
    s->owner = owner;
    s->serial = *serial = ++g_serial ? g_serial : ++g_serial;
    int h = mem_host_index();   /* the resident set's peak without a reset is a lower bound: marked */
    s->reset = g_refs_fd < 0 && h >= 0 ? 1u << h : 0u;
    s->changes = g_mem_owner_changes;
    for (int k = 0; k < MEM_SOURCES; k++) s->start[k] = s->peak[k] = cur[k];
    s->pos = g_n_open;
    g_open[g_n_open++] = id;
    return id;
}

static void mem_slot_free(int32_t id) {
    Slot *s = &g_slots[id];
    int32_t last = g_open[--g_n_open];
    g_open[s->pos] = last;
    g_slots[last].pos = s->pos;
    s->serial = 0;
    g_free[g_n_free++] = id;
}

void mem_exit(int32_t slot, uint32_t serial, const void *owner, int read, MemCall *out) {
    out->have = out->overlapped = 0;
    out->reset = 0;
    if (slot < 0 || g_mem_epoch != g_epoch || g_slots[slot].serial != serial) return;
    Slot *s = &g_slots[slot];
    if (read && !g_busy && s->owner == owner) {
        int64_t cur[MEM_SOURCES];
        mem_read_all(0, cur);
        if (g_mem_epoch != g_epoch || s->serial != serial) return;   /* freed by Python code the read ran */
        for (int k = 0; k < MEM_SOURCES; k++) {
            int ok = cur[k] >= 0 && s->start[k] >= 0;
            out->peak[k] = ok ? (s->peak[k] > cur[k] ? s->peak[k] : cur[k]) - s->start[k] : -1;
            out->net[k] = ok ? cur[k] - s->start[k] : 0;
        }
        out->reset = s->reset;
        out->overlapped = s->changes != g_mem_owner_changes;
        out->have = 1;
    }
    mem_slot_free(slot);
}

void mem_stat_add(MemStat *m, const MemCall *c, double w) {
    for (int k = 0; k < g_n_idx; k++) {
        if (c->peak[k] < 0) continue;
        MemStat *x = &m[k];
        if (c->overlapped) { x->overlapped++; continue; }
        double p = (double)c->peak[k], n = (double)c->net[k];
        x->calls++;
        x->marked += (c->reset >> k) & 1;
        x->fresh += c->peak[k] >= MEM_FRESH;
        if (p > x->peak_max) x->peak_max = p;
        x->w += w, x->w_peak += w * p, x->w_net += w * n;
        x->peak_sum += p, x->peak_sq += p * p, x->net_sum += n, x->net_sq += n * n;
    }
}

int mem_indices(void) { return g_n_idx; }

void mem_stat_merge(MemStat *d, const MemStat *a, int n) {
    for (int k = 0; k < n; k++) {
        d[k].calls += a[k].calls, d[k].overlapped += a[k].overlapped, d[k].marked += a[k].marked;
        d[k].fresh += a[k].fresh;
        if (a[k].peak_max > d[k].peak_max) d[k].peak_max = a[k].peak_max;
        d[k].w += a[k].w, d[k].w_peak += a[k].w_peak, d[k].w_net += a[k].w_net;
        d[k].peak_sum += a[k].peak_sum, d[k].peak_sq += a[k].peak_sq;
        d[k].net_sum += a[k].net_sum, d[k].net_sq += a[k].net_sq;
    }
}

PyObject *mem_stat_list(const MemStat *m, int n) {
    PyObject *d = PyDict_New();
    for (int k = 0; d && m && k < n && k < g_n_idx; k++) {
        const MemStat *x = &m[k];
        if (!x->calls && !x->overlapped) continue;
        PyObject *e = Py_BuildValue("{s:K,s:K,s:K,s:K,s:d,s:d,s:d,s:d,s:d,s:d,s:d,s:d}", "calls",
            (unsigned long long)x->calls, "overlapped", (unsigned long long)x->overlapped, "marked",
            (unsigned long long)x->marked, "fresh", (unsigned long long)x->fresh, "peak_max", x->peak_max, "w", x->w, "w_peak", x->w_peak, "w_net", x->w_net,
            "peak_sum", x->peak_sum, "peak_sq", x->peak_sq, "net_sum", x->net_sum, "net_sq", x->net_sq);
        if (!e || PyDict_SetItem(d, g_src[k].name, e) < 0) Py_CLEAR(d);
        Py_XDECREF(e);
    }
    return d;
}

/* ------------------------------------------------------------ configuration */

static int mem_spec_check(PyObject *item, PyObject **name, PyObject **get, PyObject **reset) {
    *get = *reset = NULL;
    if (PyUnicode_Check(item) && PyUnicode_CompareWithASCIIString(item, "host") == 0) { *name = item; return 0; }
    if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 3 && PyUnicode_Check(PyTuple_GET_ITEM(item, 0)) &&
        PyCallable_Check(PyTuple_GET_ITEM(item, 1)) &&
        (PyTuple_GET_ITEM(item, 2) == Py_None || PyCallable_Check(PyTuple_GET_ITEM(item, 2)))) {
        *name = PyTuple_GET_ITEM(item, 0), *get = PyTuple_GET_ITEM(item, 1), *reset = PyTuple_GET_ITEM(item, 2);
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "memory sources must be \"host\" or (name, get, reset) with get() -> (current, "
                 "peak) and reset a callable or None, got %R", item);
    return -1;
}

/* The index of a source's name: its old one (stats keep their meaning), else a new one; -1 when all are used. */
static int mem_source_index(PyObject *name) {
    for (int k = 0; k < g_n_idx; k++)
        if (PyUnicode_Compare(g_src[k].name, name) == 0) return k;
    if (g_n_idx == MEM_SOURCES) return -1;
    g_src[g_n_idx].name = Py_NewRef(name);
    return g_n_idx++;
}

int mem_configure(PyObject *spec, int apply) {
    PyObject *seq = PySequence_Fast(spec, "memory must be a sequence of sources");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *name, *get, *reset;
    for (Py_ssize_t i = 0; i < n; i++)
        if (mem_spec_check(PySequence_Fast_GET_ITEM(seq, i), &name, &get, &reset) < 0) { Py_DECREF(seq); return -1; }
    if (!apply) { Py_DECREF(seq); return 0; }
    mem_fork_check();
    int was[MEM_SOURCES];
    for (int k = 0; k < MEM_SOURCES; k++) was[k] = k < g_n_idx && g_src[k].active, g_src[k].active = 0;
    g_mem_n = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        mem_spec_check(PySequence_Fast_GET_ITEM(seq, i), &name, &get, &reset);
        int k = mem_source_index(name);
        if (k < 0) continue;   /* beyond MEM_SOURCES names in one process: not read (mem_status lists what is) */
        Source *s = &g_src[k];
        Py_XSETREF(s->get, Py_XNewRef(get));
        Py_XSETREF(s->reset, Py_XNewRef(reset));
        Py_CLEAR(s->error);
        s->active = 1, s->floor = 0, s->last_mark = 0;
        if (!get && (g_refs_fd == -2 || g_host_epoch != g_epoch)) mem_host_open();
        for (int32_t j = 0; !was[k] && j < g_n_open; j++)   /* calls open before it: no start of theirs */
            g_slots[g_open[j]].start[k] = g_slots[g_open[j]].peak[k] = -1;
        g_mem_n++;
    }
    Py_DECREF(seq);
    return 0;
}

PyObject *mem_status(void) {
    PyObject *l = PyList_New(0);
    for (int k = 0; l && k < g_n_idx; k++) {
        Source *s = &g_src[k];
        if (!s->active && !s->error) continue;
        const char *how = s->get ? "the source's own peak, reset at each measured enter"
                        : g_refs_fd >= 0 && g_exec_peak ? "the kernel's high-water mark of the resident set, reset at "
                            "each read through /proc/self/clear_refs, read from /proc/self/status (getrusage holds "
                            "the higher peak of the process this one was exec'd from, and costs less only above it)"
                        : g_refs_fd >= 0 ? "the kernel's high-water mark of the resident set (getrusage), reset at "
                                           "each read through /proc/self/clear_refs"
                        : "the resident set's high-water mark, which the process may not reset here: a peak is seen "
                          "only where it rises above every earlier one (the figures are lower bounds)";
        PyObject *e = Py_BuildValue("{s:O,s:O,s:s,s:L,s:K,s:d,s:K,s:O}", "name", s->name, "active",
            s->active ? Py_True : Py_False, "peak", how, "peak_bytes", (long long)s->max_seen,
            "reads", (unsigned long long)s->reads,
            "ns_per_read", s->reads ? (double)s->read_ns / (double)s->reads : 0.0, "errors",
            (unsigned long long)s->errors, "error", s->error ? s->error : Py_None);
        if (!e || PyList_Append(l, e) < 0) Py_CLEAR(l);
        Py_XDECREF(e);
    }
    return l;
}
