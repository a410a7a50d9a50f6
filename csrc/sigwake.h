/* A signal's wake-up for a watcher thread: a handler put in front of CPython's own for a signal, which writes the
 * signal's number to a pipe and then runs CPython's handler.  Python runs its signal handlers in the main thread
 * between bytecodes; a thread reading the pipe learns of the signal where the main thread is blocked in a native
 * call that does not return on it.  A later signal.signal() for that signal replaces both (CPython installs its own
 * handler again): the program's own handler takes the signal over. */
#ifndef INSTRUMENT_SIGWAKE_H
#define INSTRUMENT_SIGWAKE_H

#include "core.h"

#pragma GCC visibility push(hidden)

/* sigwake_chain(signum, fd): in front of the handler CPython has for signum; writes go to fd (non-blocking) while
 * the process is this one and fd is still the pipe it was (a fork's child, or a program that closed it and opened
 * another file under its number, gets nothing written). */
PyObject *mod_sigwake_chain(PyObject *m, PyObject *args);
/* sigwake_fd(fd): the pipe the chained handlers write to, from now on, in this process (a fork's child's own) */
PyObject *mod_sigwake_fd(PyObject *m, PyObject *fd);

#pragma GCC visibility pop

#endif
