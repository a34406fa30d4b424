/* sock.c: outbound TCP sockets, their reads by pattern, the worker's connection pools. */
#include "client/sock.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "engine/engine.h"
#include "base/match.h"
#include "client/sockets.h"

/* A socket's read buffer: one size, recycled, so a warm socket reads without allocating.
 * A read that needs more (a long line, receive(n), "*a") grows it; a grown one is freed when
 * the connection goes back to the pool. */
#define MS_SOCK_BUF_SIZE 4096
/* Gathered sends with more pieces than this use the socket's own scratch array. */
#define MS_SOCK_IOV_STACK 16
/* Ciphertext kept unread at most, beyond a full plaintext buffer nobody reads, before the
 * peer is held back: about two records. */
#define MS_SOCK_TLS_HOLD (32 * 1024)

enum { ST_CLOSED, ST_RESOLVING, ST_WAITING, ST_CONNECTING, ST_CONNECTED };

/* A connection: the libuv handle and what must outlive the socket that used it (the write
 * request libuv still holds, the pool's links). A socket points to it while it uses it; the
 * pool holds it while idle; it is freed once libuv has closed its handles. */
struct ms_sconn_s {
    union {
        uv_handle_t h;
        uv_stream_t st;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } u;
    uv_connect_t creq;
    uv_write_t wreq;
    uv_timer_t idle; /* the pool's expiry; unreferenced, so idle connections let a loop end */
    ms_sockets_t *sk;
    ms_sock_t *sock;          /* who uses it; NULL while idle in the pool or closing */
    ms_spool_t *pool;         /* counted in pool->active until it closes */
    ms_sconn_t *older, *newer; /* the pool's idle list, while idle */
    uint32_t reused;
    uint8_t open;  /* the handle is initialised (it must be closed) */
    uint8_t idling; /* in the pool's idle list */
    uint8_t closes; /* handles still closing */
    /* TLS (sslhandshake): the state goes to the pool with the connection */
    uint8_t wflight;  /* a background write of `sending` is under way */
    ms_stls_t *tls;   /* owned; freed when the handles have closed */
    ms_buf_t sending; /* owned: the ciphertext that write is writing */
};

struct ms_sock_s {
    ms_sock_view_t v; /* first: the binding casts an ms_sock_t * to its view */
    ms_server_t *server;
    ms_sockets_t *sk;
    ms_sconn_t *c; /* the connection, from the start of a connect until it closes or pools */
    int state;     /* ST_* */
    uint32_t connect_ms, send_ms, read_ms;
    /* connect */
    ms_sock_cb connect_cb;
    ms_timer_t ctimer;
    ms_spool_t *pool;          /* the pool connect named */
    ms_sock_t *wait_next;      /* in the pool's backlog queue */
    uint8_t wait_fresh;        /* ... asking for a connection of its own (TLS with other wishes) */
    ms_resolve_t res;          /* the name being connected to, and its addresses */
    int addr_next;             /* the next address to try */
    char host[MS_HOST_MAX + 1]; /* for messages */
    /* reading: bytes [rpos, rlen) of rbuf are unread */
    ms_sock_cb read_cb;
    ms_timer_t rtimer;
    int rkind; /* MS_SOCK_*, or -1 for receiveuntil */
    size_t rn; /* the count or size asked for */
    ms_sock_until_t *until;
    char *rbuf;
    size_t rpos, rlen, rcap;
    size_t lscan;   /* bytes of the unread data already searched for a LF */
    uint64_t rgen;  /* changes with every consuming read: a matcher's state is stale */
    int rerr;       /* the read side ended (UV_EOF) or failed, with no reader to tell */
    uint8_t read_off; /* reading stopped: the buffer is full and nobody reads */
    /* writing */
    ms_sock_cb write_cb;
    ms_timer_t wtimer;
    uv_buf_t *iov; /* owned scratch for long gathered sends */
    unsigned iov_cap;
    /* TLS */
    uint8_t hs;           /* a handshake is under way (connect_cb and ctimer are its) */
    int verr;             /* the certificate error of the last failed handshake */
    ms_stls_cert_t *cert; /* owned: setclientcert's */
};

/* A receiveuntil iterator: the matcher (match.c), and which socket's unread bytes its state
 * describes. One allocation: the matcher follows this header. */
struct ms_sock_until_s {
    ms_sock_t *sock; /* whose unread bytes the matcher has searched */
    uint64_t gen;    /* ... as of that socket's rgen */
    ms_match_t *m;   /* in this allocation */
};

static uint64_t rgen_next;

/* -- The worker's sockets ---------------------------------------------------------------- */

/* The configuration the worker's limits give (core/base/settings.h: socket_*, resolver_*). */
static void config_of(ms_sock_config_t *cfg, const ms_limits_t *l)
{
    cfg->connect_timeout = l->socket_connect_timeout_ms;
    cfg->send_timeout = l->socket_send_timeout_ms;
    cfg->read_timeout = l->socket_read_timeout_ms;
    cfg->keepalive_timeout = l->socket_keepalive_timeout_ms;
    cfg->pool_size = l->socket_pool_size;
    cfg->resolve_ttl = l->resolver_ttl_ms;
    cfg->resolve_negative_ttl = l->resolver_negative_ttl_ms;
    cfg->resolve_max = l->resolver_in_flight;
    cfg->resolve_cache_max = l->resolver_names;
}

void ms_sock_config_default(ms_sock_config_t *cfg)
{
    ms_limits_t l;
    ms_limits_default(&l);
    config_of(cfg, &l);
}

/* Lookups hold a thread of libuv's pool each (UV_THREADPOOL_SIZE, 4 unless set) until they
 * end; file work needs one left. */
static uint32_t resolve_cap(uint32_t want)
{
    const char *env = getenv("UV_THREADPOOL_SIZE");
    long threads = env != NULL ? strtol(env, NULL, 10) : 4;
    uint32_t cap = threads > 1 ? (uint32_t)(threads - 1) : 1;
    return want == 0 ? 1 : want > cap ? cap : want;
}

ms_sockets_t *ms__sockets(ms_server_t *srv)
{
    if (MS_LIKELY(srv->sockets != NULL))
        return srv->sockets;
    ms_sockets_t *sk = ms_mem_alloc(sizeof(*sk));
    memset(sk, 0, sizeof(*sk));
    sk->server = srv;
    config_of(&sk->cfg, &srv->limits);
    sk->cfg.resolve_max = resolve_cap(sk->cfg.resolve_max);
    srv->sockets = sk;
    return sk;
}

void ms_sock_config(ms_server_t *srv, const ms_sock_config_t *cfg)
{
    ms_sockets_t *sk = ms__sockets(srv);
    if (cfg)
        sk->cfg = *cfg;
    else
        config_of(&sk->cfg, &srv->limits);
    sk->cfg.resolve_max = resolve_cap(sk->cfg.resolve_max);
}

/* -- Errors ------------------------------------------------------------------------------ */

const char *ms_sock_strerror(int err)
{
    switch (err) {
#define MS_SOCK_ERR_MSG(name, value, msg)                                                          \
    case MS_SOCK_##name: return msg;
        MS_SOCK_ERRORS(MS_SOCK_ERR_MSG)
#undef MS_SOCK_ERR_MSG
    case UV_ETIMEDOUT: return "timeout";
    case UV_EOF:
    case UV_ENOTCONN:
    case UV_ECANCELED:
    case MS_ECLOSED: return "closed";
    /* The rest as nginx words them (strerror, in lower case). */
    case UV_ECONNREFUSED: return "connection refused";
    case UV_ECONNRESET: return "connection reset by peer";
    case UV_EHOSTUNREACH: return "no route to host";
    case UV_ENETUNREACH: return "network is unreachable";
    case UV_EPIPE: return "broken pipe";
    case UV_ENOENT: return "no such file or directory";
    case UV_EACCES: return "permission denied";
    case UV_ECONNABORTED: return "software caused connection abort";
    case UV_EADDRNOTAVAIL: return "cannot assign requested address";
    case UV_EINVAL: return "invalid argument";
    }
    return uv_strerror(err);
}

int ms_sock_errmsg(ms_sock_t *s, int err, char *buf, size_t len)
{
    int n;
    if (err == MS_SOCK_ENOTFOUND || err == MS_SOCK_ERESOLVE)
        n = snprintf(buf, len, "%s %s", s->host, ms_sock_strerror(err));
    else if (err == MS_SOCK_EVERIFY && s->verr != 0)
        n = snprintf(buf, len, "%d: %s", s->verr, ms__stls_verify_text(s->verr));
    else
        n = snprintf(buf, len, "%s", ms_sock_strerror(err));
    return n < 0 ? 0 : (size_t)n >= len ? (int)len - 1 : n;
}

/* -- Read buffers ------------------------------------------------------------------------ */

static void rbuf_take(ms_sock_t *s)
{
    s->rbuf = ms__recycle_get(&s->sk->buf_free);
    if (s->rbuf == NULL)
        s->rbuf = ms_mem_alloc(MS_SOCK_BUF_SIZE);
    s->rcap = MS_SOCK_BUF_SIZE;
    s->rpos = s->rlen = s->lscan = 0;
}

static void rbuf_release(ms_sock_t *s)
{
    if (s->rbuf == NULL)
        return;
    if (s->rcap != MS_SOCK_BUF_SIZE || !ms__recycle_put(&s->sk->buf_free, s->rbuf))
        ms_mem_free(s->rbuf);
    s->rbuf = NULL;
    s->rpos = s->rlen = s->rcap = s->lscan = 0;
}

/* Moves the unread bytes to the front. Only when a read starts: until then the last result
 * (the view) points at bytes before rpos. */
static void rbuf_compact(ms_sock_t *s)
{
    if (s->rpos == 0)
        return;
    memmove(s->rbuf, s->rbuf + s->rpos, s->rlen - s->rpos);
    s->rlen -= s->rpos;
    s->rpos = 0;
}

static void rbuf_reserve(ms_sock_t *s, size_t n)
{
    if (s->rbuf == NULL)
        rbuf_take(s);
    if (s->rcap - s->rlen >= n)
        return;
    size_t cap = s->rcap;
    while (cap - s->rlen < n)
        cap *= 2;
    s->rbuf = ms_mem_realloc(s->rbuf, cap);
    s->rcap = cap;
}

static void consume(ms_sock_t *s, size_t n)
{
    s->rpos += n;
    s->lscan = 0;
    s->rgen = ++rgen_next;
}

static void set_result(ms_sock_t *s, const char *p, size_t n)
{
    s->v.data = p;
    s->v.len = n;
}

/* -- Matching ----------------------------------------------------------------------------
 * Each returns MS_SOCK_DONE or MS_SOCK_END with the result in the view and its bytes
 * consumed, or 0 when it needs more. None looks at the socket beyond its buffer and rerr,
 * so the fuzz target runs them on a buffer alone. */

static int match_line(ms_sock_t *s)
{
    char *p = s->rbuf + s->rpos;
    size_t used;
    long len = ms_match_line(p, s->rlen - s->rpos, &s->lscan, &used);
    if (len < 0)
        return 0;
    set_result(s, p, (size_t)len);
    consume(s, used);
    return MS_SOCK_DONE;
}

static int match_until(ms_sock_t *s, ms_sock_until_t *u, size_t size)
{
    if (u->sock != s || u->gen != s->rgen) { /* another read consumed, or another socket */
        u->sock = s;
        ms_match_reset(u->m);
    }
    const char *p = s->rbuf + s->rpos;
    size_t len, used;
    int rc = ms_match_feed(u->m, p, s->rlen - s->rpos, size, &len, &used);
    if (rc == MS_MATCH_MORE)
        return 0;
    if (rc == MS_MATCH_END) { /* ms_sock_receiveuntil tells it first; here for the fuzz target */
        set_result(s, NULL, 0);
        return MS_SOCK_END;
    }
    set_result(s, p, len);
    consume(s, used);
    u->gen = s->rgen;
    return MS_SOCK_DONE;
}

static int read_match(ms_sock_t *s)
{
    size_t avail = s->rlen - s->rpos;
    char *p = s->rbuf + s->rpos;
    switch (s->rkind) {
    case MS_SOCK_LINE: return avail ? match_line(s) : 0;
    case MS_SOCK_ALL:
        if (s->rerr != UV_EOF)
            return 0;
        set_result(s, p, avail);
        consume(s, avail);
        return MS_SOCK_DONE;
    case MS_SOCK_BYTES:
        if (avail < s->rn)
            return 0;
        set_result(s, p, s->rn);
        consume(s, s->rn);
        return MS_SOCK_DONE;
    case MS_SOCK_ANY:
        if (avail == 0)
            return 0;
        avail = avail < s->rn ? avail : s->rn;
        set_result(s, p, avail);
        consume(s, avail);
        return MS_SOCK_DONE;
    default: return match_until(s, s->until, s->rn);
    }
}

/* A read that cannot finish: the partial data (every unread byte, CRs dropped for a line)
 * goes to the view and is consumed. */
static void read_partial(ms_sock_t *s)
{
    char *p = s->rbuf ? s->rbuf + s->rpos : NULL;
    size_t avail = s->rlen - s->rpos;
    size_t n = s->rkind == MS_SOCK_LINE && avail ? ms_match_drop_cr(p, avail) : avail;
    set_result(s, p, n);
    if (avail)
        consume(s, avail);
    if (s->rkind < 0)
        ms_match_reset(s->until->m);
}

/* -- Connections ------------------------------------------------------------------------- */

static void pool_slot_free(ms_spool_t *p);
static void idle_unlink(ms_sconn_t *c);

static void sconn_closed(uv_handle_t *h)
{
    ms_sconn_t *c = h->data;
    if (--c->closes > 0)
        return;
    ms__stls_free(c->tls);
    ms_mem_free(c->sending.base);
    ms_mem_free(c);
}

/* A TLS connection that closes says so (close_notify) and sends what OpenSSL still has (an
 * alert after a failed handshake), as far as the socket takes it now: nothing waits. */
static void tls_goodbye(ms_sconn_t *c)
{
    ms__stls_shutdown(c->tls);
    ms_buf_t *o = ms__stls_out(c->tls);
    if (o->len > 0 && !c->wflight) {
        uv_buf_t b = uv_buf_init(o->base, (unsigned)o->len);
        (void)uv_try_write(&c->u.st, &b, 1);
    }
    o->len = 0;
}

static ms_sconn_t *sconn_new(ms_sockets_t *sk, ms_spool_t *pool)
{
    ms_sconn_t *c = ms_mem_alloc(sizeof(*c));
    memset(c, 0, sizeof(*c));
    c->sk = sk;
    c->pool = pool;
    if (pool)
        pool->active++;
    uv_timer_init(sk->server->loop, &c->idle);
    uv_unref((uv_handle_t *)&c->idle);
    c->idle.data = c;
    sk->sconns++;
    return c;
}

/* Closes a connection nobody uses any more, and frees its pool slot. */
static void sconn_drop(ms_sconn_t *c)
{
    if (c->idling)
        idle_unlink(c);
    c->sock = NULL;
    c->sk->sconns--;
    c->closes = 1;
    uv_close((uv_handle_t *)&c->idle, sconn_closed);
    if (c->open && c->tls)
        tls_goodbye(c);
    if (c->open) {
        c->closes++;
        uv_close(&c->u.h, sconn_closed);
    }
    ms_spool_t *p = c->pool;
    c->pool = NULL;
    if (p)
        pool_slot_free(p);
}

/* -- Pools ------------------------------------------------------------------------------- */

static uint32_t key_hash(const char *k, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)k[i]) * 16777619u;
    return h;
}

static ms_spool_t *pool_get(ms_sockets_t *sk, const char *key, size_t n, const ms_sock_opts_t *o)
{
    uint32_t h = key_hash(key, n) % MS_SOCK_POOL_BUCKETS;
    for (ms_spool_t *p = sk->pools[h]; p != NULL; p = p->hnext)
        if (p->keylen == n && memcmp(p->key, key, n) == 0) {
            if (o && o->pool_size && !p->size_set) {
                p->size = o->pool_size;
                p->size_set = 1;
            }
            return p;
        }
    /* FIXME: a pool is kept for as long as the worker runs: a worker that connects to ever
     * new names keeps one small struct per name. */
    ms_spool_t *p = ms_mem_alloc(sizeof(*p) + n);
    memset(p, 0, sizeof(*p));
    p->keylen = (uint16_t)n;
    memcpy(p->key, key, n);
    p->size = o && o->pool_size ? o->pool_size : sk->cfg.pool_size;
    p->size_set = o && o->pool_size;
    p->backlog = o ? o->backlog : 0;
    p->hnext = sk->pools[h];
    sk->pools[h] = p;
    return p;
}

static void idle_unlink(ms_sconn_t *c)
{
    ms_spool_t *p = c->pool;
    if (c->older)
        c->older->newer = c->newer;
    else
        p->oldest = c->newer;
    if (c->newer)
        c->newer->older = c->older;
    else
        p->newest = c->older;
    c->older = c->newer = NULL;
    c->idling = 0;
    p->nidle--;
    c->sk->server->m->pool_idle--;
    uv_timer_stop(&c->idle);
}

static void on_idle_expired(uv_timer_t *t)
{
    ms_sconn_t *c = t->data;
    ms_server_t *srv = c->sk->server;
    ms__server_enter(srv);
    sconn_drop(c); /* a connect in the backlog may go ahead */
    ms__server_leave(srv);
}

static void attach(ms_sock_t *s, ms_sconn_t *c);
static void connect_start(ms_sock_t *s);
static void connect_done(ms_sock_t *s, int status);

/* A pooled connection that is no longer the pool's limit's: a connect that waits for one
 * goes ahead. */
static void pool_slot_free(ms_spool_t *p)
{
    p->active--;
    if (p->wait_head == NULL || p->active >= p->size)
        return;
    ms_sock_t *w = p->wait_head;
    p->wait_head = w->wait_next;
    if (p->wait_head == NULL)
        p->wait_tail = NULL;
    w->wait_next = NULL;
    p->nwait--;
    connect_start(w);
}

/* The newest idle connection, or NULL. It is handed out unchecked, as nginx does: the pool
 * reads every idle connection (on_idle_read), so one its peer closed or wrote to is dropped
 * on the turn of the loop that sees it, and a check here would cost a system call a connect.
 * A peer that closes after the loop last polled is seen by the connection's first read
 * ("closed"), as it would be a moment after any check. */
static ms_sconn_t *pool_take(ms_spool_t *p)
{
    ms_sconn_t *c = p->newest;
    if (c != NULL)
        idle_unlink(c);
    return c;
}

static void on_idle_read(ms_sconn_t *c)
{
    /* Bytes or the end on an idle connection: the peer closed it, or it is out of step. */
    if (c->idling)
        sconn_drop(c);
}

static void pool_put(ms_spool_t *p, ms_sconn_t *c, uint64_t idle_ms)
{
    c->reused++;
    if (p->wait_head != NULL && p->wait_head->wait_fresh) {
        /* a connect waits for a slot of its own: closing this one gives it */
        sconn_drop(c);
        return;
    }
    if (p->wait_head != NULL) { /* a connect waits for a slot: it takes this one */
        ms_sock_t *w = p->wait_head;
        p->wait_head = w->wait_next;
        if (p->wait_head == NULL)
            p->wait_tail = NULL;
        w->wait_next = NULL;
        p->nwait--;
        attach(w, c);
        connect_done(w, MS_SOCK_DONE);
        return;
    }
    if (p->size == 0) {
        sconn_drop(c);
        return;
    }
    if (p->nidle >= p->size)
        sconn_drop(p->oldest);
    c->older = p->newest;
    c->newer = NULL;
    if (p->newest)
        p->newest->newer = c;
    else
        p->oldest = c;
    p->newest = c;
    p->nidle++;
    c->sk->server->m->pool_idle++;
    c->idling = 1;
    uv_unref(&c->u.h);
    if (idle_ms > 0)
        uv_timer_start(&c->idle, on_idle_expired, idle_ms, 0);
}

/* -- Reading from libuv ------------------------------------------------------------------ */

static void sock_fail(ms_sock_t *s, int err);
static void sock_close_conn(ms_sock_t *s, int err, int notify);
static void tls_decrypt(ms_sock_t *s);

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    ms_sconn_t *c = h->data;
    ms_sock_t *s = c->sock;
    if (c->tls) {
        /* Ciphertext goes to the TLS state's own buffer. With the plaintext buffer full and
         * nobody reading, the peer is held back once a record more is waiting. */
        if (s && s->read_cb == NULL && s->rbuf && s->rlen == s->rcap &&
            ms__stls_in_pending(c->tls) >= MS_SOCK_TLS_HOLD) {
            *buf = uv_buf_init(NULL, 0);
            return;
        }
        size_t n;
        char *p = ms__stls_in_space(c->tls, &n);
        *buf = uv_buf_init(p, (unsigned)n);
        return;
    }
    if (s == NULL) { /* idle in the pool: whatever comes is dropped with the connection */
        *buf = uv_buf_init(c->sk->scratch, sizeof(c->sk->scratch));
        return;
    }
    if (s->rbuf == NULL)
        rbuf_take(s);
    if (s->rlen == s->rcap) {
        if (s->read_cb == NULL) { /* nobody reads: hold the peer back */
            *buf = uv_buf_init(NULL, 0);
            return;
        }
        if (s->rpos > 0)
            rbuf_compact(s);
        else
            rbuf_reserve(s, s->rcap);
    }
    *buf = uv_buf_init(s->rbuf + s->rlen, s->rcap - s->rlen);
}

static void read_finish(ms_sock_t *s, int rc)
{
    ms_sock_cb cb = s->read_cb;
    s->read_cb = NULL;
    ms_timer_stop(s->server, &s->rtimer);
    cb(s, rc);
}

static void read_done(ms_sconn_t *c, ms_sock_t *s, ssize_t nread);
static void tls_read_done(ms_sconn_t *c, ms_sock_t *s, size_t n);

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    ms_sconn_t *c = st->data;
    ms_server_t *srv = c->sk->server;
    ms__server_enter(srv);
    if (c->tls && nread > 0)
        tls_read_done(c, c->sock, (size_t)nread);
    else
        read_done(c, c->sock, nread);
    ms__server_leave(srv);
}

/* A reader waits and the buffer has more: it finishes if it can, or fails with the end. */
static void read_progress(ms_sock_t *s)
{
    if (s->read_cb == NULL)
        return;
    int rc = read_match(s);
    if (rc != 0)
        read_finish(s, rc);
    else if (s->rerr)
        sock_fail(s, s->rerr);
}

static void read_done(ms_sconn_t *c, ms_sock_t *s, ssize_t nread)
{
    uv_stream_t *st = &c->u.st;
    if (s == NULL) {
        if (nread != 0)
            on_idle_read(c);
        return;
    }
    if (nread > 0) {
        s->rlen += (size_t)nread;
    } else if (nread == UV_ENOBUFS) {
        uv_read_stop(st);
        s->read_off = 1;
        return;
    } else if (nread < 0) {
        uv_read_stop(st);
        if (s->hs) { /* the peer went away during the handshake */
            sock_close_conn(s, MS_SOCK_ESSL, 1);
            return;
        }
        s->rerr = (int)nread;
    } else {
        return;
    }
    read_progress(s);
}

static void on_read_timeout(ms_timer_t *t)
{
    ms_sock_t *s = container_of(t, ms_sock_t, rtimer);
    ms_server_t *srv = s->server;
    read_partial(s);
    ms_sock_cb cb = s->read_cb;
    s->read_cb = NULL;
    ms__server_enter(srv);
    cb(s, UV_ETIMEDOUT); /* the socket stays usable */
    ms__server_leave(srv);
}

/* -- Closing ----------------------------------------------------------------------------- */

/* Lets go of the connection (closing it) and completes whatever was under way with `err`:
 * a reader gets the partial data. Callbacks run last, so they may use the socket again. */
static void sock_close_conn(ms_sock_t *s, int err, int notify)
{
    ms_sock_cb rcb = s->read_cb, wcb = s->write_cb, ccb = s->connect_cb;
    s->read_cb = s->write_cb = s->connect_cb = NULL;
    ms_timer_stop(s->server, &s->rtimer);
    ms_timer_stop(s->server, &s->wtimer);
    ms_timer_stop(s->server, &s->ctimer);
    if (s->state == ST_RESOLVING)
        ms_resolve_cancel(&s->res);
    if (s->state == ST_WAITING) {
        ms_spool_t *p = s->pool;
        ms_sock_t **pp = &p->wait_head, *prev = NULL;
        while (*pp != s) {
            prev = *pp;
            pp = &(*pp)->wait_next;
        }
        *pp = s->wait_next;
        if (p->wait_tail == s)
            p->wait_tail = prev;
        s->wait_next = NULL;
        p->nwait--;
    }
    if (rcb)
        read_partial(s);
    s->hs = 0;
    s->state = ST_CLOSED;
    s->v.connected = 0;
    ms_sconn_t *c = s->c;
    s->c = NULL;
    if (c)
        sconn_drop(c);
    if (!notify)
        return;
    if (ccb)
        ccb(s, err);
    if (rcb)
        rcb(s, err);
    if (wcb)
        wcb(s, err);
}

/* An error other than a read timeout: the socket closes. */
static void sock_fail(ms_sock_t *s, int err)
{
    sock_close_conn(s, err, 1);
}

int ms_sock_close(ms_sock_t *s)
{
    if (s->state == ST_CLOSED)
        return UV_ENOTCONN;
    sock_close_conn(s, UV_EOF, 1);
    return MS_SOCK_DONE;
}

int ms_sock_fd(ms_sock_t *s)
{
    uv_os_fd_t fd;
    if (s->state != ST_CONNECTED || s->c == NULL || uv_fileno(&s->c->u.h, &fd) < 0)
        return UV_ENOTCONN;
    return fd;
}

/* -- Sockets ----------------------------------------------------------------------------- */

ms_sock_t *ms_sock_new(ms_server_t *srv)
{
    ms_sockets_t *sk = ms__sockets(srv);
    ms_sock_t *s = ms__recycle_get(&sk->sock_free);
    uv_buf_t *iov = NULL;
    unsigned iov_cap = 0;
    if (s == NULL) {
        s = ms_mem_alloc(sizeof(*s));
    } else {
        iov = s->iov; /* kept while recycled */
        iov_cap = s->iov_cap;
    }
    memset(s, 0, sizeof(*s));
    s->v.slot = -1;
    s->server = srv;
    s->sk = sk;
    s->connect_ms = sk->cfg.connect_timeout;
    s->send_ms = sk->cfg.send_timeout;
    s->read_ms = sk->cfg.read_timeout;
    s->rkind = MS_SOCK_LINE;
    s->iov = iov;
    s->iov_cap = iov_cap;
    s->res.data = s;
    sk->socks++;
    return s;
}

void ms_sock_free(ms_sock_t *s)
{
    ms_sockets_t *sk = s->sk;
    sock_close_conn(s, UV_EOF, 0);
    rbuf_release(s);
    ms__stls_cert_free(s->cert);
    s->cert = NULL;
    sk->socks--;
    uv_buf_t *iov = s->iov;
    if (!ms__recycle_put(&sk->sock_free, s)) {
        ms_mem_free(iov);
        ms_mem_free(s);
    }
}

static void sock_destroy(void *p)
{
    ms_sock_t *s = p;
    ms_mem_free(s->iov);
    ms_mem_free(s);
}

ms_sock_view_t *ms_sock_view(ms_sock_t *s)
{
    return &s->v;
}

void ms_sock_settimeouts(ms_sock_t *s, uint32_t connect_ms, uint32_t send_ms, uint32_t read_ms)
{
    const ms_sockets_t *sk = s->sk;
    s->connect_ms = connect_ms == MS_SOCK_TIMEOUT_DEFAULT ? sk->cfg.connect_timeout : connect_ms;
    s->send_ms = send_ms == MS_SOCK_TIMEOUT_DEFAULT ? sk->cfg.send_timeout : send_ms;
    s->read_ms = read_ms == MS_SOCK_TIMEOUT_DEFAULT ? sk->cfg.read_timeout : read_ms;
}

/* -- Connecting -------------------------------------------------------------------------- */

static void attach(ms_sock_t *s, ms_sconn_t *c)
{
    s->c = c;
    c->sock = s;
    uv_ref(&c->u.h);
    s->state = ST_CONNECTED;
    s->v.connected = 1;
    s->v.reused = c->reused;
    s->rerr = 0;
    s->read_off = 0;
    s->rpos = s->rlen = s->lscan = 0;
    s->v.data = NULL;
    s->v.len = 0;
}

static void connect_done(ms_sock_t *s, int status)
{
    ms_timer_stop(s->server, &s->ctimer);
    ms_sock_cb cb = s->connect_cb;
    s->connect_cb = NULL;
    if (status < 0)
        sock_close_conn(s, status, 0);
    if (cb)
        cb(s, status);
}

static void on_connect_timeout(ms_timer_t *t)
{
    ms_sock_t *s = container_of(t, ms_sock_t, ctimer);
    ms_server_t *srv = s->server;
    ms_sock_cb cb = s->connect_cb;
    s->connect_cb = NULL;
    ms__server_enter(srv);
    sock_close_conn(s, UV_ETIMEDOUT, 0);
    cb(s, UV_ETIMEDOUT);
    ms__server_leave(srv);
}

static int connect_addr(ms_sock_t *s);

static void connected(ms_sock_t *s, ms_sconn_t *c, int status);

static void on_connect(uv_connect_t *req, int status)
{
    ms_sconn_t *c = req->data;
    ms_sock_t *s = c->sock;
    if (s == NULL) /* the socket gave up on it: it is closing */
        return;
    ms_server_t *srv = s->server;
    ms__server_enter(srv);
    connected(s, c, status);
    ms__server_leave(srv);
}

static void connected(ms_sock_t *s, ms_sconn_t *c, int status)
{
    if (status < 0) {
        /* Refused or unreachable: the name's next address, if it has one. */
        if (s->addr_next < s->res.naddrs && status != UV_ECANCELED) {
            uv_close(&c->u.h, sconn_closed);
            c->closes++;
            c->open = 0;
            int rc = connect_addr(s);
            if (rc < 0)
                connect_done(s, rc);
            return;
        }
        connect_done(s, status);
        return;
    }
    uv_read_start(&c->u.st, on_alloc, on_read);
    attach(s, c);
    connect_done(s, MS_SOCK_DONE);
}

/* Opens the handle and connects to the next address. */
static int connect_addr(ms_sock_t *s)
{
    ms_sconn_t *c = s->c;
    uv_loop_t *loop = s->server->loop;
    int rc;
    if (c->closes > 0) {
        /* The handle of the last address is still closing; this attempt gets a fresh
         * connection that takes over the pool slot. */
        ms_sconn_t *n = sconn_new(s->sk, NULL);
        n->pool = c->pool;
        c->pool = NULL;
        c->sk->sconns--;
        n->sock = s;
        c->sock = NULL;
        uv_close((uv_handle_t *)&c->idle, sconn_closed);
        c->closes++;
        s->c = c = n;
    }
    s->state = ST_CONNECTING;
    c->creq.data = c;
    if (s->res.naddrs == 0) { /* unix: the path is in res.name */
        uv_pipe_init(loop, &c->u.pipe, 0);
        c->u.h.data = c;
        c->open = 1;
        uv_pipe_connect(&c->creq, &c->u.pipe, s->res.name, on_connect);
        return 0;
    }
    ms_addr_t *a = &s->res.addrs[s->addr_next++];
    uv_tcp_init_ex(loop, &c->u.tcp, a->sa.sa_family);
    c->u.h.data = c;
    c->open = 1;
    uv_tcp_nodelay(&c->u.tcp, 1);
    rc = uv_tcp_connect(&c->creq, &c->u.tcp, &a->sa, on_connect);
    return rc < 0 ? rc : 0;
}

/* From the resolver's callback, which the engine's work brackets (resolve.c). */
static void on_resolved(ms_resolve_t *r, int status)
{
    ms_sock_t *s = r->data;
    if (status < 0) {
        connect_done(s, status);
        return;
    }
    s->addr_next = 0;
    int rc = connect_addr(s);
    if (rc < 0)
        connect_done(s, rc);
}

/* Resolves and connects, holding a slot of the pool. Returns 0, or an error (the caller
 * completes the connect with it). */
static int connect_begin(ms_sock_t *s)
{
    s->c = sconn_new(s->sk, s->pool);
    s->c->sock = s;
    if (strncmp(s->host, "unix:", 5) == 0) {
        size_t n = strlen(s->host + 5);
        memcpy(s->res.name, s->host + 5, n + 1);
        s->res.naddrs = 0;
        return connect_addr(s);
    }
    s->state = ST_RESOLVING;
    int rc = ms_resolve(s->server, &s->res, s->host, strlen(s->host), s->res.port, on_resolved);
    if (rc == MS_SOCK_DONE) {
        s->addr_next = 0;
        return connect_addr(s);
    }
    return rc;
}

/* A connect that waited in the backlog has a slot now. */
static void connect_start(ms_sock_t *s)
{
    ms_timer_stop(s->server, &s->ctimer);
    if (s->connect_ms)
        ms_timer_start(s->server, &s->ctimer, s->connect_ms, on_connect_timeout);
    int rc = connect_begin(s);
    if (rc < 0)
        connect_done(s, rc);
}

int ms_sock_connect(ms_sock_t *s, const char *host, size_t host_len, int port,
                    const ms_sock_opts_t *o, ms_sock_cb cb)
{
    if (s->state != ST_CLOSED && s->state != ST_CONNECTED)
        return MS_SOCK_EBUSY_CONNECT;
    if (host_len > MS_HOST_MAX || host_len == 0 || memchr(host, 0, host_len))
        return UV_EINVAL;
    int is_unix = host_len > 5 && memcmp(host, "unix:", 5) == 0;
    if (!is_unix && (port <= 0 || port > 65535))
        return UV_EINVAL;
    if (s->state == ST_CONNECTED)
        sock_close_conn(s, UV_EOF, 1);
    memcpy(s->host, host, host_len);
    s->host[host_len] = 0;
    s->res.port = (uint16_t)(is_unix ? 0 : port);

    char key[MS_HOST_MAX + 8];
    const char *k = key;
    size_t klen;
    if (o && o->pool) {
        k = o->pool;
        klen = o->pool_len;
    } else if (is_unix) {
        memcpy(key, host, host_len);
        klen = host_len;
    } else {
        /* "host:port", written by hand: snprintf cost 1,500 instructions, a third of a
         * pooled connect. */
        memcpy(key, host, host_len);
        klen = host_len;
        key[klen++] = ':';
        char digits[5];
        int nd = 0;
        for (int v = port; v > 0; v /= 10)
            digits[nd++] = (char)('0' + v % 10);
        while (nd > 0)
            key[klen++] = digits[--nd];
    }
    ms_spool_t *p = s->pool = pool_get(s->sk, k, klen, o);
    rbuf_release(s);

    ms_sconn_t *c = o && o->fresh ? NULL : pool_take(p);
    if (c != NULL) {
        attach(s, c);
        return MS_SOCK_DONE;
    }
    if (p->backlog > 0 && p->active >= p->size) {
        if (p->nwait >= p->backlog)
            return MS_SOCK_EBACKLOG;
        s->state = ST_WAITING;
        s->wait_fresh = o && o->fresh;
        if (p->wait_tail)
            p->wait_tail->wait_next = s;
        else
            p->wait_head = s;
        p->wait_tail = s;
        p->nwait++;
        s->connect_cb = cb;
        if (s->connect_ms)
            ms_timer_start(s->server, &s->ctimer, s->connect_ms, on_connect_timeout);
        return MS_SOCK_PENDING;
    }
    int rc = connect_begin(s);
    if (rc < 0) {
        sock_close_conn(s, rc, 0);
        return rc;
    }
    s->connect_cb = cb;
    if (s->connect_ms)
        ms_timer_start(s->server, &s->ctimer, s->connect_ms, on_connect_timeout);
    return MS_SOCK_PENDING;
}

/* -- Keepalive --------------------------------------------------------------------------- */

int ms_sock_setkeepalive(ms_sock_t *s, int64_t idle_ms, uint32_t pool_size)
{
    if (s->state != ST_CONNECTED)
        return UV_ENOTCONN;
    if (s->read_cb)
        return MS_SOCK_EBUSY_READ;
    if (s->write_cb)
        return MS_SOCK_EBUSY_WRITE;
    if (s->hs)
        return MS_SOCK_EBUSY_CONNECT;
    if (s->c->tls)
        tls_decrypt(s); /* ciphertext still waiting may hold bytes unread */
    if (s->rlen > s->rpos)
        return MS_SOCK_EUNREAD;
    if (s->rerr) { /* the peer closed it (or it failed) while nobody read */
        sock_close_conn(s, s->rerr, 0);
        return MS_SOCK_DONE;
    }
    ms_sconn_t *c = s->c;
    if (c->tls)
        ms__stls_idle(c->tls);
    ms_spool_t *p = c->pool;
    if (pool_size > 0 && !p->size_set) {
        p->size = pool_size;
        p->size_set = 1;
    }
    if (s->read_off) /* the idle connection must read, to see its peer close */
        uv_read_start(&c->u.st, on_alloc, on_read);
    rbuf_release(s);
    s->c = NULL;
    c->sock = NULL;
    s->state = ST_CLOSED;
    s->v.connected = 0;
    s->v.data = NULL;
    s->v.len = 0;
    pool_put(p, c, idle_ms < 0 ? s->sk->cfg.keepalive_timeout : (uint64_t)idle_ms);
    return MS_SOCK_DONE;
}

/* -- Sending ----------------------------------------------------------------------------- */

static void on_send_timeout(ms_timer_t *t)
{
    ms_sock_t *s = container_of(t, ms_sock_t, wtimer);
    ms_server_t *srv = s->server;
    ms__server_enter(srv);
    sock_fail(s, UV_ETIMEDOUT); /* a write cannot be taken back: the socket closes */
    ms__server_leave(srv);
}

static void on_write(uv_write_t *req, int status)
{
    ms_sconn_t *c = req->data;
    ms_sock_t *s = c->sock;
    if (s == NULL || s->write_cb == NULL) /* closed under it */
        return;
    ms_server_t *srv = s->server;
    ms__server_enter(srv);
    if (status < 0) {
        sock_fail(s, status);
    } else {
        ms_sock_cb cb = s->write_cb;
        s->write_cb = NULL;
        ms_timer_stop(s->server, &s->wtimer);
        cb(s, MS_SOCK_DONE);
    }
    ms__server_leave(srv);
}

static int tls_send(ms_sock_t *s, const uv_buf_t *bufs, unsigned n, ms_sock_cb cb);

int ms_sock_send(ms_sock_t *s, const uv_buf_t *bufs, unsigned n, ms_sock_cb cb)
{
    if (s->state != ST_CONNECTED)
        return UV_ENOTCONN;
    if (s->write_cb)
        return MS_SOCK_EBUSY_WRITE;
    if (s->hs)
        return MS_SOCK_EBUSY_CONNECT;
    size_t total = 0;
    for (unsigned i = 0; i < n; i++)
        total += bufs[i].len;
    if (total == 0)
        return MS_SOCK_DONE;
    ms_sconn_t *c = s->c;
    if (c->tls)
        return tls_send(s, bufs, n, cb);
    int w = uv_try_write(&c->u.st, bufs, n);
    if (w == UV_EAGAIN || w == UV_ENOSYS)
        w = 0;
    if (w < 0) {
        sock_fail(s, w);
        return w;
    }
    if ((size_t)w == total)
        return MS_SOCK_DONE;
    /* The rest goes in the background. libuv copies the array, not the bytes. */
    unsigned i = 0;
    size_t skip = (size_t)w;
    while (skip >= bufs[i].len) {
        skip -= bufs[i].len;
        i++;
    }
    unsigned m = n - i;
    uv_buf_t stack[MS_SOCK_IOV_STACK], *rest = stack;
    if (m > MS_SOCK_IOV_STACK) {
        if (m > s->iov_cap) {
            s->iov = ms_mem_realloc(s->iov, m * sizeof(*s->iov));
            s->iov_cap = m;
        }
        rest = s->iov;
    }
    memcpy(rest, bufs + i, m * sizeof(*rest));
    rest[0].base += skip;
    rest[0].len -= skip;
    c->wreq.data = c;
    int rc = uv_write(&c->wreq, &c->u.st, rest, m, on_write);
    if (rc < 0) {
        sock_fail(s, rc);
        return rc;
    }
    s->write_cb = cb;
    if (s->send_ms)
        ms_timer_start(s->server, &s->wtimer, s->send_ms, on_send_timeout);
    return MS_SOCK_PENDING;
}

/* -- Receiving --------------------------------------------------------------------------- */

static int read_begin(ms_sock_t *s, ms_sock_cb cb)
{
    if (s->c->tls)
        tls_decrypt(s); /* what waited in ciphertext while the buffer was full */
    int rc = read_match(s);
    if (rc != 0)
        return rc;
    if (s->rerr) {
        int err = s->rerr;
        read_partial(s);
        sock_close_conn(s, err, 1);
        return err;
    }
    if (s->rkind == MS_SOCK_BYTES)
        rbuf_reserve(s, s->rn - (s->rlen - s->rpos));
    if (s->read_off) {
        s->read_off = 0;
        uv_read_start(&s->c->u.st, on_alloc, on_read);
    }
    s->read_cb = cb;
    if (s->read_ms)
        ms_timer_start(s->server, &s->rtimer, s->read_ms, on_read_timeout);
    return MS_SOCK_PENDING;
}

static int read_check(ms_sock_t *s)
{
    if (s->read_cb)
        return MS_SOCK_EBUSY_READ;
    if (s->state != ST_CONNECTED)
        return UV_ENOTCONN;
    if (s->hs)
        return MS_SOCK_EBUSY_CONNECT;
    if (s->rbuf == NULL)
        rbuf_take(s);
    else
        rbuf_compact(s);
    s->v.data = NULL;
    s->v.len = 0;
    return 0;
}

int ms_sock_receive(ms_sock_t *s, int pattern, size_t n, ms_sock_cb cb)
{
    int rc = read_check(s);
    if (rc < 0)
        return rc;
    s->rkind = pattern;
    s->rn = n;
    return read_begin(s, cb);
}

int ms_sock_receiveuntil(ms_sock_t *s, ms_sock_until_t *u, size_t size, ms_sock_cb cb)
{
    if (s->read_cb)
        return MS_SOCK_EBUSY_READ;
    if (ms_match_take_end(u->m)) {
        s->v.data = NULL;
        s->v.len = 0;
        return MS_SOCK_END;
    }
    int rc = read_check(s);
    if (rc < 0)
        return rc;
    s->rkind = -1;
    s->rn = size;
    s->until = u;
    return read_begin(s, cb);
}

ms_sock_until_t *ms_sock_until_new(const char *pat, size_t len, int inclusive)
{
    _Static_assert(sizeof(ms_sock_until_t) % sizeof(void *) == 0, "the matcher is aligned");
    ms_sock_until_t *u = ms_mem_alloc(sizeof(*u) + ms_match_size(len));
    u->sock = NULL;
    u->gen = 0;
    u->m = ms_match_init(u + 1, pat, len, inclusive);
    return u;
}

void ms_sock_until_free(ms_sock_until_t *u)
{
    ms_mem_free(u);
}

/* -- TLS --------------------------------------------------------------------------------
 * The TLS state (tls_client.c) sits between the connection's handle and the socket's buffer:
 * ciphertext read goes into it and comes out as plaintext in rbuf; a send is encrypted at
 * once, so its bytes need not outlive the call, and the ciphertext goes out as plain sends do:
 * uv_try_write, and the rest in the background from `sending`. */

/* Sends what OpenSSL wrote, unless a background write is under way (it sends the rest when
 * it is done). Returns 0 or an error. */
static void on_tls_write(uv_write_t *req, int status);

static int tls_flush(ms_sconn_t *c)
{
    if (c->wflight)
        return 0;
    ms_buf_t *o = ms__stls_out(c->tls);
    if (o->len == 0)
        return 0;
    uv_buf_t b = uv_buf_init(o->base, (unsigned)o->len);
    int w = uv_try_write(&c->u.st, &b, 1);
    if (w == UV_EAGAIN || w == UV_ENOSYS)
        w = 0;
    if (w < 0)
        return w;
    if ((size_t)w == o->len) {
        o->len = 0;
        return 0;
    }
    /* The rest is written from `sending`, so OpenSSL may write more into `out` meanwhile. */
    ms_buf_t spare = c->sending;
    c->sending = *o;
    spare.len = 0;
    *o = spare;
    b = uv_buf_init(c->sending.base + w, (unsigned)(c->sending.len - (size_t)w));
    c->wreq.data = c;
    int rc = uv_write(&c->wreq, &c->u.st, &b, 1, on_tls_write);
    if (rc < 0)
        return rc;
    c->wflight = 1;
    return 0;
}

static void on_tls_write(uv_write_t *req, int status)
{
    ms_sconn_t *c = req->data;
    c->wflight = 0;
    c->sending.len = 0;
    if (status == UV_ECANCELED) /* closing */
        return;
    ms_sock_t *s = c->sock;
    ms_server_t *srv = c->sk->server;
    ms__server_enter(srv);
    int rc = status < 0 ? status : tls_flush(c);
    if (rc < 0) {
        if (s)
            sock_fail(s, rc);
        else if (c->idling)
            sconn_drop(c);
    } else if (!c->wflight && s && s->write_cb) {
        ms_sock_cb cb = s->write_cb;
        s->write_cb = NULL;
        ms_timer_stop(s->server, &s->wtimer);
        cb(s, MS_SOCK_DONE);
    }
    ms__server_leave(srv);
}

static int tls_send(ms_sock_t *s, const uv_buf_t *bufs, unsigned n, ms_sock_cb cb)
{
    ms_sconn_t *c = s->c;
    int rc = 0;
    for (unsigned i = 0; i < n && rc == 0; i++)
        rc = ms__stls_write(c->tls, bufs[i].base, bufs[i].len);
    if (rc == 0)
        rc = tls_flush(c);
    if (rc < 0) {
        sock_fail(s, rc);
        return rc;
    }
    if (!c->wflight)
        return MS_SOCK_DONE;
    s->write_cb = cb;
    if (s->send_ms)
        ms_timer_start(s->server, &s->wtimer, s->send_ms, on_send_timeout);
    return MS_SOCK_PENDING;
}

/* Plaintext into rbuf, as far as it has room (grown only for a reader that needs more). An
 * end or error of the TLS layer becomes the read side's end. */
static void tls_decrypt(ms_sock_t *s)
{
    ms_stls_t *t = s->c->tls;
    for (;;) {
        if (s->rbuf == NULL)
            rbuf_take(s);
        if (s->rlen == s->rcap) {
            if (s->read_cb == NULL)
                break; /* the view may point into the buffer: it stays where it is */
            if (s->rpos > 0)
                rbuf_compact(s);
            else
                rbuf_reserve(s, s->rcap);
        }
        ssize_t n = ms__stls_read(t, s->rbuf + s->rlen, s->rcap - s->rlen);
        if (n > 0) {
            s->rlen += (size_t)n;
            continue;
        }
        if (n < 0 && s->rerr == 0)
            s->rerr = (int)n;
        break;
    }
    int rc = tls_flush(s->c); /* a reply OpenSSL owed (a key update) */
    if (rc < 0 && s->rerr == 0)
        s->rerr = rc;
}

static int handshake_step(ms_sock_t *s, int from_loop);

static void tls_read_done(ms_sconn_t *c, ms_sock_t *s, size_t n)
{
    ms__stls_in_added(c->tls, n);
    if (s == NULL) {
        /* Idle in the pool: a ticket or a key update is TLS's own business; data or the end
         * drops the connection, as on a plain one. */
        ssize_t k = ms__stls_read(c->tls, c->sk->scratch, sizeof(c->sk->scratch));
        if (k != 0 || tls_flush(c) < 0)
            on_idle_read(c);
        else
            ms__stls_idle(c->tls);
        return;
    }
    if (s->hs) {
        handshake_step(s, 1);
        return;
    }
    tls_decrypt(s);
    read_progress(s);
}

static void handshake_end(ms_sock_t *s, int rc, int from_loop)
{
    ms_sock_cb cb = s->connect_cb;
    s->connect_cb = NULL;
    s->hs = 0;
    ms_timer_stop(s->server, &s->ctimer);
    if (rc < 0) {
        s->verr = rc == MS_SOCK_EVERIFY ? ms__stls_verr(s->c->tls) : 0;
        sock_close_conn(s, rc, 0);
    }
    if (from_loop && cb)
        cb(s, rc);
}

/* One step of the handshake: when called from the loop, its end calls back. Returns
 * MS_SOCK_PENDING, MS_SOCK_DONE or the error it ended with. */
static int handshake_step(ms_sock_t *s, int from_loop)
{
    ms_sconn_t *c = s->c;
    int rc = ms__stls_handshake(c->tls);
    int wrc = tls_flush(c);
    if (wrc < 0 && rc >= 0)
        rc = MS_SOCK_ESSL;
    if (rc != MS_SOCK_PENDING)
        handshake_end(s, rc, from_loop);
    return rc;
}

int ms_sock_sslhandshake(ms_sock_t *s, const ms_sock_tls_opts_t *o, ms_sock_cb cb)
{
    if (s->state != ST_CONNECTED)
        return UV_ENOTCONN;
    if (s->hs)
        return MS_SOCK_EBUSY_CONNECT;
    if (s->read_cb)
        return MS_SOCK_EBUSY_READ;
    if (s->write_cb)
        return MS_SOCK_EBUSY_WRITE;
    ms_sconn_t *c = s->c;
    if (c->tls) {
        /* From the pool, its handshake done: OpenResty returns success whatever this
         * handshake asks, so a connection set up with verify off (or for another name, or
         * with another client certificate) would pass for a verified one. Only the same
         * wishes get it; else it goes, and the caller connects anew. */
        if (!ms__stls_done(c->tls))
            return MS_SOCK_ESSL;
        if (ms__stls_same(c->tls, s->sk, o, s->cert))
            return MS_SOCK_DONE;
        sock_close_conn(s, MS_SOCK_ETLSPOOL, 0);
        return MS_SOCK_ETLSPOOL;
    }
    if (s->rlen > s->rpos)
        return MS_SOCK_EUNREAD;
    int err = 0;
    c->tls = ms__stls_new(s->sk, o, s->cert, &err);
    if (c->tls == NULL)
        return err;
    s->verr = 0;
    s->hs = 1;
    s->connect_cb = cb;
    int rc = handshake_step(s, 0);
    if (rc == MS_SOCK_PENDING && s->connect_ms)
        ms_timer_start(s->server, &s->ctimer, s->connect_ms, on_connect_timeout);
    return rc; /* done or failed at once: the callback is not called */
}

ms_tls_session_t *ms_sock_tls_session(ms_sock_t *s)
{
    if (s->state != ST_CONNECTED || s->c->tls == NULL)
        return NULL;
    return ms__stls_session(s->c->tls);
}

int ms_sock_tls_info(ms_sock_t *s, const char **version, const char **cipher)
{
    if (s->state != ST_CONNECTED || s->c->tls == NULL || !ms__stls_done(s->c->tls))
        return UV_ENOTCONN;
    return ms__stls_info(s->c->tls, version, cipher);
}

int ms_sock_setclientcert(ms_sock_t *s, const char *cert, size_t cert_len, const char *key,
                          size_t key_len, char *err, size_t errlen)
{
    ms_stls_cert_t *n = NULL;
    if (cert != NULL) {
        n = ms__stls_cert_new(cert, cert_len, key, key_len, err, errlen);
        if (n == NULL)
            return UV_EINVAL;
    }
    ms__stls_cert_free(s->cert);
    s->cert = n;
    return 0;
}

/* -- The worker's, at the end ------------------------------------------------------------ */

void ms__sockets_free(ms_server_t *srv)
{
    ms_sockets_t *sk = srv->sockets;
    if (sk == NULL)
        return;
    assert(sk->socks == 0); /* every socket is freed first */
    for (int i = 0; i < MS_SOCK_POOL_BUCKETS; i++) {
        for (ms_spool_t *p = sk->pools[i], *next; p != NULL; p = next) {
            next = p->hnext;
            while (p->newest != NULL)
                sconn_drop(p->newest);
            ms_mem_free(p);
        }
    }
    ms__resolver_free(sk);
    ms__stls_ctx_free(sk);
    ms__recycle_drain(&sk->sock_free, sock_destroy);
    ms__recycle_drain(&sk->buf_free, ms_mem_free);
    srv->sockets = NULL;
    ms_mem_free(sk);
}

const ms_part_t ms__sockets_part = {.name = "client sockets", .worker_free = ms__sockets_free};
