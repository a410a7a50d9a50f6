/* The readings of one boundary (readings.h). */
#include "readings.h"   /* first: Python.h sets the feature macros */

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HELPERS_MAX_THREADS 16   /* beyond this many threads running stages, helper CPU is not read (too costly) */
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

/* The process's CPU time less that of every thread that has run a stage (live or ended). */
int64_t helpers_cpu(ThreadState *ts) {
    if (g_n_threads > HELPERS_MAX_THREADS) return -1;
    int64_t proc = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
    if (proc < 0) return -1;
    int64_t ours = g_retired_cpu;
    for (ThreadState *t = g_threads; t; t = t->next) {
        int64_t c = clock_ns(t == ts ? CLOCK_THREAD_CPUTIME_ID : t->cpu_clock_id);
        if (c >= 0) t->cpu_seen = c;   /* a thread ending meanwhile keeps its last value */
        ours += t->cpu_seen;
    }
    return HELPERS_BASE + proc - ours;
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
    if (g_ctr_n && ts->perf_gen == g_ctr_gen) {
        perf_set_read(&ts->perf, &r->c);
        r->ctr_gen = g_ctr_gen;
        if (g_ctr_taskclock >= 0 && r->c.running[g_ctr_taskclock]) {
            r->q[Q_CPU] = (int64_t)r->c.value[g_ctr_taskclock];
            r->cpu_src = 2;
        }
    }
    if (!r->cpu_src && g_cpu_clock && (r->q[Q_CPU] = thread_cpu(ts)) >= 0) r->cpu_src = 1;
    r->tq = now_ns();
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
    if (!exit) {   /* the CPU window innermost: the other reads' own CPU time stays out of it */
        if (g_run_queue) r->q[Q_RQ] = sched_run_delay(ts);
        if (g_helper_cpu) r->q[Q_HELPERS] = helpers_cpu(ts);
        if (g_cpu_split) read_rusage(r);
        read_cpu(ts, r);
    } else {
        read_cpu(ts, r);
        if (g_cpu_split) read_rusage(r);
        if (g_helper_cpu) r->q[Q_HELPERS] = helpers_cpu(ts);
        if (g_run_queue) r->q[Q_RQ] = sched_run_delay(ts);
    }
}
