/* h1.c: HTTP/1.x: bytes into requests (llhttp, in place) and replies into bytes. */
#include "moonserve.h"

#include <stdio.h>

#include "internal.h"

/* -- Head validation ---------------------------------------------------------------------
 * llhttp 8.1 predates the fixes for a header ended by a bare CR and for obs-fold, so every
 * head passes this scan first. It also finds the end of the head, so llhttp always sees a
 * whole head in one contiguous piece and its spans stay valid. */

/* Scans from *scan for the end of the head. Returns the head's length, 0 when more bytes
 * are needed (*scan remembers how far it got), or MS_EBADREQ with *why set. */
static ssize_t scan_head(const char *base, size_t len, size_t *scan, const char **why)
{
    const unsigned char *p = (const unsigned char *)base + *scan;
    const unsigned char *end = (const unsigned char *)base + len;
    for (;;) {
        /* Skip eight bytes at a time while none is below 0x20: the common case. */
        while (end - p >= 8) {
            uint64_t x;
            memcpy(&x, p, 8);
            if ((x - 0x2020202020202020ull) & ~x & 0x8080808080808080ull)
                break;
            p += 8;
        }
        while (p < end && *p >= 0x20)
            p++;
        if (p == end)
            break;
        if (*p == '\t') {
            p++;
            continue;
        }
        if (*p != '\r') {
            *why = *p == '\n' ? "LF without CR"
                   : *p == 0  ? "NUL in head"
                              : "control character in head";
            return MS_EBADREQ;
        }
        if (end - p < 3)
            break; /* CR LF and the next line's first byte decide */
        if (p[1] != '\n') {
            *why = "CR without LF";
            return MS_EBADREQ;
        }
        p += 2;
        if (*p == '\r') {
            if (end - p < 2) {
                p -= 2; /* the head may end here: decide when the next byte comes */
                break;
            }
            if (p[1] != '\n') {
                *why = "CR without LF";
                return MS_EBADREQ;
            }
            return (ssize_t)((const char *)p + 2 - base);
        }
        if (*p == ' ' || *p == '\t') {
            *why = "obs-fold or whitespace before a field";
            return MS_EBADREQ;
        }
        if (*p == ':') {
            /* A field name is a token (RFC 9110 5.1): never empty, so ':authority' is not a
             * field either; llhttp would take the line for a value with no name. */
            *why = "empty header field name";
            return MS_EBADREQ;
        }
    }
    *scan = (size_t)((const char *)p - base);
    return 0;
}

/* -- llhttp callbacks -------------------------------------------------------------------- */

static inline void span(ms_str_t *s, const char *at, size_t n)
{
    if (s->len == 0)
        s->base = at;
    s->len += n; /* llhttp may split a span; the head is contiguous, so it just grows */
}

static int refuse_cb(llhttp_t *p, int status, const char *why)
{
    ms_h1_t *h = p->data;
    h->status = status;
    h->why = why;
    llhttp_set_error_reason(p, why);
    return HPE_USER;
}

static int on_method(llhttp_t *p, const char *at, size_t n)
{
    span(&((ms_h1_t *)p->data)->req.v.method, at, n);
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t n)
{
    span(&((ms_h1_t *)p->data)->req.v.target, at, n);
    return 0;
}

static MS_NOINLINE int headers_grow(ms_h1_t *h)
{
    ms_req_t *r = &h->req;
    int cap = r->headers_cap * 2;
    ms_header_t *a = ms_pool_alloc(&r->pool, (size_t)cap * sizeof(*a));
    memcpy(a, r->headers, (size_t)r->v.nheaders * sizeof(*a));
    r->headers = a;
    r->headers_cap = cap;
    return 0;
}

/* Trailer fields come among the body bytes, split wherever the reads split them: each is
 * gathered in the connection's own buffer and copied into the request's pool when whole. They
 * are held to the limits of header fields. */
static MS_NOINLINE int trailer_bytes(llhttp_t *p, const char *at, size_t n, int name)
{
    ms_h1_t *h = p->data;
    ms_req_t *r = &h->req;
    if (name && !h->field_open) {
        if ((uint32_t)r->ntrailers >= h->conn_limits->header_count)
            return refuse_cb(p, 431, "too many trailer fields");
        h->trailer.len = 0;
        h->field_open = 1;
    }
    if (!h->field_open)
        return refuse_cb(p, 400, "empty header field name");
    h->trailer_bytes += n;
    if (h->trailer_bytes > h->conn_limits->head_bytes)
        return refuse_cb(p, 431, "trailer fields larger than head_bytes");
    ms__buf_append(&h->trailer, at, n);
    if (name)
        h->trailer_name = h->trailer.len;
    return 0;
}

static MS_NOINLINE int trailer_done(llhttp_t *p)
{
    ms_h1_t *h = p->data;
    const char *t = h->trailer.base;
    size_t nlen = h->trailer_name, vlen = h->trailer.len - nlen;
    if (nlen == 0)
        return refuse_cb(p, 400, "empty header field name");
    for (size_t i = 0; i < nlen; i++)
        if (!ms__tchar[(unsigned char)t[i]])
            return refuse_cb(p, 400, "invalid trailer field name");
    for (size_t i = nlen; i < nlen + vlen; i++) {
        unsigned char ch = (unsigned char)t[i];
        if ((ch < 0x20 && ch != '\t') || ch == 0x7f)
            return refuse_cb(p, 400, "control character in a trailer field");
    }
    ms__req_add_trailer(&h->req, t, nlen, t + nlen, vlen);
    h->field_open = 0;
    return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t n)
{
    ms_h1_t *h = p->data;
    ms_req_t *r = &h->req;
    if (MS_UNLIKELY(h->head_done))
        return trailer_bytes(p, at, n, 1);
    if (!h->field_open) {
        if (MS_UNLIKELY((uint32_t)r->v.nheaders >= h->conn_limits->header_count))
            return refuse_cb(p, 431, "too many header fields");
        if (MS_UNLIKELY(r->v.nheaders == r->headers_cap))
            headers_grow(h);
        ms_header_t *f = &r->headers[r->v.nheaders++];
        f->name.base = at;
        f->name.len = 0;
        f->value.base = "";
        f->value.len = 0;
        h->field_open = 1;
    }
    span(&r->headers[r->v.nheaders - 1].name, at, n);
    return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t n)
{
    ms_h1_t *h = p->data;
    ms_req_t *r = &h->req;
    if (MS_UNLIKELY(h->head_done))
        return trailer_bytes(p, at, n, 0);
    /* A value with no name before it: scan_head refuses the lines that make one, and this
     * keeps headers[-1] out of reach should llhttp find another. */
    if (MS_UNLIKELY(!h->field_open))
        return refuse_cb(p, 400, "empty header field name");
    span(&r->headers[r->v.nheaders - 1].value, at, n);
    return 0;
}

static int on_header_value_complete(llhttp_t *p)
{
    ms_h1_t *h = p->data;
    if (MS_UNLIKELY(h->head_done))
        return trailer_done(p);
    h->field_open = 0;
    return 0;
}

static int valid_host(const ms_str_t *v)
{
    for (size_t i = 0; i < v->len; i++)
        if (!ms__hostchar[(unsigned char)v->base[i]])
            return 0;
    return 1;
}

/* Splits the target into path and query; an absolute-form target loses its scheme and
 * authority (RFC 9112 3.2.2). */
static void split_target(ms_req_t *r)
{
    const char *t = r->v.target.base, *end = t + r->v.target.len;
    if (*t != '/' && *t != '*') {
        const char *a = memchr(t, ':', (size_t)(end - t));
        if (a != NULL && end - a > 3 && a[1] == '/' && a[2] == '/') {
            const char *slash = memchr(a + 3, '/', (size_t)(end - a - 3));
            const char *q = memchr(a + 3, '?', (size_t)(end - a - 3));
            t = slash != NULL && (q == NULL || slash < q) ? slash : q != NULL ? q : end;
        }
    }
    const char *q = memchr(t, '?', (size_t)(end - t));
    if (t == end || *t == '?') {
        r->v.path.base = "/";
        r->v.path.len = 1;
    } else {
        r->v.path.base = t;
        r->v.path.len = (size_t)((q ? q : end) - t);
    }
    if (q != NULL) {
        r->v.query.base = q + 1;
        r->v.query.len = (size_t)(end - q - 1);
    }
}

static inline uint64_t max_body(const ms_limits_t *l)
{
    return l->body_bytes_max > l->body_bytes ? l->body_bytes_max : l->body_bytes;
}

static int on_headers_complete(llhttp_t *p)
{
    ms_h1_t *h = p->data;
    ms_req_t *r = &h->req;
    h->head_done = 1;
    if (p->http_major != 1)
        return refuse_cb(p, 505, "unsupported HTTP version");
    /* One space on each side of the target: llhttp lets runs of spaces through, and
     * parsers that disagree on a request line are how requests get smuggled. */
    const char *t = r->v.target.base;
    if (t != r->v.method.base + r->v.method.len + 1 || t[r->v.target.len] != ' ' ||
        t[r->v.target.len + 1] != 'H')
        return refuse_cb(p, 400, "malformed request line");
    r->v.version = p->http_minor == 0 ? 10 : 11;
    if (p->method == HTTP_CONNECT)
        return refuse_cb(p, 405, "CONNECT is not served");
    if ((p->flags & F_TRANSFER_ENCODING) && (p->flags & F_CONTENT_LENGTH))
        /* RFC 9112 6.3: both together are a smuggling vector; refuse and close. */
        return refuse_cb(p, 400, "both Transfer-Encoding and Content-Length");
    int hosts = 0, expect = 0;
    for (int i = 0; i < r->v.nheaders; i++) {
        const ms_header_t *f = &r->headers[i];
        if (f->name.len == 4 && ms__ieq(f->name.base, "host", 4)) {
            if (hosts++ > 0 || !valid_host(&f->value))
                return refuse_cb(p, 400, hosts > 1 ? "more than one Host" : "invalid Host");
        } else if (f->name.len == 6 && ms__ieq(f->name.base, "expect", 6)) {
            if (f->value.len == 12 && ms__ieq(f->value.base, "100-continue", 12))
                expect = 1;
            else
                return refuse_cb(p, 417, "unknown expectation");
        }
    }
    if (r->v.version == 11 && hosts == 0)
        return refuse_cb(p, 400, "no Host");
    if (p->flags & F_CONTENT_LENGTH) {
        /* Over what any route allows: refused before any Lua runs. Over this route's
         * limit only: refused when the handler asks for the body (before 100 Continue). */
        r->v.content_length = (int64_t)p->content_length;
        if (p->content_length > max_body(h->conn_limits))
            return refuse_cb(p, 413, "body larger than body_bytes");
    }
    if ((p->flags & F_CHUNKED) || r->v.content_length > 0) {
        r->v.flags |= MS_REQ_HAS_BODY;
        if (expect && r->v.version == 11)
            r->v.flags |= MS_REQ_EXPECT;
    }
    if (p->method == HTTP_HEAD)
        r->v.flags |= MS_REQ_IS_HEAD;
    if (r->v.version == 11 ? (p->flags & F_CONNECTION_CLOSE) != 0
                           : (p->flags & F_CONNECTION_KEEP_ALIVE) == 0)
        r->v.flags |= MS_REQ_CLOSE;
    split_target(r);
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t n)
{
    ms_h1_t *h = p->data;
    ms_req_t *r = &h->req;
    r->body_seen += n;
    /* Before dispatch the route is not known yet: hold the body to what any route allows;
     * the route's own limit applies from then on. */
    uint64_t limit = r->body_limit;
    if (!(r->v.flags & MS_REQ_IN_HANDLER) && !h->discard_body)
        limit = max_body(h->conn_limits);
    if (MS_UNLIKELY(r->body_seen > limit))
        return refuse_cb(p, 413, "body larger than body_bytes");
    /* A handler that finished without reading the body: the rest is discarded. */
    if (!h->discard_body)
        ms__buf_append(&r->body, at, n);
    return 0;
}

/* Chunk extensions are parsed and ignored, up to a bound per chunk-size line. */
static int on_chunk_extension(llhttp_t *p, const char *at, size_t n)
{
    ms_h1_t *h = p->data;
    h->chunk_ext += (uint32_t)n;
    if (MS_UNLIKELY(h->chunk_ext > MS_CHUNK_EXT_MAX))
        return refuse_cb(p, 400, "chunk extensions longer than 4 KiB");
    return 0;
}

static int on_chunk_header(llhttp_t *p)
{
    ((ms_h1_t *)p->data)->chunk_ext = 0;
    return 0;
}

static int on_message_complete(llhttp_t *p)
{
    ms_h1_t *h = p->data;
    h->msg_done = 1;
    h->req.v.flags |= MS_REQ_BODY_DONE;
    return HPE_PAUSED; /* stop here: the next request waits for this one's reply */
}

static const llhttp_settings_t h1_settings = {
    .on_method = on_method,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_header_value_complete = on_header_value_complete,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_chunk_extension_name = on_chunk_extension,
    .on_chunk_extension_value = on_chunk_extension,
    .on_chunk_header = on_chunk_header,
    .on_message_complete = on_message_complete,
};

/* -- State ------------------------------------------------------------------------------- */

static ms_h1_t *h1_get(ms_conn_t *c)
{
    ms_server_t *s = c->server;
    ms_h1_t *h = ms__recycle_get(&s->h1_free);
    if (h == NULL) {
        h = ms_mem_alloc(sizeof(*h));
        memset(h, 0, sizeof(*h));
        ms_pool_init(&h->req.pool);
        llhttp_init(&h->parser, HTTP_REQUEST, &h1_settings);
        h->parser.data = h;
        ms__req_init(&h->req);
    }
    h->conn_limits = &s->limits;
    h->req.conn = c;
    c->h1 = h;
    return h;
}

void ms__h1_destroy(void *p)
{
    ms_h1_t *h = p;
    ms_pool_free(&h->req.pool);
    ms_mem_free(h->req.body.base);
    ms_mem_free(h->in.base);
    ms_mem_free(h->trailer.base);
    ms_mem_free(h);
}

void ms__h1_free(ms_server_t *s, ms_h1_t *h)
{
    ms__req_reset(&h->req);
    llhttp_reset(&h->parser);
    h->state = MS_H1_HEAD;
    h->msg_done = h->field_open = h->discard_body = h->head_done = h->out_paused = 0;
    h->scan = h->in.len = h->in_off = 0;
    h->trailer.len = h->trailer_name = h->trailer_bytes = 0;
    h->status = 0;
    h->why = NULL;
    /* Big buffers are not worth keeping for the next connection. */
    if (h->in.cap > 4 * MS_CONN_BUF_MIN) {
        ms_mem_free(h->in.base);
        h->in.base = NULL;
        h->in.cap = 0;
    }
    if (h->req.body.cap > MS_BODY_HIGH_WATER) {
        ms_mem_free(h->req.body.base);
        h->req.body.base = NULL;
        h->req.body.cap = 0;
    }
    if (!ms__recycle_put(&s->h1_free, h))
        ms__h1_destroy(h);
}

/* -- Refusals ---------------------------------------------------------------------------- */

/* Answers a request the core will not hand to Lua (or whose body went wrong) and closes. */
static void refuse(ms_conn_t *c, ms_h1_t *h, int status, const char *why)
{
    ms_server_t *s = c->server;
    ms_req_t *r = &h->req;
    char peer[64];
    ms_conn_peer(c, peer, sizeof(peer));
    ms_log(MS_LOG_INFO, "%s: %d %s: %s", peer, status, ms__reason(status), why ? why : "malformed");
    s->stats.bad_requests++;
    h->state = MS_H1_DEAD;
    if (c->flags & MS_CONN_CLOSED) {
        /* nothing to send */
    } else if (r->v.flags & MS_REQ_HEAD_SENT) {
        ms__conn_close(c, 0); /* part of a reply is out: closing is the only answer left */
    } else {
        r->v.flags |= MS_REQ_HEAD_SENT | MS_REQ_DONE | MS_REQ_CLOSE;
        ms_out_t *o = ms__conn_out(c);
        char *w = ms__out_reserve(o, 512);
        char body[64];
        int len = ms__refusal_body(status, body, sizeof(body));
        int n = snprintf(w, 512,
                         "HTTP/1.1 %d %s\r\nserver: moonserve\r\n%scontent-type: text/plain; "
                         "charset=utf-8\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s",
                         status, ms__reason(status), ms__date_line(s), len, body);
        ms__out_commit(s, o, (size_t)n);
        c->flags |= MS_CONN_CLOSING;
        if (!(c->flags & MS_CONN_IN_FEED))
            ms__conn_flush(c);
    }
    /* A handler reading the body learns it will not come, after the answer is decided, so
     * that its own reply cannot take the refusal's place. */
    if (r->v.flags & MS_REQ_IN_HANDLER) {
        r->v.flags |= MS_REQ_BODY_ERROR;
        if (r->v.wait == MS_WAIT_BODY)
            ms__req_wake(r, MS_WAIT_BODY);
    }
}

/* The handler asked for a body its route does not allow: 413, and a close. */
void ms__h1_refuse_body(ms_conn_t *c)
{
    refuse(c, c->h1, 413, "body larger than the route's body_bytes");
}

/* -- Replies ----------------------------------------------------------------------------- */

static char *put(char *w, const char *s, size_t n)
{
    memcpy(w, s, n);
    return w + n;
}
#define PUT(w, lit) put((w), (lit), sizeof(lit) - 1)

static char *put_u64(char *w, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (n > 0)
        *w++ = tmp[--n];
    return w;
}

/* Queues the reply head. `clen` is the body length, -1 for a body of unknown length
 * (chunked, or closing on HTTP/1.0), -2 for a status that has no body. */
int ms__h1_reply_head(ms_req_t *r, int64_t clen)
{
    ms_conn_t *c = r->conn;
    ms_server_t *s = c->server;
    /* A body the client waits to send (100-continue) and the handler never asked for is
     * not read: close after the reply instead. */
    if ((r->v.flags & (MS_REQ_EXPECT | MS_REQ_BODY_DONE)) == MS_REQ_EXPECT)
        r->v.flags |= MS_REQ_CLOSE;
    if ((c->flags & MS_CONN_CLOSING) || s->stopping)
        r->v.flags |= MS_REQ_CLOSE; /* (the last request a connection may make: dispatch) */
    if (clen == -1 && r->v.version == 10)
        r->v.flags |= MS_REQ_CLOSE;
    ms_out_t *o = ms__conn_out(c);
    const char *why = ms__reason(r->v.status);
    size_t wlen = strlen(why);
    char *w0 = ms__out_reserve(o, 192 + wlen + r->res_headers.len), *w = w0;
    w = PUT(w, "HTTP/1.1 ");
    *w++ = (char)('0' + r->v.status / 100 % 10);
    *w++ = (char)('0' + r->v.status / 10 % 10);
    *w++ = (char)('0' + r->v.status % 10);
    *w++ = ' ';
    w = put(w, why, wlen);
    w = PUT(w, "\r\nserver: moonserve\r\n");
    w = put(w, ms__date_line(s), 37);
    if (clen >= 0) {
        w = PUT(w, "content-length: ");
        w = put_u64(w, (uint64_t)clen);
        w = PUT(w, "\r\n");
    } else if (clen == -1 && r->v.version == 11) {
        w = PUT(w, "transfer-encoding: chunked\r\n");
        r->v.flags |= MS_REQ_CHUNKED_OUT;
    }
    if (r->v.flags & MS_REQ_CLOSE)
        w = PUT(w, "connection: close\r\n");
    else if (r->v.version == 10)
        w = PUT(w, "connection: keep-alive\r\n");
    if (r->res_headers.len > 0)
        w = put(w, r->res_headers.base, r->res_headers.len);
    w = PUT(w, "\r\n");
    ms__out_commit(s, o, (size_t)(w - w0));
    r->v.flags |= MS_REQ_HEAD_SENT;
    return 0;
}

/* -- Reading ----------------------------------------------------------------------------- */

/* Over the in-flight cap: 503 from the core before the head is even parsed, and a close.
 * Shedding load must cost far less than serving it: what it costs here is finding the end
 * of the head, one write and the close; the client comes back on a new connection, later. */
static void refuse_busy(ms_conn_t *c)
{
    ms_server_t *s = c->server;
    static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\nserver: moonserve\r\n"
                               "retry-after: 1\r\ncontent-type: text/plain; charset=utf-8\r\n"
                               "content-length: 24\r\nconnection: close\r\n";
    static const char body[] = "\r\n503 Service Unavailable\n"; /* ms__refusal_body's */
    ms_out_t *o = ms__conn_out(c);
    ms__out_vec(s, o, busy, sizeof(busy) - 1, MS_VEC_STATIC, -1);
    ms__out_text(s, o, ms__date_line(s), 37);
    ms__out_vec(s, o, body, sizeof(body) - 1, MS_VEC_STATIC, -1);
    c->h1->state = MS_H1_DEAD;
    c->flags |= MS_CONN_CLOSING;
}

static void dispatch(ms_conn_t *c, ms_h1_t *h)
{
    /* (the request dispatch counts is the connection's last one it may make) */
    if (c->requests + 1 >= c->server->limits.requests_per_connection)
        h->req.v.flags |= MS_REQ_CLOSE;
    ms__req_dispatch(&h->req);
}

/* Feeds body bytes to llhttp; returns how far it read. */
static const char *feed_body(ms_conn_t *c, ms_h1_t *h, const char *p, const char *end)
{
    ms_req_t *r = &h->req;
    llhttp_errno_t e = llhttp_execute(&h->parser, p, (size_t)(end - p));
    if (e == HPE_PAUSED) {
        p = llhttp_get_error_pos(&h->parser);
        h->state = MS_H1_WAIT_NEXT;
    } else if (e != HPE_OK) {
        refuse(c, h, h->status ? h->status : 400,
               h->why ? h->why : llhttp_get_error_reason(&h->parser));
        return end;
    } else {
        p = end;
    }
    if (r->v.wait == MS_WAIT_BODY && (r->body.len > 0 || h->msg_done))
        ms__req_wake(r, MS_WAIT_BODY);
    /* Backpressure: a handler that reads slowly stops the socket, not the worker's memory. */
    if (r->body.len > MS_BODY_HIGH_WATER && !(c->flags & MS_CONN_READ_OFF)) {
        c->flags |= MS_CONN_READ_OFF;
        c->io->read_stop(c);
    }
    return p;
}

/* "Upgrade: h2c" with its HTTP2-Settings, on a request without a body (RFC 7540 3.2): the
 * request becomes stream 1 of an HTTP/2 connection. */
static int upgrade_to_h2c(ms_req_t *r)
{
    const ms_str_t *up = ms_req_header(r, "upgrade", 7);
    return up != NULL && up->len == 3 && ms__ieq(up->base, "h2c", 3) &&
           ms_req_header(r, "http2-settings", 14) != NULL && r->v.content_length <= 0 &&
           !(r->v.flags & MS_REQ_HAS_BODY);
}

/* Parses a whole head with llhttp, then hands the request to the handler. Returns 0, 1 for
 * a request that upgrades to HTTP/2, or -1 when it was refused. */
static int start_request(ms_conn_t *c, ms_h1_t *h, const char *p, size_t n)
{
    ms_req_t *r = &h->req;
    r->v.id = ++c->server->next_req_id;
    r->body_limit = c->server->limits.body_bytes;
    r->head.base = p;
    r->head.len = n;
    llhttp_errno_t e = llhttp_execute(&h->parser, p, n);
    if ((e == HPE_PAUSED_UPGRADE || (e == HPE_PAUSED && h->parser.upgrade)) && c->requests == 0 &&
        upgrade_to_h2c(r)) {
        h->msg_done = 1;
        return 1;
    }
    if (e == HPE_PAUSED_UPGRADE) {
        /* No protocol we switch to: serve it as a plain request, then close, since the
         * client may start talking the other protocol. */
        r->v.flags |= MS_REQ_CLOSE | MS_REQ_BODY_DONE;
        h->msg_done = 1;
        e = HPE_PAUSED;
    }
    if (e != HPE_OK && e != HPE_PAUSED) {
        refuse(c, h, h->status ? h->status : 400,
               h->why ? h->why : llhttp_get_error_reason(&h->parser));
        return -1;
    }
    h->state = h->msg_done ? MS_H1_WAIT_NEXT : MS_H1_BODY;
    return 0;
}

/* Moves on to the next request on the connection. */
static void next_request(ms_h1_t *h)
{
    ms__req_reset(&h->req);
    llhttp_reset(&h->parser);
    h->state = MS_H1_HEAD;
    h->msg_done = h->discard_body = h->head_done = 0;
    h->scan = h->chunk_ext = 0;
    h->trailer.len = h->trailer_name = h->trailer_bytes = 0;
}

/* Reads the PROXY header a proxy-protocol listener's connection starts with. Returns how far
 * it got: `p` when more bytes are needed, `end` when the connection is done for. */
static MS_NOINLINE const char *read_proxy_header(ms_conn_t *c, const char *p, const char *end)
{
    ms_server_t *s = c->server;
    uint8_t src[16];
    int known;
    ssize_t n = ms__proxy_parse(p, (size_t)(end - p), src, &known);
    if (n == 0)
        return p;
    char peer[64];
    ms_conn_peer(c, peer, sizeof(peer));
    if (n < 0) {
        ms_log(MS_LOG_INFO, "%s: closed: no valid PROXY protocol header", peer);
        s->stats.bad_requests++;
        ms__conn_close(c, 0);
        return end;
    }
    c->flags &= ~MS_CONN_PROXY;
    if (known) {
        memcpy(c->source, src, 16);
        c->source_known = 1;
    }
    /* The client behind the proxy is the source the per-source cap counts. */
    if (c->source_known && !ms__trusted(s, c->source) && ms__source_add(s, c) < 0) {
        s->stats.refused_conns++;
        ms__log_refusals(s);
        ms__conn_close(c, 0);
        return end;
    }
    return p + n;
}

/* The state machine over the bytes at hand. Returns how far it got; the caller keeps the
 * rest for later. Requests are answered strictly in order: while a handler holds one,
 * the bytes of the next stay unparsed. */
static const char *process(ms_conn_t *c, ms_h1_t *h, const char *p, const char *end)
{
    const ms_limits_t *lim = &c->server->limits;
    while (p < end) {
        if (c->flags & MS_CONN_CLOSING)
            return end; /* closing after this reply: whatever comes next is dropped */
        if (MS_UNLIKELY(c->flags & MS_CONN_PROXY)) {
            const char *q = read_proxy_header(c, p, end);
            if (q == p || q == end)
                return q;
            p = q;
            continue;
        }
        switch (h->state) {
        case MS_H1_HEAD: {
            if (MS_UNLIKELY(h->scan == 0 && ms__conn_queued(c) > MS_OUT_HIGH_WATER)) {
                /* Pipelined requests from a client that does not read its replies: the next
                 * one waits (its bytes kept, the socket not read) until the queue drains. */
                h->out_paused = 1;
                if (!(c->flags & MS_CONN_READ_OFF)) {
                    c->flags |= MS_CONN_READ_OFF;
                    c->io->read_stop(c);
                }
                return p;
            }
            if (MS_UNLIKELY(c->requests == 0 && h->scan == 0 && *p == 'P')) {
                /* HTTP/2 with prior knowledge: the connection preface instead of a request. */
                size_t n = (size_t)(end - p);
                if (memcmp(p, MS_H2_PREFACE, n < MS_H2_PREFACE_LEN ? n : MS_H2_PREFACE_LEN) == 0) {
                    if (n < MS_H2_PREFACE_LEN)
                        return p;
                    ms__h2_start(c, p, n);
                    return end;
                }
            }
            if (h->scan == 0) {
                /* RFC 9112 2.2: ignore empty lines before a request line. */
                while (end - p >= 2 && p[0] == '\r' && p[1] == '\n')
                    p += 2;
                if (p == end || (end - p == 1 && *p == '\r'))
                    return p;
            }
            ssize_t n = scan_head(p, (size_t)(end - p), &h->scan, &h->why);
            if (n < 0) {
                refuse(c, h, 400, h->why);
                return end;
            }
            size_t have = n > 0 ? (size_t)n : (size_t)(end - p);
            if (MS_UNLIKELY(have > lim->line_bytes)) {
                /* Only a head longer than a request line may hold one that is too long. */
                const char *lf = memchr(p, '\n', have);
                if (lf == NULL ? have > lim->line_bytes : (size_t)(lf - p) > lim->line_bytes) {
                    refuse(c, h, 414, "request line larger than line_bytes");
                    return end;
                }
                if (have > lim->head_bytes) {
                    refuse(c, h, 431, "head larger than head_bytes");
                    return end;
                }
            }
            if (n == 0)
                return p;
            h->scan = 0;
            if (MS_UNLIKELY(ms__req_busy(c->server))) {
                refuse_busy(c);
                return end;
            }
            int started = start_request(c, h, p, (size_t)n);
            if (started < 0)
                return end;
            if (started == 1) {
                ms__h2_upgrade(c, &h->req, p + n, (size_t)(end - p - n));
                return end;
            }
            p += n;
            /* Body bytes already here go in first, so a small body is whole when the
             * handler starts. */
            if (h->state == MS_H1_BODY && p < end)
                p = feed_body(c, h, p, end);
            if (h->state != MS_H1_DEAD)
                dispatch(c, h);
            break;
        }
        case MS_H1_BODY: p = feed_body(c, h, p, end); break;
        case MS_H1_WAIT_NEXT:
            if (h->req.v.flags & MS_REQ_IN_HANDLER)
                return p;
            next_request(h);
            break;
        default: /* MS_H1_DEAD */ return end;
        }
    }
    if (h->state == MS_H1_WAIT_NEXT && !(h->req.v.flags & MS_REQ_IN_HANDLER))
        next_request(h);
    return p;
}

/* An idle connection gives its HTTP/1 state back and keeps only itself and its socket. */
static void maybe_idle(ms_conn_t *c)
{
    ms_h1_t *h = c->h1;
    if (h == NULL || (c->flags & MS_CONN_CLOSED))
        return;
    if (h->state == MS_H1_HEAD && h->scan == 0 && h->in.len == h->in_off &&
        !(h->req.v.flags & MS_REQ_IN_HANDLER) && c->flight == NULL) {
        c->h1 = NULL;
        ms__h1_free(c->server, h);
        ms__conn_idle(c);
    }
    ms__conn_rearm(c);
}

void ms__h1_feed(ms_conn_t *c, const char *data, size_t len)
{
    ms_h1_t *h = c->h1 != NULL ? c->h1 : h1_get(c);
    ms__conn_hold(c); /* a handler run from here may let go of the connection */
    int kept = 0;
    if (h->in.len > h->in_off) {
        /* Bytes were kept: new bytes go after them, read in place or copied. */
        if (data == h->in.base + h->in.len)
            h->in.len += len;
        else if (len > 0)
            ms__buf_append(&h->in, data, len);
        data = h->in.base + h->in_off;
        len = h->in.len - h->in_off;
        kept = 1;
    }
    c->flags |= MS_CONN_IN_FEED;
    const char *p = process(c, h, data, data + len);
    c->flags &= ~MS_CONN_IN_FEED;
    if (c->h1 == h && !(c->flags & MS_CONN_CLOSED)) {
        size_t rest = (size_t)(data + len - p);
        if (kept) {
            h->in_off = h->in.len - rest;
            if (rest == 0)
                h->in.len = h->in_off = 0;
        } else if (rest > 0) {
            /* Still needed (a partial head, or requests behind a parked one): off the
             * shared buffer and into the connection's own. */
            ms__buf_append(&h->in, p, rest);
        }
        /* Requests pile up behind a parked handler: stop reading until it is done. */
        if (h->in.len - h->in_off > c->server->limits.head_bytes &&
            (h->req.v.flags & MS_REQ_IN_HANDLER) && !(c->flags & MS_CONN_READ_OFF)) {
            c->flags |= MS_CONN_READ_OFF;
            c->io->read_stop(c);
        }
    }
    ms__conn_flush(c);
    ms__conn_drain_check(c);
    maybe_idle(c);
    ms__conn_release(c);
}

/* The handler let go of the request (ms_req_finish). */
void ms__h1_req_finished(ms_conn_t *c)
{
    ms_h1_t *h = c->h1;
    if (h->req.v.flags & MS_REQ_CLOSE)
        c->flags |= MS_CONN_CLOSING;
    if (!h->msg_done)
        h->discard_body = 1;
    if (c->flags & (MS_CONN_IN_FEED | MS_CONN_CLOSED)) {
        ms__conn_release(c); /* feed goes on from where it was, or nothing is left to do */
        return;
    }
    assert(c->refs > 1); /* the transport's reference remains: the connection is open */
    c->refs--;
    if (c->server->depth > 0) {
        /* Called from inside a handler's call into the core (LuaJIT FFI), where calling
         * back into Lua is not allowed: serve what comes next once the callback returns. */
        ms__server_defer(c->server, c);
        return;
    }
    ms__h1_continue(c);
}

/* Serves whatever came in behind a finished request. */
void ms__h1_continue(ms_conn_t *c)
{
    ms_h1_t *h = c->h1;
    if (h == NULL || (c->flags & MS_CONN_CLOSED))
        return;
    if (c->flags & MS_CONN_READ_OFF) {
        c->flags &= ~MS_CONN_READ_OFF;
        c->io->read_start(c);
    }
    if (h->state == MS_H1_WAIT_NEXT || h->in.len > h->in_off) {
        ms__h1_feed(c, NULL, 0); /* serve what came in behind it */
        return;
    }
    ms__conn_flush(c);
    maybe_idle(c);
}

/* A deadline passed: the head or the body did not come in time (408), or the client stopped
 * reading a reply (close). */
void ms__h1_timeout(ms_conn_t *c, int phase)
{
    ms_h1_t *h = c->h1;
    char peer[64];
    ms_conn_peer(c, peer, sizeof(peer));
    if (phase == MS_PHASE_SEND || h == NULL) {
        ms_log(MS_LOG_INFO, "%s: closed: the client read nothing for send_timeout", peer);
        ms__conn_close(c, 0);
        return;
    }
    if (phase == MS_PHASE_BODY) {
        /* Past body_timeout, a body may go on while it keeps body_min_rate on average:
         * a large upload on a good link is fine, a trickle is not. Looked at each second. */
        const ms_limits_t *lim = &c->server->limits;
        uint64_t ms = uv_now(c->server->loop) - h->body_start;
        uint64_t got = h->req.body_seen - h->body_mark;
        if (ms > 0 && got * 1000 / ms >= lim->body_min_rate) {
            ms__conn_arm(c, MS_PHASE_BODY, 1000);
            return;
        }
    }
    ms__conn_hold(c);
    refuse(c, h, 408,
           phase == MS_PHASE_HEAD ? "head not complete within head_timeout"
                                  : "body not complete within body_timeout at body_min_rate");
    ms__conn_flush(c);
    ms__conn_release(c);
}

/* The reply queue drained below half its high-water mark: pipelined requests go on. */
void ms__h1_out_drained(ms_conn_t *c)
{
    ms_h1_t *h = c->h1;
    if (h == NULL || !h->out_paused || (c->flags & MS_CONN_IN_FEED) ||
        ms__conn_queued(c) > MS_OUT_HIGH_WATER / 2)
        return;
    h->out_paused = 0;
    if (c->server->depth > 0) {
        ms__server_defer(c->server, c); /* no calls into Lua from inside one */
        return;
    }
    ms__h1_continue(c);
}

void ms__h1_body_drained(ms_conn_t *c)
{
    if ((c->flags & MS_CONN_READ_OFF) && c->h1 != NULL &&
        c->h1->req.body.len <= MS_BODY_HIGH_WATER / 2) {
        c->flags &= ~MS_CONN_READ_OFF;
        c->io->read_start(c);
    }
}

void ms__h1_eof(ms_conn_t *c)
{
    ms_h1_t *h = c->h1;
    if (h != NULL && (h->req.v.flags & MS_REQ_IN_HANDLER)) {
        /* The client may have only shut its sending side: the reply can still go out. */
        ms_req_t *r = &h->req;
        c->flags |= MS_CONN_CLOSING;
        if (!h->msg_done) {
            r->v.flags |= MS_REQ_BODY_ERROR;
            if (r->v.wait == MS_WAIT_BODY)
                ms__req_wake(r, MS_WAIT_BODY);
        }
        return;
    }
    if (c->flight != NULL || (c->pend != NULL && c->pend->nvecs > 0)) {
        c->flags |= MS_CONN_CLOSING;
        return;
    }
    ms__conn_close(c, 0);
}
