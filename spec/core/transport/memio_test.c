/* memio_test.c: the in-memory transport: what the engine writes, reads in the buffers it
 * offers, pending writes that the peer drains, closes graceful and abortive. */
#include "test.h"

#include "../../../core/transport/memio.c"
#include "text.h"

#define S(lit) lit, sizeof(lit) - 1
#define GET    "GET / HTTP/1.1\r\nHost: a\r\n\r\n"

static uv_loop_t loop;
static ms_server_t *srv;
static int requests;
static int32_t woken_slot = -100;

static void on_request(ms_req_t *r, void *data)
{
    (void)data;
    requests++;
    if (r->v.path.len == 5 && memcmp(r->v.path.base, "/bye!", 5) == 0)
        ms_reply_header(r, S("connection"), S("close"));
    ms_reply_send(r, S("hello"), MS_VEC_STATIC, -1);
    ms_req_finish(r);
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
    woken_slot = slot;
}

static void setup(void)
{
    ms_log_set(NULL, MS_LOG_WARN);
    uv_loop_init(&loop);
    srv = ms_server_new(&loop, NULL, on_request, on_resume, NULL);
    ms_server_on_event(srv, on_event);
    requests = 0;
    woken_slot = -100;
}

static void teardown(void)
{
    ms_server_free(srv);
    uv_loop_close(&loop);
}

TEST(memio_keeps_what_the_engine_writes_and_closes_as_asked)
{
    setup();
    ms_memio_t m;
    ms_conn_t *c = ms_memio_open(srv, &m);
    ASSERT(m.conn == c);
    ASSERT_EQ(1, m.reading);
    ASSERT_EQ(0, m.closed);
    ASSERT_EQ(1, (int)srv->stats->conns);
    ASSERT_EQ(MS_PHASE_HEAD, c->phase); /* started: the first bytes' deadline runs */
    char peer[32];
    ms_conn_peer(c, peer, sizeof(peer));
    ASSERT_STR_EQ("memory", peer);
    ms_memio_feed(&m, S(GET));
    ASSERT_EQ(1, requests);
    ASSERT(strncmp(text(&m.out), "HTTP/1.1 200 OK\r\n", 17) == 0);
    ASSERT(strstr(text(&m.out), "\r\n\r\nhello") != NULL);
    ASSERT_EQ(0, m.closed);
    /* "connection: close": the engine ends it gracefully, and the transport lets go. */
    ms_memio_feed(&m, S("GET /bye! HTTP/1.1\r\nHost: a\r\n\r\n"));
    ASSERT_EQ(2, requests);
    ASSERT_EQ(1, m.closed);
    ASSERT(m.conn == NULL);
    ASSERT_EQ(0, (int)srv->stats->conns);
    size_t len = m.out.len;
    ms_memio_feed(&m, S(GET)); /* after the close: dropped */
    ASSERT_EQ(2, requests);
    ASSERT_EQ(len, m.out.len);
    ms_memio_free(&m);
    ASSERT(m.out.base == NULL && m.out.len == 0);
    teardown();
}

TEST(memio_reads_into_the_buffer_the_connection_offers)
{
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    /* One byte a read: the head is kept across reads in the connection's own buffer. */
    static const char req[] = GET GET;
    size_t n = sizeof(req) - 1;
    for (size_t i = 0; i < n; i++)
        ASSERT_EQ(1, ms_memio_read(&m, req + i, 1));
    ASSERT_EQ(2, requests);
    /* All at once: as many reads as the buffers take. */
    ASSERT_EQ(n, ms_memio_read(&m, req, n));
    ASSERT_EQ(4, requests);
    /* Closed: nothing is taken. */
    ms_memio_peer_close(&m, UV_ECONNRESET);
    ASSERT_EQ(2, m.closed); /* a reset is abortive */
    ASSERT_EQ(0, ms_memio_read(&m, req, n));
    ASSERT_EQ(4, requests);
    ms_memio_free(&m);
    teardown();
}

TEST(memio_congested_holds_a_write_until_drained)
{
    setup();
    ms_memio_t m;
    ms_conn_t *c = ms_memio_open(srv, &m);
    m.congested = 1;
    ms_memio_feed(&m, S(GET));
    ASSERT_EQ(1, requests);
    ASSERT_EQ(0, m.out.len);           /* nothing went out now */
    ASSERT(m.held.len > 0);            /* the rest is a pending write */
    ASSERT_EQ(2, c->refs);             /* which holds the connection, as a socket's does */
    ASSERT(c->flags & MS_CONN_WRITING);
    size_t held = m.held.len;
    m.congested = 0;
    ms_memio_drain(&m);
    ASSERT_EQ(held, m.out.len);
    ASSERT_EQ(0, m.held.len);
    ASSERT_EQ(1, c->refs);
    ASSERT(!(c->flags & MS_CONN_WRITING));
    ASSERT(strstr(text(&m.out), "hello") != NULL);
    ms_memio_drain(&m); /* nothing pending: nothing happens */
    ASSERT_EQ(held, m.out.len);
    ms_memio_peer_close(&m, UV_EOF);
    ASSERT(m.conn == NULL);
    ms_memio_free(&m);
    teardown();
}

TEST(memio_close_with_a_write_pending_cancels_it_and_frees_the_connection)
{
    setup();
    ms_memio_t m;
    ms_memio_open(srv, &m);
    m.congested = 1;
    m.wake = 7 + 1; /* the opener hears of the end on slot 7 */
    ms_memio_feed(&m, S(GET));
    ASSERT(m.held.len > 0);
    ms_memio_peer_close(&m, UV_ECONNRESET);
    ASSERT_EQ(2, m.closed);
    ASSERT(m.conn == NULL);
    ASSERT_EQ(0, m.held.len);
    ASSERT_EQ(0, m.out.len); /* the held bytes never reached the peer */
    ASSERT_EQ(0, (int)srv->stats->conns); /* freed: the write's hold is given back */
    ASSERT_EQ(7, woken_slot);
    ms_memio_free(&m);
    teardown();
}

TEST(memio_stops_reading_when_the_engine_says_so)
{
    setup();
    ms_memio_t m;
    ms_conn_t *c = ms_memio_open(srv, &m);
    c->io->read_stop(c);
    ASSERT_EQ(0, m.reading);
    ASSERT_EQ(0, ms_memio_read(&m, S(GET))); /* a socket not read takes nothing */
    ASSERT_EQ(0, requests);
    c->io->read_start(c);
    ASSERT_EQ(sizeof(GET) - 1, ms_memio_read(&m, S(GET)));
    ASSERT_EQ(1, requests);
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    teardown();
}

TEST(memio_tag_alpn_and_extra_bytes)
{
    setup();
    ms_memio_t a, b;
    ms_conn_t *ca = ms_memio_open(srv, &a);
    ms_conn_t *cb = ms_memio_open_ex(srv, &b, 64);
    a.tag = 42;
    ASSERT_EQ(42, ms_memio_tag(ca));
    ASSERT_EQ(0, ms_memio_tag(cb));
    /* The extra bytes are the connection's, past the transport's own pointer. */
    char *x = ms_memio_extra(cb);
    ASSERT(x >= (char *)ms_conn_io_data(cb) + sizeof(ms_memio_t *));
    memset(x, 0xab, 64); /* (ASan: all of it is inside the allocation) */
    ASSERT(*(ms_memio_t **)ms_conn_io_data(cb) == &b);
    /* A transport that is not the memory one has no tag. */
    static const ms_io_t other = {0};
    ms_conn_t fake;
    memset(&fake, 0, sizeof(fake));
    fake.io = &other;
    ASSERT_EQ(0, ms_memio_tag(&fake));
    /* ALPN as TLS would say it: the accept stage takes HTTP/2 without a preface. */
    b.alpn = "h2";
    ASSERT_STR_EQ("h2", cb->io->alpn(cb));
    ASSERT(ca->io->alpn(ca) == NULL);
    ms_memio_peer_close(&a, UV_EOF);
    ms_memio_peer_close(&b, UV_EOF);
    ASSERT_EQ(0, (int)srv->stats->conns);
    ms_memio_free(&a);
    ms_memio_free(&b);
    teardown();
}

TEST_MAIN()
