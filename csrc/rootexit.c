/* The root-exit hook and the machine probe (rootexit.h). */
#include "rootexit.h"

PyObject *g_root_exit_hook = NULL;

void root_exit_notify(void) {
    PyObject *h = g_root_exit_hook;
    if (!h) return;
    Py_INCREF(h);   /* the hook may replace itself while it runs */
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);   /* a Region exit carries the function's exception */
    PyObject *r = PyObject_CallNoArgs(h);
    if (!r) internal_failure("root exit hook"); else Py_DECREF(r);
    PyErr_Restore(et, ev, tb);
    Py_DECREF(h);
}

/* Puts f (a callable, or None: none) in *slot; `name` is the setter's, for the error. */
static PyObject *set_hook(PyObject **slot, PyObject *f, const char *name) {
    if (f != Py_None && !PyCallable_Check(f))
        return PyErr_Format(PyExc_TypeError, "%s needs a callable or None, not %.100s", name, Py_TYPE(f)->tp_name);
    PyObject *old = *slot;
    *slot = f == Py_None ? NULL : Py_NewRef(f);
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

PyObject *mod_set_root_exit_hook(PyObject *m, PyObject *f) {
    return set_hook(&g_root_exit_hook, f, "set_root_exit_hook");
}

PyObject *g_probe_hook = NULL;
int64_t g_probe_due = 0;

void probe_notify(void) {
    PyObject *h = g_probe_hook;
    Py_INCREF(h);
    g_probe_due = INT64_MAX;   /* not again while it runs (its own stages, another thread) */
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *r = PyObject_CallNoArgs(h);
    long long wait = r ? PyLong_AsLongLong(r) : -1;
    if (!r || (wait == -1 && PyErr_Occurred())) {
        internal_failure("machine probe");
        wait = 1000000000;
    }
    Py_XDECREF(r);
    if (h == g_probe_hook) g_probe_due = now_ns() + (wait > 0 ? wait : 0);   /* counted from its end */
    PyErr_Restore(et, ev, tb);
    Py_DECREF(h);
}

PyObject *mod_set_probe_hook(PyObject *m, PyObject *f) {
    PyObject *r = set_hook(&g_probe_hook, f, "set_probe_hook");
    if (r) g_probe_due = 0;
    return r;
}
