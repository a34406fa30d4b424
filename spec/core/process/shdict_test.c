/* shdict_test.c: shared dictionaries: every operation and its errors, expiry, eviction, and
 * several processes on one zone, one of them killed while it holds the lock. */
#define _GNU_SOURCE /* memfd_create, before any header */
#include "test.h"

#include "../../../core/process/shdict.c"

#include <signal.h>
#include <sys/wait.h>

#define K(lit) lit, sizeof(lit) - 1

#define ASSERT_SOUND(d)                                                                            \
    do {                                                                                           \
        const char *why_ = NULL;                                                                   \
        if (ms_shdict_check((d), &why_) != 0)                                                      \
            TEST_FAIL("the zone is broken: %s", why_);                                             \
    } while (0)

/* -- Helpers ---------------------------------------------------------------------------------- */

/* The tests' clock: it moves only when a test says so. */
static int64_t fake_ms = 1000000;

static int64_t fake_now(void)
{
    return fake_ms;
}

static ms_shdict_t *dict(const char *name, size_t size, int *fd)
{
    *fd = ms_shdict_create(name, size);
    ms_shdict_t *d = NULL;
    if (*fd < 0 || ms_shdict_attach(*fd, name, size, &d) < 0)
        return NULL;
    return d;
}

static void dict_close(ms_shdict_t *d, int fd)
{
    ms_shdict_detach(d);
    close(fd);
}

static int set(ms_shdict_t *d, int op, const char *key, const char *val, double exptime)
{
    return ms_shdict_store(d, op, key, strlen(key), MS_SHDICT_STRING, val, strlen(val), 0, exptime,
                           0, NULL);
}

/* The string under `key`, or NULL; `stale` as ms_shdict_get() has it. */
static char got[4096];
static ms_shdict_val_t gotv;

static const char *get(ms_shdict_t *d, const char *key, int stale)
{
    long n = ms_shdict_get(d, key, strlen(key), got, sizeof(got) - 1, stale, &gotv);
    if (n < 0 || (size_t)n >= sizeof(got))
        return NULL;
    got[n] = 0;
    return got;
}

static double incr(ms_shdict_t *d, const char *key, double n)
{
    double out = -12345;
    int rc = ms_shdict_incr(d, key, strlen(key), n, 0, 0, 0, &out, NULL);
    return rc < 0 ? rc : out;
}

static char log_line[1024];
static int log_lines;

static void log_capture(int level, const char *msg, size_t len)
{
    log_lines++;
    snprintf(log_line, sizeof(log_line), "%.*s", (int)len, msg);
}

/* -- Zones ------------------------------------------------------------------------------------ */

TEST(shdict_makes_a_zone_and_attaches_to_it)
{
    int fd;
    ms_shdict_t *d = dict("cache", 1 << 20, &fd);
    ASSERT(d != NULL);
    ASSERT_STR_EQ("cache", ms_shdict_name(d));
    ASSERT_EQ(1 << 20, ms_shdict_capacity(d));
    ASSERT(ms_shdict_free_space(d) > (1 << 20) / 100 * 97); /* the rest: header, buckets */
    ASSERT(ms_shdict_free_space(d) < (1 << 20));
    ASSERT_SOUND(d);
    dict_close(d, fd);
}

TEST(shdict_refuses_a_bad_size_or_name)
{
    ASSERT_EQ(UV_EINVAL, ms_shdict_create("x", 1024));
    ASSERT_EQ(UV_EINVAL, ms_shdict_create("", 1 << 20));
    ASSERT_EQ(UV_EINVAL, ms_shdict_create(NULL, 1 << 20));
    char longname[80];
    memset(longname, 'n', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = 0;
    ASSERT_EQ(UV_EINVAL, ms_shdict_create(longname, 1 << 20));
}

TEST(shdict_attach_reports_another_size_or_name)
{
    int fd = ms_shdict_create("sessions", 1 << 20);
    ASSERT(fd >= 0);
    ms_shdict_t *d = NULL;
    /* A reload that declares the dictionary with another size must be able to say so. */
    ASSERT_EQ(MS_SHDICT_ESIZE, ms_shdict_attach(fd, "sessions", 2 << 20, &d));
    ASSERT_STR_EQ("the shared dictionary has another size", ms_shdict_strerror(MS_SHDICT_ESIZE));
    ASSERT_EQ(MS_SHDICT_ENAME, ms_shdict_attach(fd, "cache", 1 << 20, &d));
    ASSERT(d == NULL);
    ASSERT_EQ(0, ms_shdict_attach(fd, NULL, 0, &d));
    ASSERT_EQ(1 << 20, ms_shdict_capacity(d));
    ms_shdict_detach(d);
    close(fd);
}

TEST(shdict_attach_refuses_what_is_not_a_zone)
{
    int fd = memfd_create("junk", MFD_CLOEXEC);
    ASSERT(fd >= 0);
    ASSERT_EQ(0, ftruncate(fd, 1 << 20));
    ms_shdict_t *d = NULL;
    ASSERT_EQ(MS_SHDICT_EBADZONE, ms_shdict_attach(fd, NULL, 0, &d));
    ASSERT_EQ(0, ftruncate(fd, 100));
    ASSERT_EQ(MS_SHDICT_EBADZONE, ms_shdict_attach(fd, NULL, 0, &d));
    close(fd);
    ASSERT_EQ(UV_EBADF, ms_shdict_attach(fd, NULL, 0, &d));
}

TEST(shdict_zone_size_is_sealed)
{
    int fd = ms_shdict_create("sealed", 1 << 16);
    ASSERT(fd >= 0);
    ASSERT(ftruncate(fd, 1 << 12) < 0); /* no process can pull the pages from under another */
    ASSERT(ftruncate(fd, 1 << 20) < 0);
    close(fd);
}

TEST(shdict_two_mappings_in_one_process_see_one_dictionary)
{
    int fd;
    ms_shdict_t *a = dict("twice", 1 << 16, &fd), *b = NULL;
    ASSERT(a != NULL);
    ASSERT_EQ(0, ms_shdict_attach(fd, "twice", 1 << 16, &b));
    ASSERT(a->base != b->base);
    ASSERT_EQ(0, set(a, MS_SHDICT_SET, "k", "from a", 0));
    ASSERT_STR_EQ("from a", get(b, "k", 0));
    ASSERT_EQ(1, ms_shdict_push(b, K("l"), 0, MS_SHDICT_STRING, K("x"), 0));
    ASSERT_EQ(1, ms_shdict_llen(a, K("l")));
    ms_shdict_detach(b);
    ASSERT_STR_EQ("from a", get(a, "k", 0));
    dict_close(a, fd);
}

TEST(shdict_error_strings_are_openrestys)
{
    ASSERT_STR_EQ("not found", ms_shdict_strerror(MS_SHDICT_ENOTFOUND));
    ASSERT_STR_EQ("exists", ms_shdict_strerror(MS_SHDICT_EEXISTS));
    ASSERT_STR_EQ("no memory", ms_shdict_strerror(MS_SHDICT_ENOMEM));
    ASSERT_STR_EQ("not a number", ms_shdict_strerror(MS_SHDICT_ENAN));
    ASSERT_STR_EQ("value not a list", ms_shdict_strerror(MS_SHDICT_ENOTLIST));
    ASSERT_STR_EQ("value is a list", ms_shdict_strerror(MS_SHDICT_EISLIST));
    ASSERT_STR_EQ("bad value type", ms_shdict_strerror(MS_SHDICT_EBADTYPE));
    ASSERT_STR_EQ("empty key", ms_shdict_strerror(MS_SHDICT_EEMPTYKEY));
    ASSERT_STR_EQ("key too long", ms_shdict_strerror(MS_SHDICT_EKEYLONG));
    ASSERT_STR_EQ("invalid argument", ms_shdict_strerror(UV_EINVAL));
}

/* -- Values ----------------------------------------------------------------------------------- */

TEST(shdict_stores_strings_numbers_booleans_and_tables)
{
    int fd;
    ms_shdict_t *d = dict("values", 1 << 16, &fd);
    ASSERT(d != NULL);
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "s", "hello", 0));
    ASSERT_STR_EQ("hello", get(d, "s", 0));
    ASSERT_EQ(MS_SHDICT_STRING, gotv.type);
    ASSERT_EQ(5, gotv.len);
    ASSERT_EQ(0, gotv.flags);
    ASSERT_EQ(0, gotv.stale);

    ASSERT_EQ(
        0, ms_shdict_store(d, MS_SHDICT_SET, K("n"), MS_SHDICT_NUMBER, NULL, 0, 3.5, 0, 7, NULL));
    ASSERT_EQ(0, ms_shdict_get(d, K("n"), NULL, 0, 0, &gotv));
    ASSERT_EQ(MS_SHDICT_NUMBER, gotv.type);
    ASSERT(gotv.num == 3.5);
    ASSERT_EQ(7, gotv.flags);

    ASSERT_EQ(0,
              ms_shdict_store(d, MS_SHDICT_SET, K("t"), MS_SHDICT_BOOLEAN, NULL, 0, 1, 0, 0, NULL));
    ASSERT_EQ(0,
              ms_shdict_store(d, MS_SHDICT_SET, K("f"), MS_SHDICT_BOOLEAN, NULL, 0, 0, 0, 0, NULL));
    ASSERT_EQ(0, ms_shdict_get(d, K("t"), NULL, 0, 0, &gotv));
    ASSERT_EQ(MS_SHDICT_BOOLEAN, gotv.type);
    ASSERT(gotv.num == 1);
    ASSERT_EQ(0, ms_shdict_get(d, K("f"), NULL, 0, 0, &gotv));
    ASSERT(gotv.num == 0);

    /* A table is opaque bytes, zeros included. */
    ASSERT_EQ(
        0, ms_shdict_store(d, MS_SHDICT_SET, K("tab"), MS_SHDICT_TABLE, "a\0b", 3, 0, 0, 0, NULL));
    char buf[8];
    ASSERT_EQ(3, ms_shdict_get(d, K("tab"), buf, sizeof(buf), 0, &gotv));
    ASSERT_EQ(MS_SHDICT_TABLE, gotv.type);
    ASSERT(memcmp(buf, "a\0b", 3) == 0);

    ASSERT_EQ(MS_SHDICT_EBADTYPE,
              ms_shdict_store(d, MS_SHDICT_SET, K("l"), MS_SHDICT_LIST, NULL, 0, 0, 0, 0, NULL));
    ASSERT_EQ(MS_SHDICT_EBADTYPE,
              ms_shdict_store(d, MS_SHDICT_SET, K("l"), 99, NULL, 0, 0, 0, 0, NULL));
    ASSERT_EQ(MS_SHDICT_EBADARG,
              ms_shdict_store(d, 99, K("l"), MS_SHDICT_NUMBER, NULL, 0, 0, 0, 0, NULL));
    ASSERT_EQ(MS_SHDICT_ENOTFOUND, ms_shdict_get(d, K("missing"), buf, sizeof(buf), 0, &gotv));
    ASSERT_SOUND(d);
    dict_close(d, fd);
}

TEST(shdict_get_reports_the_size_a_value_needs)
{
    int fd;
    ms_shdict_t *d = dict("sizes", 1 << 16, &fd);
    ASSERT(d != NULL);
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "k", "0123456789", 0));
    char buf[16];
    memset(buf, 'x', sizeof(buf));
    ASSERT_EQ(10, ms_shdict_get(d, K("k"), buf, 4, 0, &gotv));
    ASSERT_EQ('x', buf[0]); /* nothing copied */
    ASSERT_EQ(10, gotv.len);
    ASSERT_EQ(10, ms_shdict_get(d, K("k"), buf, 10, 0, &gotv));
    ASSERT(memcmp(buf, "0123456789", 10) == 0);
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "empty", "", 0));
    ASSERT_EQ(0, ms_shdict_get(d, K("empty"), NULL, 0, 0, &gotv));
    ASSERT_EQ(MS_SHDICT_STRING, gotv.type);
    dict_close(d, fd);
}

TEST(shdict_keys_are_one_to_65535_bytes)
{
    int fd;
    ms_shdict_t *d = dict("keys", 1 << 20, &fd);
    ASSERT(d != NULL);
    ASSERT_EQ(MS_SHDICT_EEMPTYKEY, ms_shdict_get(d, "", 0, NULL, 0, 0, &gotv));
    ASSERT_EQ(MS_SHDICT_EEMPTYKEY, set(d, MS_SHDICT_SET, "", "v", 0));
    static char key[65536];
    memset(key, 'k', sizeof(key));
    ASSERT_EQ(MS_SHDICT_EKEYLONG, ms_shdict_store(d, MS_SHDICT_SET, key, 65536, MS_SHDICT_STRING,
                                                  K("v"), 0, 0, 0, NULL));
    ASSERT_EQ(
        0, ms_shdict_store(d, MS_SHDICT_SET, key, 65535, MS_SHDICT_STRING, K("v"), 0, 0, 0, NULL));
    char buf[4];
    ASSERT_EQ(1, ms_shdict_get(d, key, 65535, buf, sizeof(buf), 0, &gotv));
    ASSERT_EQ(MS_SHDICT_ENOTFOUND, ms_shdict_get(d, key, 65534, buf, sizeof(buf), 0, &gotv));
    ASSERT_EQ(MS_SHDICT_EKEYLONG, ms_shdict_llen(d, key, 65536));
    ASSERT_SOUND(d);
    dict_close(d, fd);
}

TEST(shdict_set_add_replace_and_nil)
{
    int fd;
    ms_shdict_t *d = dict("ops", 1 << 16, &fd);
    ASSERT(d != NULL);
    ASSERT_EQ(MS_SHDICT_ENOTFOUND, set(d, MS_SHDICT_REPLACE, "k", "r", 0));
    ASSERT(get(d, "k", 0) == NULL);
    ASSERT_EQ(0, set(d, MS_SHDICT_ADD, "k", "a", 0));
    ASSERT_EQ(MS_SHDICT_EEXISTS, set(d, MS_SHDICT_ADD, "k", "b", 0));
    ASSERT_EQ(MS_SHDICT_EEXISTS, set(d, MS_SHDICT_SAFE_ADD, "k", "b", 0));
    ASSERT_STR_EQ("a", get(d, "k", 0));
    ASSERT_EQ(0, set(d, MS_SHDICT_REPLACE, "k", "replaced", 0));
    ASSERT_STR_EQ("replaced", get(d, "k", 0));
    ASSERT_EQ(0, set(d, MS_SHDICT_SAFE_SET, "k", "safe", 0));
    ASSERT_STR_EQ("safe", get(d, "k", 0));
    ASSERT_EQ(0, set(d, MS_SHDICT_SAFE_ADD, "k2", "safe add", 0));
    ASSERT_STR_EQ("safe add", get(d, "k2", 0));

    /* The flags go with each store. */
    ASSERT_EQ(0,
              ms_shdict_store(d, MS_SHDICT_SET, K("k"), MS_SHDICT_STRING, K("v"), 0, 0, 42, NULL));
    get(d, "k", 0);
    ASSERT_EQ(42, gotv.flags);
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "k", "v", 0));
    get(d, "k", 0);
    ASSERT_EQ(0, gotv.flags);

    /* A value of the same block size is rewritten in place. */
    size_t before = ms_shdict_free_space(d);
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "k", "w", 0));
    ASSERT_EQ(before, ms_shdict_free_space(d));

    /* nil, as set(key, nil) has it: a delete, after add's and replace's checks. */
    ASSERT_EQ(MS_SHDICT_EEXISTS,
              ms_shdict_store(d, MS_SHDICT_ADD, K("k"), MS_SHDICT_NIL, NULL, 0, 0, 0, 0, NULL));
    ASSERT_EQ(0, ms_shdict_store(d, MS_SHDICT_SET, K("k"), MS_SHDICT_NIL, NULL, 0, 0, 0, 0, NULL));
    ASSERT(get(d, "k", 0) == NULL);
    ASSERT_EQ(MS_SHDICT_ENOTFOUND,
              ms_shdict_store(d, MS_SHDICT_REPLACE, K("k"), MS_SHDICT_NIL, NULL, 0, 0, 0, 0, NULL));
    ASSERT_EQ(0, ms_shdict_delete(d, K("k2")));
    ASSERT(get(d, "k2", 0) == NULL);
    ASSERT_EQ(0, ms_shdict_delete(d, K("never there")));
    ASSERT_SOUND(d);
    dict_close(d, fd);
}

/* -- Expiry ------------------------------------------------------------------------------------ */

TEST(shdict_entries_expire_and_stay_stale_until_freed)
{
    int fd;
    ms_shdict_t *d = dict("ttl", 1 << 16, &fd);
    ASSERT(d != NULL);
    now_ms = fake_now;
    ASSERT_EQ(MS_SHDICT_EBADARG, set(d, MS_SHDICT_SET, "k", "v", -1));
    ASSERT_EQ(MS_SHDICT_EBADARG, set(d, MS_SHDICT_SET, "k", "v", 0.0 / 0.0));
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "k", "v", 1.5));
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "forever", "v", 0));
    double ttl = -1;
    ASSERT_EQ(0, ms_shdict_ttl(d, K("k"), &ttl));
    ASSERT(ttl == 1.5);
    ASSERT_EQ(0, ms_shdict_ttl(d, K("forever"), &ttl));
    ASSERT(ttl == 0);
    ASSERT_EQ(MS_SHDICT_ENOTFOUND, ms_shdict_ttl(d, K("missing"), &ttl));

    fake_ms += 1500; /* the last millisecond of its life */
    ASSERT_STR_EQ("v", get(d, "k", 0));
    fake_ms += 1;
    ASSERT(get(d, "k", 0) == NULL);
    ASSERT_STR_EQ("v", get(d, "k", 1));
    ASSERT_EQ(1, gotv.stale);
    ASSERT_STR_EQ("v", get(d, "forever", 1));
    ASSERT_EQ(0, gotv.stale);
    /* As in OpenResty, ttl sees an expired entry that is not freed yet, and says so. */
    ASSERT_EQ(0, ms_shdict_ttl(d, K("k"), &ttl));
    ASSERT(ttl < 0);

    /* add takes an expired key; replace does not. */
    ASSERT_EQ(MS_SHDICT_ENOTFOUND, set(d, MS_SHDICT_REPLACE, "k", "r", 0));
    ASSERT_EQ(0, set(d, MS_SHDICT_ADD, "k", "added", 2));
    ASSERT_STR_EQ("added", get(d, "k", 0));

    /* expire gives a new life, even to an expired entry; 0 is forever. */
    fake_ms += 3000;
    ASSERT(get(d, "k", 0) == NULL);
    ASSERT_EQ(0, ms_shdict_expire(d, K("k"), 10));
    ASSERT_STR_EQ("added", get(d, "k", 0));
    ASSERT_EQ(0, ms_shdict_ttl(d, K("k"), &ttl));
    ASSERT(ttl == 10);
    ASSERT_EQ(0, ms_shdict_expire(d, K("k"), 0));
    fake_ms += 100000;
    ASSERT_STR_EQ("added", get(d, "k", 0));
    ASSERT_EQ(MS_SHDICT_ENOTFOUND, ms_shdict_expire(d, K("missing"), 1));
    ASSERT_EQ(MS_SHDICT_EBADARG, ms_shdict_expire(d, K("k"), -1));
    now_ms = clock_ms;
    ASSERT_SOUND(d);
    dict_close(d, fd);
}

TEST(shdict_flush_all_marks_expired_and_flush_expired_frees)
{
    int fd;
    ms_shdict_t *d = dict("flush", 1 << 16, &fd);
    ASSERT(d != NULL);
    size_t empty = ms_shdict_free_space(d);
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "a", "1", 0));
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "b", "2", 100));
    ASSERT_EQ(1, ms_shdict_push(d, K("l"), 1, MS_SHDICT_STRING, K("x"), 0));
    ASSERT_EQ(0, ms_shdict_flush_all(d));
    ASSERT(get(d, "a", 0) == NULL);
    ASSERT(get(d, "b", 0) == NULL);
    ASSERT_EQ(0, ms_shdict_llen(d, K("l")));
    ASSERT_STR_EQ("1", get(d, "a", 1));
    ASSERT_EQ(1, gotv.stale);
    ASSERT(ms_shdict_free_space(d) < empty); /* marked, not freed */
    ASSERT_EQ(1, ms_shdict_flush_expired(d, 1));
    ASSERT_EQ(2, ms_shdict_flush_expired(d, 0));
    ASSERT_EQ(0, ms_shdict_flush_expired(d, 0));
    ASSERT(get(d, "a", 1) == NULL);
    ASSERT_EQ(empty, ms_shdict_free_space(d));
    ASSERT_SOUND(d);
    dict_close(d, fd);
}

TEST(shdict_get_keys_lists_live_keys)
{
    int fd;
    ms_shdict_t *d = dict("keys", 1 << 16, &fd);
    ASSERT(d != NULL);
    now_ms = fake_now;
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "a", "1", 0));
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "bb", "2", 0));
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "gone", "3", 1));
    fake_ms += 2000;
    char buf[64];
    size_t needed = 0;
    ASSERT_EQ(2, ms_shdict_get_keys(d, 0, buf, sizeof(buf), &needed));
    ASSERT_EQ(2 + 1 + 2 + 2, needed);
    /* The most recently used first. */
    uint16_t len;
    memcpy(&len, buf, 2);
    ASSERT_EQ(2, len);
    ASSERT(memcmp(buf + 2, "bb", 2) == 0);
    memcpy(&len, buf + 4, 2);
    ASSERT_EQ(1, len);
    ASSERT_EQ('a', buf[6]);
    ASSERT_EQ(1, ms_shdict_get_keys(d, 1, buf, sizeof(buf), &needed));
    ASSERT_EQ(4, needed);
    ASSERT_EQ(2, ms_shdict_get_keys(d, 0, buf, 3, &needed));
    ASSERT_EQ(7, needed); /* too little room: it says how much */
    now_ms = clock_ms;
    dict_close(d, fd);
}

/* -- incr ---------------------------------------------------------------------------------------
 */

TEST(shdict_incr_has_openrestys_semantics)
{
    int fd;
    ms_shdict_t *d = dict("incr", 1 << 16, &fd);
    ASSERT(d != NULL);
    now_ms = fake_now;
    double out = 0;
    int forcible = 1;
    ASSERT_EQ(MS_SHDICT_ENOTFOUND, incr(d, "n", 1));
    ASSERT_EQ(0, ms_shdict_incr(d, K("n"), 1, 1, 10, 0, &out, &forcible));
    ASSERT(out == 11);
    ASSERT_EQ(0, forcible);
    ASSERT(incr(d, "n", 1) == 12);
    ASSERT(incr(d, "n", 0.5) == 12.5);
    ASSERT(incr(d, "n", -20) == -7.5);
    /* init only matters when the key is missing. */
    ASSERT_EQ(0, ms_shdict_incr(d, K("n"), 1, 1, 100, 5, &out, NULL));
    ASSERT(out == -6.5);
    double ttl;
    ASSERT_EQ(0, ms_shdict_ttl(d, K("n"), &ttl));
    ASSERT(ttl == 0);

    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "s", "12", 0));
    ASSERT_EQ(MS_SHDICT_ENAN, incr(d, "s", 1));
    ASSERT_EQ(MS_SHDICT_ENAN, ms_shdict_incr(d, K("s"), 1, 1, 0, 0, &out, NULL));
    ASSERT_EQ(1, ms_shdict_push(d, K("l"), 1, MS_SHDICT_NUMBER, NULL, 0, 1));
    ASSERT_EQ(MS_SHDICT_ENAN, incr(d, "l", 1));

    /* init_ttl applies to the entry incr makes; an existing one keeps its expiry and flags. */
    ASSERT_EQ(0, ms_shdict_incr(d, K("t"), 1, 1, 0, 2, &out, NULL));
    ASSERT_EQ(0, ms_shdict_ttl(d, K("t"), &ttl));
    ASSERT(ttl == 2);
    ASSERT_EQ(0,
              ms_shdict_store(d, MS_SHDICT_SET, K("e"), MS_SHDICT_NUMBER, NULL, 0, 1, 5, 9, NULL));
    ASSERT(incr(d, "e", 1) == 2);
    ASSERT_EQ(0, ms_shdict_ttl(d, K("e"), &ttl));
    ASSERT(ttl == 5);
    ASSERT_EQ(0, ms_shdict_get(d, K("e"), NULL, 0, 0, &gotv));
    ASSERT_EQ(9, gotv.flags);
    fake_ms += 2001;
    ASSERT_EQ(MS_SHDICT_ENOTFOUND, incr(d, "t", 1)); /* expired: not found without init */
    ASSERT_EQ(0, ms_shdict_incr(d, K("t"), 1, 1, 40, 0, &out, NULL));
    ASSERT(out == 41); /* and made again from init with it */
    ASSERT_EQ(0, ms_shdict_ttl(d, K("t"), &ttl));
    ASSERT(ttl == 0);
    ASSERT_EQ(MS_SHDICT_EBADARG, ms_shdict_incr(d, K("t"), 1, 1, 0, -1, &out, NULL));
    now_ms = clock_ms;
    ASSERT_SOUND(d);
    dict_close(d, fd);
}

/* -- Lists --------------------------------------------------------------------------------------
 */

TEST(shdict_lists_push_and_pop_at_both_ends)
{
    int fd;
    ms_shdict_t *d = dict("lists", 1 << 16, &fd);
    ASSERT(d != NULL);
    char buf[16];
    ASSERT_EQ(0, ms_shdict_llen(d, K("q")));
    ASSERT_EQ(MS_SHDICT_ENOTFOUND, ms_shdict_pop(d, K("q"), 1, buf, sizeof(buf), &gotv));
    ASSERT_EQ(1, ms_shdict_push(d, K("q"), 0, MS_SHDICT_STRING, K("a"), 0));
    ASSERT_EQ(2, ms_shdict_push(d, K("q"), 0, MS_SHDICT_NUMBER, NULL, 0, 2));
    ASSERT_EQ(3, ms_shdict_push(d, K("q"), 1, MS_SHDICT_STRING, K("z"), 0));
    ASSERT_EQ(3, ms_shdict_llen(d, K("q")));
    ASSERT_SOUND(d);
    ASSERT_EQ(1, ms_shdict_pop(d, K("q"), 1, buf, sizeof(buf), &gotv));
    ASSERT_EQ(MS_SHDICT_STRING, gotv.type);
    ASSERT_EQ('z', buf[0]);
    ASSERT_EQ(0, ms_shdict_pop(d, K("q"), 0, buf, sizeof(buf), &gotv));
    ASSERT_EQ(MS_SHDICT_NUMBER, gotv.type);
    ASSERT(gotv.num == 2);
    ASSERT_EQ(1, ms_shdict_pop(d, K("q"), 0, buf, sizeof(buf), &gotv));
    ASSERT_EQ('a', buf[0]);
    /* The list went with its last element. */
    ASSERT_EQ(MS_SHDICT_ENOTFOUND, ms_shdict_pop(d, K("q"), 0, buf, sizeof(buf), &gotv));
    ASSERT_EQ(MS_SHDICT_ENOTFOUND, ms_shdict_get(d, K("q"), buf, sizeof(buf), 0, &gotv));
    ASSERT_EQ(0, ms_shdict_llen(d, K("q")));
    ASSERT_SOUND(d);
    dict_close(d, fd);
}

TEST(shdict_lists_refuse_other_types)
{
    int fd;
    ms_shdict_t *d = dict("lists", 1 << 16, &fd);
    ASSERT(d != NULL);
    char buf[16];
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "s", "v", 0));
    ASSERT_EQ(MS_SHDICT_ENOTLIST, ms_shdict_push(d, K("s"), 1, MS_SHDICT_STRING, K("x"), 0));
    ASSERT_EQ(MS_SHDICT_ENOTLIST, ms_shdict_pop(d, K("s"), 1, buf, sizeof(buf), &gotv));
    ASSERT_EQ(MS_SHDICT_ENOTLIST, ms_shdict_llen(d, K("s")));
    ASSERT_EQ(MS_SHDICT_EBADTYPE, ms_shdict_push(d, K("l"), 1, MS_SHDICT_TABLE, K("x"), 0));
    ASSERT_EQ(MS_SHDICT_EBADTYPE, ms_shdict_push(d, K("l"), 1, MS_SHDICT_BOOLEAN, NULL, 0, 1));
    ASSERT_EQ(0, ms_shdict_llen(d, K("l")));
    ASSERT_EQ(1, ms_shdict_push(d, K("l"), 1, MS_SHDICT_STRING, K("x"), 0));
    ASSERT_EQ(MS_SHDICT_EISLIST, ms_shdict_get(d, K("l"), buf, sizeof(buf), 0, &gotv));
    ASSERT_STR_EQ("v", get(d, "s", 0));
    dict_close(d, fd);
}

TEST(shdict_pop_into_too_small_a_buffer_pops_nothing)
{
    int fd;
    ms_shdict_t *d = dict("lists", 1 << 16, &fd);
    ASSERT(d != NULL);
    char big[100], buf[100];
    memset(big, 'b', sizeof(big));
    ASSERT_EQ(1, ms_shdict_push(d, K("q"), 0, MS_SHDICT_STRING, big, sizeof(big), 0));
    ASSERT_EQ(100, ms_shdict_pop(d, K("q"), 1, buf, 10, &gotv));
    ASSERT_EQ(100, gotv.len);
    ASSERT_EQ(1, ms_shdict_llen(d, K("q")));
    ASSERT_EQ(100, ms_shdict_pop(d, K("q"), 1, buf, sizeof(buf), &gotv));
    ASSERT(memcmp(buf, big, sizeof(big)) == 0);
    ASSERT_EQ(0, ms_shdict_llen(d, K("q")));
    dict_close(d, fd);
}

TEST(shdict_expired_keys_become_new_lists_and_sets_free_old_ones)
{
    int fd;
    ms_shdict_t *d = dict("lists", 1 << 16, &fd);
    ASSERT(d != NULL);
    now_ms = fake_now;
    size_t empty = ms_shdict_free_space(d);
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "e", "string", 1));
    fake_ms += 1001;
    ASSERT_EQ(1, ms_shdict_push(d, K("e"), 1, MS_SHDICT_STRING, K("x"), 0));
    double ttl;
    ASSERT_EQ(0, ms_shdict_ttl(d, K("e"), &ttl));
    ASSERT(ttl == 0);
    for (int i = 0; i < 50; i++)
        ASSERT_EQ(i + 2, ms_shdict_push(d, K("e"), 0, MS_SHDICT_NUMBER, NULL, 0, i));
    ASSERT_SOUND(d);
    /* A set over a list frees its elements. */
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "e", "string again", 0));
    ASSERT_STR_EQ("string again", get(d, "e", 0));
    ASSERT_SOUND(d);
    ASSERT_EQ(0, ms_shdict_delete(d, K("e")));
    ASSERT_EQ(empty, ms_shdict_free_space(d));
    /* An expired list is a missing one. */
    ASSERT_EQ(1, ms_shdict_push(d, K("l"), 1, MS_SHDICT_STRING, K("x"), 0));
    ASSERT_EQ(0, ms_shdict_expire(d, K("l"), 1));
    fake_ms += 1001;
    ASSERT_EQ(0, ms_shdict_llen(d, K("l")));
    char buf[4];
    ASSERT_EQ(MS_SHDICT_ENOTFOUND, ms_shdict_pop(d, K("l"), 1, buf, sizeof(buf), &gotv));
    now_ms = clock_ms;
    dict_close(d, fd);
}

/* -- Memory -------------------------------------------------------------------------------------
 */

TEST(shdict_evicts_the_least_recently_used_when_full)
{
    int fd;
    ms_shdict_t *d = dict("lru", 1 << 16, &fd);
    ASSERT(d != NULL);
    char key[16], val[101];
    memset(val, 'v', 100);
    val[100] = 0;
    int forced = 0;
    for (int i = 0; i < 1000; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        int forcible = 0;
        ASSERT_EQ(0, ms_shdict_store(d, MS_SHDICT_SET, key, strlen(key), MS_SHDICT_STRING, val, 100,
                                     0, 0, 0, &forcible));
        forced += forcible;
        if (i % 10 == 0)
            ASSERT(get(d, "k0", 0) != NULL); /* kept recent */
    }
    ASSERT(forced > 500);
    ASSERT(get(d, "k0", 0) != NULL);
    ASSERT(get(d, "k1", 0) == NULL);
    ASSERT(get(d, "k500", 0) == NULL);
    ASSERT(get(d, "k998", 0) != NULL);
    ASSERT(get(d, "k999", 0) != NULL);
    ASSERT_SOUND(d);
    dict_close(d, fd);
}

TEST(shdict_evicts_around_small_entries_to_fit_a_large_one)
{
    int fd;
    ms_shdict_t *d = dict("mixed", 1 << 16, &fd);
    ASSERT(d != NULL);
    char key[16];
    for (int i = 0; i < 2000; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        ASSERT_EQ(0, set(d, MS_SHDICT_SET, key, "small", 0));
        if (i % 3 == 0)
            ASSERT(ms_shdict_push(d, K("list"), 0, MS_SHDICT_NUMBER, NULL, 0, i) > 0);
    }
    ASSERT(ms_shdict_free_space(d) < 1024);
    static char big[16000];
    memset(big, 'B', sizeof(big));
    int forcible = 0;
    ASSERT_EQ(0, ms_shdict_store(d, MS_SHDICT_SET, K("big"), MS_SHDICT_STRING, big, sizeof(big), 0,
                                 0, 0, &forcible));
    ASSERT_EQ(1, forcible);
    static char out[16000];
    ASSERT_EQ(sizeof(big), ms_shdict_get(d, K("big"), out, sizeof(out), 0, &gotv));
    ASSERT(memcmp(big, out, sizeof(big)) == 0);
    ASSERT(d->z->count > 100); /* only the region around the LRU's tail went */
    ASSERT_SOUND(d);
    /* More than the largest block can hold fails at once, evicting nothing. */
    uint32_t count = d->z->count;
    static char huge[40000];
    ASSERT_EQ(MS_SHDICT_ENOMEM, ms_shdict_store(d, MS_SHDICT_SET, K("huge"), MS_SHDICT_STRING, huge,
                                                sizeof(huge), 0, 0, 0, NULL));
    ASSERT_EQ(count, d->z->count);
    ASSERT_EQ(MS_SHDICT_ENOMEM,
              ms_shdict_push(d, K("list"), 0, MS_SHDICT_STRING, huge, sizeof(huge), 0));
    dict_close(d, fd);
}

TEST(shdict_a_push_evicts_others_but_never_its_own_list)
{
    int fd;
    ms_shdict_t *d = dict("queue", 1 << 14, &fd);
    ASSERT(d != NULL);
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "other", "x", 0));
    char val[200];
    memset(val, 'q', sizeof(val));
    long n = 0, rc;
    while ((rc = ms_shdict_push(d, K("q"), 0, MS_SHDICT_STRING, val, sizeof(val), 0)) > 0) {
        n = rc;
        ASSERT(n < 1000);
    }
    ASSERT_EQ(MS_SHDICT_ENOMEM, rc);
    ASSERT(n > 20);
    ASSERT(get(d, "other", 0) == NULL);
    ASSERT_EQ(n, ms_shdict_llen(d, K("q")));
    ASSERT_SOUND(d);
    dict_close(d, fd);
}

TEST(shdict_safe_set_never_evicts_a_live_entry)
{
    int fd;
    ms_shdict_t *d = dict("safe", 1 << 16, &fd);
    ASSERT(d != NULL);
    now_ms = fake_now;
    char key[16], val[101];
    memset(val, 'v', 100);
    val[100] = 0;
    int i, rc = 0;
    for (i = 0; i < 1000; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        if ((rc = set(d, MS_SHDICT_SAFE_SET, key, val, 10)) < 0)
            break;
    }
    ASSERT_EQ(MS_SHDICT_ENOMEM, rc);
    ASSERT(i > 100);
    int stored = i;
    ASSERT_EQ(MS_SHDICT_ENOMEM, set(d, MS_SHDICT_SAFE_ADD, "another", val, 0));
    for (int j = 0; j < stored; j++) {
        snprintf(key, sizeof(key), "k%d", j);
        ASSERT(get(d, key, 0) != NULL);
    }
    /* The room of expired entries is free for the taking. */
    fake_ms += 10001;
    ASSERT_EQ(0, set(d, MS_SHDICT_SAFE_SET, "after", val, 0));
    ASSERT_EQ(0, set(d, MS_SHDICT_SAFE_ADD, "after2", val, 0));
    now_ms = clock_ms;
    ASSERT_SOUND(d);
    dict_close(d, fd);
}

TEST(shdict_freeing_everything_gives_back_every_byte)
{
    int fd;
    ms_shdict_t *d = dict("churn", 1 << 18, &fd);
    ASSERT(d != NULL);
    size_t empty = ms_shdict_free_space(d);
    static char val[5000];
    memset(val, 'c', sizeof(val));
    char key[16];
    unsigned seed = 1;
    for (int round = 0; round < 20000; round++) {
        seed = seed * 1103515245 + 12345;
        snprintf(key, sizeof(key), "k%u", (seed >> 8) % 300);
        size_t len = (seed >> 4) % (round % 7 == 0 ? sizeof(val) : 64);
        switch ((seed >> 16) % 5) {
        case 0: ms_shdict_delete(d, key, strlen(key)); break;
        case 1: ms_shdict_push(d, key, strlen(key), seed & 1, MS_SHDICT_STRING, val, len, 0); break;
        default:
            ms_shdict_store(d, MS_SHDICT_SET, key, strlen(key), MS_SHDICT_STRING, val, len, 0, 0, 0,
                            NULL);
        }
        if (round % 1000 == 0)
            ASSERT_SOUND(d);
    }
    ASSERT_SOUND(d);
    for (int i = 0; i < 300; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        ms_shdict_delete(d, key, strlen(key));
    }
    ASSERT_EQ(empty, ms_shdict_free_space(d));
    ASSERT_EQ(0, d->z->count);
    /* All of it merged back: the largest block is there again. */
    ASSERT(d->z->free_head[d->z->top_order] != 0);
    dict_close(d, fd);
}

/* -- Processes ----------------------------------------------------------------------------------
 */

/* Each child maps the zone afresh, after i + 1 holes of the zone's size, so that every
 * process has it at another address (the kernel places same-sized mappings one after the
 * other); each writes its address under "base<i>" for the parent to compare. */
static void child_incr(int fd, int i, int times)
{
    alarm(60);
    for (int h = 0; h <= i; h++)
        mmap(NULL, 1 << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ms_shdict_t *c = NULL;
    if (ms_shdict_attach(fd, "counters", 0, &c) < 0)
        _exit(2);
    char key[16];
    snprintf(key, sizeof(key), "base%d", i);
    if (ms_shdict_store(c, MS_SHDICT_SET, key, strlen(key), MS_SHDICT_NUMBER, NULL, 0,
                        (double)(uintptr_t)c->base, 0, 0, NULL) < 0)
        _exit(3);
    for (int j = 0; j < times; j++) {
        double out;
        if (ms_shdict_incr(c, K("hits"), 1, 1, 0, 0, &out, NULL) < 0)
            _exit(4);
    }
    ms_shdict_detach(c);
    _exit(0);
}

static int wait_ok(pid_t pid)
{
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        return 0;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void incr_from(int nproc)
{
    enum { TIMES = 100000 };
    int fd;
    ms_shdict_t *d = dict("counters", 1 << 20, &fd);
    ASSERT(d != NULL);
    pid_t pids[8];
    for (int i = 0; i < nproc; i++) {
        pids[i] = fork();
        ASSERT(pids[i] >= 0);
        if (pids[i] == 0)
            child_incr(fd, i, TIMES);
    }
    for (int i = 0; i < nproc; i++)
        ASSERT(wait_ok(pids[i]));
    ASSERT_EQ(0, ms_shdict_get(d, K("hits"), NULL, 0, 0, &gotv));
    ASSERT_EQ((long long)nproc * TIMES, (long long)gotv.num);
    double bases[8];
    for (int i = 0; i < nproc; i++) {
        char key[16];
        snprintf(key, sizeof(key), "base%d", i);
        ASSERT_EQ(0, ms_shdict_get(d, key, strlen(key), NULL, 0, 0, &gotv));
        bases[i] = gotv.num;
        ASSERT(bases[i] != (double)(uintptr_t)d->base);
        for (int j = 0; j < i; j++)
            ASSERT(bases[i] != bases[j]);
    }
    dict_close(d, fd);
}

TEST(shdict_two_processes_incr_one_key_exactly)
{
    incr_from(2);
}

TEST(shdict_four_processes_incr_one_key_exactly)
{
    incr_from(4);
}

/* -- Sliding logs for rate limits -------------------------------------------------------- */

TEST(shdict_window_take_admits_limit_in_any_window)
{
    int fd;
    ms_shdict_t *d = dict("limits", 1 << 20, &fd);
    ASSERT(d != NULL);
    now_ms = fake_now;
    uint32_t left = 0;
    int64_t wait = 0;
    /* 3 in any 1000 ms: at 0, 400 and 800, then nothing until the first leaves at 1000. */
    ASSERT_EQ(1, ms_shdict_window_take(d, K("ip"), 3, 1000, &left, &wait));
    ASSERT_EQ(2, (int)left);
    ASSERT_EQ(1000, (int)wait);
    fake_ms += 400;
    ASSERT_EQ(1, ms_shdict_window_take(d, K("ip"), 3, 1000, &left, &wait));
    fake_ms += 400;
    ASSERT_EQ(1, ms_shdict_window_take(d, K("ip"), 3, 1000, &left, &wait));
    ASSERT_EQ(0, (int)left);
    ASSERT_EQ(0, ms_shdict_window_take(d, K("ip"), 3, 1000, &left, &wait));
    ASSERT_EQ(200, (int)wait);
    fake_ms += 199;
    ASSERT_EQ(0, ms_shdict_window_take(d, K("ip"), 3, 1000, &left, &wait));
    ASSERT_EQ(1, (int)wait);
    /* The window slides: the admission at 0 leaves at 1000 (not at a fixed boundary), and the
     * one taking its place waits for the one at 400. */
    fake_ms += 1;
    ASSERT_EQ(1, ms_shdict_window_take(d, K("ip"), 3, 1000, &left, &wait));
    ASSERT_EQ(0, ms_shdict_window_take(d, K("ip"), 3, 1000, &left, &wait));
    ASSERT_EQ(400, (int)wait);
    /* Another key has its own log; refusals recorded nothing. */
    ASSERT_EQ(1, ms_shdict_window_take(d, K("other"), 3, 1000, &left, &wait));
    ASSERT_EQ(2, (int)left);
    /* Once the newest admission left the window, the whole log has expired. */
    fake_ms += 1000;
    ASSERT_EQ(MS_SHDICT_ENOTFOUND, (int)ms_shdict_get(d, K("ip"), NULL, 0, 0, &gotv));
    ASSERT_EQ(1, ms_shdict_window_take(d, K("ip"), 3, 1000, &left, &wait));
    ASSERT_EQ(2, (int)left);
    /* Another limit, or a value set by hand, starts a new log. */
    ASSERT_EQ(1, ms_shdict_window_take(d, K("ip"), 1, 1000, &left, &wait));
    ASSERT_EQ(0, ms_shdict_window_take(d, K("ip"), 1, 1000, &left, &wait));
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "ip", "hand", 0));
    ASSERT_EQ(1, ms_shdict_window_take(d, K("ip"), 1, 1000, &left, &wait));
    ASSERT_EQ(MS_SHDICT_EBADARG, ms_shdict_window_take(d, K("ip"), 0, 1000, &left, &wait));
    ASSERT_EQ(MS_SHDICT_EBADARG,
              ms_shdict_window_take(d, K("ip"), MS_SHDICT_WINDOW_MAX + 1, 1000, &left, &wait));
    ASSERT_EQ(MS_SHDICT_EBADARG, ms_shdict_window_take(d, K("ip"), 3, 0, &left, &wait));
    ASSERT_EQ(MS_SHDICT_EEMPTYKEY, ms_shdict_window_take(d, "", 0, 3, 1000, &left, &wait));
    ASSERT_SOUND(d);
    now_ms = clock_ms;
    dict_close(d, fd);
}

static void child_take(int fd, int times)
{
    ms_shdict_t *d = NULL;
    if (ms_shdict_attach(fd, "limits", 1 << 20, &d) < 0)
        _exit(2);
    int admitted = 0;
    for (int i = 0; i < times; i++) {
        uint32_t left;
        int64_t wait;
        int rc = ms_shdict_window_take(d, K("k"), 500, 600000, &left, &wait);
        if (rc < 0)
            _exit(3);
        admitted += rc;
    }
    char key[32];
    snprintf(key, sizeof(key), "admitted%d", (int)getpid());
    ms_shdict_store(d, MS_SHDICT_SET, key, strlen(key), MS_SHDICT_NUMBER, NULL, 0, admitted, 0, 0,
                    NULL);
    _exit(0);
}

TEST(shdict_window_take_from_four_processes_admits_exactly_the_limit)
{
    int fd;
    ms_shdict_t *d = dict("limits", 1 << 20, &fd);
    ASSERT(d != NULL);
    pid_t pids[4];
    for (int i = 0; i < 4; i++) {
        pids[i] = fork();
        ASSERT(pids[i] >= 0);
        if (pids[i] == 0)
            child_take(fd, 2000);
    }
    long total = 0;
    for (int i = 0; i < 4; i++) {
        ASSERT(wait_ok(pids[i]));
        char key[32];
        snprintf(key, sizeof(key), "admitted%d", (int)pids[i]);
        ASSERT_EQ(0, ms_shdict_get(d, key, strlen(key), NULL, 0, 0, &gotv));
        total += (long)gotv.num;
    }
    ASSERT_EQ(500L, total);
    ASSERT_SOUND(d);
    dict_close(d, fd);
}

/* A child that takes the lock, and dies (`dirty`: in the middle of a change). */
static pid_t die_holding_lock(int fd, int dirty)
{
    pid_t pid = fork();
    if (pid == 0) {
        ms_shdict_t *c = NULL;
        if (ms_shdict_attach(fd, NULL, 0, &c) < 0)
            _exit(2);
        zone_lock(c);
        if (dirty)
            change_begin(c->z);
        raise(SIGKILL);
        _exit(3);
    }
    return pid;
}

TEST(shdict_flushes_with_one_line_when_a_process_died_mid_change)
{
    int fd;
    ms_shdict_t *d = dict("dead", 1 << 16, &fd);
    ASSERT(d != NULL);
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "a", "1", 0));
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "b", "2", 0));
    pid_t pid = die_holding_lock(fd, 1);
    ASSERT(pid > 0);
    int status;
    ASSERT_EQ(pid, waitpid(pid, &status, 0));
    ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    log_lines = 0;
    ms_log_set(log_capture, MS_LOG_DEBUG);
    ASSERT(get(d, "a", 0) == NULL);
    ms_log_set(NULL, MS_LOG_INFO);
    ASSERT_EQ(1, log_lines);
    ASSERT_STR_EQ("shared dict dead: a process died while changing it: flushed it (2 keys)",
                  log_line);
    ASSERT_EQ(1, d->z->repairs);
    ASSERT(get(d, "b", 0) == NULL);
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "a", "again", 0));
    ASSERT_STR_EQ("again", get(d, "a", 0));
    ASSERT_SOUND(d);
    dict_close(d, fd);
}

TEST(shdict_lock_of_a_dead_holder_is_freed_by_forsake_at_once)
{
    int fd;
    ms_shdict_t *d = dict("forsaken", 1 << 16, &fd);
    ASSERT(d != NULL);
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "a", "1", 0));
    pid_t pid = die_holding_lock(fd, 0);
    ASSERT(pid > 0);
    /* Dead but not reaped: kill(pid, 0) still finds the zombie, so only the reaper (the
     * master) knows; it frees the lock, and nothing else. */
    while (__atomic_load_n(&d->z->owner, __ATOMIC_ACQUIRE) != (uint32_t)pid)
        usleep(100);
    siginfo_t si;
    ASSERT_EQ(0, waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT));
    ASSERT_EQ(0, ms_shdict_forsake(d, (int)getpid())); /* not the holder: nothing */
    ASSERT_EQ(1, ms_shdict_forsake(d, (int)pid));
    ASSERT_EQ(0, ms_shdict_forsake(d, (int)pid));
    ASSERT_STR_EQ("1", get(d, "a", 0));
    int status;
    ASSERT_EQ(pid, waitpid(pid, &status, 0));
    ASSERT_SOUND(d);
    dict_close(d, fd);
}

TEST(shdict_keeps_everything_when_a_process_died_reading)
{
    int fd;
    ms_shdict_t *d = dict("dead", 1 << 16, &fd);
    ASSERT(d != NULL);
    ASSERT_EQ(0, set(d, MS_SHDICT_SET, "a", "1", 0));
    pid_t pid = die_holding_lock(fd, 0);
    ASSERT(pid > 0);
    int status;
    ASSERT_EQ(pid, waitpid(pid, &status, 0));
    log_lines = 0;
    ms_log_set(log_capture, MS_LOG_DEBUG);
    ASSERT_STR_EQ("1", get(d, "a", 0));
    ms_log_set(NULL, MS_LOG_INFO);
    ASSERT_EQ(0, log_lines);
    ASSERT_EQ(0, d->z->repairs);
    ASSERT_SOUND(d);
    dict_close(d, fd);
}

static void writer_loop(int fd)
{
    alarm(30);
    ms_shdict_t *c = NULL;
    if (ms_shdict_attach(fd, NULL, 0, &c) < 0)
        _exit(2);
    static char val[3000];
    memset(val, 'w', sizeof(val));
    char key[16];
    for (unsigned seed = (unsigned)getpid();;) {
        seed = seed * 1103515245 + 12345;
        snprintf(key, sizeof(key), "w%u", (seed >> 8) % 200);
        size_t len = (seed >> 4) % sizeof(val);
        double out;
        switch ((seed >> 16) % 6) {
        case 0: ms_shdict_delete(c, key, strlen(key)); break;
        case 1: ms_shdict_push(c, K("queue"), seed & 1, MS_SHDICT_STRING, val, len % 100, 0); break;
        case 2: ms_shdict_pop(c, K("queue"), seed & 2, val, 100, &gotv); break;
        case 3: ms_shdict_incr(c, K("n"), 1, 1, 0, 0, &out, NULL); break;
        default:
            ms_shdict_store(c, MS_SHDICT_SET, key, strlen(key), MS_SHDICT_STRING, val, len, 0, 0, 0,
                            NULL);
        }
    }
}

static int64_t wall_ms(void)
{
    return clock_ms();
}

TEST(shdict_a_writer_killed_in_a_loop_leaves_the_dictionary_usable)
{
    int fd;
    ms_shdict_t *d = dict("killed", 1 << 16, &fd);
    ASSERT(d != NULL);
    ms_log_set(log_capture, MS_LOG_DEBUG);
    /* A bystander keeps incrementing throughout: it must never block. */
    pid_t bystander = fork();
    ASSERT(bystander >= 0);
    if (bystander == 0) {
        alarm(30);
        ms_shdict_t *c = NULL;
        if (ms_shdict_attach(fd, NULL, 0, &c) < 0)
            _exit(2);
        for (int i = 0; i < 200000; i++) {
            double out;
            if (ms_shdict_incr(c, K("bystander"), 1, 1, 0, 0, &out, NULL) < 0)
                _exit(4);
        }
        _exit(0);
    }
    int64_t deadline = wall_ms() + 3000;
    int rounds = 0;
    unsigned seed = 7;
    while (rounds < 60 && wall_ms() < deadline) {
        pid_t w = fork();
        ASSERT(w >= 0);
        if (w == 0)
            writer_loop(fd);
        seed = seed * 1103515245 + 12345;
        usleep(1000 + (seed >> 8) % 20000);
        kill(w, SIGKILL);
        int status;
        ASSERT_EQ(w, waitpid(w, &status, 0));
        ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        ASSERT_EQ(0, set(d, MS_SHDICT_SET, "probe", "alive", 0));
        ASSERT_STR_EQ("alive", get(d, "probe", 0));
        ASSERT_SOUND(d);
        rounds++;
    }
    ms_log_set(NULL, MS_LOG_INFO);
    ASSERT(rounds >= 10);
    /* The bystander finished within its alarm, so no kill left it blocked. */
    ASSERT(wait_ok(bystander));
    printf("# %d writers killed, %llu flushes after a death mid-change\n", rounds,
           (unsigned long long)d->z->repairs);
    dict_close(d, fd);
}

TEST_MAIN()
