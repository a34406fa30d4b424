/* lua_fuzz.c: a parser of moonserve's Lua side on arbitrary bytes, in LuaJIT. The target
 * (spec/fuzz/lua/TARGET.lua, named at build time as MS_LUA_TARGET) returns a function of the
 * input that raises only for a finding: a parser that raised where it answers nil and an
 * error, or that broke a promise it makes (a bound, a type). A raise aborts, so that libFuzzer
 * keeps the input; a parser that loops is a timeout, which libFuzzer reports too.
 *
 * libFuzzer sees the C it instruments, not the Lua that LuaJIT runs: a line hook gives it the
 * Lua side's coverage, as pairs of lines run one after the other, counted in its "extra
 * counters" (a section it reads as its own coverage). */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static lua_State *L;
static int target_ref;

#define PAIRS 65536
__attribute__((section("__libfuzzer_extra_counters"))) static uint8_t pairs[PAIRS];
static uintptr_t last_line;

static void line_hook(lua_State *state, lua_Debug *ar)
{
    if (lua_getinfo(state, "S", ar) == 0)
        return;
    /* (a chunk's source name is interned for the process's life: its address names it) */
    uintptr_t line = ((uintptr_t)ar->source * 31 + (uintptr_t)ar->currentline) * 2654435761u;
    pairs[(line ^ (last_line >> 1)) % PAIRS]++;
    last_line = line;
}

/* The state's objects go with it at the exit, so that LeakSanitizer sees only real leaks. */
static void close_state(void)
{
    lua_close(L);
}

/* OpenSSL's algorithms, fetched once by moonserve.crypto and kept for the process's life. */
const char *__lsan_default_suppressions(void);
__attribute__((visibility("default"))) const char *__lsan_default_suppressions(void)
{
    return "leak:libcrypto.so\n";
}

static void setup(void)
{
    L = luaL_newstate();
    luaL_openlibs(L);
    lua_getglobal(L, "package");
    lua_pushstring(L, MS_SOURCE_ROOT "/lua/?.lua;" MS_SOURCE_ROOT "/lua/?/init.lua;"
                      MS_SOURCE_ROOT "/spec/fuzz/lua/?.lua");
    lua_setfield(L, -2, "path");
    lua_pop(L, 1);
    lua_getglobal(L, "require");
    lua_pushstring(L, MS_LUA_TARGET);
    if (lua_pcall(L, 1, 1, 0) != 0 || !lua_isfunction(L, -1)) {
        fprintf(stderr, "lua_fuzz: target %s: %s\n", MS_LUA_TARGET, lua_tostring(L, -1));
        abort();
    }
    target_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_sethook(L, line_hook, LUA_MASKLINE, 0);
    atexit(close_state);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (L == NULL)
        setup();
    lua_rawgeti(L, LUA_REGISTRYINDEX, target_ref);
    lua_pushlstring(L, (const char *)data, size);
    if (lua_pcall(L, 1, 0, 0) != 0) {
        fprintf(stderr, "lua_fuzz: %s: %s\n", MS_LUA_TARGET, lua_tostring(L, -1));
        abort();
    }
    return 0;
}
