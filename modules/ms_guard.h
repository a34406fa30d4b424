/* ms_guard.h: runaway Lua code (ms_guard.c): the CPU budget of a resume and the memory cap of
 * the Lua heap, started from ms_core.c; and the profiler's clock. */
#ifndef MS_GUARD_H
#define MS_GUARD_H

#include <stddef.h>

#include <lua.h>

#include "moonserve.h"

/**
 * Starts the budget's clock in this process: LuaJIT's profiler in line mode and the SIGPROF
 * handler that stops a resume past its budget. `L` is the state that runs the dispatcher (its
 * own code is never stopped), on the thread that runs the loop. Once a process; 0, or a
 * negative errno (-EBUSY: started already for another state).
 */
int ms_guard_cpu(lua_State *L);

/**
 * Starts (`on`) or stops the sampling profiler (ms_profile.c) on the same clock, which ticks
 * every millisecond of CPU while it runs. 0, or a negative errno (-EALREADY: a profile runs).
 */
int ms_guard_profile(lua_State *L, int on);

/**
 * Caps the Lua heap of `L`'s VM at `bytes`: past it, an allocation of a resumed coroutine
 * fails with a memory error and the resume is stopped (ms_ffi_stop). Allocations between
 * resumes (the dispatcher's own) are counted, never refused. The VM's small blocks are then
 * kept when freed and reused by size (a worker without a cap passes 2^52). Once a process, on
 * the loop's thread (a later call changes nothing); 0, or a negative errno.
 */
int ms_guard_memory(lua_State *L, size_t bytes);

#endif
