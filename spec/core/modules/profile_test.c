/* profile_test.c: the sampling profiler's tables and names (modules/ms_profile.c), fed as the
 * clock feeds them, with a real LuaJIT state: a tick in the core is counted under the function
 * it was in, named from this program's own symbol table (a static function) or a library's
 * exported symbols; a tick in a handler's C call goes under the handler's Lua stack; the
 * collector's time under the code that ran; a full table counts what it cannot hold; a file
 * that is not ELF, or one cut short, names nothing and breaks nothing. */
#define _GNU_SOURCE /* (ms_profile.c: dladdr1, dl_iterate_phdr, REG_RIP) */
#include "test.h"

#include <lauxlib.h>
#include <lualib.h>
#include <sys/mman.h>

#include "../../../modules/ms_profile.c"

volatile uint32_t ms_ffi_resume; /* (ms_guard.c's, for the dispatcher) */

/* A function of this program's own, never exported: only the symbol table names it. */
static __attribute__((noinline, used)) int core_marker(int x)
{
    return x * 3 + 1;
}

/* A tick at program counter `pc`, as the clock's signal handler gives it. */
static void tick_at(uintptr_t pc)
{
    ucontext_t uc;
    memset(&uc, 0, sizeof(uc));
#if defined(__x86_64__)
    uc.uc_mcontext.gregs[REG_RIP] = (greg_t)pc;
#elif defined(__aarch64__)
    uc.uc_mcontext.pc = pc;
#endif
    ms_profile_signal(&uc);
}

/* The samples of stack `key` in the table on top of L. */
static lua_Number count_of(lua_State *L, const char *key)
{
    lua_getfield(L, -1, key);
    lua_Number n = lua_tonumber(L, -1);
    lua_pop(L, 1);
    return n;
}

TEST(profile_counts_a_core_tick_under_the_function_it_was_in)
{
    lua_State *L = luaL_newstate();
    ASSERT_EQ(0, ms_profile_begin());
    uintptr_t pc = (uintptr_t)&core_marker + 2;
    for (int i = 0; i < 3; i++)
        tick_at(pc);
    tick_at((uintptr_t)&lua_pushnil + 1);      /* in LuaJIT: the callback's, not counted here */
    tick_at((uintptr_t)&memchr);               /* a library's exported function */
    ms_profile_end();
    tick_at(pc); /* after the end: not counted */
    ASSERT_EQ(2, ms_profile_push(L));
    ASSERT_EQ(4, lua_tonumber(L, -1)); /* (LuaJIT's tick waits for a callback that never came) */
    lua_pop(L, 1);
    ASSERT_EQ(3, count_of(L, "[core];core_marker"));
    lua_pushnil(L);
    int stacks = 0;
    while (lua_next(L, -2) != 0) {
        stacks++;
        lua_pop(L, 1);
    }
    ASSERT_EQ(2, stacks); /* core_marker's and memchr's (however libc names its variant) */
    lua_close(L);
}

static int sample_here(lua_State *L)
{
    ms_profile_lua(L, (int)luaL_checkinteger(L, 1), (int)luaL_checkinteger(L, 2));
    return 0;
}

TEST(profile_counts_a_lua_tick_under_its_stack_and_a_handlers_c_call_after_it)
{
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    lua_register(L, "sample_here", sample_here);
    ASSERT_EQ(0, ms_profile_begin());
    /* a core tick, then the callback with 3 samples: 2 are Lua's */
    tick_at((uintptr_t)&core_marker);
    ASSERT_EQ(0, luaL_dostring(L, "local function deep(n, s) sample_here(n, s) end\n"
                                  "function run(n, s) deep(n, s) end\n"
                                  "run(3, string.byte('I'))"));
    /* a handler's tick in C (a resume under way): under the stack of the next callback */
    ms_ffi_resume = 7;
    tick_at((uintptr_t)&core_marker);
    ms_ffi_resume = 0;
    ASSERT_EQ(0, luaL_dostring(L, "run(1, string.byte('C'))"));
    /* the collector's tick */
    ASSERT_EQ(0, luaL_dostring(L, "run(4, string.byte('G'))"));
    ms_profile_end();
    ASSERT_EQ(2, ms_profile_push(L));
    lua_pop(L, 1);
    /* one stack a line, outermost first; the C function LuaJIT shows as @0x... is named */
    /* (a chunk loaded from a string is "[string]"; its main function has no name: line 0) */
    ASSERT_EQ(2, count_of(L, "[string]:0;[string]:run;[string]:deep;sample_here"));
    ASSERT_EQ(1, count_of(L, "[string]:0;[string]:run;[string]:deep;sample_here;core_marker"));
    ASSERT_EQ(4, count_of(L, "[string]:0;[string]:run;[string]:deep;sample_here;[gc]"));
    ASSERT_EQ(1, count_of(L, "[core];core_marker"));
    lua_close(L);
}

TEST(profile_counts_ticks_past_its_tables_as_such)
{
    lua_State *L = luaL_newstate();
    ASSERT_EQ(0, ms_profile_begin());
    /* more distinct program counters than the core's table holds, in a library's code */
    const segment_t *big = NULL;
    for (int i = 0; i < nsegments; i++)
        if (!segments[i].luajit && segments[i].hi - segments[i].lo > 4 * (CORE_SLOTS + 500))
            big = &segments[i];
    ASSERT(big != NULL);
    int ticks = CORE_SLOTS + 500;
    for (int i = 0; i < ticks; i++)
        tick_at(big->lo + 4 * (uintptr_t)i);
    ms_profile_end();
    ASSERT_EQ(2, ms_profile_push(L));
    ASSERT_EQ(ticks, lua_tonumber(L, -1));
    lua_pop(L, 1);
    /* every tick is in the table, those it could not hold under a line of their own */
    ASSERT(count_of(L, "[samples past the profiler's tables]") >= 500);
    lua_Number sum = 0;
    lua_pushnil(L);
    while (lua_next(L, -2) != 0) {
        sum += lua_tonumber(L, -1);
        lua_pop(L, 1);
    }
    ASSERT_EQ(ticks, sum);
    lua_close(L);
}

TEST(profile_names_compiled_code_and_refuses_files_that_are_not_elf)
{
    ASSERT_EQ(0, ms_profile_begin());
    char buf[64];
    /* a page of code no module holds: LuaJIT's compiled traces live in such pages */
    void *page = mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT(page != MAP_FAILED);
    ASSERT_STR_EQ("[compiled Lua]", name_of((uintptr_t)page + 16, buf, sizeof(buf)));
    munmap(page, 4096);
    ASSERT_STR_EQ("lua_pushnil", name_of((uintptr_t)&lua_pushnil, buf, sizeof(buf)));
    symtab_t t;
    char path[] = "/tmp/ms-profile-XXXXXX";
    int fd = mkstemp(path);
    ASSERT(fd >= 0);
    ASSERT(write(fd, "not an ELF file at all, but long enough to be read as one........", 66) ==
           66);
    close(fd);
    ASSERT_EQ(-1, symtab_open(&t, path));
    symtab_close(&t);
    /* an ELF header whose section table lies past the file's end */
    ElfW(Ehdr) eh;
    memset(&eh, 0, sizeof(eh));
    memcpy(eh.e_ident, ELFMAG, SELFMAG);
    eh.e_shentsize = sizeof(ElfW(Shdr));
    eh.e_shoff = 1 << 20;
    eh.e_shnum = 40;
    fd = open(path, O_WRONLY | O_TRUNC);
    ASSERT(write(fd, &eh, sizeof(eh)) == (ssize_t)sizeof(eh));
    close(fd);
    ASSERT_EQ(-1, symtab_open(&t, path));
    symtab_close(&t);
    unlink(path);
    ASSERT_EQ(-1, symtab_open(&t, "/nonexistent/moonserve"));
    ms_profile_end();
    lua_State *L = luaL_newstate();
    ms_profile_push(L); /* (clears the tables) */
    lua_close(L);
}

TEST_MAIN()
