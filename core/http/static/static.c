/* static.c: static files from the core. A request under a mount is answered here without
 * entering Lua: the path is cleaned once and opened beneath the mount's directory, the file
 * is kept open in a cache (small ones in memory), and the reply follows the HTTP rules for
 * validators, ranges and encodings. File bytes go out with sendfile, or straight from memory
 * in the same writev as the head. */
#include "http/static/static.h"

#include <assert.h>
#include <brotli/encode.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "http/static/cond.h"
#include "http/http.h"
#include "http/static/mime.h"
#include "http/static/path.h"

/* A file as the static file cache holds it. Queued reply pieces hold references,
 * so a file evicted or replaced while it is being sent stays open until it is written. */
typedef struct ms_sfile_s ms_sfile_t;
struct ms_sfile_s {
    /* first: fd, refs (1 while cached, and 1 per queued piece) and data (the whole file when
     * small, or a compressed variant; owned) */
    ms_file_t file;
    ms_sfile_t *hnext;         /* the cache's hash chain */
    ms_sfile_t *older, *newer; /* the cache's recency list */
    struct ms_mount_s *mount;  /* where it was found; NULL for a file a handler named */
    uint32_t hash;
    uint8_t cached; /* in the table (not yet evicted or replaced) */
    uint8_t compressible;
    uint8_t encoding;   /* MS_ENC_*: what `data` or the file is encoded with */
    uint8_t sidecars;   /* MS_ENC_* bits: which precompressed sidecars exist */
    uint64_t size;      /* of what is served: the file, or `data` for a variant */
    uint64_t file_size; /* of the file as stat()ed */
    int64_t mtime_sec, mtime_nsec;
    int64_t ctime_sec, ctime_nsec; /* a chmod, chown or rename changes only this */
    uint64_t dev, ino;
    uint64_t checked;          /* the turn of the loop of the last check of the path */
    uint64_t sidecars_checked; /* loop ms of the last look for sidecars */
    ms_sfile_t *variant[3];    /* by MS_ENC_* (index 0 unused): encoded forms, when known */
    const char *type;          /* Content-Type, from the mime table */
    uint8_t type_len;
    uint8_t etag_len;
    char etag[40];
    char last_modified[32];
    uint16_t key_len;
    char key[]; /* the path below the mount, or the path a handler named */
};


/* Content codings, as indexes of ms_sfile_t.variant and bits of what a client accepts. */
enum { MS_ENC_IDENTITY, MS_ENC_BR, MS_ENC_GZIP };
#define ENC_BIT(e) (1u << (e))

/* Sidecars (file.br, file.gz) are looked for again after this long. */
#define SIDECAR_RECHECK_MS 1000
/* On-the-fly compression: bytes of input a worker may compress per second, with this burst. It
 * bounds the CPU a stream of cache misses can take; past it, files go uncompressed. */
#define COMPRESS_RATE  (8u * 1024 * 1024)
#define COMPRESS_BURST (16u * 1024 * 1024)
/* A compressed form is kept only when it saves at least 1/16 of the size. */
#define WORTH(out, in) ((out) < (in) - (in) / 16)
/* Room for the fields of a file reply: validators, a cache_control of CACHE_CONTROL_MAX
 * bytes, a type, ranges, a coding. */
#define CACHE_CONTROL_MAX 256
#define FIELDS_MAX        2048
/* Entries a directory listing shows at most; directories watched for live reload. */
#define LISTING_MAX 10000
#define WATCH_MAX   1024

typedef struct ms_mount_s {
    char *prefix; /* without a trailing '/': "" for the root */
    size_t prefix_len;
    int root_fd; /* -1 for the pseudo-mount of files handlers name */
    char *dir;
    ms_static_opts_t o; /* strings owned */
    size_t fields_len, cache_control_len;
} ms_mount_t;

typedef struct ms_static_s {
    ms_mount_t **mounts; /* in the order mounted: a mount's number is its index */
    uint32_t nmounts;
    ms_mount_t files; /* for ms_static_file() */
    const ms_mime_t *mime;
    ms_sfile_t **table;
    uint32_t mask, count;
    ms_sfile_t *lru; /* sentinel: lru->newer is the oldest entry, lru->older the newest */
    uint32_t max_files;
    uint64_t max_bytes, bytes;  /* contents held in memory, cached or still being sent */
    uint64_t budget, budget_at; /* compression tokens, and when they were last added */
    uint64_t generation;
    uint64_t turn;       /* turns of the loop: a file is checked once per turn */
    uv_check_t *counter; /* counts them */
    struct watch_s **watches;
    uint32_t nwatches;
} ms_static_t;

/* A directory watched for live reload. */
typedef struct watch_s {
    uv_fs_event_t h;
    ms_static_t *st;
    char path[];
} watch_t;

static const char live_script[] =
    "<script>new EventSource(\"/.moonserve/live\").onmessage=function(){location.reload()}"
    "</script>\n";

void ms_static_opts_default(ms_static_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->index = "index.html";
    o->memory_max = 64 * 1024;
    o->compress_min = 1024;
    o->compress_max = 1024 * 1024;
    o->immutable = o->precompressed = o->compress = 1;
}

static void mount_init(ms_mount_t *m, const ms_static_opts_t *o)
{
    m->o = *o;
    m->o.index = ms_mem_strdup(o->index);
    m->o.cache_control = ms_mem_strdup(o->cache_control);
    m->o.fields = ms_mem_strdup(o->fields);
    m->o.host = ms_mem_strdup(o->host);
    m->fields_len = o->fields ? strlen(o->fields) : 0;
    m->cache_control_len = o->cache_control ? strlen(o->cache_control) : 0;
}

/* The system's MIME table, read once per process and shared by its servers. */
static const ms_mime_t *mime_table(void)
{
    static ms_mime_t *table;
    if (table == NULL)
        table = ms_mime_load("/etc/mime.types");
    return table;
}

static void count_turn(uv_check_t *h)
{
    ((ms_static_t *)h->data)->turn++;
}

static void free_handle(uv_handle_t *h)
{
    ms_mem_free(h);
}

static ms_static_t *statics(ms_server_t *s)
{
    if (s->statics == NULL) {
        ms_static_t *st = ms_mem_alloc(sizeof(*st));
        memset(st, 0, sizeof(*st));
        st->mime = mime_table();
        st->lru = ms_mem_alloc(sizeof(*st->lru));
        memset(st->lru, 0, sizeof(*st->lru));
        st->lru->older = st->lru->newer = st->lru;
        st->max_files = MS_STATIC_CACHE_FILES;
        st->max_bytes = MS_STATIC_CACHE_BYTES;
        st->budget = COMPRESS_BURST;
        st->mask = 2 * MS_STATIC_CACHE_FILES - 1;
        st->table = ms_mem_alloc((st->mask + 1) * sizeof(*st->table));
        memset(st->table, 0, (st->mask + 1) * sizeof(*st->table));
        ms_static_opts_t o;
        ms_static_opts_default(&o);
        o.index = NULL;
        mount_init(&st->files, &o);
        st->files.root_fd = -1;
        st->files.prefix = ms_mem_strdup("");
        st->turn = 1;
        st->counter = ms_mem_alloc(sizeof(*st->counter));
        uv_check_init(s->loop, st->counter);
        st->counter->data = st;
        uv_check_start(st->counter, count_turn);
        uv_unref((uv_handle_t *)st->counter);
        s->statics = st;
        s->before_handler = ms__static_dispatch;
    }
    return s->statics;
}

/* -- The cache ------------------------------------------------------------------------------ */

static uint32_t key_hash(const ms_mount_t *m, const char *k, size_t n)
{
    uint32_t h = 2166136261u ^ (uint32_t)((uintptr_t)m >> 4);
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)k[i]) * 16777619u;
    return h;
}

static void lru_unlink(ms_sfile_t *f)
{
    f->older->newer = f->newer;
    f->newer->older = f->older;
}

static void lru_newest(ms_static_t *st, ms_sfile_t *f)
{
    f->older = st->lru->older;
    f->newer = st->lru;
    st->lru->older->newer = f;
    st->lru->older = f;
}

static void sfile_unref(ms_server_t *s, ms_sfile_t *f)
{
    assert(f->file.refs > 0);
    if (--f->file.refs > 0)
        return;
    for (int e = MS_ENC_BR; e <= MS_ENC_GZIP; e++)
        if (f->variant[e] != NULL)
            sfile_unref(s, f->variant[e]);
    if (f->file.fd >= 0)
        close(f->file.fd);
    if (f->file.data != NULL) {
        s->statics->bytes -= f->size;
        ms_mem_free(f->file.data);
    }
    ms_mem_free(f);
}

/* A queued reply piece gives its reference back (ms_file_t.release). */
static void file_release(ms_server_t *s, ms_file_t *f)
{
    sfile_unref(s, (ms_sfile_t *)f);
}

/* Takes `f` out of the table; queued pieces may still hold it. */
static void evict(ms_server_t *s, ms_sfile_t *f)
{
    ms_static_t *st = s->statics;
    ms_sfile_t **p = &st->table[f->hash & st->mask];
    while (*p != f)
        p = &(*p)->hnext;
    *p = f->hnext;
    lru_unlink(f);
    f->cached = 0;
    st->count--;
    sfile_unref(s, f);
}

/* Evicts the oldest entries (never `keep`) until one more file and `bytes` more fit. */
static void make_room(ms_server_t *s, uint64_t bytes, const ms_sfile_t *keep)
{
    ms_static_t *st = s->statics;
    while (st->lru->newer != st->lru &&
           (st->count >= st->max_files || st->bytes + bytes > st->max_bytes)) {
        ms_sfile_t *old = st->lru->newer;
        if (old == keep)
            break;
        evict(s, old);
    }
}

static ms_sfile_t *find(ms_static_t *st, const ms_mount_t *m, const char *key, size_t n, uint32_t h)
{
    for (ms_sfile_t *f = st->table[h & st->mask]; f != NULL; f = f->hnext)
        if (f->hash == h && f->mount == m && f->key_len == n && memcmp(f->key, key, n) == 0)
            return f;
    return NULL;
}

/* Whether `sb` is not the file `f` was made from, as it was then. The ctime counts: a chmod,
 * a chown, a rename or a rewrite that put the mtime back (cp -p) changes nothing else. */
static int changed(const ms_sfile_t *f, const struct stat *sb)
{
    return sb->st_nlink == 0 || (uint64_t)sb->st_size != f->file_size ||
           (uint64_t)sb->st_ino != f->ino || (uint64_t)sb->st_dev != f->dev ||
           sb->st_mtim.tv_sec != f->mtime_sec || sb->st_mtim.tv_nsec != f->mtime_nsec ||
           sb->st_ctim.tv_sec != f->ctime_sec || sb->st_ctim.tv_nsec != f->ctime_nsec;
}

/* Reads a whole file of `size` bytes; NULL if it is not that long any more. */
static char *read_whole(int fd, uint64_t size)
{
    char *p = ms_mem_alloc(size ? size : 1);
    uint64_t got = 0;
    while (got < size) {
        ssize_t n = pread(fd, p + got, size - got, (off_t)got);
        if (n <= 0) {
            if (n < 0 && errno == EINTR)
                continue;
            ms_mem_free(p);
            return NULL;
        }
        got += (uint64_t)n;
    }
    return p;
}

static void set_validators(ms_sfile_t *f)
{
    f->etag_len =
        (uint8_t)ms_etag_make(f->etag, sizeof(f->etag), f->file_size, f->mtime_sec, f->mtime_nsec);
    if (ms_http_date_format(f->last_modified, sizeof(f->last_modified), f->mtime_sec) < 0)
        f->last_modified[0] = 0;
}

/* A new entry for the open file `fd`, not yet in the table. */
static ms_sfile_t *sfile_new(ms_server_t *s, ms_mount_t *m, const char *key, size_t n, int fd,
                             const struct stat *sb, const ms_sfile_t *keep)
{
    ms_static_t *st = s->statics;
    ms_sfile_t *f = ms_mem_alloc(sizeof(*f) + n + 1);
    memset(f, 0, sizeof(*f));
    memcpy(f->key, key, n);
    f->key[n] = 0;
    f->key_len = (uint16_t)n;
    f->mount = m;
    f->file.fd = fd;
    f->file.refs = 1;
    f->file.release = file_release;
    f->size = f->file_size = (uint64_t)sb->st_size;
    f->mtime_sec = sb->st_mtim.tv_sec;
    f->mtime_nsec = sb->st_mtim.tv_nsec;
    f->ctime_sec = sb->st_ctim.tv_sec;
    f->ctime_nsec = sb->st_ctim.tv_nsec;
    f->dev = (uint64_t)sb->st_dev;
    f->ino = (uint64_t)sb->st_ino;
    f->checked = st->turn;
    size_t tl;
    f->type = ms_mime_type(st->mime, key, n, &tl);
    if (tl > UINT8_MAX) { /* a mime.types line can name any length; type_len cannot */
        f->type = "application/octet-stream";
        tl = strlen(f->type);
    }
    f->type_len = (uint8_t)tl;
    f->compressible = (uint8_t)ms_mime_compressible(f->type, tl);
    set_validators(f);
    if (f->size <= m->o.memory_max) {
        make_room(s, f->size, keep);
        if (st->bytes + f->size <= st->max_bytes) {
            f->file.data = read_whole(fd, f->size);
            if (f->file.data != NULL)
                st->bytes += f->size;
        }
    }
    return f;
}

/* Opens `key` under the mount: beneath its directory, or as given for a handler's file. A
 * regular file that nobody may read (no r in its mode) is refused with UV_EACCES even where
 * the open worked, as it does for root: whether a file is served must not depend on the
 * user the workers run as, nor on whether it was cached before the chmod. */
static int open_key(const ms_mount_t *m, const char *key, int *fd, struct stat *sb)
{
    if (m->root_fd >= 0) {
        int rc = ms_path_open(m->root_fd, key, fd, sb);
        if (rc < 0)
            return rc;
    } else {
        *fd = open(key, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (*fd < 0)
            return -errno;
        if (fstat(*fd, sb) < 0 || !(S_ISREG(sb->st_mode) || S_ISDIR(sb->st_mode))) {
            int rc = errno ? -errno : UV_EACCES;
            close(*fd);
            *fd = -1;
            return S_ISREG(sb->st_mode) ? rc : UV_EACCES;
        }
    }
    if (S_ISREG(sb->st_mode) && (sb->st_mode & (S_IRUSR | S_IRGRP | S_IROTH)) == 0) {
        close(*fd);
        *fd = -1;
        return UV_EACCES;
    }
    return 0;
}

static int hit(ms_static_t *st, ms_sfile_t *f, ms_sfile_t **out)
{
    lru_unlink(f);
    lru_newest(st, f);
    *out = f;
    return 0;
}

/**
 * The cached file for `key` under `m`. At most once per turn of the loop, a hit resolves the
 * path again, by the rules of the first open: a file changed (in its contents or its
 * metadata: the ctime), deleted, renamed over, moved out of the mount (or out from under a
 * directory of its path) or made unreadable is evicted, and what the path names now is
 * served, or not. Returns 0 with *out (borrowed from the cache), UV_EISDIR for a directory,
 * or a negative code.
 */
static int lookup(ms_server_t *s, ms_mount_t *m, const char *key, size_t n, ms_sfile_t **out)
{
    ms_static_t *st = s->statics;
    uint64_t now = st->turn;
    uint32_t h = key_hash(m, key, n);
    ms_sfile_t *f = find(st, m, key, n, h);
    if (f != NULL && f->checked == now) {
        s->m->static_hits++;
        return hit(st, f, out);
    }
    /* For a hit, openat2 beneath the root, fstat and close: two calls more than an fstat of
     * the open descriptor, which cannot see a rename of the file or of a directory above it.
     * Once per turn, whatever the number of requests in it. */
    int fd;
    struct stat sb;
    int rc = open_key(m, key, &fd, &sb);
    if (f != NULL) {
        if (rc == 0 && S_ISREG(sb.st_mode) && !changed(f, &sb)) {
            close(fd);
            f->checked = now;
            s->m->static_hits++;
            return hit(st, f, out);
        }
        evict(s, f);
    }
    s->m->static_misses++;
    if (rc < 0)
        return rc;
    if (S_ISDIR(sb.st_mode)) {
        close(fd);
        return UV_EISDIR;
    }
    make_room(s, 0, NULL);
    f = sfile_new(s, m, key, n, fd, &sb, NULL);
    f->hash = h;
    f->cached = 1;
    f->hnext = st->table[h & st->mask];
    st->table[h & st->mask] = f;
    st->count++;
    lru_newest(st, f);
    *out = f;
    return 0;
}

void ms_static_cache_limits(ms_server_t *s, uint32_t files, uint64_t bytes)
{
    ms_static_t *st = statics(s);
    st->max_files = files > 0 ? files : 1;
    st->max_bytes = bytes;
    make_room(s, 0, NULL);
}

/* -- Encodings ------------------------------------------------------------------------------- */

/* The codings an Accept-Encoding value takes (RFC 9110 12.5.3): br and gzip, unless their
 * weight is 0; "*" stands for those it does not name. */
static unsigned accepted(const ms_str_t *v)
{
    unsigned yes = 0, named = 0, star = 0;
    const char *p = v->base, *end = v->base + v->len;
    while (p < end) {
        while (p < end && (*p == ' ' || *p == '\t' || *p == ','))
            p++;
        const char *t = p;
        while (p < end && *p != ',' && *p != ';' && *p != ' ' && *p != '\t')
            p++;
        size_t tl = (size_t)(p - t);
        int zero = 0;
        while (p < end && *p != ',') {
            /* parameters: only q matters, and only whether it is zero */
            if ((*p == 'q' || *p == 'Q') && p + 1 < end && p[1] == '=') {
                const char *q = p + 2;
                zero = q < end && *q == '0';
                for (q++; zero && q < end && *q != ',' && *q != ';' && *q != ' '; q++)
                    if (*q != '.' && *q != '0')
                        zero = 0;
            }
            p++;
        }
        unsigned bit = 0;
        if (tl == 2 && ms__ieq(t, "br", 2))
            bit = ENC_BIT(MS_ENC_BR);
        else if ((tl == 4 && ms__ieq(t, "gzip", 4)) || (tl == 6 && ms__ieq(t, "x-gzip", 6)))
            bit = ENC_BIT(MS_ENC_GZIP);
        else if (tl == 1 && *t == '*')
            star = zero ? 2 : 1;
        named |= bit;
        if (!zero)
            yes |= bit;
    }
    if (star == 1)
        yes |= (ENC_BIT(MS_ENC_BR) | ENC_BIT(MS_ENC_GZIP)) & ~named;
    return yes;
}

/* Names `v` as the form of `f` encoded with `enc`: the file's type and date, and an
 * entity-tag of its own, the file's with the coding inside the quotes. */
static void as_variant(ms_sfile_t *v, const ms_sfile_t *f, int enc)
{
    v->encoding = (uint8_t)enc;
    v->type = f->type;
    v->type_len = f->type_len;
    v->mtime_sec = f->mtime_sec;
    memcpy(v->last_modified, f->last_modified, sizeof(v->last_modified));
    memcpy(v->etag, f->etag, f->etag_len - 1u);
    memcpy(v->etag + f->etag_len - 1, enc == MS_ENC_BR ? "-br\"" : "-gz\"", 5);
    v->etag_len = (uint8_t)(f->etag_len + 3);
}

/* An encoded form of `f` compressed here, held in memory (no file of its own). */
static ms_sfile_t *variant_new(const ms_sfile_t *f, int enc)
{
    ms_sfile_t *v = ms_mem_alloc(sizeof(*v) + 1);
    memset(v, 0, sizeof(*v) + 1);
    v->file.fd = -1;
    v->file.refs = 1;
    v->file.release = file_release;
    as_variant(v, f, enc);
    return v;
}

/* Looks for file.br and file.gz next to `f` again, once in a while. */
static void find_sidecars(ms_server_t *s, ms_sfile_t *f)
{
    uint64_t now = uv_now(s->loop);
    if (f->sidecars_checked != 0 && now - f->sidecars_checked < SIDECAR_RECHECK_MS)
        return;
    f->sidecars_checked = now ? now : 1;
    static const char *ext[] = {NULL, ".br", ".gz"};
    char key[MS_PATH_MAX + 4];
    if (f->key_len + 4u > sizeof(key))
        return;
    for (int e = MS_ENC_BR; e <= MS_ENC_GZIP; e++) {
        ms_sfile_t *old = f->variant[e];
        if (old != NULL && old->file.fd < 0)
            continue; /* compressed here: no sidecar was there */
        memcpy(key, f->key, f->key_len);
        memcpy(key + f->key_len, ext[e], 4);
        int fd;
        struct stat sb;
        f->variant[e] = NULL;
        f->sidecars &= (uint8_t)~ENC_BIT(e);
        if (open_key(f->mount, key, &fd, &sb) == 0) {
            if (S_ISREG(sb.st_mode)) {
                if (old != NULL && !changed(old, &sb)) {
                    close(fd); /* the same sidecar as before */
                    f->variant[e] = old;
                    old = NULL;
                } else {
                    ms_sfile_t *v = sfile_new(s, f->mount, key, f->key_len + 3u, fd, &sb, f);
                    as_variant(v, f, e); /* its own file, size and data; the file's names */
                    f->variant[e] = v;
                }
                f->sidecars |= (uint8_t)ENC_BIT(e);
            } else {
                close(fd);
            }
        }
        if (old != NULL)
            sfile_unref(s, old);
    }
}

static size_t compress_br(const char *in, size_t n, char *out, size_t cap)
{
    size_t len = cap;
    if (!BrotliEncoderCompress(5, BROTLI_DEFAULT_WINDOW, BROTLI_MODE_TEXT, n, (const uint8_t *)in,
                               &len, (uint8_t *)out))
        return 0;
    return len;
}

static size_t compress_gzip(const char *in, size_t n, char *out, size_t cap)
{
    z_stream z;
    memset(&z, 0, sizeof(z));
    if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return 0;
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)n;
    z.next_out = (Bytef *)out;
    z.avail_out = (uInt)cap;
    int rc = deflate(&z, Z_FINISH);
    size_t len = z.total_out;
    deflateEnd(&z);
    return rc == Z_STREAM_END ? len : 0;
}

/* Compresses `f` with `enc` and keeps the result as its variant, within the CPU budget and
 * the cache's memory. Whether it was worth it is remembered either way. */
static void compress_file(ms_server_t *s, ms_sfile_t *f, int enc)
{
    ms_static_t *st = s->statics;
    uint64_t now = uv_now(s->loop);
    st->budget += (now - st->budget_at) * (COMPRESS_RATE / 1000);
    if (st->budget > COMPRESS_BURST)
        st->budget = COMPRESS_BURST;
    st->budget_at = now;
    if (st->budget < f->size)
        return; /* busy compressing: this one goes as it is, and is tried again later */
    st->budget -= f->size;
    f->sidecars |= (uint8_t)(ENC_BIT(enc) << 4); /* tried */
    const char *in = f->file.data;
    char *tmp = NULL;
    if (in == NULL && (in = tmp = read_whole(f->file.fd, f->size)) == NULL)
        return;
    size_t cap = enc == MS_ENC_BR ? BrotliEncoderMaxCompressedSize(f->size)
                                  : compressBound((uLong)f->size) + 32;
    char *out = ms_mem_alloc(cap ? cap : 64);
    size_t len = enc == MS_ENC_BR ? compress_br(in, f->size, out, cap)
                                  : compress_gzip(in, f->size, out, cap);
    ms_mem_free(tmp);
    make_room(s, len, f);
    if (len == 0 || !WORTH(len, f->size) || st->bytes + len > st->max_bytes) {
        ms_mem_free(out);
        return;
    }
    ms_sfile_t *v = variant_new(f, enc);
    v->file.data = ms_mem_realloc(out, len);
    v->size = len;
    st->bytes += len;
    f->variant[enc] = v;
}

/* The form of `f` to send to a client that takes the codings `accept`: brotli before gzip,
 * a sidecar before compressing here. */
static ms_sfile_t *choose(ms_server_t *s, ms_mount_t *m, ms_sfile_t *f, unsigned accept)
{
    for (int e = MS_ENC_BR; e <= MS_ENC_GZIP; e++)
        if ((accept & ENC_BIT(e)) && f->variant[e] != NULL)
            return f->variant[e];
    if (!m->o.compress || !f->compressible || f->size < m->o.compress_min ||
        f->size > m->o.compress_max)
        return f;
    for (int e = MS_ENC_BR; e <= MS_ENC_GZIP; e++) {
        if (!(accept & ENC_BIT(e)) || (f->sidecars & (ENC_BIT(e) << 4)))
            continue;
        compress_file(s, f, e);
        if (f->variant[e] != NULL)
            return f->variant[e];
    }
    return f;
}

/* -- Replies ------------------------------------------------------------------------------- */

/* The request fields the file rules read, found in one pass. */
typedef struct fields_s {
    ms_str_t accept_encoding, range, if_range, if_match, if_none_match, if_modified_since,
        if_unmodified_since, host;
} fields_t;

static void read_fields(ms_req_t *r, fields_t *q)
{
    memset(q, 0, sizeof(*q));
    for (int i = 0; i < r->v.nheaders; i++) {
        const ms_header_t *h = &r->headers[i];
        const char *n = h->name.base;
        ms_str_t *to = NULL;
        switch (h->name.len) {
        case 4: to = ms__ieq(n, "host", 4) ? &q->host : NULL; break;
        case 5: to = ms__ieq(n, "range", 5) ? &q->range : NULL; break;
        case 8:
            to = ms__ieq(n, "if-range", 8)   ? &q->if_range
                 : ms__ieq(n, "if-match", 8) ? &q->if_match
                                             : NULL;
            break;
        case 13: to = ms__ieq(n, "if-none-match", 13) ? &q->if_none_match : NULL; break;
        case 15: to = ms__ieq(n, "accept-encoding", 15) ? &q->accept_encoding : NULL; break;
        case 17: to = ms__ieq(n, "if-modified-since", 17) ? &q->if_modified_since : NULL; break;
        case 19: to = ms__ieq(n, "if-unmodified-since", 19) ? &q->if_unmodified_since : NULL; break;
        }
        if (to != NULL && to->base == NULL)
            *to = h->value;
    }
}

static char *put(char *w, const char *p, size_t n)
{
    memcpy(w, p, n);
    return w + n;
}
#define PUT(w, lit) put((w), (lit), sizeof(lit) - 1)

/* Whether a file name carries a content hash ("app.3f9a1c.js", "main-B3xYz9Ab.css"): a part
 * between dots, or after the last '-', of 6 to 64 letters and digits with both in it. */
static int fingerprinted(const char *key, size_t n)
{
    const char *name = key, *end = key + n;
    for (const char *p = key; p < end; p++)
        if (*p == '/')
            name = p + 1;
    const char *ext = NULL;
    for (const char *p = name; p < end; p++)
        if (*p == '.')
            ext = p;
    if (ext == NULL)
        return 0;
    const char *part = name;
    for (const char *p = name; p <= ext; p++) {
        if (*p != '.' && *p != '-')
            continue;
        size_t len = (size_t)(p - part);
        if (part > name && len >= 6 && len <= 64) {
            int digit = 0, alpha = 0, other = 0;
            for (const char *q = part; q < p; q++) {
                char ch = *q;
                if (ch >= '0' && ch <= '9')
                    digit = 1;
                else if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'))
                    alpha = 1;
                else if (ch != '_')
                    other = 1;
            }
            if (digit && alpha && !other)
                return 1;
        }
        part = p + 1;
    }
    return 0;
}

/* The fields every answer about `rep` carries, a 304 included (RFC 9110 15.4.5). */
static char *validator_fields(char *w, const ms_mount_t *m, const ms_sfile_t *f,
                              const ms_sfile_t *rep, int vary)
{
    w = PUT(w, "etag: ");
    w = put(w, rep->etag, rep->etag_len);
    if (f->last_modified[0]) {
        w = PUT(w, "\r\nlast-modified: ");
        w = put(w, f->last_modified, 29);
    }
    w = PUT(w, "\r\n");
    if (m->o.immutable && fingerprinted(f->key, f->key_len))
        w = PUT(w, "cache-control: public, max-age=31536000, immutable\r\n");
    else if (m->o.cache_control != NULL) {
        w = PUT(w, "cache-control: ");
        w = put(w, m->o.cache_control, m->cache_control_len);
        w = PUT(w, "\r\n");
    }
    if (vary)
        w = PUT(w, "vary: accept-encoding\r\n");
    return w;
}

/* A reply with no file body (304, 412, 416, a redirect): fields already added. */
static int answer(ms_req_t *r, int status, const char *body)
{
    r->v.status = (uint16_t)status;
    return ms_reply_send(r, body, strlen(body), MS_VEC_STATIC, -1);
}

static int add_fields(ms_req_t *r, const ms_mount_t *m, const char *buf, size_t n)
{
    /* (lines built here from parts checked when mounted, and the mount's own fields) */
    int rc = ms_reply_fields_checked(r, buf, n);
    if (rc == 0 && m->fields_len > 0)
        rc = ms_reply_fields_checked(r, m->o.fields, m->fields_len);
    return rc;
}

/* Room for a part head: its fixed text (57 bytes), a type of up to 255 and a Content-Range. */
#define PART_HEAD_MAX (64 + UINT8_MAX + MS_CONTENT_RANGE_SIZE)

/* multipart/byteranges (RFC 9110 14.6): the part head before range `i`, or the closing
 * delimiter when i == n. Returns its length, which is what went into `out` (PART_HEAD_MAX
 * bytes): snprintf's answer is what it would have written, and past `cap` that is the
 * stack's bytes. */
static size_t part_head(char *out, const ms_sfile_t *f, const ms_range_t *rg, int i, int n,
                        uint32_t boundary)
{
    int len;
    if (i == n) {
        len = snprintf(out, PART_HEAD_MAX, "\r\n--%08x%08x--\r\n", boundary, ~boundary);
    } else {
        char cr[MS_CONTENT_RANGE_SIZE];
        ms_content_range(cr, sizeof(cr), rg[i].first, rg[i].last, f->size);
        len = snprintf(out, PART_HEAD_MAX,
                       "%s--%08x%08x\r\ncontent-type: %.*s\r\ncontent-range: %s\r\n\r\n",
                       i ? "\r\n" : "", boundary, ~boundary, (int)f->type_len, f->type, cr);
    }
    assert(len > 0 && len < PART_HEAD_MAX); /* type_len is a uint8_t */
    return len < 0 ? 0 : len >= PART_HEAD_MAX ? PART_HEAD_MAX - 1 : (size_t)len;
}

static int send_ranges(ms_req_t *r, const ms_mount_t *m, ms_sfile_t *f, char *buf, char *w,
                       const ms_range_t *rg, int n)
{
    r->v.status = 206;
    if (n == 1) {
        w = PUT(w, "content-range: ");
        w += ms_content_range(w, MS_CONTENT_RANGE_SIZE, rg[0].first, rg[0].last, f->size);
        w = PUT(w, "\r\ncontent-type: ");
        w = put(w, f->type, f->type_len);
        w = PUT(w, "\r\n");
        add_fields(r, m, buf, (size_t)(w - buf));
        uint64_t len = rg[0].last - rg[0].first + 1;
        ms_reply_begin(r, len);
        ms__reply_file(r, &f->file, rg[0].first, len);
        return ms_reply_end(r);
    }
    uint32_t boundary = ms__hash16(f->etag) ^ r->v.id;
    char part[PART_HEAD_MAX];
    uint64_t total = 0;
    for (int i = 0; i <= n; i++)
        total +=
            part_head(part, f, rg, i, n, boundary) + (i < n ? rg[i].last - rg[i].first + 1 : 0);
    w += snprintf(w, 96, "content-type: multipart/byteranges; boundary=%08x%08x\r\n", boundary,
                  ~boundary);
    add_fields(r, m, buf, (size_t)(w - buf));
    ms_reply_begin(r, total);
    for (int i = 0; i <= n; i++) {
        size_t len = part_head(part, f, rg, i, n, boundary);
        ms_reply_piece(r, part, len, MS_VEC_OUT, -1);
        if (i < n)
            ms__reply_file(r, &f->file, rg[i].first, rg[i].last - rg[i].first + 1);
    }
    return ms_reply_end(r);
}

/* Answers with file `f` (found under mount `m`) by the rules of RFC 9110: the encoding the
 * client takes, preconditions (304, 412), ranges (206, 416), or the whole file. */
static int send_file(ms_req_t *r, ms_mount_t *m, ms_sfile_t *f, const fields_t *q, int typed)
{
    ms_server_t *s = r->conn->server;
    int is_get = r->v.method.len == 3;
    int live = m->o.live_reload && f->type_len >= 9 && memcmp(f->type, "text/html", 9) == 0;
    int ranged = is_get && q->range.base != NULL && !live;
    ms_sfile_t *rep = f;
    if (m->o.precompressed)
        find_sidecars(s, f); /* also for Vary, which must not depend on who asked first */
    if (q->accept_encoding.base != NULL && !ranged && !live) {
        unsigned accept = accepted(&q->accept_encoding);
        if (accept != 0)
            rep = choose(s, m, f, accept);
    }
    int vary = f->compressible || f->sidecars & (ENC_BIT(MS_ENC_BR) | ENC_BIT(MS_ENC_GZIP));
    char buf[FIELDS_MAX];
    char *w = validator_fields(buf, m, f, rep, vary);

    ms_cond_in_t in = {.method = r->v.method,
                       .if_match = q->if_match,
                       .if_none_match = q->if_none_match,
                       .if_modified_since = q->if_modified_since,
                       .if_unmodified_since = q->if_unmodified_since,
                       .etag = {rep->etag, rep->etag_len},
                       .mtime = f->last_modified[0] ? f->mtime_sec : -1};
    int cond = ms_cond_evaluate(&in);
    if (cond == MS_COND_NOT_MODIFIED) {
        add_fields(r, m, buf, (size_t)(w - buf));
        return answer(r, 304, "");
    }
    if (cond == MS_COND_PRECONDITION_FAILED) {
        add_fields(r, m, buf, (size_t)(w - buf));
        return answer(r, 412, "412 Precondition Failed\n");
    }
    if (rep == f && !live)
        w = PUT(w, "accept-ranges: bytes\r\n");
    if (ranged && (q->if_range.base == NULL ||
                   ms_if_range_ok(q->if_range.base, q->if_range.len, f->etag, f->etag_len,
                                  f->last_modified[0] ? f->mtime_sec : -1))) {
        ms_range_t rg[MS_RANGES_MAX];
        int n = 0;
        int rc = ms_range_parse(q->range.base, q->range.len, f->size, rg, MS_RANGES_MAX, &n);
        if (rc == MS_RANGE_UNSATISFIABLE) {
            w = PUT(w, "content-range: ");
            w += ms_content_range(w, MS_CONTENT_RANGE_SIZE, 1, 0, f->size);
            w = PUT(w, "\r\ncontent-type: text/plain; charset=utf-8\r\n");
            add_fields(r, m, buf, (size_t)(w - buf));
            return answer(r, 416, "416 Range Not Satisfiable\n");
        }
        if (rc == MS_RANGE_OK)
            return send_ranges(r, m, f, buf, w, rg, n);
    }
    if (!typed) {
        w = PUT(w, "content-type: ");
        w = put(w, rep->type, rep->type_len);
        w = PUT(w, "\r\n");
    }
    if (rep->encoding != MS_ENC_IDENTITY)
        w = rep->encoding == MS_ENC_BR ? PUT(w, "content-encoding: br\r\n")
                                       : PUT(w, "content-encoding: gzip\r\n");
    add_fields(r, m, buf, (size_t)(w - buf));
    size_t extra = live ? sizeof(live_script) - 1 : 0;
    ms_reply_begin(r, rep->size + extra);
    ms__reply_file(r, &rep->file, 0, rep->size);
    if (extra)
        ms_reply_piece(r, live_script, extra, MS_VEC_STATIC, -1);
    return ms_reply_end(r);
}

/* -- Directories ----------------------------------------------------------------------------- */

static void buf_put(ms_buf_t *b, const char *p, size_t n)
{
    ms__buf_append(b, p, n);
}

#define BUF_LIT(b, lit) buf_put((b), (lit), sizeof(lit) - 1)

static void html_escape(ms_buf_t *b, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        switch (p[i]) {
        case '&': buf_put(b, "&amp;", 5); break;
        case '<': buf_put(b, "&lt;", 4); break;
        case '>': buf_put(b, "&gt;", 4); break;
        case '"': buf_put(b, "&quot;", 6); break;
        case '\'': buf_put(b, "&#39;", 5); break;
        default: buf_put(b, p + i, 1);
        }
    }
}

/* Percent-encodes all but unreserved bytes (and '/' when `slash`): for URLs we make. */
static void url_escape(ms_buf_t *b, const char *p, size_t n, int slash)
{
    static const char hex[] = "0123456789ABCDEF";
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
            ch == '-' || ch == '.' || ch == '_' || ch == '~' || (slash && ch == '/')) {
            buf_put(b, p + i, 1);
        } else {
            char e[3] = {'%', hex[ch >> 4], hex[ch & 15]};
            buf_put(b, e, 3);
        }
    }
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Answers with a listing of the directory `rel`: names escaped for HTML and for the links,
 * directories first marked with '/', sorted, dotfiles left out unless the mount serves them. */
static int send_listing(ms_req_t *r, ms_mount_t *m, const char *rel)
{
    int fd;
    if (ms_path_open(m->root_fd, rel, &fd, NULL) < 0)
        return MS_STATIC_MISS;
    DIR *d = fdopendir(fd);
    if (d == NULL) {
        close(fd);
        return MS_STATIC_MISS;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < LISTING_MAX) {
        if (e->d_name[0] == '.' &&
            (!m->o.dotfiles || !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")))
            continue;
        int is_dir = e->d_type == DT_DIR;
        if (e->d_type == DT_UNKNOWN || e->d_type == DT_LNK) {
            struct stat sb;
            is_dir = fstatat(dirfd(d), e->d_name, &sb, 0) == 0 && S_ISDIR(sb.st_mode);
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            names = ms_mem_realloc(names, cap * sizeof(*names));
        }
        size_t len = strlen(e->d_name);
        names[n] = ms_mem_alloc(len + 2);
        memcpy(names[n], e->d_name, len);
        names[n][len] = is_dir ? '/' : 0;
        names[n][len + 1] = 0;
        n++;
    }
    closedir(d);
    qsort(names, n, sizeof(*names), by_name);
    ms_buf_t b = {0};
    const ms_str_t *path = &r->v.path;
    BUF_LIT(&b, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Index of ");
    html_escape(&b, path->base, path->len);
    BUF_LIT(&b, "</title></head>\n<body><h1>Index of ");
    html_escape(&b, path->base, path->len);
    BUF_LIT(&b, "</h1>\n<ul>\n");
    if (rel[0] != 0)
        BUF_LIT(&b, "<li><a href=\"../\">../</a></li>\n");
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        BUF_LIT(&b, "<li><a href=\"./");
        url_escape(&b, names[i], len, 1);
        BUF_LIT(&b, "\">");
        html_escape(&b, names[i], len);
        BUF_LIT(&b, "</a></li>\n");
        ms_mem_free(names[i]);
    }
    ms_mem_free(names);
    BUF_LIT(&b, "</ul>\n</body></html>\n");
    static const char type[] = "content-type: text/html; charset=utf-8\r\n"
                               "cache-control: no-cache\r\n";
    add_fields(r, m, type, sizeof(type) - 1);
    int rc = ms_reply_send(r, b.base, b.len, MS_VEC_OUT, -1);
    ms_mem_free(b.base);
    return rc;
}

/* A directory asked for without its trailing '/': send the client to the name with it, built
 * from the cleaned path (so never "//host"), with the query kept. */
static int redirect_to_dir(ms_req_t *r, ms_mount_t *m, const char *rel, size_t n)
{
    ms_buf_t b = {0};
    BUF_LIT(&b, "location: ");
    buf_put(&b, m->prefix, m->prefix_len);
    BUF_LIT(&b, "/");
    if (n > 0) {
        url_escape(&b, rel, n, 1);
        BUF_LIT(&b, "/");
    }
    if (r->v.query.len > 0) {
        BUF_LIT(&b, "?");
        buf_put(&b, r->v.query.base, r->v.query.len);
    }
    BUF_LIT(&b, "\r\n");
    add_fields(r, m, b.base, b.len);
    ms_mem_free(b.base);
    return answer(r, 301, "");
}

/* -- Serving ----------------------------------------------------------------------------------- */

static int bad_path(ms_req_t *r, const char *why)
{
    char peer[64];
    ms_conn_peer(r->conn, peer, sizeof(peer));
    ms_log(MS_LOG_INFO, "%s: 400 Bad Request: static path: %s", peer, why);
    r->conn->server->stats->bad_requests++;
    static const char type[] = "content-type: text/plain; charset=utf-8\r\n";
    ms_reply_field(r, type, sizeof(type) - 1);
    return answer(r, 400, "400 Bad Request\n");
}

/* The last segment of `rel` has no '.': it names no file type, so a SPA's route. */
static int no_extension(const char *rel, size_t n)
{
    for (size_t i = n; i > 0 && rel[i - 1] != '/'; i--)
        if (rel[i - 1] == '.')
            return 0;
    return 1;
}

static int serve_mount(ms_req_t *r, ms_mount_t *m, const fields_t *q)
{
    ms_server_t *s = r->conn->server;
    const char *below = r->v.path.base + m->prefix_len;
    size_t blen = r->v.path.len - m->prefix_len;
    char rel[MS_PATH_MAX];
    const char *why;
    int n = ms_path_clean(below, blen, rel, sizeof(rel) - 64, m->o.dotfiles, &why);
    if (n < 0) {
        if (n == MS_EBADREQ && strcmp(why, "hidden file") != 0)
            return bad_path(r, why);
        return MS_STATIC_MISS; /* a hidden file, or a name too long to exist */
    }
    int slash = blen > 0 && below[blen - 1] == '/';
    size_t ilen = m->o.index ? strlen(m->o.index) : 0;
    ms_sfile_t *f = NULL;
    int rc;
    if (slash && ilen > 0) {
        /* A directory's page: looked up first, so that a hit is one cache lookup. */
        memcpy(rel + n, n ? "/" : "", n ? 1 : 0);
        memcpy(rel + n + (n ? 1 : 0), m->o.index, ilen + 1);
        rc = lookup(s, m, rel, (size_t)n + (n ? 1 : 0) + ilen, &f);
        rel[n] = 0;
        if (rc == 0)
            return send_file(r, m, f, q, 0);
    }
    rc = lookup(s, m, rel, (size_t)n, &f);
    if (rc == UV_EISDIR) {
        if (!slash)
            return redirect_to_dir(r, m, rel, (size_t)n);
        if (m->o.listing)
            return send_listing(r, m, rel);
        /* The app answers (404), but must not take the '/' away: that would send the
         * client back here. */
        r->v.flags |= MS_REQ_STATIC_DIR;
        return MS_STATIC_MISS;
    }
    if (rc == 0)
        return send_file(r, m, f, q, 0);
    if (m->o.spa && ilen > 0 && no_extension(rel, (size_t)n) &&
        lookup(s, m, m->o.index, ilen, &f) == 0)
        return send_file(r, m, f, q, 0);
    return MS_STATIC_MISS;
}

/* Whether a Host field names `want` (lowercase, no port). The port is cut as the framework
 * cuts it for sites (moonserve.security.split_host): an IP literal ends at its ']'
 * ("[::1]:8080" is "[::1]"), any other host at its first ':'. */
static int host_is(const ms_str_t *host, const char *want)
{
    size_t n = host->len;
    if (n > 0 && host->base[0] == '[') {
        const char *close = memchr(host->base, ']', n);
        if (close != NULL)
            n = (size_t)(close - host->base) + 1;
    } else {
        const char *colon = memchr(host->base, ':', n);
        if (colon != NULL)
            n = (size_t)(colon - host->base);
    }
    size_t wl = strlen(want);
    return n == wl && ms__ieq(host->base, want, n);
}

static int under(const ms_mount_t *m, const ms_str_t *path)
{
    /* (an HTTP/2 request may come with no path at all: base NULL, len 0) */
    return path->len >= m->prefix_len &&
           (m->prefix_len == 0 || memcmp(path->base, m->prefix, m->prefix_len) == 0) &&
           (path->len == m->prefix_len || path->base[m->prefix_len] == '/');
}

/* The mount with the longest prefix the request's path is under ("/assets/img" before
 * "/assets"), for its Host if the mount names one. Hooked mounts take part in the choice:
 * when one wins, the request goes to Lua, where its hook runs first; an outer mount without
 * a hook must not answer for the paths beneath it. */
int ms__static_dispatch(ms_req_t *r)
{
    ms_static_t *st = r->conn->server->statics;
    ms_mount_t *best = NULL;
    fields_t q;
    int have_fields = 0;
    for (uint32_t i = 0; i < st->nmounts; i++) {
        ms_mount_t *m = st->mounts[i];
        if (!under(m, &r->v.path) || (best && best->prefix_len >= m->prefix_len))
            continue;
        if (m->o.host != NULL) {
            if (!have_fields)
                read_fields(r, &q);
            have_fields = 1;
            if (q.host.base == NULL || !host_is(&q.host, m->o.host))
                continue;
        }
        best = m;
    }
    if (best == NULL || best->o.hooked || !ms__req_get_or_head(r))
        return MS_STATIC_MISS;
    if (!have_fields)
        read_fields(r, &q);
    return serve_mount(r, best, &q);
}

int ms_static_serve(ms_req_t *r, int id)
{
    ms_static_t *st = r->conn->server->statics;
    if (st == NULL || id < 0 || (uint32_t)id >= st->nmounts || !ms__req_get_or_head(r))
        return MS_STATIC_MISS;
    ms_mount_t *m = st->mounts[id];
    if (!under(m, &r->v.path))
        return MS_STATIC_MISS;
    fields_t q;
    read_fields(r, &q);
    return serve_mount(r, m, &q);
}

int ms_static_file(ms_req_t *r, const char *path, size_t len, int typed)
{
    ms_server_t *s = r->conn->server;
    ms_static_t *st = statics(s);
    if (len == 0 || len >= MS_PATH_MAX || memchr(path, 0, len) != NULL)
        return UV_EINVAL;
    char key[MS_PATH_MAX];
    memcpy(key, path, len);
    key[len] = 0;
    ms_sfile_t *f;
    int rc = lookup(s, &st->files, key, len, &f);
    if (rc < 0)
        return rc;
    fields_t q;
    read_fields(r, &q);
    return send_file(r, &st->files, f, &q, typed);
}

/* -- Mounts ----------------------------------------------------------------------------------- */

static void watch_closed(uv_handle_t *h)
{
    ms_mem_free(container_of((uv_fs_event_t *)h, watch_t, h));
}

static void watch_dir(ms_static_t *st, uv_loop_t *loop, const char *path, int depth);

static void on_change(uv_fs_event_t *h, const char *name, int events, int status)
{
    watch_t *w = container_of(h, watch_t, h);
    if (status < 0)
        return;
    w->st->generation++;
    if (name != NULL && (events & UV_RENAME)) {
        /* A directory made or moved in is watched from now on. */
        char sub[MS_PATH_MAX];
        struct stat sb;
        int n = snprintf(sub, sizeof(sub), "%s/%s", w->path, name);
        if (n > 0 && (size_t)n < sizeof(sub) && stat(sub, &sb) == 0 && S_ISDIR(sb.st_mode))
            watch_dir(w->st, h->loop, sub, 1);
    }
}

/* Watches `path` and the directories below it, for live reload. */
static void watch_dir(ms_static_t *st, uv_loop_t *loop, const char *path, int depth)
{
    for (uint32_t i = 0; i < st->nwatches; i++)
        if (strcmp(st->watches[i]->path, path) == 0)
            return;
    if (st->nwatches >= WATCH_MAX || depth > 32)
        return;
    size_t len = strlen(path);
    watch_t *w = ms_mem_alloc(sizeof(*w) + len + 1);
    memcpy(w->path, path, len + 1);
    w->st = st;
    uv_fs_event_init(loop, &w->h);
    if (uv_fs_event_start(&w->h, on_change, path, 0) != 0) {
        uv_close((uv_handle_t *)&w->h, watch_closed);
        return;
    }
    uv_unref((uv_handle_t *)&w->h);
    st->watches = ms_mem_realloc(st->watches, (st->nwatches + 1) * sizeof(*st->watches));
    st->watches[st->nwatches++] = w;
    DIR *d = opendir(path);
    if (d == NULL)
        return;
    struct dirent *e;
    char sub[MS_PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || e->d_type != DT_DIR)
            continue;
        int n = snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
        if (n > 0 && (size_t)n < sizeof(sub))
            watch_dir(st, loop, sub, depth + 1);
    }
    closedir(d);
}

/* A field value we may send: no CR, LF or other control byte (NULL is fine: none). */
static int field_value_ok(const char *v)
{
    for (; v != NULL && *v; v++)
        if ((unsigned char)*v < 0x20 || *v == 0x7f)
            return 0;
    return 1;
}

int ms_static_mount(ms_server_t *s, const char *prefix, const char *dir, const ms_static_opts_t *o)
{
    size_t plen = strlen(prefix);
    while (plen > 0 && prefix[plen - 1] == '/')
        plen--;
    if ((prefix[0] != '/' && prefix[0] != 0) || !field_value_ok(o->cache_control) ||
        (o->cache_control && strlen(o->cache_control) > CACHE_CONTROL_MAX) ||
        (o->fields && ms_fields_check(o->fields, strlen(o->fields)) != 0) ||
        (o->index && (strlen(o->index) > 60 || strchr(o->index, '/') || !o->index[0])))
        return UV_EINVAL;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ms_static_t *st = statics(s);
    ms_mount_t *m = ms_mem_alloc(sizeof(*m));
    memset(m, 0, sizeof(*m));
    mount_init(m, o);
    m->root_fd = fd;
    m->prefix = ms_mem_alloc(plen + 1);
    memcpy(m->prefix, prefix, plen);
    m->prefix[plen] = 0;
    m->prefix_len = plen;
    m->dir = ms_mem_strdup(dir);
    st->mounts = ms_mem_realloc(st->mounts, (st->nmounts + 1) * sizeof(*st->mounts));
    st->mounts[st->nmounts++] = m;
    int id = (int)st->nmounts - 1;
    if (o->live_reload)
        watch_dir(st, s->loop, dir, 0);
    return id;
}

uint64_t ms_static_generation(ms_server_t *s)
{
    return s->statics ? s->statics->generation : 0;
}

static void mount_free(ms_mount_t *m)
{
    if (m->root_fd >= 0)
        close(m->root_fd);
    ms_mem_free((char *)m->o.index);
    ms_mem_free((char *)m->o.cache_control);
    ms_mem_free((char *)m->o.fields);
    ms_mem_free((char *)m->o.host);
    ms_mem_free(m->prefix);
    ms_mem_free(m->dir);
}

void ms__static_free(ms_server_t *s)
{
    ms_static_t *st = s->statics;
    if (st == NULL)
        return;
    while (st->lru->newer != st->lru)
        evict(s, st->lru->newer);
    uv_close((uv_handle_t *)st->counter, free_handle);
    for (uint32_t i = 0; i < st->nwatches; i++)
        uv_close((uv_handle_t *)&st->watches[i]->h, watch_closed);
    for (uint32_t i = 0; i < st->nmounts; i++) {
        mount_free(st->mounts[i]);
        ms_mem_free(st->mounts[i]);
    }
    mount_free(&st->files);
    ms_mem_free(st->mounts);
    ms_mem_free(st->watches);
    ms_mem_free(st->table);
    ms_mem_free(st->lru);
    ms_mem_free(st);
    s->statics = NULL;
    s->before_handler = NULL;
}

const ms_part_t ms__static_part = {.name = "static files", .worker_free = ms__static_free};
