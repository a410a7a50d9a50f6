/* Which reads pull the scheduler's preemptions into the window they bracket.
 *
 * A loop of fixed work pinned to one core (run it beside a CPU hog pinned to the same core): ITER iterations of
 * ~100 us of work bracketed by a read before and after, then ~900 us of work outside.  Per read kind: the loop's
 * involuntary switches (getrusage RUSAGE_THREAD ru_nivcsw) and the share of the loop's wall inside the 100 us
 * windows, both the outer window (the reads inside it: the SDK's enter/exit before issue 40) and the inner one
 * (the wall timestamps taken inside the reads: a preemption a read triggers falls outside).
 *
 *   gcc -O2 -o /tmp/rd benchmarks/read_disturbance.c -lpthread && taskset -c 0 /tmp/rd [iterations]
 *   (with e.g. `taskset -c 0 python -c 'while True: pass' &` beside it)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int64_t ns(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static volatile uint64_t sink;
static void work(long n) {
    uint64_t x = sink;
    for (long k = 0; k < n; k++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    sink = x;
}

static int tc_fd = -1, grp_fd = -1, sched_fd = -1, stat_fd = -1;
static clockid_t helper_clock;
static volatile int helper_run = 1;

static int perf_open(uint64_t config, int group, uint64_t fmt) {
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = config;
    a.read_format = fmt;
    return (int)syscall(SYS_perf_event_open, &a, 0, -1, group, PERF_FLAG_FD_CLOEXEC);
}

static void *helper(void *arg) {   /* a pool thread: wakes every ms, works a little */
    while (helper_run) {
        work(20000);
        struct timespec d = {0, 1000000};
        nanosleep(&d, NULL);
    }
    return arg;
}

static const char *kinds[] = {"none", "monotonic", "thread_clock", "process_clock", "getrusage", "schedstat",
                              "taskclock_read", "taskclock_group", "other_thread_clock", "proc_task_stat", NULL};

static void do_read(int kind) {
    char buf[512];
    uint64_t v[16];
    struct rusage u;
    switch (kind) {
    case 1: sink += ns(CLOCK_MONOTONIC); break;
    case 2: sink += ns(CLOCK_THREAD_CPUTIME_ID); break;
    case 3: sink += ns(CLOCK_PROCESS_CPUTIME_ID); break;
    case 4: getrusage(RUSAGE_THREAD, &u); sink += u.ru_nivcsw; break;
    case 5: sink += pread(sched_fd, buf, sizeof buf, 0); break;
    case 6: sink += read(tc_fd, v, sizeof v); break;
    case 7: sink += read(grp_fd, v, sizeof v); break;
    case 8: sink += ns(helper_clock); break;
    case 9: sink += pread(stat_fd, buf, sizeof buf, 0); break;
    default: break;
    }
}

static long per_us(void) {   /* iterations of work() per microsecond, the quietest of several tries */
    long best = 0;
    for (int k = 0; k < 20; k++) {
        int64_t a = ns(CLOCK_THREAD_CPUTIME_ID);
        work(1000000);
        int64_t d = ns(CLOCK_THREAD_CPUTIME_ID) - a;
        long r = (long)(1000000.0 * 1000 / (double)d);
        if (r > best) best = r;
    }
    return best;
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 3000;
    tc_fd = perf_open(PERF_COUNT_SW_TASK_CLOCK, -1, 0);
    uint64_t gf = PERF_FORMAT_GROUP | PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING | PERF_FORMAT_ID;
    grp_fd = perf_open(PERF_COUNT_SW_TASK_CLOCK, -1, gf);
    perf_open(PERF_COUNT_SW_PAGE_FAULTS, grp_fd, gf);
    perf_open(PERF_COUNT_SW_CONTEXT_SWITCHES, grp_fd, gf);
    perf_open(PERF_COUNT_SW_CPU_MIGRATIONS, grp_fd, gf);
    sched_fd = open("/proc/thread-self/schedstat", O_RDONLY);
    pthread_t h;
    pthread_create(&h, NULL, helper, NULL);
    pthread_getcpuclockid(h, &helper_clock);
    usleep(10000);
    char path[64];
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    long self = syscall(SYS_gettid), other = -1;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.' && atol(e->d_name) != self) other = atol(e->d_name);
    closedir(d);
    snprintf(path, sizeof path, "/proc/self/task/%ld/stat", other);
    stat_fd = open(path, O_RDONLY);
    if (tc_fd < 0 || grp_fd < 0 || sched_fd < 0 || stat_fd < 0) fprintf(stderr, "some sources unavailable\n");
    long r = per_us();
    printf("%-20s %10s %12s %12s %10s\n", "read", "nivcsw", "outer_share", "inner_share", "loop_s");
    for (int rep = 0; rep < 2; rep++)
        for (int kind = 0; kinds[kind]; kind++) {
            struct rusage u0, u1;
            int64_t outer = 0, inner = 0, w0 = ns(CLOCK_MONOTONIC);
            getrusage(RUSAGE_THREAD, &u0);
            for (int i = 0; i < iters; i++) {
                int64_t a = ns(CLOCK_MONOTONIC);
                do_read(kind);
                int64_t b = ns(CLOCK_MONOTONIC);
                work(100 * r);
                int64_t c = ns(CLOCK_MONOTONIC);
                do_read(kind);
                int64_t dd = ns(CLOCK_MONOTONIC);
                outer += dd - a, inner += c - b;
                work(900 * r);
            }
            getrusage(RUSAGE_THREAD, &u1);
            int64_t w = ns(CLOCK_MONOTONIC) - w0;
            printf("%-20s %10ld %12.3f %12.3f %10.2f\n", kinds[kind], u1.ru_nivcsw - u0.ru_nivcsw,
                   (double)outer / (double)w, (double)inner / (double)w, (double)w / 1e9);
            fflush(stdout);
        }
    helper_run = 0;
    pthread_join(h, NULL);
    return 0;
}
