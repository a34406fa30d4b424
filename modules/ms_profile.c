/* ms_profile.c: the sampling profiler (moonserve --profile, GET /profile on the metrics
 * listener). While it runs, the budget's clock (ms_guard.c) ticks every millisecond of CPU and
 * each tick is one sample, counted under a stack:
 *
 * - Lua was running (the tick's program counter is in LuaJIT or in its compiled code), or a
 *   handler's coroutine had called into C: LuaJIT's profiler callback, at the next line that
 *   runs, dumps the running coroutine's frames (outermost first), and a C function the handler
 *   was in is added as its last frame.
 * - The core was running, outside any Lua: the sample is counted in the signal handler under
 *   "[core]" and the C function it was in. The core's callers are not walked: the core and
 *   its libraries keep no frame pointers, and an unwinder may take a lock (libgcc's) that the
 *   interrupted code holds.
 *
 * Program counters are named once the profile stops: a library's exported symbol, else the
 * symbol table of its file (the core's own static functions), else the file's name. */
#define _GNU_SOURCE
#include "ms_profile.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <ucontext.h>
#include <unistd.h>

#include <lauxlib.h>

LUA_API const char *luaJIT_profile_dumpstack(lua_State *L, const char *fmt, int depth,
                                             size_t *len);

/* Written by the dispatcher (ms_guard.c): the resume under way, 0 between resumes. */
extern volatile uint32_t ms_ffi_resume;

/* -- The loaded modules' code, found once a profile starts ----------------------------- */

#define MODULES_MAX 128
typedef struct {
    uintptr_t lo, hi;  /* an executable segment */
    uintptr_t bias;    /* the module's load address, which its symbols' values are from */
    char path[256];
    int luajit;        /* LuaJIT's own code */
} segment_t;
static segment_t segments[MODULES_MAX];
static int nsegments;

static int add_module(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size, (void)data;
    for (int i = 0; i < info->dlpi_phnum && nsegments < MODULES_MAX; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
            continue;
        segment_t *s = &segments[nsegments++];
        s->lo = info->dlpi_addr + ph->p_vaddr;
        s->hi = s->lo + ph->p_memsz;
        s->bias = info->dlpi_addr;
        const char *name = info->dlpi_name;
        if (name != NULL && name[0] != '\0') {
            snprintf(s->path, sizeof(s->path), "%s", name);
        } else { /* the program itself (luajit) */
            ssize_t n = readlink("/proc/self/exe", s->path, sizeof(s->path) - 1);
            s->path[n > 0 ? n : 0] = '\0';
        }
        uintptr_t lj = (uintptr_t)&lua_pushnil;
        s->luajit = lj >= s->lo && lj < s->hi;
    }
    return 0;
}

/* The segment that holds `pc`, or NULL (LuaJIT's compiled code, or an unknown page). From the
 * signal handler too: it reads the table only. */
static const segment_t *segment_of(uintptr_t pc)
{
    for (int i = 0; i < nsegments; i++)
        if (pc >= segments[i].lo && pc < segments[i].hi)
            return &segments[i];
    return NULL;
}

/* -- Samples ---------------------------------------------------------------------------- */

/* The core's samples, counted in the signal handler (no allocation there): a fixed table of
 * program counters, open addressing. */
#define CORE_SLOTS 4096
#define CORE_PROBES 32
typedef struct {
    uintptr_t pc;
    uint32_t n;
} core_slot_t;
static core_slot_t *core;
static uint32_t core_other;  /* samples past a full table */
static uint32_t core_taken;  /* core samples since the callback last ran */
static uintptr_t handler_pc; /* the C function a resumed handler was in at the last tick */

/* Lua's samples, counted in LuaJIT's callback (allocation is fine there): a stack and the C
 * function it was in -> a count. */
#define LUA_BUCKETS 4096
#define LUA_STACKS_MAX 20000
typedef struct lua_stack_s lua_stack_t;
struct lua_stack_s {
    lua_stack_t *next;
    uintptr_t pc; /* 0: none */
    uint32_t n;
    uint32_t hash;
    size_t len;
    char stack[];
};
static lua_stack_t **buckets;
static int nstacks;
static uint32_t lua_other; /* samples past LUA_STACKS_MAX stacks */
static volatile int running;

static uintptr_t signal_pc(void *ctx)
{
    const ucontext_t *uc = ctx;
#if defined(__x86_64__)
    return (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    return (uintptr_t)uc->uc_mcontext.pc;
#else
    (void)uc;
    return 0;
#endif
}

void ms_profile_signal(void *ctx)
{
    if (!running)
        return;
    uintptr_t pc = signal_pc(ctx);
    const segment_t *s = segment_of(pc);
    int in_lua = s == NULL || s->luajit; /* LuaJIT, or the code it compiled */
    if (in_lua)
        return; /* the callback counts it, at the next line that runs */
    if (ms_ffi_resume != 0) {
        handler_pc = pc; /* a handler called into C: the callback counts it, under its stack */
        return;
    }
    core_taken++;
    uint32_t h = (uint32_t)((pc >> 2) * 0x9e3779b97f4a7c15ull >> 52); /* 12 bits */
    for (int i = 0; i < CORE_PROBES; i++) {
        core_slot_t *slot = &core[(h + (uint32_t)i) & (CORE_SLOTS - 1)];
        if (slot->pc == pc || slot->pc == 0) {
            slot->pc = pc;
            slot->n++;
            return;
        }
    }
    core_other++;
}

static uint32_t hash_bytes(const char *p, size_t n, uintptr_t pc)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)p[i]) * 16777619u;
    return (h ^ (uint32_t)(pc >> 2)) * 16777619u;
}

void ms_profile_lua(lua_State *L, int samples, int vmstate)
{
    if (!running)
        return;
    int n = samples - (int)core_taken;
    core_taken = 0;
    uintptr_t pc = handler_pc;
    handler_pc = 0;
    if (n <= 0)
        return;
    size_t len;
    /* p: whole paths, shortened when the profile is read; F: module:function; Z and ';'
     * separate the frames; -64: the innermost 64, outermost first */
    const char *stack = luaJIT_profile_dumpstack(L, "pFZ;", -64, &len);
    /* The collector and the compiler run for the code that allocated or got hot: their time
     * goes under its stack. */
    const char *tail = vmstate == 'G' ? ";[gc]" : vmstate == 'J' ? ";[jit compiler]" : NULL;
    static char joined[16384];
    if (tail != NULL && len + strlen(tail) < sizeof(joined)) {
        memcpy(joined, stack, len);
        memcpy(joined + len, tail, strlen(tail));
        len += strlen(tail);
        stack = joined;
        pc = 0;
    }
    uint32_t h = hash_bytes(stack, len, pc);
    lua_stack_t **head = &buckets[h & (LUA_BUCKETS - 1)];
    for (lua_stack_t *e = *head; e != NULL; e = e->next)
        if (e->hash == h && e->pc == pc && e->len == len && memcmp(e->stack, stack, len) == 0) {
            e->n += (uint32_t)n;
            return;
        }
    lua_stack_t *e = nstacks < LUA_STACKS_MAX ? malloc(sizeof(*e) + len + 1) : NULL;
    if (e == NULL) {
        lua_other += (uint32_t)n;
        return;
    }
    memcpy(e->stack, stack, len);
    e->stack[len] = '\0';
    e->len = len, e->pc = pc, e->n = (uint32_t)n, e->hash = h;
    e->next = *head;
    *head = e;
    nstacks++;
}

static void clear(void)
{
    if (buckets != NULL)
        for (int i = 0; i < LUA_BUCKETS; i++)
            for (lua_stack_t *e = buckets[i], *next; e != NULL; e = next) {
                next = e->next;
                free(e);
            }
    free(buckets);
    free(core);
    buckets = NULL, core = NULL;
    nstacks = 0;
    core_other = core_taken = lua_other = 0;
    handler_pc = 0;
}

int ms_profile_begin(void)
{
    clear();
    core = calloc(CORE_SLOTS, sizeof(*core));
    buckets = calloc(LUA_BUCKETS, sizeof(*buckets));
    if (core == NULL || buckets == NULL) {
        clear();
        return -1;
    }
    nsegments = 0;
    dl_iterate_phdr(add_module, NULL);
    running = 1;
    return 0;
}

void ms_profile_end(void)
{
    running = 0;
}

/* -- Names for program counters ---------------------------------------------------------- */

typedef struct {
    const char *path;
    void *map;
    size_t size;
    const ElfW(Sym) *syms;
    size_t nsyms;
    const char *strs;
    size_t strs_size;
} symtab_t;

/* Maps `path` and finds its symbol table (SHT_SYMTAB), which a stripped file lacks. */
static int symtab_open(symtab_t *t, const char *path)
{
    memset(t, 0, sizeof(*t));
    t->path = path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(ElfW(Ehdr))) {
        close(fd);
        return -1;
    }
    t->size = (size_t)st.st_size;
    t->map = mmap(NULL, t->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (t->map == MAP_FAILED) {
        t->map = NULL;
        return -1;
    }
    const uint8_t *base = t->map;
    const ElfW(Ehdr) *eh = t->map;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_shentsize != sizeof(ElfW(Shdr)) ||
        eh->e_shoff > t->size || (size_t)eh->e_shnum * sizeof(ElfW(Shdr)) > t->size - eh->e_shoff)
        return -1;
    const ElfW(Shdr) *sh = (const ElfW(Shdr) *)(base + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum)
            continue;
        const ElfW(Shdr) *ss = &sh[sh[i].sh_link];
        if (sh[i].sh_offset > t->size || sh[i].sh_size > t->size - sh[i].sh_offset ||
            ss->sh_offset > t->size || ss->sh_size > t->size - ss->sh_offset)
            return -1;
        t->syms = (const ElfW(Sym) *)(base + sh[i].sh_offset);
        t->nsyms = sh[i].sh_size / sizeof(ElfW(Sym));
        t->strs = (const char *)(base + ss->sh_offset);
        t->strs_size = ss->sh_size;
        return 0;
    }
    return -1;
}

static const char *symtab_find(const symtab_t *t, uintptr_t off)
{
    for (size_t i = 0; i < t->nsyms; i++) {
        const ElfW(Sym) *s = &t->syms[i];
        if (ELF64_ST_TYPE(s->st_info) == STT_FUNC && s->st_name < t->strs_size &&
            off >= s->st_value && off - s->st_value < s->st_size)
            return t->strs + s->st_name;
    }
    return NULL;
}

static void symtab_close(symtab_t *t)
{
    if (t->map != NULL)
        munmap(t->map, t->size);
    t->map = NULL;
}

/* The symbol tables read for one report, a module each. */
static symtab_t tables[MODULES_MAX];
static int ntables;

/* Writes `pc`'s name into buf. */
static const char *name_of(uintptr_t pc, char *buf, size_t size)
{
    const segment_t *s = segment_of(pc);
    if (s == NULL) {
        snprintf(buf, size, "[compiled Lua]");
        return buf;
    }
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    if (dladdr1((void *)pc, &info, (void **)&sym, RTLD_DL_SYMENT) != 0 && info.dli_sname &&
        sym != NULL && pc - (uintptr_t)info.dli_saddr < sym->st_size)
        return info.dli_sname;
    symtab_t *t = NULL;
    for (int i = 0; i < ntables; i++)
        if (strcmp(tables[i].path, s->path) == 0)
            t = &tables[i];
    if (t == NULL && ntables < MODULES_MAX) {
        t = &tables[ntables++];
        symtab_open(t, s->path);
    }
    const char *name = t != NULL ? symtab_find(t, pc - s->bias) : NULL;
    if (name != NULL)
        return name;
    /* (a stripped library's own functions: one frame for all of them, where an offset each
     * would scatter them over frames no one can read) */
    const char *file = strrchr(s->path, '/');
    snprintf(buf, size, "%s", file ? file + 1 : s->path);
    return buf;
}

/* Pushes Lua stack `e` with its C functions named: a frame LuaJIT dumps as "@0x..." (a C
 * function of the core's or a library's, called through the Lua API), and the one the handler
 * had called at the tick. */
static void push_stack(lua_State *L, const lua_stack_t *e)
{
    char buf[320];
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (const char *p = e->stack, *end = e->stack + e->len; p < end;) {
        const char *semi = memchr(p, ';', (size_t)(end - p));
        const char *stop = semi != NULL ? semi + 1 : end;
        if (p[0] == '@' && stop - p > 3 && p[1] == '0' && p[2] == 'x') {
            luaL_addstring(&b, name_of((uintptr_t)strtoull(p + 1, NULL, 16), buf, sizeof(buf)));
            if (semi != NULL)
                luaL_addchar(&b, ';');
        } else {
            luaL_addlstring(&b, p, (size_t)(stop - p));
        }
        p = stop;
    }
    if (e->pc != 0) {
        luaL_addchar(&b, ';');
        luaL_addstring(&b, name_of(e->pc, buf, sizeof(buf)));
    }
    luaL_pushresult(&b);
}

/* Adds `n` samples to the stack on top of L in the table below it, and pops the stack. */
static void add_samples(lua_State *L, lua_Number n)
{
    lua_pushvalue(L, -1);
    lua_rawget(L, -3);
    lua_Number had = lua_tonumber(L, -1);
    lua_pop(L, 1);
    lua_pushnumber(L, had + n);
    lua_rawset(L, -3);
}

/* Pushes {[stack] = samples} onto L (C frames named, the folded stack format's lines without
 * their counts), then the samples in all (the ticks of the profile's last moment that no
 * callback came to count are not among them). */
int ms_profile_push(lua_State *L)
{
    char buf[320];
    lua_Number sum = core_other + lua_other;
    lua_createtable(L, 0, nstacks + 64);
    for (int i = 0; buckets != NULL && i < LUA_BUCKETS; i++)
        for (lua_stack_t *e = buckets[i]; e != NULL; e = e->next) {
            push_stack(L, e);
            add_samples(L, e->n);
            sum += e->n;
        }
    for (int i = 0; core != NULL && i < CORE_SLOTS; i++) {
        if (core[i].pc == 0)
            continue;
        lua_pushliteral(L, "[core];");
        lua_pushstring(L, name_of(core[i].pc, buf, sizeof(buf)));
        lua_concat(L, 2);
        add_samples(L, core[i].n);
        sum += core[i].n;
    }
    if (core_other + lua_other > 0) {
        lua_pushnumber(L, core_other + lua_other);
        lua_setfield(L, -2, "[samples past the profiler's tables]");
    }
    for (int i = 0; i < ntables; i++)
        symtab_close(&tables[i]);
    ntables = 0;
    lua_pushnumber(L, sum);
    clear();
    return 2;
}
