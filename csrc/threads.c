/* The thread registry: a ThreadState per thread, owned by its thread dict; an
 * ending thread's slots are folded into g_retired. */
#include "threads.h"

#include <stdlib.h>
#include <unistd.h>

#include "gil.h"
#include "taskclock.h"   /* TaskThread, freed here (plain memory, no call into it) */

ThreadState *g_threads = NULL;
_Thread_local ThreadState *tls_ts = NULL;
StatsArray g_retired = {NULL, 0};
int32_t g_n_threads = 0;
uint64_t g_threads_gen = 0;

static PyObject *g_ts_key = NULL;        /* the thread dict entry that owns the state */

static void ThreadState_dealloc(ThreadState *ts) {
    /* Runs on the ending thread when its thread dict is cleared: fold its slots. */
    if (ts->tasks) free(ts->tasks->spans);   /* asyncio attribution's state (taskclock.h): plain memory */
    free(ts->tasks);
    ts->tasks = NULL;
    struct timespec t;   /* its CPU clock at its end: its slots' calls took no more */
    int have = clock_gettime(ts->cpu_clock_id, &t) == 0;
    int64_t cpu = have ? (int64_t)t.tv_sec * 1000000000 + t.tv_nsec : -1;
    if (stats_array_merge(&g_retired, &ts->stats, have ? cpu : INT64_MAX / 2) < 0) g_internal++;
    stats_array_clear(&ts->stats);
    if (ts->perf_gen) perf_set_close(&ts->perf);
    if (ts->clk_state == 1) perf_clock_close(&ts->clk);
    perf_clock_close(&ts->sw);
    if (ts->sched_fd >= 0) close(ts->sched_fd);
    gil_slot_free(ts->gil);
    g_n_threads--;
    g_threads_gen++;
    if (ts->prev) ts->prev->next = ts->next; else if (g_threads == ts) g_threads = ts->next;
    if (ts->next) ts->next->prev = ts->prev;
    if (tls_ts == ts) tls_ts = NULL;
    PyObject_Free(ts);
}

static PyTypeObject ThreadState_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._native._ThreadState",
    .tp_basicsize = sizeof(ThreadState),
    .tp_dealloc = (destructor)ThreadState_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
};

int threads_init(void) {
    if (PyType_Ready(&ThreadState_Type) < 0) return -1;
    g_ts_key = PyUnicode_InternFromString("instrument._native.thread");
    return g_ts_key ? 0 : -1;
}

ThreadState *ts_create(void) {
    PyObject *d = PyThreadState_GetDict();
    if (!d) return NULL;
    ThreadState *ts = PyObject_New(ThreadState, &ThreadState_Type);
    if (!ts) return NULL;
    ts->stats.v = NULL;
    ts->stats.n = 0;
    ts->perf_gen = 0;
    ts->clk_state = 0;
    ts->clk.fd = -1;
    ts->clk.page = NULL;
    if (perf_switch_open(&ts->sw) < 0) ts->sw.page = NULL;
    ts->tasks = NULL;
    ts->sched_fd = -1;
    ts->gil = NULL;
    if (pthread_getcpuclockid(pthread_self(), &ts->cpu_clock_id) != 0) ts->cpu_clock_id = CLOCK_THREAD_CPUTIME_ID;
    static uint64_t next_serial = 0;
    ts->serial = ++next_serial;
    uint64_t z = ts->serial * 0x9E3779B97F4A7C15ULL + (uint64_t)now_ns();   /* splitmix64 of serial and time */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    ts->rng = (z ^ (z >> 31)) | 1;
    ts->native_id = PyThread_get_thread_native_id();
    g_n_threads++;
    g_threads_gen++;
    ts->prev = NULL;
    ts->next = g_threads;
    if (g_threads) g_threads->prev = ts;
    g_threads = ts;
    if (PyDict_SetItem(d, g_ts_key, (PyObject *)ts) < 0) {
        Py_DECREF(ts);
        return NULL;
    }
    Py_DECREF(ts);          /* the thread dict owns it */
    tls_ts = ts;
    return ts;
}
