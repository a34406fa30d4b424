/* accept_test.c: the accept stage: a PROXY header first where asked, then the protocol
 * chosen by ALPN or by sniffing the HTTP/2 preface, and what it refuses. */
#include "test.h"

#include "../../../core/engine/accept.c"
#include "../../../core/transport/memio.h"
#include "text.h"

#define S(lit) lit, sizeof(lit) - 1
#define GET    "GET / HTTP/1.1\r\nHost: a\r\n\r\n"

static uv_loop_t loop;
static ms_server_t *srv;
static int requests;
static char client[64];

static void on_request(ms_req_t *r, void *data)
{
    (void)data;
    requests++;
    ms_req_client_ip(r, client, sizeof(client));
    ms_reply_send(r, S("hi"), MS_VEC_STATIC, -1);
    ms_req_finish(r);
}

static void on_resume(ms_req_t *r, void *data)
{
    (void)r;
    (void)data;
}

/* Log lines, kept to count them. */
static char logged[2048];
static int nlogged;

static void keep_log(int level, const char *msg, size_t len)
{
    (void)level;
    nlogged++;
    snprintf(logged, sizeof(logged), "%.*s", (int)len, msg);
}

static void setup(const ms_limits_t *lim)
{
    ms_log_set(keep_log, MS_LOG_INFO);
    uv_loop_init(&loop);
    srv = ms_server_new(&loop, lim, on_request, on_resume, NULL);
    requests = 0;
    nlogged = 0;
    logged[0] = 0;
    client[0] = 0;
}

static void teardown(void)
{
    ms_server_free(srv);
    uv_loop_close(&loop);
    ms_log_set(NULL, MS_LOG_ERR);
}

/* The server's first frame on HTTP/2 is its SETTINGS (RFC 9113 3.4). */
static int starts_with_settings(const ms_memio_t *m)
{
    return m->out.len >= 9 && (unsigned char)m->out.base[3] == 0x4;
}

TEST(accept_sniffs_the_http2_preface_and_otherwise_speaks_http1)
{
    setup(NULL);
    ms_memio_t a, b, c, d;
    ms_conn_t *ca = ms_memio_open(srv, &a);
    ms_conn_t *cb = ms_memio_open(srv, &b);
    ms_conn_t *cc = ms_memio_open(srv, &c);
    ms_conn_t *cd = ms_memio_open(srv, &d);
    ASSERT_STR_EQ("accept", ca->proto->name);
    /* the preface whole */
    ms_memio_feed(&a, S(MS_H2_PREFACE));
    ASSERT(ca->proto == HTTP2);
    ASSERT(starts_with_settings(&a));
    /* the preface split: the stage keeps its start until the rest comes */
    ms_memio_read(&b, "PRI * HT", 8);
    ASSERT_STR_EQ("accept", cb->proto->name);
    ASSERT(cb->pstate != NULL);
    ASSERT_EQ(0, b.out.len);
    ms_memio_read(&b, MS_H2_PREFACE + 8, MS_H2_PREFACE_LEN - 8);
    ASSERT(cb->proto == HTTP2);
    ASSERT(starts_with_settings(&b));
    /* A request that starts with "P" as the preface does: HTTP/1.1 once it differs. */
    ms_memio_read(&c, "P", 1);
    ASSERT_STR_EQ("accept", cc->proto->name);
    ms_memio_read(&c, S("OST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"));
    ASSERT(cc->proto == HTTP1);
    ASSERT_EQ(1, requests);
    ASSERT(strncmp(text(&c.out), "HTTP/1.1 200 OK\r\n", 17) == 0);
    /* anything else: HTTP/1.1 from the first byte */
    ms_memio_feed(&d, S(GET));
    ASSERT(cd->proto == HTTP1);
    ASSERT_EQ(2, requests);
    ms_memio_t *all[] = {&a, &b, &c, &d};
    for (int i = 0; i < 4; i++) {
        ms_memio_peer_close(all[i], UV_EOF);
        ms_memio_free(all[i]);
    }
    ASSERT_EQ(0, (int)srv->stats->conns);
    teardown();
}

TEST(accept_takes_the_protocol_the_transport_agreed)
{
    setup(NULL);
    ms_memio_t a, b;
    ms_conn_t *ca = ms_memio_open(srv, &a);
    ms_memio_open(srv, &b);
    a.alpn = "h2";
    b.alpn = "http/1.1";
    ms_memio_feed(&a, S(MS_H2_PREFACE));
    ASSERT(ca->proto == HTTP2);
    /* ALPN said HTTP/1.1: a preface is not sniffed, it is a bad request line */
    ms_memio_feed(&b, S(MS_H2_PREFACE));
    ASSERT(b.conn == NULL); /* answered as HTTP/1.1 does a line it cannot read, and closed */
    ASSERT(strncmp(text(&b.out), "HTTP/1.1 4", 10) == 0 ||
           strncmp(text(&b.out), "HTTP/1.1 5", 10) == 0);
    ASSERT(!starts_with_settings(&b));
    ASSERT_EQ(0, requests);
    ms_memio_peer_close(&a, UV_EOF);
    ms_memio_peer_close(&b, UV_EOF);
    ms_memio_free(&a);
    ms_memio_free(&b);
    teardown();
}

TEST(accept_reads_a_proxy_header_then_http1_with_the_client_it_names)
{
    setup(NULL);
    ms_memio_t m;
    ms_conn_t *c = ms_memio_open(srv, &m);
    c->flags |= MS_CONN_PROXY; /* as a MS_LISTEN_PROXY listener marks it */
    static const char hdr[] = "PROXY TCP4 192.0.2.7 198.51.100.2 56324 443\r\n";
    /* in pieces: the header split, then the request behind it in the same read */
    ms_memio_read(&m, hdr, 10);
    ASSERT_STR_EQ("accept", c->proto->name);
    ASSERT(c->flags & MS_CONN_PROXY);
    ms_memio_read(&m, hdr + 10, sizeof(hdr) - 1 - 10);
    ASSERT(!(c->flags & MS_CONN_PROXY));
    ASSERT_EQ(1, c->source_known);
    ASSERT_EQ(1, c->source_counted); /* the client behind the proxy is the source counted */
    ms_memio_feed(&m, S(GET));
    ASSERT_EQ(1, requests);
    ASSERT_STR_EQ("192.0.2.7", client);
    char peer[64];
    ms_conn_peer(c, peer, sizeof(peer));
    ASSERT_STR_EQ("192.0.2.7", peer);
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    teardown();
}

TEST(accept_closes_on_a_bad_proxy_header_with_one_line)
{
    setup(NULL);
    ms_memio_t m;
    ms_conn_t *c = ms_memio_open(srv, &m);
    c->flags |= MS_CONN_PROXY;
    ms_memio_feed(&m, S(GET)); /* a request where the header must be */
    ASSERT(m.conn == NULL);
    ASSERT_EQ(2, m.closed);
    ASSERT_EQ(0, requests);
    ASSERT_EQ(0, m.out.len);
    ASSERT_EQ(1, (int)srv->stats->bad_requests);
    ASSERT_EQ(1, nlogged);
    ASSERT_HAS(logged, "no valid PROXY protocol header");
    ms_memio_free(&m);
    teardown();
}

TEST(accept_refuses_a_source_over_its_cap_named_by_the_proxy_header)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.per_source = 1;
    setup(&lim);
    ms_memio_t a, b, c;
    static const char h1[] = "PROXY TCP4 192.0.2.7 198.51.100.2 1000 443\r\n";
    static const char h2[] = "PROXY TCP4 192.0.2.8 198.51.100.2 1001 443\r\n";
    ms_memio_open(srv, &a)->flags |= MS_CONN_PROXY;
    ms_memio_open(srv, &b)->flags |= MS_CONN_PROXY;
    ms_memio_open(srv, &c)->flags |= MS_CONN_PROXY;
    ms_memio_feed(&a, S(h1));
    ms_memio_feed(&b, S(h1)); /* the same client again: over per_source */
    ms_memio_feed(&c, S(h2)); /* another: served */
    ASSERT(a.conn != NULL);
    ASSERT(b.conn == NULL);
    ASSERT(c.conn != NULL);
    ASSERT_EQ(1, (int)srv->stats->refused_conns);
    ASSERT_EQ(0, (int)srv->stats->bad_requests);
    ms_memio_t *all[] = {&a, &b, &c};
    for (int i = 0; i < 3; i++) {
        ms_memio_peer_close(all[i], UV_EOF);
        ms_memio_free(all[i]);
    }
    teardown();
}

TEST(accept_deadline_closes_silence_and_answers_a_slow_start_408)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.head_timeout_ms = 10;
    setup(&lim);
    ms_memio_t quiet, slow, proxied;
    ms_memio_open(srv, &quiet);
    ms_memio_open(srv, &slow);
    ms_memio_open(srv, &proxied)->flags |= MS_CONN_PROXY;
    ms_memio_read(&slow, "PR", 2); /* a preface or a request: too slow to tell */
    ms_memio_read(&proxied, "PROXY TCP4", 10);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT(quiet.conn == NULL && quiet.out.len == 0);
    ASSERT(proxied.conn == NULL && proxied.out.len == 0);
    ASSERT(slow.conn == NULL);
    ASSERT(strncmp(text(&slow.out), "HTTP/1.1 408 Request Timeout\r\n", 30) == 0);
    ASSERT_EQ(3, (int)srv->stats->timeouts);
    ASSERT_EQ(0, (int)srv->stats->conns);
    ms_memio_free(&quiet);
    ms_memio_free(&slow);
    ms_memio_free(&proxied);
    teardown();
}

TEST_MAIN()
