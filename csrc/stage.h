/* The Python types users hold: Stage (a named stage, a context manager whose
 * __enter__/__exit__ are cached callables) and Region (a function called inside
 * a stage). */
#ifndef INSTRUMENT_STAGE_H
#define INSTRUMENT_STAGE_H

#include "core.h"

typedef struct Stage {
    PyObject_HEAD
    PyObject *name;
    PyObject *bound[2];   /* cached __enter__/__exit__ callables, so `with` allocates nothing */
    void *nvtx_message;   /* registered string in the current NVTX domain */
    uint32_t nvtx_gen;    /* domain generation the message was registered in */
    uint32_t color, category;
} Stage;

#pragma GCC visibility push(hidden)

extern PyTypeObject Stage_Type, Region_Type;

int stage_types_init(void);                 /* readies the types; 0, or -1 with an exception */
int check_name(PyObject *name);             /* 0, or -1 with the exception a bad stage name raises */
PyObject *stage_new(PyObject *name, PyObject *color, uint32_t category);   /* NULL with an exception */
PyObject *mod_set_decorator(PyObject *m, PyObject *f);   /* set_decorator(f): f(stage, func) is `@stage` on func */

#pragma GCC visibility pop

#endif
