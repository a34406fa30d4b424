/* tls.c: the TLS transport (ms_io_t) on OpenSSL 3, stacked on the connection's own (TCP, or
 * memory in the tests and fuzzers): the handshake and its deadline, ALPN, SNI, then records
 * both ways. Nothing blocks the loop: a BIO of our own hands OpenSSL the bytes the lower
 * transport read and takes what OpenSSL writes into one buffer of the worker's, from which
 * the lower transport writes at once what the socket takes; only the rest is copied.
 * Where the kernel offers TLS (ms_tls_kernel), the write BIO sits on a socket BIO of the TCP
 * descriptor, which OpenSSL hands the keys once the handshake is done; from then on the
 * kernel encrypts, and writes and files go to the lower transport as they are (ktls_io). */
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/ocsp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "process/tickets.h"
#include "transport/tls_engine.h"

/* Ciphertext read at once, into the worker's buffer. */
#define MS_TLS_READ_BUF (64 * 1024)
/* Small pieces of a reply are gathered into one record of up to this many bytes (one MAC and
 * one header for a head and a short body); a larger piece is encrypted where it is. */
#define MS_TLS_STAGE (16 * 1024)
/* Plaintext encrypted before the lower transport is tried: the worker's buffer stays this
 * size (plus the records' overhead) however large the reply. */
#define MS_TLS_BURST (64 * 1024)
/* Bytes one try_write takes at most, so that one large reply does not hold the worker. */
#define MS_TLS_TRY_MAX (1024 * 1024)
/* A failed handshake of one kind is logged at most once in this long, with a count of the
 * others: a scanner or a broken client must not fill the log. */
#define MS_TLS_LOG_EVERY_MS 10000

/* What a failed handshake is logged as. */
enum {
    FAIL_NOT_TLS,
    FAIL_VERSION,
    FAIL_CIPHER,
    FAIL_NAME,
    FAIL_TIMEOUT,
    FAIL_OTHER,
    FAIL_HOOK,
    NFAIL
};
static const char *const fail_names[NFAIL] = {"not TLS",
                                              "no protocol version in common",
                                              "no cipher in common",
                                              "unknown server name",
                                              "not done within handshake_timeout",
                                              "error",
                                              "the certificate hook failed"};

typedef struct tls_name_s {
    char *name;   /* lowercase: "example.com", or "*.example.com" */
    SSL_CTX *ctx; /* its own, or the default one (a name of the default certificate) */
} tls_name_t;

/* An OCSP response stapled to the handshakes that send its certificate. */
typedef struct tls_staple_s {
    X509 *leaf;         /* referenced */
    unsigned char *der; /* the response, owned */
    size_t len;
    time_t next_update; /* past it, nothing is stapled; 0: the response gave none */
    uint8_t stale_logged;
} tls_staple_t;

struct ms_tls_s {
    ms_tls_t *next; /* the worker's list */
    SSL_CTX *ctx;   /* the default certificates; its settings are every name's */
    int has_default;
    int refuse_unknown;
    int ktls;          /* kernel TLS is offered and not turned off: SSL_OP_ENABLE_KTLS */
    tls_name_t *names; /* owned */
    uint32_t nnames, cap;
    char *ciphers, *ciphersuites, *groups; /* owned copies, for each name's context */
    tls_staple_t *staples;                 /* owned */
    uint32_t nstaples;
    int32_t hook_slot; /* the certificate hook's wake slot, or -1: none */
};

/* A handshake's call of the certificate hook (ms_tls_cert_hook). Held by the connection
 * (t->hook) and by Lua from ms_tls_hook_next to ms_tls_hook_done; freed when both let go. */
struct ms_tls_hook_s {
    ms_timer_t timer;    /* the handshake goes on at the next turn once the hook is done */
    ms_conn_t *conn;     /* NULL once the connection is gone */
    ms_tls_hook_t *next; /* in the worker's queue until Lua takes it */
    uint8_t state;       /* HOOK_* */
    uint8_t in_cb;       /* on_cert is under way: a hook done now needs no resume */
    uint8_t taken;       /* Lua holds it */
};

enum { HOOK_QUEUED, HOOK_RUNNING, HOOK_OK, HOOK_FAILED };

typedef struct ms_tls_worker_s {
    ms_tls_t *list; /* every TLS setting of the server */
    char *rbuf;     /* MS_TLS_READ_BUF: ciphertext as it is read */
    ms_buf_t out;   /* ciphertext OpenSSL wrote, until the lower transport takes it */
    char *stage;    /* MS_TLS_STAGE: small pieces gathered into one record */
    char *fbuf;     /* MS_TLS_BURST: a part of a file, read to be encrypted */
    ms_tls_hook_t *hooks, **hooks_tail; /* handshakes waiting for Lua to run their hook */
    struct {
        uint8_t logged;
        uint64_t at;   /* loop ms of the last line of this kind */
        uint32_t more; /* failures of this kind since */
    } failed[NFAIL];
} ms_tls_worker_t;

enum { TLS_HANDSHAKE, TLS_OPEN, TLS_DONE };

/* A connection's TLS state, in the connection's memory (ms__tls_wrap). */
typedef struct tls_conn_s {
    ms_upper_t upper;     /* first: c->upper points here */
    const ms_io_t *lower; /* the transport under this one */
    ms_conn_t *conn;
    ms_tls_t *tls;       /* the listener's settings (the server's, which outlive it) */
    ms_tls_eng_t eng;    /* its SSL made at the first bytes, freed once the transport closed;
                          * its `out`: the worker's buffer, or `queued` while `flight` */
    ms_timer_t timer;    /* the handshake deadline, then reads resumed on the next turn */
    const char *alpn;    /* "h2", "http/1.1" or NULL: static */
    const char *version; /* "TLSv1.3": OpenSSL's static text, kept past the close */
    ms_buf_t kept;       /* owned: ciphertext read while reading was off */
    ms_buf_t sending;    /* owned: ciphertext the lower transport writes in the background */
    ms_buf_t queued;     /* owned: ciphertext OpenSSL wrote meanwhile */
    uv_buf_t *wv;        /* owned copy of the connection's background write (tls_write) */
    unsigned wn, wi;     /* its pieces, the first not wholly encrypted */
    size_t woff;         /* bytes of that one encrypted */
    uint8_t state;       /* TLS_* */
    uint8_t reading;     /* the connection wants bytes */
    uint8_t flight;      /* the lower transport is writing `sending` */
    uint8_t shutdown;    /* a graceful close waits for `sending` */
    uint8_t closing;     /* the lower transport is told to close: nothing more goes out */
    uint8_t fail;        /* FAIL_* + 1 set by a callback during the handshake */
    uint8_t ksock;       /* the write BIO is on the socket's: the kernel may take the keys */
    ms_tls_hook_t *hook; /* the certificate hook's call, while the handshake lasts */
} tls_conn_t;

const size_t ms__tls_size = sizeof(tls_conn_t);

static inline tls_conn_t *tls_of(ms_conn_t *c)
{
    return (tls_conn_t *)c->upper;
}

static void buf_drop(ms_buf_t *b)
{
    ms_mem_free(b->base);
    b->base = NULL;
    b->len = b->cap = 0;
}

/* A background write of the lower transport's has `sending` (on), or not: while it has,
 * OpenSSL's records go to `queued`, after it. */
static inline void set_flight(tls_conn_t *t, int on)
{
    t->flight = (uint8_t)on;
    t->eng.out = on ? &t->queued : &t->conn->server->tls->out;
}

/* -- The engine: one for both directions (tls_engine.h) ----------------------------------
 * A connection's SSL and the BIO through which it meets its owner's buffers: what the owner
 * read is handed in as `in`, what OpenSSL writes goes to `out`. The server's transport below
 * and client sockets (client/tls_client.c) both step OpenSSL only through these functions.
 * Client sockets are not ms_conn_t connections on the transport interface: an ms_conn_t is
 * the server's (its protocol, reply queue, the worker's list that a stop closes, per-source
 * and metrics counts, and conn.c's callbacks that the upper transport reports to), while a
 * pooled client connection outlives the socket that used it, idles with its own expiry, may
 * be a unix socket and is read by pattern into the socket's buffer. So the engine is the
 * part both share, and each side keeps its own socket I/O. */

static BIO_METHOD *bio_method; /* one for the process, made at the first use */

static int bio_write(BIO *b, const char *p, int n)
{
    ms_tls_eng_t *e = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    ms__buf_append(e->out, p, (size_t)n);
    return n;
}

static int bio_read(BIO *b, char *p, int n)
{
    ms_tls_eng_t *e = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    if (e->in_len == 0) {
        BIO_set_retry_read(b);
        return -1;
    }
    size_t k = e->in_len < (size_t)n ? e->in_len : (size_t)n;
    memcpy(p, e->in, k);
    e->in += k;
    e->in_len -= k;
    return (int)k;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)b, (void)num, (void)ptr;
    return cmd == BIO_CTRL_FLUSH; /* in `out` already: its owner sends it */
}

static int bio_create(BIO *b)
{
    BIO_set_init(b, 1);
    return 1;
}

static int bio_setup(void);

/* SSL_get_error reads the thread's error queue: it must be empty before a call whose result
 * it explains. It is, unless someone left an error there; clearing it only then is cheaper
 * than ERR_clear_error on every record (which clears every slot). */
static inline void err_reset(void)
{
    if (MS_UNLIKELY(ERR_peek_error() != 0))
        ERR_clear_error();
}

int ms__tls_eng_open(ms_tls_eng_t *e, SSL_CTX *ctx, int client, BIO *wbio)
{
    ERR_clear_error();
    e->ssl = bio_setup() == 0 ? SSL_new(ctx) : NULL;
    BIO *b = e->ssl != NULL ? BIO_new(bio_method) : NULL;
    if (b == NULL) {
        SSL_free(e->ssl);
        e->ssl = NULL;
        BIO_free_all(wbio);
        ERR_clear_error();
        return UV_ENOMEM;
    }
    BIO_set_data(b, e);
    SSL_set_bio(e->ssl, b, wbio != NULL ? wbio : b);
    if (client)
        SSL_set_connect_state(e->ssl);
    else
        SSL_set_accept_state(e->ssl);
    return 0;
}

void ms__tls_eng_close(ms_tls_eng_t *e)
{
    SSL_free(e->ssl); /* (and its BIOs) */
    e->ssl = NULL;
}

int ms__tls_eng_handshake(ms_tls_eng_t *e)
{
    ERR_clear_error();
    int rc = SSL_do_handshake(e->ssl);
    if (rc == 1)
        return MS_TLS_ENG_DONE;
    switch (SSL_get_error(e->ssl, rc)) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
    case SSL_ERROR_WANT_X509_LOOKUP: /* (the certificate hook runs) */
        return MS_TLS_ENG_WANT;
    default: return UV_EPROTO;
    }
}

static inline ssize_t eng_read(ms_tls_eng_t *e, char *p, size_t n)
{
    err_reset();
    int k = SSL_read(e->ssl, p, n < INT32_MAX ? (int)n : INT32_MAX);
    if (k > 0)
        return k;
    switch (SSL_get_error(e->ssl, k)) {
    case SSL_ERROR_WANT_READ: return 0;
    case SSL_ERROR_ZERO_RETURN: return UV_EOF; /* close_notify */
    default: return UV_EPROTO;
    }
}

ssize_t ms__tls_eng_read(ms_tls_eng_t *e, char *p, size_t n)
{
    return eng_read(e, p, n);
}

static inline int eng_write(ms_tls_eng_t *e, const char *p, size_t n)
{
    err_reset();
    return SSL_write(e->ssl, p, (int)n) == (int)n ? 0 : UV_EPROTO;
}

int ms__tls_eng_write(ms_tls_eng_t *e, const char *p, size_t n)
{
    for (; n > INT32_MAX; p += INT32_MAX, n -= INT32_MAX)
        if (eng_write(e, p, INT32_MAX) < 0)
            return UV_EPROTO;
    return n > 0 ? eng_write(e, p, n) : 0;
}

void ms__tls_eng_shutdown(ms_tls_eng_t *e)
{
    ERR_clear_error();
    (void)SSL_shutdown(e->ssl);
    ERR_clear_error();
}

/* The write BIO of a listener that may use kernel TLS: the same as the one above, pushed on
 * a socket BIO of the TCP descriptor (BIO_NOCLOSE), to which the controls it does not know
 * pass, so that OpenSSL finds the socket to hand the keys to (and later its descriptor, for
 * SSL_sendfile). The read BIO stays the one above: records are read and decrypted here, and
 * refusing the kernel the read keys keeps it so. Its data is the engine of a tls_conn_t (only
 * the server's transport offers kernel TLS: client sockets never did). */
static BIO_METHOD *ktls_bio_method;
static int send_out(ms_conn_t *c);
static void process(ms_conn_t *c, const char *p, size_t n);

static int ktls_bio_write(BIO *b, const char *p, int n)
{
    BIO *sock = BIO_next(b);
    if (!BIO_get_ktls_send(sock))
        return bio_write(b, p, n);
    /* The kernel encrypts: OpenSSL's own records (a session ticket, an alert, each with its
     * type) go to the socket directly, once none of the connection's bytes waits to go
     * before them. */
    BIO_clear_retry_flags(b);
    if (container_of(BIO_get_data(b), tls_conn_t, eng)->flight) {
        BIO_set_retry_write(b);
        return -1;
    }
    /* FIXME: a full socket here (it holds at most the handshake's own flight: only with a
     * very large certificate chain) leaves a session ticket to the client's next bytes, or
     * the handshake to handshake_timeout: libuv says nothing of room on a socket it is not
     * writing to. */
    int k = BIO_write(sock, p, n);
    BIO_copy_next_retry(b);
    return k;
}

static long ktls_bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    if (cmd != BIO_CTRL_FLUSH)
        return BIO_ctrl(BIO_next(b), cmd, num, ptr);
    /* OpenSSL flushes before the kernel takes the keys, and takes them only if the flush
     * succeeds: every byte written before must then be in the socket, or the kernel would
     * encrypt it again. What the socket does not take now is written in the background,
     * and the flush is to be tried again (tls_written goes on with the handshake). */
    tls_conn_t *t = container_of(BIO_get_data(b), tls_conn_t, eng);
    ms_conn_t *c = t->conn;
    BIO_clear_retry_flags(b);
    if (!t->flight && c->server->tls->out.len > 0)
        (void)send_out(c); /* (a failure shows on the next read, as it would after) */
    if (t->flight) {
        BIO_set_retry_write(b);
        return -1;
    }
    return 1;
}

static int bio_setup(void)
{
    if (bio_method != NULL)
        return 0;
    bio_method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "moonserve");
    ktls_bio_method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_FILTER, "moonserve ktls");
    if (bio_method == NULL || ktls_bio_method == NULL)
        return UV_ENOMEM;
    BIO_meth_set_write(bio_method, bio_write);
    BIO_meth_set_read(bio_method, bio_read);
    BIO_meth_set_ctrl(bio_method, bio_ctrl);
    BIO_meth_set_create(bio_method, bio_create);
    BIO_meth_set_write(ktls_bio_method, ktls_bio_write);
    BIO_meth_set_ctrl(ktls_bio_method, ktls_bio_ctrl);
    BIO_meth_set_create(ktls_bio_method, bio_create);
    return 0;
}

/* -- Writing ----------------------------------------------------------------------------- */

/* Closes the lower transport, once. */
static void lower_close(ms_conn_t *c, int graceful)
{
    tls_conn_t *t = tls_of(c);
    if (t->closing)
        return;
    t->closing = 1;
    if (graceful)
        t->lower->shutdown(c);
    else
        t->lower->close(c);
}

/* The lower transport failed: the connection closes, or if it is closing already (a graceful
 * close waiting for the last bytes), the lower transport does at once. */
static void io_failed(ms_conn_t *c)
{
    if (c->flags & MS_CONN_CLOSED)
        lower_close(c, 0);
    else
        ms__conn_close(c, 0);
}

static int start_sending(ms_conn_t *c)
{
    tls_conn_t *t = tls_of(c);
    uv_buf_t b = {.base = t->sending.base, .len = t->sending.len};
    int rc = t->lower->write(c, &b, 1);
    if (rc < 0) {
        t->sending.len = 0;
        return rc;
    }
    set_flight(t, 1);
    return 0;
}

/* Hands what OpenSSL wrote to the lower transport: what it takes now, the rest copied and
 * written in the background. Every call into OpenSSL is followed by this, so the worker's
 * buffer never holds one connection's bytes while another's are made. */
static int send_out(ms_conn_t *c)
{
    ms_buf_t *o = &c->server->tls->out;
    tls_conn_t *t = tls_of(c);
    if (o->len == 0)
        return 0;
    assert(!t->flight);
    if (t->closing) {
        o->len = 0;
        return UV_ECANCELED;
    }
    uv_buf_t b = {.base = o->base, .len = o->len};
    int rc = t->lower->try_write(c, &b, 1);
    if (rc == UV_EAGAIN)
        rc = 0;
    if (rc < 0) {
        o->len = 0;
        return rc;
    }
    if ((size_t)rc < o->len) {
        ms__buf_append(&t->sending, o->base + rc, o->len - (size_t)rc);
        o->len = 0;
        return start_sending(c);
    }
    o->len = 0;
    return 0;
}

static inline int ssl_write(tls_conn_t *t, const char *p, size_t n)
{
    return eng_write(&t->eng, p, n);
}

/* Encrypts up to `budget` bytes of bufs[*i..n) from *off into the worker's buffer, gathering
 * small pieces into one record. Returns the plaintext bytes taken, or a negative code;
 * (*i, *off) end past the pieces wholly taken. */
static ssize_t encrypt(ms_conn_t *c, const uv_buf_t *bufs, unsigned n, unsigned *i, size_t *off,
                       size_t budget)
{
    tls_conn_t *t = tls_of(c);
    char *stage = c->server->tls->stage;
    size_t staged = 0, done = 0;
    while (*i < n && done < budget) {
        const char *p = bufs[*i].base + *off;
        size_t left = bufs[*i].len - *off;
        if (left > budget - done)
            left = budget - done;
        size_t k;
        if (staged == 0 && left >= MS_TLS_STAGE) {
            k = MS_TLS_STAGE;
            if (ssl_write(t, p, k) < 0)
                return UV_EPROTO;
        } else {
            k = left < MS_TLS_STAGE - staged ? left : MS_TLS_STAGE - staged;
            memcpy(stage + staged, p, k);
            staged += k;
            if (staged == MS_TLS_STAGE) {
                if (ssl_write(t, stage, staged) < 0)
                    return UV_EPROTO;
                staged = 0;
            }
        }
        done += k;
        *off += k;
        while (*i < n && *off == bufs[*i].len) {
            (*i)++;
            *off = 0;
        }
    }
    if (staged > 0 && ssl_write(t, stage, staged) < 0)
        return UV_EPROTO;
    return (ssize_t)done;
}

static int tls_try_write(ms_conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    tls_conn_t *t = tls_of(c);
    if (MS_UNLIKELY(t->state == TLS_HANDSHAKE))
        return UV_EPROTO; /* (no protocol is chosen before the handshake is done) */
    if (t->flight || t->wv != NULL)
        return UV_EAGAIN;
    unsigned i = 0;
    size_t off = 0, total = 0;
    while (i < n && total < MS_TLS_TRY_MAX) {
        while (i < n && bufs[i].len == 0)
            i++;
        if (i == n)
            break;
        ssize_t k = encrypt(c, bufs, n, &i, &off, MS_TLS_BURST);
        if (k < 0)
            return (int)k;
        total += (size_t)k;
        int rc = send_out(c);
        if (rc < 0)
            return rc;
        if (t->flight)
            break; /* the socket is full: the rest waits */
    }
    return (int)total;
}

/* A part of a file: read into the worker's buffer and encrypted from there, up to
 * MS_TLS_BURST bytes, what the socket does not take now written in the background like any
 * other bytes. The connection's "sendfile" (with kernel TLS, ktls_sendfile is the real one):
 * parts four times the size of its own fallback's, and no buffer of the connection's. */
static ssize_t tls_sendfile(ms_conn_t *c, int fd, uint64_t off, size_t len)
{
    tls_conn_t *t = tls_of(c);
    if (MS_UNLIKELY(t->state == TLS_HANDSHAKE))
        return UV_EPROTO;
    if (t->flight || t->wv != NULL)
        return UV_EAGAIN;
    char *buf = c->server->tls->fbuf;
    ssize_t got = pread(fd, buf, len < MS_TLS_BURST ? len : MS_TLS_BURST, (off_t)off);
    if (got <= 0)
        return got == 0 ? 0 : -errno;
    uv_buf_t b = {.base = buf, .len = (size_t)got};
    unsigned i = 0;
    size_t o = 0;
    ssize_t k = encrypt(c, &b, 1, &i, &o, (size_t)got);
    int rc = k < 0 ? (int)k : send_out(c);
    return rc < 0 ? rc : got;
}

/* Goes on with the connection's background write once the lower transport has room. */
static void pump(ms_conn_t *c)
{
    tls_conn_t *t = tls_of(c);
    int rc = 0;
    while (t->wi < t->wn && !t->flight) {
        ssize_t k = encrypt(c, t->wv, t->wn, &t->wi, &t->woff, MS_TLS_BURST);
        rc = k < 0 ? (int)k : send_out(c);
        if (rc < 0)
            break;
    }
    if (t->flight && rc == 0)
        return;
    ms_mem_free(t->wv);
    t->wv = NULL;
    ms_conn_write_done(c, rc);
}

static int tls_write(ms_conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    tls_conn_t *t = tls_of(c);
    assert(t->wv == NULL && t->state != TLS_HANDSHAKE);
    t->wv = ms_mem_alloc(n * sizeof(*bufs));
    memcpy(t->wv, bufs, n * sizeof(*bufs));
    t->wn = n;
    t->wi = 0;
    t->woff = 0;
    if (t->flight)
        return 0; /* tls_written goes on with it */
    /* The completion must come later, never inside this call: the first burst goes to the
     * background even when the socket would take it. */
    ssize_t k = encrypt(c, t->wv, t->wn, &t->wi, &t->woff, MS_TLS_BURST);
    ms_buf_t *o = &c->server->tls->out;
    int rc = k < 0 ? (int)k : 0;
    if (rc == 0) {
        ms__buf_append(&t->sending, o->base, o->len);
        rc = start_sending(c);
    }
    o->len = 0;
    if (rc < 0) {
        ms_mem_free(t->wv);
        t->wv = NULL;
    }
    return rc;
}

/* The lower transport wrote `sending` (or failed, or is closing). */
static void tls_written(ms_conn_t *c, int status)
{
    tls_conn_t *t = tls_of(c);
    set_flight(t, 0);
    t->sending.len = 0;
    if (status < 0 || t->closing) {
        buf_drop(&t->sending);
        buf_drop(&t->queued);
        if (t->wv != NULL) {
            ms_mem_free(t->wv);
            t->wv = NULL;
            ms_conn_write_done(c, status < 0 ? status : UV_ECANCELED);
        }
        if (status < 0 && !t->closing)
            io_failed(c);
        return;
    }
    if (t->queued.len > 0) {
        ms_buf_t b = t->sending;
        t->sending = t->queued;
        t->queued = b;
        if (start_sending(c) < 0)
            io_failed(c);
        return;
    }
    /* Nothing is in flight: an idle connection keeps no buffer. */
    buf_drop(&t->sending);
    buf_drop(&t->queued);
    if (t->wv != NULL)
        pump(c);
    else if (t->shutdown)
        lower_close(c, 1); /* the last bytes and close_notify have gone: FIN */
    else if (t->ksock && t->state == TLS_HANDSHAKE)
        process(c, NULL, 0); /* its flush waited for this (ktls_bio_ctrl) */
}

/* -- Failed handshakes ------------------------------------------------------------------- */

/* One line per kind of failure every MS_TLS_LOG_EVERY_MS, with how many more there were. */
static void log_failure(ms_conn_t *c, int kind, const char *detail)
{
    ms_tls_worker_t *w = c->server->tls;
    uint64_t now = uv_now(c->server->loop);
    if (w->failed[kind].logged && now - w->failed[kind].at < MS_TLS_LOG_EVERY_MS) {
        w->failed[kind].more++;
        return;
    }
    char peer[64], more[64] = "";
    ms_conn_peer(c, peer, sizeof(peer));
    if (w->failed[kind].more > 0)
        snprintf(more, sizeof(more), " (and %u more like it since the last line)",
                 w->failed[kind].more);
    ms_log(MS_LOG_INFO, "%s: TLS handshake failed: %s%s%s%s", peer, fail_names[kind],
           detail ? ": " : "", detail ? detail : "", more);
    w->failed[kind].logged = 1;
    w->failed[kind].at = now;
    w->failed[kind].more = 0;
}

/* What OpenSSL's error says of a failed handshake. */
static int classify(unsigned long e)
{
    switch (ERR_GET_REASON(e)) {
    case SSL_R_HTTP_REQUEST:
    case SSL_R_HTTPS_PROXY_REQUEST:
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_PACKET_LENGTH_TOO_LONG:
    case SSL_R_RECORD_LENGTH_MISMATCH:
    case SSL_R_UNKNOWN_PROTOCOL:
        return FAIL_NOT_TLS;
    case SSL_R_UNSUPPORTED_PROTOCOL:
    case SSL_R_VERSION_TOO_LOW:
    case SSL_R_TLSV1_ALERT_PROTOCOL_VERSION:
        return FAIL_VERSION;
    case SSL_R_NO_SHARED_CIPHER:
    case SSL_R_NO_SHARED_GROUPS:
    case SSL_R_NO_SUITABLE_KEY_SHARE:
    case SSL_R_NO_SUITABLE_SIGNATURE_ALGORITHM:
    case SSL_R_NO_SHARED_SIGNATURE_ALGORITHMS:
        return FAIL_CIPHER;
    default:
        return FAIL_OTHER;
    }
}

static void handshake_failed(ms_conn_t *c)
{
    tls_conn_t *t = tls_of(c);
    unsigned long e = ERR_peek_error();
    int kind = t->fail ? t->fail - 1 : classify(e);
    const char *why = kind == FAIL_OTHER && e != 0 ? ERR_reason_error_string(e) : NULL;
    ERR_clear_error();
    if (kind != FAIL_HOOK) /* (the hook's error is its line) */
        log_failure(c, kind, why);
    c->server->stats->bad_requests++;
    ms__conn_close(c, 0);
}

static void handshake_expired(ms_timer_t *tm)
{
    tls_conn_t *t = container_of(tm, tls_conn_t, timer);
    ms_conn_t *c = t->conn;
    c->server->stats->timeouts++;
    log_failure(c, FAIL_TIMEOUT, NULL);
    ms__conn_close(c, 0);
}

/* -- The handshake ----------------------------------------------------------------------- */

static const char *lower_name(const char *name, char *buf, size_t len)
{
    size_t i = 0;
    for (; name[i] != 0 && i + 1 < len; i++)
        buf[i] = (char)ms__lower((unsigned char)name[i]);
    buf[i] = 0;
    return name[i] == 0 ? buf : NULL;
}

static tls_name_t *find_exact(ms_tls_t *t, const char *name)
{
    for (uint32_t i = 0; i < t->nnames; i++)
        if (strcmp(t->names[i].name, name) == 0)
            return &t->names[i];
    return NULL;
}

/* The certificates for a server name: its own, else a wildcard's one label up. */
static SSL_CTX *find_name(ms_tls_t *t, const char *sent)
{
    char name[256];
    if (lower_name(sent, name, sizeof(name)) == NULL)
        return NULL;
    tls_name_t *n = find_exact(t, name);
    if (n != NULL)
        return n->ctx;
    char *dot = strchr(name, '.');
    if (dot == NULL || dot == name)
        return NULL;
    dot[-1] = '*';
    n = find_exact(t, dot - 1);
    return n != NULL ? n->ctx : NULL;
}

static int on_servername(SSL *ssl, int *alert, void *arg)
{
    ms_tls_t *t = arg;
    const char *name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
    if (name == NULL)
        return SSL_TLSEXT_ERR_OK; /* no name sent (an address): the default certificate */
    SSL_CTX *ctx = find_name(t, name);
    if (ctx != NULL) {
        if (ctx != SSL_get_SSL_CTX(ssl))
            SSL_set_SSL_CTX(ssl, ctx);
        return SSL_TLSEXT_ERR_OK;
    }
    if (!t->refuse_unknown)
        return SSL_TLSEXT_ERR_OK;
    ms_conn_t *c = SSL_get_app_data(ssl);
    tls_of(c)->fail = FAIL_NAME + 1;
    *alert = SSL_AD_UNRECOGNIZED_NAME;
    return SSL_TLSEXT_ERR_ALERT_FATAL;
}

/* ALPN: h2 if the client offers it, else http/1.1; neither offered, none agreed (the accept
 * stage then looks for HTTP/2's preface). */
static int on_alpn(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                   const unsigned char *in, unsigned int inlen, void *arg)
{
    static const unsigned char ours[] = "\x02h2\x08http/1.1";
    unsigned char *sel;
    (void)ssl, (void)arg;
    if (SSL_select_next_proto(&sel, outlen, ours, sizeof(ours) - 1, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_NOACK;
    *out = sel;
    return SSL_TLSEXT_ERR_OK;
}

/* -- The certificate hook ---------------------------------------------------------------- */

/* The connection lets go of its hook's call (the handshake is over, or the connection). */
static void hook_detach(ms_conn_t *c)
{
    tls_conn_t *t = tls_of(c);
    ms_tls_hook_t *h = t->hook;
    if (h == NULL)
        return;
    t->hook = NULL;
    ms_timer_stop(c->server, &h->timer);
    h->conn = NULL;
    if (h->state == HOOK_QUEUED) {
        ms_tls_worker_t *w = c->server->tls;
        ms_tls_hook_t **pp = &w->hooks;
        while (*pp != h)
            pp = &(*pp)->next;
        *pp = h->next;
        if (w->hooks_tail == &h->next)
            w->hooks_tail = pp;
    }
    if (!h->taken)
        ms_mem_free(h);
}

static void hook_resume(ms_timer_t *tm)
{
    ms_tls_hook_t *h = container_of(tm, ms_tls_hook_t, timer);
    if (h->conn != NULL && !(h->conn->flags & MS_CONN_CLOSED))
        process(h->conn, NULL, 0);
}

/* OpenSSL's certificate callback, once the ClientHello is read (after SNI chose the name's
 * certificates): the first time, the hook's call is queued and its slot woken, which runs
 * the Lua hook now when no Lua is under way; while it runs, -1 pauses the handshake
 * (SSL_ERROR_WANT_X509_LOOKUP), and ms_tls_hook_done lets it go on. */
static int on_cert(SSL *ssl, void *arg)
{
    ms_tls_t *tls = arg;
    ms_conn_t *c = SSL_get_app_data(ssl);
    tls_conn_t *t = tls_of(c);
    ms_tls_hook_t *h = t->hook;
    if (h == NULL) {
        if (tls->hook_slot < 0)
            return 1;
        ms_tls_worker_t *w = c->server->tls;
        h = ms_mem_alloc(sizeof(*h));
        memset(h, 0, sizeof(*h));
        h->conn = c;
        h->state = HOOK_QUEUED;
        t->hook = h;
        if (w->hooks == NULL)
            w->hooks_tail = &w->hooks;
        *w->hooks_tail = h;
        w->hooks_tail = &h->next;
        h->in_cb = 1;
        ms_wake(c->server, tls->hook_slot, 0);
        h->in_cb = 0;
    }
    switch (h->state) {
    case HOOK_OK: return 1;
    case HOOK_FAILED: t->fail = FAIL_HOOK + 1; return 0;
    default: return -1;
    }
}

void ms_tls_cert_hook(ms_tls_t *t, int32_t slot)
{
    t->hook_slot = slot;
    SSL_CTX_set_cert_cb(t->ctx, on_cert, t);
    for (uint32_t i = 0; i < t->nnames; i++)
        SSL_CTX_set_cert_cb(t->names[i].ctx, on_cert, t);
}

ms_tls_hook_t *ms_tls_hook_next(ms_server_t *s)
{
    ms_tls_worker_t *w = s->tls;
    if (w == NULL || w->hooks == NULL)
        return NULL;
    ms_tls_hook_t *h = w->hooks;
    w->hooks = h->next;
    if (w->hooks == NULL)
        w->hooks_tail = &w->hooks;
    h->next = NULL;
    h->state = HOOK_RUNNING;
    h->taken = 1;
    return h;
}

void ms_tls_hook_done(ms_tls_hook_t *h, int ok)
{
    if (!h->taken)
        return;
    h->taken = 0;
    if (h->conn == NULL) {
        ms_mem_free(h);
        return;
    }
    h->state = ok ? HOOK_OK : HOOK_FAILED;
    /* Never from inside the Lua that called this: the handshake goes on from the loop. */
    if (!h->in_cb)
        ms_timer_start(h->conn->server, &h->timer, 0, hook_resume);
}

SSL *ms_tls_hook_ssl(ms_tls_hook_t *h)
{
    if (h->conn == NULL || !h->taken)
        return NULL;
    return tls_of(h->conn)->eng.ssl;
}

ms_conn_t *ms_tls_hook_conn(ms_tls_hook_t *h)
{
    return h->taken ? h->conn : NULL;
}

static const ms_io_t ktls_io;
static const ms_io_up_t ktls_up;

static void handshake_done(ms_conn_t *c)
{
    tls_conn_t *t = tls_of(c);
    const unsigned char *p;
    unsigned int len;
    ms_timer_stop(c->server, &t->timer);
    hook_detach(c);
    t->state = TLS_OPEN;
    t->version = SSL_get_version(t->eng.ssl);
    SSL_get0_alpn_selected(t->eng.ssl, &p, &len);
    if (len == 2 && memcmp(p, "h2", 2) == 0)
        t->alpn = "h2";
    else if (len == 8 && memcmp(p, "http/1.1", 8) == 0)
        t->alpn = "http/1.1";
    if (t->ksock && BIO_get_ktls_send(SSL_get_wbio(t->eng.ssl))) {
        /* The kernel took the keys: what the connection writes goes to the socket as it is. */
        c->io = &ktls_io;
        t->upper.up = &ktls_up;
    }
    ms__conn_start(c); /* the first request's head_timeout starts now */
}

/* Runs the handshake on the bytes at hand. Returns 0 once it is done, 1 while it waits for
 * more, -1 when it failed (the connection is closed). */
static int handshake(ms_conn_t *c)
{
    tls_conn_t *t = tls_of(c);
    if (t->eng.ssl == NULL) {
        BIO *w = NULL;
        int fd = t->tls->ktls && t->lower->fd != NULL ? t->lower->fd(c) : -1;
        int ok = 1;
        if (fd >= 0) {
            /* (BIO_new_socket attaches the kernel's tls ULP to the socket) */
            BIO *sock = BIO_new_socket(fd, BIO_NOCLOSE);
            w = sock != NULL ? BIO_new(ktls_bio_method) : NULL;
            if (w != NULL) {
                BIO_set_data(w, &t->eng);
                BIO_push(w, sock);
                t->ksock = 1;
            } else {
                BIO_free(sock);
                ok = 0;
            }
        }
        if (!ok || ms__tls_eng_open(&t->eng, t->tls->ctx, 0, w) < 0) {
            ms_log(MS_LOG_ERR, "TLS: out of memory for a connection");
            ms__conn_close(c, 0);
            return -1;
        }
        SSL_set_app_data(t->eng.ssl, c);
    }
    int rc = ms__tls_eng_handshake(&t->eng);
    if (send_out(c) < 0) { /* (an alert, on a failure, goes out first) */
        ERR_clear_error();
        ms__conn_close(c, 0);
        return -1;
    }
    if (rc == MS_TLS_ENG_DONE) {
        handshake_done(c);
        return 0;
    }
    if (rc == MS_TLS_ENG_WANT)
        return 1;
    handshake_failed(c);
    return -1;
}

/* -- Reading ----------------------------------------------------------------------------- */

/* Keeps the ciphertext OpenSSL was not given (reading went off) for when it comes back on. */
static void keep_rest(tls_conn_t *t)
{
    ms_buf_t *k = &t->kept;
    ms_tls_eng_t *e = &t->eng;
    if (e->in_len > 0 && !(t->conn->flags & MS_CONN_CLOSED)) {
        if (k->base != NULL && e->in >= k->base && e->in < k->base + k->len) {
            memmove(k->base, e->in, e->in_len);
            k->len = e->in_len;
        } else {
            k->len = 0;
            ms__buf_append(k, e->in, e->in_len);
        }
    } else {
        buf_drop(k);
    }
    e->in = NULL;
    e->in_len = 0;
}

/* Ciphertext in: the handshake, then records decrypted into the buffer the connection
 * offers (ms_conn_read_buf) and fed to it, for as long as it reads. */
static void process(ms_conn_t *c, const char *p, size_t n)
{
    tls_conn_t *t = tls_of(c);
    ms__conn_hold(c);
    if (t->kept.len > 0) {
        ms__buf_append(&t->kept, p, n);
        t->eng.in = t->kept.base;
        t->eng.in_len = t->kept.len;
    } else {
        t->eng.in = p;
        t->eng.in_len = n;
    }
    if (t->state == TLS_HANDSHAKE && handshake(c) != 0) {
        keep_rest(t);
        ms__conn_release(c);
        return;
    }
    /* Each pass takes at least one record's bytes, or ends: bounded by what was read. */
    while (t->reading && t->state == TLS_OPEN && !(c->flags & MS_CONN_CLOSED)) {
        uv_buf_t b;
        ms_conn_read_buf(c, &b);
        ssize_t k = eng_read(&t->eng, b.base, b.len);
        if (send_out(c) < 0) {
            ms__conn_close(c, 0);
            break;
        }
        if (k > 0) {
            ms_conn_feed(c, b.base, (size_t)k);
            continue;
        }
        if (k == 0)
            break;
        if (k == UV_EOF) {
            /* close_notify: the peer sends no more, as a FIN says on TCP. */
            t->state = TLS_DONE;
            t->lower->read_stop(c);
            ms_conn_eof(c, UV_EOF);
            break;
        }
        char peer[64];
        ms_conn_peer(c, peer, sizeof(peer));
        ms_log(MS_LOG_DEBUG, "%s: closed: TLS: %s", peer,
               ERR_peek_error() ? ERR_reason_error_string(ERR_peek_error()) : "error");
        ERR_clear_error();
        ms__conn_close(c, 0);
        break;
    }
    keep_rest(t);
    ms__conn_release(c);
}

static void resume_cb(ms_timer_t *tm)
{
    tls_conn_t *t = container_of(tm, tls_conn_t, timer);
    if (!(t->conn->flags & MS_CONN_CLOSED) && t->reading)
        process(t->conn, NULL, 0);
}

static void tls_read_buf(ms_conn_t *c, uv_buf_t *buf)
{
    buf->base = c->server->tls->rbuf;
    buf->len = MS_TLS_READ_BUF;
}

static void tls_feed(ms_conn_t *c, const char *p, size_t n)
{
    process(c, p, n);
}

static void tls_eof(ms_conn_t *c, int err)
{
    tls_conn_t *t = tls_of(c);
    if (t->state == TLS_OPEN)
        ms_conn_eof(c, err); /* (without close_notify: taken as the end all the same) */
    else if (t->state == TLS_HANDSHAKE)
        ms__conn_close(c, 0); /* gone before a handshake: not worth a line */
}

static void tls_read_stop(ms_conn_t *c)
{
    tls_of(c)->reading = 0;
    tls_of(c)->lower->read_stop(c);
}

static void tls_read_start(ms_conn_t *c)
{
    tls_conn_t *t = tls_of(c);
    if (c->flags & MS_CONN_CLOSED)
        return;
    t->reading = 1;
    if (t->state == TLS_DONE)
        return;
    t->lower->read_start(c);
    /* Bytes read or decrypted while reading was off go to the connection on the next turn of
     * the loop, not inside the call that turned it on. */
    if (t->state == TLS_OPEN && (t->kept.len > 0 || SSL_has_pending(t->eng.ssl)))
        ms_timer_start(c->server, &t->timer, 0, resume_cb);
}

/* -- Closing ----------------------------------------------------------------------------- */

static void tls_shutdown(ms_conn_t *c)
{
    tls_conn_t *t = tls_of(c);
    ms_timer_stop(c->server, &t->timer);
    t->reading = 0;
    t->shutdown = 1;
    if (t->state != TLS_HANDSHAKE) {
        ms__tls_eng_shutdown(&t->eng); /* close_notify (after what is in flight) */
        if (send_out(c) < 0) {
            lower_close(c, 0);
            return;
        }
    }
    if (!t->flight)
        lower_close(c, 1);
}

static void tls_close(ms_conn_t *c)
{
    tls_conn_t *t = tls_of(c);
    ms_timer_stop(c->server, &t->timer);
    t->reading = 0;
    lower_close(c, 0);
}

/* The lower transport has closed: nothing reaches OpenSSL again. */
static void tls_closed(ms_conn_t *c)
{
    tls_conn_t *t = tls_of(c);
    ms_timer_stop(c->server, &t->timer);
    hook_detach(c);
    ms__tls_eng_close(&t->eng);
    buf_drop(&t->kept);
    buf_drop(&t->sending);
    buf_drop(&t->queued);
    ms_mem_free(t->wv);
    t->wv = NULL;
    ms_conn_closed(c);
}

static void tls_peer(ms_conn_t *c, char *buf, size_t len)
{
    tls_conn_t *t = tls_of(c);
    if (t->lower->peer != NULL)
        t->lower->peer(c, buf, len);
    else
        buf[0] = 0;
}

static const char *tls_alpn(ms_conn_t *c)
{
    return tls_of(c)->alpn;
}

static const char *tls_version(ms_conn_t *c)
{
    return tls_of(c)->version != NULL ? tls_of(c)->version : "TLS";
}

/* -- Kernel TLS ------------------------------------------------------------------------ */

/* Once the kernel has the keys, it encrypts what is written to the socket: the connection's
 * writes and files go to the lower transport as they are (`flight` says one of its writes is
 * under way, before which OpenSSL's own records may not go), and reading stays the above. */
static int ktls_try_write(ms_conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    return tls_of(c)->lower->try_write(c, bufs, n);
}

static int ktls_write(ms_conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    tls_conn_t *t = tls_of(c);
    int rc = t->lower->write(c, bufs, n);
    if (rc == 0)
        set_flight(t, 1);
    return rc;
}

static ssize_t ktls_sendfile(ms_conn_t *c, int fd, uint64_t off, size_t len)
{
    tls_conn_t *t = tls_of(c);
    if (t->flight)
        return UV_EAGAIN;
    err_reset();
    ossl_ssize_t n = SSL_sendfile(t->eng.ssl, fd, (off_t)off, len, 0);
    if (n >= 0)
        return n;
    int e = errno;
    if (SSL_get_error(t->eng.ssl, -1) == SSL_ERROR_WANT_WRITE)
        return UV_EAGAIN;
    ERR_clear_error();
    return e > 0 ? -e : UV_EPROTO;
}

static void ktls_cork(ms_conn_t *c, int on)
{
    tls_conn_t *t = tls_of(c);
    if (t->lower->cork != NULL)
        t->lower->cork(c, on);
}

static void ktls_written(ms_conn_t *c, int status)
{
    tls_conn_t *t = tls_of(c);
    set_flight(t, 0);
    ms_conn_write_done(c, status);
    if (t->shutdown && !t->flight && !t->closing) {
        /* tls_shutdown's close_notify waited for this write (ktls_bio_write). */
        if (status == 0)
            ms__tls_eng_shutdown(&t->eng);
        lower_close(c, status == 0);
    }
}

/* The socket under the TLS transport, for request_waiting's FIONREAD: ciphertext there is
 * the peer's next bytes as much as plaintext is under TCP. */
static int tls_fd(ms_conn_t *c)
{
    tls_conn_t *t = tls_of(c);
    return t->lower->fd != NULL ? t->lower->fd(c) : -1;
}

/* A record OpenSSL has decrypted and not yet handed up. */
static int tls_pending(ms_conn_t *c)
{
    tls_conn_t *t = tls_of(c);
    return t->eng.ssl != NULL && SSL_pending(t->eng.ssl) > 0;
}

static const ms_io_up_t ktls_up = {
    .read_buf = tls_read_buf,
    .feed = tls_feed,
    .eof = tls_eof,
    .write_done = ktls_written,
    .closed = tls_closed,
};

static const ms_io_t ktls_io = {
    .try_write = ktls_try_write,
    .write = ktls_write,
    .sendfile = ktls_sendfile,
    .cork = ktls_cork,
    .read_stop = tls_read_stop,
    .read_start = tls_read_start,
    .shutdown = tls_shutdown,
    .close = tls_close,
    .peer = tls_peer,
    .alpn = tls_alpn,
    .tls = tls_version,
    .fd = tls_fd,
    .pending = tls_pending,
};

/* 1 when the kernel has a tls ULP, tried on a loopback TCP connection of the process's own:
 * setting it also loads the module where it is not loaded yet (for a process that may). */
static int kernel_probe(const char **why)
{
#ifdef OPENSSL_NO_KTLS
    *why = "OpenSSL is built without it";
    return 0;
#else
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), s = -1, ok = 0;
    *why = "no loopback TCP connection to try it on";
    if (l >= 0 && bind(l, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(l, 1) == 0 &&
        getsockname(l, (struct sockaddr *)&sa, &sl) == 0 &&
        (s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0 &&
        connect(s, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
        if (setsockopt(s, IPPROTO_TCP, TCP_ULP, "tls", sizeof("tls")) == 0) {
            ok = 1;
            *why = NULL;
        } else if (errno == ENOENT) {
            *why = "not offered by the kernel (no tls ULP)";
        } else {
            *why = "the kernel refused its tls ULP";
        }
    }
    if (s >= 0)
        close(s);
    if (l >= 0)
        close(l);
    return ok;
#endif
}

int ms_tls_kernel(const char **why)
{
    static int known = -1;
    static const char *known_why;
    if (known < 0)
        known = kernel_probe(&known_why);
    if (why != NULL)
        *why = known_why;
    return known;
}

static const ms_io_up_t tls_up = {
    .read_buf = tls_read_buf,
    .feed = tls_feed,
    .eof = tls_eof,
    .write_done = tls_written,
    .closed = tls_closed,
};

/* Records made here: files pass through OpenSSL (tls_sendfile). */
static const ms_io_t tls_io = {
    .try_write = tls_try_write,
    .write = tls_write,
    .sendfile = tls_sendfile,
    .read_stop = tls_read_stop,
    .read_start = tls_read_start,
    .shutdown = tls_shutdown,
    .close = tls_close,
    .peer = tls_peer,
    .alpn = tls_alpn,
    .tls = tls_version,
    .fd = tls_fd,
    .pending = tls_pending,
};

void ms__tls_wrap(ms_conn_t *c, ms_tls_t *tls, void *mem)
{
    ms_server_t *s = c->server;
    tls_conn_t *t = mem;
    memset(t, 0, sizeof(*t));
    t->upper.up = &tls_up;
    t->lower = c->io;
    t->conn = c;
    t->tls = tls;
    t->eng.out = &s->tls->out;
    t->state = TLS_HANDSHAKE;
    t->reading = 1;
    c->io = &tls_io;
    c->upper = &t->upper;
    /* The handshake's deadline first; the head's starts when it is done. */
    ms_timer_stop(s, &c->timer);
    c->phase = MS_PHASE_NONE;
    ms_timer_start(s, &t->timer, s->limits.handshake_timeout_ms, handshake_expired);
}

/* -- OCSP stapling ------------------------------------------------------------------------ */

/* A client that asks for the certificate's status (status_request) gets the response stapled
 * for the certificate the handshake sends, while it is current. */
static int on_status(SSL *ssl, void *arg)
{
    ms_tls_t *t = arg;
    X509 *leaf = SSL_get_certificate(ssl);
    for (uint32_t i = 0; leaf != NULL && i < t->nstaples; i++) {
        tls_staple_t *st = &t->staples[i];
        if (X509_cmp(leaf, st->leaf) != 0)
            continue;
        if (st->next_update != 0 && time(NULL) > st->next_update) {
            if (!st->stale_logged) {
                char subject[256];
                st->stale_logged = 1;
                X509_NAME_oneline(X509_get_subject_name(leaf), subject, sizeof(subject));
                ms_log(MS_LOG_WARN, "TLS: the OCSP response for %s is past its next update: "
                                    "not stapled (refresh the file, then reload)",
                       subject);
            }
            return SSL_TLSEXT_ERR_NOACK;
        }
        unsigned char *copy = OPENSSL_memdup(st->der, st->len); /* (OpenSSL frees it) */
        if (copy == NULL || SSL_set_tlsext_status_ocsp_resp(ssl, copy, (long)st->len) != 1) {
            OPENSSL_free(copy);
            return SSL_TLSEXT_ERR_NOACK;
        }
        return SSL_TLSEXT_ERR_OK;
    }
    return SSL_TLSEXT_ERR_NOACK;
}

/* -- Session tickets ------------------------------------------------------------------------
 * Resumption is by tickets alone, encrypted with the keys of a zone (tickets.h): the master's,
 * handed over by ms_tls_tickets, so that a ticket resumes on any worker and after a reload;
 * or, in a process that was handed none (one without a master), its own, which it rotates
 * itself as a ticket is made. */

static const ms_tickets_t *tickets;
static ms_tickets_t *own_tickets;                        /* this process made them */
static uint64_t ticket_rotate_ms = MS_TLS_TICKET_ROTATE * 1000; /* for its own */

int ms_tls_tickets(int fd)
{
    const ms_tickets_t *t;
    int rc = ms_tickets_attach(fd, &t);
    if (rc < 0)
        return rc;
    ms_tickets_detach(tickets);
    tickets = t;
    own_tickets = NULL;
    return 0;
}

void ms_tls_ticket_rotate(double seconds)
{
    if (seconds > 0)
        ticket_rotate_ms = (uint64_t)(seconds * 1000);
}

static int tickets_ready(void)
{
    if (tickets != NULL)
        return 0;
    int fd = ms_tickets_create(&own_tickets);
    if (fd < 0)
        return fd;
    close(fd); /* the mapping stays */
    tickets = own_tickets;
    return 0;
}

/* OpenSSL's ticket callback: a new ticket is made with the newest key; one made with either
 * key before it decrypts, and is renewed; any other means a full handshake. */
static int on_ticket(SSL *ssl, unsigned char name[16], unsigned char *iv, EVP_CIPHER_CTX *cctx,
                     EVP_MAC_CTX *hctx, int enc)
{
    (void)ssl;
    if (own_tickets != NULL && enc &&
        uv_hrtime() / 1000000 - ms_tickets_made(own_tickets) >= ticket_rotate_ms)
        ms_tickets_rotate(own_tickets); /* (on failure the key in use stays) */
    ms_ticket_key_t keys[MS_TICKET_KEYS];
    int n = ms_tickets_read(tickets, keys), k = 0;
    if (enc) {
        memcpy(name, keys[0].name, sizeof(keys[0].name));
        if (RAND_bytes(iv, 16) != 1)
            k = -1;
    } else {
        while (k < n && memcmp(name, keys[k].name, sizeof(keys[k].name)) != 0)
            k++;
    }
    int rc = 0; /* decrypting: not one of ours, or too old */
    if (k >= 0 && k < n) {
        OSSL_PARAM params[] = {
            OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_KEY, keys[k].hmac,
                                              sizeof(keys[k].hmac)),
            OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, "SHA256", 0),
            OSSL_PARAM_construct_end()};
        int ok = EVP_MAC_CTX_set_params(hctx, params) == 1 &&
                 (enc ? EVP_EncryptInit_ex(cctx, EVP_aes_256_cbc(), NULL, keys[k].aes, iv)
                      : EVP_DecryptInit_ex(cctx, EVP_aes_256_cbc(), NULL, keys[k].aes, iv)) == 1;
        rc = !ok ? -1 : k == 0 ? 1 : 2; /* 2: an older key's, renewed */
    } else if (enc) {
        rc = -1;
    }
    OPENSSL_cleanse(keys, sizeof(keys));
    return rc;
}

/* -- Settings ---------------------------------------------------------------------------- */

static void set_err(char *err, size_t errlen, const char *what)
{
    unsigned long e = ERR_peek_last_error();
    const char *why = e != 0 ? ERR_reason_error_string(e) : NULL;
    snprintf(err, errlen, "%s%s%s", what, why ? ": " : "", why ? why : "");
    ERR_clear_error();
}

static char *dup_or(const char *s, const char *dflt)
{
    const char *v = s != NULL ? s : dflt;
    size_t n = strlen(v) + 1;
    char *p = ms_mem_alloc(n);
    memcpy(p, v, n);
    return p;
}

/* A context with the settings of `t`: every context of a listener has the same. */
static SSL_CTX *make_ctx(ms_tls_t *t, char *err, size_t errlen)
{
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL) {
        set_err(err, errlen, "cannot make a TLS context");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION);
    /* No renegotiation (a client could make the server redo handshakes for free), no
     * compression (CRIME), and the client's order of ciphers (all of ours are strong). */
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    SSL_CTX_clear_options(ctx, SSL_OP_CIPHER_SERVER_PREFERENCE);
    /* An idle connection holds no record buffers. */
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    /* The kernel may take the keys once the handshake is done (only those for writing: see
     * ktls_bio_method). */
    if (t->ktls)
        SSL_CTX_set_options(ctx, SSL_OP_ENABLE_KTLS);
    /* No 0-RTT: early data can be replayed. */
    SSL_CTX_set_max_early_data(ctx, 0);
    SSL_CTX_set_recv_max_early_data(ctx, 0);
    /* Resumption by tickets alone (no session cache in the worker's memory), with the
     * keys every worker shares. */
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_tlsext_ticket_key_evp_cb(ctx, on_ticket);
    SSL_CTX_set_tlsext_status_cb(ctx, on_status);
    SSL_CTX_set_tlsext_status_arg(ctx, t);
    SSL_CTX_set_session_id_context(ctx, (const unsigned char *)"moonserve", 9);
    SSL_CTX_set_dh_auto(ctx, 1);
    SSL_CTX_set_alpn_select_cb(ctx, on_alpn, NULL);
    if (t->hook_slot >= 0)
        SSL_CTX_set_cert_cb(ctx, on_cert, t);
    if (SSL_CTX_set_cipher_list(ctx, t->ciphers) != 1) {
        set_err(err, errlen, "bad ciphers");
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (SSL_CTX_set_ciphersuites(ctx, t->ciphersuites) != 1) {
        set_err(err, errlen, "bad ciphersuites");
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (SSL_CTX_set1_groups_list(ctx, t->groups) != 1) {
        set_err(err, errlen, "bad groups");
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

static void tls_free_one(ms_tls_t *t)
{
    for (uint32_t i = 0; i < t->nstaples; i++) {
        X509_free(t->staples[i].leaf);
        ms_mem_free(t->staples[i].der);
    }
    ms_mem_free(t->staples);
    for (uint32_t i = 0; i < t->nnames; i++) {
        if (t->names[i].ctx != t->ctx)
            SSL_CTX_free(t->names[i].ctx);
        ms_mem_free(t->names[i].name);
    }
    ms_mem_free(t->names);
    SSL_CTX_free(t->ctx);
    ms_mem_free(t->ciphers);
    ms_mem_free(t->ciphersuites);
    ms_mem_free(t->groups);
    ms_mem_free(t);
}

ms_tls_t *ms_tls_new(ms_server_t *s, const ms_tls_opts_t *o, char *err, size_t errlen)
{
    static const ms_tls_opts_t none = {0};
    if (o == NULL)
        o = &none;
    if (bio_setup() < 0) {
        snprintf(err, errlen, "cannot make the TLS BIO");
        return NULL;
    }
    int rc = tickets_ready();
    if (rc < 0) {
        snprintf(err, errlen, "cannot make session ticket keys: %s", uv_strerror(rc));
        return NULL;
    }
    ms_tls_t *t = ms_mem_alloc(sizeof(*t));
    memset(t, 0, sizeof(*t));
    t->refuse_unknown = o->refuse_unknown != 0;
    t->ktls = !o->no_ktls && ms_tls_kernel(NULL);
    t->ciphers = dup_or(o->ciphers, MS_TLS_CIPHERS);
    t->ciphersuites = dup_or(o->ciphersuites, MS_TLS_CIPHERSUITES);
    t->groups = dup_or(o->groups, MS_TLS_GROUPS);
    t->hook_slot = -1;
    t->ctx = make_ctx(t, err, errlen);
    if (t->ctx == NULL) {
        tls_free_one(t);
        return NULL;
    }
    SSL_CTX_set_tlsext_servername_callback(t->ctx, on_servername);
    SSL_CTX_set_tlsext_servername_arg(t->ctx, t);
    if (s->tls == NULL) {
        ms_tls_worker_t *w = ms_mem_alloc(sizeof(*w));
        memset(w, 0, sizeof(*w));
        w->rbuf = ms_mem_alloc(MS_TLS_READ_BUF);
        w->stage = ms_mem_alloc(MS_TLS_STAGE);
        w->fbuf = ms_mem_alloc(MS_TLS_BURST);
        s->tls = w;
    }
    t->next = s->tls->list;
    s->tls->list = t;
    return t;
}

static void tls_free(ms_server_t *s)
{
    ms_tls_worker_t *w = s->tls;
    if (w == NULL)
        return;
    for (ms_tls_t *t = w->list, *next; t != NULL; t = next) {
        next = t->next;
        tls_free_one(t);
    }
    ms_mem_free(w->rbuf);
    ms_mem_free(w->stage);
    ms_mem_free(w->fbuf);
    ms_mem_free(w->out.base);
    ms_mem_free(w);
    s->tls = NULL;
}

static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    (void)buf, (void)size, (void)rwflag, (void)u;
    return 0; /* a key with a passphrase is refused, never asked for on a terminal */
}

/* Puts a certificate, its chain and its key into `ctx`; returns the leaf (referenced) or NULL
 * with why in `err`. */
static X509 *load_pair(SSL_CTX *ctx, const char *cert, size_t cert_len, const char *key,
                       size_t key_len, char *err, size_t errlen)
{
    ERR_clear_error();
    if (cert_len > INT32_MAX || key_len > INT32_MAX) {
        snprintf(err, errlen, "certificate or key too large");
        return NULL;
    }
    BIO *b = BIO_new_mem_buf(cert, (int)cert_len);
    X509 *leaf = b != NULL ? PEM_read_bio_X509(b, NULL, no_passphrase, NULL) : NULL;
    if (leaf == NULL || SSL_CTX_use_certificate(ctx, leaf) != 1) {
        set_err(err, errlen, "no certificate in the PEM");
        X509_free(leaf);
        BIO_free(b);
        return NULL;
    }
    SSL_CTX_clear_chain_certs(ctx);
    X509 *ca;
    while ((ca = PEM_read_bio_X509(b, NULL, no_passphrase, NULL)) != NULL) {
        if (SSL_CTX_add0_chain_cert(ctx, ca) != 1) {
            X509_free(ca);
            set_err(err, errlen, "a bad certificate in the chain");
            X509_free(leaf);
            BIO_free(b);
            return NULL;
        }
    }
    ERR_clear_error(); /* the end of the PEM */
    BIO_free(b);
    b = BIO_new_mem_buf(key, (int)key_len);
    EVP_PKEY *k = b != NULL ? PEM_read_bio_PrivateKey(b, NULL, no_passphrase, NULL) : NULL;
    BIO_free(b);
    if (k == NULL) {
        set_err(err, errlen, "no private key in the PEM (or one with a passphrase)");
        X509_free(leaf);
        return NULL;
    }
    int ok = SSL_CTX_use_PrivateKey(ctx, k) == 1 && SSL_CTX_check_private_key(ctx) == 1;
    EVP_PKEY_free(k);
    if (!ok) {
        set_err(err, errlen, "the private key is not the certificate's");
        X509_free(leaf);
        return NULL;
    }
    return leaf;
}

static void add_name(ms_tls_t *t, const char *name, SSL_CTX *ctx)
{
    if (t->nnames == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 8;
        t->names = ms_mem_realloc(t->names, t->cap * sizeof(*t->names));
    }
    t->names[t->nnames].name = dup_or(name, NULL);
    t->names[t->nnames].ctx = ctx;
    t->nnames++;
}

/* The names a default certificate is for (its DNS subject alternative names) are known names:
 * the refusing policy answers them with it. */
static void add_leaf_names(ms_tls_t *t, X509 *leaf)
{
    GENERAL_NAMES *sans = X509_get_ext_d2i(leaf, NID_subject_alt_name, NULL, NULL);
    char name[256];
    for (int i = 0; sans != NULL && i < sk_GENERAL_NAME_num(sans); i++) {
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, i);
        if (g->type != GEN_DNS)
            continue;
        const char *p = (const char *)ASN1_STRING_get0_data(g->d.dNSName);
        int n = ASN1_STRING_length(g->d.dNSName);
        if (n <= 0 || n >= (int)sizeof(name) || memchr(p, 0, (size_t)n) != NULL)
            continue;
        memcpy(name, p, (size_t)n);
        name[n] = 0;
        if (lower_name(name, name, sizeof(name)) != NULL && find_exact(t, name) == NULL)
            add_name(t, name, t->ctx);
    }
    GENERAL_NAMES_free(sans);
}

int ms_tls_cert(ms_tls_t *t, const char *name, const char *cert, size_t cert_len,
                const char *key, size_t key_len, char *err, size_t errlen)
{
    SSL_CTX *ctx = t->ctx;
    char lname[256];
    if (name != NULL) {
        if (lower_name(name, lname, sizeof(lname)) == NULL || lname[0] == 0) {
            snprintf(err, errlen, "bad server name");
            return UV_EINVAL;
        }
        tls_name_t *n = find_exact(t, lname);
        if (n == NULL || n->ctx == t->ctx) {
            /* A name of its own: a context like the default one, with its certificates. */
            ctx = make_ctx(t, err, errlen);
            if (ctx == NULL)
                return UV_EINVAL;
            if (n != NULL)
                n->ctx = ctx;
            else
                add_name(t, lname, ctx);
        } else {
            ctx = n->ctx;
        }
    }
    X509 *leaf = load_pair(ctx, cert, cert_len, key, key_len, err, errlen);
    if (leaf == NULL)
        return UV_EINVAL;
    if (name == NULL) {
        t->has_default = 1;
        add_leaf_names(t, leaf);
    }
    X509_free(leaf);
    return 0;
}

int ms__tls_ready(const ms_tls_t *t)
{
    return t->has_default;
}

/* The first two certificates of a PEM chain: the leaf and its issuer (NULL if none follows). */
static X509 *leaf_and_issuer(const char *pem, size_t len, X509 **issuer)
{
    *issuer = NULL;
    if (len > INT32_MAX)
        return NULL;
    BIO *b = BIO_new_mem_buf(pem, (int)len);
    X509 *leaf = b != NULL ? PEM_read_bio_X509(b, NULL, no_passphrase, NULL) : NULL;
    if (leaf != NULL)
        *issuer = PEM_read_bio_X509(b, NULL, no_passphrase, NULL);
    BIO_free(b);
    ERR_clear_error();
    return leaf;
}

static time_t asn1_time(const ASN1_TIME *a)
{
    struct tm tm;
    if (a == NULL || ASN1_TIME_to_tm(a, &tm) != 1)
        return 0;
    return timegm(&tm);
}

int ms_tls_staple(ms_tls_t *t, const char *cert, size_t cert_len, const char *der,
                  size_t der_len, char *err, size_t errlen)
{
    X509 *issuer, *leaf = leaf_and_issuer(cert, cert_len, &issuer);
    const unsigned char *p = (const unsigned char *)der;
    OCSP_RESPONSE *resp = der_len <= LONG_MAX ? d2i_OCSP_RESPONSE(NULL, &p, (long)der_len) : NULL;
    OCSP_BASICRESP *basic = NULL;
    OCSP_CERTID *id = NULL;
    ASN1_GENERALIZEDTIME *this_update = NULL, *next_update = NULL;
    int status = -1, reason, rc = UV_EINVAL;
    if (leaf == NULL) {
        snprintf(err, errlen, "no certificate in the PEM");
    } else if (issuer == NULL) {
        snprintf(err, errlen, "an OCSP response needs the issuer's certificate after the leaf "
                              "in the chain");
    } else if (resp == NULL || p != (const unsigned char *)der + der_len) {
        snprintf(err, errlen, "not an OCSP response (DER)");
    } else if ((status = OCSP_response_status(resp)) != OCSP_RESPONSE_STATUS_SUCCESSFUL) {
        snprintf(err, errlen, "the OCSP response is not successful: %s",
                 OCSP_response_status_str(status));
    } else if ((basic = OCSP_response_get1_basic(resp)) == NULL ||
               (id = OCSP_cert_to_id(NULL, leaf, issuer)) == NULL ||
               OCSP_resp_find_status(basic, id, &status, &reason, NULL, &this_update,
                                     &next_update) != 1) {
        snprintf(err, errlen, "the OCSP response is not for this certificate");
    } else if (status != V_OCSP_CERTSTATUS_GOOD) {
        snprintf(err, errlen, "the OCSP response says the certificate is %s",
                 OCSP_cert_status_str(status));
    } else {
        /* (5 minutes' leeway for the clocks, as OpenSSL's own client allows) */
        int current = OCSP_check_validity(this_update, next_update, 300, -1) == 1;
        if (!current)
            ms_log(MS_LOG_WARN, "TLS: the OCSP response is not current: it will not be "
                                "stapled (refresh the file, then reload)");
        t->staples = ms_mem_realloc(t->staples, (t->nstaples + 1) * sizeof(*t->staples));
        tls_staple_t *st = &t->staples[t->nstaples++];
        st->leaf = leaf;
        leaf = NULL;
        st->der = ms_mem_alloc(der_len);
        memcpy(st->der, der, der_len);
        st->len = der_len;
        st->next_update = current ? asn1_time(next_update) : 1; /* 1: past, never stapled */
        st->stale_logged = !current;
        rc = 0;
    }
    ERR_clear_error();
    OCSP_CERTID_free(id);
    OCSP_BASICRESP_free(basic);
    OCSP_RESPONSE_free(resp);
    X509_free(issuer);
    X509_free(leaf);
    return rc;
}

const ms_part_t ms__tls_part = {.name = "tls", .worker_free = tls_free};
