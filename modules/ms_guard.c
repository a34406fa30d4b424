/* ms_guard.c: runaway Lua code. A resume of a handler, a timer's run or a light thread that
 * runs past its CPU budget (limits.handler_cpu_ms) without yielding, or that grows the Lua heap
 * past its cap (limits.lua_memory), is stopped with an error, compiled loops included, and
 * the worker goes on.
 *
 * The CPU budget: LuaJIT's profiler runs in line mode ("l", every 10 ms of CPU), which makes
 * every trace recorded from then on check the profiler's flag at each change of source line
 * and go back to the interpreter when it is set (lj_record.c, IR_PROF). Its SIGPROF handler
 * is wrapped: after LuaJIT's own work, a resume that has used its budget gets a count hook of
 * 1, which the interpreter runs at its next instruction; the hook raises there, as luajit.c's
 * own Ctrl-C does. An error raised from the profiler's callback itself would leave LuaJIT's
 * state half-changed (lj_profile.c), hence the hook.
 *
 * The memory cap: the VM's allocator is wrapped (lua_setallocf) and counts the heap; a resume
 * that takes it past the cap is stopped by the same hook (see GRACE below). The wrapper also
 * keeps the small blocks the VM frees for its next allocations of their sizes (see KEEP_MAX).
 *
 * The same clock feeds the sampling profiler (ms_profile.c), ticking every millisecond while
 * a profile runs.
 *
 * The dispatcher numbers its resumes (ms_ffi_resume, 0 between them) and reads ms_ffi_stop
 * after each; nothing else is paid per resume. What cannot be stopped until it returns: a
 * long C call (a pattern match, table.sort without a Lua comparator, string.rep), an xpcall
 * message handler and a __gc finalizer (they run with hooks off). */
#define _GNU_SOURCE
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ms_guard.h"
#include "ms_profile.h"

/* LuaJIT's own API (luajit.h, lauxlib.h of LuaJIT 2.1), declared here: a rock builds against
 * the include directory LuaRocks names, which may hold PUC Lua 5.1's headers. The symbols come
 * from the luajit that loads the module. */
typedef void (*luaJIT_profile_callback)(void *data, lua_State *L, int samples, int vmstate);
LUA_API void luaJIT_profile_start(lua_State *L, const char *mode, luaJIT_profile_callback cb,
                                  void *data);
LUA_API void luaJIT_profile_stop(lua_State *L);
LUALIB_API void luaL_traceback(lua_State *L, lua_State *L1, const char *msg, int level);

/* Written by the dispatcher: the resume under way (a number that changes with each; 0: none)
 * and its budget in milliseconds of CPU. */
MS_EXPORT volatile uint32_t ms_ffi_resume;
MS_EXPORT volatile uint32_t ms_ffi_budget_ms;
/* Set here when the resume under way is to be stopped, to why (MS_STOP_CPU, MS_STOP_MEMORY):
 * the dispatcher then calls ms_ffi_stop_settle(). */
enum { MS_STOP_CPU = 1, MS_STOP_MEMORY = 2 };
MS_EXPORT volatile int ms_ffi_stop;

/* The clock's period in ms: the budget is seen to run out within two of them; a profile
 * samples at each. */
#define TICK_BUDGET 10
#define TICK_PROFILE 1

static lua_State *vm;          /* the state that runs the dispatcher; its own code is spared */
static int budget_on;          /* the CPU budget runs on the clock */
static int profiling;          /* a profile samples on the clock */
static int clock_ms;           /* the clock's period now; 0: stopped */
static pthread_t loop_thread;  /* the only thread that runs Lua */
static struct sigaction luajit_action; /* LuaJIT's SIGPROF handler, which ours calls first */
static volatile int hooked;    /* the hook raised in the resumed code */
static int refused;            /* the resumed code went past the cap */
static uint32_t seen_run;      /* the resume the last tick saw, and the thread's CPU then */
static struct timespec seen_cpu;
static lua_Hook saved_hook;    /* a hook that was there before ours (coverage, a debugger) */
static int saved_mask, saved_count;
static char where[2048];       /* the traceback of the last stop */

/* The memory cap. A resume's first allocation past the cap arms the hook, which stops the code
 * at its next instruction, where its traceback says what allocated. Until then GRACE bytes
 * past the cap are let through; an allocation past those fails, and LuaJIT raises "not enough
 * memory" where it was made (one huge allocation, or compiled code that allocates on and is
 * not brought back to the interpreter: a SIGPROF does that when the clock runs). */
#define GRACE (1u << 20)
static lua_Alloc base_alloc;   /* LuaJIT's allocator, which ours calls */
static void *base_ud;
static size_t heap, cap;       /* the heap's bytes, as allocated through us; the cap */
static int exempt;             /* the hook itself is allocating */

static void stop_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    if (L == vm || !ms_ffi_stop)
        return;
    exempt = 1;
    if (!hooked) {
        hooked = 1;
        luaL_traceback(L, L, NULL, 0);
        const char *tb = lua_tostring(L, -1);
        size_t n = tb != NULL ? strlen(tb) : 0;
        if (n >= sizeof(where))
            n = sizeof(where) - 1;
        memcpy(where, tb != NULL ? tb : "", n);
        where[n] = '\0';
        lua_pop(L, 1);
    }
    /* Raised again at each instruction until the resumed coroutine is dead: a pcall in the
     * code that ran out cannot keep it going. */
    if (ms_ffi_stop == MS_STOP_MEMORY)
        lua_pushliteral(L, "not enough memory (limits.lua_memory)");
    else
        lua_pushliteral(L, "CPU budget exceeded (limits.handler_cpu_ms)");
    exempt = 0;
    lua_error(L);
}

/* Arms the hook for `why`, keeping a hook that was there before ours. */
static void arm(int why)
{
    if (!ms_ffi_stop) {
        lua_Hook h = lua_gethook(vm);
        if (h != stop_hook) {
            saved_hook = h;
            saved_mask = lua_gethookmask(vm);
            saved_count = lua_gethookcount(vm);
        }
        ms_ffi_stop = why;
    }
    /* (again at each tick: LuaJIT puts back the hook mask it saved around the profiler's
     * callback, which may take an arming made meanwhile away) */
    lua_sethook(vm, stop_hook, LUA_MASKCOUNT, 1);
}

static int64_t ms_between(const struct timespec *a, const struct timespec *b)
{
    return (int64_t)(b->tv_sec - a->tv_sec) * 1000 + (b->tv_nsec - a->tv_nsec) / 1000000;
}

/* In the signal handler, on the loop thread. */
static void check(void)
{
    uint32_t run = ms_ffi_resume;
    if (run == 0) {
        seen_run = 0;
        return;
    }
    struct timespec now;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    if (run != seen_run) { /* the first tick of this resume: its clock starts here */
        seen_run = run;
        seen_cpu = now;
        return;
    }
    if (ms_ffi_stop) {
        if (!hooked)
            arm(ms_ffi_stop);
        return;
    }
    if (ms_between(&seen_cpu, &now) >= (int64_t)ms_ffi_budget_ms)
        arm(MS_STOP_CPU);
}

static void on_sigprof(int sig, siginfo_t *info, void *ctx)
{
    int saved_errno = errno;
    if (!pthread_equal(pthread_self(), loop_thread)) {
        /* ITIMER_PROF's signal goes to any thread of the process (a thread pool's too):
         * only the loop thread may touch the VM */
        pthread_kill(loop_thread, SIGPROF);
        errno = saved_errno;
        return;
    }
    if (luajit_action.sa_flags & SA_SIGINFO)
        luajit_action.sa_sigaction(sig, info, ctx);
    else if (luajit_action.sa_handler != SIG_DFL && luajit_action.sa_handler != SIG_IGN)
        luajit_action.sa_handler(sig);
    if (profiling)
        ms_profile_signal(ctx);
    if (budget_on)
        check();
    errno = saved_errno;
}

static void on_profile(void *data, lua_State *L, int samples, int vmstate)
{
    (void)data;
    if (profiling) {
        exempt = 1; /* (its stack dump may grow LuaJIT's buffer: never refused) */
        ms_profile_lua(L, samples, vmstate);
        exempt = 0;
    }
}

/* Runs the clock at the period its users need now, or stops it. (Each start and stop of
 * LuaJIT's profiler in line mode flushes the compiled traces: a profile's start and end cost
 * a recompilation.) */
static int set_clock(lua_State *L)
{
    int want = profiling ? TICK_PROFILE : budget_on ? TICK_BUDGET : 0;
    if (want == clock_ms)
        return 0;
    if (clock_ms) {
        /* (LuaJIT puts back the SIGPROF action from before its start, our wrapper's going with
         * it; a tick still on its way from another thread is then ignored, not fatal) */
        luaJIT_profile_stop(L);
        signal(SIGPROF, SIG_IGN);
        clock_ms = 0;
    }
    if (!want)
        return 0;
    char mode[16];
    snprintf(mode, sizeof(mode), "li%d", want);
    luaJIT_profile_start(L, mode, on_profile, NULL);
    if (sigaction(SIGPROF, NULL, &luajit_action) != 0)
        return -errno;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_sigprof;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGPROF, &sa, NULL) != 0) {
        int err = -errno;
        luaJIT_profile_stop(L);
        return err;
    }
    clock_ms = want;
    return 0;
}

/* The state and thread the guards serve: one a process. */
static int bind_vm(lua_State *L)
{
    if (vm != NULL && vm != L)
        return -EBUSY;
    vm = L;
    loop_thread = pthread_self();
    return 0;
}

int ms_guard_cpu(lua_State *L)
{
    int rc = bind_vm(L);
    if (rc < 0 || budget_on)
        return rc;
    budget_on = 1;
    rc = set_clock(L);
    if (rc < 0)
        budget_on = 0;
    return rc;
}

int ms_guard_profile(lua_State *L, int on)
{
    int rc = bind_vm(L);
    if (rc < 0 || on == profiling)
        return rc < 0 ? rc : on ? -EALREADY : 0;
    if (on && ms_profile_begin() != 0)
        return -ENOMEM;
    if (!on)
        ms_profile_end();
    profiling = on;
    rc = set_clock(L);
    if (rc < 0 && on) {
        profiling = 0;
        ms_profile_end();
    }
    return rc;
}

/* heap_alloc's path past the cap (the heap counted already): only the resumed code is
 * stopped; the dispatcher's own allocations, the hook's, and frees go through. */
static __attribute__((noinline)) void *over_cap(void *ptr, size_t osize, size_t nsize)
{
    size_t old = ptr != NULL ? osize : 0;
    if (nsize > old && ms_ffi_resume != 0 && !exempt) {
        if (!ms_ffi_stop) {
            refused = 1;
            arm(MS_STOP_MEMORY);
            if (clock_ms) /* (a trace checks the profiler's flag at its next line) */
                pthread_kill(loop_thread, SIGPROF);
        }
        if (heap > cap + GRACE) {
            heap -= nsize - old;
            return NULL; /* LuaJIT raises "not enough memory" where it was made */
        }
    }
    return base_alloc(base_ud, ptr, osize, nsize);
}

/* Small blocks the VM freed, kept by their exact size and handed back for its next request
 * of that size: a pop and a push instead of LuaJIT's allocator, whose free of a small block
 * (dlmalloc's, which coalesces) costs about a hundred instructions. A request's tables,
 * strings and cdata come in a few sizes that recur on every request. An exact size makes
 * any block safe to hand out again, whichever allocator made it: LuaJIT passes each block's
 * size on free and resize. The heap counts kept blocks as freed.
 *
 * A collection frees about a cycle's garbage, the live heap's size at the default pause,
 * which the next cycle's allocations take back: kept blocks may reach twice the heap (at
 * least KEEP_BYTES), as much as LuaJIT's allocator would hold free. Past that, all go back
 * to it at once, so that sizes no longer asked for (a start-up's, a burst's) do not hold
 * memory for good, and a heap that shrank lets go of what it kept. */
#define KEEP_MAX 512          /* sizes kept: 16 to this many bytes */
#define KEEP_BYTES (1u << 20) /* bytes that may be kept, whatever the heap */
static void *kept[KEEP_MAX + 1]; /* by size, each block's first word the next */
static size_t kept_bytes;

static __attribute__((noinline)) void kept_release(void)
{
    for (size_t n = 16; n <= KEEP_MAX; n++)
        while (kept[n] != NULL) {
            void *p = kept[n];
            kept[n] = *(void **)p;
            base_alloc(base_ud, p, n, 0);
        }
    kept_bytes = 0;
}

/* Called from LuaJIT for every allocation, resize and free of the VM (lua_setallocf); `osize`
 * is the block's size, as LuaJIT always passes it. Below the cap this is a few instructions,
 * then a kept block or a tail call. The heap is counted before LuaJIT's allocator runs: a block
 * it fails to get (the system is out of memory) stays counted. */
static void *heap_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    (void)ud;
    heap += nsize - (ptr != NULL ? osize : 0);
    if (__builtin_expect(heap > cap, 0))
        return over_cap(ptr, osize, nsize);
    if (ptr == NULL) {
        if (nsize - 16 <= KEEP_MAX - 16 && kept[nsize] != NULL) {
            void *p = kept[nsize];
            kept[nsize] = *(void **)p;
            kept_bytes -= nsize;
            return p;
        }
    } else if (nsize == 0 && osize - 16 <= KEEP_MAX - 16) {
        if (__builtin_expect(kept_bytes + osize > KEEP_BYTES && kept_bytes + osize > 2 * heap, 0))
            kept_release();
        *(void **)ptr = kept[osize];
        kept[osize] = ptr;
        kept_bytes += osize;
        return NULL;
    }
    return base_alloc(base_ud, ptr, osize, nsize);
}

int ms_guard_memory(lua_State *L, size_t bytes)
{
    int rc = bind_vm(L);
    if (rc < 0 || base_alloc != NULL)
        return rc;
    cap = bytes;
    base_alloc = lua_getallocf(L, &base_ud);
    heap = (size_t)lua_gc(L, LUA_GCCOUNT, 0) * 1024 + (size_t)lua_gc(L, LUA_GCCOUNTB, 0);
    lua_setallocf(L, heap_alloc, NULL);
    return 0;
}

MS_EXPORT int ms_ffi_stop_settle(void)
{
    int s = hooked || refused ? ms_ffi_stop : 0;
    ms_ffi_stop = 0;
    hooked = refused = 0;
    if (vm != NULL && lua_gethook(vm) == stop_hook) {
        lua_sethook(vm, saved_hook, saved_hook != NULL ? saved_mask : 0, saved_count);
        saved_hook = NULL;
    }
    return s;
}

MS_EXPORT const char *ms_ffi_stop_where(void)
{
    return where;
}
