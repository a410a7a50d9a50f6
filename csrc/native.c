#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "nvtx_emit.h"

static struct PyModuleDef native_module = {PyModuleDef_HEAD_INIT, "instrument._native", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *m = PyModule_Create(&native_module);
    if (!m) return NULL;
    if (nvtx_add_functions(m) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
