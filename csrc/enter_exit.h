/* Stage enter and exit: the hot path. */
#ifndef INSTRUMENT_ENTER_EXIT_H
#define INSTRUMENT_ENTER_EXIT_H

#include "stage.h"
#include "threads.h"

#pragma GCC visibility push(hidden)

void stage_enter(Stage *self);
void stage_exit(Stage *self, int error);
int counters_ready(ThreadState *ts);        /* the thread's counter group, opened on its first stage; 1 */
PyObject *stage_calibrate(int n);           /* calibrate.c: the configuration's costs; sets g_read_cost, the biases */

#pragma GCC visibility pop

#endif
