#define PY_SSIZE_T_CLEAN
#include <Python.h>

static struct PyModuleDef native_module = {PyModuleDef_HEAD_INIT, "instrument._native", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&native_module); }
