/* h2_test.c: the HTTP/2 engine fed bytes through the memory transport, talking to an
 * nghttp2 client session: streams as requests, bodies both ways, windows, resets, caps. */
#include "test.h"

#include <nghttp2/nghttp2.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../../core/transport/memio.h"
#include "../../../core/http/h2.c"
#include "fields.h"
#include "tunnel.h"

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
static echo_tunnel_t tunnel;  /* /tunnel's taker */
static char seen_fields[512]; /* /echo: "headers|trailers" as name=value; lists */

static int fields_rc[8];

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
        note_fields(r, seen_fields, sizeof(seen_fields));
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
    if (path_is(r, "/tunnel")) {
        ms_req_tunnel(r, echo_tunnel(&tunnel));
        return;
    }
    if (path_is(r, "/noread")) {
        parked = r; /* never reads its body */
        ms_req_wait_body(r);
        return;
    }
    if (path_is(r, "/replywait")) {
        parked = r; /* answers, then waits for a body that does not come */
        ms_reply_send(r, S("early"), MS_VEC_STATIC, -1);
        ms_req_wait_body(r);
        return;
    }
    if (path_is(r, "/fields")) {
        /* Lines that are not whole field lines are refused, whatever else is right. */
        fields_rc[0] = ms_reply_field(r, S("x-a: 1"));
        fields_rc[1] = ms_reply_field(r, S("x-b: 2\r\nx-c: 3"));
        fields_rc[2] = ms_reply_field(r, S("x d: 4\r\n"));
        fields_rc[3] = ms_reply_field(r, S("x-e: 5\n"));
        fields_rc[4] = ms_reply_field(r, S("x-f: 6\r7\r\n"));
        fields_rc[5] = ms_reply_field(r, "x-g: \0\r\n", 8);
        fields_rc[6] = ms_reply_field(r, S(": 8\r\n"));
        fields_rc[7] = ms_reply_field(r, S("x-ok: 9\r\nx-ok2:10\r\n"));
        ms_reply_send(r, S("fields"), MS_VEC_STATIC, -1);
        ms_req_finish(r);
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
    int saw_ok2;
    char body[400000];
    size_t len;
    int closed;
    uint32_t error;
    int rst; /* RST_STREAM frames received */
    int saw_connection_field, saw_date;
    char ctype[64]; /* the reply's content-type */
} reply_t;

static reply_t replies[32]; /* by stream id / 2 */
static nghttp2_session *client;
static int goaway_seen;        /* GOAWAY frames the client got */
static int32_t goaway_last_id; /* the last one's last stream id */

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
    if (nl == 12 && memcmp(name, "content-type", 12) == 0 && vl < sizeof(rp->ctype)) {
        memcpy(rp->ctype, value, vl);
        rp->ctype[vl] = 0;
    }
    if (nl == 5 && memcmp(name, "x-ok2", 5) == 0 && vl == 2 && memcmp(value, "10", 2) == 0)
        rp->saw_ok2 = 1;
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
    if (f->hd.type == NGHTTP2_RST_STREAM)
        reply_of(f->hd.stream_id)->rst++;
    if (f->hd.type == NGHTTP2_GOAWAY) {
        goaway_seen++;
        goaway_last_id = f->goaway.last_stream_id;
    }
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

/* A body that never comes: the client's side of the stream stays open. */
static ssize_t body_never(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
                          nghttp2_data_source *src, void *u)
{
    return NGHTTP2_ERR_DEFERRED;
}

static int32_t request_scheme(const char *method, const char *scheme, const char *path,
                              body_t *body)
{
    nghttp2_nv nva[] = {
        {(uint8_t *)":method", (uint8_t *)method, 7, strlen(method), 0},
        {(uint8_t *)":scheme", (uint8_t *)scheme, 7, strlen(scheme), 0},
        {(uint8_t *)":path", (uint8_t *)path, 5, strlen(path), 0},
        {(uint8_t *)":authority", (uint8_t *)"example.test", 10, 12, 0},
    };
    nghttp2_data_provider prd = {.source.ptr = body,
                                 .read_callback =
                                     body != NULL && body->p == NULL ? body_never : body_read};
    return nghttp2_submit_request(client, NULL, nva, 4, body ? &prd : NULL, NULL);
}

static int32_t request(const char *method, const char *path, body_t *body)
{
    return request_scheme(method, "http", path, body);
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
    ASSERT_EQ(0, srv->stats->in_flight);
    teardown();
}

#define NV(n, v)                                                                                   \
    {                                                                                              \
        (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1, 0                            \
    }

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
    ASSERT_EQ(0, srv->stats->in_flight);
    ASSERT_EQ(0, h2_of(m.conn)->nstreams);
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

/* A POST declaring a body over body_bytes_max, with `accept` (NULL: none). */
static int32_t post_too_large(const char *accept)
{
    nghttp2_nv nva[] = {
        {(uint8_t *)":method", (uint8_t *)"POST", 7, 4, 0},
        {(uint8_t *)":scheme", (uint8_t *)"http", 7, 4, 0},
        {(uint8_t *)":path", (uint8_t *)"/echo", 5, 5, 0},
        {(uint8_t *)":authority", (uint8_t *)"h", 10, 1, 0},
        {(uint8_t *)"content-length", (uint8_t *)"100000", 14, 6, 0},
        {(uint8_t *)"accept", (uint8_t *)accept, 6, accept ? strlen(accept) : 0, 0},
    };
    static body_t never = {.p = NULL};
    nghttp2_data_provider prd = {.source.ptr = &never, .read_callback = body_never};
    return nghttp2_submit_request(client, NULL, nva, accept ? 6 : 5, &prd, NULL);
}

/* The app's refusal bodies, chosen by Accept, as on HTTP/1.1; the core's text where none. */
TEST(h2_answers_refusals_with_the_app_bodies_chosen_by_accept)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.body_bytes_max = lim.body_bytes = 1000;
    setup_limits(&lim);
    static const char json[] = "{\"error\":\"too large\"}", html[] = "<h1>Too large</h1>";
    static const char text[] = "too large\n";
    ASSERT_EQ(0, ms_server_refusal_body(srv, 413, MS_REFUSAL_JSON, S(json)));
    ASSERT_EQ(0, ms_server_refusal_body(srv, 413, MS_REFUSAL_HTML, S(html)));
    ASSERT_EQ(0, ms_server_refusal_body(srv, 413, MS_REFUSAL_TEXT, S(text)));
    int32_t a = post_too_large("application/json"), b = post_too_large("text/html"),
            c = post_too_large("*/*"), d = post_too_large(NULL);
    pump();
    ASSERT_EQ(413, reply_of(a)->status);
    ASSERT_STR_EQ("application/json", reply_of(a)->ctype);
    ASSERT_EQ(strlen(json), reply_of(a)->len);
    ASSERT(memcmp(reply_of(a)->body, json, strlen(json)) == 0);
    ASSERT_EQ(413, reply_of(b)->status);
    ASSERT_STR_EQ("text/html; charset=utf-8", reply_of(b)->ctype);
    ASSERT_EQ(strlen(html), reply_of(b)->len);
    ASSERT(memcmp(reply_of(b)->body, html, strlen(html)) == 0);
    for (int32_t id = c; id <= d; id += 2) {
        ASSERT_EQ(413, reply_of(id)->status);
        ASSERT_STR_EQ("text/plain; charset=utf-8", reply_of(id)->ctype);
        ASSERT_EQ(strlen(text), reply_of(id)->len);
        ASSERT(memcmp(reply_of(id)->body, text, strlen(text)) == 0);
    }
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
    ASSERT_EQ(0, srv->stats->requests); /* no handler ran */
    int32_t next = request("GET", "/ok", NULL);
    pump();
    ASSERT_EQ(200, reply_of(next)->status);
    teardown();
}

TEST(h2_resets_a_path_without_a_leading_slash_and_a_scheme_other_than_http)
{
    setup();
    /* nghttp2 checks :path only for http and https: with another scheme, "Xadmin/secret"
     * would have reached the handler, and the router served it as /admin/secret. */
    int32_t a = request_scheme("GET", "foo", "Xadmin/secret", NULL);
    int32_t b = request_scheme("GET", "foo", "/admin/secret", NULL);
    int32_t c = request_scheme("GET", "foo", "*", NULL);
    int32_t d = request_scheme("OPTIONS", "http", "*", NULL);
    pump();
    int32_t bad[] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(0, reply_of(bad[i])->status);
        ASSERT_EQ(1, reply_of(bad[i])->closed);
        ASSERT_EQ(NGHTTP2_PROTOCOL_ERROR, (int)reply_of(bad[i])->error);
    }
    ASSERT_EQ(200, reply_of(d)->status); /* OPTIONS * is a request */
    ASSERT_STR_EQ("v20 * example.test", reply_of(d)->body);
    ASSERT_EQ(1, srv->stats->requests); /* only OPTIONS * reached a handler */
    ASSERT_EQ(0, goaway_seen);
    teardown();
}

static void run_for(uint64_t ms);

TEST(h2_a_stream_the_client_never_ends_is_reset_at_discard_timeout_once_answered)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.discard_timeout_ms = 100;
    setup_limits(&lim);
    body_t never = {NULL, 0, 0, NULL, 0};
    int32_t ids[4];
    for (int i = 0; i < 4; i++)
        ids[i] = request("POST", "/x", &never);
    pump();
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(200, reply_of(ids[i])->status);
        ASSERT_EQ(0, reply_of(ids[i])->closed); /* the rest of the body would be dropped */
    }
    ASSERT_EQ(4, h2_of(m.conn)->nstreams);
    run_for(150);
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(1, reply_of(ids[i])->closed); /* RST_STREAM(NO_ERROR), RFC 9113 8.1 */
        ASSERT_EQ(1, reply_of(ids[i])->rst);
        ASSERT_EQ(NGHTTP2_NO_ERROR, (int)reply_of(ids[i])->error);
    }
    ASSERT_EQ(0, h2_of(m.conn)->nstreams); /* nothing held for a client that stays silent */
    ASSERT_EQ(0, srv->stats->in_flight);
    ASSERT_EQ(0, goaway_seen);
    teardown();
}

/* An early reply (the handler answers without reading): what the client still sends is read
 * and dropped, so a body within discard_bytes ends its stream as usual, with no reset that
 * a client could take for a failure; past discard_bytes the stream is reset (NO_ERROR). */
TEST(h2_an_early_reply_drops_the_rest_of_the_body_up_to_discard_bytes)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.discard_bytes = 100000;
    setup_limits(&lim);
    static char big[400000];
    memset(big, 'b', sizeof(big));
    body_t within = {big, 90000, 0, NULL, 0}, over = {big, sizeof(big), 0, NULL, 0};
    int32_t a = request("POST", "/x", &within), b = request("POST", "/x", &over);
    pump();
    ASSERT_EQ(200, reply_of(a)->status);
    ASSERT_STR_EQ("v20 /x example.test", reply_of(a)->body);
    ASSERT_EQ(1, reply_of(a)->closed);
    ASSERT_EQ(0, reply_of(a)->rst); /* both sides ended it */
    ASSERT_EQ(within.len, within.off);
    ASSERT_EQ(200, reply_of(b)->status);
    ASSERT_STR_EQ("v20 /x example.test", reply_of(b)->body);
    ASSERT_EQ(1, reply_of(b)->closed);
    ASSERT_EQ(1, reply_of(b)->rst);
    ASSERT_EQ(NGHTTP2_NO_ERROR, (int)reply_of(b)->error);
    ASSERT(over.off > lim.discard_bytes && over.off < over.len); /* stopped past the bound */
    ASSERT_EQ(0, h2_of(m.conn)->nstreams);
    ASSERT_EQ(0, goaway_seen);
    teardown();
}

TEST(h2_a_handler_that_replied_and_waits_for_the_body_wakes_on_reset)
{
    setup();
    body_t never = {NULL, 0, 0, NULL, 0};
    int32_t id = request("POST", "/replywait", &never);
    pump();
    ASSERT(parked != NULL);
    ASSERT_EQ(200, reply_of(id)->status);
    ASSERT_EQ(MS_WAIT_BODY, parked->v.wait);
    nghttp2_submit_rst_stream(client, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
    pump();
    ASSERT_EQ(1, aborted_seen);
    ASSERT_EQ(MS_WAIT_NONE, parked->v.wait);
    const char *p;
    ASSERT_EQ(MS_ECLOSED, (int)ms_req_body_take(parked, &p));
    ms_req_finish(parked);
    ASSERT_EQ(0, h2_of(m.conn)->nstreams);
    teardown();
}

/* Runs the loop for `ms` milliseconds of its own time, moving bytes as they come. */
static void run_for(uint64_t ms)
{
    uv_update_time(&loop);
    uint64_t until = uv_now(&loop) + ms;
    while (uv_now(&loop) < until) {
        pump();
        usleep(5000);
        uv_update_time(&loop);
        uv_run(&loop, UV_RUN_NOWAIT);
    }
    pump();
}

typedef struct drip_s {
    int sent, allowed;
} drip_t;

/* One byte of body each time the test allows one, of a content-length it never reaches. */
static ssize_t body_drip(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
                         nghttp2_data_source *src, void *u)
{
    drip_t *d = src->ptr;
    if (d->sent == d->allowed)
        return NGHTTP2_ERR_DEFERRED;
    buf[0] = 'x';
    d->sent++;
    return 1;
}

TEST(h2_a_body_below_body_min_rate_gets_408_and_a_reset_while_the_connection_goes_on)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.body_timeout_ms = 100;
    lim.body_min_rate = 4096;
    setup_limits(&lim);
    drip_t d = {0, 1};
    nghttp2_nv nva[] = {
        {(uint8_t *)":method", (uint8_t *)"POST", 7, 4, 0},
        {(uint8_t *)":scheme", (uint8_t *)"http", 7, 4, 0},
        {(uint8_t *)":path", (uint8_t *)"/echo", 5, 5, 0},
        {(uint8_t *)":authority", (uint8_t *)"example.test", 10, 12, 0},
        {(uint8_t *)"content-length", (uint8_t *)"100000", 14, 6, 0},
    };
    nghttp2_data_provider prd = {.source.ptr = &d, .read_callback = body_drip};
    int32_t id = nghttp2_submit_request(client, NULL, nva, 5, &prd, NULL);
    pump();
    for (int i = 0; i < 6 && !reply_of(id)->closed; i++) {
        run_for(40); /* a byte every 40 ms: 25 bytes a second, far below body_min_rate */
        d.allowed++;
        nghttp2_session_resume_data(client, id);
    }
    ASSERT_EQ(408, reply_of(id)->status);
    ASSERT_EQ(1, reply_of(id)->closed);
    ASSERT_EQ(NGHTTP2_NO_ERROR, (int)reply_of(id)->error);
    ASSERT(d.sent < 6);
    ASSERT(m.conn != NULL); /* the connection goes on */
    ASSERT_EQ(0, goaway_seen);
    int32_t next = request("GET", "/after", NULL);
    pump();
    ASSERT_EQ(200, reply_of(next)->status);
    ASSERT_EQ(0, srv->stats->in_flight);
    teardown();
}

TEST(h2_a_body_that_keeps_body_min_rate_may_take_longer_than_body_timeout)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.body_timeout_ms = 100;
    lim.body_min_rate = 10; /* bytes a second: a byte every 40 ms is 25 */
    setup_limits(&lim);
    drip_t d = {0, 1};
    nghttp2_nv nva[] = {
        {(uint8_t *)":method", (uint8_t *)"POST", 7, 4, 0},
        {(uint8_t *)":scheme", (uint8_t *)"http", 7, 4, 0},
        {(uint8_t *)":path", (uint8_t *)"/echo", 5, 5, 0},
        {(uint8_t *)":authority", (uint8_t *)"example.test", 10, 12, 0},
    };
    nghttp2_data_provider prd = {.source.ptr = &d, .read_callback = body_drip};
    int32_t id = nghttp2_submit_request(client, NULL, nva, 4, &prd, NULL);
    pump();
    for (int i = 0; i < 8; i++) {
        run_for(40);
        d.allowed++;
        nghttp2_session_resume_data(client, id);
    }
    ASSERT_EQ(0, reply_of(id)->status); /* 320 ms, past body_timeout: still read */
    ASSERT_EQ(0, reply_of(id)->closed);
    nghttp2_submit_rst_stream(client, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
    pump();
    teardown();
}

/* Appends a frame header to `b`. */
static void put_frame_head(ms_buf_t *b, size_t len, int type, int flags, uint32_t id)
{
    uint8_t hd[9] = {(uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len,
                     (uint8_t)type,        (uint8_t)flags,      (uint8_t)(id >> 24),
                     (uint8_t)(id >> 16),  (uint8_t)(id >> 8),  (uint8_t)id};
    ms__buf_append(b, (const char *)hd, 9);
}

/* A GET's header block of literal fields (no indexing, no Huffman coding). */
static size_t get_block(char *out, const char *path)
{
    size_t n = 0, pl = strlen(path);
    static const char head[] = "\x00\x07:method\x03GET\x00\x07:scheme\x04http"
                               "\x00\x0a:authority\x01h\x00\x05:path";
    memcpy(out, head, sizeof(head) - 1);
    n = sizeof(head) - 1;
    out[n++] = (char)pl;
    memcpy(out + n, path, pl);
    return n + pl;
}

/* The frames of type `type` on stream `id` in what the server wrote; the last one's error
 * code in *code (RST_STREAM, GOAWAY). */
static int frames_of(const ms_buf_t *out, int type, uint32_t id, uint32_t *code)
{
    int k = 0;
    const uint8_t *p = (const uint8_t *)out->base;
    for (size_t off = 0; off + 9 <= out->len;) {
        size_t len = (size_t)p[off] << 16 | (size_t)p[off + 1] << 8 | p[off + 2];
        uint32_t sid = (uint32_t)p[off + 5] << 24 | (uint32_t)p[off + 6] << 16 |
                       (uint32_t)p[off + 7] << 8 | p[off + 8];
        if (p[off + 3] == type && (sid & 0x7fffffff) == id) {
            k++;
            const uint8_t *c = p + off + 9 + (type == NGHTTP2_GOAWAY ? 4 : 0);
            if (code != NULL)
                *code = (uint32_t)c[0] << 24 | (uint32_t)c[1] << 16 | (uint32_t)c[2] << 8 | c[3];
        }
        off += 9 + len;
    }
    return k;
}

TEST(h2_a_stream_that_depends_on_itself_is_reset_in_a_frame_split_anywhere)
{
    /* Stream 1 parks; PRIORITY makes 1 depend on 1; HEADERS (PADDED | PRIORITY) opens 3
     * depending on 3; stream 5 is a plain GET. Fed whole, then a byte a read. */
    ms_buf_t in = {0};
    char block[64];
    ms__buf_append(&in, MS_H2_PREFACE, MS_H2_PREFACE_LEN);
    put_frame_head(&in, 0, NGHTTP2_SETTINGS, 0, 0);
    size_t bl = get_block(block, "/park");
    put_frame_head(&in, bl, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS, 1);
    ms__buf_append(&in, block, bl);
    put_frame_head(&in, 5, NGHTTP2_PRIORITY, 0, 1);
    ms__buf_append(&in, "\x80\x00\x00\x01\x10", 5);
    bl = get_block(block, "/x");
    put_frame_head(&in, 1 + 5 + bl + 2, NGHTTP2_HEADERS,
                   NGHTTP2_FLAG_END_HEADERS | NGHTTP2_FLAG_END_STREAM | NGHTTP2_FLAG_PADDED |
                       NGHTTP2_FLAG_PRIORITY,
                   3);
    ms__buf_append(&in, "\x02\x00\x00\x00\x03\x10", 6);
    ms__buf_append(&in, block, bl);
    ms__buf_append(&in, "\x00\x00", 2);
    bl = get_block(block, "/ok");
    put_frame_head(&in, bl, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS | NGHTTP2_FLAG_END_STREAM, 5);
    ms__buf_append(&in, block, bl);
    for (int bytewise = 0; bytewise < 2; bytewise++) {
        setup();
        if (bytewise)
            for (size_t i = 0; i < in.len; i++)
                ms_memio_feed(&m, in.base + i, 1);
        else
            ms_memio_feed(&m, in.base, in.len);
        uv_run(&loop, UV_RUN_NOWAIT);
        uint32_t code = 0xff;
        ASSERT_EQ(1, frames_of(&m.out, NGHTTP2_RST_STREAM, 1, &code));
        ASSERT_EQ(NGHTTP2_PROTOCOL_ERROR, (int)code);
        ASSERT(parked != NULL);
        ASSERT(parked->v.flags & MS_REQ_ABORTED);
        code = 0xff;
        ASSERT_EQ(1, frames_of(&m.out, NGHTTP2_RST_STREAM, 3, &code));
        ASSERT_EQ(NGHTTP2_PROTOCOL_ERROR, (int)code);
        ASSERT_EQ(0, frames_of(&m.out, NGHTTP2_HEADERS, 3, NULL)); /* never served */
        ASSERT_EQ(1, frames_of(&m.out, NGHTTP2_HEADERS, 5, NULL));
        ASSERT_EQ(0, frames_of(&m.out, NGHTTP2_GOAWAY, 0, NULL));
        ASSERT_EQ(2, srv->stats->requests);
        ms_req_finish(parked);
        m.out.len = 0;
        teardown();
    }
    ms_mem_free(in.base);
}

/* Frames on streams nghttp2 has forgotten, and PRIORITY frames it drops unread: `first`
 * (after the preface and SETTINGS) is fed and answered, then `then`, each whole or a byte a
 * read. Returns how many frames of `type` on stream `id` the server wrote, the last one's
 * code in *code; *served: whether a GET on stream 101 sent after all was answered. */
static int closed_case(const ms_buf_t *first, const ms_buf_t *then, int bytewise, int type,
                       uint32_t id, uint32_t *code, int *served)
{
    ms_buf_t in = {0};
    char block[64];
    ms__buf_append(&in, MS_H2_PREFACE, MS_H2_PREFACE_LEN);
    put_frame_head(&in, 0, NGHTTP2_SETTINGS, 0, 0);
    ms__buf_append(&in, first->base, first->len);
    setup();
    for (int part = 0; part < 2; part++) {
        const ms_buf_t *b = part == 0 ? &in : then;
        if (bytewise)
            for (size_t i = 0; i < b->len && m.conn != NULL; i++)
                ms_memio_feed(&m, b->base + i, 1);
        else if (m.conn != NULL)
            ms_memio_feed(&m, b->base, b->len);
        uv_run(&loop, UV_RUN_NOWAIT);
    }
    if (m.conn != NULL) {
        ms_buf_t last = {0};
        size_t bl = get_block(block, "/after");
        put_frame_head(&last, bl, NGHTTP2_HEADERS,
                       NGHTTP2_FLAG_END_HEADERS | NGHTTP2_FLAG_END_STREAM, 101);
        ms__buf_append(&last, block, bl);
        ms_memio_feed(&m, last.base, last.len);
        uv_run(&loop, UV_RUN_NOWAIT);
        ms_mem_free(last.base);
    }
    *served = frames_of(&m.out, NGHTTP2_HEADERS, 101, NULL);
    *code = 0xff;
    int k = frames_of(&m.out, type, id, code);
    m.out.len = 0;
    teardown();
    ms_mem_free(in.base);
    return k;
}

static void put_get(ms_buf_t *b, uint32_t id, const char *path, int flags)
{
    char block[64];
    size_t bl = get_block(block, path);
    put_frame_head(b, bl, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS | flags, id);
    ms__buf_append(b, block, bl);
}

static void put_data(ms_buf_t *b, uint32_t id, int flags)
{
    put_frame_head(b, 3, NGHTTP2_DATA, flags, id);
    ms__buf_append(b, "abc", 3);
}

TEST(h2_answers_frames_on_closed_streams_as_rfc_9113_5_1_says)
{
    for (int bytewise = 0; bytewise < 2; bytewise++) {
        ms_buf_t ended = {0}, open = {0}, data = {0}, headers = {0}, reset = {0}, lower = {0};
        ms_buf_t ours = {0}, none = {0};
        uint32_t code;
        int served;
        put_get(&ended, 1, "/x", NGHTTP2_FLAG_END_STREAM); /* answered: both sides ended it */
        put_get(&open, 1, "/x", 0);                        /* answered, its body still open */
        put_data(&data, 1, 0);
        put_get(&headers, 1, "/x", NGHTTP2_FLAG_END_STREAM);
        /* Closed by both ends: DATA or HEADERS is a connection error STREAM_CLOSED (5.1). */
        ASSERT_EQ(1, closed_case(&ended, &data, bytewise, NGHTTP2_GOAWAY, 0, &code, &served));
        ASSERT_EQ(NGHTTP2_STREAM_CLOSED, (int)code);
        ASSERT_EQ(0, served);
        ASSERT_EQ(1, closed_case(&ended, &headers, bytewise, NGHTTP2_GOAWAY, 0, &code, &served));
        ASSERT_EQ(NGHTTP2_STREAM_CLOSED, (int)code);
        /* Reset by the client, then DATA or HEADERS in the same read: a stream error. */
        put_frame_head(&reset, 4, NGHTTP2_RST_STREAM, 0, 1);
        ms__buf_append(&reset, "\0\0\0\x08", 4);
        ms__buf_append(&reset, data.base, data.len);
        ms__buf_append(&reset, headers.base, headers.len);
        ASSERT_EQ(2, closed_case(&open, &reset, bytewise, NGHTTP2_RST_STREAM, 1, &code, &served));
        ASSERT_EQ(NGHTTP2_STREAM_CLOSED, (int)code);
        ASSERT_EQ(1, served); /* the connection goes on */
        ASSERT_EQ(0, closed_case(&open, &reset, bytewise, NGHTTP2_GOAWAY, 0, &code, &served));
        /* A HEADERS frame on a stream id below one already used, in the same read or the
         * next: a connection error PROTOCOL_ERROR (5.1.1). */
        put_get(&lower, 5, "/x", NGHTTP2_FLAG_END_STREAM);
        put_get(&lower, 3, "/x", NGHTTP2_FLAG_END_STREAM);
        ASSERT_EQ(1, closed_case(&lower, &none, bytewise, NGHTTP2_GOAWAY, 0, &code, &served));
        ASSERT_EQ(NGHTTP2_PROTOCOL_ERROR, (int)code);
        ASSERT_EQ(0, closed_case(&lower, &none, bytewise, NGHTTP2_HEADERS, 3, &code, &served));
        /* A stream we reset (a :path without its /): what the client had sent is ignored. */
        put_get(&ours, 1, "x", 0);
        ASSERT_EQ(1, closed_case(&ours, &data, bytewise, NGHTTP2_RST_STREAM, 1, &code, &served));
        ASSERT_EQ(NGHTTP2_PROTOCOL_ERROR, (int)code);
        ASSERT_EQ(1, served);
        ASSERT_EQ(0, closed_case(&ours, &data, bytewise, NGHTTP2_GOAWAY, 0, &code, &served));
        ms_mem_free(ended.base), ms_mem_free(open.base), ms_mem_free(data.base);
        ms_mem_free(headers.base), ms_mem_free(reset.base), ms_mem_free(lower.base);
        ms_mem_free(ours.base);
    }
}

TEST(h2_a_frame_that_stops_the_pre_scan_still_counts_for_the_frames_after_it)
{
    /* The pre-scan hands nghttp2 what came before a frame it must look at (split across
     * reads, depending on itself, or on a closed stream), then that frame's start; the
     * frames after it in the same read must still see that frame's HEADERS id and
     * END_STREAM or RST_STREAM (RFC 9113 5.1, 5.1.1). */
    for (int bytewise = 0; bytewise < 2; bytewise++) {
        ms_buf_t selfdep = {0}, split = {0}, rest = {0}, open = {0}, rst = {0}, rst_rest = {0};
        ms_buf_t none = {0};
        char block[64];
        uint32_t code;
        int served;
        /* HEADERS 5 depending on itself (reset), then HEADERS 3: below an id already used. */
        size_t bl = get_block(block, "/x");
        put_frame_head(&selfdep, 5 + bl, NGHTTP2_HEADERS,
                       NGHTTP2_FLAG_END_HEADERS | NGHTTP2_FLAG_END_STREAM | NGHTTP2_FLAG_PRIORITY,
                       5);
        ms__buf_append(&selfdep, "\x00\x00\x00\x05\x10", 5);
        ms__buf_append(&selfdep, block, bl);
        put_get(&selfdep, 3, "/x", NGHTTP2_FLAG_END_STREAM);
        ASSERT_EQ(1, closed_case(&selfdep, &none, bytewise, NGHTTP2_GOAWAY, 0, &code, &served));
        ASSERT_EQ(NGHTTP2_PROTOCOL_ERROR, (int)code);
        ASSERT_EQ(0, served);
        ASSERT_EQ(0, closed_case(&selfdep, &none, bytewise, NGHTTP2_HEADERS, 3, &code, &served));
        /* HEADERS 5 split across two reads, HEADERS 3 in the read that ends it. */
        put_get(&split, 5, "/x", NGHTTP2_FLAG_END_STREAM);
        ms__buf_append(&rest, split.base + 4, split.len - 4);
        put_get(&rest, 3, "/x", NGHTTP2_FLAG_END_STREAM);
        split.len = 4;
        ASSERT_EQ(1, closed_case(&split, &rest, bytewise, NGHTTP2_GOAWAY, 0, &code, &served));
        ASSERT_EQ(NGHTTP2_PROTOCOL_ERROR, (int)code);
        ASSERT_EQ(0, closed_case(&split, &rest, bytewise, NGHTTP2_HEADERS, 3, &code, &served));
        /* Stream 1 open; RST_STREAM on 1 split across two reads, DATA on 1 in the read that
         * ends it: a stream error STREAM_CLOSED (5.1), and the connection goes on. */
        put_get(&open, 1, "/x", 0);
        put_frame_head(&rst, 4, NGHTTP2_RST_STREAM, 0, 1);
        ms__buf_append(&rst, "\0\0\0\x08", 4);
        ms__buf_append(&rst_rest, rst.base + 5, rst.len - 5);
        put_data(&rst_rest, 1, 0);
        rst.len = 5;
        ms__buf_append(&open, rst.base, rst.len);
        ASSERT_EQ(1,
                  closed_case(&open, &rst_rest, bytewise, NGHTTP2_RST_STREAM, 1, &code, &served));
        ASSERT_EQ(NGHTTP2_STREAM_CLOSED, (int)code);
        ASSERT_EQ(1, served);
        ms_mem_free(selfdep.base), ms_mem_free(split.base), ms_mem_free(rest.base);
        ms_mem_free(open.base), ms_mem_free(rst.base), ms_mem_free(rst_rest.base);
    }
}

TEST(h2_a_first_stream_id_of_2_31_minus_1_is_served_and_closes_the_id_space_below)
{
    /* The highest stream id first (RFC 9113 5.1.1): the window of closed ids moves by 2^30,
     * counted without overflow; a HEADERS on a lower id after it is a PROTOCOL_ERROR. */
    for (int bytewise = 0; bytewise < 2; bytewise++) {
        ms_buf_t top = {0}, lower = {0};
        uint32_t code;
        int served;
        put_get(&top, 0x7fffffff, "/x", NGHTTP2_FLAG_END_STREAM);
        put_get(&lower, 0x7ffffffd, "/x", NGHTTP2_FLAG_END_STREAM); /* (skipped: unused) */
        ASSERT_EQ(1,
                  closed_case(&top, &lower, bytewise, NGHTTP2_HEADERS, 0x7fffffff, &code, &served));
        ASSERT_EQ(1, closed_case(&top, &lower, bytewise, NGHTTP2_GOAWAY, 0, &code, &served));
        ASSERT_EQ(NGHTTP2_PROTOCOL_ERROR, (int)code);
        ASSERT_EQ(0, served);
        ms_mem_free(top.base), ms_mem_free(lower.base);
    }
}

TEST(h2_priority_on_stream_0_or_an_idle_stream_on_itself_is_a_connection_error)
{
    for (int bytewise = 0; bytewise < 2; bytewise++) {
        ms_buf_t zero = {0}, idle = {0}, none = {0};
        uint32_t code;
        int served;
        /* RFC 9113 6.3: PRIORITY on stream 0 (nghttp2 drops PRIORITY unread). */
        put_frame_head(&zero, 5, NGHTTP2_PRIORITY, 0, 0);
        ms__buf_append(&zero, "\0\0\0\x01\x10", 5);
        ASSERT_EQ(1, closed_case(&zero, &none, bytewise, NGHTTP2_GOAWAY, 0, &code, &served));
        ASSERT_EQ(NGHTTP2_PROTOCOL_ERROR, (int)code);
        ASSERT_EQ(0, served);
        /* 5.3.1: stream 7, idle, made to depend on itself: an idle stream cannot be reset. */
        put_frame_head(&idle, 5, NGHTTP2_PRIORITY, 0, 7);
        ms__buf_append(&idle, "\0\0\0\x07\x10", 5);
        ASSERT_EQ(1, closed_case(&idle, &none, bytewise, NGHTTP2_GOAWAY, 0, &code, &served));
        ASSERT_EQ(NGHTTP2_PROTOCOL_ERROR, (int)code);
        ms_mem_free(zero.base), ms_mem_free(idle.base);
    }
}

TEST(h2_field_lines_that_are_not_whole_are_refused_and_the_reply_still_goes)
{
    setup();
    int32_t id = request("GET", "/fields", NULL);
    pump();
    for (int i = 0; i < 7; i++)
        ASSERT_EQ(MS_EBADHEADER, fields_rc[i]);
    ASSERT_EQ(0, fields_rc[7]);
    ASSERT_EQ(200, reply_of(id)->status);
    ASSERT_STR_EQ("fields", reply_of(id)->body);
    ASSERT_EQ(1, reply_of(id)->saw_ok2);
    teardown();
}

TEST(h2_fields_nv_counts_a_last_line_without_its_lf)
{
    ms_req_t r;
    memset(&r, 0, sizeof(r));
    ms_pool_init(&r.pool);
    ms_buf_t b = {(char *)"x-a: 1\r\nx-b: 2", 14, 14};
    ASSERT_EQ(2, count_lines(&b));
    nghttp2_nv nva[2];
    ASSERT_EQ(2, fields_nv(&r, &b, nva));
    ASSERT_EQ(3, (int)nva[1].namelen);
    ASSERT_EQ(1, (int)nva[1].valuelen);
    ASSERT(memcmp(nva[1].value, "2", 1) == 0);
    ms_pool_free(&r.pool);
}

/* A connection with no stream open gives its reply queue back at once; idle for a second, its
 * frame buffer's pages too (not counted as a timeout); its next request is served as ever,
 * and the idle deadline still runs from the last request, the second included. */
TEST(h2_an_idle_connection_gives_its_memory_back_and_serves_on)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.idle_timeout_ms = 1600;
    setup_limits(&lim);
    int32_t a = request("GET", "/a", NULL);
    pump();
    ASSERT_STR_EQ("v20 /a example.test", reply_of(a)->body);
    ms_h2_t *h2 = h2_of(m.conn);
    ASSERT(m.conn->pend == NULL); /* the queue went back */
#ifndef MS_ASAN
    ASSERT(h2->framebuf != NULL); /* (a mapping, but for ASan's heap block) */
    ASSERT_EQ(MS_PHASE_SETTLE, m.conn->phase);
    run_for(1150);
    ASSERT_EQ(1, h2->trimmed);
    unsigned char resident[8];
    ASSERT_EQ(0, mincore(h2->framebuf, h2->framebuf_size, resident));
    for (size_t i = 0; i < h2->framebuf_size / 4096; i++)
        ASSERT_EQ(0, resident[i] & 1);
    ASSERT_EQ(MS_PHASE_IDLE, m.conn->phase);
    ASSERT_EQ(0, srv->stats->timeouts);
#else
    run_for(1150);
#endif
    int32_t b = request("GET", "/b", NULL);
    pump();
    ASSERT_EQ(200, reply_of(b)->status);
    ASSERT_STR_EQ("v20 /b example.test", reply_of(b)->body);
    ASSERT_EQ(0, h2->trimmed);
    run_for(1300); /* settled again, and open: the idle deadline is 1.6 s from /b */
    ASSERT(m.conn != NULL);
    ASSERT_EQ(0, m.closed);
    run_for(500);
    ASSERT(m.conn == NULL); /* closed at idle_timeout, not a settle later */
    ASSERT_EQ(0, srv->stats->timeouts);
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
    ASSERT_EQ(2, goaway_seen); /* the notice, and after the PING came back the last one */
    ASSERT_EQ(id, goaway_last_id);
    ASSERT(m.conn != NULL);
    ms_reply_send(parked, S("finished"), MS_VEC_STATIC, -1);
    ms_req_finish(parked);
    pump();
    ASSERT_EQ(200, reply_of(id)->status);
    ASSERT_STR_EQ("finished", reply_of(id)->body);
    ASSERT(m.conn == NULL); /* nothing left: the connection closed */
    teardown();
}

TEST(h2_stop_serves_a_stream_the_client_sent_before_it_saw_the_notice)
{
    setup();
    int32_t id = request("GET", "/park", NULL);
    pump();
    ms_server_stop(srv, stopped);
    uv_run(&loop, UV_RUN_NOWAIT);
    /* The notice and its PING are on their way when the client opens another stream. */
    ASSERT(m.out.len > 0);
    size_t len = m.out.len;
    char *notice = malloc(len);
    memcpy(notice, m.out.base, len);
    m.out.len = 0;
    int32_t late = request("GET", "/ok", NULL);
    const uint8_t *p;
    ssize_t n;
    while ((n = nghttp2_session_mem_send(client, &p)) > 0)
        ms_memio_feed(&m, (const char *)p, (size_t)n);
    uv_run(&loop, UV_RUN_NOWAIT);
    nghttp2_session_mem_recv(client, (const uint8_t *)notice, len);
    free(notice);
    ASSERT_EQ(1, goaway_seen);
    ASSERT_EQ(INT32_MAX, goaway_last_id);
    pump();
    ASSERT_EQ(200, reply_of(late)->status); /* served, not refused */
    ASSERT_EQ(0, (int)reply_of(late)->error);
    ASSERT_EQ(2, goaway_seen);
    ASSERT_EQ(late, goaway_last_id);
    ms_reply_send(parked, S("finished"), MS_VEC_STATIC, -1);
    ms_req_finish(parked);
    pump();
    ASSERT_EQ(200, reply_of(id)->status);
    ASSERT(m.conn == NULL);
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

TEST(h2_hands_a_stream_to_a_tunnel)
{
    setup();
    body_t b = {"abc", 3, 0, NULL, 0};
    int32_t id = request("POST", "/tunnel", &b);
    pump();
    /* The DATA came to the taker, which sent it back; the client's END_STREAM ended it. */
    ASSERT_EQ(200, reply_of(id)->status);
    ASSERT_STR_EQ("abc", tunnel.seen);
    ASSERT_STR_EQ("<abc>", reply_of(id)->body);
    ASSERT_EQ(1, tunnel.ended);
    ASSERT_EQ(0, tunnel.end_status);
    ASSERT_EQ(1, reply_of(id)->closed);
    ASSERT_EQ(0, (int)reply_of(id)->error);
    ASSERT_EQ(0, srv->stats->in_flight);
    teardown();
}

TEST(h2_tells_a_tunnel_when_its_stream_is_reset)
{
    setup();
    body_t b = {NULL, 0, 0, NULL, 0}; /* the client's side stays open */
    int32_t id = request("POST", "/tunnel", &b);
    pump();
    ASSERT_EQ(200, reply_of(id)->status);
    ASSERT_EQ(0, tunnel.ended);
    nghttp2_submit_rst_stream(client, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
    pump();
    ASSERT_EQ(1, tunnel.ended);
    ASSERT_EQ(MS_ECLOSED, tunnel.end_status);
    ASSERT_EQ(0, srv->stats->in_flight);
    teardown();
}

TEST_MAIN()
