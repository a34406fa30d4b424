/* shdict.c: shared dictionaries: a hash table, an LRU list and a buddy allocator inside one
 * memfd zone that each process maps at its own address, behind a lock word holding its
 * holder's pid. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif
#include "process/shdict.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "moonserve.h"

/* "MSSHDICT" in memory order, and the layout's version: a worker built from other sources
 * than its master's refuses the zone instead of misreading it. */
#define ZONE_MAGIC   UINT64_C(0x5443494448535346)
#define ZONE_VERSION 3

/* Blocks are 2^MIN_ORDER (32) to 2^31 bytes. */
#define MIN_ORDER 5
#define NORDERS   32
/* One hash bucket (4 bytes) per this many bytes of zone: at most 4 entries a chain, since
 * an entry takes at least 64 bytes. */
#define BYTES_PER_BUCKET 256
/* On a failed allocation, this many entries at the LRU's tail are looked at for expired
 * ones before a live one is evicted. */
#define EXPIRED_SCAN 32

#define ALIGN8(n) (((n) + 7) & ~(size_t)7)

/* -- The zone -------------------------------------------------------------------------------------
 * Everything is addressed by a uint32_t offset from the zone's base; 0 is "none" (the
 * header is at 0, so no block is). */

enum { BLK_FREE = 0x46, BLK_NODE = 0x4e, BLK_ELEM = 0x45 };

/* Every block starts with its order and its kind. */
typedef struct blk_s {
    uint8_t order, kind;
} blk_t;

typedef struct free_blk_s {
    uint8_t order, kind, _pad[2];
    uint32_t next, prev; /* the free list of its order */
} free_blk_t;

/* An entry: this, then the key (padded to 8 bytes), then the value. */
typedef struct node_s {
    uint8_t order, kind, type, _pad;
    uint32_t value_len;
    uint32_t hash;
    uint32_t hnext;              /* the bucket's chain */
    uint32_t lru_prev, lru_next; /* prev: more recently used */
    uint32_t flags;
    uint16_t key_len, _pad2;
    int64_t expires; /* ms on the zone's clock; 0: never */
} node_t;
_Static_assert(sizeof(node_t) == 40, "the per-entry overhead that docs/shared-dicts.md gives");

/* A LIST entry's value. The elements are blocks of their own. */
typedef struct list_s {
    uint32_t head, tail, count; /* count > 0: an emptied list is removed */
} list_t;

typedef struct elem_s {
    uint8_t order, kind, type, _pad;
    uint32_t len;
    uint32_t next, prev;
    uint32_t owner; /* the list's node: eviction of a region frees whole entries */
    uint32_t _pad2;
} elem_t;
_Static_assert(sizeof(elem_t) == 24, "elements keep their data 8-aligned");

typedef struct zone_s {
    /* What every operation reads and none changes. */
    uint64_t magic;
    uint32_t version, hdr_size;
    uint64_t size;     /* the whole zone: what fstat says */
    uint32_t seed;     /* of the hash, the same in every process */
    uint32_t nbuckets; /* a power of two */
    uint32_t buckets;  /* uint32_t[nbuckets] */
    uint32_t area, area_len;
    uint32_t top_order; /* of the largest block there can be */
    uint64_t _pad[2];
    /* The lock, alone in its cache line: the waiters read it while the holder works on the
     * line below, so that the holder's writes do not take the line from them each time. */
    uint32_t owner; /* the pid of the process holding it, 0 when free */
    uint32_t _pad2[15];
    /* What every change writes, in one line. */
    uint32_t dirty; /* set while the structures are being changed */
    uint32_t lru_head, lru_tail;
    uint32_t count; /* entries */
    uint64_t free_bytes;
    uint64_t repairs; /* flushes after a process died mid-change */
    uint32_t free_head[NORDERS];
    char name[MS_SHDICT_NAME_MAX + 1];
} zone_t;
_Static_assert(offsetof(zone_t, owner) == 64, "the lock starts a cache line");
_Static_assert(offsetof(zone_t, dirty) == 128, "what a change writes starts the next");
_Static_assert(sizeof(zone_t) <= 384, "docs/shared-dicts.md: the header is 384 bytes");
_Static_assert(offsetof(zone_t, count) + sizeof(uint32_t) <= 192,
               "what a change writes shares one cache line");

struct ms_shdict_s {
    char *base; /* this process's mapping; owned, unmapped by detach */
    zone_t *z;  /* == base */
    size_t size;
};

#define AT(d, off) ((void *)((d)->base + (off)))

static inline uint32_t *buckets(ms_shdict_t *d)
{
    return AT(d, d->z->buckets);
}

static inline char *node_key(node_t *n)
{
    return (char *)(n + 1);
}

static inline char *node_val(node_t *n)
{
    return (char *)(n + 1) + ALIGN8(n->key_len);
}

static inline uint32_t off_of(ms_shdict_t *d, const void *p)
{
    return (uint32_t)((const char *)p - d->base);
}

/* -- The clock ------------------------------------------------------------------------------------
 * CLOCK_MONOTONIC is one clock for every process of the machine, so expiry times written by
 * one worker mean the same in another. A zone does not outlive a reboot. The coarse variant
 * (the kernel's tick, a few ms) is read without the precise clock's cost, which was a third of
 * an incr; nginx's dictionaries tell time by the event loop's cached clock, coarser still. */

static int64_t clock_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + 1;
}

/* Tests set their own clock. */
static int64_t (*now_ms)(void) = clock_ms;

static inline int is_expired(const node_t *n, int64_t now)
{
    return n->expires != 0 && n->expires < now;
}

/* exptime seconds from now as an expiry time, or -1 when exptime is negative or NaN. */
static int64_t expiry(double exptime, int64_t now)
{
    if (!(exptime >= 0))
        return -1;
    if (exptime == 0)
        return 0;
    if (exptime > 1e12) /* some 30,000 years: no overflow below */
        exptime = 1e12;
    int64_t e = now + (int64_t)(exptime * 1000);
    return e == 0 ? 1 : e;
}

/* -- The lock -------------------------------------------------------------------------------------
 * Every operation holds the zone's lock: a word holding the pid of its holder, taken with a
 * compare-and-swap (0 to our pid) and given back with a store of 0. A holder keeps it for well
 * under a microsecond, so the fast path is one atomic each way; glibc's robust mutex did the
 * same work with its robust-list bookkeeping around it and ran at half the speed.
 *
 * A holder that dies leaves its pid in the word. The master frees it when it learns the
 * worker died (ms_shdict_forsake, before it starts another process, so no pid is reused
 * meanwhile), and a waiter that has waited long asks the kernel whether the holder still
 * exists (kill(pid, 0): a server without a master, a test's children). The holder sets
 * `dirty` before it changes any structure and clears it after, so the next holder finds it
 * set only when the last one died mid-change, and flushes the zone; one that was reading
 * left nothing to repair.
 *
 * A compiler barrier is enough around `dirty`: the only reader of a half-done change is the
 * next owner after the writer died, and a process dies at an instruction boundary (a signal),
 * so program order is what counts; the lock's acquire and release order the memory between
 * the CPUs. */

static void zone_format(ms_shdict_t *d);

/* This process's pid, as the word holds it: getpid() is a system call, and a child made by
 * fork() learns its own through the atfork handler. */
static uint32_t my_pid;
static pthread_once_t my_pid_once = PTHREAD_ONCE_INIT;

static void learn_pid(void)
{
    my_pid = (uint32_t)getpid();
}

static void learn_pid_once(void)
{
    learn_pid();
    pthread_atfork(NULL, NULL, learn_pid);
}

static MS_NOINLINE void lock_repair(ms_shdict_t *d)
{
    zone_t *z = d->z;
    uint32_t lost = z->count;
    zone_format(d);
    z->repairs++;
    z->dirty = 0;
    ms_log(MS_LOG_ERR, "shared dict %s: a process died while changing it: flushed it (%u keys)",
           z->name, lost);
}

static inline int lock_try(uint32_t *w, uint32_t from)
{
    return __atomic_compare_exchange_n(w, &from, my_pid, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

/* A waiter watches the word (test and test-and-set, so its tries do not take the line from
 * the holder) with a pause between looks that doubles up to LOCK_PAUSE_MAX; after LOCK_SPINS
 * looks it lets the CPU go, and after LOCK_YIELDS more it sleeps LOCK_SLEEP_NS at a time: only
 * a holder that was descheduled, stopped or killed keeps it waiting that long. Every
 * LOCK_CHECK_EVERY turns past the spins it checks that the holder exists. The long pauses
 * (as nginx's shmtx has them) let a holder run several operations while the line stays in
 * its cache, which is what two workers hammering one key need. */
#define LOCK_PAUSE_MAX   1024
#define LOCK_SPINS       16
#define LOCK_YIELDS      1000
#define LOCK_CHECK_EVERY 64
#define LOCK_SLEEP_NS    (200 * 1000)

static MS_NOINLINE void lock_slow(ms_shdict_t *d)
{
    uint32_t *w = &d->z->owner;
    unsigned pause = 1;
    for (unsigned i = 0;; i++) {
        if (i < LOCK_SPINS) {
            for (unsigned k = 0; k < pause; k++) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
            }
            if (pause < LOCK_PAUSE_MAX)
                pause <<= 1;
        } else if (i < LOCK_SPINS + LOCK_YIELDS) {
            sched_yield();
        } else {
            struct timespec ts = {0, LOCK_SLEEP_NS};
            nanosleep(&ts, NULL);
        }
        uint32_t o = __atomic_load_n(w, __ATOMIC_RELAXED);
        if (o == 0 && lock_try(w, 0))
            return;
        /* The holder is gone and nobody freed its word: take it over from the dead. */
        if (o != 0 && i >= LOCK_SPINS && (i - LOCK_SPINS) % LOCK_CHECK_EVERY == 0 &&
            kill((pid_t)o, 0) < 0 && errno == ESRCH && lock_try(w, o))
            return;
    }
}

static inline int zone_lock(ms_shdict_t *d)
{
    zone_t *z = d->z;
    if (MS_UNLIKELY(!lock_try(&z->owner, 0)))
        lock_slow(d);
    if (MS_UNLIKELY(z->dirty))
        lock_repair(d);
    return 0;
}

static inline void zone_unlock(ms_shdict_t *d)
{
    __atomic_store_n(&d->z->owner, 0, __ATOMIC_RELEASE);
}

int ms_shdict_forsake(ms_shdict_t *d, int pid)
{
    uint32_t o = (uint32_t)pid;
    return pid > 0 && __atomic_compare_exchange_n(&d->z->owner, &o, 0, 0, __ATOMIC_RELEASE,
                                                  __ATOMIC_RELAXED);
}

static inline void change_begin(zone_t *z)
{
    z->dirty = 1;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

static inline void change_end(zone_t *z)
{
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    z->dirty = 0;
}

/* -- The buddy allocator --------------------------------------------------------------------------
 * The area is cut into the largest aligned powers of two that fit; a block of order k splits
 * into two of order k - 1 and merges back with its buddy (offset ^ 2^k) when both are free,
 * so freeing everything always gives back the whole area: no fragmentation outlives its
 * entries. A block wastes at most half of itself. */

static void free_push(ms_shdict_t *d, uint32_t off, unsigned k)
{
    zone_t *z = d->z;
    free_blk_t *f = AT(d, off);
    f->order = (uint8_t)k;
    f->kind = BLK_FREE;
    f->prev = 0;
    f->next = z->free_head[k];
    if (f->next != 0)
        ((free_blk_t *)AT(d, f->next))->prev = off;
    z->free_head[k] = off;
}

static void free_remove(ms_shdict_t *d, uint32_t off)
{
    free_blk_t *f = AT(d, off);
    if (f->prev != 0)
        ((free_blk_t *)AT(d, f->prev))->next = f->next;
    else
        d->z->free_head[f->order] = f->next;
    if (f->next != 0)
        ((free_blk_t *)AT(d, f->next))->prev = f->prev;
}

static unsigned order_for(size_t n)
{
    unsigned k = MIN_ORDER;
    while (k < NORDERS && ((size_t)1 << k) < n)
        k++;
    return k;
}

/* A block of order k, its kind and order set, or 0. */
static uint32_t blk_alloc(ms_shdict_t *d, unsigned k, int kind)
{
    zone_t *z = d->z;
    unsigned j = k;
    while (j <= z->top_order && z->free_head[j] == 0)
        j++;
    if (j > z->top_order)
        return 0;
    uint32_t off = z->free_head[j];
    free_remove(d, off);
    while (j > k) {
        j--;
        free_push(d, off + ((uint32_t)1 << j), j);
    }
    blk_t *b = AT(d, off);
    b->order = (uint8_t)k;
    b->kind = (uint8_t)kind;
    z->free_bytes -= (uint64_t)1 << k;
    return off;
}

static void blk_free(ms_shdict_t *d, uint32_t off)
{
    zone_t *z = d->z;
    blk_t *self = AT(d, off);
    unsigned k = self->order;
    /* Marked free even if it merges into its lower buddy and so is no block's start any
     * more: evict_region() may step on this header later, and must read "free". */
    self->kind = BLK_FREE;
    uint64_t rel = off - z->area;
    z->free_bytes += (uint64_t)1 << k;
    while (k < z->top_order) {
        uint64_t size = (uint64_t)1 << k, brel = rel ^ size;
        if (brel + size > z->area_len)
            break; /* a block at the end of the area has no buddy */
        /* The buddy's offset is always a block's start: it is either that whole buddy, or
         * the first piece of it. */
        free_blk_t *b = AT(d, z->area + brel);
        if (b->kind != BLK_FREE || b->order != k)
            break;
        free_remove(d, (uint32_t)(z->area + brel));
        rel &= ~size;
        k++;
    }
    free_push(d, (uint32_t)(z->area + rel), k);
}

/* The order of the top-level block (one of the area's first cuts) that holds `rel`. */
static unsigned top_block_order(zone_t *z, uint64_t rel)
{
    uint64_t start = 0;
    for (int b = NORDERS - 1; b >= MIN_ORDER; b--) {
        uint64_t size = (uint64_t)1 << b;
        if (!(z->area_len & size))
            continue;
        if (rel < start + size)
            return (unsigned)b;
        start += size;
    }
    return 0;
}

/* An empty zone: no entries, the area in free blocks. The header's identity stays. */
static void zone_format(ms_shdict_t *d)
{
    zone_t *z = d->z;
    memset(buckets(d), 0, (size_t)z->nbuckets * sizeof(uint32_t));
    z->lru_head = z->lru_tail = 0;
    z->count = 0;
    memset(z->free_head, 0, sizeof(z->free_head));
    z->free_bytes = 0;
    uint64_t rel = 0;
    for (int b = NORDERS - 1; b >= MIN_ORDER; b--) {
        uint64_t size = (uint64_t)1 << b;
        if (!(z->area_len & size))
            continue;
        free_push(d, (uint32_t)(z->area + rel), (unsigned)b);
        z->free_bytes += size;
        rel += size;
    }
}

/* -- Entries ----------------------------------------------------------------------------------- */

static uint32_t hash_key(uint32_t seed, const char *k, size_t n)
{
    uint64_t h = seed ^ (n * UINT64_C(0x9e3779b97f4a7c15));
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, k, 8);
        h = (h ^ v) * UINT64_C(0xbf58476d1ce4e5b9);
        h ^= h >> 31;
        k += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, k, n);
    h = (h ^ v) * UINT64_C(0x94d049bb133111eb);
    h ^= h >> 29;
    h *= UINT64_C(0xbf58476d1ce4e5b9);
    return (uint32_t)(h ^ (h >> 32));
}

static node_t *lookup(ms_shdict_t *d, uint32_t h, const char *key, size_t klen)
{
    uint32_t off = buckets(d)[h & (d->z->nbuckets - 1)];
    while (off != 0) {
        node_t *n = AT(d, off);
        if (n->hash == h && n->key_len == klen && memcmp(node_key(n), key, klen) == 0)
            return n;
        off = n->hnext;
    }
    return NULL;
}

static void lru_remove(ms_shdict_t *d, node_t *n)
{
    zone_t *z = d->z;
    if (n->lru_prev != 0)
        ((node_t *)AT(d, n->lru_prev))->lru_next = n->lru_next;
    else
        z->lru_head = n->lru_next;
    if (n->lru_next != 0)
        ((node_t *)AT(d, n->lru_next))->lru_prev = n->lru_prev;
    else
        z->lru_tail = n->lru_prev;
}

static void lru_push(ms_shdict_t *d, node_t *n)
{
    zone_t *z = d->z;
    uint32_t off = off_of(d, n);
    n->lru_prev = 0;
    n->lru_next = z->lru_head;
    if (z->lru_head != 0)
        ((node_t *)AT(d, z->lru_head))->lru_prev = off;
    else
        z->lru_tail = off;
    z->lru_head = off;
}

/* Makes n the most recently used. The caller has called change_begin(). */
static void lru_touch(ms_shdict_t *d, node_t *n)
{
    if (d->z->lru_head != off_of(d, n)) {
        lru_remove(d, n);
        lru_push(d, n);
    }
}

static void list_clear(ms_shdict_t *d, node_t *n)
{
    list_t *l = (list_t *)node_val(n);
    uint32_t e = l->head;
    while (e != 0) {
        uint32_t next = ((elem_t *)AT(d, e))->next;
        blk_free(d, e);
        e = next;
    }
    l->head = l->tail = l->count = 0;
}

static void entry_free(ms_shdict_t *d, node_t *n)
{
    zone_t *z = d->z;
    uint32_t off = off_of(d, n);
    uint32_t *link = &buckets(d)[n->hash & (z->nbuckets - 1)];
    while (*link != off)
        link = &((node_t *)AT(d, *link))->hnext;
    *link = n->hnext;
    lru_remove(d, n);
    if (n->type == MS_SHDICT_LIST)
        list_clear(d, n);
    z->count--;
    blk_free(d, off);
}

/* Frees every entry that owns a block inside the aligned region of order k around the
 * victim `v`, so that the region merges into one free block of that order. Returns 0, or -1
 * (having freed nothing) when the region holds a block of the pinned entry or lies across
 * two of the area's top-level blocks. */
static int evict_region(ms_shdict_t *d, node_t *v, unsigned k, uint32_t pin)
{
    zone_t *z = d->z;
    uint64_t size = (uint64_t)1 << k;
    uint64_t start = (off_of(d, v) - z->area) & ~(size - 1);
    if (top_block_order(z, start) < k)
        return -1;
    for (uint64_t p = start; p < start + size;
         p += (uint64_t)1 << ((blk_t *)AT(d, z->area + p))->order) {
        blk_t *b = AT(d, z->area + p);
        if ((b->kind == BLK_NODE && z->area + p == pin) ||
            (b->kind == BLK_ELEM && ((elem_t *)b)->owner == pin))
            return -1;
    }
    /* The walk reads the order of each block before freeing it, and steps over it. Where
     * blocks have merged, the headers it steps on inside the merged block are stale, but
     * blk_free() marked each of them free, with the order it had: still a tiling. */
    for (uint64_t p = start; p < start + size;) {
        blk_t *b = AT(d, z->area + p);
        uint64_t bsize = (uint64_t)1 << b->order;
        if (b->kind == BLK_NODE)
            entry_free(d, (node_t *)b);
        else if (b->kind == BLK_ELEM)
            entry_free(d, AT(d, ((elem_t *)b)->owner));
        p += bsize;
    }
    return 0;
}

/* A block of order k, making room if it must: expired entries near the LRU's tail go first,
 * then (unless `safe`) live ones from the tail, with the entries around each so that a
 * large block can form. `pin` (an entry, or 0) stays. Returns the block or 0. */
static uint32_t alloc_evicting(ms_shdict_t *d, unsigned k, int kind, uint32_t pin, int safe,
                               int *forcible, int64_t now)
{
    zone_t *z = d->z;
    uint32_t off = blk_alloc(d, k, kind);
    if (MS_LIKELY(off != 0) || k > z->top_order)
        return off;
    uint32_t at = z->lru_tail;
    for (int i = 0; at != 0 && i < EXPIRED_SCAN; i++) {
        node_t *n = AT(d, at);
        at = n->lru_prev; /* freeing n leaves its neighbour where it is */
        if (off_of(d, n) != pin && is_expired(n, now)) {
            entry_free(d, n);
            if ((off = blk_alloc(d, k, kind)) != 0)
                return off;
        }
    }
    if (safe)
        return 0;
    for (;;) {
        uint32_t v = z->lru_tail;
        if (v != 0 && v == pin)
            v = ((node_t *)AT(d, v))->lru_prev;
        if (v == 0)
            return 0;
        node_t *n = AT(d, v);
        if (!is_expired(n, now) && forcible != NULL)
            *forcible = 1;
        if (n->order >= k || evict_region(d, n, k, pin) < 0)
            entry_free(d, n);
        if ((off = blk_alloc(d, k, kind)) != 0)
            return off;
    }
}

/* Frees up to two expired entries at the LRU's tail, as OpenResty does before an insert. */
static void expire_tail(ms_shdict_t *d, int64_t now)
{
    for (int i = 0; i < 2; i++) {
        uint32_t t = d->z->lru_tail;
        if (t == 0 || !is_expired(AT(d, t), now))
            return;
        entry_free(d, AT(d, t));
    }
}

static void node_write(node_t *n, int type, const void *val, size_t vlen, uint32_t flags,
                       int64_t expires)
{
    n->type = (uint8_t)type;
    n->value_len = (uint32_t)vlen;
    n->flags = flags;
    n->expires = expires;
    if (vlen != 0 && val != NULL) /* NULL: the caller writes the value in place */
        memcpy(node_val(n), val, vlen);
}

/* Puts a value under a key, in place of `n` (the key's current entry, or NULL). Returns the
 * entry, or NULL when there is no room (the old entry is gone then, as in OpenResty). */
static node_t *entry_put(ms_shdict_t *d, node_t *n, uint32_t h, const char *key, size_t klen,
                         int type, const void *val, size_t vlen, uint32_t flags, int64_t expires,
                         int safe, int *forcible, int64_t now)
{
    zone_t *z = d->z;
    unsigned k = order_for(sizeof(node_t) + ALIGN8(klen) + vlen);
    if (n != NULL && n->order == k) {
        if (n->type == MS_SHDICT_LIST)
            list_clear(d, n);
        node_write(n, type, val, vlen, flags, expires);
        lru_touch(d, n);
        return n;
    }
    if (n != NULL)
        entry_free(d, n);
    expire_tail(d, now);
    uint32_t off = alloc_evicting(d, k, BLK_NODE, 0, safe, forcible, now);
    if (off == 0)
        return NULL;
    n = AT(d, off);
    n->hash = h;
    n->key_len = (uint16_t)klen;
    memcpy(node_key(n), key, klen);
    node_write(n, type, val, vlen, flags, expires);
    uint32_t *b = &buckets(d)[h & (z->nbuckets - 1)];
    n->hnext = *b;
    *b = off;
    lru_push(d, n);
    z->count++;
    return n;
}

static inline int check_key(const char *key, size_t klen)
{
    if (klen == 0)
        return MS_SHDICT_EEMPTYKEY;
    if (klen > MS_SHDICT_KEY_MAX)
        return MS_SHDICT_EKEYLONG;
    return 0;
}

/* -- Zones ------------------------------------------------------------------------------------- */

const char *ms_shdict_strerror(int err)
{
    switch (err) {
#define MS_SHDICT_ERR_MSG(name, value, msg)                                                        \
    case MS_SHDICT_##name: return msg;
        MS_SHDICT_ERRNO_MAP(MS_SHDICT_ERR_MSG)
#undef MS_SHDICT_ERR_MSG
    }
    return ms_strerror(err);
}

static uint32_t pow2_at_least(uint64_t n)
{
    uint32_t p = 16;
    while (p < n && p < (UINT32_C(1) << 30))
        p <<= 1;
    return p;
}

int ms_shdict_create(const char *name, size_t size)
{
    size &= ~(size_t)63;
    if (name == NULL || name[0] == 0 || strlen(name) > MS_SHDICT_NAME_MAX ||
        size < MS_SHDICT_MIN_SIZE || size > MS_SHDICT_MAX_SIZE)
        return UV_EINVAL;
    char fdname[MS_SHDICT_NAME_MAX + 16];
    snprintf(fdname, sizeof(fdname), "moonserve:%s", name);
    int fd = memfd_create(fdname, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -errno;
    /* Sealed: no process can shrink it under another's mapping (SIGBUS) or grow it. */
    if (ftruncate(fd, (off_t)size) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    char *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    zone_t *z = (zone_t *)base;
    z->version = ZONE_VERSION;
    z->hdr_size = (uint32_t)((sizeof(zone_t) + 63) & ~(size_t)63);
    z->size = size;
    strcpy(z->name, name);
    if (getrandom(&z->seed, sizeof(z->seed), GRND_NONBLOCK) != sizeof(z->seed))
        z->seed = (uint32_t)(clock_ms() * 2654435761u) ^ (uint32_t)getpid();
    z->nbuckets = pow2_at_least(size / BYTES_PER_BUCKET);
    z->buckets = z->hdr_size;
    z->area = (uint32_t)((z->buckets + (uint64_t)z->nbuckets * 4 + 63) & ~(uint64_t)63);
    z->area_len = (uint32_t)((size - z->area) & ~(uint64_t)((1 << MIN_ORDER) - 1));
    z->top_order = top_block_order(z, 0);
    ms_shdict_t d = {base, z, size};
    zone_format(&d);
    z->magic = ZONE_MAGIC;
    munmap(base, size);
    return fd;
}

int ms_shdict_attach(int fd, const char *name, size_t size, ms_shdict_t **out)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -errno;
    if ((size_t)st.st_size < MS_SHDICT_MIN_SIZE || (size_t)st.st_size > MS_SHDICT_MAX_SIZE)
        return MS_SHDICT_EBADZONE;
    char *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
        return -errno;
    zone_t *z = (zone_t *)base;
    int rc = 0;
    pthread_once(&my_pid_once, learn_pid_once);
    if (z->magic != ZONE_MAGIC || z->size != (size_t)st.st_size)
        rc = MS_SHDICT_EBADZONE;
    else if (z->version != ZONE_VERSION)
        rc = MS_SHDICT_EVERSION;
    else if (name != NULL && strcmp(name, z->name) != 0)
        rc = MS_SHDICT_ENAME;
    else if (size != 0 && (size & ~(size_t)63) != z->size)
        rc = MS_SHDICT_ESIZE;
    if (rc < 0) {
        munmap(base, (size_t)st.st_size);
        return rc;
    }
    ms_shdict_t *d = ms_mem_alloc(sizeof(*d));
    d->base = base;
    d->z = z;
    d->size = (size_t)st.st_size;
    *out = d;
    return 0;
}

void ms_shdict_detach(ms_shdict_t *d)
{
    if (d == NULL)
        return;
    munmap(d->base, d->size);
    ms_mem_free(d);
}

const char *ms_shdict_name(ms_shdict_t *d)
{
    return d->z->name;
}

size_t ms_shdict_capacity(ms_shdict_t *d)
{
    return d->size;
}

size_t ms_shdict_free_space(ms_shdict_t *d)
{
    /* One aligned 8-byte load: no lock needed for a figure that is stale at once anyway. */
    return (size_t)__atomic_load_n(&d->z->free_bytes, __ATOMIC_RELAXED);
}

/* -- Operations -------------------------------------------------------------------------------- */

/* The checks and the lock every operation on a key begins with: the key's hash in *h, and
 * the zone locked (0), or a negative code with nothing locked. */
static int lock_key(ms_shdict_t *d, const char *key, size_t klen, uint32_t *h)
{
    int rc = check_key(key, klen);
    if (rc < 0)
        return rc;
    *h = hash_key(d->z->seed, key, klen);
    return zone_lock(d);
}

/* Copies a string or table of `len` bytes out, or reports its size. */
static long value_out(const char *p, size_t len, char *buf, size_t cap)
{
    if (len <= cap && len != 0)
        memcpy(buf, p, len);
    return (long)len;
}

long ms_shdict_get(ms_shdict_t *d, const char *key, size_t klen, char *buf, size_t cap, int stale,
                   ms_shdict_val_t *v)
{
    uint32_t h;
    int rc = lock_key(d, key, klen, &h);
    if (rc < 0)
        return rc;
    long ret;
    node_t *n = lookup(d, h, key, klen);
    int expired = n != NULL && n->expires != 0 && is_expired(n, now_ms());
    if (n == NULL || (expired && !stale)) {
        ret = MS_SHDICT_ENOTFOUND;
        goto out;
    }
    v->type = n->type;
    v->stale = expired;
    v->flags = n->flags;
    v->num = 0;
    v->len = 0;
    ret = 0;
    switch (n->type) {
    case MS_SHDICT_NUMBER: memcpy(&v->num, node_val(n), sizeof(double)); break;
    case MS_SHDICT_BOOLEAN: v->num = node_val(n)[0] != 0; break;
    case MS_SHDICT_LIST: ret = MS_SHDICT_EISLIST; break;
    default: v->len = n->value_len; ret = value_out(node_val(n), n->value_len, buf, cap);
    }
    if (!expired && d->z->lru_head != off_of(d, n)) {
        change_begin(d->z);
        lru_touch(d, n);
        change_end(d->z);
    }
out:
    zone_unlock(d);
    return ret;
}

int ms_shdict_store(ms_shdict_t *d, int op, const char *key, size_t klen, int type, const char *str,
                    size_t len, double num, double exptime, uint32_t flags, int *forcible)
{
    if (forcible != NULL)
        *forcible = 0;
    int rc = check_key(key, klen);
    if (rc < 0)
        return rc;
    if (op < MS_SHDICT_SET || op > MS_SHDICT_REPLACE || !(exptime >= 0))
        return MS_SHDICT_EBADARG;
    const void *val = str;
    size_t vlen = len;
    uint8_t b;
    switch (type) {
    case MS_SHDICT_STRING:
    case MS_SHDICT_TABLE:
        if (len > UINT32_MAX)
            return MS_SHDICT_ENOMEM;
        break;
    case MS_SHDICT_NUMBER:
        val = &num;
        vlen = sizeof(double);
        break;
    case MS_SHDICT_BOOLEAN:
        b = num != 0;
        val = &b;
        vlen = 1;
        break;
    case MS_SHDICT_NIL: vlen = 0; break;
    default: return MS_SHDICT_EBADTYPE;
    }
    int safe = op == MS_SHDICT_SAFE_SET || op == MS_SHDICT_SAFE_ADD;
    uint32_t h = hash_key(d->z->seed, key, klen);
    if ((rc = zone_lock(d)) < 0)
        return rc;
    change_begin(d->z);
    int64_t now = now_ms();
    node_t *n = lookup(d, h, key, klen);
    int live = n != NULL && !is_expired(n, now);
    if ((op == MS_SHDICT_ADD || op == MS_SHDICT_SAFE_ADD) && live)
        rc = MS_SHDICT_EEXISTS;
    else if (op == MS_SHDICT_REPLACE && !live)
        rc = MS_SHDICT_ENOTFOUND;
    else if (type == MS_SHDICT_NIL) {
        if (n != NULL)
            entry_free(d, n);
    } else if (entry_put(d, n, h, key, klen, type, val, vlen, flags, expiry(exptime, now), safe,
                         forcible, now) == NULL)
        rc = MS_SHDICT_ENOMEM;
    change_end(d->z);
    zone_unlock(d);
    return rc;
}

int ms_shdict_incr(ms_shdict_t *d, const char *key, size_t klen, double n, int has_init,
                   double init, double init_ttl, double *out, int *forcible)
{
    if (forcible != NULL)
        *forcible = 0;
    if (has_init && !(init_ttl >= 0))
        return MS_SHDICT_EBADARG;
    uint32_t h;
    int rc = lock_key(d, key, klen, &h);
    if (rc < 0)
        return rc;
    change_begin(d->z);
    int64_t now = now_ms();
    node_t *e = lookup(d, h, key, klen);
    if (e != NULL && !is_expired(e, now)) {
        if (e->type != MS_SHDICT_NUMBER) {
            rc = MS_SHDICT_ENAN;
        } else {
            double v;
            memcpy(&v, node_val(e), sizeof(v));
            v += n;
            memcpy(node_val(e), &v, sizeof(v));
            lru_touch(d, e);
            *out = v;
        }
    } else if (!has_init) {
        rc = MS_SHDICT_ENOTFOUND;
    } else {
        double v = init + n;
        if (entry_put(d, e, h, key, klen, MS_SHDICT_NUMBER, &v, sizeof(v), 0, expiry(init_ttl, now),
                      0, forcible, now) == NULL)
            rc = MS_SHDICT_ENOMEM;
        else
            *out = v;
    }
    change_end(d->z);
    zone_unlock(d);
    return rc;
}

/* -- Sliding logs for rate limits ------------------------------------------------------------
 * The log is a ring of the last `limit` admission times: { uint32 head, uint32 count, int64
 * t[limit] }, oldest at head. Times are the zone's clock (CLOCK_MONOTONIC in ms, one for all
 * processes), so every worker reads the others' entries rightly. The flags mark the value as a
 * log, so a key reused for something else is never read as one. */

#define WINDOW_FLAGS 0x6d73726cu /* "msrl" */

typedef struct window_head_s {
    uint32_t head, count;
} window_head_t;

int ms_shdict_window_take(ms_shdict_t *d, const char *key, size_t klen, uint32_t limit,
                          int64_t window_ms, uint32_t *left, int64_t *wait_ms)
{
    if (limit == 0 || limit > MS_SHDICT_WINDOW_MAX || window_ms <= 0)
        return MS_SHDICT_EBADARG;
    uint32_t h;
    int rc = lock_key(d, key, klen, &h);
    if (rc < 0)
        return rc;
    change_begin(d->z);
    int64_t now = now_ms();
    size_t vlen = sizeof(window_head_t) + (size_t)limit * sizeof(int64_t);
    node_t *e = lookup(d, h, key, klen);
    if (e == NULL || is_expired(e, now) || e->type != MS_SHDICT_STRING ||
        e->flags != WINDOW_FLAGS || e->value_len != vlen) {
        /* A new log: its expiry is set below, with the admission it records. */
        e = entry_put(d, e, h, key, klen, MS_SHDICT_STRING, NULL, vlen, WINDOW_FLAGS, 0, 0, NULL,
                      now);
        if (e == NULL) {
            rc = MS_SHDICT_ENOMEM;
            goto out;
        }
        window_head_t zero = {0, 0};
        memcpy(node_val(e), &zero, sizeof(zero));
    }
    char *v = node_val(e);
    window_head_t wh;
    memcpy(&wh, v, sizeof(wh));
    int64_t *ring = (int64_t *)(void *)(v + sizeof(wh)); /* node_val is 8-aligned */
    /* An admission at time s counts while now - window < s: drop those older. */
    while (wh.count > 0 && ring[wh.head] <= now - window_ms) {
        wh.head = (wh.head + 1) % limit;
        wh.count--;
    }
    if (wh.count < limit) {
        ring[(wh.head + wh.count) % limit] = now;
        wh.count++;
        /* The log is worth nothing once its newest entry left: at now + window (is_expired
         * counts a time past `expires`). */
        e->expires = now + window_ms - 1;
        rc = 1;
    } else {
        rc = 0;
    }
    memcpy(v, &wh, sizeof(wh));
    lru_touch(d, e);
    *left = limit - wh.count;
    *wait_ms = ring[wh.head] + window_ms - now;
out:
    change_end(d->z);
    zone_unlock(d);
    return rc;
}

int ms_shdict_delete(ms_shdict_t *d, const char *key, size_t klen)
{
    return ms_shdict_store(d, MS_SHDICT_SET, key, klen, MS_SHDICT_NIL, NULL, 0, 0, 0, 0, NULL);
}

int ms_shdict_ttl(ms_shdict_t *d, const char *key, size_t klen, double *ttl)
{
    uint32_t h;
    int rc = lock_key(d, key, klen, &h);
    if (rc < 0)
        return rc;
    node_t *n = lookup(d, h, key, klen);
    if (n == NULL)
        rc = MS_SHDICT_ENOTFOUND;
    else
        *ttl = n->expires == 0 ? 0 : (double)(n->expires - now_ms()) / 1000;
    zone_unlock(d);
    return rc;
}

int ms_shdict_expire(ms_shdict_t *d, const char *key, size_t klen, double exptime)
{
    if (!(exptime >= 0))
        return MS_SHDICT_EBADARG;
    uint32_t h;
    int rc = lock_key(d, key, klen, &h);
    if (rc < 0)
        return rc;
    node_t *n = lookup(d, h, key, klen);
    if (n == NULL)
        rc = MS_SHDICT_ENOTFOUND;
    else
        n->expires = expiry(exptime, now_ms()); /* one field: nothing can be half done */
    zone_unlock(d);
    return rc;
}

int ms_shdict_flush_all(ms_shdict_t *d)
{
    int rc = zone_lock(d);
    if (rc < 0)
        return rc;
    for (uint32_t off = d->z->lru_head; off != 0;) {
        node_t *n = AT(d, off);
        n->expires = 1; /* long past: the clock starts above it */
        off = n->lru_next;
    }
    zone_unlock(d);
    return 0;
}

int ms_shdict_flush_expired(ms_shdict_t *d, int max)
{
    int rc = zone_lock(d);
    if (rc < 0)
        return rc;
    change_begin(d->z);
    int64_t now = now_ms();
    int freed = 0;
    for (uint32_t off = d->z->lru_tail; off != 0 && (max <= 0 || freed < max);) {
        node_t *n = AT(d, off);
        off = n->lru_prev;
        if (is_expired(n, now)) {
            entry_free(d, n);
            freed++;
        }
    }
    change_end(d->z);
    zone_unlock(d);
    return freed;
}

int ms_shdict_get_keys(ms_shdict_t *d, int max, char *buf, size_t cap, size_t *needed)
{
    int rc = zone_lock(d);
    if (rc < 0)
        return rc;
    int64_t now = now_ms();
    int count = 0;
    size_t at = 0;
    for (uint32_t off = d->z->lru_head; off != 0 && (max <= 0 || count < max);) {
        node_t *n = AT(d, off);
        off = n->lru_next;
        if (is_expired(n, now))
            continue;
        uint16_t len = n->key_len;
        if (at + sizeof(len) + len <= cap) {
            memcpy(buf + at, &len, sizeof(len));
            memcpy(buf + at + sizeof(len), node_key(n), len);
        }
        at += sizeof(len) + len;
        count++;
    }
    zone_unlock(d);
    *needed = at;
    return count;
}

/* -- Lists ------------------------------------------------------------------------------------- */

long ms_shdict_push(ms_shdict_t *d, const char *key, size_t klen, int left, int type,
                    const char *str, size_t len, double num)
{
    const void *val = str;
    if (type == MS_SHDICT_NUMBER) {
        val = &num;
        len = sizeof(double);
    } else if (type != MS_SHDICT_STRING) {
        return MS_SHDICT_EBADTYPE;
    } else if (len > UINT32_MAX) {
        return MS_SHDICT_ENOMEM;
    }
    unsigned k = order_for(sizeof(elem_t) + len);
    uint32_t h;
    int rc = lock_key(d, key, klen, &h);
    if (rc < 0)
        return rc;
    zone_t *z = d->z;
    change_begin(z);
    int64_t now = now_ms();
    long ret;
    node_t *n = lookup(d, h, key, klen);
    if (n != NULL && is_expired(n, now)) {
        entry_free(d, n);
        n = NULL;
    }
    if (n != NULL && n->type != MS_SHDICT_LIST) {
        ret = MS_SHDICT_ENOTLIST;
        goto out;
    }
    if (k > z->top_order) {
        ret = MS_SHDICT_ENOMEM;
        goto out;
    }
    if (n == NULL) {
        list_t empty = {0, 0, 0};
        n = entry_put(d, NULL, h, key, klen, MS_SHDICT_LIST, &empty, sizeof(empty), 0, 0, 0, NULL,
                      now);
        if (n == NULL) {
            ret = MS_SHDICT_ENOMEM;
            goto out;
        }
    } else {
        lru_touch(d, n);
    }
    uint32_t eoff = alloc_evicting(d, k, BLK_ELEM, off_of(d, n), 0, NULL, now);
    list_t *l = (list_t *)node_val(n);
    if (eoff == 0) {
        if (l->count == 0)
            entry_free(d, n);
        ret = MS_SHDICT_ENOMEM;
        goto out;
    }
    elem_t *e = AT(d, eoff);
    e->type = (uint8_t)type;
    e->len = (uint32_t)len;
    e->owner = off_of(d, n);
    memcpy(e + 1, val, len);
    if (left) {
        e->prev = 0;
        e->next = l->head;
        if (l->head != 0)
            ((elem_t *)AT(d, l->head))->prev = eoff;
        else
            l->tail = eoff;
        l->head = eoff;
    } else {
        e->next = 0;
        e->prev = l->tail;
        if (l->tail != 0)
            ((elem_t *)AT(d, l->tail))->next = eoff;
        else
            l->head = eoff;
        l->tail = eoff;
    }
    ret = ++l->count;
out:
    change_end(z);
    zone_unlock(d);
    return ret;
}

long ms_shdict_pop(ms_shdict_t *d, const char *key, size_t klen, int left, char *buf, size_t cap,
                   ms_shdict_val_t *v)
{
    uint32_t h;
    int rc = lock_key(d, key, klen, &h);
    if (rc < 0)
        return rc;
    change_begin(d->z);
    long ret;
    node_t *n = lookup(d, h, key, klen);
    if (n == NULL || is_expired(n, now_ms())) {
        ret = MS_SHDICT_ENOTFOUND;
        goto out;
    }
    if (n->type != MS_SHDICT_LIST) {
        ret = MS_SHDICT_ENOTLIST;
        goto out;
    }
    list_t *l = (list_t *)node_val(n);
    uint32_t eoff = left ? l->head : l->tail;
    elem_t *e = AT(d, eoff);
    v->type = e->type;
    v->stale = 0;
    v->flags = 0;
    v->num = 0;
    v->len = 0;
    ret = 0;
    if (e->type == MS_SHDICT_NUMBER) {
        memcpy(&v->num, e + 1, sizeof(double));
    } else {
        v->len = e->len;
        ret = value_out((const char *)(e + 1), e->len, buf, cap);
        if (e->len > cap)
            goto out; /* not popped: the caller comes back with room */
    }
    if (left) {
        l->head = e->next;
        if (l->head != 0)
            ((elem_t *)AT(d, l->head))->prev = 0;
        else
            l->tail = 0;
    } else {
        l->tail = e->prev;
        if (l->tail != 0)
            ((elem_t *)AT(d, l->tail))->next = 0;
        else
            l->head = 0;
    }
    blk_free(d, eoff);
    if (--l->count == 0)
        entry_free(d, n);
    else
        lru_touch(d, n);
out:
    change_end(d->z);
    zone_unlock(d);
    return ret;
}

long ms_shdict_llen(ms_shdict_t *d, const char *key, size_t klen)
{
    uint32_t h;
    int rc = lock_key(d, key, klen, &h);
    if (rc < 0)
        return rc;
    long ret = 0;
    node_t *n = lookup(d, h, key, klen);
    if (n != NULL && !is_expired(n, now_ms()))
        ret = n->type == MS_SHDICT_LIST ? (long)((list_t *)node_val(n))->count
                                        : (long)MS_SHDICT_ENOTLIST;
    zone_unlock(d);
    return ret;
}

/* -- Checking ---------------------------------------------------------------------------------- */

#define CHECK(cond, msg)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            *why = msg;                                                                            \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* Whether `off` may be a block's offset: walking a broken link must not leave the zone. */
#define IN_AREA(z, off)                                                                            \
    ((off) >= (z)->area && (uint64_t)(off) + 32 <= (uint64_t)(z)->area + (z)->area_len)

int ms_shdict_check(ms_shdict_t *d, const char **why)
{
    if (zone_lock(d) < 0) {
        *why = "lock";
        return -1;
    }
    zone_t *z = d->z;
    uint64_t free_bytes = 0, free_blocks = 0, nodes = 0, elems = 0;
    /* The area is a tiling of blocks. */
    for (uint64_t p = 0; p < z->area_len;) {
        blk_t *b = AT(d, z->area + p);
        CHECK(b->order >= MIN_ORDER && b->order <= z->top_order, "a block's order");
        uint64_t size = (uint64_t)1 << b->order;
        CHECK((p & (size - 1)) == 0 && p + size <= z->area_len, "a block's alignment");
        CHECK(top_block_order(z, p) >= b->order, "a block across top-level blocks");
        if (b->kind == BLK_FREE) {
            free_bytes += size;
            free_blocks++;
        } else if (b->kind == BLK_NODE) {
            node_t *n = (node_t *)b;
            CHECK(sizeof(node_t) + ALIGN8(n->key_len) + n->value_len <= size, "a node's size");
            CHECK(n->hash == hash_key(z->seed, node_key(n), n->key_len), "a node's hash");
            nodes++;
        } else {
            CHECK(b->kind == BLK_ELEM, "a block's kind");
            elem_t *e = (elem_t *)b;
            CHECK(sizeof(elem_t) + e->len <= size, "an element's size");
            CHECK(IN_AREA(z, e->owner), "an element's owner's offset");
            node_t *o = AT(d, e->owner);
            CHECK(o->kind == BLK_NODE && o->type == MS_SHDICT_LIST, "an element's owner");
            elems++;
        }
        p += size;
    }
    CHECK(free_bytes == z->free_bytes, "the free byte count");
    /* Every free list holds free blocks of its order, linked both ways. */
    uint64_t listed = 0;
    for (unsigned k = 0; k < NORDERS; k++) {
        uint32_t prev = 0;
        for (uint32_t off = z->free_head[k]; off != 0; off = ((free_blk_t *)AT(d, off))->next) {
            CHECK(IN_AREA(z, off), "a free list's link");
            free_blk_t *f = AT(d, off);
            CHECK(f->kind == BLK_FREE && f->order == k && f->prev == prev, "a free list");
            CHECK(++listed <= free_blocks, "a free list's length");
            prev = off;
        }
    }
    CHECK(listed == free_blocks, "a free block that no list holds");
    /* The LRU list and the chains hold every node once. */
    uint64_t lru = 0, list_elems = 0;
    uint32_t prev = 0;
    for (uint32_t off = z->lru_head; off != 0; off = ((node_t *)AT(d, off))->lru_next) {
        CHECK(IN_AREA(z, off), "an LRU link");
        node_t *n = AT(d, off);
        CHECK(n->kind == BLK_NODE && n->lru_prev == prev, "the LRU list");
        CHECK(++lru <= nodes, "the LRU list's length");
        CHECK(lookup(d, n->hash, node_key(n), n->key_len) == n, "a node its chain lacks");
        if (n->type == MS_SHDICT_LIST) {
            list_t *l = (list_t *)node_val(n);
            uint32_t eprev = 0, count = 0;
            for (uint32_t e = l->head; e != 0; e = ((elem_t *)AT(d, e))->next) {
                CHECK(IN_AREA(z, e), "a list's link");
                elem_t *el = AT(d, e);
                CHECK(el->kind == BLK_ELEM && el->owner == off && el->prev == eprev, "a list");
                CHECK(++count <= l->count, "a list's length");
                eprev = e;
            }
            CHECK(count == l->count && l->tail == eprev && count > 0, "a list's count");
            list_elems += count;
        }
        prev = off;
    }
    CHECK(z->lru_tail == prev && lru == nodes && nodes == z->count, "the entry count");
    CHECK(list_elems == elems, "an element no list holds");
    uint64_t chained = 0;
    for (uint32_t i = 0; i < z->nbuckets; i++)
        for (uint32_t off = buckets(d)[i]; off != 0; off = ((node_t *)AT(d, off))->hnext) {
            CHECK(IN_AREA(z, off), "a chain's link");
            node_t *n = AT(d, off);
            CHECK(n->kind == BLK_NODE && (n->hash & (z->nbuckets - 1)) == i, "a chain");
            CHECK(++chained <= nodes, "a chain's length");
        }
    CHECK(chained == nodes, "a node no chain holds");
    zone_unlock(d);
    return 0;
fail:
    zone_unlock(d);
    return -1;
}
