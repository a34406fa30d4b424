/* h2_test.c: the HTTP/2 engine fed bytes through the memory transport, talking to an
 * nghttp2 client session: streams as requests, bodies both ways, windows, resets, caps. */
#include "test.h"

#include <nghttp2/nghttp2.h>

#include "../../core/memio.h"
#include "../../core/h2.c"

#define S(lit) lit, sizeof(lit) - 1

static uv_loop_t loop;
static ms_server_t *srv;
static ms_memio_t m;
static ms_req_t *parked;
static int aborted_seen;

/* -- The server's handlers ------------------------------------------------------------------- */

static int path_is(ms_req_t *r, const char *p)
{
    return r->v.path.len == strlen(p) && memcmp(r->v.path.base, p, r->v.path.len) == 0;
}

static ms_buf_t echoed;
static char seen_fields[512]; /* /echo: "headers|trailers" as name=value; lists */

static void note_fields(ms_req_t *r)
{
    size_t k = 0;
    for (int i = 0; i < r->v.nheaders; i++)
        k += (size_t)snprintf(seen_fields + k, sizeof(seen_fields) - k, "%.*s=%.*s;",
                              (int)r->headers[i].name.len, r->headers[i].name.base,
                              (int)r->headers[i].value.len, r->headers[i].value.base);
    k += (size_t)snprintf(seen_fields + k, sizeof(seen_fields) - k, "|");
    for (int i = 0; i < r->ntrailers; i++)
        k += (size_t)snprintf(seen_fields + k, sizeof(seen_fields) - k, "%.*s=%.*s;",
                              (int)r->trailers[i].name.len, r->trailers[i].name.base,
                              (int)r->trailers[i].value.len, r->trailers[i].value.base);
}

static void echo_step(ms_req_t *r)
{
    for (;;) {
        const char *p;
        int64_t n = ms_req_body_take(r, &p);
        if (n > 0) {
            ms__buf_append(&echoed, p, (size_t)n);
            continue;
        }
        if (n == UV_EAGAIN && ms_req_wait_body(r) == 0)
            return;
        note_fields(r);
        ms_reply_send(r, echoed.base ? echoed.base : "", echoed.len, MS_VEC_OUT, -1);
        ms_req_finish(r);
        return;
    }
}

static void on_request(ms_req_t *r, void *data)
{
    (void)data;
    if (path_is(r, "/park")) {
        parked = r;
        return;
    }
    if (path_is(r, "/echo")) {
        echoed.len = 0;
        echo_step(r);
        return;
    }
    if (path_is(r, "/noread")) {
        parked = r; /* never reads its body */
        ms_req_wait_body(r);
        return;
    }
    if (path_is(r, "/stream")) {
        ms_reply_write(r, S("one "), MS_VEC_STATIC, -1);
        ms_reply_write(r, S("two"), MS_VEC_STATIC, -1);
        ms_req_finish(r);
        return;
    }
    char body[128];
    const ms_str_t *host = ms_req_header(r, S("host"));
    snprintf(body, sizeof(body), "v%d %.*s %.*s", r->v.version, (int)r->v.path.len, r->v.path.base,
             host ? (int)host->len : 0, host ? host->base : "");
    ms_reply_header(r, S("Content-Type"), S("text/plain"));
    ms_reply_header(r, S("Connection"), S("close")); /* must not reach an HTTP/2 client */
    ms_reply_send(r, body, strlen(body), MS_VEC_OUT, -1);
    ms_req_finish(r);
}

static void on_resume(ms_req_t *r, void *data)
{
    (void)data;
    if (r->v.flags & MS_REQ_ABORTED)
        aborted_seen++;
    if (path_is(r, "/echo"))
        echo_step(r);
}

/* -- The client ---------------------------------------------------------------------------- */

typedef struct reply_s {
    int status;
    char body[400000];
    size_t len;
    int closed;
    uint32_t error;
    int saw_connection_field, saw_date;
} reply_t;

static reply_t replies[32]; /* by stream id / 2 */
static nghttp2_session *client;
static int goaway_seen;

static reply_t *reply_of(int32_t id)
{
    return &replies[(id / 2) % 32];
}

static int c_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name, size_t nl,
                    const uint8_t *value, size_t vl, uint8_t flags, void *u)
{
    reply_t *rp = reply_of(f->hd.stream_id);
    if (nl == 7 && memcmp(name, ":status", 7) == 0)
        rp->status = atoi((const char *)value);
    if (nl == 10 && memcmp(name, "connection", 10) == 0)
        rp->saw_connection_field = 1;
    if (nl == 4 && memcmp(name, "date", 4) == 0)
        rp->saw_date = 1;
    return 0;
}

static int c_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *data, size_t len,
                  void *u)
{
    reply_t *rp = reply_of(id);
    if (rp->len + len <= sizeof(rp->body)) {
        memcpy(rp->body + rp->len, data, len);
        rp->len += len;
    }
    return 0;
}

static int c_close(nghttp2_session *s, int32_t id, uint32_t code, void *u)
{
    reply_of(id)->closed = 1;
    reply_of(id)->error = code;
    return 0;
}

static int c_frame(nghttp2_session *s, const nghttp2_frame *f, void *u)
{
    if (f->hd.type == NGHTTP2_GOAWAY)
        goaway_seen = 1;
    return 0;
}

/* Moves bytes both ways until neither side has anything more to say. */
static void pump(void)
{
    for (int round = 0; round < 1000; round++) {
        int moved = 0;
        uv_run(&loop, UV_RUN_NOWAIT); /* replies made outside a read leave once a turn */
        const uint8_t *p;
        ssize_t n;
        while ((n = nghttp2_session_mem_send(client, &p)) > 0) {
            ms_memio_feed(&m, (const char *)p, (size_t)n);
            moved = 1;
        }
        if (m.held.len > 0) {
            ms_memio_drain(&m);
            moved = 1;
        }
        if (m.out.len > 0) {
            nghttp2_session_mem_recv(client, (const uint8_t *)m.out.base, m.out.len);
            m.out.len = 0;
            moved = 1;
        }
        if (!moved)
            return;
    }
}

static void setup_limits(const ms_limits_t *lim)
{
    ms_log_set(NULL, MS_LOG_ERR);
    uv_loop_init(&loop);
    srv = ms_server_new(&loop, lim, on_request, on_resume, NULL);
    memset(replies, 0, sizeof(replies));
    parked = NULL;
    aborted_seen = goaway_seen = 0;
    echoed.len = 0;
    ms_memio_open(srv, &m);
    nghttp2_session_callbacks *cb;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_on_header_callback(cb, c_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, c_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, c_close);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, c_frame);
    nghttp2_session_client_new(&client, cb, NULL);
    nghttp2_session_callbacks_del(cb);
    nghttp2_submit_settings(client, NGHTTP2_FLAG_NONE, NULL, 0); /* after the client's preface */
}

static void setup(void)
{
    setup_limits(NULL);
}

static void teardown(void)
{
    nghttp2_session_del(client);
    if (m.conn != NULL)
        ms_memio_peer_close(&m, UV_ECONNRESET);
    ms_memio_free(&m);
    ms_server_free(srv);
    uv_loop_close(&loop);
    ms_mem_free(echoed.base);
    echoed.base = NULL;
    echoed.len = echoed.cap = 0;
}

typedef struct body_s {
    const char *p;
    size_t len, off;
    const nghttp2_nv *trailers; /* sent in a HEADERS frame after the body */
    size_t ntrailers;
} body_t;

static ssize_t body_read(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
                         nghttp2_data_source *src, void *u)
{
    body_t *b = src->ptr;
    size_t n = b->len - b->off < len ? b->len - b->off : len;
    memcpy(buf, b->p + b->off, n);
    b->off += n;
    if (b->off == b->len) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
        if (b->trailers != NULL) {
            *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
            nghttp2_submit_trailer(s, id, b->trailers, b->ntrailers);
        }
    }
    return (ssize_t)n;
}

static int32_t request(const char *method, const char *path, body_t *body)
{
    nghttp2_nv nva[] = {
        {(uint8_t *)":method", (uint8_t *)method, 7, strlen(method), 0},
        {(uint8_t *)":scheme", (uint8_t *)"http", 7, 4, 0},
        {(uint8_t *)":path", (uint8_t *)path, 5, strlen(path), 0},
        {(uint8_t *)":authority", (uint8_t *)"example.test", 10, 12, 0},
    };
    nghttp2_data_provider prd = {.source.ptr = body, .read_callback = body_read};
    return nghttp2_submit_request(client, NULL, nva, 4, body ? &prd : NULL, NULL);
}

/* -- Tests --------------------------------------------------------------------------------- */

TEST(h2_serves_streams_as_requests_with_the_authority_as_host)
{
    setup();
    int32_t a = request("GET", "/a", NULL), b = request("GET", "/b?x=1", NULL);
    pump();
    ASSERT_EQ(200, reply_of(a)->status);
    ASSERT_EQ(1, reply_of(a)->closed);
    ASSERT_STR_EQ("v20 /a example.test", reply_of(a)->body);
    ASSERT_STR_EQ("v20 /b example.test", reply_of(b)->body);
    ASSERT_EQ(0, reply_of(a)->saw_connection_field); /* hop-by-hop fields are not sent */
    ASSERT_EQ(1, reply_of(a)->saw_date);
    ASSERT_EQ(0, srv->stats.in_flight);
    teardown();
}

#define NV(n, v) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1, 0}

TEST(h2_keeps_trailers_apart_from_headers)
{
    setup();
    nghttp2_nv tr[] = {NV("x-forwarded-for", "6.6.6.6"), NV("cookie", "stolen")};
    body_t b = {"abc", 3, 0, tr, 2};
    seen_fields[0] = 0;
    int32_t id = request("POST", "/echo", &b);
    pump();
    ASSERT_EQ(200, reply_of(id)->status);
    ASSERT_STR_EQ("abc", reply_of(id)->body);
    ASSERT_STR_EQ("host=example.test;|x-forwarded-for=6.6.6.6;cookie=stolen;", seen_fields);
    teardown();
}

TEST(h2_holds_trailers_to_the_limits_of_header_fields)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.header_count = 4;
    setup_limits(&lim);
    nghttp2_nv tr[] = {NV("a", "1"), NV("b", "2"), NV("c", "3"), NV("d", "4"), NV("e", "5")};
    body_t b = {"abc", 3, 0, tr, 5};
    int32_t id = request("POST", "/echo", &b);
    pump();
    ASSERT_EQ(431, reply_of(id)->status);
    teardown();
}

TEST(h2_streams_a_reply_written_in_pieces)
{
    setup();
    int32_t id = request("GET", "/stream", NULL);
    pump();
    ASSERT_EQ(200, reply_of(id)->status);
    ASSERT_STR_EQ("one two", reply_of(id)->body);
    ASSERT_EQ(0, (int)reply_of(id)->error);
    teardown();
}

TEST(h2_echoes_a_body_larger_than_the_window_as_the_handler_reads_it)
{
    setup();
    static char big[300000];
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (char)('a' + i % 26);
    body_t b = {big, sizeof(big), 0, NULL, 0};
    int32_t id = request("POST", "/echo", &b);
    pump();
    ASSERT_EQ(200, reply_of(id)->status);
    ASSERT_EQ(sizeof(big), reply_of(id)->len);
    ASSERT(memcmp(big, reply_of(id)->body, sizeof(big)) == 0);
    teardown();
}

TEST(h2_a_handler_that_does_not_read_holds_the_client_back_at_the_window)
{
    setup();
    static char big[1 << 20];
    memset(big, 'z', sizeof(big));
    body_t b = {big, sizeof(big), 0, NULL, 0};
    request("POST", "/noread", &b);
    pump();
    ASSERT(parked != NULL);
    /* The window is all the client may send: the unread body stays within it. */
    ASSERT(parked->body.len <= H2_WINDOW);
    ASSERT(parked->body.len >= 65535);
    ASSERT(b.off < sizeof(big));
    ms_reply_send(parked, S("ok"), MS_VEC_STATIC, -1);
    ms_req_finish(parked);
    pump();
    teardown();
}

TEST(h2_a_reset_reaches_a_parked_handler_which_may_still_finish)
{
    setup();
    int32_t id = request("GET", "/park", NULL);
    pump();
    ASSERT(parked != NULL);
    nghttp2_submit_rst_stream(client, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
    pump();
    ASSERT(parked->v.flags & MS_REQ_ABORTED);
    ASSERT_EQ(0, ms_reply_send(parked, S("late"), MS_VEC_STATIC, -1));
    ms_req_finish(parked);
    ASSERT_EQ(0, srv->stats.in_flight);
    ASSERT_EQ(0, m.conn->h2->nstreams);
    int32_t next = request("GET", "/after", NULL);
    pump();
    ASSERT_EQ(200, reply_of(next)->status);
    teardown();
}

TEST(h2_over_in_flight_a_stream_gets_503_from_the_core)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.in_flight = 1;
    setup_limits(&lim);
    request("GET", "/park", NULL);
    int32_t second = request("GET", "/x", NULL);
    pump();
    ASSERT_EQ(503, reply_of(second)->status);
    ms_reply_send(parked, S("ok"), MS_VEC_STATIC, -1);
    ms_req_finish(parked);
    pump();
    teardown();
}

TEST(h2_a_header_list_over_head_bytes_gets_431)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.head_bytes = 1024;
    setup_limits(&lim);
    static char big[1500];
    memset(big, 'v', sizeof(big) - 1);
    nghttp2_nv nva[] = {
        {(uint8_t *)":method", (uint8_t *)"GET", 7, 3, 0},
        {(uint8_t *)":scheme", (uint8_t *)"http", 7, 4, 0},
        {(uint8_t *)":path", (uint8_t *)"/", 5, 1, 0},
        {(uint8_t *)":authority", (uint8_t *)"h", 10, 1, 0},
        {(uint8_t *)"x-big", (uint8_t *)big, 5, sizeof(big) - 1, 0},
    };
    int32_t id = nghttp2_submit_request(client, NULL, nva, 5, NULL, NULL);
    pump();
    ASSERT_EQ(431, reply_of(id)->status);
    ASSERT_EQ(0, srv->stats.requests); /* no handler ran */
    int32_t next = request("GET", "/ok", NULL);
    pump();
    ASSERT_EQ(200, reply_of(next)->status);
    teardown();
}

static void stopped(ms_server_t *s)
{
    (void)s;
}

TEST(h2_stop_sends_goaway_and_lets_a_stream_under_way_finish)
{
    setup();
    int32_t id = request("GET", "/park", NULL);
    pump();
    ms_server_stop(srv, stopped);
    pump();
    ASSERT_EQ(1, goaway_seen);
    ASSERT(m.conn != NULL);
    ms_reply_send(parked, S("finished"), MS_VEC_STATIC, -1);
    ms_req_finish(parked);
    pump();
    ASSERT_EQ(200, reply_of(id)->status);
    ASSERT_STR_EQ("finished", reply_of(id)->body);
    ASSERT(m.conn == NULL); /* nothing left: the connection closed */
    teardown();
}

TEST(h2_upgrades_an_http1_request_to_h2c)
{
    ms_log_set(NULL, MS_LOG_ERR);
    uv_loop_init(&loop);
    srv = ms_server_new(&loop, NULL, on_request, on_resume, NULL);
    memset(replies, 0, sizeof(replies));
    ms_memio_open(srv, &m);
    nghttp2_session_callbacks *cb;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_on_header_callback(cb, c_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, c_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, c_close);
    nghttp2_session_client_new(&client, cb, NULL);
    nghttp2_session_callbacks_del(cb);
    /* HTTP2-Settings of an empty SETTINGS payload: "" in base64url. */
    ms_memio_feed(&m,
                  S("GET /up HTTP/1.1\r\nHost: up.test\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                    "Upgrade: h2c\r\nHTTP2-Settings: \r\n\r\n"));
    ms__buf_append(&m.out, "", 1);
    ASSERT_HAS(m.out.base, "HTTP/1.1 101 Switching Protocols\r\n");
    const char *frames = strstr(m.out.base, "\r\n\r\n") + 4;
    size_t rest = m.out.len - 1 - (size_t)(frames - m.out.base);
    memmove(m.out.base, frames, rest);
    m.out.len = rest;
    ASSERT_EQ(0, nghttp2_session_upgrade2(client, NULL, 0, 0, NULL));
    ms_memio_feed(&m, MS_H2_PREFACE, MS_H2_PREFACE_LEN);
    nghttp2_submit_settings(client, NGHTTP2_FLAG_NONE, NULL, 0);
    pump();
    ASSERT_EQ(200, reply_of(1)->status);
    ASSERT_STR_EQ("v20 /up up.test", reply_of(1)->body);
    teardown();
}

TEST_MAIN()
