/* GIL wait, sampled from outside the waiting threads (gil.h).  Self-contained: it calls no other unit. */
#include "gil.h"   /* first: Python.h sets the feature macros */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The GIL's state around the futex a thread was seen waiting on: CPython's _gil_runtime_state holds a few words
 * (interval, last holder, locked, switch number), then a condition variable (whose futex a waiter sleeps on), a
 * mutex, and for forced switching a second condition variable and mutex, about 210 bytes in all with glibc. */
#define GIL_BELOW 128
#define GIL_ABOVE 192
#define LEARN_NS 500000000        /* how long gil_learn() looks for the waiting thread */
#define PERIOD_MIN_NS 1000000     /* at most 1,000 samples a second per thread */
#define PERIOD_MAX_NS 100000000
#define IDLE_NS 100000000         /* while no stage is open anywhere, the sampler waits for one this long at most */

struct GilSlot {
    int fd;                       /* /proc/self/task/<tid>/syscall */
    uint32_t epoch;               /* g_fork_epoch it was made in */
    uint64_t blocked, gil;        /* samples that found the thread blocked; of them, on the GIL (atomic) */
};

int g_gil = 0;
volatile int g_gil_idle = 0;
static uintptr_t g_lo, g_hi;      /* the GIL's futexes lie in [g_lo, g_hi) */
static int g_learned = 0;         /* 1 found, -1 not, 0 not tried */
static char g_why[200] = "not tried yet";
static const double g_share = 0.005;   /* the most of one core the sampler's CPU time may take */
static uint32_t g_fork_epoch = 1;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;   /* the slots' table, and the figures below */
static pthread_cond_t g_wake = PTHREAD_COND_INITIALIZER;   /* a stage opened while the sampler was idle */
static GilSlot **g_slots = NULL;
static int g_n = 0, g_cap = 0;
static int g_running = 0;         /* the sampler thread runs in this process */
static volatile int g_on = 0;     /* it samples (else it idles) */
static long g_tid = 0;
static int64_t g_started = 0, g_cpu = 0, g_period = PERIOD_MIN_NS;
static uint64_t g_ticks = 0, g_reads = 0;

static int64_t clock_of(clockid_t id) {
    struct timespec t;
    return clock_gettime(id, &t) == 0 ? (int64_t)t.tv_sec * 1000000000 + t.tv_nsec : -1;
}

static void nap(int64_t ns) {
    struct timespec t = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
}

/* A syscall file's text: "running" (on a CPU or ready for one), "-1 sp pc" (blocked outside a system call), or
 * "nr arg0 ...": 1 blocked, 2 blocked in a futex call on the GIL, 0 not blocked or unreadable. */
static int classify(int fd, uintptr_t *addr) {
    char buf[128];
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    if (n <= 0 || buf[0] == 'r') return 0;
    buf[n] = 0;
    char *end;
    long nr = strtol(buf, &end, 10);
    if (nr != SYS_futex) return 1;
    uintptr_t a = (uintptr_t)strtoull(end, NULL, 16);
    if (addr) *addr = a;
    return g_learned == 1 && a >= g_lo && a < g_hi ? 2 : 1;
}

static void sample_all(void) {
    pthread_mutex_lock(&g_mu);
    for (int k = 0; k < g_n; k++) {
        int c = classify(g_slots[k]->fd, NULL);
        if (c) __atomic_add_fetch(&g_slots[k]->blocked, 1, __ATOMIC_RELAXED);
        if (c == 2) __atomic_add_fetch(&g_slots[k]->gil, 1, __ATOMIC_RELAXED);
    }
    g_reads += (uint64_t)g_n;
    g_ticks++;
    pthread_mutex_unlock(&g_mu);
}

/* Waits for a stage to open (gil_wake), IDLE_NS at most: a wake that crossed the check is late by that much. */
static void idle(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_nsec += IDLE_NS % 1000000000;
    t.tv_sec += IDLE_NS / 1000000000 + t.tv_nsec / 1000000000;
    t.tv_nsec %= 1000000000;
    pthread_mutex_lock(&g_mu);
    g_gil_idle = 1;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    while (g_gil_idle && __atomic_load_n(&g_open_frames, __ATOMIC_RELAXED) <= 0)
        if (pthread_cond_timedwait(&g_wake, &g_mu, &t) != 0) break;
    g_gil_idle = 0;
    pthread_mutex_unlock(&g_mu);
}

void gil_wake(void) {
    pthread_mutex_lock(&g_mu);
    g_gil_idle = 0;
    pthread_cond_signal(&g_wake);
    pthread_mutex_unlock(&g_mu);
}

/* The sampler: never takes the GIL.  SCHED_BATCH: its wake-ups do not preempt the threads it samples, and at the
 * default weight it still gets its turn beside CPU hogs (a lower one would wait for hundreds of ms there).
 * Its period keeps its whole CPU time (reads, wake-ups) within g_share of one core; while no stage is open
 * anywhere it reads nothing. */
static void *sampler(void *arg) {
    (void)arg;
    __atomic_store_n(&g_tid, (long)syscall(SYS_gettid), __ATOMIC_RELAXED);
    struct sched_param sp = {0};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
    int64_t cpu0 = clock_of(CLOCK_THREAD_CPUTIME_ID), last = cpu0;
    double per_tick = 0;   /* a tick's CPU time, wake-up included, averaged (not the first: the thread's start) */
    for (uint64_t ticks = 0;; ticks++) {
        if (!g_on) {   /* turned off: it looks again now and then (configure turns it on without a wake) */
            nap(IDLE_NS);
            continue;
        }
        if (__atomic_load_n(&g_open_frames, __ATOMIC_RELAXED) <= 0) {
            idle();
            continue;
        }
        nap(g_period);
        if (!g_on) continue;   /* turned off meanwhile */
        sample_all();
        int64_t cpu = clock_of(CLOCK_THREAD_CPUTIME_ID), d = cpu - last;
        if (ticks) per_tick = per_tick ? 0.9 * per_tick + 0.1 * (double)d : (double)d;
        last = cpu;
        double p = per_tick / g_share;
        pthread_mutex_lock(&g_mu);
        g_cpu = cpu - cpu0;
        g_period = p < PERIOD_MIN_NS ? PERIOD_MIN_NS : p > PERIOD_MAX_NS ? PERIOD_MAX_NS : (int64_t)p;
        pthread_mutex_unlock(&g_mu);
    }
    return NULL;
}

static void forked_child(void) {   /* only the forking thread lives on: no sampler, no slot of the parent's */
    pthread_mutex_init(&g_mu, NULL);
    pthread_cond_init(&g_wake, NULL);
    g_gil_idle = 0;
    g_n = 0;
    g_running = 0;
    g_tid = 0;
    g_fork_epoch++;
}

static int start_sampler(void) {
    static int atfork = 0;
    if (!atfork && pthread_atfork(NULL, NULL, forked_child) == 0) atfork = 1;
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&at, 64 * 1024);
    int err = pthread_create(&th, &at, sampler, NULL);
    pthread_attr_destroy(&at);
    if (err) {
        snprintf(g_why, sizeof(g_why), "the sampler thread could not start: %s", strerror(err));
        return -1;
    }
    g_running = 1;
    g_started = clock_of(CLOCK_MONOTONIC);
    return 0;
}

typedef struct { long tid; } Learner;

static void *wait_for_gil(void *arg) {
    __atomic_store_n(&((Learner *)arg)->tid, (long)syscall(SYS_gettid), __ATOMIC_SEQ_CST);
    PyGILState_STATE st = PyGILState_Ensure();   /* waits: the learning thread holds the GIL throughout */
    PyGILState_Release(st);
    return NULL;
}

/* Watch the waiting thread's syscall file until it shows the same futex twice, 1 ms apart. */
static uintptr_t watch(Learner *l) {
    int fd = -1;
    uintptr_t seen = 0;
    for (int64_t t0 = clock_of(CLOCK_MONOTONIC); clock_of(CLOCK_MONOTONIC) - t0 < LEARN_NS; nap(1000000)) {
        long tid = __atomic_load_n(&l->tid, __ATOMIC_SEQ_CST);
        if (!tid) continue;
        if (fd < 0) {
            char path[64];
            snprintf(path, sizeof(path), "/proc/self/task/%ld/syscall", tid);
            if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
                snprintf(g_why, sizeof(g_why), "%s is not readable: %s", path, strerror(errno));
                return 0;
            }
        }
        uintptr_t a = 0;
        if (classify(fd, &a) && a && a == seen) break;
        seen = a;
    }
    if (fd >= 0) close(fd);
    return seen;
}

int gil_learn(void) {
#ifdef Py_GIL_DISABLED
    g_learned = -1;
    snprintf(g_why, sizeof(g_why), "no GIL: a free-threaded build");
#endif
    if (g_learned) return g_learned == 1 ? 0 : -1;
    Learner l = {0};
    pthread_t th;
    int err = pthread_create(&th, NULL, wait_for_gil, &l);
    if (err) {
        snprintf(g_why, sizeof(g_why), "a thread to wait for the GIL could not start: %s", strerror(err));
        return g_learned = -1;
    }
    snprintf(g_why, sizeof(g_why), "no thread was seen waiting for the GIL in a futex call within %d ms",
             LEARN_NS / 1000000);
    uintptr_t a = watch(&l);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(th, NULL);
    Py_END_ALLOW_THREADS
    if (!a) return g_learned = -1;
    g_lo = a - GIL_BELOW, g_hi = a + GIL_ABOVE;
    g_learned = 1;
    g_why[0] = 0;
    return 0;
}

void gil_enable(int on) {
    if (on && gil_learn() < 0) on = 0;
    if (on && !g_running && start_sampler() < 0) on = 0;
    g_on = g_gil = on;
}

GilSlot *gil_slot_new(void) {
    if (!g_gil || g_learned != 1) return NULL;
    if (!g_running && start_sampler() < 0) return NULL;   /* a forked child: its own sampler */
    GilSlot *s = calloc(1, sizeof(GilSlot));
    if (!s) return NULL;
    s->epoch = g_fork_epoch;
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/task/%ld/syscall", (long)syscall(SYS_gettid));
    if ((s->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) { free(s); return NULL; }
    pthread_mutex_lock(&g_mu);
    if (g_n == g_cap) {
        int cap = g_cap ? 2 * g_cap : 16;
        GilSlot **v = realloc(g_slots, (size_t)cap * sizeof(GilSlot *));
        if (!v) { pthread_mutex_unlock(&g_mu); close(s->fd); free(s); return NULL; }
        g_slots = v, g_cap = cap;
    }
    g_slots[g_n++] = s;
    pthread_mutex_unlock(&g_mu);
    return s;
}

void gil_slot_free(GilSlot *s) {
    if (!s) return;
    pthread_mutex_lock(&g_mu);
    for (int k = 0; k < g_n; k++)
        if (g_slots[k] == s) { g_slots[k] = g_slots[--g_n]; break; }
    pthread_mutex_unlock(&g_mu);
    close(s->fd);
    free(s);
}

int gil_read(GilSlot *s, int64_t *blocked, int64_t *gil) {
    if (s->epoch != g_fork_epoch) return 0;
    *blocked = (int64_t)__atomic_load_n(&s->blocked, __ATOMIC_RELAXED);
    *gil = (int64_t)__atomic_load_n(&s->gil, __ATOMIC_RELAXED);
    return 1;
}

long gil_sampler_tid(void) { return g_running ? __atomic_load_n(&g_tid, __ATOMIC_RELAXED) : 0; }

PyObject *gil_status(void) {
    pthread_mutex_lock(&g_mu);
    int64_t cpu = g_cpu, period = g_period, since = g_running ? clock_of(CLOCK_MONOTONIC) - g_started : 0;
    uint64_t ticks = g_ticks, reads = g_reads;
    int threads = g_n;
    pthread_mutex_unlock(&g_mu);
    return Py_BuildValue("{s:O,s:s,s:s,s:d,s:L,s:L,s:K,s:K,s:i,s:d,s:l}", "enabled", g_gil ? Py_True : Py_False,
                         "mechanism", g_learned == 1 ? "futex sampling of /proc/self/task/<tid>/syscall" : "none",
                         "reason", g_why, "cpu_share_max", g_share, "sampler_cpu_ns", (long long)cpu,
                         "period_ns", (long long)period, "ticks", (unsigned long long)ticks,
                         "reads", (unsigned long long)reads, "threads", threads, "seconds", (double)since / 1e9,
                         "tid", gil_sampler_tid());
}
