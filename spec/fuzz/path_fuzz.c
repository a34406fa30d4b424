/* path_fuzz.c: ms_path_clean on arbitrary bytes, checking that what it accepts can only name
 * a file beneath the mount. No file system is touched. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http/static/path.h"

/* Aborts unless `out` (n bytes) is a clean relative path. */
static void check_clean(const char *out, int n, size_t cap, int dotfiles)
{
    if (n < 0 || (size_t)n > cap - 1 || n > MS_PATH_MAX || out[n] != 0)
        abort();
    if (memchr(out, 0, (size_t)n) != NULL)
        abort();
    if (n == 0)
        return;
    if (out[0] == '/' || out[n - 1] == '/')
        abort();
    const char *p = out, *end = out + n;
    while (p < end) {
        const char *slash = memchr(p, '/', (size_t)(end - p));
        size_t len = slash ? (size_t)(slash - p) : (size_t)(end - p);
        if (len == 0 || len > MS_PATH_SEGMENT_MAX) /* empty: "//" */
            abort();
        if ((len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
            abort();
        if (p[0] == '.' && !dotfiles)
            abort();
        for (size_t i = 0; i < len; i++) {
            unsigned char ch = (unsigned char)p[i];
            if (ch < 0x20 || ch == 0x7f || ch == '\\')
                abort();
        }
        p += len + 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    /* The first byte: bit 0 allows dotfiles, the rest picks a small output buffer (1..127
     * bytes) or, when zero, one large enough for any path. */
    int dotfiles = data[0] & 1;
    size_t cap = data[0] >> 1 ? (size_t)(data[0] >> 1) : MS_PATH_MAX + 1;
    const char *in = (const char *)data + 1;
    size_t len = size - 1;

    /* Exactly `cap` bytes on the heap, so that ASan sees a write past them. */
    char *out = malloc(cap);
    const char *why = NULL;
    int n = ms_path_clean(in, len, out, cap, dotfiles, &why);
    if (n < 0) {
        if ((n != MS_EBADREQ && n != MS_ETOOBIG) || why == NULL)
            abort();
        free(out);
        return 0;
    }
    if (why != NULL)
        abort();
    check_clean(out, n, cap, dotfiles);

    /* Decoding is done once: every '%' that reached the output came from "%25". */
    size_t pct_in = 0, pct_out = 0;
    for (size_t i = 0; i + 2 < len; i++)
        if (in[i] == '%' && in[i + 1] == '2' && in[i + 2] == '5')
            pct_in++;
    for (int i = 0; i < n; i++)
        pct_out += out[i] == '%';
    if (pct_out > pct_in)
        abort();

    /* The output, every byte escaped, cleans to itself: nothing in it needed cleaning. */
    static char enc[1 + 3 * MS_PATH_MAX];
    static char again[MS_PATH_MAX + 1];
    static const char hex[] = "0123456789ABCDEF";
    size_t e = 0;
    enc[e++] = '/';
    for (int i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)out[i];
        if (ch == '/') {
            enc[e++] = '/';
        } else {
            enc[e++] = '%';
            enc[e++] = hex[ch >> 4];
            enc[e++] = hex[ch & 15];
        }
    }
    const char *why2 = NULL;
    int m = ms_path_clean(enc, e, again, sizeof(again), dotfiles, &why2);
    if (m != n || memcmp(again, out, (size_t)n + 1) != 0)
        abort();
    free(out);
    return 0;
}
