/* The switch hook of asyncio attribution: step_runner and iteration_runner. */
#ifndef INSTRUMENT_STEPS_H
#define INSTRUMENT_STEPS_H

#include "core.h"

#pragma GCC visibility push(hidden)
int steps_add_functions(PyObject *module);   /* step_runner, iteration_runner; 0 or -1 with an exception */
#pragma GCC visibility pop

#endif
