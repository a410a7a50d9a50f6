/* The readings of one boundary (readings.h). */
#include "readings.h"   /* first: Python.h sets the feature macros */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gil.h"

#define HELPERS_RESCAN_NS 100000000   /* the thread list is looked at again when its count changes, or every 100 ms */
#define HELPERS_BASE ((int64_t)1 << 50)   /* only deltas count: a base keeps a reading positive (-1 means unread) */

int64_t sched_run_delay(ThreadState *ts) {
    if (ts->sched_fd == -2) return -1;
    if (ts->sched_fd == -1) {   /* per thread: thread-self resolves at open */
        ts->sched_fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
        if (ts->sched_fd < 0) { ts->sched_fd = -2; return -1; }
    }
    char buf[96];
    ssize_t n = pread(ts->sched_fd, buf, sizeof(buf) - 1, 0);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *end;
    (void)strtoull(buf, &end, 10);          /* time on CPU: stale for a running reader, not used */
    unsigned long long delay = strtoull(end, &end, 10);
    return (int64_t)delay;
}

static int64_t clock_ns(clockid_t id) {
    struct timespec t;
    if (clock_gettime(id, &t) != 0) return -1;
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

typedef struct { long tid; clockid_t clock; int64_t seen; } Helper;
static Helper g_helpers[HELPERS_MAX];
static int g_n_helpers = 0, g_too_many = 0, g_over_cap = 0;   /* g_over_cap: the most seen while over the cap */
static int64_t g_helpers_gone = 0, g_helpers_scanned = 0;   /* CPU of helpers no longer listed; last scan */

static int runs_stages(long tid) {
    for (ThreadState *t = g_threads; t; t = t->next)
        if ((long)t->native_id == tid) return 1;
    return tid == gil_sampler_tid();   /* the GIL sampler: its cost is the SDK's own */
}

/* The helper threads now: the process's threads that run no stage.  One that left the list (ended, or now runs
 * stages) keeps its last CPU time in g_helpers_gone; one that joined counts from 0 (from now at the first scan). */
static void helpers_rescan(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return;
    Helper next[HELPERS_MAX];
    int n = 0, first = g_helpers_scanned == 0;
    struct dirent *e;
    int all = 0;
    while ((e = readdir(d))) {
        long tid = atol(e->d_name);
        if (tid <= 0 || runs_stages(tid) || ++all > HELPERS_MAX) continue;   /* past the cap: only counted */
        next[n] = (Helper){tid, (clockid_t)((~(unsigned)tid << 3) | 6), 0};   /* MAKE_THREAD_CPUCLOCK(tid, SCHED) */
        for (int k = 0; k < g_n_helpers; k++)
            if (g_helpers[k].tid == tid) next[n].seen = g_helpers[k].seen, g_helpers[k].tid = 0;
        if (first && (next[n].seen = clock_ns(next[n].clock)) >= 0) g_helpers_gone -= next[n].seen;
        if (next[n].seen < 0) next[n].seen = 0;
        n++;
    }
    closedir(d);
    g_too_many = all > HELPERS_MAX;
    if (all > g_over_cap && g_too_many) g_over_cap = all;
    for (int k = 0; k < g_n_helpers; k++)
        if (g_helpers[k].tid) g_helpers_gone += g_helpers[k].seen;
    memcpy(g_helpers, next, sizeof(Helper) * (size_t)n);
    g_n_helpers = n;
}

int helpers_over_cap(int forget) {
    int n = g_over_cap;
    if (forget) g_over_cap = 0;
    return n;
}

/* The CPU time of the process's threads that run no stage: each one's own CPU clock, read from this thread.
 * Never this thread's clock nor the process's (both bring the caller's scheduler accounting up to date). */
int64_t helpers_cpu(ThreadState *ts) {
    static int task_fd = -1;
    static uint32_t task_epoch = 0;
    static nlink_t links = 0;
    static uint64_t gen = 0;   /* a thread that starts running stages leaves the helpers at once, not at the next scan */
    if (task_fd >= 0 && task_epoch != g_epoch) close(task_fd), task_fd = -1, g_helpers_scanned = 0;   /* a fork */
    if (task_fd < 0) task_fd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC), task_epoch = g_epoch;
    struct stat sb;   /* the task directory's link count is 2 + the process's threads: a thread came or went */
    nlink_t now_links = task_fd >= 0 && fstat(task_fd, &sb) == 0 ? sb.st_nlink : 0;
    int64_t now = now_ns();
    if (!g_helpers_scanned || now_links != links || gen != g_threads_gen || now - g_helpers_scanned >= HELPERS_RESCAN_NS) {
        helpers_rescan();
        g_helpers_scanned = now, links = now_links, gen = g_threads_gen;
    }
    if (g_too_many) return -1;
    int64_t sum = g_helpers_gone;
    for (int k = 0; k < g_n_helpers; k++) {
        int64_t c = clock_ns(g_helpers[k].clock);
        if (c >= 0) g_helpers[k].seen = c;   /* a thread ending meanwhile keeps its last value */
        sum += g_helpers[k].seen;
    }
    return HELPERS_BASE + sum;
}

/* The GIL sampler's counts of this thread (its slot made on first use, again after a fork). */
static void read_gil(ThreadState *ts, Reading *r) {
    if (ts->gil && !gil_read(ts->gil, &r->q[Q_OFF], &r->q[Q_GIL])) gil_slot_free(ts->gil), ts->gil = NULL;
    if (!ts->gil && !(ts->gil = gil_slot_new())) return;
    gil_read(ts->gil, &r->q[Q_OFF], &r->q[Q_GIL]);
}

static void read_rusage(Reading *r) {
    struct rusage u;
    if (getrusage(RUSAGE_THREAD, &u) != 0) return;
    r->q[Q_SYS] = (int64_t)u.ru_stime.tv_sec * 1000000000 + (int64_t)u.ru_stime.tv_usec * 1000;
    r->q[Q_VCSW] = u.ru_nvcsw;
    r->q[Q_IVCSW] = u.ru_nivcsw;
}

/* The counters, and CPU time from task-clock where it ran, else from the thread CPU clock. */
static void read_cpu(ThreadState *ts, Reading *r) {
    r->cpu_src = 0;
    if (g_ctr_n && ts->perf_gen == g_ctr_gen) {
        perf_set_read(&ts->perf, &r->c);
        r->ctr_gen = g_ctr_gen;
        if (g_ctr_taskclock >= 0 && r->c.running[g_ctr_taskclock]) {
            r->q[Q_CPU] = (int64_t)r->c.value[g_ctr_taskclock];
            r->cpu_src = 2;
        }
    }
    if (!r->cpu_src && g_cpu_clock && (r->q[Q_CPU] = thread_cpu(ts)) >= 0) r->cpu_src = 1;
}

/* The run-queue time and the wall clock together at an edge of a call's wall window, the clock on the window's
 * side (at enter after schedstat, at exit before it), and between them the CPU time where reading it does not
 * update the scheduler (cpu): a switch across them (the switch page moved) reads them again, so the run-queue
 * and CPU times are exact at the wall time they go with and the wall window holds none of the reads. */
static void read_edge(ThreadState *ts, Reading *r, int exit, int cpu) {
    for (int tries = 0; tries < 3; tries++) {
        uint32_t sw = ts_switches(ts);
        if (exit) r->t = r->tq = now_ns();
        if (exit && cpu) read_cpu(ts, r);
        if (g_run_queue) r->q[Q_RQ] = sched_run_delay(ts);
        if (g_gil) read_gil(ts, r);
        if (!exit && cpu) read_cpu(ts, r);
        if (!exit) r->t = r->tq = now_ns();
        if (ts_switches(ts) == sw) return;
    }
}

void read_time(Reading *r) {
    r->t = r->tq = now_ns();
    for (int k = 0; k < Q_SCALARS; k++) r->q[k] = -1;
    r->cpu_src = r->full = 0;
    r->ctr_gen = 0;
    r->epoch = g_epoch;
}

void read_boundary(ThreadState *ts, Reading *r, int exit) {
    for (int k = 0; k < Q_SCALARS; k++) r->q[k] = -1;
    r->cpu_src = 0;
    r->full = 1;
    r->epoch = g_epoch;
    r->ctr_gen = 0;
    /* CPU time from a task-clock goes next to the wall clock; from CLOCK_THREAD_CPUTIME_ID (it can preempt the
     * thread inside the read) outside the run-queue time's window, where a preemption it triggers is no one's */
    int inner = (g_ctr_n && g_ctr_taskclock >= 0) || g_thread_taskclock;
    if (!exit) {
        if (g_helper_cpu) r->q[Q_HELPERS] = helpers_cpu(ts);
        if (g_cpu_split) read_rusage(r);
        if (!inner) read_cpu(ts, r);
        read_edge(ts, r, 0, inner);
    } else {
        read_edge(ts, r, 1, inner);
        if (!inner) read_cpu(ts, r);
        if (g_cpu_split) read_rusage(r);
        if (g_helper_cpu) r->q[Q_HELPERS] = helpers_cpu(ts);
    }
}
