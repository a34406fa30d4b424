/* shdict.h: dictionaries in shared memory, one zone each, shared by the workers of one
 * server: OpenResty's ngx.shared.DICT. docs/shared-dicts.md describes the zone. */
#ifndef MS_SHDICT_H
#define MS_SHDICT_H

#include <stddef.h>
#include <stdint.h>

/* A process's handle on a zone: its own mapping of the memfd. The zone itself holds no
 * pointer, only offsets, so every process may map it at a different address. */
typedef struct ms_shdict_s ms_shdict_t;

/* The API is exported from the core's module: Lua calls it through the FFI
 * (lua/moonserve/host/core/shared.lua), as it does the ms_ffi_* functions. */
#define MS_SHDICT_API __attribute__((visibility("default")))

/* The smallest and largest zone. Offsets inside a zone are 32 bits. */
#define MS_SHDICT_MIN_SIZE ((size_t)16 * 1024)
#define MS_SHDICT_MAX_SIZE ((size_t)UINT32_MAX + 1 - 65536)
/* The longest key and the longest zone name, as OpenResty has them. */
#define MS_SHDICT_KEY_MAX  65535
#define MS_SHDICT_NAME_MAX 63

/* The type of a value. TABLE is opaque bytes that the Lua side encodes (string.buffer). A
 * LIST is what lpush/rpush make; its elements are strings or numbers. */
enum {
    MS_SHDICT_NIL,
    MS_SHDICT_STRING,
    MS_SHDICT_NUMBER,
    MS_SHDICT_BOOLEAN,
    MS_SHDICT_TABLE,
    MS_SHDICT_LIST,
};

/* The flavours of ms_shdict_store(). The SAFE_ ones never evict a live entry. */
enum {
    MS_SHDICT_SET,
    MS_SHDICT_SAFE_SET,
    MS_SHDICT_ADD,
    MS_SHDICT_SAFE_ADD,
    MS_SHDICT_REPLACE,
};

/* X(name, value, message): the messages are OpenResty's, returned to Lua as they are.
 * The values sit beside errors.h's MS_E* range, far below libuv's. */
#define MS_SHDICT_ERRNO_MAP(X)                                                                     \
    X(ENOTFOUND, -10101, "not found")                                                              \
    X(EEXISTS, -10102, "exists")                                                                   \
    X(ENOMEM, -10103, "no memory")                                                                 \
    X(ENAN, -10104, "not a number")                                                                \
    X(ENOTLIST, -10105, "value not a list")                                                        \
    X(EISLIST, -10114, "value is a list")                                                          \
    X(EBADTYPE, -10106, "bad value type")                                                          \
    X(EEMPTYKEY, -10107, "empty key")                                                              \
    X(EKEYLONG, -10108, "key too long")                                                            \
    X(EBADARG, -10109, "bad argument")                                                             \
    X(EBADZONE, -10110, "not a shared dictionary zone")                                            \
    X(ESIZE, -10111, "the shared dictionary has another size")                                     \
    X(ENAME, -10112, "the shared dictionary has another name")                                     \
    X(EVERSION, -10113, "the zone was made by another version of moonserve (restart the server)")

enum {
#define MS_SHDICT_ERR_ENUM(name, value, msg) MS_SHDICT_##name = (value),
    MS_SHDICT_ERRNO_MAP(MS_SHDICT_ERR_ENUM)
#undef MS_SHDICT_ERR_ENUM
};

/* The message of a negative code: OpenResty's string for MS_SHDICT_E*, else ms_strerror(). */
MS_SHDICT_API const char *ms_shdict_strerror(int err);

/* What a read found. Filled by ms_shdict_get() and ms_shdict_pop(). */
typedef struct ms_shdict_val_s {
    int type;       /* MS_SHDICT_STRING, ... */
    int stale;      /* 1 when ms_shdict_get(..., stale = 1) found an expired entry */
    uint32_t flags; /* the user flags given to ms_shdict_store() */
    double num;     /* NUMBER: the value; BOOLEAN: 0 or 1 */
    size_t len;     /* STRING, TABLE: the value's length, even when it did not fit */
} ms_shdict_val_t;

/* -- Zones ----------------------------------------------------------------------------------- */

/* Makes a zone of `size` bytes (rounded down to a multiple of 64) named `name`, in a memfd
 * whose size is sealed. The master calls it once per dictionary and keeps the descriptor
 * (close-on-exec: a worker gets it over its channel) across reloads. Returns the fd or a
 * negative code (UV_EINVAL for a bad size or name, -errno). */
MS_SHDICT_API int ms_shdict_create(const char *name, size_t size);

/* Maps the zone of `fd` and checks its header. `name` and `size`, when not NULL and not 0,
 * must be what the zone was made with: otherwise MS_SHDICT_ENAME or MS_SHDICT_ESIZE, so
 * that a reload that changes a dictionary's size can fail with a clear message. Returns 0
 * and sets *out, or a negative code (MS_SHDICT_EBADZONE, MS_SHDICT_EVERSION, -errno). The fd
 * stays the caller's. */
MS_SHDICT_API int ms_shdict_attach(int fd, const char *name, size_t size, ms_shdict_t **out);
/* Tells the zone that process `pid` has died: if it held the lock, the lock is free again (and
 * the next holder flushes the zone if the dead one was changing it). The master calls it for
 * every zone when it learns that a worker died. Returns 1 if `pid` held the lock, else 0. */
MS_SHDICT_API int ms_shdict_forsake(ms_shdict_t *d, int pid);
/* Unmaps the zone and frees the handle. The zone lives on while any process maps it or
 * holds its fd. */
MS_SHDICT_API void ms_shdict_detach(ms_shdict_t *d);
/* The name the zone was made with. */
MS_SHDICT_API const char *ms_shdict_name(ms_shdict_t *d);

/* -- Operations ------------------------------------------------------------------------------
 * Each is atomic across every process that maps the zone. Keys are 1 to MS_SHDICT_KEY_MAX
 * bytes (else MS_SHDICT_EEMPTYKEY, MS_SHDICT_EKEYLONG). Times are seconds, with millisecond
 * resolution; an exptime of 0 is "never". Nothing returned points into the zone. */

/* Copies the value of `key` into buf[0..cap) and describes it in *v. Returns the length of
 * a STRING or TABLE value (if it is more than `cap`, nothing was copied: call again with a
 * buffer that large), 0 for the other types, MS_SHDICT_ENOTFOUND, or MS_SHDICT_EISLIST (a
 * list's key). With `stale` set, an expired entry not yet freed is returned too, with v->stale = 1
 * (get_stale). A hit makes the entry the most recently used. */
MS_SHDICT_API long ms_shdict_get(ms_shdict_t *d, const char *key, size_t klen, char *buf,
                                 size_t cap, int stale, ms_shdict_val_t *v);

/* set, safe_set, add, safe_add, replace (`op`) of a value of `type`: STRING or TABLE take
 * str[0..len), NUMBER takes num, BOOLEAN takes num != 0; NIL deletes the key (as set(key,
 * nil) does). Returns 0; MS_SHDICT_EEXISTS (add on a live key), MS_SHDICT_ENOTFOUND (replace
 * on a missing or expired one), MS_SHDICT_ENOMEM (a SAFE_ op that would have to evict, or a
 * value larger than the zone can hold). *forcible (may be NULL) is set to 1 when live
 * entries were evicted to make room. */
MS_SHDICT_API int ms_shdict_store(ms_shdict_t *d, int op, const char *key, size_t klen, int type,
                                  const char *str, size_t len, double num, double exptime,
                                  uint32_t flags, int *forcible);

/* Adds `n` to a NUMBER value and sets *out to the sum. A missing (or expired) key is
 * MS_SHDICT_ENOTFOUND unless `has_init`: then it is made as init + n, with init_ttl (0:
 * never expires), evicting as set does (*forcible). A value of another type is
 * MS_SHDICT_ENAN. The expiry and flags of an existing entry are kept. */
MS_SHDICT_API int ms_shdict_incr(ms_shdict_t *d, const char *key, size_t klen, double n,
                                 int has_init, double init, double init_ttl, double *out,
                                 int *forcible);

/* A sliding log of admissions under `key`, for rate limits: admits (returns 1) when fewer
 * than `limit` admissions happened in the last `window_ms` milliseconds, recording this one,
 * else refuses (returns 0) and records nothing. Check and record happen under the zone's lock,
 * so the workers of an instance together never admit more than `limit` in any window. *left
 * is the admissions still open now; *wait_ms the time until the oldest admission counted
 * leaves the window (on a refusal: when the next request may pass). The value is a STRING of
 * 8 + 8 * limit bytes that only this call reads; a key holding anything else (another limit, a
 * value set by hand) starts a new log. Returns a negative code for a bad key or argument
 * (limit 1 to MS_SHDICT_WINDOW_MAX, window_ms above 0), or MS_SHDICT_ENOMEM. */
#define MS_SHDICT_WINDOW_MAX 65536
MS_SHDICT_API int ms_shdict_window_take(ms_shdict_t *d, const char *key, size_t klen,
                                        uint32_t limit, int64_t window_ms, uint32_t *left,
                                        int64_t *wait_ms);

/* Removes the key, if there is one. Returns 0. */
MS_SHDICT_API int ms_shdict_delete(ms_shdict_t *d, const char *key, size_t klen);
/* Sets *ttl to the seconds left (0: no expiry; negative: expired but not yet freed). Returns
 * 0 or MS_SHDICT_ENOTFOUND. */
MS_SHDICT_API int ms_shdict_ttl(ms_shdict_t *d, const char *key, size_t klen, double *ttl);
/* Gives the key (even an expired one not yet freed) a new exptime. Returns 0 or
 * MS_SHDICT_ENOTFOUND. */
MS_SHDICT_API int ms_shdict_expire(ms_shdict_t *d, const char *key, size_t klen, double exptime);
/* Marks every entry expired, as OpenResty does: get_stale still sees them until they are
 * freed (by flush_expired, or to make room). Returns 0. */
MS_SHDICT_API int ms_shdict_flush_all(ms_shdict_t *d);
/* Frees up to `max` expired entries (0: all). Returns how many. */
MS_SHDICT_API int ms_shdict_flush_expired(ms_shdict_t *d, int max);
/* Lists up to `max` live keys (0: all), each written into buf as its length (a uint16_t in
 * native byte order, unaligned) then its bytes. Returns the number of keys and sets
 * *needed to the bytes they take; if that is more than `cap`, buf is not to be read: call
 * again with that much room. */
MS_SHDICT_API int ms_shdict_get_keys(ms_shdict_t *d, int max, char *buf, size_t cap,
                                     size_t *needed);

/* lpush (`left`) or rpush of a STRING (str[0..len)) or NUMBER (num) element: a missing or
 * expired key becomes a new list with no expiry. Returns the list's new length,
 * MS_SHDICT_ENOTLIST, MS_SHDICT_EBADTYPE or MS_SHDICT_ENOMEM. Evicts other entries as set
 * does. */
MS_SHDICT_API long ms_shdict_push(ms_shdict_t *d, const char *key, size_t klen, int left, int type,
                                  const char *str, size_t len, double num);
/* lpop (`left`) or rpop into buf[0..cap) and *v, as ms_shdict_get() does; a list left empty
 * is removed. Returns what ms_shdict_get() would; if a string element is longer than
 * `cap`, nothing was popped: call again with a buffer that large. MS_SHDICT_ENOTFOUND for a
 * missing or expired key (Lua: nil), MS_SHDICT_ENOTLIST. */
MS_SHDICT_API long ms_shdict_pop(ms_shdict_t *d, const char *key, size_t klen, int left, char *buf,
                                 size_t cap, ms_shdict_val_t *v);
/* The length of a list: 0 for a missing or expired key, or MS_SHDICT_ENOTLIST. */
MS_SHDICT_API long ms_shdict_llen(ms_shdict_t *d, const char *key, size_t klen);

/* The zone's size in bytes, as made. */
MS_SHDICT_API size_t ms_shdict_capacity(ms_shdict_t *d);
/* The bytes of the allocator that are free now (not counting space inside used blocks). */
MS_SHDICT_API size_t ms_shdict_free_space(ms_shdict_t *d);

/* Checks the zone's structures (every block, free list, chain and the LRU) under the lock:
 * for tests and fuzzing, O(size). Returns 0, or -1 with *why pointing at a static string. */
MS_SHDICT_API int ms_shdict_check(ms_shdict_t *d, const char **why);

#endif
