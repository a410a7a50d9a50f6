#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "perf.h"

static struct PyModuleDef native_module = {PyModuleDef_HEAD_INIT, "instrument._native", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *m = PyModule_Create(&native_module);
    if (!m) return NULL;
    if (perf_add_types(m) < 0) return NULL;
    return m;
}
