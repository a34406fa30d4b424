/* rawsock_test.c: a raw request socket taking over an HTTP/1.1 connection: the 101, bytes
 * both ways over the memory transport, the wait's wake, the send queue's cap, the end. */
#include "test.h"

#include "../../../core/tunnel/rawsock.c"
#include "../../../core/transport/memio.h"
#include "text.h"

#define S(lit) lit, sizeof(lit) - 1
#define UPGRADE "GET /raw HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: x-raw\r\n\r\n"

static uv_loop_t loop;
static ms_server_t *srv;
static ms_raw_t *raw;
static ms_req_t *req;
static int raw_err;
static uint64_t send_queue = 1 << 20;
static int32_t woken = -100;
static int nwoken;

static void on_request(ms_req_t *r, void *data)
{
    (void)data;
    ms_reply_header(r, S("upgrade"), S("x-raw"));
    req = r;
    raw = ms_raw_accept(r, send_queue, &raw_err);
}

static void on_resume(ms_req_t *r, void *data)
{
    (void)r;
    (void)data;
}

static void on_event(int32_t slot, int status, void *data)
{
    (void)status;
    (void)data;
    woken = slot;
    nwoken++;
}

static void setup(const ms_limits_t *lim)
{
    ms_log_set(NULL, MS_LOG_ERR);
    uv_loop_init(&loop);
    srv = ms_server_new(&loop, lim, on_request, on_resume, NULL);
    ms_server_on_event(srv, on_event);
    raw = NULL;
    req = NULL;
    raw_err = 0;
    woken = -100;
    nwoken = 0;
}

static void teardown(void)
{
    ms_server_free(srv);
    uv_loop_close(&loop);
}

TEST(rawsock_takes_the_connection_and_carries_bytes_both_ways)
{
    setup(NULL);
    ms_memio_t m;
    ms_memio_open(srv, &m);
    /* bytes right behind the head belong to the socket too */
    ms_memio_feed(&m, S(UPGRADE "early"));
    ASSERT(raw != NULL);
    ASSERT(strncmp(text(&m.out), "HTTP/1.1 101 Switching Protocols\r\n", 34) == 0);
    ASSERT_HAS(text(&m.out), "upgrade: x-raw\r\n");
    ASSERT_EQ(1, (int)srv->websockets); /* counted as a WebSocket, not a request in flight */
    ASSERT_EQ(0, (int)srv->stats->in_flight);
    const char *p;
    ASSERT_EQ(5, ms_raw_peek(raw, &p));
    ASSERT(memcmp(p, "early", 5) == 0);
    ms_raw_consume(raw, 2);
    ASSERT_EQ(3, ms_raw_peek(raw, &p));
    ASSERT(memcmp(p, "rly", 3) == 0);
    ms_raw_consume(raw, 3);
    ASSERT_EQ(0, ms_raw_peek(raw, &p)); /* nothing now; more may come */
    /* A waiter on slot 5 is woken once when bytes come. */
    ms_raw_wait(raw, 5);
    ms_memio_feed(&m, S("ping"));
    ASSERT_EQ(5, woken);
    ASSERT_EQ(1, nwoken);
    ms_memio_feed(&m, S("!"));
    ASSERT_EQ(1, nwoken); /* the wait was used up */
    ASSERT_EQ(5, ms_raw_peek(raw, &p));
    ASSERT(memcmp(p, "ping!", 5) == 0);
    ms_raw_consume(raw, 5);
    /* Bytes out, as they are: no framing. */
    size_t head = m.out.len;
    ASSERT_EQ(0, ms_raw_send(raw, S("pong"), MS_VEC_STATIC, -1));
    ASSERT_EQ(0, ms_raw_send(raw, S("!"), MS_VEC_OUT, -1));
    ms__conn_flush(m.conn);
    ASSERT_EQ(head + 5, m.out.len);
    ASSERT(memcmp(m.out.base + head, "pong!", 5) == 0);
    ASSERT_EQ(0, ms_raw_closed(raw));
    /* The peer ends its side: what came stays readable, then MS_ECLOSED; a waiter hears. */
    ms_memio_feed(&m, S("bye"));
    ms_raw_wait(raw, 6);
    ms_memio_peer_close(&m, UV_EOF);
    ASSERT_EQ(6, woken);
    ASSERT_EQ(3, ms_raw_peek(raw, &p));
    ms_raw_consume(raw, 3);
    ASSERT_EQ(MS_ECLOSED, ms_raw_peek(raw, &p));
    ms_raw_free(raw);
    ASSERT_EQ(0, (int)srv->websockets);
    ms_req_finish(req);
    ASSERT(m.conn == NULL);
    ASSERT_EQ(0, (int)srv->stats->conns);
    ASSERT_EQ(0, (int)srv->stats->in_flight);
    ms_memio_free(&m);
    teardown();
}

TEST(rawsock_cuts_a_peer_that_does_not_read)
{
    send_queue = 64;
    setup(NULL);
    ms_memio_t m;
    ms_memio_open(srv, &m);
    ms_memio_feed(&m, S(UPGRADE));
    ASSERT(raw != NULL);
    m.congested = 1; /* the peer reads nothing */
    static char blob[100];
    memset(blob, 'z', sizeof(blob));
    ASSERT_EQ(0, ms_raw_send(raw, blob, 40, MS_VEC_OUT, -1)); /* a first send always goes */
    ms__conn_flush(m.conn);
    ASSERT_EQ(0, ms_raw_send(raw, blob, 20, MS_VEC_OUT, -1)); /* 60: under the cap */
    ASSERT_EQ(MS_ETOOBIG, ms_raw_send(raw, blob, 10, MS_VEC_OUT, -1));
    ASSERT_EQ(1, ms_raw_closed(raw));
    ASSERT_EQ(MS_ECLOSED, ms_raw_send(raw, blob, 1, MS_VEC_OUT, -1));
    const char *p;
    ASSERT_EQ(MS_ECLOSED, ms_raw_peek(raw, &p));
    ms_raw_free(raw);
    ms_req_finish(req);
    /* Over HTTP/1.1 the connection closes once what was queued has gone (or send_timeout
     * ends it); nothing more is queued behind it. */
    ASSERT(m.conn != NULL);
    m.congested = 0;
    ms_memio_drain(&m);
    ASSERT(m.conn == NULL);
    ASSERT_EQ(0, (int)srv->stats->conns);
    const char *out = text(&m.out);
    const char *body = strstr(out, "\r\n\r\n");
    ASSERT(body != NULL);
    ASSERT_EQ(60, strlen(body + 4)); /* the two sends under the cap, not the third */
    ms_memio_free(&m);
    teardown();
    send_queue = 1 << 20;
}

TEST(rawsock_counts_against_websockets)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.websockets = 1;
    setup(&lim);
    ms_memio_t a, b;
    ms_memio_open(srv, &a);
    ms_memio_open(srv, &b);
    ms_memio_feed(&a, S(UPGRADE));
    ms_raw_t *first = raw;
    ms_req_t *first_req = req;
    ASSERT(first != NULL);
    ms_memio_feed(&b, S(UPGRADE));
    ASSERT(raw == NULL);
    ASSERT_EQ(MS_EBUSY, raw_err); /* over `websockets`: the handler answers as it likes */
    ms_reply_send(req, S("busy"), MS_VEC_STATIC, -1);
    ms_req_finish(req);
    ASSERT(strncmp(text(&b.out), "HTTP/1.1 200 OK\r\n", 17) == 0);
    ms_raw_free(first);
    ms_req_finish(first_req);
    ms_memio_peer_close(&b, UV_EOF);
    ASSERT_EQ(0, (int)srv->stats->conns);
    ms_memio_free(&a);
    ms_memio_free(&b);
    teardown();
}

TEST_MAIN()
