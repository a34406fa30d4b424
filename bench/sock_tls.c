/* sock_tls.c: client sockets over TLS (sock:sslhandshake) against moonserve's own TLS
 * listener on 127.0.0.1, both in this process on one loop, so that callgrind counts the
 * client's work and the server's: run it with two counts and divide the difference.
 *   sock_tls N [rt|full|resumed]
 * rt: one connection and one handshake, then N round trips (a GET and its reply); full: N
 * connections, each with a full handshake and one round trip; resumed: the same, each offering
 * the session of the one before. Prints the operations per second, and how many resumed. */
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/sock.h"
#include "moonserve.h"

static char *pem_of(BIO *b, size_t *len)
{
    char *p;
    long n = BIO_get_mem_data(b, &p);
    char *out = malloc((size_t)n);
    memcpy(out, p, (size_t)n);
    *len = (size_t)n;
    BIO_free(b);
    return out;
}

/* A self-signed ECDSA P-256 certificate and its key, PEM. */
static void make_cert(char **cert, size_t *cl, char **key, size_t *kl)
{
    EVP_PKEY *k = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -60);
    X509_gmtime_adj(X509_getm_notAfter(x), 86400);
    X509_set_pubkey(x, k);
    X509_NAME *n = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)"localhost", -1, -1,
                               0);
    X509_set_issuer_name(x, n);
    X509_sign(x, k, EVP_sha256());
    BIO *b = BIO_new(BIO_s_mem());
    PEM_write_bio_X509(b, x);
    *cert = pem_of(b, cl);
    b = BIO_new(BIO_s_mem());
    PEM_write_bio_PrivateKey(b, k, NULL, NULL, 0, NULL, NULL);
    *key = pem_of(b, kl);
    X509_free(x);
    EVP_PKEY_free(k);
}

static void on_request(ms_req_t *r, void *data)
{
    (void)data;
    ms_reply_send(r, "hello world", 11, MS_VEC_STATIC, -1);
    ms_req_finish(r);
}

enum { S_CONNECT, S_HANDSHAKE, S_SEND, S_RECEIVE, S_NEXT };

static ms_server_t *srv;
static ms_sock_t *sock;
static ms_sock_until_t *until;
static ms_tls_session_t *last;
static int port, mode, state, failed;
static long left, resumed;

static const char req[] = "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";

static void step(ms_sock_t *s, int status);

/* Runs the client's steps until one waits (or all are done). */
static void go(int rc)
{
    while (rc != MS_SOCK_PENDING) {
        if (rc < 0) {
            fprintf(stderr, "sock_tls: %s in step %d\n", ms_sock_strerror(rc), state);
            failed = 1;
            ms_server_stop(srv, NULL);
            return;
        }
        switch (state) {
        case S_CONNECT:
            state = S_HANDSHAKE;
            ms_sock_tls_opts_t o = {.session = mode == 2 ? last : NULL};
            rc = ms_sock_sslhandshake(sock, &o, step);
            break;
        case S_HANDSHAKE: {
            const char *v, *c;
            resumed += ms_sock_tls_info(sock, &v, &c) == 1;
            if (mode == 2) {
                ms_tls_session_free(last);
                last = ms_sock_tls_session(sock);
            }
            state = S_SEND;
            rc = MS_SOCK_DONE;
            break;
        }
        case S_SEND: {
            uv_buf_t b = uv_buf_init((char *)req, sizeof(req) - 1);
            state = S_RECEIVE;
            rc = ms_sock_send(sock, &b, 1, step);
            break;
        }
        case S_RECEIVE:
            state = S_NEXT;
            rc = ms_sock_receiveuntil(sock, until, 0, step);
            break;
        case S_NEXT:
            if (--left <= 0) {
                ms_sock_close(sock);
                ms_server_stop(srv, NULL);
                return;
            }
            if (mode == 0) {
                state = S_SEND;
                rc = MS_SOCK_DONE;
                break;
            }
            ms_sock_close(sock);
            state = S_CONNECT;
            rc = ms_sock_connect(sock, "127.0.0.1", 9, port, NULL, step);
            break;
        }
    }
}

static void step(ms_sock_t *s, int status)
{
    (void)s;
    go(status == MS_SOCK_END ? -1 : status);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000;
    const char *m = argc > 2 ? argv[2] : "rt";
    mode = strcmp(m, "full") == 0 ? 1 : strcmp(m, "resumed") == 0 ? 2 : 0;
    uv_loop_t loop;
    uv_loop_init(&loop);
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.requests_per_connection = 0xffffffffu;
    ms_log_set(NULL, MS_LOG_ERR);
    srv = ms_server_new(&loop, &lim, on_request, NULL, NULL);
    char err[256], *cert, *key;
    size_t cl, kl;
    make_cert(&cert, &cl, &key, &kl);
    ms_tls_opts_t to = {.no_ktls = 1};
    ms_tls_t *t = ms_tls_new(srv, &to, err, sizeof(err));
    if (t == NULL || ms_tls_cert(t, NULL, cert, cl, key, kl, err, sizeof(err)) < 0 ||
        ms_server_listen(srv, "127.0.0.1:0", 128, 0) < 0 || ms_server_listen_tls(srv, t) < 0) {
        fprintf(stderr, "sock_tls: %s\n", err);
        return 1;
    }
    port = ms_server_port(srv);
    sock = ms_sock_new(srv);
    until = ms_sock_until_new("hello world", 11, 1);
    left = n;
    double t0 = now();
    state = S_CONNECT;
    go(ms_sock_connect(sock, "127.0.0.1", 9, port, NULL, step));
    uv_run(&loop, UV_RUN_DEFAULT);
    double dt = now() - t0;
    printf("%s %ld in %.3f s: %.0f/s, resumed %ld\n", m, n, dt, n / dt, resumed);
    ms_tls_session_free(last);
    ms_sock_until_free(until);
    ms_sock_free(sock);
    ms_server_free(srv);
    uv_loop_close(&loop);
    free(cert);
    free(key);
    return failed;
}
