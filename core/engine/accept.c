/* accept.c: the accept stage, what a new connection speaks. A PROXY header comes first on a
 * listener that asks for one, then (with TLS) the handshake and ALPN; then the protocol is
 * chosen: HTTP/2 for a client with prior knowledge (it starts with the connection preface),
 * else HTTP/1.1. An HTTP/1.1 request may switch its connection to another protocol later
 * (Upgrade: h2c). It chooses among the protocols of the table of parts (core/parts.c), where
 * a protocol is added. */
#include "engine/engine.h"

#define HTTP1 ms__protos[0]
#define HTTP2 ms__protos[1]

/* Until it has chosen, the stage is the connection's protocol. Its state, made only when it
 * must wait for more bytes (a PROXY header or a preface split across reads), is what it
 * keeps of them. */
static ms_buf_t *held_of(ms_conn_t *c)
{
    return c->pstate;
}

static void held_free(ms_server_t *s, void *pstate)
{
    ms_buf_t *b = pstate;
    (void)s;
    ms_mem_free(b->base);
    ms_mem_free(b);
}

/* Keeps the bytes from `p` to `end` for the next read, in a buffer of the stage's own. */
static void keep(ms_conn_t *c, const char *p, const char *end)
{
    ms_buf_t *b = held_of(c);
    if (b == NULL) {
        b = ms_mem_alloc(sizeof(*b));
        memset(b, 0, sizeof(*b));
        c->pstate = b;
    }
    if (p != b->base) {
        b->len = 0;
        ms__buf_append(b, p, (size_t)(end - p));
    } else {
        b->len = (size_t)(end - p);
    }
}

static void accept_read_buf(ms_conn_t *c, uv_buf_t *buf)
{
    ms_buf_t *b = held_of(c);
    if (b == NULL)
        return;
    if (b->cap - b->len < MS_CONN_BUF_MIN) {
        b->cap = b->len + MS_CONN_BUF_MIN;
        b->base = ms_mem_realloc(b->base, b->cap);
    }
    buf->base = b->base + b->len;
    buf->len = b->cap - b->len;
}

/* Reads the PROXY header a proxy-protocol listener's connection starts with. Returns how far
 * it got: `p` when more bytes are needed, NULL when the connection is done for. */
static MS_NOINLINE const char *read_proxy_header(ms_conn_t *c, const char *p, const char *end)
{
    ms_server_t *s = c->server;
    uint8_t src[16];
    int known;
    ssize_t n = ms__proxy_parse(p, (size_t)(end - p), src, &known);
    if (n == 0)
        return p;
    if (n < 0) {
        char peer[64];
        ms_conn_peer(c, peer, sizeof(peer));
        ms_log(MS_LOG_INFO, "%s: closed: no valid PROXY protocol header", peer);
        s->stats->bad_requests++;
        ms__conn_close(c, 0);
        return NULL;
    }
    c->flags &= ~MS_CONN_PROXY;
    if (known) {
        memcpy(c->source, src, 16);
        c->source_known = 1;
    }
    /* The client behind the proxy is the source the per-source cap counts. */
    if (c->source_known && !ms__trusted(s, c->source) && ms__source_add(s, c) < 0) {
        s->stats->refused_conns++;
        ms__log_refusals(s);
        ms__conn_close(c, 0);
        return NULL;
    }
    return p + n;
}

/* The connection speaks `to` from now on, starting with the bytes from `p` to `end`. It may
 * be gone when this returns (a transport that closes at once, as the memory one does). */
static void choose(ms_conn_t *c, const ms_proto_t *to, const char *p, const char *end)
{
    ms_buf_t *held = held_of(c);
    ms_server_t *s = c->server;
    ms__metrics_proto(c, to);
    c->proto = to;
    c->pstate = NULL;
    if (p < end)
        to->feed(c, p, (size_t)(end - p)); /* (it copies what it keeps: `held` goes next) */
    else
        ms__conn_rearm(c);
    if (held != NULL)
        held_free(s, held);
}

static void accept_feed(ms_conn_t *c, const char *data, size_t len)
{
    ms_buf_t *held = held_of(c);
    if (held != NULL && held->len > 0) {
        /* Bytes were kept: new bytes go after them, read in place or copied. */
        if (data == held->base + held->len)
            held->len += len;
        else
            ms__buf_append(held, data, len);
        data = held->base;
        len = held->len;
    }
    /* (Nothing here touches the connection after a call that may close it.) */
    const char *p = data, *end = data + len;
    if (MS_UNLIKELY(c->flags & MS_CONN_PROXY)) {
        const char *q = read_proxy_header(c, p, end);
        if (q == NULL)
            return;
        if (q == p) {
            keep(c, p, end);
            return;
        }
        p = q;
    }
    if (p == end) {
        if (held != NULL)
            held->len = 0;
        return;
    }
    const char *alpn = c->io->alpn != NULL ? c->io->alpn(c) : NULL;
    if (alpn != NULL) {
        /* The transport agreed on the protocol (TLS ALPN): no preface to sniff. */
        choose(c, strcmp(alpn, "h2") == 0 ? HTTP2 : HTTP1, p, end);
        return;
    }
    size_t n = (size_t)(end - p);
    if (MS_UNLIKELY(*p == 'P') &&
        memcmp(p, MS_H2_PREFACE, n < MS_H2_PREFACE_LEN ? n : MS_H2_PREFACE_LEN) == 0) {
        /* HTTP/2 with prior knowledge: the connection preface instead of a request. */
        if (n < MS_H2_PREFACE_LEN)
            keep(c, p, end);
        else
            choose(c, HTTP2, p, end);
        return;
    }
    choose(c, HTTP1, p, end);
}

static void accept_eof(ms_conn_t *c)
{
    ms__conn_close(c, 0);
}

static void accept_write(ms_conn_t *c)
{
    ms__conn_flush(c);
}

/* Nothing has come yet (the first bytes' deadline is head_timeout, from the accept), or a
 * stopping server gives it the short grace a waiting keep-alive connection gets. */
static void accept_rearm(ms_conn_t *c)
{
    if (c->server->stopping)
        ms__conn_arm_idle(c);
    else if (c->phase != MS_PHASE_HEAD)
        ms__conn_arm(c, MS_PHASE_HEAD, c->server->limits.head_timeout_ms);
}

static void accept_timeout(ms_conn_t *c, int phase)
{
    ms_buf_t *held = held_of(c);
    if (held != NULL && held->len > 0 && !(c->flags & MS_CONN_PROXY)) {
        /* The start of a preface, or of a request that starts like one ("P" of a POST): a
         * request head that came too slowly, as HTTP/1.1 answers it (408). */
        ms__conn_hold(c);
        choose(c, HTTP1, held->base, held->base + held->len);
        if (!(c->flags & MS_CONN_CLOSED))
            c->proto->timeout(c, phase);
        ms__conn_release(c);
        return;
    }
    char peer[64];
    ms_conn_peer(c, peer, sizeof(peer));
    ms_log(MS_LOG_INFO, "%s: closed: %s within head_timeout", peer,
           c->flags & MS_CONN_PROXY ? "no whole PROXY protocol header" : "no request");
    ms__conn_close(c, 0);
}

static void accept_nothing(ms_conn_t *c)
{
    (void)c;
}

static const ms_proto_t accept_proto = {
    .name = "accept",
    .read_buf = accept_read_buf,
    .feed = accept_feed,
    .eof = accept_eof,
    .write = accept_write,
    .rearm = accept_rearm,
    .timeout = accept_timeout,
    .drain_check = accept_nothing,
    .resume = accept_nothing,
    .stop = ms__conn_rearm,
    .abort = accept_nothing,
    .free = held_free,
};

void ms__conn_accept(ms_conn_t *c)
{
    c->proto = &accept_proto;
    c->pstate = NULL;
}

const ms_proto_t *ms__upgrade_proto(ms_req_t *r)
{
    for (const ms_proto_t *const *p = ms__protos; *p != NULL; p++)
        if ((*p)->upgrade_ok != NULL && (*p)->upgrade_ok(r))
            return *p;
    return NULL;
}

void ms__conn_switch(ms_conn_t *c, const ms_proto_t *to, ms_req_t *r, const char *rest,
                     size_t restlen)
{
    const ms_proto_t *from = c->proto;
    void *state = c->pstate;
    ms__metrics_proto(c, to);
    c->proto = to;
    c->pstate = NULL;
    to->upgrade(c, r, rest, restlen); /* `r` and `rest` live in `state` until it is freed */
    if (state != NULL)
        from->free(c->server, state);
}

void ms__protos_init(ms_server_t *s)
{
    for (const ms_proto_t *const *p = ms__protos; *p != NULL; p++)
        (*p)->worker_init(s);
}

void ms__protos_free(ms_server_t *s)
{
    for (const ms_proto_t *const *p = ms__protos; *p != NULL; p++)
        (*p)->worker_free(s);
}
