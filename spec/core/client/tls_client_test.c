/* tls_client_test.c: sock:sslhandshake's engine on a real loop, against a TLS echo server
 * made here on 127.0.0.1 (OpenSSL over memory BIOs, a certificate made at run time). */
#include "test.h"

#include <stdlib.h>
#include <unistd.h>

#include "../../../core/client/sock.c"
#include "tls_peer.h"

static uv_loop_t loop;
static ms_server_t *srv;
static uv_timer_t guard;
static ms_mem_stats_t mem_before;

static void on_guard(uv_timer_t *t)
{
    fprintf(stderr, "  tls_client_test: a wait took over 10 s\n");
    abort();
}

static void run_once(void)
{
    uv_timer_start(&guard, on_guard, 10000, 0);
    uv_run(&loop, UV_RUN_ONCE);
    uv_timer_stop(&guard);
}

static int done_n, done_rc;

static void on_done(ms_sock_t *s, int status)
{
    done_n++;
    done_rc = status;
}

static int await(int rc)
{
    if (rc != MS_SOCK_PENDING)
        return rc;
    int n = done_n;
    while (done_n == n)
        run_once();
    return done_rc;
}

static const char *err(ms_sock_t *s, int rc)
{
    static char buf[256];
    ms_sock_errmsg(s, rc, buf, sizeof(buf));
    return buf;
}

/* -- The peer: a TLS echo server, or one that never answers, or one that closes ----------- */

enum { P_ECHO, P_SILENT, P_CLOSER };

static SSL_CTX *sctx;
static uv_tcp_t lsn;
static int lport, pkind, paccepted;

typedef struct pconn_s {
    uv_tcp_t tcp;
    SSL *ssl;
    BIO *in, *out;
    char buf[65536];
} pconn_t;

typedef struct pwrite_s {
    uv_write_t req;
    char data[];
} pwrite_t;

static void p_written(uv_write_t *req, int status)
{
    free(req);
}

static void p_closed(uv_handle_t *h)
{
    pconn_t *c = h->data;
    SSL_free(c->ssl);
    free(c);
}

static void p_flush(pconn_t *c)
{
    size_t n = (size_t)BIO_ctrl_pending(c->out);
    if (n == 0)
        return;
    pwrite_t *w = malloc(sizeof(*w) + n);
    BIO_read(c->out, w->data, (int)n);
    uv_buf_t b = uv_buf_init(w->data, (unsigned)n);
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, p_written) != 0)
        free(w);
}

static void p_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    pconn_t *c = h->data;
    *buf = uv_buf_init(c->buf, sizeof(c->buf));
}

static void p_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    pconn_t *c = st->data;
    if (n < 0 || pkind == P_CLOSER) {
        uv_close((uv_handle_t *)&c->tcp, p_closed);
        return;
    }
    if (pkind == P_SILENT)
        return;
    BIO_write(c->in, buf->base, (int)n);
    if (!SSL_is_init_finished(c->ssl) && SSL_do_handshake(c->ssl) != 1) {
        p_flush(c);
        return;
    }
    char plain[16384];
    int k;
    while ((k = SSL_read(c->ssl, plain, sizeof(plain))) > 0)
        SSL_write(c->ssl, plain, k);
    p_flush(c);
}

static void p_accept(uv_stream_t *ls, int status)
{
    pconn_t *c = calloc(1, sizeof(*c));
    uv_tcp_init(&loop, &c->tcp);
    c->tcp.data = c;
    uv_accept(ls, (uv_stream_t *)&c->tcp);
    c->ssl = SSL_new(sctx);
    c->in = BIO_new(BIO_s_mem());
    c->out = BIO_new(BIO_s_mem());
    SSL_set_bio(c->ssl, c->in, c->out);
    SSL_set_accept_state(c->ssl);
    paccepted++;
    uv_read_start((uv_stream_t *)&c->tcp, p_alloc, p_read);
}

static void close_walk(uv_handle_t *h, void *arg)
{
    /* After ms_server_free the core's handles are closing: the open ones are the peer's. */
    if (h->type == UV_TCP && h != (uv_handle_t *)&lsn && !uv_is_closing(h))
        uv_close(h, p_closed);
}

static char cafile[64];

/* The loop, the server under test, and the peer with a self-signed certificate for
 * "localhost", which is also written to `cafile`. */
static void setup(int kind)
{
    uv_loop_init(&loop);
    mem_before = ms_mem_stats;
    srv = ms_server_new(&loop, NULL, NULL, NULL, NULL);
    uv_timer_init(&loop, &guard);
    char *cert, *key;
    size_t cl, kl;
    peer_make_cert("localhost", 0, &cert, &cl, &key, &kl);
    strcpy(cafile, "/tmp/ms-tls-client-XXXXXX");
    int fd = mkstemp(cafile);
    if (fd < 0 || write(fd, cert, cl) != (ssize_t)cl)
        abort();
    close(fd);
    sctx = SSL_CTX_new(TLS_server_method());
    BIO *b = BIO_new_mem_buf(cert, (int)cl);
    X509 *x = PEM_read_bio_X509(b, NULL, NULL, NULL);
    BIO_free(b);
    b = BIO_new_mem_buf(key, (int)kl);
    EVP_PKEY *k = PEM_read_bio_PrivateKey(b, NULL, NULL, NULL);
    BIO_free(b);
    SSL_CTX_use_certificate(sctx, x);
    SSL_CTX_use_PrivateKey(sctx, k);
    X509_free(x);
    EVP_PKEY_free(k);
    free(cert);
    free(key);
    pkind = kind;
    paccepted = 0;
    uv_tcp_init(&loop, &lsn);
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", 0, &a);
    uv_tcp_bind(&lsn, (struct sockaddr *)&a, 0);
    uv_listen((uv_stream_t *)&lsn, 16, p_accept);
    int len = sizeof(a);
    uv_tcp_getsockname(&lsn, (struct sockaddr *)&a, &len);
    lport = ntohs(a.sin_port);
}

/* Frees the server and the peer, and checks nothing is left of the core's allocations. */
static int teardown(void)
{
    uv_close((uv_handle_t *)&guard, NULL);
    ms_server_free(srv);
    uv_walk(&loop, close_walk, NULL);
    uv_close((uv_handle_t *)&lsn, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    SSL_CTX_free(sctx);
    unlink(cafile);
    if (uv_loop_close(&loop) != 0) {
        uv_print_all_handles(&loop, stderr);
        return 0;
    }
    return ms_mem_stats.allocs - mem_before.allocs == ms_mem_stats.frees - mem_before.frees;
}

static ms_sock_t *open_sock(const ms_sock_opts_t *o)
{
    ms_sock_t *s = ms_sock_new(srv);
    if (await(ms_sock_connect(s, "127.0.0.1", 9, lport, o, on_done)) != MS_SOCK_DONE) {
        fprintf(stderr, "  tls_client_test: cannot connect to the peer\n");
        abort();
    }
    return s;
}

static int handshake(ms_sock_t *s, const char *name, int verify, ms_tls_session_t *sess)
{
    ms_sock_tls_opts_t o = {name, name ? strlen(name) : 0, verify, 0, sess};
    return await(ms_sock_sslhandshake(s, &o, on_done));
}

TEST(tls_client_verifies_echoes_pools_and_resumes)
{
    setup(P_ECHO);
    /* Not trusted yet: OpenResty's "<code>: <reason>", and the socket is closed. */
    ms_sock_t *s = open_sock(NULL);
    int rc = handshake(s, "localhost", 1, NULL);
    ASSERT_EQ(MS_SOCK_EVERIFY, rc);
    ASSERT_STR_EQ("18: self-signed certificate", err(s, rc));
    ASSERT_EQ(UV_ENOTCONN, ms_sock_fd(s));
    char why[256];
    ms_sock_free(s);
    ASSERT_EQ(0, ms_sock_tls_trust(srv, cafile, why, sizeof(why)));
    ASSERT(ms_sock_tls_trust(srv, "/nonexistent/ca.pem", why, sizeof(why)) < 0);
    /* Trusted, for another name. */
    s = open_sock(NULL);
    rc = handshake(s, "other.test", 1, NULL);
    ASSERT_STR_EQ("certificate host mismatch", err(s, rc));
    /* Trusted and right: 1 MB each way through a small send buffer, so that most of it goes
     * out in the background while the echo comes back and is held back (the read buffer is
     * full and nobody reads) until the read starts. */
    ms_sock_opts_t po = {"tls", 3, 0, 0, 0};
    ASSERT(await(ms_sock_connect(s, "127.0.0.1", 9, lport, &po, on_done)) == MS_SOCK_DONE);
    ASSERT_EQ(MS_SOCK_DONE, handshake(s, "localhost", 1, NULL));
    const char *version, *cipher;
    ASSERT_EQ(0, ms_sock_tls_info(s, &version, &cipher));
    ASSERT_STR_EQ("TLSv1.3", version);
    size_t big = 1000000;
    int small = 4096;
    ASSERT_EQ(0, setsockopt(ms_sock_fd(s), SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)));
    char *out = malloc(big);
    for (size_t i = 0; i < big; i++)
        out[i] = (char)('a' + i % 26);
    uv_buf_t b = uv_buf_init(out, (unsigned)big);
    rc = ms_sock_send(s, &b, 1, on_done);
    ASSERT_EQ(MS_SOCK_PENDING, rc);
    ASSERT_EQ(MS_SOCK_DONE, await(rc));
    ASSERT(s->read_off); /* the peer is held back */
    memset(out, 0, 16);  /* encrypted at the call: the bytes need not live on */
    ASSERT_EQ(MS_SOCK_DONE, await(ms_sock_receive(s, MS_SOCK_BYTES, big, on_done)));
    ASSERT_EQ(big, s->v.len);
    ASSERT(memcmp(s->v.data + 16, "qrstuvwxyz", 10) == 0);
    free(out);
    ms_tls_session_t *sess = ms_sock_tls_session(s);
    ASSERT(sess != NULL);
    /* Pooled: the next connect takes it, and its handshake is done already. */
    ASSERT_EQ(MS_SOCK_DONE, ms_sock_setkeepalive(s, -1, 0));
    ASSERT_EQ(MS_SOCK_DONE, ms_sock_connect(s, "127.0.0.1", 9, lport, &po, on_done));
    ASSERT_EQ(1, s->v.reused);
    ms_sock_tls_opts_t o = {"localhost", 9, 1, 0, NULL};
    ASSERT_EQ(MS_SOCK_DONE, ms_sock_sslhandshake(s, &o, on_done));
    b = uv_buf_init("hi\n", 3);
    ASSERT(await(ms_sock_send(s, &b, 1, on_done)) == MS_SOCK_DONE);
    ASSERT_EQ(MS_SOCK_DONE, await(ms_sock_receive(s, MS_SOCK_LINE, 0, on_done)));
    ASSERT_EQ(2, s->v.len);
    ASSERT_EQ(MS_SOCK_DONE, ms_sock_close(s));
    /* A new connection resumes the session the first one was given. */
    ms_sock_free(s);
    s = open_sock(NULL);
    ASSERT_EQ(MS_SOCK_DONE, handshake(s, "localhost", 1, sess));
    ASSERT_EQ(1, ms_sock_tls_info(s, &version, &cipher));
    ms_tls_session_free(sess);
    ms_sock_free(s);
    ASSERT_EQ(4, paccepted);
    ASSERT(teardown());
}

TEST(tls_client_handshake_timeout_and_peer_close)
{
    setup(P_SILENT);
    ms_sock_t *s = open_sock(NULL);
    ms_sock_settimeouts(s, 150, 1000, 1000);
    uv_update_time(&loop);
    uint64_t t0 = uv_now(&loop);
    int rc = handshake(s, "localhost", 0, NULL);
    ASSERT_STR_EQ("timeout", err(s, rc));
    ASSERT(uv_now(&loop) - t0 >= 140);
    pkind = P_CLOSER;
    ms_sock_settimeouts(s, 1000, 1000, 1000);
    ASSERT(await(ms_sock_connect(s, "127.0.0.1", 9, lport, NULL, on_done)) == MS_SOCK_DONE);
    rc = handshake(s, "localhost", 0, NULL);
    ASSERT_STR_EQ("handshake failed", err(s, rc));
    ms_sock_free(s);
    ASSERT(teardown());
}

TEST(tls_client_refuses_a_client_key_for_another_certificate)
{
    setup(P_ECHO);
    char *c1, *k1, *c2, *k2, why[256];
    size_t c1l, k1l, c2l, k2l;
    peer_make_cert("one", 0, &c1, &c1l, &k1, &k1l);
    peer_make_cert("two", 0, &c2, &c2l, &k2, &k2l);
    ms_sock_t *s = ms_sock_new(srv);
    ASSERT_EQ(0, ms_sock_setclientcert(s, c1, c1l, k1, k1l, why, sizeof(why)));
    ASSERT_EQ(UV_EINVAL, ms_sock_setclientcert(s, c1, c1l, k2, k2l, why, sizeof(why)));
    ASSERT(strstr(why, "does not match") != NULL);
    ASSERT_EQ(UV_EINVAL, ms_sock_setclientcert(s, "junk", 4, k1, k1l, why, sizeof(why)));
    free(c1), free(k1), free(c2), free(k2);
    ms_sock_free(s);
    ASSERT(teardown());
}

TEST_MAIN()
