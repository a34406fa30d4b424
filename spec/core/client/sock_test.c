/* sock_test.c: outbound sockets, pools, resolution and UDP on a real loop, against listeners
 * made here on 127.0.0.1, ::1 and a unix socket. */
#include "test.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../../core/client/sock.c"

/* -- The loop and the server under test ---------------------------------------------------- */

static uv_loop_t loop;
static ms_server_t *srv;
static uv_timer_t guard;
static ms_mem_stats_t mem_before;

static void on_guard(uv_timer_t *t)
{
    fprintf(stderr, "  sock_test: a wait took over 10 s\n");
    abort();
}

static void setup(void)
{
    uv_loop_init(&loop);
    mem_before = ms_mem_stats;
    srv = ms_server_new(&loop, NULL, NULL, NULL, NULL);
    uv_timer_init(&loop, &guard);
}

static void run_once(void)
{
    uv_timer_start(&guard, on_guard, 10000, 0);
    uv_run(&loop, UV_RUN_ONCE);
    uv_timer_stop(&guard);
}

/* Runs the loop for about `ms`. */
static void run_for(uint64_t ms)
{
    uv_update_time(&loop);
    uint64_t end = uv_now(&loop) + ms;
    uv_timer_t t;
    uv_timer_init(&loop, &t);
    while (uv_now(&loop) < end) {
        uv_timer_start(&t, (uv_timer_cb)(void (*)(void))uv_timer_stop, end - uv_now(&loop), 0);
        uv_run(&loop, UV_RUN_ONCE);
    }
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
}

/* -- Completions, per socket slot -------------------------------------------------------- */

#define SLOTS 16
static int done_n[SLOTS], done_rc[SLOTS];

static void on_done(ms_sock_t *s, int status)
{
    done_n[s->v.slot]++;
    done_rc[s->v.slot] = status;
}

static ms_sock_t *sock(int slot)
{
    ms_sock_t *s = ms_sock_new(srv);
    s->v.slot = slot;
    done_n[slot] = 0;
    return s;
}

/* What the call returned, or, when it is pending, what its callback got. */
static int await(ms_sock_t *s, int rc)
{
    if (rc != MS_SOCK_PENDING)
        return rc;
    int n = done_n[s->v.slot];
    while (done_n[s->v.slot] == n)
        run_once();
    return done_rc[s->v.slot];
}

static char data_copy[1 << 16];
/* The view as a C string (the binding's ffi.string). */
static const char *data(ms_sock_t *s)
{
    if (s->v.data == NULL)
        return "(nil)";
    memcpy(data_copy, s->v.data, s->v.len);
    data_copy[s->v.len] = 0;
    return data_copy;
}

static const char *err(ms_sock_t *s, int rc)
{
    static char buf[256];
    ms_sock_errmsg(s, rc, buf, sizeof(buf));
    return buf;
}

static int send_str(ms_sock_t *s, const char *p)
{
    uv_buf_t b = uv_buf_init((char *)p, (unsigned)strlen(p));
    return await(s, ms_sock_send(s, &b, 1, on_done));
}

/* -- Listeners --------------------------------------------------------------------------- */

enum { T_ECHO, T_SILENT, T_DEAF, T_CLOSER };

typedef struct tconn_s tconn_t;
typedef struct tsrv_s {
    union {
        uv_handle_t h;
        uv_stream_t st;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } u;
    int kind;
    int port;
    int accepted, closed; /* connections, and those the client closed */
    tconn_t *conns;
} tsrv_t;

struct tconn_s {
    union {
        uv_handle_t h;
        uv_stream_t st;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } u;
    tsrv_t *srv;
    tconn_t *next;
    char buf[65536];
};

typedef struct twrite_s {
    uv_write_t req;
    char data[];
} twrite_t;

static void tconn_unlink(tconn_t *c)
{
    for (tconn_t **pp = &c->srv->conns; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            return;
        }
}

static void tconn_closed(uv_handle_t *h)
{
    free(h->data);
}

static void tconn_close(tconn_t *c)
{
    tconn_unlink(c);
    uv_close(&c->u.h, tconn_closed);
}

static void t_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    tconn_t *c = h->data;
    *buf = uv_buf_init(c->buf, sizeof(c->buf));
}

static void t_written(uv_write_t *req, int status)
{
    free(req);
}

static void t_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    tconn_t *c = st->data;
    if (n < 0) {
        c->srv->closed++;
        tconn_close(c);
        return;
    }
    if (n == 0 || c->srv->kind == T_SILENT)
        return;
    if (c->srv->kind == T_CLOSER) {
        uv_buf_t b = uv_buf_init("partial", 7);
        uv_try_write(st, &b, 1);
        tconn_close(c);
        return;
    }
    twrite_t *w = malloc(sizeof(*w) + (size_t)n);
    memcpy(w->data, buf->base, (size_t)n);
    uv_buf_t b = uv_buf_init(w->data, (unsigned)n);
    uv_write(&w->req, st, &b, 1, t_written);
}

static void t_accept(uv_stream_t *ls, int status)
{
    tsrv_t *ts = ls->data;
    tconn_t *c = malloc(sizeof(*c));
    c->srv = ts;
    if (ls->type == UV_NAMED_PIPE)
        uv_pipe_init(&loop, &c->u.pipe, 0);
    else
        uv_tcp_init(&loop, &c->u.tcp);
    c->u.h.data = c;
    if (uv_accept(ls, &c->u.st) < 0) {
        uv_close(&c->u.h, tconn_closed);
        return;
    }
    c->next = ts->conns;
    ts->conns = c;
    ts->accepted++;
    if (ts->kind != T_DEAF)
        uv_read_start(&c->u.st, t_alloc, t_read);
}

static void tsrv_start(tsrv_t *ts, int kind, const char *ip)
{
    memset(ts, 0, sizeof(*ts));
    ts->kind = kind;
    ms_addr_t a;
    if (strchr(ip, ':'))
        uv_ip6_addr(ip, 0, &a.in6);
    else
        uv_ip4_addr(ip, 0, &a.in);
    uv_tcp_init(&loop, &ts->u.tcp);
    ts->u.h.data = ts;
    uv_tcp_bind(&ts->u.tcp, &a.sa, 0);
    uv_listen(&ts->u.st, 64, t_accept);
    int len = sizeof(a);
    uv_tcp_getsockname(&ts->u.tcp, &a.sa, &len);
    ts->port = ntohs(a.sa.sa_family == AF_INET6 ? a.in6.sin6_port : a.in.sin_port);
}

static void tsrv_start_unix(tsrv_t *ts, const char *path)
{
    memset(ts, 0, sizeof(*ts));
    ts->kind = T_ECHO;
    unlink(path);
    uv_pipe_init(&loop, &ts->u.pipe, 0);
    ts->u.h.data = ts;
    uv_pipe_bind(&ts->u.pipe, path);
    uv_listen(&ts->u.st, 64, t_accept);
}

/* Closes every connection the listener has, as a server that drops idle clients. */
static void tsrv_drop_all(tsrv_t *ts)
{
    while (ts->conns)
        tconn_close(ts->conns);
}

static void tsrv_stop(tsrv_t *ts)
{
    tsrv_drop_all(ts);
    uv_close(&ts->u.h, NULL);
}

/* Frees the server (its pools close their connections) and checks that nothing is left:
 * neither a libuv handle nor an allocation of the core's. */
static int teardown(void)
{
    uv_close((uv_handle_t *)&guard, NULL);
    ms_server_free(srv);
    uv_run(&loop, UV_RUN_DEFAULT);
    int rc = uv_loop_close(&loop);
    if (rc != 0) {
        fprintf(stderr, "  handles left open:\n");
        uv_print_all_handles(&loop, stderr);
        return 0;
    }
    return ms_mem_stats.allocs - mem_before.allocs == ms_mem_stats.frees - mem_before.frees;
}

static int connect_to(ms_sock_t *s, const char *host, int port, const ms_sock_opts_t *o)
{
    return await(s, ms_sock_connect(s, host, strlen(host), port, o, on_done));
}

/* -- The matchers, fed in pieces ----------------------------------------------------------
 * A socket with a buffer and no connection: bytes are appended as reads would append them,
 * and the matcher runs after each piece, as on_read runs it. */

static ms_sock_t fake;

static void fake_reset(void)
{
    free(fake.rbuf);
    memset(&fake, 0, sizeof(fake));
}

static void fake_feed(const char *p, size_t n)
{
    rbuf_compact(&fake);
    if (fake.rcap - fake.rlen < n) {
        fake.rcap = fake.rlen + n + 16;
        fake.rbuf = realloc(fake.rbuf, fake.rcap);
    }
    memcpy(fake.rbuf + fake.rlen, p, n);
    fake.rlen += n;
}

/* Runs the matcher over `in` cut at `cut` (and byte by byte when cut is 0); appends each
 * result to `out` as "[data]" ("[END]" for the iterator's end). */
static void fake_run(const char *in, size_t cut, int kind, size_t n, ms_sock_until_t *u,
                     char *out, size_t out_len)
{
    fake_reset();
    fake.rkind = kind;
    fake.rn = n;
    fake.until = u;
    out[0] = 0;
    size_t len = strlen(in), pos = 0;
    while (pos < len) {
        size_t step = cut == 0 ? 1 : pos < cut ? cut - pos : len - pos;
        fake_feed(in + pos, step);
        pos += step;
        for (;;) {
            int rc;
            if (kind < 0 && ms_match_take_end(u->m)) {
                rc = MS_SOCK_END;
            } else {
                rbuf_compact(&fake);
                rc = read_match(&fake);
            }
            if (rc == 0)
                break;
            size_t o = strlen(out);
            if (rc == MS_SOCK_END)
                snprintf(out + o, out_len - o, "[END]");
            else
                snprintf(out + o, out_len - o, "[%.*s]", (int)fake.v.len, fake.v.data);
        }
    }
}

TEST(sock_line_split_at_every_byte)
{
    static const char in[] = "ab\r\ncd\n\r\nl\ra\rst\r\r\n\n";
    char out[512];
    for (size_t cut = 0; cut < sizeof(in) - 1; cut++) {
        fake_run(in, cut, MS_SOCK_LINE, 0, NULL, out, sizeof(out));
        if (strcmp(out, "[ab][cd][][last][]") != 0)
            TEST_FAIL("cut at %zu: %s", cut, out);
    }
    fake_reset();
}

TEST(sock_until_split_at_every_byte)
{
    static const struct {
        const char *pat, *in;
        int inclusive;
        size_t size;
        const char *want;
    } cases[] = {
        {"\r\n--abcedhb", "hello, world! -agentzh\r\n--abcedhb blah", 0, 0,
         "[hello, world! -agentzh]"},
        /* OpenResty's example of the iterator with a size. */
        {"\r\n--abcedhb", "hello, world! -agentzh\r\n--abcedhb blah", 0, 4,
         "[hell][o, w][orld][! -a][gent][zh][END][ bla]"},
        {"\r\n--abcedhb", "hello, world! -agentzh\r\n--abcedhb blah", 1, 0,
         "[hello, world! -agentzh\r\n--abcedhb]"},
        /* Inclusive with a size: the pattern ends the last piece whole, as in lua-nginx-module. */
        {"--b", "x--a--b-y--b", 1, 5, "[x--a--b][END][-y--b][END]"},
        {"--b", "abcdef--b", 1, 3, "[abc][def][--b][END]"},
        /* Overlaps that a naive restart would miss. */
        {"aab", "aaab", 0, 0, "[a]"},
        {"abab", "abababx abab", 0, 0, "[][abx ]"},
        {"aaa", "aaaaaaa", 0, 0, "[][]"},
        /* A piece of exactly the size before the pattern: "" comes next, then the end, as in
         * lua-nginx-module (lua-resty-upload's header reader counts on it). */
        {"abcabd", "abcabcabd!", 0, 3, "[abc][][END]"},
        {"ab", "xab", 0, 1, "[x][][END]"},
        {"ab", "abab", 0, 4, "[][END][][END]"},
    };
    char out[512];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t len = strlen(cases[i].in);
        for (size_t cut = 0; cut < len; cut++) {
            ms_sock_until_t *u =
                ms_sock_until_new(cases[i].pat, strlen(cases[i].pat), cases[i].inclusive);
            fake_run(cases[i].in, cut, -1, cases[i].size, u, out, sizeof(out));
            ms_sock_until_free(u);
            if (strcmp(out, cases[i].want) != 0)
                TEST_FAIL("case %zu cut at %zu: want %s, got %s", i, cut, cases[i].want, out);
        }
    }
    fake_reset();
}

/* -- TCP ----------------------------------------------------------------------------------- */

static void echo_round(const char *host, int port)
{
    ms_sock_t *s = sock(0);
    ASSERT_EQ(MS_SOCK_DONE, connect_to(s, host, port, NULL));
    ASSERT_EQ(1, s->v.connected);
    ASSERT_EQ(0, s->v.reused);
    /* Gathered, and one line echoed in pieces: "*l", then n bytes, then receiveany. */
    uv_buf_t bufs[] = {uv_buf_init("GET ", 4), uv_buf_init("key", 3), uv_buf_init("\r\n", 2),
                       uv_buf_init("0123456789", 10)};
    ASSERT_EQ(MS_SOCK_DONE, await(s, ms_sock_send(s, bufs, 4, on_done)));
    ASSERT_EQ(MS_SOCK_DONE, await(s, ms_sock_receive(s, MS_SOCK_LINE, 0, on_done)));
    ASSERT_STR_EQ("GET key", data(s));
    ASSERT_EQ(MS_SOCK_DONE, await(s, ms_sock_receive(s, MS_SOCK_BYTES, 4, on_done)));
    ASSERT_STR_EQ("0123", data(s));
    ASSERT_EQ(MS_SOCK_DONE, await(s, ms_sock_receive(s, MS_SOCK_ANY, 3, on_done)));
    ASSERT_STR_EQ("456", data(s));
    ASSERT_EQ(MS_SOCK_DONE, await(s, ms_sock_receive(s, MS_SOCK_ANY, 100, on_done)));
    ASSERT_STR_EQ("789", data(s));
    ASSERT_EQ(MS_SOCK_DONE, ms_sock_close(s));
    ASSERT_EQ(UV_ENOTCONN, ms_sock_close(s));
    ms_sock_free(s);
}

TEST(sock_echo_over_ipv4_ipv6_and_unix)
{
    setup();
    tsrv_t t4, t6, tu;
    tsrv_start(&t4, T_ECHO, "127.0.0.1");
    tsrv_start(&t6, T_ECHO, "::1");
    char path[64];
    snprintf(path, sizeof(path), "/tmp/ms-sock-test-%d.sock", (int)getpid());
    tsrv_start_unix(&tu, path);
    echo_round("127.0.0.1", t4.port);
    echo_round("::1", t6.port);
    echo_round("[::1]", t6.port);
    char upath[80];
    snprintf(upath, sizeof(upath), "unix:%s", path);
    echo_round(upath, 0);
    ASSERT_EQ(1, t4.accepted);
    ASSERT_EQ(2, t6.accepted);
    ASSERT_EQ(1, tu.accepted);
    tsrv_stop(&t4);
    tsrv_stop(&t6);
    tsrv_stop(&tu);
    ASSERT(teardown());
    unlink(path);
}

TEST(sock_receiveuntil_over_a_socket_in_pieces)
{
    setup();
    tsrv_t t;
    tsrv_start(&t, T_ECHO, "127.0.0.1");
    ms_sock_t *s = sock(0);
    ASSERT_EQ(MS_SOCK_DONE, connect_to(s, "127.0.0.1", t.port, NULL));
    ms_sock_until_t *u = ms_sock_until_new("\r\n--abcedhb", 11, 0);
    /* The boundary comes split over two sends, read apart. */
    ASSERT_EQ(MS_SOCK_DONE, send_str(s, "hello, world! -agentzh\r\n--abc"));
    char out[256] = "";
    for (int i = 0; i < 20; i++) {
        if (i == 5)
            ASSERT_EQ(MS_SOCK_DONE, send_str(s, "edhb blah\r\n"));
        int rc = await(s, ms_sock_receiveuntil(s, u, 4, on_done));
        ASSERT(rc > 0);
        if (rc == MS_SOCK_END)
            break;
        snprintf(out + strlen(out), sizeof(out) - strlen(out), "[%.*s]", (int)s->v.len, s->v.data);
    }
    ASSERT_STR_EQ("[hell][o, w][orld][! -a][gent][zh]", out);
    ASSERT_EQ(MS_SOCK_DONE, await(s, ms_sock_receive(s, MS_SOCK_LINE, 0, on_done)));
    ASSERT_STR_EQ(" blah", data(s));
    ms_sock_until_free(u);
    ms_sock_free(s);
    tsrv_stop(&t);
    ASSERT(teardown());
}

TEST(sock_read_timeout_keeps_the_socket_usable)
{
    setup();
    tsrv_t t;
    tsrv_start(&t, T_ECHO, "127.0.0.1");
    ms_sock_t *s = sock(0);
    ms_sock_settimeouts(s, 1000, 1000, 50);
    ASSERT_EQ(MS_SOCK_DONE, connect_to(s, "127.0.0.1", t.port, NULL));
    int rc = await(s, ms_sock_receive(s, MS_SOCK_LINE, 0, on_done));
    ASSERT_STR_EQ("timeout", err(s, rc));
    ASSERT_EQ(0, s->v.len);
    /* Half a line, then the deadline: the half is the partial data, and is consumed. */
    ASSERT_EQ(MS_SOCK_DONE, send_str(s, "ab\rc"));
    rc = await(s, ms_sock_receive(s, MS_SOCK_LINE, 0, on_done));
    ASSERT_EQ(UV_ETIMEDOUT, rc);
    ASSERT_STR_EQ("abc", data(s));
    ASSERT_EQ(1, s->v.connected);
    ASSERT_EQ(MS_SOCK_DONE, send_str(s, "de\n"));
    ASSERT_EQ(MS_SOCK_DONE, await(s, ms_sock_receive(s, MS_SOCK_LINE, 0, on_done)));
    ASSERT_STR_EQ("de", data(s));
    ms_sock_free(s);
    tsrv_stop(&t);
    ASSERT(teardown());
}

TEST(sock_connect_and_send_timeouts)
{
    setup();
    /* A listener that never accepts, with the smallest queue: once it is full the kernel
     * drops further SYNs, and a connect waits. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ms_addr_t a;
    uv_ip4_addr("127.0.0.1", 0, &a.in);
    ASSERT_EQ(0, bind(fd, &a.sa, sizeof(a.in)));
    ASSERT_EQ(0, listen(fd, 0));
    socklen_t alen = sizeof(a.in);
    getsockname(fd, &a.sa, &alen);
    int port = ntohs(a.in.sin_port);
    ms_sock_t *ss[8];
    int timeouts = 0;
    for (int i = 0; i < 8; i++) {
        ss[i] = sock(i);
        ms_sock_settimeouts(ss[i], 100, 100, 100);
        int rc = connect_to(ss[i], "127.0.0.1", port, NULL);
        if (rc == UV_ETIMEDOUT) {
            timeouts++;
            ASSERT_STR_EQ("timeout", err(ss[i], rc));
            ASSERT_EQ(0, ss[i]->v.connected);
        }
    }
    ASSERT(timeouts > 0);
    for (int i = 0; i < 8; i++)
        ms_sock_free(ss[i]);
    close(fd);

    /* A peer that accepts and never reads: a big send stalls, times out, and closes. */
    tsrv_t t;
    tsrv_start(&t, T_DEAF, "127.0.0.1");
    ms_sock_t *s = sock(0);
    ms_sock_settimeouts(s, 1000, 100, 100);
    ASSERT_EQ(MS_SOCK_DONE, connect_to(s, "127.0.0.1", t.port, NULL));
    size_t big = 32 << 20;
    char *p = calloc(1, big);
    uv_buf_t b = uv_buf_init(p, (unsigned)big);
    int rc = ms_sock_send(s, &b, 1, on_done);
    ASSERT_EQ(MS_SOCK_PENDING, rc);
    /* One writer at a time; a reader may wait meanwhile. */
    ASSERT_STR_EQ("socket busy writing", err(s, ms_sock_send(s, &b, 1, on_done)));
    ASSERT_EQ(UV_ETIMEDOUT, await(s, rc));
    ASSERT_EQ(0, s->v.connected);
    ASSERT_STR_EQ("closed", err(s, ms_sock_send(s, &b, 1, on_done)));
    free(p);
    ms_sock_free(s);
    tsrv_stop(&t);
    ASSERT(teardown());
}

TEST(sock_errors_and_partial_data)
{
    setup();
    /* Nobody listens on a port that was just free. */
    tsrv_t t;
    tsrv_start(&t, T_ECHO, "127.0.0.1");
    int port = t.port;
    tsrv_stop(&t);
    run_for(1);
    ms_sock_t *s = sock(0);
    int rc = connect_to(s, "127.0.0.1", port, NULL);
    ASSERT_STR_EQ("connection refused", err(s, rc));
    ASSERT_STR_EQ("closed", err(s, ms_sock_receive(s, MS_SOCK_LINE, 0, on_done)));
    ASSERT_STR_EQ("invalid argument", err(s, ms_sock_connect(s, "127.0.0.1", 9, 0, NULL,
                                                              on_done)));

    /* A peer that answers part of a reply and closes: the part comes with "closed". */
    tsrv_start(&t, T_CLOSER, "127.0.0.1");
    ASSERT_EQ(MS_SOCK_DONE, connect_to(s, "127.0.0.1", t.port, NULL));
    ASSERT_EQ(MS_SOCK_DONE, send_str(s, "GET\r\n"));
    rc = await(s, ms_sock_receive(s, MS_SOCK_BYTES, 100, on_done));
    ASSERT_STR_EQ("closed", err(s, rc));
    ASSERT_STR_EQ("partial", data(s));
    ASSERT_EQ(0, s->v.connected);
    /* "*a" reads until the close, which is then no error. */
    ASSERT_EQ(MS_SOCK_DONE, connect_to(s, "127.0.0.1", t.port, NULL));
    ASSERT_EQ(MS_SOCK_DONE, send_str(s, "GET\r\n"));
    ASSERT_EQ(MS_SOCK_DONE, await(s, ms_sock_receive(s, MS_SOCK_ALL, 0, on_done)));
    ASSERT_STR_EQ("partial", data(s));
    /* A line cut short. */
    ASSERT_EQ(MS_SOCK_DONE, connect_to(s, "127.0.0.1", t.port, NULL));
    ASSERT_EQ(MS_SOCK_DONE, send_str(s, "GET\r\n"));
    ms_sock_until_t *u = ms_sock_until_new("\r\n", 2, 0);
    rc = await(s, ms_sock_receiveuntil(s, u, 0, on_done));
    ASSERT_STR_EQ("closed", err(s, rc));
    ASSERT_STR_EQ("partial", data(s));
    ms_sock_until_free(u);
    ms_sock_free(s);
    tsrv_stop(&t);
    ASSERT(teardown());
}

TEST(sock_one_reader_and_one_writer_at_a_time)
{
    setup();
    tsrv_t t;
    tsrv_start(&t, T_ECHO, "127.0.0.1");
    ms_sock_t *s = sock(0);
    ASSERT_EQ(MS_SOCK_DONE, connect_to(s, "127.0.0.1", t.port, NULL));
    int rc = ms_sock_receive(s, MS_SOCK_LINE, 0, on_done);
    ASSERT_EQ(MS_SOCK_PENDING, rc);
    ASSERT_STR_EQ("socket busy reading", err(s, ms_sock_receive(s, MS_SOCK_ANY, 9, on_done)));
    ASSERT_EQ(MS_SOCK_EBUSY_READ, ms_sock_setkeepalive(s, -1, 0));
    /* The write goes while the read waits, and the read gets its echo. */
    uv_buf_t b = uv_buf_init("both\n", 5);
    ASSERT_EQ(MS_SOCK_DONE, ms_sock_send(s, &b, 1, on_done));
    ASSERT_EQ(MS_SOCK_DONE, await(s, rc));
    ASSERT_STR_EQ("both", data(s));
    /* Closing completes a read under way with "closed". */
    rc = ms_sock_receive(s, MS_SOCK_LINE, 0, on_done);
    ASSERT_EQ(MS_SOCK_PENDING, rc);
    int n = done_n[0];
    ASSERT_EQ(MS_SOCK_DONE, ms_sock_close(s));
    ASSERT_EQ(n + 1, done_n[0]);
    ASSERT_STR_EQ("closed", err(s, done_rc[0]));
    ms_sock_free(s);
    tsrv_stop(&t);
    ASSERT(teardown());
}

/* -- Pools --------------------------------------------------------------------------------- */

TEST(sock_pool_reuses_a_connection)
{
    setup();
    tsrv_t t;
    tsrv_start(&t, T_ECHO, "127.0.0.1");
    for (int i = 0; i < 3; i++) {
        ms_sock_t *s = sock(0);
        int rc = ms_sock_connect(s, "127.0.0.1", 9, t.port, NULL, on_done);
        ASSERT_EQ(i == 0 ? MS_SOCK_PENDING : MS_SOCK_DONE, rc);
        ASSERT_EQ(MS_SOCK_DONE, await(s, rc));
        ASSERT_EQ(i, s->v.reused);
        ASSERT_EQ(MS_SOCK_DONE, send_str(s, "PING\r\n"));
        ASSERT_EQ(MS_SOCK_DONE, await(s, ms_sock_receive(s, MS_SOCK_LINE, 0, on_done)));
        ASSERT_STR_EQ("PING", data(s));
        ASSERT_EQ(MS_SOCK_DONE, ms_sock_setkeepalive(s, -1, 0));
        ASSERT_EQ(0, s->v.connected);
        ASSERT(s->rbuf == NULL); /* no buffer while idle */
        ms_sock_free(s);
    }
    ASSERT_EQ(1, t.accepted);
    /* Unread bytes: refused, as OpenResty does; the socket stays as it was. */
    ms_sock_t *s = sock(0);
    ASSERT_EQ(MS_SOCK_DONE, connect_to(s, "127.0.0.1", t.port, NULL));
    ASSERT_EQ(MS_SOCK_DONE, send_str(s, "a\nb\n"));
    ASSERT_EQ(MS_SOCK_DONE, await(s, ms_sock_receive(s, MS_SOCK_BYTES, 2, on_done)));
    run_for(20);
    ASSERT_STR_EQ("unread data in buffer", err(s, ms_sock_setkeepalive(s, -1, 0)));
    ASSERT_EQ(1, s->v.connected);
    ms_sock_free(s);
    /* A pool by name, apart from the address's. */
    ms_sock_opts_t o = {.pool = "named", .pool_len = 5};
    s = sock(0);
    ASSERT_EQ(MS_SOCK_DONE, connect_to(s, "127.0.0.1", t.port, &o));
    ASSERT_EQ(0, s->v.reused);
    ms_sock_free(s);
    tsrv_stop(&t);
    ASSERT(teardown());
}

TEST(sock_pool_cap_and_backlog)
{
    setup();
    tsrv_t t;
    tsrv_start(&t, T_ECHO, "127.0.0.1");
    ms_sock_opts_t o = {.pool_size = 1, .backlog = 1};
    ms_sock_t *a = sock(0), *b = sock(1), *c = sock(2);
    ASSERT_EQ(MS_SOCK_DONE, connect_to(a, "127.0.0.1", t.port, &o));
    int rb = ms_sock_connect(b, "127.0.0.1", 9, t.port, &o, on_done);
    ASSERT_EQ(MS_SOCK_PENDING, rb);
    int rc = ms_sock_connect(c, "127.0.0.1", 9, t.port, &o, on_done);
    ASSERT_STR_EQ("too many waiting connect operations", err(c, rc));
    /* The one that waits takes the connection given back. */
    ASSERT_EQ(MS_SOCK_DONE, ms_sock_setkeepalive(a, -1, 0));
    ASSERT_EQ(1, done_n[1]);
    ASSERT_EQ(MS_SOCK_DONE, done_rc[1]);
    ASSERT_EQ(1, b->v.reused);
    /* ... or a slot freed by a close, and connects anew. */
    rc = ms_sock_connect(a, "127.0.0.1", 9, t.port, &o, on_done);
    ASSERT_EQ(MS_SOCK_PENDING, rc);
    ms_sock_close(b);
    ASSERT_EQ(MS_SOCK_DONE, await(a, rc));
    ASSERT_EQ(0, a->v.reused);
    ASSERT_EQ(2, t.accepted);
    /* A connect that waits too long times out with the connect timeout. */
    ms_sock_settimeouts(b, 50, 1000, 1000);
    rc = connect_to(b, "127.0.0.1", t.port, &o);
    ASSERT_STR_EQ("timeout", err(b, rc));
    ASSERT_EQ(0, b->v.connected);
    ms_sock_free(a);
    ms_sock_free(b);
    ms_sock_free(c);
    tsrv_stop(&t);
    ASSERT(teardown());
}

/* A connect that asked for a connection of its own (sslhandshake with other TLS wishes than
 * the pooled one's) and waits in the backlog is not handed the next idle one: that one is
 * closed, which frees the slot it connects anew in. */
TEST(sock_pool_backlog_gives_a_fresh_connect_a_slot_not_an_idle_connection)
{
    setup();
    tsrv_t t;
    tsrv_start(&t, T_ECHO, "127.0.0.1");
    ms_sock_opts_t o = {.pool_size = 1, .backlog = 1};
    ms_sock_opts_t fresh = {.pool_size = 1, .backlog = 1, .fresh = 1};
    ms_sock_t *a = sock(0), *b = sock(1);
    ASSERT_EQ(MS_SOCK_DONE, connect_to(a, "127.0.0.1", t.port, &o));
    int rb = ms_sock_connect(b, "127.0.0.1", 9, t.port, &fresh, on_done);
    ASSERT_EQ(MS_SOCK_PENDING, rb);
    ASSERT_EQ(MS_SOCK_DONE, ms_sock_setkeepalive(a, -1, 0));
    ASSERT_EQ(MS_SOCK_DONE, await(b, rb));
    ASSERT_EQ(0, b->v.reused);
    ASSERT_EQ(2, t.accepted);
    ms_sock_free(a);
    ms_sock_free(b);
    tsrv_stop(&t);
    ASSERT(teardown());
}

/* -- Wakes: what the binding does with a completion ----------------------------------------
 * The binding wakes the slot a socket's waiter parked on (ms_wake). The event callback (Lua)
 * must never run inside a call from Lua (an FFI call) nor inside the engine's own work. */

static int ev_n, ev_slot, ev_status, ev_depth, ev_again;

static void on_ev(int32_t slot, int status, void *data)
{
    (void)data;
    ev_n++;
    ev_slot = slot;
    ev_status = status;
    ev_depth = srv->depth; /* 1: this call alone, nothing of the engine's below it */
    if (ev_again > 0) {
        ev_again--;
        ms_wake(srv, slot, status + 1); /* wakes itself again: queued behind this call */
    }
}

static void wake_cb(ms_sock_t *s, int status)
{
    ms_wake(srv, s->v.slot, status);
}

TEST(sock_wakes_wait_for_the_call_that_caused_them)
{
    setup();
    ms_server_on_event(srv, on_ev);
    ev_n = ev_again = 0;
    tsrv_t t;
    tsrv_start(&t, T_ECHO, "127.0.0.1");
    ms_sock_opts_t o = {.pool = "wakes", .pool_len = 5, .pool_size = 1, .backlog = 1};
    ms_sock_t *a = sock(0), *b = sock(1);
    ASSERT_EQ(MS_SOCK_DONE, connect_to(a, "127.0.0.1", t.port, &o));
    ASSERT_EQ(MS_SOCK_PENDING, ms_sock_connect(b, "127.0.0.1", 9, t.port, &o, wake_cb));
    /* Inside a call into Lua (which an FFI call from Lua is), giving the connection back
     * completes b's connect at once; b's waiter is resumed when the call returns. */
    ms__server_enter(srv);
    ASSERT_EQ(MS_SOCK_DONE, ms_sock_setkeepalive(a, -1, 0));
    ASSERT_EQ(1, b->v.connected);
    ASSERT_EQ(0, ev_n);
    ms__server_leave(srv);
    ASSERT_EQ(1, ev_n);
    ASSERT_EQ(1, ev_slot);
    ASSERT_EQ(MS_SOCK_DONE, ev_status);
    ASSERT_EQ(1, ev_depth);
    /* From the loop: a read completes in libuv's callback, and the waiter is resumed in that
     * same turn, once the engine has returned. */
    ASSERT_EQ(MS_SOCK_DONE, send_str(b, "ping\n"));
    ASSERT_EQ(MS_SOCK_PENDING, ms_sock_receive(b, MS_SOCK_LINE, 0, wake_cb));
    while (ev_n == 1)
        run_once();
    ASSERT_EQ(2, ev_n);
    ASSERT_EQ(MS_SOCK_DONE, ev_status);
    ASSERT_EQ(1, ev_depth);
    ASSERT_STR_EQ("ping", data(b));
    /* A queued wake is void once cancelled, and replaced by the slot's timer. */
    ms__server_enter(srv);
    ms_wake(srv, 5, 0);
    ms_wake_cancel(srv, 5);
    ms_wake(srv, 6, 1);
    ASSERT_EQ(0, ms_wake_after(srv, 6, 0, 2));
    ms__server_leave(srv);
    ASSERT_EQ(2, ev_n);
    run_for(5);
    ASSERT_EQ(3, ev_n);
    ASSERT_EQ(6, ev_slot);
    ASSERT_EQ(2, ev_status);
    /* Code that keeps waking itself gets MS_WAKE_BATCH wakes at once, the rest on the next
     * turns of the loop, so that the loop goes on with its other work. */
    ev_n = 0;
    ev_again = 1000;
    ms__server_enter(srv);
    ms_wake(srv, 7, 0);
    ms__server_leave(srv);
    ASSERT_EQ(256, ev_n);
    uv_run(&loop, UV_RUN_NOWAIT);
    ASSERT_EQ(512, ev_n);
    for (int i = 0; i < 3; i++)
        uv_run(&loop, UV_RUN_NOWAIT);
    ASSERT_EQ(1001, ev_n);
    ASSERT_EQ(1000, ev_status);
    ms_server_on_event(srv, NULL);
    ms_sock_free(a);
    ms_sock_free(b);
    tsrv_stop(&t);
    ASSERT(teardown());
}

TEST(sock_pool_idle_expiry_and_size)
{
    setup();
    tsrv_t t;
    tsrv_start(&t, T_ECHO, "127.0.0.1");
    ms_sock_t *s = sock(0);
    ASSERT_EQ(MS_SOCK_DONE, connect_to(s, "127.0.0.1", t.port, NULL));
    ASSERT_EQ(MS_SOCK_DONE, ms_sock_setkeepalive(s, 50, 0));
    run_for(150);
    ASSERT_EQ(1, t.closed); /* the pool closed it */
    ASSERT_EQ(MS_SOCK_PENDING, ms_sock_connect(s, "127.0.0.1", 9, t.port, NULL, on_done));
    ASSERT_EQ(MS_SOCK_DONE, await(s, MS_SOCK_PENDING));
    ASSERT_EQ(0, s->v.reused);
    ms_sock_free(s);
    /* A pool of two keeps two: the third given back closes the oldest. */
    ms_sock_t *ss[3];
    ms_sock_opts_t o = {.pool = "two", .pool_len = 3, .pool_size = 2};
    for (int i = 0; i < 3; i++) {
        ss[i] = sock(i);
        ASSERT_EQ(MS_SOCK_DONE, connect_to(ss[i], "127.0.0.1", t.port, &o));
    }
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(MS_SOCK_DONE, ms_sock_setkeepalive(ss[i], 0, 0));
    run_for(20);
    ASSERT_EQ(2, ms__sockets(srv)->sconns);
    ASSERT_EQ(3, t.closed); /* the expired one, `s` freed, and the oldest of the three */
    for (int i = 0; i < 3; i++)
        ms_sock_free(ss[i]);
    tsrv_stop(&t);
    ASSERT(teardown());
}

TEST(sock_pool_never_hands_out_a_connection_its_peer_closed)
{
    setup();
    tsrv_t t;
    tsrv_start(&t, T_ECHO, "127.0.0.1");
    ms_sock_t *s = sock(0);
    /* Closed while idle, and the loop ran: the pool's read saw it and dropped it. */
    ASSERT_EQ(MS_SOCK_DONE, connect_to(s, "127.0.0.1", t.port, NULL));
    ASSERT_EQ(MS_SOCK_DONE, ms_sock_setkeepalive(s, -1, 0));
    ASSERT_EQ(1, ms__sockets(srv)->sconns);
    run_for(10);
    tsrv_drop_all(&t);
    run_for(20);
    ASSERT_EQ(0, ms__sockets(srv)->sconns);
    ASSERT_EQ(MS_SOCK_PENDING, ms_sock_connect(s, "127.0.0.1", 9, t.port, NULL, on_done));
    ASSERT_EQ(MS_SOCK_DONE, await(s, MS_SOCK_PENDING));
    ASSERT_EQ(0, s->v.reused);
    ASSERT_EQ(2, t.accepted);
    /* Written to while idle: out of step, dropped as well. */
    ASSERT_EQ(MS_SOCK_DONE, ms_sock_setkeepalive(s, -1, 0));
    run_for(10);
    uv_buf_t b = uv_buf_init("late\n", 5);
    ASSERT(uv_try_write(&t.conns->u.st, &b, 1) == 5);
    run_for(20);
    ASSERT_EQ(0, ms__sockets(srv)->sconns);
    /* Closed by the peer in this very turn of the loop, before it polled: handed out
     * unchecked, as nginx does (no system call a reuse), and its first read fails. */
    ASSERT_EQ(MS_SOCK_DONE, connect_to(s, "127.0.0.1", t.port, NULL));
    ASSERT_EQ(3, t.accepted);
    ASSERT_EQ(MS_SOCK_DONE, ms_sock_setkeepalive(s, -1, 0));
    run_for(10);
    tsrv_drop_all(&t);
    ASSERT_EQ(MS_SOCK_DONE, connect_to(s, "127.0.0.1", t.port, NULL));
    ASSERT_EQ(1, s->v.reused);
    (void)send_str(s, "x\n");
    ASSERT(await(s, ms_sock_receive(s, MS_SOCK_LINE, 0, on_done)) < 0);
    ASSERT_EQ(0, s->v.connected);
    ms_sock_free(s);
    tsrv_stop(&t);
    ASSERT(teardown());
}

TEST(sock_warm_pooled_round_trip_allocates_nothing)
{
#if defined(__SANITIZE_ADDRESS__)
    return; /* recycling is off under ASan, on purpose */
#endif
    setup();
    tsrv_t t;
    tsrv_start(&t, T_ECHO, "127.0.0.1");
    ms_mem_stats_t before = ms_mem_stats;
    for (int i = 0; i < 1010; i++) {
        if (i == 10)
            before = ms_mem_stats;
        ms_sock_t *s = sock(0);
        ASSERT(await(s, ms_sock_connect(s, "127.0.0.1", 9, t.port, NULL, on_done)) > 0);
        uv_buf_t b[] = {uv_buf_init("GET ", 4), uv_buf_init("k\r\n", 3)};
        ASSERT_EQ(MS_SOCK_DONE, await(s, ms_sock_send(s, b, 2, on_done)));
        ASSERT_EQ(MS_SOCK_DONE, await(s, ms_sock_receive(s, MS_SOCK_LINE, 0, on_done)));
        ASSERT_EQ(5, s->v.len);
        ASSERT_EQ(MS_SOCK_DONE, ms_sock_setkeepalive(s, -1, 0));
        ms_sock_free(s);
    }
    ASSERT_EQ(before.allocs, ms_mem_stats.allocs);
    ASSERT_EQ(before.reallocs, ms_mem_stats.reallocs);
    ASSERT_EQ(before.frees, ms_mem_stats.frees);
    ASSERT_EQ(1, t.accepted);
    tsrv_stop(&t);
    ASSERT(teardown());
}

/* -- Resolution ---------------------------------------------------------------------------- */

static int res_n, res_rc;
static void on_res(ms_resolve_t *r, int status)
{
    res_n++;
    res_rc = status;
}

TEST(sock_resolves_names_off_the_loop_and_caches_them)
{
    setup();
    ms_resolve_t r;
    ASSERT_EQ(MS_SOCK_DONE, ms_resolve(srv, &r, "::1", 3, 80, on_res));
    ASSERT_EQ(AF_INET6, r.addrs[0].sa.sa_family);
    int rc = ms_resolve(srv, &r, "localhost", 9, 80, on_res);
    ASSERT_EQ(MS_SOCK_PENDING, rc);
    while (res_n == 0)
        run_once();
    ASSERT_EQ(MS_SOCK_DONE, res_rc);
    ASSERT(r.naddrs >= 1);
    ASSERT_EQ(80, ntohs(r.addrs[0].sa.sa_family == AF_INET ? r.addrs[0].in.sin_port
                                                            : r.addrs[0].in6.sin6_port));
    ms_sockets_t *sk = ms__sockets(srv);
    ASSERT_EQ(1, sk->lookups_started);
    /* Cached: no second lookup; names are not case-sensitive. */
    ASSERT_EQ(MS_SOCK_DONE, ms_resolve(srv, &r, "LocalHost", 9, 81, on_res));
    ASSERT_EQ(1, sk->lookups_started);

    /* A connect by name. */
    tsrv_t t;
    tsrv_start(&t, T_ECHO, "127.0.0.1");
    ms_sock_t *s = sock(0);
    ASSERT_EQ(MS_SOCK_DONE, connect_to(s, "localhost", t.port, NULL));
    ms_sock_free(s);

    /* A name that does not resolve, and its message; the failure is cached too. */
    s = sock(0);
    rc = connect_to(s, "nonexistent.invalid", 80, NULL);
    ASSERT_STR_EQ("nonexistent.invalid could not be resolved (3: Host not found)", err(s, rc));
    ASSERT_EQ(MS_SOCK_ENOTFOUND, ms_sock_connect(s, "nonexistent.invalid", 19, 80, NULL,
                                                 on_done));
    ms_sock_free(s);
    tsrv_stop(&t);
    ASSERT(teardown());
}

TEST(sock_caps_lookups_in_flight)
{
    setup();
    ms_sock_config_t cfg;
    ms_sock_config_default(&cfg);
    cfg.resolve_max = 1;
    ms_sock_config(srv, &cfg);
    ms_sockets_t *sk = ms__sockets(srv);
    static const char *names[] = {"localhost", "nonexistent.invalid", "another.invalid"};
    ms_resolve_t r[4];
    res_n = 0;
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(MS_SOCK_PENDING, ms_resolve(srv, &r[i], names[i], strlen(names[i]), 1,
                                              on_res));
    /* One lookup per name, however many ask. */
    ASSERT_EQ(MS_SOCK_PENDING, ms_resolve(srv, &r[3], "localhost", 9, 1, on_res));
    ASSERT_EQ(1, sk->inflight);
    ASSERT_EQ(1, sk->lookups_started);
    while (res_n < 4) {
        run_once();
        ASSERT(sk->inflight <= 1);
    }
    ASSERT_EQ(3, sk->lookups_started);
    ASSERT(teardown());
}

/* -- UDP ----------------------------------------------------------------------------------- */

static uv_udp_t uecho;
static char ubuf[2048];
static void u_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    *buf = uv_buf_init(ubuf, sizeof(ubuf));
}
static void u_recv(uv_udp_t *h, ssize_t n, const uv_buf_t *buf, const struct sockaddr *addr,
                   unsigned flags)
{
    if (n <= 0 || addr == NULL)
        return;
    uv_buf_t b = uv_buf_init(buf->base, (unsigned)n);
    uv_udp_try_send(h, &b, 1, addr);
}

static int udp_n, udp_rc;
static void on_udp(ms_udp_t *u, int status)
{
    udp_n++;
    udp_rc = status;
}
static int udp_await(int rc)
{
    if (rc != MS_SOCK_PENDING)
        return rc;
    int n = udp_n;
    while (udp_n == n)
        run_once();
    return udp_rc;
}

TEST(sock_udp_echo_and_receive_timeout)
{
    setup();
    ms_addr_t a;
    uv_ip4_addr("127.0.0.1", 0, &a.in);
    uv_udp_init(&loop, &uecho);
    uv_udp_bind(&uecho, &a.sa, 0);
    uv_udp_recv_start(&uecho, u_alloc, u_recv);
    int len = sizeof(a);
    uv_udp_getsockname(&uecho, &a.sa, &len);
    int port = ntohs(a.in.sin_port);

    ms_udp_t *u = ms_udp_new(srv);
    ms_udp_settimeout(u, 50);
    ASSERT_EQ(UV_ENOTCONN, ms_udp_receive(u, 0, on_udp));
    /* (By address: "localhost" may name ::1 first, where this echo does not listen; names
     * are the resolver's test.) */
    ASSERT_EQ(MS_SOCK_DONE, udp_await(ms_udp_setpeername(u, "127.0.0.1", 9, port, on_udp)));
    uv_buf_t b[] = {uv_buf_init("\x12\x34", 2), uv_buf_init("query", 5)};
    ASSERT_EQ(MS_SOCK_DONE, ms_udp_send(u, b, 2));
    ASSERT_EQ(MS_SOCK_DONE, udp_await(ms_udp_receive(u, 0, on_udp)));
    ASSERT_EQ(7, ms_udp_view(u)->len);
    ASSERT(memcmp(ms_udp_view(u)->data, "\x12\x34query", 7) == 0);
    /* Nothing comes: "timeout", and the socket goes on working. */
    int rc = udp_await(ms_udp_receive(u, 512, on_udp));
    ASSERT_STR_EQ("timeout", ms_sock_strerror(rc));
    ASSERT_EQ(MS_SOCK_DONE, ms_udp_send(u, b, 1));
    ASSERT_EQ(MS_SOCK_DONE, udp_await(ms_udp_receive(u, 1, on_udp)));
    ASSERT_EQ(1, ms_udp_view(u)->len); /* a datagram longer than the size is cut */
    ASSERT_EQ(MS_SOCK_DONE, ms_udp_close(u));
    ASSERT_EQ(UV_ENOTCONN, ms_udp_send(u, b, 1));
    ms_udp_free(u);
    uv_close((uv_handle_t *)&uecho, NULL);
    ASSERT(teardown());
}

TEST_MAIN()
