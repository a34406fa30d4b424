/* ms_budget.h: the CPU budget of a resume (ms_budget.c), started from ms_core.c. */
#ifndef MS_BUDGET_H
#define MS_BUDGET_H

#include <lua.h>

#include "moonserve.h"

/**
 * Starts the budget's clock in this process: LuaJIT's profiler in line mode and the SIGPROF
 * handler that stops a resume past its budget. `L` is the state that runs the dispatcher (its
 * own code is never stopped), on the thread that runs the loop. Once a process; 0, or a
 * negative errno (-EBUSY: started already for another state).
 */
int ms_budget_start(lua_State *L);

#endif
