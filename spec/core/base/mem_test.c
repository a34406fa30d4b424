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

TEST(mem_blocks_come_by_size_class_and_go_back_to_their_list)
{
    ms_blocks_t b = {0};
    /* each size in its class: 16-byte steps to 256, then four a doubling to 8 KiB; past it,
     * malloc's */
    size_t sizes[] = {0, 1, 16, 17, 256, 257, 320, 321, 2928, 4096, 8192, 8193, 100000};
    uint32_t classes[] = {0, 0, 0, 1, 15, 16, 16, 17, 29, 31, 35, BIG, BIG};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(*sizes); i++) {
        char *p = ms__blocks_alloc(&b, sizes[i]);
        ASSERT(p != NULL);
        ASSERT_EQ(0, (uintptr_t)p % 16); /* malloc's alignment */
        ASSERT_EQ(classes[i], ((block_head_t *)block_of(p))->cls);
        memset(p, 0xab, sizes[i]); /* all of it is usable (ASan says otherwise) */
        ms__blocks_free(&b, p);
    }
#ifndef MS_ASAN
    /* kept for the next of its class (97 to 112 bytes), the last freed first */
    char *x = ms__blocks_alloc(&b, 100), *y = ms__blocks_alloc(&b, 110);
    ms__blocks_free(&b, x);
    ms__blocks_free(&b, y);
    ASSERT(ms__blocks_alloc(&b, 97) == y);
    ASSERT(ms__blocks_alloc(&b, 112) == x);
    ms__blocks_free(&b, x);
    ms__blocks_free(&b, y);
    /* a class keeps MS_BLOCKS_KEEP bytes of free blocks, no more: 8 of 8 KiB */
    void *big[40];
    for (int i = 0; i < 40; i++)
        big[i] = ms__blocks_alloc(&b, 8000);
    for (int i = 0; i < 40; i++)
        ms__blocks_free(&b, big[i]);
    ASSERT_EQ(MS_BLOCKS_KEEP / 8192, b.count[35]);
#endif
    ms__blocks_drain(&b);
    for (int c = 0; c < MS_BLOCK_CLASSES; c++) {
        ASSERT(b.head[c] == NULL);
        ASSERT_EQ(0, b.count[c]);
    }
}

TEST(mem_blocks_classes_hold_each_size_with_little_to_spare)
{
    uint32_t last = 0;
    for (size_t n = 1; n <= 8192; n++) {
        uint32_t c = class_of(n);
        ASSERT(c < MS_BLOCK_CLASSES);
        ASSERT(c >= last); /* a larger size never gets a smaller class */
        last = c;
        size_t size = class_size(c);
        ASSERT(size >= n);
        /* (at most 15 bytes past it up to 256, then a quarter of the size below the class) */
        if (n <= 256)
            ASSERT(size - n < 16);
        else
            ASSERT((size - n) * 4 < size);
        ASSERT_EQ(0, size % 16); /* malloc's alignment for what follows the header */
    }
    ASSERT_EQ(MS_BLOCK_CLASSES - 1, class_of(8192));
    ASSERT_EQ(BIG, class_of(8193));
}

TEST(mem_blocks_realloc_keeps_the_bytes_and_calloc_zeroes)
{
    ms_blocks_t b = {0};
    char *p = ms__blocks_realloc(&b, NULL, 10);
    memcpy(p, "moonserve", 10);
    ASSERT(ms__blocks_realloc(&b, p, 16) == p); /* it fits where it is */
    p = ms__blocks_realloc(&b, p, 3000);        /* to a larger class */
    ASSERT_STR_EQ("moonserve", p);
    p = ms__blocks_realloc(&b, p, 20000); /* to malloc's */
    ASSERT_STR_EQ("moonserve", p);
    p = ms__blocks_realloc(&b, p, 40000); /* within malloc's */
    ASSERT_STR_EQ("moonserve", p);
    p = ms__blocks_realloc(&b, p, 16); /* back to a class: the first bytes come along */
    ASSERT_EQ(0, memcmp(p, "moonserve", 10));
    ms__blocks_free(&b, p);
    unsigned char *z = ms__blocks_alloc(&b, 200);
    memset(z, 0xff, 200);
    ms__blocks_free(&b, z);
    z = ms__blocks_calloc(&b, 50, 4); /* (the block just freed, maybe) */
    for (int i = 0; i < 200; i++)
        ASSERT_EQ(0, z[i]);
    ms__blocks_free(&b, z);
    ASSERT(ms__blocks_calloc(&b, SIZE_MAX / 2, 4) == NULL); /* the product overflows */
    ms__blocks_free(&b, NULL);
    ms__blocks_drain(&b);
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
