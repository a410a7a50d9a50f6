/* calibrate(): what the configuration in force costs on the calling thread, the
 * way stage_enter/exit spend it.  It sets g_read_cost (one call's reads, both
 * boundaries: the overhead budget's unit) and the SDK's own share of a call's
 * wall window (g_wall_bias, unread and read calls) and of a read call's CPU
 * window (g_cpu_bias): what an empty stage records, taken out of every call; and
 * it times a stage call without reads, for meta.overhead.  The
 * calibration stage runs with integrations, NVTX, exemplars and the trace ring
 * off, into slots of its own that are freed; it is only timed when no stage is
 * open in the calling context (else base_ns is None). */
#include "enter_exit.h"   /* first: Python.h sets the feature macros */

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "exemplars.h"
#include "memory.h"
#include "nodes.h"
#include "rootexit.h"
#include "stack.h"
#include "stats.h"

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int64_t median_i64(int64_t *v, int n) {
    qsort(v, (size_t)n, sizeof(int64_t), cmp_i64);
    return v[n / 2];
}

/* The mean of the middle 80 %: what a call costs on average, without the rare interrupt or fault. */
static int64_t trimmed_mean_i64(int64_t *v, int n) {
    qsort(v, (size_t)n, sizeof(int64_t), cmp_i64);
    int lo = n / 10, hi = n - n / 10;
    double sum = 0;
    for (int k = lo; k < hi; k++) sum += (double)v[k];
    return (int64_t)(sum / (hi - lo));
}

#define BLOCKS 5   /* short blocks of samples: a burst of load during calibrate() spoils some, not all */

/* The samples in BLOCKS blocks (one where there are too few), each summed up by `of`; the quietest block's figure
 * (quietest != 0: the least) or the median block's. */
static int64_t over_blocks(int64_t *v, int n, int64_t (*of)(int64_t *, int), int quietest) {
    int nb = n >= 5 * BLOCKS ? BLOCKS : 1, len = n / nb;
    int64_t b[BLOCKS];
    for (int k = 0; k < nb; k++) b[k] = of(v + k * len, len);
    qsort(b, (size_t)nb, sizeof(int64_t), cmp_i64);
    return quietest ? b[0] : b[nb / 2];
}

/* The thread's CPU time from its task-clock event, where perf_event_open allows it and it agrees with the clock over
 * 2 ms of this thread's CPU, in one of a few tries: on a loaded VM a burst of steal time or a preemption between
 * the two reads can part them once, and a clock that disagrees every time is not taken. */
static void calibrate_thread_clock(ThreadState *ts) {
    g_thread_taskclock = 0;
    if (ts->clk_state == 0) ts->clk_state = perf_clock_open(&ts->clk) == 0 ? 1 : -1;
    if (ts->clk_state != 1) return;
    for (int tries = 0; tries < 5 && !g_thread_taskclock; tries++) {
        int64_t a = perf_clock_read(&ts->clk), b = thread_cpu_ns(), x = 0;
        for (int64_t end = b + 2000000; thread_cpu_ns() < end;) x++;
        int64_t da = perf_clock_read(&ts->clk) - a, db = thread_cpu_ns() - b;
        g_thread_taskclock = a >= 0 && da > 0 && db > 0 && (double)llabs(da - db) <= 0.02 * (double)db;
        (void)x;
    }
}

/* The reads of one call, as stage_enter/exit take them, timed bare: their cost (the quietest block's median), the
 * budget's figure until the run has timed its own read calls. */
static int64_t time_reads(ThreadState *ts, int n, int64_t *v) {
    Reading r0, r1;
    for (int k = 0; k < n; k++) {
        int64_t a = now_ns();
        uint32_t serial = 0;
        int32_t slot = g_mem_n ? mem_enter(NULL, &serial) : -1;   /* a read call reads memory too (memory.h) */
        read_boundary(ts, &r0, 0);
        read_boundary(ts, &r1, 1);
        MemCall mc;
        if (slot >= 0) mem_exit(slot, serial, NULL, 1, &mc);
        v[k] = now_ns() - a;
    }
    return over_blocks(v, n, median_i64, 1);
}

/* The globals a calibration run changes, to put back afterwards. */
typedef struct {
    int enabled, nvtx, ctr_n, cpu_clock, cpu_split, run_queue, helper_cpu;
    int32_t exemplar_k;
    size_t ring;
    double budget;
    int64_t wall_bias[2], cpu_bias, inner_bias;
    PyObject *he, *hx, *re, *pr;
    StatsArray stats;
} Saved;

static void quiet(ThreadState *ts, Saved *s) {
    *s = (Saved){g_enabled, g_nvtx, g_ctr_n, g_cpu_clock, g_cpu_split, g_run_queue, g_helper_cpu,
                 g_exemplar_k, g_ring_cap,
                 g_budget, {g_wall_bias[0], g_wall_bias[1]}, g_cpu_bias, g_inner_bias, g_hook_enter, g_hook_exit,
                 g_root_exit_hook, g_probe_hook, ts->stats};
    ts->stats.v = NULL;
    ts->stats.n = 0;
    g_enabled = 1, g_nvtx = 0, g_exemplar_k = 0, g_ring_cap = 0;
    g_hook_enter = g_hook_exit = g_root_exit_hook = g_probe_hook = NULL;
}

static void restore(ThreadState *ts, const Saved *s) {
    g_enabled = s->enabled, g_nvtx = s->nvtx, g_ctr_n = s->ctr_n, g_cpu_clock = s->cpu_clock;
    g_cpu_split = s->cpu_split, g_run_queue = s->run_queue, g_helper_cpu = s->helper_cpu;
    g_exemplar_k = s->exemplar_k, g_ring_cap = s->ring;
    g_budget = s->budget, g_wall_bias[0] = s->wall_bias[0], g_wall_bias[1] = s->wall_bias[1];
    g_cpu_bias = s->cpu_bias, g_inner_bias = s->inner_bias;
    g_hook_enter = s->he, g_hook_exit = s->hx, g_root_exit_hook = s->re, g_probe_hook = s->pr;
    stats_array_clear(&ts->stats);
    ts->stats = s->stats;
}

/* A stage call without reads: ns per enter+exit (*cost), and the wall time such a call records (*wall). */
static void time_bare_calls(Stage *cal, int32_t node, ThreadState *ts, int n, int64_t *v, double *cost,
                            int64_t *wall) {
    const int batch = 32;
    g_ctr_n = 0, g_cpu_clock = 0, g_cpu_split = 0, g_run_queue = 0, g_helper_cpu = 0, g_wall_bias[0] = 0;
    int64_t *w = v + n;
    for (int k = 0; k < n; k++) {
        NodeStats *cs = stats_get(&ts->stats, node);
        int64_t w0 = cs ? cs->wall_total : 0, a = now_ns();
        for (int j = 0; j < batch; j++) {
            stage_enter(cal);
            stage_exit(cal, 0);
        }
        v[k] = now_ns() - a;
        cs = stats_get(&ts->stats, node);
        w[k] = cs ? (cs->wall_total - w0) / batch : 0;
    }
    int64_t empty = now_ns();
    empty = now_ns() - empty;   /* the clock read that closes each batch */
    *cost = (double)(over_blocks(v, n, median_i64, 1) - empty) / batch;
    *wall = over_blocks(w, n, median_i64, 0);
}

/* Empty calls read on every call, on the real enter/exit path: what one records in its wall and CPU windows, and
 * between its CPU reads (biases[0..2]).  0 when fewer than 5 calls were read. */
static int measure_biases(Stage *cal, int32_t node, ThreadState *ts, int n, int64_t *v, int64_t *biases) {
    g_budget = 0, g_wall_bias[1] = 0, g_cpu_bias = 0, g_inner_bias = 0;
    int64_t *w = v + n, *u = v + 2 * n;
    int m = 0, with_cpu = 0;
    for (int k = 0; k < n; k++) {
        NodeStats *cs = stats_get(&ts->stats, node);
        double c0 = cs ? stats_read_sum(cs, Q_CPU) : 0;
        double i0 = cs ? stats_read_run(cs, Q_CPU) : 0;
        uint64_t r0 = cs ? stats_reads(cs, Q_CPU) : 0, n0 = cs ? cs->calls : 0;
        int64_t w0 = cs ? cs->wall_total : 0;
        stage_enter(cal);
        stage_exit(cal, 0);
        if (!(cs = stats_get(&ts->stats, node)) || cs->calls != n0 + 1) continue;
        with_cpu = stats_reads(cs, Q_CPU) == r0 + 1;
        v[m] = with_cpu ? (int64_t)(stats_read_sum(cs, Q_CPU) - c0) : 0;
        u[m] = with_cpu ? (int64_t)(stats_read_run(cs, Q_CPU) - i0) : 0;
        w[m++] = cs->wall_total - w0;
    }
    if (m < 5) return 0;
    int64_t b[3] = {over_blocks(w, m, trimmed_mean_i64, 0), with_cpu ? over_blocks(v, m, trimmed_mean_i64, 0) : 0,
                    with_cpu ? over_blocks(u, m, trimmed_mean_i64, 0) : 0};
    for (int k = 0; k < 3; k++) biases[k] = b[k] > 0 ? b[k] : 0;
    return 1;
}

/* Times a stage call and measures the biases with a stage of its own; the cost per call, or NULL with an
 * exception. */
static PyObject *calibrate_stage(ThreadState *ts, Stack *st, int reads, int n, int64_t *v) {
    PyObject *name = PyUnicode_FromString("(instrument calibration)");
    Stage *cal = name ? (Stage *)stage_new(name, NULL, 0) : NULL;
    Py_XDECREF(name);
    int32_t node = cal ? node_uncounted(stack_base(st), cal->name) : -1;   /* not one of the user's max_stages */
    if (node < 0) {
        Py_XDECREF(cal);
        return cal ? PyErr_NoMemory() : NULL;
    }
    Saved saved;
    quiet(ts, &saved);
    double cost;
    int64_t bare_wall, biases[3] = {0, 0, 0};
    time_bare_calls(cal, node, ts, n, v, &cost, &bare_wall);
    g_ctr_n = saved.ctr_n, g_cpu_clock = saved.cpu_clock, g_cpu_split = saved.cpu_split;
    g_run_queue = saved.run_queue, g_helper_cpu = saved.helper_cpu;
    int measured = reads ? measure_biases(cal, node, ts, n, v, biases) : 0;
    restore(ts, &saved);
    g_wall_bias[0] = bare_wall > 0 ? bare_wall : 0;
    if (measured) g_wall_bias[1] = biases[0], g_cpu_bias = biases[1], g_inner_bias = biases[2];
    Py_DECREF(cal);
    return PyFloat_FromDouble(cost);
}

/* Whether this thread's schedstat gives run-queue time: a thread that waited for a CPU shows a delay that grows. */
static const char *run_queue_source(ThreadState *ts) {
    if (!g_run_queue) return "off (the run_queue option)";
    int64_t d = sched_run_delay(ts);
    if (d < 0) return "unavailable (/proc/thread-self/schedstat cannot be read)";
    char buf[64];
    int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    ssize_t k = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
    if (fd >= 0) close(fd);
    if (k > 0) buf[k] = 0;
    return k > 0 && strtoull(buf, NULL, 10) == 0 ? "unavailable (schedstat reads 0 0: the kernel keeps no scheduler "
                                                   "statistics)" : "/proc/thread-self/schedstat";
}

/* Whether the switch page moves when this thread sleeps (g_switches): where it does, each call knows whether its
 * thread left the CPU.  The reason where it does not. */
static const char *probe_switches(ThreadState *ts) {
    g_switches = 0;
    if (!ts->sw.page) return "unavailable (no perf context-switches event for this thread: perf_event_paranoid?)";
    for (int k = 0; k < 3; k++) {
        uint32_t a = perf_switch_seq(&ts->sw);
        struct timespec d = {0, 50000};
        nanosleep(&d, NULL);
        if (perf_switch_seq(&ts->sw) != a) {
            g_switches = 1;
            return "perf mmap page (each call: whether its thread left the CPU)";
        }
    }
    return "unavailable (the kernel does not update the perf mmap page when the thread is switched in)";
}

/* Where the thread's CPU time comes from, and whether reading it disturbs the scheduler. */
static const char *thread_clock_source(const ThreadState *ts) {
    if (g_thread_taskclock) return ts->clk.user_time ? "perf task-clock mmap page (cap_user_time; no scheduler update)"
                                                     : "perf task-clock read() (no cap_user_time; no scheduler update)";
    return ts->clk_state == 1 ? "CLOCK_THREAD_CPUTIME_ID (the task-clock disagreed with it; updates the scheduler)"
                              : "CLOCK_THREAD_CPUTIME_ID (perf_event_open refused; updates the scheduler)";
}

PyObject *stage_calibrate(int n) {
    if (n < 9) n = 9;
    ThreadState *ts = ts_get();
    if (!ts) return NULL;
    int64_t *v = malloc(3 * sizeof(int64_t) * (size_t)n);
    if (!v) return PyErr_NoMemory();
    if (g_ctr_n) counters_ready(ts);
    calibrate_thread_clock(ts);
    const char *switches = probe_switches(ts);
    Reading probe;
    read_boundary(ts, &probe, 0);
    int src = probe.cpu_src, reads = src || probe.ctr_gen || probe.q[Q_RQ] >= 0 || probe.q[Q_HELPERS] >= 0;
    int64_t read_ns = reads ? time_reads(ts, n, v) : 0;
    g_read_cost = (double)read_ns;
    PyObject *base = Py_NewRef(Py_None);
    Stack *st = stack_current(1);
    if (st && st->depth == 0 && !st->exemplar) {
        Py_DECREF(base);
        base = calibrate_stage(ts, st, reads, n, v);
    }
    free(v);
    g_read_spent = 0, g_read_spent_calls = 0;   /* the run times its read calls afresh under this configuration */
    if (!st || !base) { Py_XDECREF(base); return NULL; }
    static const char *names[3] = {"none", "thread-clock", "task-clock"};
    return Py_BuildValue("{s:d,s:N,s:L,s:L,s:L,s:L,s:s,s:O,s:s,s:s,s:s,s:s}", "read_ns", (double)read_ns, "base_ns", base,
                         "cpu_bias_ns", (long long)g_cpu_bias, "inner_bias_ns", (long long)g_inner_bias,
                         "wall_bias_ns", (long long)g_wall_bias[1],
                         "unread_wall_bias_ns", (long long)g_wall_bias[0], "cpu_source", names[src],
                         "sys", probe.q[Q_SYS] >= 0 ? Py_True : Py_False, "thread_clock", thread_clock_source(ts),
                         "run_queue", run_queue_source(ts), "helper_cpu",
                         !g_helper_cpu ? "off (the helper_cpu option)" : probe.q[Q_HELPERS] >= 0 ?
                         "each helper thread's own CPU clock (no scheduler update of the reader)" :
                         "unavailable (more than 32 threads run no stage)", "switches", switches);
}
