/* mime.c: extension -> Content-Type, read from a mime.types file with built-in fallbacks. */
#include "http/static/mime.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "http/http.h"

/* The common web formats, in mime.types format, so one parser reads both. They are read after
 * the file and an extension keeps its first type, which is what lets the file win. */
static const char builtin_types[] = "text/html html htm\n"
                                    "text/css css\n"
                                    "text/javascript js mjs\n" /* RFC 9239 */
                                    "application/json json map\n"
                                    "text/plain txt\n"
                                    "application/xml xml\n"
                                    "image/svg+xml svg\n"
                                    "image/png png\n"
                                    "image/jpeg jpg jpeg\n"
                                    "image/gif gif\n"
                                    "image/webp webp\n"
                                    "image/avif avif\n"
                                    "image/vnd.microsoft.icon ico\n"
                                    "font/woff woff\n"
                                    "font/woff2 woff2\n"
                                    "font/ttf ttf\n"
                                    "font/otf otf\n"
                                    "application/wasm wasm\n"
                                    "application/pdf pdf\n"
                                    "application/zip zip\n"
                                    "application/gzip gz\n"
                                    "video/mp4 mp4\n"
                                    "video/webm webm\n"
                                    "audio/mpeg mp3\n"
                                    "audio/ogg ogg\n"
                                    "text/csv csv\n"
                                    "text/markdown md\n";

static const char octet_stream[] = "application/octet-stream";
static const char charset_utf8[] = "; charset=utf-8";

/* A key is the lowercase extension padded with NULs to 16 bytes, so a probe compares two
 * words and never looks at a length. ext[0] == 0 marks an empty row. */
typedef struct mime_row_s {
    char ext[MS_MIME_EXT_MAX + 1];
    uint32_t off, len; /* the Content-Type value in m->types */
} mime_row_t;

struct ms_mime_s {
    mime_row_t *rows;   /* owned; open addressing, linear probing */
    uint32_t cap, len;  /* cap is a power of two and at least twice len, so probes stay short */
    char *types;        /* owned: every Content-Type value, NUL-terminated, end to end */
    uint32_t types_len; /* rows hold offsets, not pointers, so `types` may move as it grows */
    uint32_t types_cap;
};

static int same_key(const char *a, const char *b)
{
    uint64_t a0, a1, b0, b1;
    memcpy(&a0, a, 8);
    memcpy(&a1, a + 8, 8);
    memcpy(&b0, b, 8);
    memcpy(&b1, b + 8, 8);
    return a0 == b0 && a1 == b1;
}

/* The row holding `key`, or the empty row where it would go. */
static mime_row_t *find(const ms_mime_t *m, const char *key)
{
    uint32_t mask = m->cap - 1, j = ms__hash16(key) & mask;
    /* Ends: the table is never more than half full. */
    while (m->rows[j].ext[0] != 0 && !same_key(m->rows[j].ext, key))
        j = (j + 1) & mask;
    return &m->rows[j];
}

static void grow(ms_mime_t *m)
{
    mime_row_t *old = m->rows;
    uint32_t old_cap = m->cap;
    m->cap = old_cap * 2;
    m->rows = ms_mem_alloc(m->cap * sizeof(mime_row_t));
    memset(m->rows, 0, m->cap * sizeof(mime_row_t));
    for (uint32_t i = 0; i < old_cap; i++)
        if (old[i].ext[0] != 0)
            *find(m, old[i].ext) = old[i];
    ms_mem_free(old);
}

/* -- Reading mime.types ------------------------------------------------------------------ */

/* Media types compare without case (RFC 9110 8.3.1). */
static int type_is(const char *type, size_t len, const char *lower)
{
    size_t n = strlen(lower);
    return len == n && ms__ieq(type, lower, n);
}

/* Text that a browser would otherwise decode with a guessed charset. */
static int wants_charset(const char *type, size_t len)
{
    return (len > 5 && ms__ieq(type, "text/", 5)) || type_is(type, len, "application/javascript") ||
           type_is(type, len, "application/json") || type_is(type, len, "application/xml") ||
           type_is(type, len, "image/svg+xml");
}

/* token "/" token: anything else could put bytes into the reply head that do not belong. */
static int valid_type(const char *p, size_t n)
{
    size_t slash = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '/' && slash == 0 && i > 0)
            slash = i;
        else if (!ms__tchar[(unsigned char)p[i]])
            return 0;
    }
    return slash != 0 && slash < n - 1;
}

/* Appends the Content-Type value for `type` to m->types; returns its offset. */
static uint32_t add_type(ms_mime_t *m, const char *type, size_t n)
{
    size_t extra = wants_charset(type, n) ? sizeof(charset_utf8) - 1 : 0;
    /* Fits: the file is at most MS_MIME_FILE_MAX bytes, and each line adds its type once. */
    uint32_t need = (uint32_t)(n + extra + 1);
    if (m->types_cap - m->types_len < need) {
        while (m->types_cap - m->types_len < need)
            m->types_cap *= 2;
        m->types = ms_mem_realloc(m->types, m->types_cap);
    }
    uint32_t off = m->types_len;
    char *p = m->types + off;
    memcpy(p, type, n);
    memcpy(p + n, charset_utf8, extra);
    p[n + extra] = 0;
    m->types_len += need;
    return off;
}

/* Adds one extension unless the table has it already. Returns 1 if it was added. */
static int add_ext(ms_mime_t *m, const char *ext, size_t n, uint32_t off, uint32_t len)
{
    char key[MS_MIME_EXT_MAX + 1] = {0};
    if (n > MS_MIME_EXT_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        /* Such an extension could never be looked up: lookups stop at the last '.' or '/'. */
        if (ext[i] == '.' || ext[i] == '/')
            return 0;
        key[i] = (char)ms__lower((unsigned char)ext[i]);
    }
    if ((m->len + 1) * 2 > m->cap)
        grow(m);
    mime_row_t *r = find(m, key);
    if (r->ext[0] != 0)
        return 0; /* the first type named for an extension wins */
    memcpy(r->ext, key, sizeof(key));
    r->off = off;
    r->len = len;
    m->len++;
    return 1;
}

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* Reads mime.types text. A word that starts with '#' comments out the rest of its line. */
static void parse(ms_mime_t *m, const char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        const char *type = NULL;
        size_t type_len = 0;
        uint32_t off = 0, len = 0;
        int have_off = 0;
        while (i < n && p[i] != '\n') {
            while (i < n && is_space(p[i]))
                i++;
            size_t start = i;
            while (i < n && p[i] != '\n' && !is_space(p[i]))
                i++;
            if (i == start)
                continue;
            if (p[start] == '#') {
                while (i < n && p[i] != '\n')
                    i++;
                break;
            }
            if (type == NULL) {
                type = p + start;
                type_len = i - start;
                if (!valid_type(type, type_len)) {
                    while (i < n && p[i] != '\n')
                        i++;
                    break;
                }
                continue;
            }
            if (!have_off) {
                /* The type's text is added once per line, and only for a line that has an
                 * extension, so the strings are shared by every extension of the line. */
                off = add_type(m, type, type_len);
                len = m->types_len - off - 1;
                have_off = 1;
            }
            add_ext(m, p + start, i - start, off, len);
        }
        i++; /* the '\n' */
    }
}

/* Reads a whole regular file into a new buffer. Returns its length, or -1. */
static ssize_t read_file(const char *path, char **out)
{
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; it is then refused below. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > MS_MIME_FILE_MAX) {
        close(fd);
        return -1;
    }
    /* One byte more than the size says, to see a file that grew since fstat. */
    size_t cap = (size_t)st.st_size + 1, len = 0;
    char *buf = ms_mem_alloc(cap);
    for (;;) {
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 || (len += (size_t)r) == cap) {
            /* A read error, or the file is now longer than it was: no half-read table. */
            ms_mem_free(buf);
            close(fd);
            return -1;
        }
        if (r == 0)
            break;
    }
    close(fd);
    *out = buf;
    return (ssize_t)len;
}

/* -- The table --------------------------------------------------------------------------- */

ms_mime_t *ms_mime_load(const char *path)
{
    ms_mime_t *m = ms_mem_alloc(sizeof(*m));
    m->cap = 64; /* the built-in types alone fit without growing */
    m->len = 0;
    m->rows = ms_mem_alloc(m->cap * sizeof(mime_row_t));
    memset(m->rows, 0, m->cap * sizeof(mime_row_t));
    m->types_cap = 1024;
    m->types_len = 0;
    m->types = ms_mem_alloc(m->types_cap);
    char *file = NULL;
    ssize_t n = path != NULL ? read_file(path, &file) : -1;
    if (n >= 0) {
        parse(m, file, (size_t)n);
        ms_mem_free(file);
    }
    parse(m, builtin_types, sizeof(builtin_types) - 1);
    return m;
}

void ms_mime_free(ms_mime_t *m)
{
    if (m == NULL)
        return;
    ms_mem_free(m->rows);
    ms_mem_free(m->types);
    ms_mem_free(m);
}

/* -- Lookups ----------------------------------------------------------------------------- */

const char *ms_mime_type(const ms_mime_t *m, const char *path, size_t len, size_t *out_len)
{
    /* Look back from the end for the last '.', no further than the longest extension: a
     * longer one is unknown anyway, so the cost does not grow with the path. */
    size_t dot = len, stop = len > MS_MIME_EXT_MAX + 1 ? len - MS_MIME_EXT_MAX - 1 : 0;
    for (size_t i = len; i > stop; i--) {
        char c = path[i - 1];
        if (c == '.') {
            dot = i - 1;
            break;
        }
        if (c == '/')
            break;
    }
    if (dot == len || dot + 1 == len)
        goto unknown;
    size_t n = len - (dot + 1);
    /* Leading dots belong to the name, not to an extension: ".bashrc" and "..rc" have none. */
    size_t k = dot;
    while (k > 0 && path[k - 1] == '.')
        k--;
    if (k == 0 || path[k - 1] == '/')
        goto unknown;
    char key[MS_MIME_EXT_MAX + 1] = {0};
    for (size_t i = 0; i < n; i++) {
        char c = path[dot + 1 + i];
        if (c == 0)
            goto unknown; /* a NUL would pass for the key's padding */
        key[i] = (char)ms__lower((unsigned char)c);
    }
    const mime_row_t *r = find(m, key);
    if (r->ext[0] == 0)
        goto unknown;
    if (out_len != NULL)
        *out_len = r->len;
    return m->types + r->off;
unknown:
    if (out_len != NULL)
        *out_len = sizeof(octet_stream) - 1;
    return octet_stream;
}

/* Ends with `suffix` (lowercase), ignoring case. */
static int ends_with(const char *p, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);
    return n >= k && ms__ieq(p + n - k, suffix, k);
}

int ms_mime_compressible(const char *type, size_t len)
{
    size_t n = 0;
    while (n < len && type[n] != ';')
        n++;
    while (n > 0 && (type[n - 1] == ' ' || type[n - 1] == '\t'))
        n--;
    if (n > 5 && ms__ieq(type, "text/", 5))
        return 1;
    /* Structured syntax suffixes (RFC 6839): application/ld+json, application/atom+xml,
     * image/svg+xml and the like are text underneath. */
    if (ends_with(type, n, "+json") || ends_with(type, n, "+xml"))
        return 1;
    /* ttf and otf are stored uncompressed (woff and woff2 are compressed already). */
    static const char *const yes[] = {
        "application/json",
        "application/javascript",
        "application/x-javascript",
        "application/ecmascript",
        "application/xml",
        "application/wasm",
        "font/ttf",
        "font/otf",
    };
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
        if (type_is(type, n, yes[i]))
            return 1;
    return 0;
}
