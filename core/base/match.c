/* match.c: receiveuntil's pattern matcher (KMP, with memmem where nothing is pending). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include "base/match.h"

#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "moonserve.h"

struct ms_match_s {
    size_t plen;
    size_t scanned;   /* the caller's unread bytes searched */
    size_t j;         /* pattern bytes matched at the end of them (KMP's state) */
    size_t match_end; /* > 0: a match ends here (unread bytes), not yet all returned */
    uint8_t inclusive;
    uint8_t ending;       /* a sized read returned its last piece: the end is next */
    const uint32_t *fail; /* fail[k]: the longest proper border of pat[0..k] */
    char pat[];
};

static size_t fail_offset(size_t len)
{
    return (offsetof(ms_match_t, pat) + len + 3) & ~(size_t)3;
}

size_t ms_match_size(size_t len)
{
    return fail_offset(len) + len * sizeof(uint32_t);
}

ms_match_t *ms_match_init(void *mem, const char *pat, size_t len, int inclusive)
{
    assert(len > 0 && len <= UINT32_MAX);
    ms_match_t *m = mem;
    memset(m, 0, sizeof(*m));
    m->plen = len;
    m->inclusive = inclusive != 0;
    memcpy(m->pat, pat, len);
    uint32_t *fail = (uint32_t *)((char *)m + fail_offset(len));
    fail[0] = 0;
    for (size_t i = 1, k = 0; i < len; i++) {
        while (k > 0 && pat[i] != pat[k])
            k = fail[k - 1];
        if (pat[i] == pat[k])
            k++;
        fail[i] = (uint32_t)k;
    }
    m->fail = fail;
    return m;
}

ms_match_t *ms_match_new(const char *pat, size_t len, int inclusive)
{
    return ms_match_init(ms_mem_alloc(ms_match_size(len)), pat, len, inclusive);
}

void ms_match_free(ms_match_t *m)
{
    ms_mem_free(m);
}

void ms_match_reset(ms_match_t *m)
{
    m->scanned = m->j = m->match_end = 0;
}

int ms_match_take_end(ms_match_t *m)
{
    if (!m->ending)
        return 0;
    m->ending = 0;
    ms_match_reset(m);
    return 1;
}

/* Searches p[scanned..n) from KMP's state, up to the first match. Where no pattern byte is
 * pending (j == 0) no match can begin before the current byte, so the first occurrence from
 * there is the first of all, and memmem (glibc's: linear, and fast over bytes that hold few
 * candidates) finds it. When it finds none, the state at the end is the longest prefix of
 * the pattern the bytes end with, which lies in their last plen - 1: KMP goes on from
 * there. So memmem runs at most once a call, and no byte is looked at twice by KMP. */
static void search(ms_match_t *m, const char *p, size_t n)
{
    size_t i = m->scanned, j = m->j, plen = m->plen;
    const char *pat = m->pat;
    while (i < n) {
        if (j == 0 && n - i >= plen) {
            const char *hit = memmem(p + i, n - i, pat, plen);
            if (hit != NULL) {
                i = (size_t)(hit - p) + plen;
                j = plen;
                break;
            }
            i = n - (plen - 1);
            continue;
        }
        char c = p[i++];
        while (j > 0 && c != pat[j])
            j = m->fail[j - 1];
        if (c == pat[j] && ++j == plen)
            break;
    }
    m->scanned = i;
    if (j == plen) {
        m->match_end = i;
        j = 0;
    }
    m->j = j;
}

int ms_match_feed(ms_match_t *m, const char *p, size_t n, size_t size, size_t *len, size_t *used)
{
    if (ms_match_take_end(m)) {
        *len = *used = 0;
        return MS_MATCH_END;
    }
    /* Fewer bytes than were searched: they are not the ones searched. */
    if (MS_UNLIKELY(n < m->scanned))
        ms_match_reset(m);
    if (m->match_end == 0 && m->scanned < n)
        search(m, p, n);
    if (m->match_end > 0) {
        size_t pre = m->match_end - m->plen; /* the bytes before the pattern */
        if (size == 0 || pre < size) {
            /* The last piece, or the whole of it. As in lua-nginx-module, a sized read that
             * meets the pattern at once returns "" (the pattern alone when inclusive), and
             * only the call after it the end: a reader that handed out exactly `size` bytes
             * has not yet looked past them. */
            *len = m->inclusive ? m->match_end : pre;
            *used = m->match_end;
            m->ending = size != 0;
            ms_match_reset(m);
            return MS_MATCH_LAST;
        }
        m->match_end -= size;
    } else if (size == 0 || m->scanned - m->j < size) {
        return MS_MATCH_MORE; /* the bytes that may still begin a match wait */
    }
    *len = *used = size;
    m->scanned -= size;
    return MS_MATCH_PIECE;
}

/* -- Lines --------------------------------------------------------------------------------- */

size_t ms_match_drop_cr(char *p, size_t n)
{
    char *cr = memchr(p, '\r', n);
    if (cr == NULL)
        return n;
    char *w = cr;
    for (char *r = cr + 1; r < p + n; r++)
        if (*r != '\r')
            *w++ = *r;
    return (size_t)(w - p);
}

long ms_match_line(char *p, size_t n, size_t *scanned, size_t *used)
{
    char *lf = *scanned < n ? memchr(p + *scanned, '\n', n - *scanned) : NULL;
    if (lf == NULL) {
        *scanned = n;
        return -1;
    }
    size_t len = (size_t)(lf - p);
    *used = len + 1;
    return (long)ms_match_drop_cr(p, len);
}
