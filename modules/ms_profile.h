/* ms_profile.h: the sampling profiler (ms_profile.c), fed by the budget's clock (ms_guard.c). */
#ifndef MS_PROFILE_H
#define MS_PROFILE_H

#include <lua.h>

/** Clears the samples and starts counting them; 0, or -1 when out of memory. */
int ms_profile_begin(void);

/** Stops counting (the samples stay until ms_profile_push). */
void ms_profile_end(void);

/** A tick of the clock, from its SIGPROF handler on the loop's thread; `ctx` its ucontext. */
void ms_profile_signal(void *ctx);

/** LuaJIT's profiler callback: `samples` ticks since the last, `L` the running coroutine. */
void ms_profile_lua(lua_State *L, int samples, int vmstate);

/**
 * Pushes the samples onto L as a table {[folded stack] = count}, frames outermost first and
 * separated by ';', then their number in all; clears them. Returns 2.
 */
int ms_profile_push(lua_State *L);

#endif
