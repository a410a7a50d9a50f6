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

PyObject *mod_set_root_exit_hook(PyObject *m, PyObject *f) {
    if (f != Py_None && !PyCallable_Check(f))
        return PyErr_Format(PyExc_TypeError, "set_root_exit_hook needs a callable or None, not %.100s", Py_TYPE(f)->tp_name);
    PyObject *old = g_root_exit_hook;
    g_root_exit_hook = f == Py_None ? NULL : Py_NewRef(f);
    Py_XDECREF(old);
    Py_RETURN_NONE;
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
    if (f != Py_None && !PyCallable_Check(f))
        return PyErr_Format(PyExc_TypeError, "set_probe_hook needs a callable or None, not %.100s", Py_TYPE(f)->tp_name);
    PyObject *old = g_probe_hook;
    g_probe_hook = f == Py_None ? NULL : Py_NewRef(f);
    g_probe_due = 0;
    Py_XDECREF(old);
    Py_RETURN_NONE;
}
