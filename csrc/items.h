/* Items per stage: instrument.add(name, value) adds to the innermost open stage
 * of the current context (tokens, samples, bytes, ...), summed per node slot. */
#ifndef INSTRUMENT_ITEMS_H
#define INSTRUMENT_ITEMS_H

#include "core.h"
#include "stats.h"

#define ITEMS_MAX 32              /* distinct item names per stage; more fold into "(other)" */

struct ItemStat {
    PyObject *name;               /* interned str, held */
    int64_t n;                    /* sum of the integer values */
    double x;                     /* sum of the float values */
    uint64_t calls;               /* add() calls */
    uint64_t floats;              /* of which with a float value */
};

#pragma GCC visibility push(hidden)

int items_merge(NodeStats *d, const NodeStats *s);     /* 0, or -1 when out of memory */
void items_clear(NodeStats *s);
PyObject *items_to_list(const NodeStats *s);          /* [(name, int_total, float_total, calls, float_calls)] */
int items_parse(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **name, int64_t *n,
                double *x, int *is_float);                     /* add()'s arguments; 0, or -1 with an exception */
int items_add(NodeStats *s, PyObject *name, int64_t n, double x, int is_float);   /* 0, or -1 out of memory */

#pragma GCC visibility pop

#endif
