/* mem.c: the counted allocator, recycle lists and the per-request pool. */
#include "moonserve.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/util.h"

ms_mem_stats_t ms_mem_stats;

static MS_NOINLINE void out_of_memory(size_t n)
{
    fprintf(stderr, "moonserve: out of memory allocating %zu bytes\n", n);
    abort();
}

char *ms_mem_strdup(const char *s)
{
    if (s == NULL)
        return NULL;
    size_t n = strlen(s) + 1;
    return memcpy(ms_mem_alloc(n), s, n);
}

void *ms_mem_alloc(size_t n)
{
    void *p = malloc(n);
    if (MS_UNLIKELY(p == NULL))
        out_of_memory(n);
    ms_mem_stats.allocs++;
    return p;
}

void *ms_mem_realloc(void *p, size_t n)
{
    void *q = realloc(p, n);
    if (MS_UNLIKELY(q == NULL))
        out_of_memory(n);
    if (p == NULL)
        ms_mem_stats.allocs++;
    else
        ms_mem_stats.reallocs++;
    return q;
}

void ms_mem_free(void *p)
{
    if (p == NULL)
        return;
    ms_mem_stats.frees++;
    free(p);
}

/* -- Recycle lists --------------------------------------------------------------------- */

/* Under ASan recycling is off (MS_ASAN, base/util.h), so that a use after free is caught
 * rather than hidden. */

void *ms__recycle_get(ms_recycle_t *r)
{
    void *p = r->head;
    if (p != NULL) {
        r->head = *(void **)p;
        r->count--;
    }
    return p;
}

int ms__recycle_put(ms_recycle_t *r, void *p)
{
#ifdef MS_ASAN
    (void)r;
    (void)p;
    return 0;
#else
    if (r->count >= MS_RECYCLE_MAX)
        return 0;
    *(void **)p = r->head;
    r->head = p;
    r->count++;
    return 1;
#endif
}

void ms__recycle_drain(ms_recycle_t *r, void (*destroy)(void *p))
{
    while (r->head != NULL) {
        void *p = r->head;
        r->head = *(void **)p;
        destroy(p);
    }
    r->count = 0;
}

/* -- Blocks by size class ------------------------------------------------------------------ */

/* A block's header: its class (BIG: from the allocator, of `size` bytes). 16 bytes, so that
 * the block after it keeps malloc's alignment. */
#define BLOCK_HEAD 16
#define BIG 0xff
typedef struct {
    uint32_t cls;
    size_t size;
} block_head_t;

static inline void *block_of(void *p)
{
    return (char *)p - BLOCK_HEAD;
}

/* The class of a block of `n` bytes, or BIG: 0 to 15 for 16 to 256 bytes in steps of 16,
 * then 16 to 35 for 320 to 8 KiB in four steps a doubling. */
static inline uint32_t class_of(size_t n)
{
    if (n <= 256)
        return n == 0 ? 0 : (uint32_t)((n - 1) >> 4);
    if (n > 8192)
        return BIG;
    uint32_t e = (uint32_t)(63 - __builtin_clzll((unsigned long long)(n - 1))); /* 8 to 12 */
    return 16 + (e - 8) * 4 + (uint32_t)(((n - 1) >> (e - 2)) & 3);
}

static inline size_t class_size(uint32_t c)
{
    if (c < 16)
        return (size_t)(c + 1) * 16;
    uint32_t e = 8 + (c - 16) / 4, q = (c - 16) % 4;
    return ((size_t)1 << e) + (size_t)(q + 1) * ((size_t)1 << (e - 2));
}

/* A new block of class `c` (BIG: of `n` bytes), from the allocator. */
static MS_NOINLINE void *block_new(uint32_t c, size_t n)
{
    size_t size = c != BIG ? class_size(c) : n;
    block_head_t *h = malloc(BLOCK_HEAD + size);
    if (h == NULL)
        return NULL; /* the library answers its own out-of-memory */
    h->cls = c;
    h->size = size;
    return (char *)h + BLOCK_HEAD;
}

void *ms__blocks_alloc(ms_blocks_t *b, size_t n)
{
    uint32_t c = class_of(n);
    if (c != BIG && b->head[c] != NULL) {
        char *h = b->head[c];
        b->head[c] = *(void **)(h + BLOCK_HEAD);
        b->count[c]--;
        return h + BLOCK_HEAD;
    }
    return block_new(c, n);
}

size_t ms__blocks_size(const void *p)
{
    return ((const block_head_t *)((const char *)p - BLOCK_HEAD))->size;
}

void ms__blocks_free(ms_blocks_t *b, void *p)
{
    if (p == NULL)
        return;
    block_head_t *h = block_of(p);
#ifndef MS_ASAN
    uint32_t c = h->cls;
    if (c != BIG && b->count[c] * h->size < MS_BLOCKS_KEEP) {
        *(void **)p = b->head[c];
        b->head[c] = h;
        b->count[c]++;
        return;
    }
#else
    (void)b;
#endif
    free(h);
}

void *ms__blocks_calloc(ms_blocks_t *b, size_t nmemb, size_t size)
{
    if (size != 0 && nmemb > SIZE_MAX / size)
        return NULL;
    void *p = ms__blocks_alloc(b, nmemb * size);
    return p != NULL ? memset(p, 0, nmemb * size) : NULL;
}

void *ms__blocks_realloc(ms_blocks_t *b, void *p, size_t n)
{
    if (p == NULL)
        return ms__blocks_alloc(b, n);
    block_head_t *h = block_of(p);
    if (h->cls != BIG && class_of(n) == h->cls)
        return p; /* it fits where it is */
    if (h->cls == BIG && class_of(n) == BIG) {
        h = realloc(h, BLOCK_HEAD + n);
        if (h == NULL)
            return NULL;
        h->size = n;
        return (char *)h + BLOCK_HEAD;
    }
    void *q = ms__blocks_alloc(b, n);
    if (q == NULL)
        return NULL;
    memcpy(q, p, h->size < n ? h->size : n);
    ms__blocks_free(b, p);
    return q;
}

void ms__blocks_drain(ms_blocks_t *b)
{
    for (int c = 0; c < MS_BLOCK_CLASSES; c++) {
        while (b->head[c] != NULL) {
            void *h = b->head[c];
            b->head[c] = *(void **)((char *)h + BLOCK_HEAD);
            free(h);
        }
        b->count[c] = 0;
    }
}

/* -- Pool -------------------------------------------------------------------------------- */

#define MS_POOL_CHUNK 4096

struct ms_pool_chunk_s {
    ms_pool_chunk_t *next;
    size_t size;
    char data[];
};

void ms_pool_init(ms_pool_t *p)
{
    p->chunks = NULL;
    p->cur = p->end = NULL;
}

static MS_NOINLINE void *pool_grow(ms_pool_t *p, size_t n)
{
    size_t size = n > MS_POOL_CHUNK / 2 ? n : MS_POOL_CHUNK;
    ms_pool_chunk_t *c = ms_mem_alloc(sizeof(*c) + size);
    c->size = size;
    if (n > MS_POOL_CHUNK / 2 && p->chunks != NULL) {
        /* A big allocation gets a chunk of its own behind the current one, so the rest of
         * the current chunk stays usable. */
        c->next = p->chunks->next;
        p->chunks->next = c;
        return c->data;
    }
    c->next = p->chunks;
    p->chunks = c;
    p->cur = c->data + n;
    p->end = c->data + size;
    return c->data;
}

void *ms_pool_alloc(ms_pool_t *p, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (MS_UNLIKELY((size_t)(p->end - p->cur) < n))
        return pool_grow(p, n);
    void *r = p->cur;
    p->cur += n;
    return r;
}

void ms_pool_reset(ms_pool_t *p)
{
    /* Keep the oldest chunk if it is a standard one: it is the one every request uses. */
    ms_pool_chunk_t *keep = NULL;
    for (ms_pool_chunk_t *c = p->chunks, *next; c != NULL; c = next) {
        next = c->next;
        if (next == NULL && c->size == MS_POOL_CHUNK)
            keep = c;
        else
            ms_mem_free(c);
    }
    if (keep == NULL) {
        ms_pool_init(p);
        return;
    }
    p->chunks = keep;
    p->cur = keep->data;
    p->end = keep->data + keep->size;
}

void ms_pool_free(ms_pool_t *p)
{
    for (ms_pool_chunk_t *c = p->chunks, *next; c != NULL; c = next) {
        next = c->next;
        ms_mem_free(c);
    }
    ms_pool_init(p);
}

/* -- Errors ------------------------------------------------------------------------------- */

const char *ms_err_name(int err)
{
    switch (err) {
#define MS_ERR_NAME(name, value, msg)                                                              \
    case MS_##name: return #name;
        MS_ERRNO_MAP(MS_ERR_NAME)
#undef MS_ERR_NAME
    }
    return uv_err_name(err);
}

const char *ms_strerror(int err)
{
    switch (err) {
#define MS_ERR_MSG(name, value, msg)                                                               \
    case MS_##name: return msg;
        MS_ERRNO_MAP(MS_ERR_MSG)
#undef MS_ERR_MSG
    }
    return uv_strerror(err);
}
