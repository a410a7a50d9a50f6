/* The per-context stack of open stage calls: one Stack per context (asyncio
 * task, thread, copied context), held in a context variable. */
#ifndef INSTRUMENT_STACK_H
#define INSTRUMENT_STACK_H

#include "frame.h"

#pragma GCC visibility push(hidden)

extern PyObject *g_stack_var;               /* context variable holding the Stack */

int stack_init(void);                       /* the type and the context variable; 0, or -1 with an exception */
Stack *stack_current(int create);           /* this context's own stack; NULL: none yet (create=0), or failure */
Stack *stack_owned_by(PyObject *ctx);       /* the stack a context owns (borrowed), without entering it; NULL */
Stack *stack_visible(void);                 /* the stack this context sees, its own or inherited (borrowed); NULL */
int32_t current_node(void);                 /* the innermost open stage this context sees (a copied one: its parent's); 0 */

#pragma GCC visibility pop

#endif
