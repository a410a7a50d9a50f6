/* The state shared by the units (declared in core.h) and the once-only warnings. */
#include "core.h"

int g_enabled = 1;
int g_cpu_clock = 1;
int g_nvtx = 0;
uint32_t g_epoch = 1;
PyObject *g_hook_enter = NULL, *g_hook_exit = NULL;

int g_ctr_n = 0;
perf_event_desc g_ctr_desc[PERF_MAX_EVENTS];
int g_ctr_exclude_kernel = 0;
int g_ctr_taskclock = -1;
uint32_t g_ctr_gen = 1;
int g_ctr_status[PERF_MAX_EVENTS];
int g_ctr_status_known = 0;
int g_ctr_excl_used = 0;
int g_ctr_rdpmc = 0;

double g_budget = 0.0;
double g_read_cost = 0.0;
double g_read_spent = 0.0;
uint64_t g_read_spent_calls = 0;
int64_t g_cpu_bias = 0;
int64_t g_inner_bias = 0;
int g_switches = 0;
int64_t g_wall_bias[2] = {0, 0};
int g_cpu_split = 0;
int g_run_queue = 0;
int g_helper_cpu = 0;
int g_thread_taskclock = 0;

int64_t g_open_frames = 0;
uint64_t g_unmatched = 0, g_out_of_order = 0, g_cross_thread = 0, g_internal = 0, g_folded = 0;
PyObject *g_warn_once = NULL;

void warn_once(const char *key, const char *fmt, ...) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *k = PyUnicode_FromString(key);
    if (k && g_warn_once && PySet_Contains(g_warn_once, k) == 0 && PySet_Add(g_warn_once, k) == 0) {
        va_list ap;
        va_start(ap, fmt);
        PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
        va_end(ap);
        const char *text = msg ? PyUnicode_AsUTF8(msg) : NULL;
        if (text && PyErr_WarnEx(PyExc_RuntimeWarning, text, 1) < 0) PyErr_Clear();
        Py_XDECREF(msg);
    }
    Py_XDECREF(k);
    PyErr_Clear();
    PyErr_Restore(et, ev, tb);
}

int interrupt_handed_back(void) {
    if (!PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) return 0;
    PyErr_Clear();
    PyErr_SetInterrupt();   /* raised again at the program's next check, in its own code */
    return 1;
}

void internal_failure(const char *what) {
    if (interrupt_handed_back()) return;   /* Ctrl-C inside the SDK's Python code: the program's */
    g_internal++;
    PyErr_Clear();
    warn_once(what, "instrument: internal failure in %s; measurement goes on without it", what);
}
