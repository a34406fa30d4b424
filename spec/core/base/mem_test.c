/* mem_test.c: the counted allocator, the recycle lists and the per-request pool. */
#include "test.h"

#include "../../../core/base/mem.c"

TEST(mem_counts_every_alloc_realloc_and_free)
{
    ms_mem_stats_t before = ms_mem_stats;
    char *p = ms_mem_alloc(10);
    ASSERT_EQ(before.allocs + 1, ms_mem_stats.allocs);
    p = ms_mem_realloc(p, 100); /* an existing block: a realloc, not an alloc */
    ASSERT_EQ(before.allocs + 1, ms_mem_stats.allocs);
    ASSERT_EQ(before.reallocs + 1, ms_mem_stats.reallocs);
    char *q = ms_mem_realloc(NULL, 8); /* realloc of NULL is an allocation */
    ASSERT_EQ(before.allocs + 2, ms_mem_stats.allocs);
    ASSERT_EQ(before.reallocs + 1, ms_mem_stats.reallocs);
    ms_mem_free(p);
    ms_mem_free(q);
    ms_mem_free(NULL); /* not counted */
    ASSERT_EQ(before.frees + 2, ms_mem_stats.frees);
    char *d = ms_mem_strdup("moon");
    ASSERT_STR_EQ("moon", d);
    ASSERT_EQ(before.allocs + 3, ms_mem_stats.allocs);
    ms_mem_free(d);
    ASSERT(ms_mem_strdup(NULL) == NULL);
    ASSERT_EQ(before.allocs + 3, ms_mem_stats.allocs);
}

static int destroyed;

static void destroy(void *p)
{
    destroyed++;
    ms_mem_free(p);
}

TEST(mem_recycle_list_is_lifo_and_capped)
{
#ifdef MS_ASAN
    /* Recycling is off under ASan: every put says "destroy it yourself". */
    ms_recycle_t r = {0};
    void *p = ms_mem_alloc(16);
    ASSERT_EQ(0, ms__recycle_put(&r, p));
    ASSERT(ms__recycle_get(&r) == NULL);
    ms_mem_free(p);
#else
    ms_recycle_t r = {0};
    ASSERT(ms__recycle_get(&r) == NULL);
    void *a = ms_mem_alloc(16), *b = ms_mem_alloc(16), *c = ms_mem_alloc(16);
    ASSERT_EQ(1, ms__recycle_put(&r, a));
    ASSERT_EQ(1, ms__recycle_put(&r, b));
    ASSERT_EQ(1, ms__recycle_put(&r, c));
    ASSERT_EQ(3, r.count);
    ASSERT(ms__recycle_get(&r) == c); /* last in, first out: the warmest object */
    ASSERT(ms__recycle_get(&r) == b);
    ASSERT_EQ(1, r.count);
    ASSERT_EQ(1, ms__recycle_put(&r, b));
    ASSERT(ms__recycle_get(&r) == b);
    ASSERT(ms__recycle_get(&r) == a);
    ASSERT(ms__recycle_get(&r) == NULL);
    ASSERT_EQ(0, r.count);
    ms_mem_free(a);
    ms_mem_free(b);
    ms_mem_free(c);

    /* Past MS_RECYCLE_MAX the list refuses: the caller destroys the object. */
    int kept = 0;
    for (int i = 0; i < MS_RECYCLE_MAX + 5; i++) {
        void *p = ms_mem_alloc(16);
        if (ms__recycle_put(&r, p))
            kept++;
        else
            ms_mem_free(p);
    }
    ASSERT_EQ(MS_RECYCLE_MAX, kept);
    ASSERT_EQ(MS_RECYCLE_MAX, r.count);
    destroyed = 0;
    ms__recycle_drain(&r, destroy);
    ASSERT_EQ(MS_RECYCLE_MAX, destroyed);
    ASSERT_EQ(0, r.count);
    ASSERT(r.head == NULL);
#endif
}

static int chunks(const ms_pool_t *p)
{
    int n = 0;
    for (const ms_pool_chunk_t *c = p->chunks; c != NULL; c = c->next)
        n++;
    return n;
}

TEST(mem_pool_bumps_aligned_and_grows_by_chunks)
{
    ms_pool_t p;
    ms_pool_init(&p);
    ASSERT_EQ(0, chunks(&p));
    char *a = ms_pool_alloc(&p, 1);
    char *b = ms_pool_alloc(&p, 17);
    char *c = ms_pool_alloc(&p, 16);
    ASSERT_EQ(1, chunks(&p));
    ASSERT_EQ(0, (uintptr_t)a % 16);
    ASSERT_EQ(16, b - a); /* sizes round up to 16 */
    ASSERT_EQ(32, c - b);
    /* A standard chunk holds 4096 bytes: more small ones take a second chunk. */
    for (int i = 0; i < 4096 / 64; i++)
        ms_pool_alloc(&p, 64);
    ASSERT_EQ(2, chunks(&p));
    /* A big one gets a chunk of its own behind the current, which stays in use. */
    char *cur = p.cur;
    char *big = ms_pool_alloc(&p, 10000);
    memset(big, 'x', 10000);
    ASSERT_EQ(3, chunks(&p));
    ASSERT(p.cur == cur);
    char *after = ms_pool_alloc(&p, 16);
    ASSERT(after == cur);

    /* Reset keeps the oldest standard chunk alone, so a warm request allocates nothing. */
    uint64_t frees = ms_mem_stats.frees;
    ms_pool_reset(&p);
    ASSERT_EQ(2, ms_mem_stats.frees - frees);
    ASSERT_EQ(1, chunks(&p));
    uint64_t allocs = ms_mem_stats.allocs;
    char *again = ms_pool_alloc(&p, 100);
    ASSERT(again == a);
    ASSERT_EQ(allocs, ms_mem_stats.allocs);
    ms_pool_free(&p);
    ASSERT_EQ(0, chunks(&p));
    ASSERT(p.cur == NULL && p.end == NULL);
}

TEST(mem_pool_reset_of_a_big_first_chunk_keeps_nothing)
{
    ms_pool_t p;
    ms_pool_init(&p);
    ms_pool_alloc(&p, 8000); /* the first chunk is a big one: not the reusable kind */
    ASSERT_EQ(1, chunks(&p));
    ms_pool_reset(&p);
    ASSERT_EQ(0, chunks(&p));
    ASSERT(p.cur == NULL);
    ms_pool_free(&p);
}

TEST(mem_token_and_host_tables)
{
    ASSERT_EQ(1, ms__tchar['a']);
    ASSERT_EQ(1, ms__tchar['!']);
    ASSERT_EQ(1, ms__tchar['~']);
    ASSERT_EQ(0, ms__tchar[':']);
    ASSERT_EQ(0, ms__tchar[' ']);
    ASSERT_EQ(0, ms__tchar['"']);
    ASSERT_EQ(0, ms__tchar[0x80]);
    ASSERT_EQ(1, ms__hostchar['[']);
    ASSERT_EQ(1, ms__hostchar[':']);
    ASSERT_EQ(0, ms__hostchar['/']);
    ASSERT_EQ(0, ms__hostchar['@']);
    ASSERT_EQ(0, ms__hostchar[' ']);
}

TEST(mem_error_names_and_messages)
{
    ASSERT_STR_EQ("ETOOBIG", ms_err_name(MS_ETOOBIG));
    ASSERT_STR_EQ("EINVAL", ms_err_name(UV_EINVAL)); /* libuv's own, passed through */
    ASSERT(strlen(ms_strerror(MS_ECLOSED)) > 0);
    ASSERT_STR_EQ(uv_strerror(UV_EPIPE), ms_strerror(UV_EPIPE));
}

TEST_MAIN()
