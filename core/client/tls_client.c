/* tls_client.c: what only a client has of TLS on outbound sockets (sock:sslhandshake): the
 * worker's client context (the system's CA store plus a trusted file), verification, SNI,
 * client certificates, sessions to resume and the pool's handshake identity, over the one TLS
 * engine (transport/tls_engine.h), which steps OpenSSL for both directions. It does no I/O:
 * sock.c hands it the ciphertext libuv read and writes what the engine leaves in `out`. */
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <arpa/inet.h>
#include <stdio.h>

#include "client/sockets.h"
#include "transport/tls_engine.h"

/* Room libuv gets for one read of ciphertext: a whole record and its header. */
#define MS_STLS_READ (16 * 1024 + 512)

/* A session to resume, shared: the connection that made it holds one reference and updates
 * it when a ticket comes after the handshake (TLS 1.3 sends them then), and every session
 * object the binding handed out holds one. */
struct ms_tls_session_s {
    SSL_SESSION *sess; /* NULL until the server gave one that can be resumed */
    uint32_t refs;
};

struct ms_stls_cert_s {
    unsigned char fp[32]; /* the leaf's SHA-256: a pooled connection's identity names it */
    X509 *leaf;
    STACK_OF(X509) *chain; /* the certificates after the first, may be NULL */
    EVP_PKEY *key;
};

struct ms_stls_s {
    ms_tls_eng_t eng;          /* the SSL; its `in` is set from `in` around each call */
    ms_tls_session_t *session; /* a reference */
    ms_buf_t in;               /* owned: ciphertext read, [in_pos, in.len) not yet OpenSSL's */
    size_t in_pos;
    ms_buf_t out; /* owned: ciphertext OpenSSL wrote (the engine's `out`), for sock.c to send */
    int verr;     /* the first certificate error met (X509_V_ERR_*), 0: none */
    uint8_t done; /* the handshake completed */
    /* What the handshake was asked for (tls_identity): a pooled connection is handed over
     * TLS only to a handshake that asks for the same. */
    unsigned char id[32];
};

/* -- Sessions --------------------------------------------------------------------------- */

static ms_tls_session_t *session_new(void)
{
    ms_tls_session_t *b = ms_mem_alloc(sizeof(*b));
    b->sess = NULL;
    b->refs = 1;
    return b;
}

void ms_tls_session_free(ms_tls_session_t *b)
{
    if (b == NULL || --b->refs > 0)
        return;
    if (b->sess)
        SSL_SESSION_free(b->sess);
    ms_mem_free(b);
}

/* OpenSSL has a session the server will resume: after the handshake (TLS 1.2), or with each
 * ticket that follows it (TLS 1.3). Returns 1: the reference is ours. */
static int on_new_session(SSL *ssl, SSL_SESSION *sess)
{
    ms_stls_t *t = SSL_get_app_data(ssl);
    if (t == NULL || !SSL_SESSION_is_resumable(sess))
        return 0;
    if (t->session->sess)
        SSL_SESSION_free(t->session->sess);
    t->session->sess = sess;
    return 1;
}

/* -- The engine's input --------------------------------------------------------------- */

/* The ciphertext not yet taken is the engine's to read during one call into it. */
static void in_give(ms_stls_t *t)
{
    t->eng.in = t->in.base + t->in_pos;
    t->eng.in_len = t->in.len - t->in_pos;
}

/* ... and what it left is ours again. */
static void in_taken(ms_stls_t *t)
{
    t->in_pos = t->in.len - t->eng.in_len;
    if (t->in_pos == t->in.len)
        t->in_pos = t->in.len = 0;
    t->eng.in = NULL;
    t->eng.in_len = 0;
}

/* -- The worker's context --------------------------------------------------------------- */

static void set_err(char *err, size_t len, const char *what, const char *file)
{
    if (err == NULL || len == 0)
        return;
    unsigned long e = ERR_peek_last_error();
    char why[160] = "";
    if (e)
        ERR_error_string_n(e, why, sizeof(why));
    ERR_clear_error();
    if (file)
        snprintf(err, len, "%s %s%s%s", what, file, why[0] ? ": " : "", why);
    else
        snprintf(err, len, "%s%s%s", what, why[0] ? ": " : "", why);
}

/* The client context of the worker, made at first use: TLS 1.2 and 1.3, the system's CA
 * store, no renegotiation, no record buffers on an idle connection. */
static SSL_CTX *client_ctx(ms_sockets_t *sk)
{
    if (sk->tls_ctx != NULL)
        return sk->tls_ctx;
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL)
        return NULL;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    /* Debian's ca-certificates: /etc/ssl/certs, looked up by hash as a chain needs them. */
    SSL_CTX_set_default_verify_paths(ctx);
    /* Sessions are the binding's to keep (sock:sslhandshake returns them), not a cache's. */
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(ctx, on_new_session);
    ERR_clear_error();
    sk->tls_ctx = ctx;
    return ctx;
}

int ms_sock_tls_trust(ms_server_t *srv, const char *file, char *err, size_t errlen)
{
    ms_sockets_t *sk = ms__sockets(srv);
    SSL_CTX *ctx = client_ctx(sk);
    if (ctx == NULL) {
        set_err(err, errlen, "cannot make a TLS context", NULL);
        return MS_SOCK_ESSL;
    }
    ERR_clear_error();
    if (SSL_CTX_load_verify_locations(ctx, file, NULL) != 1) {
        set_err(err, errlen, "cannot load the trusted certificates in", file);
        return UV_EINVAL;
    }
    sk->trust_gen++; /* pooled connections verified before were verified against less */
    return 0;
}

void ms__stls_ctx_free(ms_sockets_t *sk)
{
    if (sk->tls_ctx)
        SSL_CTX_free(sk->tls_ctx);
    sk->tls_ctx = NULL;
}

/* -- Client certificates ---------------------------------------------------------------- */

static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    (void)buf, (void)size, (void)rwflag, (void)u;
    return 0; /* an encrypted key is refused rather than asked for on a terminal */
}

void ms__stls_cert_free(ms_stls_cert_t *c)
{
    if (c == NULL)
        return;
    X509_free(c->leaf);
    if (c->chain)
        sk_X509_pop_free(c->chain, X509_free);
    EVP_PKEY_free(c->key);
    ms_mem_free(c);
}

ms_stls_cert_t *ms__stls_cert_new(const char *cert, size_t cert_len, const char *key,
                                  size_t key_len, char *err, size_t errlen)
{
    ms_stls_cert_t *c = ms_mem_alloc(sizeof(*c));
    memset(c, 0, sizeof(*c));
    ERR_clear_error();
    BIO *b = BIO_new_mem_buf(cert, (int)cert_len);
    c->leaf = b ? PEM_read_bio_X509(b, NULL, no_passphrase, NULL) : NULL;
    if (c->leaf == NULL) {
        BIO_free(b);
        set_err(err, errlen, "bad client certificate", NULL);
        ms__stls_cert_free(c);
        return NULL;
    }
    X509 *x;
    while ((x = PEM_read_bio_X509(b, NULL, no_passphrase, NULL)) != NULL) {
        if (c->chain == NULL)
            c->chain = sk_X509_new_null();
        sk_X509_push(c->chain, x);
    }
    ERR_clear_error(); /* the end of the PEM text */
    BIO_free(b);
    b = BIO_new_mem_buf(key, (int)key_len);
    c->key = b ? PEM_read_bio_PrivateKey(b, NULL, no_passphrase, NULL) : NULL;
    BIO_free(b);
    if (c->key == NULL) {
        set_err(err, errlen, "bad client key", NULL);
        ms__stls_cert_free(c);
        return NULL;
    }
    if (X509_check_private_key(c->leaf, c->key) != 1) {
        set_err(err, errlen, "the client key does not match its certificate", NULL);
        ms__stls_cert_free(c);
        return NULL;
    }
    unsigned int fplen = sizeof(c->fp);
    if (X509_digest(c->leaf, EVP_sha256(), c->fp, &fplen) != 1) {
        set_err(err, errlen, "bad client certificate", NULL);
        ms__stls_cert_free(c);
        return NULL;
    }
    return c;
}

/* -- A connection ----------------------------------------------------------------------- */

/* A certificate the server sent does not verify: the first reason is kept (for "20: unable
 * to get local issuer certificate", "certificate host mismatch") and the handshake ends. */
static int on_verify(int ok, X509_STORE_CTX *store)
{
    if (ok)
        return 1;
    SSL *ssl = X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx());
    ms_stls_t *t = ssl ? SSL_get_app_data(ssl) : NULL;
    if (t && t->verr == 0)
        t->verr = X509_STORE_CTX_get_error(store);
    return 0;
}

/* A handshake's wishes as one digest: the name (SNI and what is verified), verification
 * on or off, the trusted CAs as they were (their generation) and the client certificate.
 * A connection set up with verify off, another name or another certificate must not pass
 * for one that was asked for these (the resumed session and OCSP change nothing the peer
 * is trusted for). */
static void tls_identity(const ms_sockets_t *sk, const ms_sock_tls_opts_t *o,
                         const ms_stls_cert_t *cert, unsigned char out[32])
{
    unsigned char b[1 + 4 + 1 + 32 + MS_HOST_MAX];
    size_t n = 0, nlen = o->name ? o->name_len : 0;
    b[n++] = o->verify ? 1 : 0;
    memcpy(b + n, &sk->trust_gen, 4);
    n += 4;
    b[n++] = cert != NULL;
    if (cert)
        memcpy(b + n, cert->fp, 32);
    n += 32;
    if (nlen > MS_HOST_MAX)
        nlen = MS_HOST_MAX; /* (refused by ms__stls_new) */
    memcpy(b + n, o->name ? o->name : "", nlen);
    n += nlen;
    if (!cert)
        memset(b + 6, 0, 32);
    unsigned int len = 32;
    EVP_Digest(b, n, out, &len, EVP_sha256(), NULL);
}

int ms__stls_same(const ms_stls_t *t, const ms_sockets_t *sk, const ms_sock_tls_opts_t *o,
                  const ms_stls_cert_t *cert)
{
    unsigned char id[32];
    tls_identity(sk, o, cert, id);
    return CRYPTO_memcmp(id, t->id, sizeof(id)) == 0;
}

static int is_address(const char *name)
{
    unsigned char a[16];
    return inet_pton(AF_INET, name, a) == 1 || inet_pton(AF_INET6, name, a) == 1;
}

ms_stls_t *ms__stls_new(ms_sockets_t *sk, const ms_sock_tls_opts_t *o, const ms_stls_cert_t *cert,
                        int *err)
{
    SSL_CTX *ctx = client_ctx(sk);
    if (ctx == NULL) {
        *err = MS_SOCK_ESSL;
        return NULL;
    }
    char name[MS_HOST_MAX + 1];
    size_t nlen = o->name ? o->name_len : 0;
    if (nlen > MS_HOST_MAX || (nlen && memchr(o->name, 0, nlen))) {
        *err = UV_EINVAL;
        return NULL;
    }
    memcpy(name, o->name ? o->name : "", nlen);
    name[nlen] = 0;
    ms_stls_t *t = ms_mem_alloc(sizeof(*t));
    memset(t, 0, sizeof(*t));
    t->eng.out = &t->out;
    if (ms__tls_eng_open(&t->eng, ctx, 1, NULL) < 0) {
        ms_mem_free(t);
        *err = MS_SOCK_ESSL;
        return NULL;
    }
    SSL *ssl = t->eng.ssl;
    t->session = session_new();
    tls_identity(sk, o, cert, t->id);
    SSL_set_app_data(ssl, t);
    int addr = nlen && is_address(name);
    /* SNI names a host, never an address (RFC 6066 3). */
    if (nlen && !addr)
        SSL_set_tlsext_host_name(ssl, name);
    if (o->verify) {
        SSL_set_verify(ssl, SSL_VERIFY_PEER, on_verify);
        if (nlen) {
            X509_VERIFY_PARAM *p = SSL_get0_param(ssl);
            X509_VERIFY_PARAM_set_hostflags(p, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
            if (addr)
                X509_VERIFY_PARAM_set1_ip_asc(p, name);
            else
                X509_VERIFY_PARAM_set1_host(p, name, nlen);
        }
    } else {
        SSL_set_verify(ssl, SSL_VERIFY_NONE, NULL);
    }
    if (o->ocsp)
        SSL_set_tlsext_status_type(ssl, TLSEXT_STATUSTYPE_ocsp);
    if (o->session && o->session->sess && SSL_SESSION_is_resumable(o->session->sess))
        SSL_set_session(ssl, o->session->sess);
    if (cert) {
        SSL_use_certificate(ssl, cert->leaf);
        SSL_use_PrivateKey(ssl, cert->key);
        for (int i = 0; cert->chain && i < sk_X509_num(cert->chain); i++)
            SSL_add1_chain_cert(ssl, sk_X509_value(cert->chain, i));
    }
    ERR_clear_error();
    return t;
}

void ms__stls_free(ms_stls_t *t)
{
    if (t == NULL)
        return;
    SSL_set_app_data(t->eng.ssl, NULL);
    ms__tls_eng_close(&t->eng);
    ms_tls_session_free(t->session);
    ms_mem_free(t->in.base);
    ms_mem_free(t->out.base);
    ms_mem_free(t);
}

int ms__stls_handshake(ms_stls_t *t)
{
    in_give(t);
    int r = ms__tls_eng_handshake(&t->eng);
    in_taken(t);
    if (r == MS_TLS_ENG_DONE) {
        t->done = 1;
        SSL_SESSION *sess = SSL_get0_session(t->eng.ssl);
        if (t->session->sess == NULL && sess && SSL_SESSION_is_resumable(sess))
            t->session->sess = SSL_get1_session(t->eng.ssl);
        return MS_SOCK_DONE;
    }
    if (r == MS_TLS_ENG_WANT)
        return MS_SOCK_PENDING;
    ERR_clear_error();
    if (t->verr == X509_V_ERR_HOSTNAME_MISMATCH || t->verr == X509_V_ERR_IP_ADDRESS_MISMATCH)
        return MS_SOCK_EHOST;
    if (t->verr != 0)
        return MS_SOCK_EVERIFY;
    return MS_SOCK_ESSL;
}

int ms__stls_done(const ms_stls_t *t)
{
    return t->done;
}

int ms__stls_verr(const ms_stls_t *t)
{
    return t->verr;
}

const char *ms__stls_verify_text(int verr)
{
    return X509_verify_cert_error_string(verr);
}

char *ms__stls_in_space(ms_stls_t *t, size_t *len)
{
    ms_buf_t *b = &t->in;
    if (b->cap - b->len < MS_STLS_READ) {
        if (t->in_pos > 0) {
            memmove(b->base, b->base + t->in_pos, b->len - t->in_pos);
            b->len -= t->in_pos;
            t->in_pos = 0;
        }
        if (b->cap - b->len < MS_STLS_READ) {
            b->cap = b->len + MS_STLS_READ;
            b->base = ms_mem_realloc(b->base, b->cap);
        }
    }
    *len = b->cap - b->len;
    return b->base + b->len;
}

void ms__stls_in_added(ms_stls_t *t, size_t n)
{
    t->in.len += n;
}

size_t ms__stls_in_pending(const ms_stls_t *t)
{
    return t->in.len - t->in_pos;
}

ssize_t ms__stls_read(ms_stls_t *t, char *p, size_t n)
{
    in_give(t);
    ssize_t r = ms__tls_eng_read(&t->eng, p, n);
    in_taken(t);
    if (r < 0)
        ERR_clear_error();
    return r;
}

int ms__stls_write(ms_stls_t *t, const char *p, size_t n)
{
    int rc = ms__tls_eng_write(&t->eng, p, n);
    if (rc < 0)
        ERR_clear_error();
    return rc;
}

ms_buf_t *ms__stls_out(ms_stls_t *t)
{
    return &t->out;
}

void ms__stls_shutdown(ms_stls_t *t)
{
    if (t->done)
        ms__tls_eng_shutdown(&t->eng); /* close_notify into `out` */
}

void ms__stls_idle(ms_stls_t *t)
{
    if (t->in_pos == t->in.len) {
        ms_mem_free(t->in.base);
        memset(&t->in, 0, sizeof(t->in));
        t->in_pos = 0;
    }
    if (t->out.len == 0) {
        ms_mem_free(t->out.base);
        memset(&t->out, 0, sizeof(t->out));
    }
}

ms_tls_session_t *ms__stls_session(ms_stls_t *t)
{
    t->session->refs++;
    return t->session;
}

int ms__stls_info(const ms_stls_t *t, const char **version, const char **cipher)
{
    *version = SSL_get_version(t->eng.ssl);
    *cipher = SSL_get_cipher_name(t->eng.ssl);
    return SSL_session_reused(t->eng.ssl);
}
