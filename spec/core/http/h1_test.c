/* h1_test.c: the HTTP/1 engine fed bytes through the memory transport. */
#include "test.h"

#include "../../../core/http/h1.c"
#include "../../../core/transport/memio.h"
#include "../../../core/tunnel/rawsock.h"
#include "fields.h"
#include "tunnel.h"
#include "../../../core/tunnel/ws.h"

extern const ms_proto_t ms__ws_proto; /* tunnel/ws.c */

#define S(lit) lit, sizeof(lit) - 1

/* -- Fixture: a server on a private loop and a handler that acts on the path ----------- */

static uv_loop_t loop;
static ms_server_t *srv;
static ms_req_t *parked; /* a request whose handler is parked, for the test to finish */
static char seen_host[64];
static ms_buf_t echoed; /* body bytes read by /echo */
static char
    seen_fields[512]; /* /echo: "headers|trailers" as name=value; lists, once the body is whole */
static int requests_seen;
static int chain_overflow, chain_short;
static echo_tunnel_t tunnel; /* /tunnel's taker */
static int tunnel_rc;
static ms_raw_t *raw; /* /raw's socket, and its request */
static ms_req_t *raw_req;
static ms_ws_t *ws; /* /ws's socket; /ws-now finishes its request in the handler */

static void reply_text(ms_req_t *r, const char *s)
{
    ms_reply_header(r, S("content-type"), S("text/plain"));
    ms_reply_send(r, s, strlen(s), MS_VEC_STATIC, -1);
}

/* /echo reads the whole body (waiting for it), then sends it back. */
static void echo_step(ms_req_t *r)
{
    for (;;) {
        const char *p;
        int64_t n = ms_req_body_take(r, &p);
        if (n > 0) {
            ms__buf_append(&echoed, p, (size_t)n);
            continue;
        }
        if (n == UV_EAGAIN) {
            ms_req_wait_body(r);
            return;
        }
        if (n < 0) {
            r->v.status = 400;
            reply_text(r, "bad body");
        } else {
            note_fields(r, seen_fields, sizeof(seen_fields));
            ms_reply_send(r, echoed.base ? echoed.base : "", echoed.len, MS_VEC_OUT, -1);
        }
        ms_req_finish(r);
        return;
    }
}

static int path_is(ms_req_t *r, const char *p)
{
    return r->v.path.len == strlen(p) && memcmp(r->v.path.base, p, r->v.path.len) == 0;
}

static void on_request(ms_req_t *r, void *data)
{
    (void)data;
    requests_seen++;
    const ms_str_t *host = ms_req_header(r, S("host"));
    snprintf(seen_host, sizeof(seen_host), "%.*s", host ? (int)host->len : 0,
             host ? host->base : "");
    if (path_is(r, "/park")) {
        ms_req_park(r);
        parked = r;
        return;
    }
    if (path_is(r, "/echo")) {
        echoed.len = 0;
        echo_step(r);
        return;
    }
    if (path_is(r, "/raw")) {
        int err = 0;
        ms_reply_header(r, S("upgrade"), S("x-raw"));
        raw_req = r;
        raw = ms_raw_accept(r, 1 << 20, &err);
        return;
    }
    if (path_is(r, "/ws") || path_is(r, "/ws-now")) {
        ms_ws_opts_t o = {.max_message = 1 << 16, .max_frame = 1 << 16, .send_queue = 1 << 20,
                          .close_ms = 1000};
        int err = 0;
        ms_reply_header(r, S("upgrade"), S("websocket"));
        ws = ms_ws_accept(r, &o, &err);
        if (path_is(r, "/ws"))
            parked = r;
        else
            ms_req_finish(r);
        return;
    }
    if (path_is(r, "/tunnel")) {
        ms_reply_header(r, S("upgrade"), S("echo"));
        tunnel_rc = ms_req_tunnel(r, echo_tunnel(&tunnel));
        return;
    }
    if (path_is(r, "/stream")) {
        ms_reply_write(r, S("a"), MS_VEC_STATIC, -1);
        ms_reply_write(r, S("bb"), MS_VEC_STATIC, -1);
        ms_req_finish(r);
        return;
    }
    if (path_is(r, "/chain")) {
        /* 10 bytes promised; a piece too many is refused, then the rest completes it */
        ms_reply_begin(r, 10);
        ms_reply_piece(r, S("abc"), MS_VEC_STATIC, -1);
        ms_reply_piece(r, S("defg"), MS_VEC_STATIC, -1);
        chain_overflow = ms_reply_piece(r, S("too long"), MS_VEC_STATIC, -1);
        ms_reply_piece(r, S("hij"), MS_VEC_STATIC, -1);
        ms_reply_end(r);
        ms_req_finish(r);
        return;
    }
    if (path_is(r, "/short")) {
        ms_reply_begin(r, 10);
        ms_reply_piece(r, S("abc"), MS_VEC_STATIC, -1);
        chain_short = ms_reply_end(r);
        ms_req_finish(r);
        return;
    }
    if (path_is(r, "/big")) {
        static char big[20 * 1024];
        memset(big, 'b', sizeof(big));
        ms_reply_send(r, big, sizeof(big), MS_VEC_STATIC, -1);
        ms_req_finish(r);
        return;
    }
    if (path_is(r, "/close")) {
        ms_reply_header(r, S("connection"), S("close"));
        reply_text(r, "bye");
        ms_req_finish(r);
        return;
    }
    if (path_is(r, "/query")) {
        char buf[128];
        snprintf(buf, sizeof(buf), "%.*s|%.*s", (int)r->v.path.len, r->v.path.base,
                 (int)r->v.query.len, r->v.query.base ? r->v.query.base : "");
        ms_reply_send(r, buf, strlen(buf), MS_VEC_OUT, -1);
        ms_req_finish(r);
        return;
    }
    reply_text(r, "hello world");
    ms_req_finish(r);
}

static int resumes;

static void on_resume(ms_req_t *r, void *data)
{
    (void)data;
    resumes++;
    if (path_is(r, "/echo"))
        echo_step(r);
}

static void setup(void)
{
    ms_log_set(NULL, MS_LOG_WARN); /* refusals log at info: kept out of the test output */
    uv_loop_init(&loop);
    srv = ms_server_new(&loop, NULL, on_request, on_resume, NULL);
    parked = NULL;
    requests_seen = 0;
    seen_host[0] = 0;
    echoed.len = 0;
}

static void teardown(void)
{
    ms_server_free(srv);
    uv_loop_close(&loop);
    ms_mem_free(echoed.base);
    echoed.base = NULL;
    echoed.cap = 0;
}

/* The output as a C string (valid until the memio is freed). */
static const char *output(ms_memio_t *m)
{
    ms__buf_append(&m->out, "", 1);
    m->out.len--;
    return m->out.base;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* Feeds `in` in pieces of `step` bytes (0: all at once); returns the output, which the caller
 * frees. The connection is closed by the peer afterwards. */
static char *exchange(const char *in, size_t len, size_t step)
{
    ms_memio_t m;
    ms_memio_open(srv, &m);
    if (step == 0)
        step = len;
    for (size_t off = 0; off < len; off += step)
        ms_memio_feed(&m, in + off, off + step <= len ? step : len - off);
    char *out = strdup(output(&m));
    ms_memio_peer_close(&m, UV_ECONNRESET);
    ms_memio_free(&m);
    return out;
}

/* As exchange(), but each of the `n` segments arrives as a socket read does: copied into the
 * buffer the connection offers, so kept bytes are read after themselves. */
static char *exchange_reads(const char *const *segs, int n)
{
    ms_memio_t m;
    ms_memio_open(srv, &m);
    for (int i = 0; i < n; i++)
        ms_memio_read(&m, segs[i], strlen(segs[i]));
    char *out = strdup(output(&m));
    ms_memio_peer_close(&m, UV_ECONNRESET);
    ms_memio_free(&m);
    return out;
}

/* -- Tests ------------------------------------------------------------------------------ */

TEST(h1_answers_a_single_request)
{
    setup();
    char *out = exchange(S("GET /hello HTTP/1.1\r\nHost: example.org\r\n\r\n"), 0);
    ASSERT_HAS(out, "HTTP/1.1 200 OK\r\n");
    ASSERT_HAS(out, "content-length: 11\r\n");
    ASSERT_HAS(out, "content-type: text/plain\r\n");
    ASSERT_HAS(out, "\r\ndate: ");
    ASSERT_HAS(out, "\r\n\r\nhello world");
    ASSERT_LACKS(out, "connection:");
    ASSERT_STR_EQ("example.org", seen_host);
    free(out);
    teardown();
}

TEST(h1_answers_a_pipelined_batch_in_order)
{
    setup();
    char in[4096] = "";
    for (int i = 0; i < 10; i++) {
        char line[128];
        snprintf(line, sizeof(line), "GET /query?n=%d HTTP/1.1\r\nHost: h\r\n\r\n", i);
        strcat(in, line);
    }
    char *out = exchange(in, strlen(in), 0);
    ASSERT_EQ(10, count(out, "HTTP/1.1 200 OK"));
    const char *p = out;
    for (int i = 0; i < 10; i++) {
        char want[32];
        snprintf(want, sizeof(want), "/query|n=%d", i);
        p = strstr(p, want);
        if (p == NULL)
            TEST_FAIL("reply %d missing or out of order:\n%s", i, out);
    }
    free(out);
    teardown();
}

TEST(h1_parses_requests_split_at_every_byte)
{
    setup();
    static const char in[] = "POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
                             "GET /query?x=1 HTTP/1.1\r\nHost: h\r\n\r\n"
                             "POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                             "3\r\nabc\r\n0\r\n\r\n";
    for (size_t step = 1; step <= sizeof(in) - 1; step++) {
        char *out = exchange(in, sizeof(in) - 1, step);
        if (count(out, "HTTP/1.1 200 OK") != 3 || strstr(out, "\r\n\r\nhello") == NULL ||
            strstr(out, "/query|x=1") == NULL || strstr(out, "\r\n\r\nabc") == NULL) {
            TEST_FAIL("step %zu:\n%s", step, out);
        }
        free(out);
    }
    teardown();
}

TEST(h1_serves_a_pipelined_head_split_across_reads)
{
    setup();
    /* The second head starts behind the first in the connection's buffer and is moved to its
     * front by the next read: its scan position must move with it. */
    const char *segs[] = {"GET /a HTTP/1.1\r\nHost: x\r\n", "\r\nGET /b HTTP/1.1\r\nHo",
                          "st: x\r\n\r\n"};
    char *out = exchange_reads(segs, 3);
    ASSERT_EQ(2, count(out, "HTTP/1.1 200 OK"));
    ASSERT_LACKS(out, "400");
    free(out);
    /* Every split of a pipelined pair into three reads. */
    static const char in[] = "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n";
    for (size_t i = 1; i < sizeof(in) - 2; i++) {
        for (size_t j = i + 1; j < sizeof(in) - 1; j++) {
            char a[64], b[64], c[64];
            snprintf(a, sizeof(a), "%.*s", (int)i, in);
            snprintf(b, sizeof(b), "%.*s", (int)(j - i), in + i);
            snprintf(c, sizeof(c), "%s", in + j);
            const char *parts[] = {a, b, c};
            out = exchange_reads(parts, 3);
            if (count(out, "HTTP/1.1 200 OK") != 2)
                TEST_FAIL("split at %zu and %zu:\n%s", i, j, out);
            free(out);
        }
    }
    teardown();
}

TEST(h1_reads_chunked_bodies_with_extensions_and_trailers)
{
    setup();
    char *out = exchange(S("POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                           "4;name=value\r\nWiki\r\n5\r\npedia\r\n0\r\nExpires: never\r\n\r\n"),
                         0);
    ASSERT_HAS(out, "HTTP/1.1 200 OK");
    ASSERT_HAS(out, "content-length: 9\r\n");
    ASSERT_HAS(out, "\r\n\r\nWikipedia");
    free(out);
    teardown();
}

TEST(h1_keeps_trailers_apart_from_headers_and_copies_them)
{
    setup();
    static const char in[] = "POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                             "3\r\nabc\r\n0\r\nX-Forwarded-For: 6.6.6.6\r\nCookie: stolen\r\n"
                             "X-Empty:\r\n\r\n";
    static const char want[] = "Host=h;Transfer-Encoding=chunked;|X-Forwarded-For=6.6.6.6;"
                               "Cookie=stolen;X-Empty=;";
    for (size_t step = 0; step < sizeof(in) - 1; step++) {
        seen_fields[0] = 0;
        /* fed and read both, so the trailer's bytes come from buffers that are reused */
        char *out = exchange(in, sizeof(in) - 1, step);
        if (count(out, "HTTP/1.1 200 OK") != 1 || strcmp(seen_fields, want) != 0)
            TEST_FAIL("step %zu: %s\n%s", step, seen_fields, out);
        free(out);
        if (step == 0)
            continue;
        char a[256], b[256];
        snprintf(a, sizeof(a), "%.*s", (int)step, in);
        snprintf(b, sizeof(b), "%s", in + step);
        const char *segs[] = {a, b};
        seen_fields[0] = 0;
        out = exchange_reads(segs, 2);
        if (count(out, "HTTP/1.1 200 OK") != 1 || strcmp(seen_fields, want) != 0)
            TEST_FAIL("read split at %zu: %s\n%s", step, seen_fields, out);
        free(out);
    }
    teardown();
}

TEST(h1_holds_trailers_to_the_limits_of_header_fields)
{
    setup();
    static char in[200000];
    static const char start[] =
        "POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        "1\r\na\r\n0\r\n";
    struct {
        const char *why;
        int status;
    } cases[] = {{"too many", 431}, {"too large", 431}, {"empty name", 400}, {"bad name", 400}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t n = (size_t)snprintf(in, sizeof(in), "%s", start);
        if (i == 0)
            for (uint32_t k = 0; k <= srv->limits.header_count; k++)
                n += (size_t)snprintf(in + n, sizeof(in) - n, "x-%u: 1\r\n", k);
        if (i == 1) {
            n += (size_t)snprintf(in + n, sizeof(in) - n, "x-big: ");
            memset(in + n, 'a', srv->limits.head_bytes);
            n += srv->limits.head_bytes;
            n += (size_t)snprintf(in + n, sizeof(in) - n, "\r\n");
        }
        if (i == 2)
            n += (size_t)snprintf(in + n, sizeof(in) - n, ": x\r\n");
        if (i == 3)
            n += (size_t)snprintf(in + n, sizeof(in) - n, "x(y): 1\r\n");
        n += (size_t)snprintf(in + n, sizeof(in) - n, "\r\n");
        char *out = exchange(in, n, 0);
        char want[32];
        snprintf(want, sizeof(want), "HTTP/1.1 %d ", cases[i].status);
        if (strncmp(out, want, strlen(want)) != 0 || strstr(out, "connection: close") == NULL)
            TEST_FAIL("%s: %.200s", cases[i].why, out);
        free(out);
    }
    teardown();
}

TEST(h1_refuses_a_bad_chunk_size)
{
    setup();
    char *out = exchange(S("POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                           "zz\r\nabc\r\n0\r\n\r\n"),
                         0);
    ASSERT_HAS(out, "HTTP/1.1 400 Bad Request");
    ASSERT_HAS(out, "connection: close");
    free(out);
    teardown();
}

TEST(h1_refuses_chunk_extensions_over_4_kib)
{
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    ms_memio_feed(&m, S("POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                        "3;"));
    for (int i = 0; i < 500; i++)
        ms_memio_feed(&m, S("name=value"));
    ASSERT_HAS(output(&m), "HTTP/1.1 400 Bad Request");
    ASSERT_EQ(1, m.closed);
    ms_memio_free(&m);
    /* Below the bound, extensions on every chunk are fine. */
    char *out = exchange(S("POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                           "1;a=b\r\nx\r\n1;c=d\r\ny\r\n0;e=f\r\n\r\n"),
                         0);
    ASSERT_HAS(out, "\r\n\r\nxy");
    free(out);
    teardown();
}

TEST(h1_sends_100_continue_only_when_the_body_is_read)
{
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    static const char head[] =
        "POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n";
    ms_memio_feed(&m, head, sizeof(head) - 1);
    ASSERT_STR_EQ("HTTP/1.1 100 Continue\r\n\r\n", output(&m));
    ms_memio_feed(&m, S("abc"));
    ASSERT_HAS(output(&m), "HTTP/1.1 200 OK");
    ASSERT_HAS(output(&m), "\r\n\r\nabc");
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);

    /* A handler that answers without reading: no 100, and the connection closes. */
    ms_memio_open(srv, &m);
    static const char head2[] =
        "POST /hello HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n";
    ms_memio_feed(&m, head2, sizeof(head2) - 1);
    ASSERT_LACKS(output(&m), "100 Continue");
    ASSERT_HAS(output(&m), "HTTP/1.1 200 OK");
    ASSERT_HAS(output(&m), "connection: close");
    ASSERT_EQ(1, m.closed);
    ms_memio_free(&m);
    teardown();
}

TEST(h1_answers_head_without_a_body_but_with_its_length)
{
    setup();
    char *out = exchange(S("HEAD /hello HTTP/1.1\r\nHost: h\r\n\r\n"), 0);
    ASSERT_HAS(out, "HTTP/1.1 200 OK");
    ASSERT_HAS(out, "content-length: 11\r\n");
    ASSERT_LACKS(out, "hello world");
    free(out);
    teardown();
}

TEST(h1_keeps_http10_alive_only_when_asked)
{
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    ms_memio_feed(&m, S("GET /hello HTTP/1.0\r\n\r\n"));
    ASSERT_HAS(output(&m), "connection: close");
    ASSERT_EQ(1, m.closed);
    ms_memio_free(&m);

    ms_memio_open(srv, &m);
    ms_memio_feed(&m, S("GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
    ASSERT_HAS(output(&m), "connection: keep-alive");
    ASSERT_EQ(0, m.closed);
    ms_memio_peer_close(&m, UV_EOF);
    ASSERT_EQ(2, m.closed);
    ms_memio_free(&m);
    teardown();
}

TEST(h1_closes_after_connection_close)
{
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    ms_memio_feed(&m, S("GET /hello HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
                        "GET /hello HTTP/1.1\r\nHost: h\r\n\r\n"));
    ASSERT_EQ(1, count(output(&m), "HTTP/1.1 200"));
    ASSERT_HAS(output(&m), "connection: close");
    ASSERT_EQ(1, m.closed);
    ASSERT_EQ(1, requests_seen);
    ms_memio_free(&m);

    ms_memio_open(srv, &m);
    ms_memio_feed(&m, S("GET /close HTTP/1.1\r\nHost: h\r\n\r\n"));
    ASSERT_HAS(output(&m), "connection: close");
    ASSERT_EQ(1, m.closed);
    ms_memio_free(&m);
    teardown();
}

TEST(h1_closes_after_requests_per_connection)
{
    setup();
    srv->limits.requests_per_connection = 3;
    ms_memio_t m;
    ms_memio_open(srv, &m);
    for (int i = 0; i < 4; i++)
        ms_memio_feed(&m, S("GET /hello HTTP/1.1\r\nHost: h\r\n\r\n"));
    ASSERT_EQ(3, requests_seen);
    ASSERT_EQ(1, count(output(&m), "connection: close")); /* on the third reply only */
    ASSERT_EQ(1, m.closed);
    ms_memio_free(&m);
    teardown();
}

TEST(h1_streams_a_reply_with_chunked_encoding)
{
    setup();
    char *out = exchange(S("GET /stream HTTP/1.1\r\nHost: h\r\n\r\n"), 0);
    ASSERT_HAS(out, "transfer-encoding: chunked\r\n");
    ASSERT_HAS(out, "\r\n\r\n1\r\na\r\n2\r\nbb\r\n0\r\n\r\n");
    free(out);
    /* HTTP/1.0 has no chunks: the body ends with the connection. */
    out = exchange(S("GET /stream HTTP/1.0\r\n\r\n"), 0);
    ASSERT_LACKS(out, "transfer-encoding");
    ASSERT_HAS(out, "connection: close\r\n");
    ASSERT_HAS(out, "\r\n\r\nabb");
    free(out);
    teardown();
}

TEST(h1_sends_a_reply_in_pieces_with_the_promised_length)
{
    setup();
    char *out = exchange(S("GET /chain HTTP/1.1\r\nHost: h\r\n\r\n"), 0);
    ASSERT_HAS(out, "content-length: 10\r\n");
    ASSERT_HAS(out, "\r\n\r\nabcdefghij");
    ASSERT_EQ(MS_ETOOBIG, chain_overflow);
    free(out);
    /* Ending short of the promise cuts the connection: the client sees a truncated body. */
    ms_memio_t m;
    ms_memio_open(srv, &m);
    ms_memio_feed(&m, S("GET /short HTTP/1.1\r\nHost: h\r\n\r\n"));
    ASSERT_EQ(MS_ETOOBIG, chain_short);
    ASSERT_HAS(output(&m), "content-length: 10\r\n");
    ASSERT_EQ(1, m.closed);
    ms_memio_free(&m);
    teardown();
}

TEST(h1_stops_reading_a_body_the_handler_does_not_take_and_resumes_when_it_does)
{
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    static char chunk[64 * 1024];
    memset(chunk, 'b', sizeof(chunk));
    ms_memio_feed(&m, S("POST /park HTTP/1.1\r\nHost: h\r\nContent-Length: 1000000\r\n\r\n"));
    ASSERT(parked != NULL);
    for (int i = 0; i < 5 && m.reading; i++)
        ms_memio_feed(&m, chunk, sizeof(chunk));
    ASSERT_EQ(0, m.reading); /* past the high-water mark: the socket is left unread */
    const char *p;
    int64_t n = ms_req_body_take(parked, &p);
    ASSERT(n > 256 * 1024);
    ASSERT_EQ(1, m.reading); /* taken: reading again */
    reply_text(parked, "done");
    ms_req_finish(parked);
    ms_memio_peer_close(&m, UV_ECONNRESET);
    ms_memio_free(&m);
    teardown();
}

TEST(h1_wakes_a_handler_waiting_for_a_body_when_the_client_leaves)
{
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    resumes = 0;
    ms_memio_feed(&m, S("POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc"));
    ASSERT_EQ(0, resumes);
    ms_memio_peer_close(&m, UV_EOF); /* half the body, then EOF */
    ASSERT_EQ(1, resumes);
    ASSERT_HAS(output(&m), "HTTP/1.1 400 "); /* the handler's answer to a body that broke */
    ms_memio_free(&m);
    teardown();
}

TEST(h1_parks_a_writer_on_a_congested_socket_until_it_drains)
{
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    m.congested = 1;
    ms_memio_feed(&m, S("GET /park HTTP/1.1\r\nHost: h\r\n\r\n"));
    ASSERT(parked != NULL);
    static char big[300 * 1024];
    memset(big, 'z', sizeof(big));
    ASSERT_EQ(0, ms_reply_write(parked, big, sizeof(big), MS_VEC_STATIC, -1));
    ASSERT(ms_reply_congested(parked));
    ASSERT_EQ(0, ms_req_wait_drain(parked, 0)); /* park */
    ASSERT_EQ(MS_WAIT_DRAIN, parked->v.wait);
    resumes = 0;
    m.congested = 0;
    ms_memio_drain(&m);
    ASSERT_EQ(1, resumes);                      /* drained: the writer is resumed */
    ASSERT_EQ(1, ms_req_wait_drain(parked, 1)); /* nothing left to wait for */
    ms_req_finish(parked);
    ASSERT_HAS(output(&m), "0\r\n\r\n");
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    teardown();
}

TEST(h1_stops_parsing_pipelined_requests_while_replies_are_not_read)
{
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    m.congested = 1; /* a client that sends and never reads */
    static char in[64 * 1024];
    size_t n = 0;
    static const char req[] = "GET /big HTTP/1.1\r\nHost: h\r\nUser-Agent: a pipelining client "
                              "that sends 64 KiB of requests and reads none of the replies\r\n"
                              "Accept: */*\r\n\r\n";
    int sent = 0;
    while (n + sizeof(req) < sizeof(in)) {
        memcpy(in + n, req, sizeof(req) - 1);
        n += sizeof(req) - 1;
        sent++;
    }
    ms_memio_feed(&m, in, n);
    /* 20 KiB replies: parsing stops once the queue holds its high-water mark */
    int first = requests_seen;
    ASSERT(first < sent);
    ASSERT(first <= MS_OUT_HIGH_WATER / (20 * 1024) + 2);
    ASSERT_EQ(0, m.reading);
    ASSERT(ms__conn_queued(m.conn) <= MS_OUT_HIGH_WATER + 20 * 1024 + 4096);
    /* the client reads: the rest are served, in order, a queue's worth at a time */
    for (int i = 0; i < 100 && requests_seen < sent; i++)
        ms_memio_drain(&m);
    ASSERT_EQ(sent, requests_seen);
    m.congested = 0;
    ms_memio_drain(&m);
    ASSERT_EQ(sent, count(output(&m), "HTTP/1.1 200 OK"));
    ASSERT_EQ(1, m.reading);
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    teardown();
}

TEST(h1_holds_the_next_request_until_a_parked_one_is_answered)
{
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    ms_memio_feed(&m, S("GET /park HTTP/1.1\r\nHost: first\r\n\r\n"
                        "GET /hello HTTP/1.1\r\nHost: second\r\n\r\n"));
    ASSERT(parked != NULL);
    ASSERT_EQ(0, (int)m.out.len);
    ASSERT_EQ(1, requests_seen);
    /* The parked head was copied out of the read buffer: scribbling on it changes nothing. */
    memset(srv->rbuf, 'x', 256);
    const ms_str_t *host = ms_req_header(parked, S("host"));
    ASSERT(host != NULL && host->len == 5 && memcmp(host->base, "first", 5) == 0);
    reply_text(parked, "first reply");
    ms_req_finish(parked);
    ASSERT_EQ(2, requests_seen);
    const char *out = output(&m);
    const char *a = strstr(out, "first reply"), *b = strstr(out, "hello world");
    ASSERT(a != NULL && b != NULL && a < b);
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    teardown();
}

TEST(h1_drops_the_reply_of_a_request_whose_client_left)
{
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    ms_memio_feed(&m, S("GET /park HTTP/1.1\r\nHost: h\r\n\r\n"));
    ASSERT(parked != NULL);
    ms_memio_peer_close(&m, UV_ECONNRESET);
    ASSERT_EQ(2, m.closed);
    ASSERT(parked->v.flags & MS_REQ_ABORTED);
    reply_text(parked, "nobody listens");
    ms_req_finish(parked); /* frees the connection */
    ASSERT_EQ(0, (int)srv->stats->conns);
    ms_memio_free(&m);
    teardown();
}

TEST(h1_writes_later_what_the_socket_cannot_take_now)
{
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    m.congested = 1;
    ms_memio_feed(
        &m, S("GET /hello HTTP/1.1\r\nHost: h\r\n\r\nGET /hello HTTP/1.1\r\nHost: h\r\n\r\n"));
    ASSERT_EQ(0, (int)m.out.len);
    ASSERT(m.held.len > 0);
    m.congested = 0;
    ms_memio_drain(&m);
    ASSERT_EQ(2, count(output(&m), "hello world"));
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    teardown();
}

TEST(h1_splits_target_into_path_and_query)
{
    setup();
    char *out = exchange(S("GET /query?a=1&b=2 HTTP/1.1\r\nHost: h\r\n\r\n"
                           "GET http://example.org/query?z HTTP/1.1\r\nHost: example.org\r\n\r\n"),
                         0);
    ASSERT_HAS(out, "/query|a=1&b=2");
    ASSERT_HAS(out, "/query|z");
    free(out);
    teardown();
}

/* Each of these must get the status given and a close, and never reach the handler. */
#define R(lit, status)                                                                             \
    {                                                                                              \
        lit, sizeof(lit) - 1, status                                                               \
    }
static const struct {
    const char *in;
    size_t len;
    int status;
} refused[] = {
    R("GET / HTTP/1.1\r\n\r\n", 400),                           /* no Host */
    R("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),     /* two Hosts */
    R("GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400),              /* bad Host */
    R("GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400),              /* bad Host */
    R("GET / HTTP/1.1\nHost: a\r\n\r\n", 400),                  /* LF without CR */
    R("GET / HTTP/1.1\r\nHost: a\rX: y\r\n\r\n", 400),          /* bare CR */
    R("GET / HTTP/1.1\r\nHost: a\r\nX: a\0b\r\n\r\n", 400),     /* NUL */
    R("GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n", 400),  /* obs-fold */
    R("GET / HTTP/1.1\r\n Host: a\r\n\r\n", 400),               /* space first */
    R("GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400),               /* space before colon */
    R("GET / HTTP/1.1\r\nHost: a\r\nBad Name: x\r\n\r\n", 400), /* space in name */
    R("GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),                /* unknown version */
    R("GET / HTTP/3.1\r\nHost: a\r\n\r\n", 400),
    R("GET /\r\n\r\n", 505), /* HTTP/0.9 */
    R("GET / FOO/1.1\r\nHost: a\r\n\r\n", 400),
    R("G@T / HTTP/1.1\r\nHost: a\r\n\r\n", 400),  /* bad method */
    R("GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400), /* double space */
    R("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    R("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400),
    R("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400),
    R("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1x\r\n\r\n", 400),
    R("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
    R("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 400),
    R("CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n", 405),
    R("POST / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\nContent-Length: 1\r\n\r\nx", 417),
    R("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999\r\n\r\n", 413),
    /* RFC 9110 5.1: a field name is a token, so neither empty nor starting with ':' */
    R("GET / HTTP/1.1\r\n: x\r\nHost: a\r\n\r\n", 400),
    R("GET / HTTP/1.1\r\nHost: a\r\n: x\r\n\r\n", 400),
    R("GET / HTTP/1.1\r\nHost: a\r\n:authority: y\r\n\r\n", 400),
    R("GET / HTTP/1.1\r\n:authority: y\r\nHost: a\r\n\r\n", 400),
    R("GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n:\r\n\r\n", 400),
};

static int log_lines;
static void count_log(int level, const char *msg, size_t len)
{
    (void)level;
    (void)msg;
    (void)len;
    log_lines++;
}

TEST(h1_refuses_malformed_requests_with_a_status_a_close_and_one_log_line)
{
    setup();
    log_lines = 0;
    ms_log_set(count_log, MS_LOG_INFO);
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        const char *in = refused[i].in;
        size_t len = refused[i].len;
        ms_memio_t m;
        ms_memio_open(srv, &m);
        requests_seen = 0;
        srv->refused_told = 0; /* each case as if in a second of its own (see the next test) */
        ms_memio_feed(&m, in, len);
        char want[32];
        snprintf(want, sizeof(want), "HTTP/1.1 %d ", refused[i].status);
        const char *out = output(&m);
        if (strncmp(out, want, strlen(want)) != 0 || strstr(out, "connection: close") == NULL ||
            m.closed != 1 || requests_seen != 0) {
            TEST_FAIL("case %zu (%s): closed %d, handler %d, got:\n%s", i, in, m.closed,
                      requests_seen, out);
        }
        ms_memio_free(&m);
        if (log_lines != (int)i + 1)
            TEST_FAIL("case %zu (%s): %d log lines in all", i, in, log_lines);
    }
    ms_log_set(NULL, MS_LOG_WARN);
    teardown();
}

/* head_bytes below line_bytes: a head between the two is refused all the same. */
TEST(h1_refuses_a_head_over_head_bytes_smaller_than_line_bytes)
{
    ms_log_set(NULL, MS_LOG_WARN);
    uv_loop_init(&loop);
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.head_bytes = 2048;
    ASSERT(lim.line_bytes > 3000);
    srv = ms_server_new(&loop, &lim, on_request, on_resume, NULL);
    requests_seen = 0;
    char head[4096];
    int n = snprintf(head, sizeof(head), "GET / HTTP/1.1\r\nHost: a\r\nX-Big: %03000d\r\n\r\n", 0);
    ms_memio_t m;
    ms_memio_open(srv, &m);
    ms_memio_feed(&m, head, (size_t)n); /* in one read */
    ASSERT_HAS(output(&m), "HTTP/1.1 431 ");
    ASSERT_EQ(0, requests_seen);
    ms_memio_free(&m);
    teardown();
}

TEST(h1_logs_a_few_refusals_a_second_with_their_reason_and_counts_the_rest)
{
    setup();
    log_lines = 0;
    srv->refused_told = 0;
    srv->refused_logged_at = uv_now(&loop); /* a window that has just begun */
    uint64_t quiet = srv->refused_quiet;
    ms_log_set(count_log, MS_LOG_INFO);
    for (int i = 0; i < 25; i++) {
        ms_memio_t m;
        ms_memio_open(srv, &m);
        ms_memio_feed(&m, S("GET / HTTP/1.1\r\nHost: a\r\nBad Name: x\r\n\r\n"));
        ASSERT_EQ(0, strncmp(output(&m), "HTTP/1.1 400 ", 13));
        ms_memio_free(&m);
    }
    ASSERT_EQ(MS_REFUSALS_TOLD, log_lines);
    ASSERT_EQ(25 - MS_REFUSALS_TOLD, (int)(srv->refused_quiet - quiet));
    ms_log_set(NULL, MS_LOG_WARN);
    teardown();
}

TEST(h1_refuses_oversized_heads)
{
    setup();
    char big[40000];
    memset(big, 'a', sizeof(big));
    memcpy(big, "GET /", 5);
    ms_memio_t m;
    ms_memio_open(srv, &m);
    ms_memio_feed(&m, big, sizeof(big));
    ASSERT_HAS(output(&m), "HTTP/1.1 414 ");
    ms_memio_free(&m);

    ms_memio_open(srv, &m);
    ms_memio_feed(&m, S("GET / HTTP/1.1\r\nHost: a\r\n"));
    for (int i = 0; i < 1000; i++)
        ms_memio_feed(&m, S("X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n"));
    ASSERT_HAS(output(&m), "HTTP/1.1 431 ");
    ms_memio_free(&m);

    ms_memio_open(srv, &m);
    ms_memio_feed(&m, S("GET / HTTP/1.1\r\nHost: a\r\n"));
    for (int i = 0; i < 101; i++)
        ms_memio_feed(&m, S("X: y\r\n"));
    ms_memio_feed(&m, S("\r\n"));
    ASSERT_HAS(output(&m), "HTTP/1.1 431 ");
    ms_memio_free(&m);
    teardown();
}

/* The app's refusal bodies: chosen by Accept (JSON, HTML, else the text, else the first
 * given), with their content type and length; the core's own text where none was given. */
TEST(h1_answers_refusals_with_the_app_bodies_chosen_by_accept)
{
    setup();
    static const char json[] = "{\"error\":\"too large\"}", html[] = "<h1>Too large</h1>";
    ASSERT_EQ(0, ms_server_refusal_body(srv, 413, MS_REFUSAL_JSON, S(json)));
    ASSERT_EQ(0, ms_server_refusal_body(srv, 413, MS_REFUSAL_HTML, S(html)));
    ASSERT_EQ(0, ms_server_refusal_body(srv, 431, MS_REFUSAL_JSON, S("{\"error\":\"head\"}")));
    ASSERT_EQ(0, ms_server_refusal_body(srv, 503, MS_REFUSAL_JSON, S("{\"error\":\"busy\"}")));
    ASSERT_EQ(UV_EEXIST, ms_server_refusal_body(srv, 413, MS_REFUSAL_JSON, S("{}")));
    ASSERT_EQ(UV_EINVAL, ms_server_refusal_body(srv, 404, MS_REFUSAL_JSON, S("{}")));
    ASSERT_EQ(UV_EINVAL, ms_server_refusal_body(srv, 413, 3, S("{}")));
    static char big[MS_REFUSAL_BODY_MAX + 1];
    ASSERT_EQ(UV_EINVAL, ms_server_refusal_body(srv, 400, MS_REFUSAL_TEXT, big, sizeof(big)));
    static const struct {
        const char *accept, *type, *body;
    } cases[] = {
        {"application/json", "application/json", json},
        {"application/problem+json", "application/json", json},
        {"text/html,application/xhtml+xml,*/*;q=0.8", "text/html; charset=utf-8", html},
        {"text/html, application/json", "text/html; charset=utf-8", html},
        {"application/json, text/html", "application/json", json},
        {"*/*", "application/json", json}, /* no text given: the first, JSON */
        {NULL, "application/json", json},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char in[256], want[256];
        snprintf(in, sizeof(in),
                 "POST / HTTP/1.1\r\nHost: a\r\n%s%s%sContent-Length: 99999999999\r\n\r\n",
                 cases[i].accept ? "Accept: " : "", cases[i].accept ? cases[i].accept : "",
                 cases[i].accept ? "\r\n" : "");
        char *out = exchange(in, strlen(in), 0);
        snprintf(want, sizeof(want), "content-type: %s\r\ncontent-length: %zu\r\n", cases[i].type,
                 strlen(cases[i].body));
        if (strncmp(out, "HTTP/1.1 413 ", 13) != 0 || strstr(out, want) == NULL ||
            strcmp(strstr(out, "\r\n\r\n") + 4, cases[i].body) != 0)
            TEST_FAIL("case %zu (%s): got:\n%s", i, cases[i].accept, out);
        free(out);
    }
    /* A status the app gave no body for keeps the core's text. */
    char *out = exchange(S("GET / HTTP/3.1\r\nHost: a\r\n\r\n"), 0);
    ASSERT_HAS(out, "HTTP/1.1 400 ");
    ASSERT_HAS(out, "content-type: text/plain; charset=utf-8\r\n");
    ASSERT_HAS(out, "\r\n\r\n400 Bad Request\n");
    free(out);
    /* A head too large is refused before its fields are read: the first body given. */
    ms_memio_t m;
    ms_memio_open(srv, &m);
    ms_memio_feed(&m, S("GET / HTTP/1.1\r\nHost: a\r\nAccept: text/html\r\n"));
    for (int i = 0; i < 1000; i++)
        ms_memio_feed(&m, S("X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n"));
    ASSERT_HAS(output(&m), "HTTP/1.1 431 ");
    ASSERT_HAS(output(&m), "content-type: application/json\r\n");
    ASSERT_HAS(output(&m), "\r\n\r\n{\"error\":\"head\"}");
    ms_memio_free(&m);
    /* Over the in-flight cap: 503 with the app's body, before the head is parsed. */
    srv->limits.in_flight = 0;
    out = exchange(S("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), 0);
    ASSERT_HAS(out, "HTTP/1.1 503 ");
    ASSERT_HAS(out, "retry-after: 1\r\n");
    ASSERT_HAS(out, "content-type: application/json\r\ncontent-length: 16\r\n");
    ASSERT_HAS(out, "\r\n\r\n{\"error\":\"busy\"}");
    free(out);
    teardown();
}

TEST(h1_ignores_empty_lines_before_a_request)
{
    setup();
    char *out = exchange(S("\r\n\r\nGET /hello HTTP/1.1\r\nHost: h\r\n\r\n"), 0);
    ASSERT_HAS(out, "HTTP/1.1 200 OK");
    free(out);
    teardown();
}

TEST(h1_serves_a_warm_keepalive_request_without_allocating)
{
#if defined(__SANITIZE_ADDRESS__)
    return; /* recycling is off under ASan, on purpose */
#endif
    setup();
    srv->limits.requests_per_connection = 100000;
    ms_memio_t m;
    ms_memio_open(srv, &m);
    static const char req[] = "GET /hello HTTP/1.1\r\nHost: example.org\r\nUser-Agent: t\r\n\r\n";
    for (int i = 0; i < 10; i++) {
        ms_memio_feed(&m, req, sizeof(req) - 1);
        m.out.len = 0;
    }
    ms_mem_stats_t before = ms_mem_stats;
    for (int i = 0; i < 1000; i++) {
        ms_memio_feed(&m, req, sizeof(req) - 1);
        m.out.len = 0;
    }
    ASSERT_EQ(1010, requests_seen);
    ASSERT_EQ(before.allocs, ms_mem_stats.allocs);
    ASSERT_EQ(before.reallocs, ms_mem_stats.reallocs);
    ASSERT_EQ(before.frees, ms_mem_stats.frees);
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    teardown();
}

TEST(h1_idle_connection_holds_no_buffers)
{
    setup();
    ms_memio_t m;
    ms_conn_t *c = ms_memio_open(srv, &m);
    ms_memio_feed(&m, S("GET /hello HTTP/1.1\r\nHost: h\r\n\r\n"));
    ASSERT(h1_of(c) == NULL);
    ASSERT(c->pend == NULL && c->flight == NULL);
    ms_memio_feed(&m, S("GET /hel"));
    ASSERT(h1_of(c) != NULL); /* a partial head keeps its bytes */
    ms_memio_feed(&m, S("lo HTTP/1.1\r\nHost: h\r\n\r\n"));
    ASSERT(h1_of(c) == NULL);
    ASSERT_EQ(2, count(output(&m), "hello world"));
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    teardown();
}

static const char tunnel_head[] = "GET /tunnel HTTP/1.1\r\nHost: h\r\nUpgrade: echo\r\n"
                                  "Connection: upgrade\r\n\r\n";

TEST(h1_hands_a_request_to_a_tunnel_after_101)
{
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    ms_memio_feed(&m, tunnel_head, sizeof(tunnel_head) - 1);
    ms_memio_feed(&m, S("hi"));
    ASSERT_EQ(0, tunnel_rc);
    const char *out = output(&m);
    ASSERT_HAS(out, "HTTP/1.1 101 Switching Protocols\r\n");
    ASSERT_HAS(out, "upgrade: echo\r\nconnection: upgrade\r\n\r\n<hi>");
    ASSERT(strstr(out, "connection: close") == NULL && strstr(out, "content-length") == NULL);
    /* What follows is the tunnel's, never a request. */
    ms_memio_feed(&m, S("GET / HTTP/1.1\r\nHost: h\r\n\r\n"));
    ASSERT_HAS(output(&m), "<GET / HTTP/1.1\r\nHost: h\r\n\r\n>");
    ASSERT_EQ(1, requests_seen);
    ASSERT_EQ(1, (int)srv->stats->in_flight);
    /* The taker ends it: what it wrote goes, then the connection closes. */
    ms_memio_feed(&m, S("quit"));
    ASSERT_HAS(output(&m), "<quit>");
    ASSERT_EQ(1, m.closed);
    ASSERT_EQ(0, tunnel.ended); /* it ended the tunnel itself: nothing more to hear */
    ASSERT_EQ(0, (int)srv->stats->in_flight);
    ms_memio_free(&m);
    teardown();
}

TEST(h1_a_tunnel_between_writes_holds_no_reply_queue)
{
    /* An open WebSocket idles most of its life: once what it wrote has gone, the queue and
     * its buffers (4 KiB of text, the vectors) go back to the worker, whether the write went
     * at once or in the background. */
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    ms_memio_feed(&m, tunnel_head, sizeof(tunnel_head) - 1);
    ASSERT(m.conn != NULL && m.conn->pend == NULL && m.conn->flight == NULL);
    ms_memio_feed(&m, S("hi"));
    ASSERT_HAS(output(&m), "<hi>");
    ASSERT(m.conn->pend == NULL && m.conn->flight == NULL);
    m.congested = 1;
    ms_memio_feed(&m, S("slow"));
    ASSERT(m.conn->flight != NULL); /* under way */
    m.congested = 0;
    ms_memio_drain(&m);
    ASSERT_HAS(output(&m), "<slow>");
    ASSERT(m.conn->pend == NULL && m.conn->flight == NULL);
    ms_memio_feed(&m, S("quit"));
    ms_memio_free(&m);
    teardown();
}

TEST(h1_gives_a_tunnel_the_bytes_that_came_behind_its_head_in_one_read)
{
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    char in[256];
    snprintf(in, sizeof(in), "%sfirst", tunnel_head);
    ms_memio_feed(&m, in, strlen(in));
    ASSERT_STR_EQ("first", tunnel.seen);
    ASSERT_HAS(output(&m), "\r\n\r\n<first>");
    /* The peer ends its side: the taker hears it once, and lets go. */
    ms_memio_peer_close(&m, UV_EOF);
    ASSERT_EQ(1, tunnel.ended);
    ASSERT_EQ(0, tunnel.end_status);
    ASSERT(m.closed != 0);
    ms_memio_free(&m);
    teardown();
}

TEST(h1_gives_a_tunnel_taken_later_the_bytes_kept_behind_a_parked_head)
{
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    char in[256];
    snprintf(in, sizeof(in),
             "GET /park HTTP/1.1\r\nHost: h\r\nUpgrade: echo\r\n"
             "Connection: upgrade\r\n\r\nkept");
    ms_memio_feed(&m, in, strlen(in));
    ASSERT(parked != NULL);
    ASSERT_EQ(0, (int)m.out.len);
    ASSERT_EQ(0, ms_req_tunnel(parked, echo_tunnel(&tunnel)));
    ASSERT_STR_EQ("kept", tunnel.seen);
    ASSERT_HAS(output(&m), "HTTP/1.1 101 Switching Protocols\r\n");
    ASSERT_HAS(output(&m), "<kept>");
    ASSERT_EQ(MS_ESENT, ms_req_tunnel(parked, &tunnel.t)); /* once */
    /* The taker holds the peer back, then lets it go on. */
    ms_tunnel_read(&tunnel.t, 0);
    ASSERT_EQ(0, m.reading);
    ms_tunnel_read(&tunnel.t, 1);
    ASSERT_EQ(1, m.reading);
    ms_memio_peer_close(&m, UV_ECONNRESET);
    ASSERT_EQ(1, tunnel.ended);
    ASSERT_EQ(MS_ECLOSED, tunnel.end_status);
    ms_memio_free(&m);
    teardown();
}

TEST(h1_raw_socket_reads_after_its_101_and_still_sends_after_the_peer_half_closes)
{
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    ms_memio_feed(&m, S("GET /raw HTTP/1.1\r\nHost: h\r\nUpgrade: x-raw\r\n"
                        "Connection: upgrade\r\n\r\nab"));
    ASSERT(raw != NULL);
    ASSERT_HAS(output(&m), "HTTP/1.1 101 Switching Protocols\r\n");
    /* A raw connection counts as a WebSocket does, not as a request in flight. */
    ASSERT_EQ(1, (int)srv->websockets);
    ASSERT_EQ(0, (int)srv->stats->in_flight);
    ms_memio_feed(&m, S("c"));
    const char *p;
    ASSERT_EQ(3, (int)ms_raw_peek(raw, &p));
    ASSERT(memcmp(p, "abc", 3) == 0);
    ms_raw_consume(raw, 2);
    ASSERT_EQ(1, (int)ms_raw_peek(raw, &p));
    ms_raw_consume(raw, 1);
    ASSERT_EQ(0, (int)ms_raw_peek(raw, &p));
    /* The peer ends its side: nothing more comes, and what the handler sends still goes. */
    ms_memio_peer_close(&m, UV_EOF);
    ASSERT_EQ(MS_ECLOSED, (int)ms_raw_peek(raw, &p));
    ASSERT_EQ(0, ms_raw_send(raw, S("late"), MS_VEC_STATIC, -1));
    ASSERT_EQ(0, ms_raw_send(raw, S("r"), MS_VEC_STATIC, -1));
    ASSERT_HAS(output(&m), "\r\n\r\nlater");
    ASSERT_EQ(0, m.closed);
    /* The handler lets go: the connection closes, and the counts are back. */
    ms_raw_free(raw);
    ms_req_finish(raw_req);
    raw = NULL;
    ASSERT(m.closed != 0);
    ASSERT_EQ(0, (int)srv->websockets);
    ASSERT_EQ(0, (int)srv->stats->in_flight);
    ms_memio_free(&m);
    teardown();
}

/* The accept stage takes the protocol a transport agreed with the peer (TLS ALPN) instead of
 * looking at the first bytes. */
TEST(accept_takes_the_protocol_the_transport_agreed)
{
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    m.alpn = "http/1.1";
    ms_memio_feed(&m, MS_H2_PREFACE, MS_H2_PREFACE_LEN); /* a preface, spoken to HTTP/1.1 */
    ASSERT(strncmp(output(&m), "HTTP/1.1 4", 10) == 0);
    ASSERT(m.closed != 0);
    ms_memio_free(&m);
    ms_memio_open(srv, &m);
    m.alpn = "h2";
    ms_memio_feed(&m, S("GET / HTTP/1.1\r\nHost: h\r\n\r\n")); /* a request, to HTTP/2 */
    ASSERT(strstr(output(&m), "HTTP/1.1") == NULL);
    ASSERT(m.closed != 0);
    ASSERT_EQ(0, requests_seen);
    ms_memio_free(&m);
    teardown();
}

TEST_MAIN()

/* -- A WebSocket outlives its request -------------------------------------------------- */

/* A client's text frame with a zero mask (the payload goes as it is). */
static size_t ws_client_text(char *out, const char *text)
{
    size_t n = strlen(text);
    out[0] = (char)0x81;
    out[1] = (char)(0x80 | n);
    memset(out + 2, 0, 4);
    memcpy(out + 6, text, n);
    return 6 + n;
}

static void ws_expect(const char *text)
{
    int op = 0, code = 0;
    const char *d;
    size_t n;
    ASSERT_EQ(MS_WS_GOT, ms_ws_receive(ws, &op, &d, &n, &code));
    ASSERT_EQ(MS_WS_TEXT, op);
    ASSERT(n == strlen(text) && memcmp(d, text, n) == 0);
}

TEST(h1_a_websocket_takes_the_connection_over_and_gives_the_request_back)
{
    /* Once its handler finishes the request, the socket has the connection: the HTTP/1.1
     * state with the request and its pool go back to the worker, and frames go on. */
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    ms_memio_feed(&m, S("GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n"
                        "Connection: upgrade\r\n\r\n"));
    ASSERT(ws != NULL && parked != NULL);
    ASSERT_EQ(1, ms_ws_outlives(ws));
    ASSERT_HAS(output(&m), "HTTP/1.1 101 Switching Protocols\r\n");
    ms_h1_t *h = m.conn->pstate;
    ASSERT(h != NULL && &h->req == parked && m.conn->proto == &ms__h1_proto);
    uint32_t recycled = srv->h1->free.count;
    ASSERT_EQ(1, (int)srv->stats->in_flight);
    ms_req_finish(parked);
    parked = NULL;
    ASSERT(m.conn->proto == &ms__ws_proto && m.conn->pstate == (void *)ws);
#ifndef MS_ASAN
    /* back in the worker's recycle list, its pool reset to the one chunk it keeps */
    ASSERT_EQ(recycled + 1, srv->h1->free.count);
    ASSERT(srv->h1->free.head == h && h->req.pool.chunks != NULL && h->req.head.base == NULL &&
           h->req.tunnel == NULL && h->keeper == NULL);
#else
    (void)recycled;
#endif
    ASSERT_EQ(0, (int)srv->stats->in_flight);
    ASSERT_EQ(1, (int)srv->websockets);
    ASSERT(m.conn->pend == NULL && m.conn->flight == NULL); /* no reply queue between writes */
    char f[64];
    m.out.len = 0;
    ms_memio_feed(&m, f, ws_client_text(f, "hi"));
    ws_expect("hi");
    ASSERT_EQ(0, ms_ws_send(ws, MS_WS_TEXT, S("back"), MS_VEC_STATIC, -1));
    ASSERT_EQ(6, (int)m.out.len);
    ASSERT(memcmp(m.out.base, "\x81\x04" "back", 6) == 0);
    ASSERT(m.conn->pend == NULL && m.conn->flight == NULL);
    /* The handler lets go: close 1000, then the connection closes. */
    m.out.len = 0;
    ms_ws_free(ws);
    ws = NULL;
    ASSERT(m.out.len == 4 && memcmp(m.out.base, "\x88\x02\x03\xe8", 4) == 0);
    ASSERT_EQ(1, m.closed);
    ASSERT_EQ(0, (int)srv->websockets);
    ms_memio_free(&m);
    teardown();
}

TEST(h1_a_websocket_finished_in_its_handler_gets_the_frames_behind_its_head)
{
    /* The request finishes inside the read that brought it: the connection is handed over
     * once the read is done with the HTTP/1.1 state, with the frame that came behind. */
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    char in[256];
    size_t n = (size_t)snprintf(in, sizeof(in), "GET /ws-now HTTP/1.1\r\nHost: h\r\n"
                                "Upgrade: websocket\r\nConnection: upgrade\r\n\r\n");
    n += ws_client_text(in + n, "behind");
    ms_memio_feed(&m, in, n);
    ASSERT(ws != NULL);
    ASSERT(m.conn->proto == &ms__ws_proto && m.conn->pstate == (void *)ws);
    ASSERT_EQ(0, (int)srv->stats->in_flight);
    ws_expect("behind");
    /* The peer goes: the socket hears it, and the connection lives until it is let go. */
    ms_memio_peer_close(&m, UV_EOF);
    int op, code;
    const char *d;
    size_t len;
    ASSERT_EQ(MS_ECLOSED, ms_ws_receive(ws, &op, &d, &len, &code));
    ms_ws_free(ws);
    ws = NULL;
    ASSERT(m.closed != 0);
    ms_memio_free(&m);
    teardown();
}
