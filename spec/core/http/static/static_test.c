/* static_test.c: static files through the engine and the memory transport: file pieces in
 * the reply queue, the cache's references, and what never reaches the handler. */
#define _GNU_SOURCE /* memmem */
#include "test.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../../../core/transport/memio.h"
#include "../../../../core/http/static/static.c"

#define S(lit) lit, sizeof(lit) - 1

static uv_loop_t loop;
static ms_server_t *srv;
static char root[64];
static int handled; /* requests that reached the handler (fell through the mount) */

static void on_request(ms_req_t *r, void *data)
{
    (void)data;
    handled++;
    r->v.status = 404;
    ms_reply_send(r, S("lua 404"), MS_VEC_STATIC, -1);
    ms_req_finish(r);
}

static void on_resume(ms_req_t *r, void *data)
{
    (void)r;
    (void)data;
}

static void write_file(const char *name, const char *data, size_t len)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", root, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, data, len) != (ssize_t)len)
        abort();
    close(fd);
}

/* A file of `len` bytes whose byte i is i * 7 mod 251, so any misplaced part shows. */
static char *pattern(size_t len)
{
    char *p = malloc(len);
    for (size_t i = 0; i < len; i++)
        p[i] = (char)(i * 7 % 251);
    return p;
}

static void setup(void)
{
    ms_log_set(NULL, MS_LOG_ERR);
    snprintf(root, sizeof(root), "/tmp/ms-static-XXXXXX");
    if (mkdtemp(root) == NULL)
        abort();
    uv_loop_init(&loop);
    srv = ms_server_new(&loop, NULL, on_request, on_resume, NULL);
    handled = 0;
    ms_static_opts_t o;
    ms_static_opts_default(&o);
    o.memory_max = 4096;
    if (ms_static_mount(srv, "/files", root, &o) != 0)
        abort();
}

static void teardown(void)
{
    ms_server_free(srv);
    uv_loop_close(&loop);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    if (system(cmd) != 0)
        abort();
}

/* Sends one request on a new connection; the reply is in m->out. */
static void get(ms_memio_t *m, const char *head)
{
    ms_memio_open(srv, m);
    ms_memio_feed(m, head, strlen(head));
}

/* The body after the head, and its length. */
static const char *body_of(const ms_memio_t *m, size_t *len)
{
    const char *end = memmem(m->out.base, m->out.len, "\r\n\r\n", 4);
    if (end == NULL) {
        *len = 0;
        return "";
    }
    *len = m->out.len - (size_t)(end + 4 - m->out.base);
    return end + 4;
}

static char *text_of(ms_memio_t *m)
{
    ms__buf_append(&m->out, "", 1);
    m->out.len--;
    return m->out.base;
}

TEST(static_small_file_leaves_with_its_head_in_one_write_and_never_reaches_the_handler)
{
    setup();
    write_file("a.txt", S("hello file"));
    ms_memio_t m;
    get(&m, "GET /files/a.txt HTTP/1.1\r\nhost: x\r\n\r\n");
    char *out = text_of(&m);
    ASSERT_HAS(out, "HTTP/1.1 200 OK\r\n");
    ASSERT_HAS(out, "content-length: 10\r\n");
    ASSERT_HAS(out, "content-type: text/plain; charset=utf-8\r\n");
    ASSERT_HAS(out, "\r\n\r\nhello file");
    ASSERT_EQ(0, handled);
    ASSERT(srv->statics->lru->older->file.data != NULL); /* small: held in memory */
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    teardown();
}

TEST(static_a_warm_hit_allocates_nothing)
{
#if defined(__SANITIZE_ADDRESS__)
    return; /* recycling is off under ASan, on purpose */
#endif
    setup();
    write_file("a.txt", S("hello file"));
    const char *req = "GET /files/a.txt HTTP/1.1\r\nhost: x\r\n\r\n";
    ms_memio_t m;
    get(&m, req);
    for (int i = 0; i < 3; i++)
        ms_memio_feed(&m, req, strlen(req));
    uint64_t before = ms_mem_stats.allocs + ms_mem_stats.reallocs;
    for (int i = 0; i < 50; i++) {
        m.out.len = 0;
        ms_memio_feed(&m, req, strlen(req));
        srv->statics->turn++; /* a new turn of the loop: the hit checks the file again */
    }
    ASSERT_EQ(0, ms_mem_stats.allocs + ms_mem_stats.reallocs - before);
    ASSERT_HAS(text_of(&m), "hello file");
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    teardown();
}

TEST(static_large_file_goes_out_in_parts_to_a_slow_reader_whole_and_in_order)
{
    setup();
    size_t len = 5 * MS_FILE_CHUNK + 123; /* over memory_max: read in parts */
    char *data = pattern(len);
    write_file("big.bin", data, len);
    ms_memio_t m;
    memset(&m, 0, sizeof(m));
    ms_memio_open(srv, &m);
    m.congested = 1; /* every write waits for the peer */
    ms_memio_feed(&m, S("GET /files/big.bin HTTP/1.1\r\nhost: x\r\n\r\n"));
    int drains = 0;
    while (m.held.len > 0 && drains < 100) {
        ms_memio_drain(&m);
        drains++;
    }
    ASSERT(drains >= 5); /* one part at a time, never the whole file */
    size_t blen;
    const char *body = body_of(&m, &blen);
    ASSERT_EQ(len, blen);
    ASSERT(memcmp(body, data, len) == 0);
#if !defined(__SANITIZE_ADDRESS__)
    ASSERT(srv->chunk_free.count >= 1); /* the part buffer went back to the worker */
#endif
    free(data);
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    teardown();
}

TEST(static_file_evicted_while_queued_is_still_sent_then_closed)
{
    setup();
    size_t len = 3 * MS_FILE_CHUNK;
    char *data = pattern(len);
    write_file("big.bin", data, len);
    write_file("b.txt", S("b"));
    ms_memio_t m;
    memset(&m, 0, sizeof(m));
    ms_memio_open(srv, &m);
    m.congested = 1;
    ms_memio_feed(&m, S("GET /files/big.bin HTTP/1.1\r\nhost: x\r\n\r\n"));
    ms_sfile_t *f = srv->statics->lru->older;
    ASSERT_EQ(2, f->file.refs); /* the cache's and the queued piece's */
    ms_static_cache_limits(srv, 1, 1 << 20);
    ms_memio_t m2;
    get(&m2, "GET /files/b.txt HTTP/1.1\r\nhost: x\r\n\r\n"); /* evicts big.bin */
    ASSERT_EQ(1, srv->statics->count);
    ASSERT_EQ(1, f->file.refs);
    while (m.held.len > 0)
        ms_memio_drain(&m);
    size_t blen;
    const char *body = body_of(&m, &blen);
    ASSERT_EQ(len, blen);
    ASSERT(memcmp(body, data, len) == 0);
    free(data);
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_peer_close(&m2, UV_EOF);
    ms_memio_free(&m);
    ms_memio_free(&m2);
    teardown();
}

TEST(static_file_cut_short_while_sent_closes_the_connection)
{
    setup();
    size_t len = 4 * MS_FILE_CHUNK;
    char *data = pattern(len);
    write_file("big.bin", data, len);
    ms_memio_t m;
    memset(&m, 0, sizeof(m));
    ms_memio_open(srv, &m);
    m.congested = 1;
    ms_memio_feed(&m, S("GET /files/big.bin HTTP/1.1\r\nhost: x\r\n\r\n"));
    char path[128];
    snprintf(path, sizeof(path), "%s/big.bin", root);
    ASSERT_EQ(0, truncate(path, MS_FILE_CHUNK));
    for (int i = 0; i < 10 && m.held.len > 0; i++)
        ms_memio_drain(&m);
    ASSERT_EQ(2, m.closed); /* the promised length cannot be kept: an abortive close */
    ASSERT(m.out.len < len);
    free(data);
    ms_memio_free(&m);
    teardown();
}

TEST(static_bad_paths_get_400_from_the_core_and_misses_go_to_the_handler)
{
    setup();
    write_file("a.txt", S("a"));
    write_file(".env", S("secret"));
    static const char *bad[] = {"/files/%2e%2e/x", "/files/a%00", "/files/a%2Fb", "/files/a%5cb",
                                "/files/%zz"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        ms_memio_t m;
        char req[256];
        snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nhost: x\r\n\r\n", bad[i]);
        get(&m, req);
        ASSERT_HAS(text_of(&m), "HTTP/1.1 400 Bad Request\r\n");
        ms_memio_peer_close(&m, UV_EOF);
        ms_memio_free(&m);
    }
    ASSERT_EQ(0, handled);
    static const char *miss[] = {"/files/.env", "/files/nope.txt", "/files/a.txt/x"};
    for (size_t i = 0; i < sizeof(miss) / sizeof(*miss); i++) {
        ms_memio_t m;
        char req[256];
        snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nhost: x\r\n\r\n", miss[i]);
        get(&m, req);
        ASSERT_HAS(text_of(&m), "lua 404");
        ASSERT_LACKS(text_of(&m), "secret");
        ms_memio_peer_close(&m, UV_EOF);
        ms_memio_free(&m);
    }
    ASSERT_EQ(3, handled);
    ms_memio_t m;
    get(&m, "POST /files/a.txt HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n");
    ASSERT_EQ(4, handled); /* other methods are the app's to answer */
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    teardown();
}

TEST(static_a_changed_file_is_seen_on_the_next_turn_of_the_loop)
{
    setup();
    write_file("a.txt", S("one"));
    const char *req = "GET /files/a.txt HTTP/1.1\r\nhost: x\r\n\r\n";
    ms_memio_t m;
    get(&m, req);
    ASSERT_HAS(text_of(&m), "\r\n\r\none");
    write_file("a.txt", S("second"));
    m.out.len = 0;
    srv->statics->turn++;
    ms_memio_feed(&m, req, strlen(req));
    ASSERT_HAS(text_of(&m), "\r\n\r\nsecond");
    char path[128];
    snprintf(path, sizeof(path), "%s/a.txt", root);
    unlink(path);
    m.out.len = 0;
    srv->statics->turn++;
    ms_memio_feed(&m, req, strlen(req));
    ASSERT_HAS(text_of(&m), "lua 404");
    ASSERT_EQ(0, srv->statics->count);
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    teardown();
}

TEST(static_a_hooked_mount_inside_a_plain_one_wins_its_paths_and_goes_to_the_handler)
{
    setup();
    char sub[128];
    snprintf(sub, sizeof(sub), "%s/private", root);
    if (mkdir(sub, 0755) != 0)
        abort();
    write_file("private/secret.txt", S("behind the hook"));
    snprintf(sub, sizeof(sub), "%s/private/open", root);
    if (mkdir(sub, 0755) != 0)
        abort();
    write_file("private/open/a.txt", S("open again"));
    ms_static_opts_t o;
    ms_static_opts_default(&o);
    o.hooked = 1;
    snprintf(sub, sizeof(sub), "%s/private", root);
    ASSERT_EQ(1, ms_static_mount(srv, "/files/private", sub, &o));
    o.hooked = 0;
    snprintf(sub, sizeof(sub), "%s/private/open", root);
    ASSERT_EQ(2, ms_static_mount(srv, "/files/private/open", sub, &o));
    ms_memio_t m;
    get(&m, "GET /files/private/secret.txt HTTP/1.1\r\nhost: x\r\n\r\n");
    ASSERT_HAS(text_of(&m), "lua 404"); /* the hook's: the outer mount did not answer */
    ASSERT_LACKS(text_of(&m), "behind the hook");
    ASSERT_EQ(1, handled);
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    /* a plain mount inside the hooked one is the core's again */
    get(&m, "GET /files/private/open/a.txt HTTP/1.1\r\nhost: x\r\n\r\n");
    ASSERT_HAS(text_of(&m), "\r\n\r\nopen again");
    ASSERT_EQ(1, handled);
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    teardown();
}

/* One GET of `path` on a new connection, on a new turn of the loop: 1 when `want` came back
 * from the core, 0 when the request went on to the handler, -1 for anything else. */
static int served(const char *path, const char *want)
{
    srv->statics->turn++;
    char req[256];
    snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nhost: x\r\n\r\n", path);
    int before = handled;
    ms_memio_t m;
    get(&m, req);
    char *out = text_of(&m);
    int got = strstr(out, want) != NULL;
    if (got == (handled != before))
        got = -1;
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    return got;
}

TEST(static_a_cached_file_moved_out_or_made_unreadable_is_not_served_on_the_next_turn)
{
    setup();
    char a[128], out[128], dir[128], dir_out[128];
    snprintf(a, sizeof(a), "%s/a.txt", root);
    snprintf(out, sizeof(out), "%s.out", root);
    snprintf(dir, sizeof(dir), "%s/d", root);
    snprintf(dir_out, sizeof(dir_out), "%s.dir", root);
    write_file("a.txt", S("cached a"));
    ASSERT_EQ(1, served("/files/a.txt", "cached a"));
    ASSERT_EQ(1, served("/files/a.txt", "cached a")); /* a hit */
    /* moved out of the mount: same inode, size and mtime */
    ASSERT_EQ(0, rename(a, out));
    ASSERT_EQ(0, served("/files/a.txt", "cached a"));
    ASSERT_EQ(0, rename(out, a));
    ASSERT_EQ(1, served("/files/a.txt", "cached a"));
    /* made unreadable: only the ctime and the mode change, and root could still open it */
    ASSERT_EQ(0, chmod(a, 0));
    ASSERT_EQ(0, served("/files/a.txt", "cached a"));
    ASSERT_EQ(0, served("/files/a.txt", "cached a")); /* a first open refuses it too */
    ASSERT_EQ(0, chmod(a, 0644));
    ASSERT_EQ(1, served("/files/a.txt", "cached a"));
    /* a directory of its path moved out: the file itself does not change at all */
    ASSERT_EQ(0, mkdir(dir, 0755));
    write_file("d/b.txt", S("cached b"));
    ASSERT_EQ(1, served("/files/d/b.txt", "cached b"));
    ASSERT_EQ(0, rename(dir, dir_out));
    ASSERT_EQ(0, served("/files/d/b.txt", "cached b"));
    ASSERT_EQ(0, rename(dir_out, dir));
    /* rewritten in place at the same size with the mtime put back (cp -p): the ctime moved */
    struct stat sb;
    ASSERT_EQ(0, stat(a, &sb));
    write_file("a.txt", S("cached A"));
    struct timespec times[2] = {sb.st_atim, sb.st_mtim};
    ASSERT_EQ(0, utimensat(AT_FDCWD, a, times, 0));
    ASSERT_EQ(1, served("/files/a.txt", "cached A"));
    ASSERT_EQ(1, srv->statics->count); /* d/b.txt went when it was not found */
    teardown();
}

TEST(static_byteranges_part_heads_hold_a_long_type_whole)
{
    setup();
    /* A mime.types with a type of 255 bytes, the most an entry keeps, and a longer one. */
    char type[256], longer[300], line[700];
    memcpy(type, "application/x-", 14);
    memset(type + 14, 'a', 255 - 14);
    type[255] = 0;
    memcpy(longer, "application/x-", 14);
    memset(longer + 14, 'b', 280 - 14);
    longer[280] = 0;
    int n = snprintf(line, sizeof(line), "%s long\n%s longer\n", type, longer);
    write_file("mime.types", line, (size_t)n);
    char path[128];
    snprintf(path, sizeof(path), "%s/mime.types", root);
    ms_mime_t *mt = ms_mime_load(path);
    const ms_mime_t *was = srv->statics->mime;
    srv->statics->mime = mt;
    char *data = pattern(100);
    write_file("x.long", data, 100);
    write_file("x.longer", data, 100);

    ms_memio_t m;
    get(&m, "GET /files/x.long HTTP/1.1\r\nhost: x\r\nrange: bytes=1-1,50-50\r\n\r\n");
    char *out = text_of(&m);
    ASSERT_HAS(out, "HTTP/1.1 206 Partial Content\r\n");
    char want[512];
    snprintf(want, sizeof(want), "\r\ncontent-type: %s\r\ncontent-range: bytes 1-1/100\r\n\r\n",
             type);
    ASSERT_HAS(out, want);
    ASSERT_HAS(out, "\r\ncontent-range: bytes 50-50/100\r\n\r\n");
    size_t blen;
    const char *body = body_of(&m, &blen);
    char cl[64];
    snprintf(cl, sizeof(cl), "content-length: %zu\r\n", blen);
    ASSERT_HAS(out, cl);
    ASSERT(blen > 4 && memcmp(body + blen - 4, "--\r\n", 4) == 0);
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);

    /* Longer than a reply keeps: sent as bytes of no known type, never cut short. */
    get(&m, "GET /files/x.longer HTTP/1.1\r\nhost: x\r\n\r\n");
    ASSERT_HAS(text_of(&m), "content-type: application/octet-stream\r\n");
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);

    /* part_head itself, at the largest sizes */
    ms_sfile_t f = {.type = type, .type_len = 255, .size = UINT64_MAX};
    ms_range_t rg[2] = {{UINT64_MAX - 3, UINT64_MAX - 2}, {UINT64_MAX - 2, UINT64_MAX - 2}};
    char part[PART_HEAD_MAX];
    ASSERT_EQ(part_head(part, &f, rg, 1, 2, 0xffffffffu), strlen(part));
    ASSERT_EQ(part_head(part, &f, rg, 2, 2, 0xffffffffu), strlen(part));

    srv->statics->mime = was;
    ms_mime_free(mt);
    free(data);
    teardown();
}

TEST(static_accept_encoding_weights_and_stars)
{
    struct {
        const char *v;
        unsigned want;
    } cases[] = {
        {"gzip", ENC_BIT(MS_ENC_GZIP)},
        {"br, gzip", ENC_BIT(MS_ENC_BR) | ENC_BIT(MS_ENC_GZIP)},
        {"br;q=0, gzip;q=0.5", ENC_BIT(MS_ENC_GZIP)},
        {"br;q=0.000", 0},
        {"*", ENC_BIT(MS_ENC_BR) | ENC_BIT(MS_ENC_GZIP)},
        {"*;q=0", 0},
        {"gzip;q=0, *", ENC_BIT(MS_ENC_BR)},
        {"identity", 0},
        {"x-gzip ; q=1", ENC_BIT(MS_ENC_GZIP)},
        {"BR", ENC_BIT(MS_ENC_BR)},
        {"deflate, brotli", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        ms_str_t v = {cases[i].v, strlen(cases[i].v)};
        if (accepted(&v) != cases[i].want)
            TEST_FAIL("%s: want %u, got %u", cases[i].v, cases[i].want, accepted(&v));
    }
}

TEST(static_fingerprints_need_letters_and_digits)
{
    ASSERT(fingerprinted(S("app.3f9a1c.js")));
    ASSERT(fingerprinted(S("assets/main-B3xYz9Ab.css")));
    ASSERT(!fingerprinted(S("jquery-3.6.0.min.js")));
    ASSERT(!fingerprinted(S("report-20240101.pdf")));
    ASSERT(!fingerprinted(S("bootstrap-icons.woff2")));
    ASSERT(!fingerprinted(S("a1b2c3d4")));
    ASSERT(!fingerprinted(S("3f9a1c.js")));
}

/* The same cases as the framework's site matching (spec/lua/app_spec.lua): both must cut a
 * Host's port in one place, or a site's mount and its routes answer different hosts. */
TEST(static_host_is_cuts_the_port_as_site_matching_does)
{
    struct {
        const char *host, *want;
        int match;
    } cases[] = {
        {"example.com:80", "example.com", 1},
        {"Example.COM", "example.com", 1},
        {"example.com", "example.co", 0},
        {"[::1]:8080", "[::1]", 1},
        {"[::1]", "[::1]", 1},
        {"[::1]:8080", "[::1]:8080", 0},
        {"[::1]:8080", "::1", 0},
        {"[2001:DB8::1]:443", "[2001:db8::1]", 1},
        {"[::1", "[::1", 1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        ms_str_t h = {cases[i].host, strlen(cases[i].host)};
        if (host_is(&h, cases[i].want) != cases[i].match)
            TEST_FAIL("%s against %s: want %d", cases[i].host, cases[i].want, cases[i].match);
    }
}

TEST_MAIN()
