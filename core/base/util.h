/* util.h: the core's leaf helpers: recycle lists, growing buffers, byte classes, hashing
 * and number text (base/mem.c, base/chars.c). */
#ifndef MS_BASE_UTIL_H
#define MS_BASE_UTIL_H

#include <assert.h>
#include <string.h>

#include "moonserve.h"

/* Built with AddressSanitizer: the recycle lists are off (mem.c), so that a use after free
 * is caught rather than hidden; tests that count what went back to a list skip that. */
#if defined(__SANITIZE_ADDRESS__)
#define MS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MS_ASAN 1
#endif
#endif

/* Free objects kept per recycle list; beyond this they go back to the allocator. */
#define MS_RECYCLE_MAX 1024

/* A LIFO of free objects, threaded through their first word. Objects keep their inner
 * buffers while recycled, which is what makes a warm request allocation-free. */
typedef struct ms_recycle_s {
    void *head;
    uint32_t count;
} ms_recycle_t;

/* Returns a recycled object, or NULL when the caller must make a new one. */
void *ms__recycle_get(ms_recycle_t *r);
/* Keeps `p` for reuse and returns 1, or returns 0 when the caller must destroy it (list full,
 * or under ASan, where recycling is off so that a use after free shows). */
int ms__recycle_put(ms_recycle_t *r, void *p);
void ms__recycle_drain(ms_recycle_t *r, void (*destroy)(void *p));

/* Blocks for a library's allocator hooks (nghttp2's): a block of up to 8 KiB comes from a
 * list per size class (16-byte steps to 256 bytes, then four steps a doubling), kept with up
 * to MS_BLOCKS_KEEP bytes of free blocks a class, so that a library that allocates a dozen
 * small blocks a request costs a pop and a push instead of malloc and free, and a block
 * wastes little of its class. Larger blocks go to the allocator. Off under ASan, as the
 * recycle lists are. */
#define MS_BLOCK_CLASSES 36
#define MS_BLOCKS_KEEP (64 * 1024)
typedef struct ms_blocks_s {
    void *head[MS_BLOCK_CLASSES];
    uint32_t count[MS_BLOCK_CLASSES];
} ms_blocks_t;

void *ms__blocks_alloc(ms_blocks_t *b, size_t n);
void *ms__blocks_calloc(ms_blocks_t *b, size_t nmemb, size_t size);
void *ms__blocks_realloc(ms_blocks_t *b, void *p, size_t n);
void ms__blocks_free(ms_blocks_t *b, void *p);
/* The bytes block `p` may hold (its class's size, or what was asked for past the classes). */
size_t ms__blocks_size(const void *p);
/* Frees the kept blocks (the blocks in use stay the library's to free). */
void ms__blocks_drain(ms_blocks_t *b);

/* Appends `n` bytes to a growing buffer. */
static inline int ms__buf_append(ms_buf_t *b, const char *p, size_t n)
{
    if (n == 0)
        return 0; /* b->base may still be NULL */
    if (MS_UNLIKELY(n > b->cap - b->len)) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n)
            cap *= 2;
        b->base = ms_mem_realloc(b->base, cap);
        b->cap = cap;
    }
    memcpy(b->base + b->len, p, n);
    b->len += n;
    return 0;
}

/* Byte classes for validating fields: token characters (RFC 9110 5.6.2), and what a Host
 * may hold. */
extern const uint8_t ms__tchar[256];
extern const uint8_t ms__hostchar[256];

/* A hash of 16 bytes (an address, a padded key) for the core's open-addressing tables. */
static inline uint32_t ms__hash16(const void *key)
{
    uint64_t x, y;
    memcpy(&x, key, 8);
    memcpy(&y, (const char *)key + 8, 8);
    x ^= y * 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    return (uint32_t)(x ^ (x >> 32));
}

/* Writes `v` in decimal at `w`; returns the end. */
static inline char *ms__put_u64(char *w, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (n > 0)
        *w++ = tmp[--n];
    return w;
}

static inline int ms__lower(int ch)
{
    return (ch >= 'A' && ch <= 'Z') ? ch | 0x20 : ch;
}

/* Compares `a` to the lowercase `lower` of the same length, ignoring case in `a`. */
static inline int ms__ieq(const char *a, const char *lower, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ms__lower((unsigned char)a[i]) != lower[i])
            return 0;
    return 1;
}

#endif
