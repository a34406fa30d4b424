/* sock_fuzz.c: the socket's line reader and receiveuntil matcher (core/base/match.c, through
 * sock.c), fed in pieces, against a
 * naive reference that sees the whole stream at once. */
#include "../../core/base/match.c" /* first: it asks for memmem; and its state is looked at */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/client/sock.c"

/* The messages a reader produced, joined with a separator the reference uses too. */
typedef struct {
    char *p;
    size_t len, cap;
} out_t;

static void out_add(out_t *o, const char *p, size_t n)
{
    if (o->cap - o->len < n + 1) {
        o->cap = (o->len + n + 1) * 2;
        o->p = realloc(o->p, o->cap);
    }
    if (n)
        memcpy(o->p + o->len, p, n);
    o->len += n;
}

static const char *find(const char *h, size_t hn, const char *n, size_t nn)
{
    for (size_t i = 0; i + nn <= hn; i++)
        if (memcmp(h + i, n, nn) == 0)
            return h + i;
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4)
        return 0;
    /* Byte 0: bit 0 receiveuntil (else "*l"), bit 1 inclusive; byte 1: the pattern's
     * length (1..16); byte 2: the size of pieces (0: none); byte 3: how the stream is cut. */
    int until = data[0] & 1, inclusive = (data[0] >> 1) & 1;
    size_t plen = (size_t)(data[1] % 16) + 1, piece = data[2] % 8, cut = data[3];
    data += 4;
    size -= 4;
    if (until && size < plen)
        return 0;
    const char *pat = (const char *)data;
    if (until) {
        data += plen;
        size -= plen;
    } else {
        plen = 1; /* a LF */
        piece = 0;
    }
    const char *in = (const char *)data;

    /* The reference: every complete message of the whole stream, each followed by 0xff. */
    out_t want = {0}, got = {0};
    const char sep = (char)0xff;
    size_t pos = 0;
    for (;;) {
        if (until) {
            const char *m = find(in + pos, size - pos, pat, plen);
            if (m == NULL)
                break;
            size_t pre = (size_t)(m - (in + pos));
            out_add(&want, in + pos, inclusive ? pre + plen : pre);
            pos += pre + plen;
        } else {
            const char *lf = memchr(in + pos, '\n', size - pos);
            if (lf == NULL)
                break;
            for (const char *q = in + pos; q < lf; q++)
                if (*q != '\r')
                    out_add(&want, q, 1);
            pos = (size_t)(lf - in) + 1;
        }
        out_add(&want, &sep, 1);
    }

    /* The socket's: the same stream cut in pieces of 1..8 bytes. */
    ms_sock_t s;
    memset(&s, 0, sizeof(s));
    ms_sock_until_t *u = until ? ms_sock_until_new(pat, plen, inclusive) : NULL;
    s.rkind = until ? -1 : MS_SOCK_LINE;
    s.rn = until ? piece : 0;
    s.until = u;
    size_t fed = 0, k = 0;
    while (fed < size) {
        size_t step = (size_t)((cut >> (k++ % 8)) & 7) + 1;
        if (step > size - fed)
            step = size - fed;
        rbuf_compact(&s);
        if (s.rcap - s.rlen < step) {
            s.rcap = s.rlen + step + 8;
            s.rbuf = realloc(s.rbuf, s.rcap);
        }
        memcpy(s.rbuf + s.rlen, in + fed, step);
        s.rlen += step;
        fed += step;
        for (;;) {
            int rc;
            int ending = u && ms_match_take_end(u->m);
            if (ending) {
                rc = MS_SOCK_END;
            } else {
                rbuf_compact(&s);
                rc = read_match(&s);
            }
            if (rc == 0)
                break;
            if (rc == MS_SOCK_END) {
                out_add(&got, &sep, 1);
                continue;
            }
            /* A piece is never over the size, but for the pattern an inclusive last piece
             * ends with, and empty only as the last (the pattern came at once). */
            if (piece && (s.v.len > piece + (u->m->ending && inclusive ? plen : 0) ||
                          (s.v.len == 0 && !u->m->ending)))
                abort();
            out_add(&got, s.v.data, s.v.len);
            if (!piece)
                out_add(&got, &sep, 1);
        }
    }
    /* With a size, bytes of a message not yet ended come out as soon as they cannot be part
     * of a match: all but the last plen - 1, in pieces, whatever is left under the size. */
    size_t extra = 0, tail = size - pos;
    if (piece) {
        if (got.len < want.len)
            abort();
        extra = got.len - want.len;
        if (extra > tail || (extra && memcmp(got.p + want.len, in + pos, extra) != 0) ||
            extra + (plen - 1) + (piece - 1) < tail)
            abort();
    }
    if (want.len != got.len - extra || (want.len && memcmp(want.p, got.p, want.len) != 0))
        abort();
    free(want.p);
    free(got.p);
    free(s.rbuf);
    if (u)
        ms_sock_until_free(u);
    return 0;
}
