/* shdict_fuzz.c: arbitrary sequences of dictionary operations on a small zone, with a clock
 * that the input moves: after each one the zone's structures must hold (ms_shdict_check),
 * the byte counts must add up, and a store that evicted nothing must read back. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/process/shdict.c"

static int64_t fuzz_ms = 1000000;

static int64_t fuzz_now(void)
{
    return fuzz_ms;
}

static ms_shdict_t *zone;

static void must(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "shdict_fuzz: %s\n", what);
        abort();
    }
}

static void check(void)
{
    const char *why = NULL;
    if (ms_shdict_check(zone, &why) != 0)
        must(0, why);
    must(ms_shdict_free_space(zone) <= zone->z->area_len, "free space beyond the area");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (zone == NULL) {
        int fd = ms_shdict_create("fuzz", 1 << 15);
        must(fd >= 0 && ms_shdict_attach(fd, "fuzz", 1 << 15, &zone) == 0, "no zone");
        close(fd); /* the mapping keeps it */
        now_ms = fuzz_now;
    }
    zone_format(zone); /* each input starts from an empty zone */
    static char val[6000], buf[6000];
    for (size_t i = 0; i < sizeof(val); i++)
        val[i] = (char)i;
    /* An operation is 4 bytes: what, which key, a length and a time. */
    for (size_t at = 0; at + 4 <= size; at += 4) {
        const uint8_t *p = data + at;
        char key[300];
        size_t klen = (size_t)snprintf(key, sizeof(key), "k%u", p[1] % 24);
        if (p[1] >= 250) { /* now and then a long key */
            memset(key, 'L', sizeof(key));
            klen = sizeof(key) - (p[2] & 63);
        }
        size_t len = (size_t)p[2] * ((p[3] & 0x80) ? 23 : 1);
        double exptime = (p[3] & 0x40) ? (double)(p[3] & 7) : 0;
        ms_shdict_val_t v;
        double out;
        int forcible = 0;
        long rc;
        switch (p[0] % 16) {
        case 0:
        case 1:
        case 2: {
            int op = p[0] / 16 % 5;
            int type = p[0] / 80 == 0 ? MS_SHDICT_STRING : MS_SHDICT_TABLE;
            rc = ms_shdict_store(zone, op, key, klen, type, val, len, 0, exptime, p[3], &forcible);
            if (rc == 0 && !forcible) {
                long n = ms_shdict_get(zone, key, klen, buf, sizeof(buf), 0, &v);
                must(n == (long)len && v.type == type && v.flags == p[3], "a store read back");
                must(memcmp(buf, val, len) == 0, "a store's bytes read back");
            }
            break;
        }
        case 3: ms_shdict_get(zone, key, klen, buf, p[2], p[3] & 1, &v); break;
        case 4:
            rc = ms_shdict_incr(zone, key, klen, p[2], p[3] & 1, 1, exptime, &out, &forcible);
            must(rc == 0 || rc == MS_SHDICT_ENOTFOUND || rc == MS_SHDICT_ENAN ||
                     rc == MS_SHDICT_ENOMEM,
                 "incr's result");
            break;
        case 5: ms_shdict_delete(zone, key, klen); break;
        case 6: ms_shdict_ttl(zone, key, klen, &out); break;
        case 7: ms_shdict_expire(zone, key, klen, exptime); break;
        case 8:
        case 9:
            rc = ms_shdict_push(zone, key, klen, p[0] & 16, (p[3] & 1) ? MS_SHDICT_NUMBER
                                                                        : MS_SHDICT_STRING,
                                val, len, p[2]);
            must(rc > 0 || rc == MS_SHDICT_ENOTLIST || rc == MS_SHDICT_ENOMEM, "push's result");
            break;
        case 10:
        case 11:
            rc = ms_shdict_pop(zone, key, klen, p[0] & 16, buf, p[2] * 8u, &v);
            must(rc >= 0 || rc == MS_SHDICT_ENOTFOUND || rc == MS_SHDICT_ENOTLIST, "pop's result");
            break;
        case 12: ms_shdict_llen(zone, key, klen); break;
        case 13:
            if (p[2] == 0)
                ms_shdict_flush_all(zone);
            else
                ms_shdict_flush_expired(zone, p[2] & 3);
            break;
        case 14: {
            size_t needed;
            ms_shdict_get_keys(zone, p[2] & 7, buf, p[3], &needed);
            break;
        }
        case 15: fuzz_ms += (int64_t)p[2] * 40; break;
        }
        check();
    }
    return 0;
}
