/* tls_peer.h: a TLS client in memory for the C tests and the fuzzer: certificates made at run
 * time, and an OpenSSL client over memory BIOs talking to a server connection on the memory
 * transport with TLS stacked on it (ms__tls_wrap). */
#ifndef MS_TLS_PEER_H
#define MS_TLS_PEER_H

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/engine.h"
#include "transport/memio.h"

/* PEM text of a BIO, NUL-terminated, malloc()ed. */
static inline char *peer_pem(BIO *b, size_t *len)
{
    char *p;
    long n = BIO_get_mem_data(b, &p);
    char *out = malloc((size_t)n + 1);
    memcpy(out, p, (size_t)n);
    out[n] = 0;
    *len = (size_t)n;
    BIO_free(b);
    return out;
}

/* A self-signed certificate for `cn` (also its DNS subjectAltName), ECDSA P-256 or RSA, and
 * its key, as PEM; the caller frees both. */
static inline void peer_make_cert(const char *cn, int rsa, char **cert, size_t *cert_len, char **key,
                           size_t *key_len)
{
    EVP_PKEY *k = rsa ? EVP_RSA_gen(2048) : EVP_EC_gen("P-256");
    X509 *x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -60);
    X509_gmtime_adj(X509_getm_notAfter(x), 86400);
    X509_set_pubkey(x, k);
    X509_NAME *n = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
    X509_set_issuer_name(x, n);
    char san[300];
    snprintf(san, sizeof(san), "DNS:%s", cn);
    X509V3_CTX v;
    X509V3_set_ctx_nodb(&v);
    X509V3_set_ctx(&v, x, x, NULL, NULL, 0);
    X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, &v, NID_subject_alt_name, san);
    X509_add_ext(x, e, -1);
    X509_EXTENSION_free(e);
    X509_sign(x, k, EVP_sha256());
    BIO *b = BIO_new(BIO_s_mem());
    PEM_write_bio_X509(b, x);
    *cert = peer_pem(b, cert_len);
    b = BIO_new(BIO_s_mem());
    PEM_write_bio_PrivateKey(b, k, NULL, NULL, 0, NULL, NULL);
    *key = peer_pem(b, key_len);
    X509_free(x);
    EVP_PKEY_free(k);
}

/* Adds a made certificate for `cn` to `t` (for the name `name`; NULL: the default one). */
static inline int peer_add_cert(ms_tls_t *t, const char *name, const char *cn, int rsa)
{
    char *cert, *key, err[256];
    size_t cl, kl;
    peer_make_cert(cn, rsa, &cert, &cl, &key, &kl);
    int rc = ms_tls_cert(t, name, cert, cl, key, kl, err, sizeof(err));
    if (rc < 0)
        fprintf(stderr, "ms_tls_cert: %s\n", err);
    free(cert);
    free(key);
    return rc;
}

typedef struct peer_s {
    SSL_CTX *ctx;
    SSL *ssl;
    BIO *in, *out; /* the client's: what the server sent it, what it sends */
    ms_memio_t m;
    ms_conn_t *c;
} peer_t;

/* A client with server name `sni` (or none) offering the ALPN list `alpn` (wire format, or
 * NULL), and the server's side of its connection, on `s` with `tls`. */
static inline void peer_open(peer_t *p, ms_server_t *s, ms_tls_t *tls, const char *sni,
                      const char *alpn, size_t alpn_len)
{
    p->ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_verify(p->ctx, SSL_VERIFY_NONE, NULL);
    p->ssl = SSL_new(p->ctx);
    p->in = BIO_new(BIO_s_mem());
    p->out = BIO_new(BIO_s_mem());
    SSL_set_bio(p->ssl, p->in, p->out);
    SSL_set_connect_state(p->ssl);
    if (sni != NULL)
        SSL_set_tlsext_host_name(p->ssl, sni);
    if (alpn != NULL)
        SSL_set_alpn_protos(p->ssl, (const unsigned char *)alpn, (unsigned)alpn_len);
    p->c = ms_memio_open_ex(s, &p->m, ms__tls_size);
    ms__tls_wrap(p->c, tls, ms_memio_extra(p->c));
}

/* What the client wrote goes to the server. */
static inline int peer_to_server(peer_t *p)
{
    char buf[4096];
    int n, moved = 0;
    while ((n = BIO_read(p->out, buf, sizeof(buf))) > 0) {
        ms_memio_feed(&p->m, buf, (size_t)n);
        moved = 1;
    }
    return moved;
}

/* What the server wrote goes to the client (a congested transport is drained first). */
static inline int peer_to_client(peer_t *p)
{
    for (int i = 0; i < 100000 && p->m.held.len > 0; i++)
        ms_memio_drain(&p->m);
    if (p->m.out.len == 0)
        return 0;
    BIO_write(p->in, p->m.out.base, (int)p->m.out.len);
    p->m.out.len = 0;
    return 1;
}

/* Runs the handshake to its end; returns 1 if it is done. */
static inline int peer_handshake(peer_t *p)
{
    for (int i = 0; i < 20; i++) {
        ERR_clear_error();
        int rc = SSL_do_handshake(p->ssl);
        int e = rc == 1 ? SSL_ERROR_NONE : SSL_get_error(p->ssl, rc);
        peer_to_server(p);
        peer_to_client(p);
        if (rc == 1)
            return p->m.conn != NULL;
        if (e != SSL_ERROR_WANT_READ)
            return 0;
    }
    return 0;
}

static inline void peer_send(peer_t *p, const char *data, size_t len)
{
    if (len > 0)
        SSL_write(p->ssl, data, (int)len);
    peer_to_server(p);
}

/* Reads what the server sent, as plaintext, appended to `into`; returns the bytes read. */
static inline size_t peer_recv(peer_t *p, ms_buf_t *into)
{
    size_t got = 0;
    for (int i = 0; i < 1000; i++) {
        int moved = peer_to_client(p);
        char buf[16384];
        int n;
        while ((n = SSL_read(p->ssl, buf, sizeof(buf))) > 0) {
            ms__buf_append(into, buf, (size_t)n);
            got += (size_t)n;
        }
        moved |= peer_to_server(p); /* (tickets answered, alerts) */
        if (!moved)
            break;
    }
    return got;
}

/* Closes the client and the server's side of the connection. */
static inline void peer_close(peer_t *p)
{
    if (p->m.conn != NULL)
        ms_memio_peer_close(&p->m, UV_ECONNRESET);
    ms_memio_free(&p->m);
    SSL_free(p->ssl);
    SSL_CTX_free(p->ctx);
}

#endif
