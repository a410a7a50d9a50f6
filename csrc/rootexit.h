/* A callback after every outermost stage exit (a stage with no enclosing open
 * stage in its context), once its call is recorded: lets a worker persist its
 * snapshot per completed request (instrument.exporters.multiproc). */
#ifndef INSTRUMENT_ROOTEXIT_H
#define INSTRUMENT_ROOTEXIT_H

#include "core.h"

#pragma GCC visibility push(hidden)

extern PyObject *g_root_exit_hook;   /* NULL: none, and the hot path makes no call */

/* Calls the hook with no arguments; keeps a pending exception; a failing hook is an internal failure. */
void root_exit_notify(void);
/* set_root_exit_hook(f or None) */
PyObject *mod_set_root_exit_hook(PyObject *m, PyObject *f);

/* The machine probe: after an outermost stage exit at or past g_probe_due (now_ns()), f() runs; it returns the ns
 * from its end until it is due again.  NULL: none, and the hot path compares nothing. */
extern PyObject *g_probe_hook;
extern int64_t g_probe_due;
void probe_notify(void);
/* set_probe_hook(f or None) */
PyObject *mod_set_probe_hook(PyObject *m, PyObject *f);

#pragma GCC visibility pop

#endif
