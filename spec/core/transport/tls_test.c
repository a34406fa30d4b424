/* tls_test.c: the TLS transport over the memory transport, against an OpenSSL client in
 * memory: the handshake, ALPN, SNI, records both ways (a congested socket too), and failed
 * handshakes. */
#include "test.h"
#include "../../../core/transport/tls.c"
#include "tls_peer.h"

#define S(lit) lit, sizeof(lit) - 1

static uv_loop_t loop;
static ms_server_t *srv;
static ms_tls_t *tls;
static char seen_tls[32];
static size_t reply_len;
static int log_lines;
static char last_log[1024];

static void on_request(ms_req_t *r, void *data)
{
    (void)data;
    const char *v = ms_req_tls(r);
    snprintf(seen_tls, sizeof(seen_tls), "%s", v ? v : "(none)");
    if (reply_len > 0) {
        char *body = malloc(reply_len);
        for (size_t i = 0; i < reply_len; i++)
            body[i] = (char)('a' + i % 26);
        ms_reply_send(r, body, reply_len, MS_VEC_OUT, -1); /* copied: freed just below */
        free(body);
    } else {
        ms_reply_send(r, "hello", 5, MS_VEC_STATIC, -1);
    }
    ms_req_finish(r);
}

static void on_resume(ms_req_t *r, void *data)
{
    (void)r, (void)data;
}

static void count_log(int level, const char *msg, size_t len)
{
    (void)level;
    log_lines++;
    snprintf(last_log, sizeof(last_log), "%.*s", (int)len, msg);
}

static void setup(ms_limits_t *lim, int refuse)
{
    ms_log_set(count_log, MS_LOG_INFO);
    log_lines = 0;
    last_log[0] = 0;
    reply_len = 0;
    uv_loop_init(&loop);
    srv = ms_server_new(&loop, lim, on_request, on_resume, NULL);
    ms_tls_opts_t o = {.refuse_unknown = refuse};
    char err[256];
    tls = ms_tls_new(srv, &o, err, sizeof(err));
    peer_add_cert(tls, NULL, "localhost", 0);
}

static void teardown(void)
{
    ms_server_free(srv);
    uv_loop_close(&loop);
    ms_log_set(NULL, MS_LOG_WARN);
}

/* A GET over a handshake with `alpn`; returns what came back (the caller frees it). */
static char *get_over_tls(const char *alpn, size_t alpn_len, const char **agreed, int congested)
{
    peer_t p;
    peer_open(&p, srv, tls, "localhost", alpn, alpn_len);
    ms_buf_t got = {0};
    if (peer_handshake(&p)) {
        *agreed = tls_of(p.c)->alpn;
        p.m.congested = congested;
        peer_send(&p, S("GET /x HTTP/1.1\r\nHost: localhost\r\n\r\n"));
        peer_recv(&p, &got);
    }
    ms__buf_append(&got, "", 1);
    peer_close(&p);
    return got.base;
}

TEST(tls_serves_http1_after_the_handshake)
{
    setup(NULL, 0);
    const char *agreed = "unset";
    char *out = get_over_tls(S("\x08http/1.1"), &agreed, 0);
    ASSERT_STR_EQ("http/1.1", agreed);
    ASSERT_HAS(out, "HTTP/1.1 200 OK\r\n");
    ASSERT_HAS(out, "\r\n\r\nhello");
    ASSERT_STR_EQ("TLSv1.3", seen_tls);
    free(out);
    /* No ALPN at all: none agreed, and the accept stage finds HTTP/1.1 by itself. */
    out = get_over_tls(NULL, 0, &agreed, 0);
    ASSERT(agreed == NULL);
    ASSERT_HAS(out, "\r\n\r\nhello");
    free(out);
    teardown();
}

TEST(tls_alpn_prefers_h2)
{
    setup(NULL, 0);
    peer_t p;
    peer_open(&p, srv, tls, "localhost", S("\x08http/1.1\x02h2"));
    ASSERT(peer_handshake(&p));
    ASSERT_STR_EQ("h2", tls_of(p.c)->alpn);
    /* The preface goes to HTTP/2, whose first frame back is SETTINGS. */
    peer_send(&p, S(MS_H2_PREFACE "\0\0\0\4\0\0\0\0\0"));
    ms_buf_t got = {0};
    peer_recv(&p, &got);
    ASSERT(got.len >= 9 && got.base[3] == 4);
    ms_mem_free(got.base);
    peer_close(&p);
    teardown();
}

TEST(tls_large_reply_goes_out_whole_on_a_congested_transport)
{
    setup(NULL, 0);
    const char *agreed;
    for (int congested = 0; congested <= 1; congested++) {
        reply_len = 3 * 1024 * 1024 + 77;
        char *out = get_over_tls(S("\x08http/1.1"), &agreed, congested);
        const char *body = strstr(out, "\r\n\r\n");
        ASSERT(body != NULL);
        body += 4;
        ASSERT_EQ(reply_len, strlen(body));
        for (size_t i = 0; i < reply_len; i += 4093)
            ASSERT_EQ('a' + i % 26, body[i]);
        free(out);
    }
    teardown();
}

TEST(tls_closes_after_the_last_bytes_and_close_notify_when_the_socket_was_full)
{
    setup(NULL, 0);
    reply_len = 1024 * 1024;
    peer_t p;
    peer_open(&p, srv, tls, "localhost", S("\x08http/1.1"));
    ASSERT(peer_handshake(&p));
    p.m.congested = 1; /* every write waits for the peer: the close waits for the last */
    peer_send(&p, S("GET /x HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"));
    ms_buf_t got = {0};
    peer_recv(&p, &got);
    ASSERT(p.m.conn == NULL);
    ASSERT_EQ(1, p.m.closed); /* gracefully: FIN, not a reset */
    ASSERT(got.len > reply_len);
    char ch;
    int rc = SSL_read(p.ssl, &ch, 1);
    ASSERT_EQ(SSL_ERROR_ZERO_RETURN, SSL_get_error(p.ssl, rc)); /* close_notify came */
    ms_mem_free(got.base);
    peer_close(&p);
    teardown();
}

TEST(tls_sni_finds_exact_and_wildcard_names)
{
    setup(NULL, 0);
    ASSERT_EQ(0, peer_add_cert(tls, "example.com", "example.com", 0));
    ASSERT_EQ(0, peer_add_cert(tls, "*.Wild.Test", "*.wild.test", 0));
    SSL_CTX *site = find_name(tls, "example.com"), *wild = find_name(tls, "a.wild.test");
    ASSERT(site != NULL && site != tls->ctx);
    ASSERT(wild != NULL && wild != tls->ctx && wild != site);
    ASSERT(find_name(tls, "EXAMPLE.com") == site);
    ASSERT(find_name(tls, "www.A.Wild.test") == NULL); /* one label only */
    ASSERT(find_name(tls, "wild.test") == NULL);
    ASSERT(find_name(tls, "localhost") == tls->ctx); /* the default certificate's own name */
    ASSERT(find_name(tls, "other.test") == NULL);
    /* A handshake naming the site gets the site's certificate. */
    peer_t p;
    peer_open(&p, srv, tls, "b.wild.test", NULL, 0);
    ASSERT(peer_handshake(&p));
    X509 *x = SSL_get1_peer_certificate(p.ssl);
    char cn[64] = "";
    X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof(cn));
    X509_free(x);
    ASSERT_STR_EQ("*.wild.test", cn);
    peer_close(&p);
    teardown();
}

TEST(tls_refuses_an_unknown_name_when_asked_to)
{
    setup(NULL, 1);
    peer_t p;
    peer_open(&p, srv, tls, "other.test", NULL, 0);
    ASSERT(!peer_handshake(&p));
    ASSERT(p.m.conn == NULL); /* closed */
    ASSERT_HAS(last_log, "TLS handshake failed: unknown server name");
    peer_close(&p);
    peer_open(&p, srv, tls, "localhost", NULL, 0);
    ASSERT(peer_handshake(&p));
    peer_close(&p);
    teardown();
}

TEST(tls_failed_handshakes_log_one_line_of_each_kind)
{
    setup(NULL, 0);
    for (int i = 0; i < 5; i++) {
        ms_memio_t m;
        ms_conn_t *c = ms_memio_open_ex(srv, &m, ms__tls_size);
        ms__tls_wrap(c, tls, ms_memio_extra(c));
        ms_memio_feed(&m, S("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
        ASSERT(m.conn == NULL);
        ms_memio_free(&m);
    }
    ASSERT_EQ(1, log_lines);
    ASSERT_HAS(last_log, "memory: TLS handshake failed: not TLS");
    /* After the quiet time, the next line says how many there were. */
    srv->tls->failed[FAIL_NOT_TLS].at -= MS_TLS_LOG_EVERY_MS;
    ms_memio_t m;
    ms_conn_t *c = ms_memio_open_ex(srv, &m, ms__tls_size);
    ms__tls_wrap(c, tls, ms_memio_extra(c));
    ms_memio_feed(&m, S("\x16\x03\x01\xff\xff"));
    ms_memio_feed(&m, S("junk that is not a record"));
    ASSERT(m.conn == NULL);
    ms_memio_free(&m);
    ASSERT_EQ(2, log_lines);
    ASSERT_HAS(last_log, "(and 4 more like it since the last line)");
    teardown();
}

TEST(tls_handshake_deadline_closes_a_silent_connection)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.handshake_timeout_ms = 30;
    setup(&lim, 0);
    ms_memio_t m;
    ms_conn_t *c = ms_memio_open_ex(srv, &m, ms__tls_size);
    ms__tls_wrap(c, tls, ms_memio_extra(c));
    ms_memio_feed(&m, S("\x16\x03\x01\x02\x00\x01")); /* half a ClientHello */
    ASSERT(m.conn != NULL);
    uint64_t t0 = uv_now(&loop);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT(m.conn == NULL);
    ASSERT(uv_now(&loop) - t0 >= 25);
    ASSERT_HAS(last_log, "not done within handshake_timeout");
    ASSERT_EQ(1, (long long)srv->stats->timeouts);
    ms_memio_free(&m);
    teardown();
}

/* The certificate hook driven from C as the Lua binding drives it: each wake of its slot
 * takes the waiting handshakes (hook_take: 0, the binding is busy and leaves them queued). */
static ms_tls_hook_t *hook_taken;
static int hook_wakes, hook_take, hook_at_once;

static void on_hook_event(int32_t slot, int status, void *data)
{
    (void)slot, (void)status, (void)data;
    hook_wakes++;
    if (!hook_take)
        return;
    ms_tls_hook_t *h = ms_tls_hook_next(srv);
    if (h != NULL && hook_at_once)
        ms_tls_hook_done(h, 1);
    else if (h != NULL)
        hook_taken = h;
}

static void hook_setup(ms_limits_t *lim, int take, int at_once)
{
    setup(lim, 0);
    hook_taken = NULL;
    hook_wakes = 0;
    hook_take = take;
    hook_at_once = at_once;
    ms_server_on_event(srv, on_hook_event);
    ms_tls_cert_hook(tls, 7);
}

/* The client's first flight reaches the server, which pauses in the hook. */
static void hook_hello(peer_t *p)
{
    peer_open(p, srv, tls, "localhost", NULL, 0);
    ERR_clear_error();
    ASSERT(SSL_do_handshake(p->ssl) != 1);
    peer_to_server(p);
    uv_run(&loop, UV_RUN_NOWAIT);
}

TEST(tls_hook_pauses_the_handshake_until_it_is_done)
{
    hook_setup(NULL, 1, 0);
    peer_t p;
    hook_hello(&p);
    ASSERT_EQ(1, hook_wakes);
    ASSERT(hook_taken != NULL);
    ASSERT(ms_tls_hook_ssl(hook_taken) != NULL);
    ASSERT(ms_tls_hook_conn(hook_taken) == p.c);
    ASSERT_EQ(0, peer_to_client(&p)); /* paused: no ServerHello yet */
    ms_tls_hook_done(hook_taken, 1);
    uv_run(&loop, UV_RUN_NOWAIT); /* (it goes on at the next turn) */
    ASSERT(peer_handshake(&p));
    peer_close(&p);
    /* A hook done at once, inside OpenSSL's callback, goes on without a turn. */
    hook_at_once = 1;
    peer_open(&p, srv, tls, "localhost", NULL, 0);
    ASSERT(peer_handshake(&p));
    ASSERT_EQ(2, hook_wakes);
    peer_close(&p);
    teardown();
}

TEST(tls_hook_outlives_a_client_that_leaves_while_it_runs)
{
    hook_setup(NULL, 1, 0);
    peer_t p;
    hook_hello(&p);
    ms_tls_hook_t *h = hook_taken;
    ASSERT(h != NULL);
    peer_close(&p); /* the client leaves while the hook sleeps */
    uv_run(&loop, UV_RUN_NOWAIT);
    ASSERT(ms_tls_hook_ssl(h) == NULL); /* what ngx.ssl answers: the connection is gone */
    ASSERT(ms_tls_hook_conn(h) == NULL);
    ms_tls_hook_done(h, 1); /* frees it: no resume of a connection that is gone */
    uv_run(&loop, UV_RUN_NOWAIT);
    /* Queued and not yet taken (the binding busy) when the client leaves: unqueued. */
    hook_take = 0;
    hook_hello(&p);
    ASSERT_EQ(2, hook_wakes);
    peer_close(&p);
    ASSERT(ms_tls_hook_next(srv) == NULL);
    /* The next handshake is served. */
    hook_take = 1;
    hook_at_once = 1;
    peer_open(&p, srv, tls, "localhost", NULL, 0);
    ASSERT(peer_handshake(&p));
    peer_close(&p);
    teardown();
}

TEST(tls_hook_that_sleeps_past_handshake_timeout_finds_its_connection_gone)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.handshake_timeout_ms = 30;
    hook_setup(&lim, 1, 0);
    peer_t p;
    hook_hello(&p);
    ms_tls_hook_t *h = hook_taken;
    ASSERT(h != NULL);
    uv_run(&loop, UV_RUN_DEFAULT); /* the deadline closes the connection */
    ASSERT(p.m.conn == NULL);
    ASSERT_HAS(last_log, "not done within handshake_timeout");
    ASSERT_EQ(1, (long long)srv->stats->timeouts);
    ASSERT(ms_tls_hook_ssl(h) == NULL);
    ms_tls_hook_done(h, 0);
    uv_run(&loop, UV_RUN_NOWAIT);
    peer_close(&p);
    teardown();
}

TEST(tls_refuses_a_key_that_is_not_the_certificates)
{
    setup(NULL, 0);
    char *c1, *k1, *c2, *k2, err[256];
    size_t cl1, kl1, cl2, kl2;
    peer_make_cert("a.test", 0, &c1, &cl1, &k1, &kl1);
    peer_make_cert("b.test", 0, &c2, &cl2, &k2, &kl2);
    ASSERT_EQ(UV_EINVAL, ms_tls_cert(tls, "a.test", c1, cl1, k2, kl2, err, sizeof(err)));
    ASSERT_HAS(err, "the private key is not the certificate's");
    ASSERT_EQ(UV_EINVAL, ms_tls_cert(tls, NULL, "junk", 4, k1, kl1, err, sizeof(err)));
    ASSERT_HAS(err, "no certificate in the PEM");
    ASSERT_EQ(UV_EINVAL, ms_tls_cert(tls, NULL, c1, cl1, "junk", 4, err, sizeof(err)));
    ASSERT_HAS(err, "no private key");
    free(c1), free(k1), free(c2), free(k2);
    ms_tls_opts_t bad = {.ciphers = "NOT-A-CIPHER"};
    ASSERT(ms_tls_new(srv, &bad, err, sizeof(err)) == NULL);
    ASSERT_HAS(err, "bad ciphers");
    teardown();
}

/* A handshake offering `sess` (or none), a request and its reply (which brings TLS 1.3's
 * tickets); returns whether the session resumed, and the session now in `*out`. */
static int resumed_with(SSL_SESSION *sess, SSL_SESSION **out)
{
    peer_t p;
    peer_open(&p, srv, tls, "localhost", NULL, 0);
    if (sess != NULL)
        SSL_set_session(p.ssl, sess);
    ms_buf_t got = {0};
    int reused = -1;
    if (peer_handshake(&p)) {
        peer_send(&p, S("GET /x HTTP/1.1\r\nHost: localhost\r\n\r\n"));
        peer_recv(&p, &got);
        reused = SSL_session_reused(p.ssl);
        if (out != NULL)
            *out = SSL_get1_session(p.ssl);
        /* (Closed as if by a close_notify: a session of a connection cut is not resumed.) */
        SSL_set_shutdown(p.ssl, SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
    }
    free(got.base);
    peer_close(&p);
    return reused;
}

TEST(tls_resumes_by_the_zones_keys_the_newest_and_two_before)
{
    setup(NULL, 0);
    ms_tickets_t *zone;
    int fd = ms_tickets_create(&zone); /* the master's */
    ASSERT(fd >= 0);
    ASSERT_EQ(0, ms_tls_tickets(fd));
    close(fd);
    SSL_SESSION *s;
    ASSERT_EQ(0, resumed_with(NULL, &s));
    ASSERT_EQ(1, resumed_with(s, NULL));
    ms_tickets_rotate(zone);
    ms_tickets_rotate(zone);
    ASSERT_EQ(1, resumed_with(s, NULL)); /* made with the oldest key kept */
    ms_tickets_rotate(zone);
    ASSERT_EQ(0, resumed_with(s, NULL)); /* its key is gone: a full handshake */
    SSL_SESSION_free(s);
    /* Another zone (another master): none of its keys made the ticket. */
    ASSERT_EQ(0, resumed_with(NULL, &s));
    ms_tickets_t *other;
    fd = ms_tickets_create(&other);
    ASSERT_EQ(0, ms_tls_tickets(fd));
    close(fd);
    ASSERT_EQ(0, resumed_with(s, NULL));
    SSL_SESSION_free(s);
    ms_tickets_detach(zone);
    ms_tickets_detach(other);
    teardown();
}

/* -- The engine alone, both ways: a client's and a server's over each other's buffers ----- */

TEST(tls_engine_runs_both_directions)
{
    setup(NULL, 0);
    ms_buf_t cout = {0}, sout = {0};
    ms_tls_eng_t cl = {.out = &cout}, sv = {.out = &sout};
    SSL_CTX *cctx = SSL_CTX_new(TLS_client_method());
    ASSERT_EQ(0, ms__tls_eng_open(&cl, cctx, 1, NULL));
    ASSERT_EQ(0, ms__tls_eng_open(&sv, tls->ctx, 0, NULL));
    ASSERT_EQ(MS_TLS_ENG_WANT, ms__tls_eng_handshake(&cl)); /* the ClientHello */
    ASSERT(cout.len > 0);
    /* The ClientHello a byte at a time: the server takes each and waits for the rest. */
    for (size_t i = 0; i < cout.len; i++) {
        sv.in = cout.base + i;
        sv.in_len = 1;
        ASSERT_EQ(MS_TLS_ENG_WANT, ms__tls_eng_handshake(&sv));
        ASSERT_EQ(0, (int)sv.in_len);
        ASSERT(i + 1 == cout.len || sout.len == 0);
    }
    cout.len = 0;
    ASSERT(sout.len > 0); /* its flight */
    cl.in = sout.base;
    cl.in_len = sout.len;
    ASSERT_EQ(MS_TLS_ENG_DONE, ms__tls_eng_handshake(&cl));
    ASSERT_EQ(0, (int)cl.in_len);
    sout.len = 0;
    sv.in = cout.base; /* the client's Finished */
    sv.in_len = cout.len;
    ASSERT_EQ(MS_TLS_ENG_DONE, ms__tls_eng_handshake(&sv));
    cout.len = 0;
    /* Records both ways, into the caller's buffers. */
    ASSERT_EQ(0, ms__tls_eng_write(&cl, S("ping")));
    char buf[64 * 1024];
    sv.in = cout.base;
    sv.in_len = cout.len;
    ASSERT_EQ(4, (int)ms__tls_eng_read(&sv, buf, sizeof(buf)));
    ASSERT(memcmp(buf, "ping", 4) == 0);
    ASSERT_EQ(0, (int)ms__tls_eng_read(&sv, buf, sizeof(buf))); /* wants more */
    cout.len = 0;
    char big[40000];
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (char)('a' + i % 26);
    /* (before them in `sout`: the server's session tickets, made as it read the Finished) */
    ASSERT_EQ(0, ms__tls_eng_write(&sv, big, sizeof(big)));
    ms__tls_eng_shutdown(&sv); /* close_notify after the records */
    cl.in = sout.base;
    cl.in_len = sout.len;
    size_t got = 0;
    ssize_t k;
    while ((k = ms__tls_eng_read(&cl, buf + got, sizeof(buf) - got)) > 0)
        got += (size_t)k;
    ASSERT_EQ((int)sizeof(big), (int)got);
    ASSERT(memcmp(buf, big, sizeof(big)) == 0);
    ASSERT_EQ(UV_EOF, (int)k); /* the close_notify */
    /* Bytes that are no record: an error, the queue left to the caller. */
    sv.in = "\x17\x03\x03\x00\x05hello";
    sv.in_len = 10;
    ASSERT_EQ(UV_EPROTO, (int)ms__tls_eng_read(&sv, buf, sizeof(buf)));
    ASSERT(ERR_peek_error() != 0);
    ERR_clear_error();
    ms__tls_eng_close(&cl);
    ms__tls_eng_close(&sv);
    ASSERT(cl.ssl == NULL && sv.ssl == NULL);
    SSL_CTX_free(cctx);
    ms_mem_free(cout.base);
    ms_mem_free(sout.base);
    teardown();
}

TEST_MAIN()
