/* guard_test.c: the Lua heap's allocator (modules/ms_guard.c) with a real LuaJIT state: a
 * small block the VM frees is handed back for its next allocation of that size and of no
 * other; sizes outside the kept range go to LuaJIT's allocator, and so do all kept blocks
 * once they pass twice the heap; the heap counts kept blocks as freed; and a VM that
 * allocates and collects through it keeps every value whole. */
#define _GNU_SOURCE
#include "test.h"

#include <lauxlib.h>
#include <lualib.h>

#include "../../../modules/ms_guard.c"
#include "../../../modules/ms_profile.c"

static lua_State *L;
static lua_Alloc vm_alloc;
static void *vm_ud;

/* The one VM a process binds (ms_guard.c), with its allocator wrapped and no cap reached. */
static void vm_once(void)
{
    if (L != NULL)
        return;
    L = luaL_newstate();
    luaL_openlibs(L);
    if (ms_guard_memory(L, (size_t)1 << 52) == 0)
        vm_alloc = lua_getallocf(L, &vm_ud);
}

static void *take(size_t n)
{
    return vm_alloc(vm_ud, NULL, 0, n);
}

static void give(void *p, size_t n)
{
    vm_alloc(vm_ud, p, n, 0);
}

TEST(heap_hands_a_freed_small_block_back_for_its_size_only)
{
    vm_once();
    ASSERT(vm_alloc == heap_alloc);
    size_t heap0 = heap, kept0 = kept_bytes;
    void *p = take(40);
    ASSERT(p != NULL);
    memset(p, 0xab, 40);
    ASSERT_EQ(heap0 + 40, heap);
    give(p, 40);
    ASSERT_EQ(heap0, heap);
    ASSERT_EQ(kept0 + 40, kept_bytes);
    void *q = take(48); /* another size: not the kept block */
    ASSERT(q != p);
    void *r = take(40);
    ASSERT(r == p);
    ASSERT_EQ(kept0, kept_bytes);
    give(q, 48);
    give(r, 40);
    ASSERT_EQ(heap0, heap);
}

TEST(heap_leaves_sizes_outside_its_range_to_luajits_allocator)
{
    vm_once();
    size_t kept0 = kept_bytes;
    void *tiny = take(8), *big = take(KEEP_MAX + 1), *edge = take(KEEP_MAX);
    ASSERT(tiny != NULL && big != NULL && edge != NULL);
    give(tiny, 8);
    give(big, KEEP_MAX + 1);
    ASSERT_EQ(kept0, kept_bytes);
    give(edge, KEEP_MAX);
    ASSERT_EQ(kept0 + KEEP_MAX, kept_bytes);
    ASSERT(take(KEEP_MAX) == edge);
    /* a resize goes to LuaJIT's allocator, and so does the block it leaves */
    void *g = vm_alloc(vm_ud, edge, KEEP_MAX, 64);
    ASSERT(g != NULL);
    ASSERT_EQ(kept0, kept_bytes);
    give(g, 64);
    ASSERT_EQ(kept0 + 64, kept_bytes);
    ASSERT(take(64) == g);
}

static int by_address(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)*(void *const *)a, y = (uintptr_t)*(void *const *)b;
    return x < y ? -1 : x > y;
}

TEST(heap_gives_every_kept_block_back_past_twice_the_heap)
{
    vm_once();
    enum { N = (KEEP_BYTES / 256) * 2 };
    static void *blocks[N];
    for (int i = 0; i < N; i++) {
        blocks[i] = take(256);
        ASSERT(blocks[i] != NULL);
    }
    void *other = take(200);
    give(other, 200);
    ASSERT(kept[200] == other);
    size_t heap0 = heap;
    for (int i = 0; i < N; i++) {
        give(blocks[i], 256);
        ASSERT(kept_bytes <= KEEP_BYTES || kept_bytes <= 2 * heap);
    }
    /* past it once (the heap shrank as they were freed): every size's blocks went back, the
     * 200-byte one too, and the rest came in */
    ASSERT(kept[200] == NULL);
    ASSERT(kept_bytes > 0);
    ASSERT_EQ(heap0 - (size_t)N * 256, heap);
    /* the kept ones come back, each once, then LuaJIT's allocator's */
    int back = 0;
    while (kept[256] != NULL)
        blocks[back++] = take(256);
    ASSERT(back > 0);
    ASSERT_EQ(0, kept_bytes);
    blocks[back] = take(256);
    ASSERT(blocks[back] != NULL);
    qsort(blocks, (size_t)back + 1, sizeof(*blocks), by_address);
    for (int i = 0; i < back; i++)
        ASSERT(blocks[i] != blocks[i + 1]);
    for (int i = 0; i <= back; i++)
        give(blocks[i], 256);
}

TEST(heap_keeps_a_collected_vms_values_whole)
{
    vm_once();
    const char *chunk =
        "local keep = {}\n"
        "for round = 1, 20 do\n"
        "  for i = 1, 5000 do\n"
        "    local t = { i, tostring(i) .. ':' .. round, { x = i } }\n"
        "    if i % 50 == 0 then keep[#keep + 1] = t end\n"
        "  end\n"
        "  collectgarbage()\n"
        "end\n"
        "for _, t in ipairs(keep) do\n"
        "  assert(t[2]:match('^(%d+):') == tostring(t[1]) and t[3].x == t[1])\n"
        "end\n"
        "return #keep\n";
    ASSERT_EQ(0, luaL_dostring(L, chunk));
    ASSERT_EQ(2000, lua_tonumber(L, -1));
    lua_pop(L, 1);
    ASSERT(kept_bytes > 0);
}

TEST_MAIN()
