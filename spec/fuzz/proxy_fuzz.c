/* proxy_fuzz.c: the PROXY header parser (v1 text, v2 binary) on arbitrary bytes, checking what
 * the accept path relies on: an answer of "the header's length", "more bytes" or "refused";
 * a header's length that no following byte changes; every prefix of a header asking for more,
 * never refused (a header split across reads must parse); an address only with a header. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

/* The longest header there is: v2's 16 bytes and its longest body (V2_LEN_MAX). */
#define HEADER_MAX (16 + 512)

/* Parses the first `n` bytes of `data` from a heap copy of exactly `n` bytes, so that ASan sees
 * any read past them. */
static ssize_t parse(const uint8_t *data, size_t n, int *known)
{
    uint8_t src[16];
    char *copy = malloc(n > 0 ? n : 1);
    memcpy(copy, data, n);
    ssize_t r = ms__proxy_parse(copy, n, src, known);
    free(copy);
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int known;
    ssize_t r = parse(data, size, &known);
    if (r != MS_EBADREQ && (r < 0 || (size_t)r > size))
        abort();
    if (known && r <= 0)
        abort(); /* an address from a header that is not whole */
    if (r == 0 && size >= HEADER_MAX)
        abort(); /* more asked for past any header's length */
    if (r <= 0)
        return 0;
    /* A v1 header ends with its CRLF. */
    if (data[0] == 'P' && (r < 2 || data[r - 2] != '\r' || data[r - 1] != '\n'))
        abort();
    /* The header alone parses to the same length and address, and each of its prefixes asks
     * for more. */
    int known2;
    if (parse(data, (size_t)r, &known2) != r || known2 != known)
        abort();
    for (size_t k = 0; k < (size_t)r; k++)
        if (parse(data, k, &known2) != 0 || known2)
            abort();
    return 0;
}
