/* h1.c: HTTP/1.x: bytes into requests (llhttp, in place) and replies into bytes. */
#include "moonserve.h"

#include <stdio.h>

#include "http/http.h"

typedef struct ms_h1_s ms_h1_t;

/* HTTP/1 state of an active connection: dropped back to the worker when it goes idle. */
enum { MS_H1_HEAD, MS_H1_BODY, MS_H1_WAIT_NEXT, MS_H1_TUNNEL, MS_H1_DEAD };

struct ms_h1_s {
    ms_h1_t *next_free;
    llhttp_t parser;
    ms_buf_t in;          /* owned: bytes kept between reads (partial head, pipelined requests) */
    size_t in_off;        /* consumed prefix of `in` */
    size_t scan;          /* how far the head scan got in `in` */
    int state;            /* MS_H1_* */
    int msg_done;         /* llhttp finished the current message */
    int field_open;       /* a header name is being read */
    int discard_body;     /* the handler is done: body bytes still coming are dropped */
    int head_done;        /* fields from now on are trailers */
    int out_paused;       /* the next request waits until the reply queue drains */
    ms_buf_t trailer;     /* owned: the trailer field being read, name then value */
    size_t trailer_name;  /* how much of `trailer` is the name */
    size_t trailer_bytes; /* of all trailer fields so far, held to head_bytes */
    uint32_t chunk_ext;   /* bytes of extensions on the current chunk-size line */
    uint64_t body_start;  /* when the wait for the body began (loop ms) */
    uint64_t body_mark;   /* body bytes received by then */
    int status;           /* the status a refused request gets */
    const char *why;      /* why the request was refused, for the log */
    const ms_limits_t *conn_limits; /* the worker's */
    ms_tunnel_t *keeper; /* a finished tunnel's taker, to hand the connection to (hand_over) */
    ms_req_t req;
};

/* The connection's HTTP/1.1 state: NULL while it idles, or once it speaks another protocol. */
static inline ms_h1_t *h1_of(ms_conn_t *c)
{
    return c->proto == &ms__h1_proto ? c->pstate : NULL;
}

static inline ms_h1_t *h1_of_req(ms_req_t *r)
{
    return container_of(r, ms_h1_t, req);
}

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
            ms__req_headers_grow(r);
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
    ms__req_split_target(r);
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

/* HTTP/1.1's own per worker: connection states kept for reuse while their connections idle. */
struct ms_h1_worker_s {
    ms_recycle_t free;
};

/* -- State ------------------------------------------------------------------------------- */

static ms_h1_t *h1_get(ms_conn_t *c)
{
    ms_server_t *s = c->server;
    ms_h1_t *h = ms__recycle_get(&s->h1->free);
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
    c->pstate = h;
    return h;
}

static void h1_destroy(void *p)
{
    ms_h1_t *h = p;
    ms_pool_free(&h->req.pool);
    ms_mem_free(h->req.body.base);
    ms_mem_free(h->in.base);
    ms_mem_free(h->trailer.base);
    ms_mem_free(h);
}

static void h1_free(ms_server_t *s, void *pstate)
{
    ms_h1_t *h = pstate;
    ms__req_reset(&h->req);
    llhttp_reset(&h->parser);
    h->state = MS_H1_HEAD;
    h->msg_done = h->field_open = h->discard_body = h->head_done = h->out_paused = 0;
    h->scan = h->in.len = h->in_off = 0;
    h->trailer.len = h->trailer_name = h->trailer_bytes = 0;
    h->status = 0;
    h->why = NULL;
    h->keeper = NULL;
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
    if (!ms__recycle_put(&s->h1->free, h))
        h1_destroy(h);
}

/* -- Refusals ---------------------------------------------------------------------------- */

/* Answers a request the core will not hand to Lua (or whose body went wrong) and closes;
 * ms__req_refuse logged it. */
static void h1_refuse(ms_req_t *r, int status)
{
    ms_conn_t *c = r->conn;
    ms_server_t *s = c->server;
    ms_h1_t *h = h1_of_req(r);
    h->state = MS_H1_DEAD;
    if (c->flags & MS_CONN_CLOSED) {
        /* nothing to send */
    } else if (r->v.flags & MS_REQ_HEAD_SENT) {
        ms__conn_close(c, 0); /* part of a reply is out: closing is the only answer left */
    } else {
        r->v.flags |= MS_REQ_HEAD_SENT | MS_REQ_DONE | MS_REQ_CLOSE;
        ms_out_t *o = ms__conn_out(c);
        char *w = ms__out_reserve(o, 512);
        ms_refusal_t body;
        ms__refusal(r, status, &body);
        int n = snprintf(w, 512,
                         "HTTP/1.1 %d %s\r\nserver: moonserve\r\n%scontent-type: %s\r\n"
                         "content-length: %zu\r\n%sconnection: close\r\n\r\n",
                         status, ms__reason(status), ms__date_line(s), body.type, body.len,
                         status == 503 ? "retry-after: 1\r\n" : "");
        ms__out_commit(s, o, (size_t)n);
        if (body.app) /* the app's lives as long as the server */
            ms__out_vec(s, o, body.body, body.len, MS_VEC_STATIC, -1);
        else
            ms__out_text(s, o, body.body, body.len);
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

/* -- Replies ----------------------------------------------------------------------------- */

static char *put(char *w, const char *s, size_t n)
{
    memcpy(w, s, n);
    return w + n;
}
#define PUT(w, lit) put((w), (lit), sizeof(lit) - 1)

/* Queues the reply head. `clen` is the body length, -1 for a body of unknown length
 * (chunked, or closing on HTTP/1.0), -2 for a status that has no body. */
static void h1_reply_head(ms_req_t *r, int64_t clen)
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
        w = ms__put_u64(w, (uint64_t)clen);
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
}

/* -- Reading ----------------------------------------------------------------------------- */

/* refuse_busy with the app's body for 503, if it gave one: no head was parsed, so no Accept
 * chooses among its bodies (ms__refusal_first). */
static MS_NOINLINE int refuse_busy_app(ms_conn_t *c, ms_out_t *o)
{
    ms_server_t *s = c->server;
    size_t len;
    const char *type, *body = ms__refusal_first(s, 503, &len, &type);
    if (body == NULL)
        return 0;
    char *w = ms__out_reserve(o, 256);
    int n = snprintf(w, 256,
                     "HTTP/1.1 503 Service Unavailable\r\nserver: moonserve\r\n%sretry-after: "
                     "1\r\ncontent-type: %s\r\ncontent-length: %zu\r\nconnection: close\r\n\r\n",
                     ms__date_line(s), type, len);
    ms__out_commit(s, o, (size_t)n);
    ms__out_vec(s, o, body, len, MS_VEC_STATIC, -1);
    h1_of(c)->state = MS_H1_DEAD;
    c->flags |= MS_CONN_CLOSING;
    return 1;
}

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
    if (MS_UNLIKELY(s->refusals != NULL) && refuse_busy_app(c, o))
        return;
    ms__out_vec(s, o, busy, sizeof(busy) - 1, MS_VEC_STATIC, -1);
    ms__out_text(s, o, ms__date_line(s), 37);
    ms__out_vec(s, o, body, sizeof(body) - 1, MS_VEC_STATIC, -1);
    h1_of(c)->state = MS_H1_DEAD;
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
        ms__req_refuse(&h->req, h->status ? h->status : 400,
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

/* Parses a whole head with llhttp, then hands the request to the handler. Returns 0, 1 for
 * a request that switches the connection to another protocol (`*to`), or -1 when it was
 * refused. */
static int start_request(ms_conn_t *c, ms_h1_t *h, const char *p, size_t n, const ms_proto_t **to)
{
    ms_req_t *r = &h->req;
    r->v.id = ++c->server->next_req_id;
    r->body_limit = c->server->limits.body_bytes;
    r->head.base = p;
    r->head.len = n;
    llhttp_errno_t e = llhttp_execute(&h->parser, p, n);
    if ((e == HPE_PAUSED_UPGRADE || (e == HPE_PAUSED && h->parser.upgrade)) &&
        (*to = ms__upgrade_proto(r)) != NULL) {
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
        ms__req_refuse(&h->req, h->status ? h->status : 400,
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

/* The state machine over the bytes at hand. Returns how far it got; the caller keeps the
 * rest for later. Requests are answered strictly in order: while a handler holds one,
 * the bytes of the next stay unparsed. */
static const char *process(ms_conn_t *c, ms_h1_t *h, const char *p, const char *end)
{
    const ms_limits_t *lim = &c->server->limits;
    while (p < end) {
        if (c->flags & MS_CONN_CLOSING)
            return end; /* closing after this reply: whatever comes next is dropped */
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
            if (h->scan == 0) {
                /* RFC 9112 2.2: ignore empty lines before a request line. */
                while (end - p >= 2 && p[0] == '\r' && p[1] == '\n')
                    p += 2;
                if (p == end || (end - p == 1 && *p == '\r'))
                    return p;
            }
            ssize_t n = scan_head(p, (size_t)(end - p), &h->scan, &h->why);
            if (n < 0) {
                ms__req_refuse(&h->req, 400, h->why);
                return end;
            }
            size_t have = n > 0 ? (size_t)n : (size_t)(end - p);
            if (MS_UNLIKELY(have > lim->line_bytes) || MS_UNLIKELY(have > lim->head_bytes)) {
                /* Only a head longer than a request line may hold one that is too long (and
                 * head_bytes may be the smaller limit). */
                const char *lf = memchr(p, '\n', have);
                if (lf == NULL ? have > lim->line_bytes : (size_t)(lf - p) > lim->line_bytes) {
                    ms__req_refuse(&h->req, 414, "request line larger than line_bytes");
                    return end;
                }
                if (have > lim->head_bytes) {
                    ms__req_refuse(&h->req, 431, "head larger than head_bytes");
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
            const ms_proto_t *to = NULL;
            int started = start_request(c, h, p, (size_t)n, &to);
            if (started < 0)
                return end;
            if (started == 1) {
                ms__conn_switch(c, to, &h->req, p + n, (size_t)(end - p - n));
                return end; /* (`h` is gone) */
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
        case MS_H1_TUNNEL:
            if (h->keeper != NULL)
                return p; /* the taker's, once it has the connection (hand_over) */
            if (h->req.tunnel != NULL)
                h->req.tunnel->on_data(h->req.tunnel, p, (size_t)(end - p));
            return end;
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

/* The request of a tunnel that keeps the connection has finished: the taker gets the
 * connection (and the reference its handler held), with what the client sent behind the
 * head, and the HTTP/1 state with the request goes back to the worker. */
static void hand_over(ms_conn_t *c, ms_h1_t *h)
{
    ms_tunnel_t *t = h->keeper;
    h->keeper = NULL;
    c->pstate = NULL;
    c->proto = NULL; /* (the taker's from here) */
    t->on_handover(t, c, h->in.base + h->in_off, h->in.len - h->in_off);
    assert(c->proto != NULL && c->pstate != NULL);
    h1_free(c->server, h);
}

/* An idle connection gives its HTTP/1 state back and keeps only itself and its socket. */
static void maybe_idle(ms_conn_t *c)
{
    ms_h1_t *h = h1_of(c);
    if (h == NULL || (c->flags & MS_CONN_CLOSED))
        return;
    if (h->state == MS_H1_HEAD && h->scan == 0 && h->in.len == h->in_off &&
        !(h->req.v.flags & MS_REQ_IN_HANDLER) && c->flight == NULL) {
        c->pstate = NULL;
        h1_free(c->server, h);
        ms__conn_idle(c);
    }
    ms__conn_rearm(c);
}

static void h1_feed(ms_conn_t *c, const char *data, size_t len)
{
    ms_h1_t *h = c->pstate != NULL ? c->pstate : h1_get(c);
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
    if (c->pstate == h && !(c->flags & MS_CONN_CLOSED)) {
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
    if (c->pstate == h && h->keeper != NULL)
        hand_over(c, h); /* a tunnel's request finished during the feed */
    ms__conn_flush(c);
    ms__conn_drain_check(c);
    maybe_idle(c);
    ms__conn_release(c);
}

static void h1_resume(ms_conn_t *c);

/* The handler let go of the request (ms_req_finish). */
static void h1_finished(ms_req_t *r)
{
    ms_conn_t *c = r->conn;
    ms_h1_t *h = h1_of_req(r);
    if (r->tunnel != NULL) {
        /* A taker that keeps the connection (ms_req_finish left it the tunnel): the
         * handler's reference is the taker's from now on. Inside a feed, the feed hands the
         * connection over once it is done with the HTTP/1 state. */
        h->keeper = r->tunnel;
        r->tunnel = NULL;
        if (!(c->flags & MS_CONN_IN_FEED))
            hand_over(c, h);
        return;
    }
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
    h1_resume(c);
}

/* Serves whatever came in behind a finished request. */
static void h1_resume(ms_conn_t *c)
{
    ms_h1_t *h = h1_of(c);
    if (h == NULL || (c->flags & MS_CONN_CLOSED))
        return;
    if (c->flags & MS_CONN_READ_OFF) {
        c->flags &= ~MS_CONN_READ_OFF;
        c->io->read_start(c);
    }
    if (h->state == MS_H1_WAIT_NEXT || h->in.len > h->in_off) {
        h1_feed(c, NULL, 0); /* serve what came in behind it */
        return;
    }
    ms__conn_hold(c); /* the flush may close it: a tunnel whose peer half-closed ends here */
    ms__conn_flush(c);
    maybe_idle(c);
    ms__conn_release(c);
}

/* A deadline passed: the head or the body did not come in time (408), or the client stopped
 * reading a reply (close). */
static void h1_timeout(ms_conn_t *c, int phase)
{
    ms_h1_t *h = h1_of(c);
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
    ms__req_refuse(&h->req, 408,
                   phase == MS_PHASE_HEAD
                       ? "head not complete within head_timeout"
                       : "body not complete within body_timeout at body_min_rate");
    ms__conn_flush(c);
    ms__conn_release(c);
}

/* The reply queue drained below half its high-water mark: pipelined requests go on. */
static void h1_out_drained(ms_conn_t *c)
{
    ms_h1_t *h = h1_of(c);
    if (h == NULL || !h->out_paused || (c->flags & MS_CONN_IN_FEED) ||
        ms__conn_queued(c) > MS_OUT_HIGH_WATER / 2)
        return;
    h->out_paused = 0;
    if (c->server->depth > 0) {
        ms__server_defer(c->server, c); /* no calls into Lua from inside one */
        return;
    }
    h1_resume(c);
}

/* The handler took body bytes: a socket stopped for backpressure reads again. */
static void h1_body_taken(ms_req_t *r, size_t n)
{
    ms_conn_t *c = r->conn;
    (void)n;
    if ((c->flags & MS_CONN_READ_OFF) && r->body.len <= MS_BODY_HIGH_WATER / 2) {
        c->flags &= ~MS_CONN_READ_OFF;
        c->io->read_start(c);
    }
}

static void h1_eof(ms_conn_t *c)
{
    ms_h1_t *h = h1_of(c);
    if (h != NULL && (h->req.v.flags & MS_REQ_IN_HANDLER)) {
        /* The client may have only shut its sending side: the reply can still go out. */
        ms_req_t *r = &h->req;
        if (r->tunnel != NULL) {
            /* A tunnel's taker may still write (a raw socket answers a half-close); the
             * connection closes when it finishes the request. */
            ms__conn_hold(c); /* the taker may let go of the request, and close */
            ms__req_tunnel_end(r, 0);
            ms__conn_release(c);
            return;
        }
        c->flags |= MS_CONN_CLOSING;
        /* A long reply (an event stream) takes this as the client leaving: no client of one
         * half-closes and still reads (res:gone() says so). */
        r->v.flags |= MS_REQ_PEER_EOF;
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

/* -- The protocol's table ----------------------------------------------------------------- */

static void h1_read_buf(ms_conn_t *c, uv_buf_t *buf)
{
    ms_h1_t *h = c->pstate;
    if (h == NULL || h->in.len == h->in_off)
        return; /* the worker's shared buffer */
    /* Bytes are kept (a partial head, or requests behind a parked one): read after them so
     * the head ends up contiguous. The kept bytes start at the head being scanned, and
     * `scan` counts from there, so moving them leaves it as it is. */
    assert(h->scan <= h->in.len - h->in_off);
    if (h->in_off > 0) {
        memmove(h->in.base, h->in.base + h->in_off, h->in.len - h->in_off);
        h->in.len -= h->in_off;
        h->in_off = 0;
    }
    if (h->in.cap - h->in.len < MS_CONN_BUF_MIN) {
        h->in.cap = h->in.cap * 2 > MS_CONN_BUF_MIN ? h->in.cap * 2 : MS_CONN_BUF_MIN;
        h->in.base = ms_mem_realloc(h->in.base, h->in.cap);
    }
    buf->base = h->in.base + h->in.len;
    buf->len = h->in.cap - h->in.len;
}

/* What the connection waits for: a body (body_timeout, reset by each read), the rest of a
 * head (head_timeout, from its first byte: trickling bytes does not extend it), or the next
 * request (idle_timeout). A handler at work has no deadline here. */
static void h1_rearm(ms_conn_t *c)
{
    ms_server_t *s = c->server;
    const ms_limits_t *lim = &s->limits;
    ms_h1_t *h = c->pstate;
    /* A body we hold back (backpressure, or 100 Continue not yet sent) is not late. */
    if (h != NULL && h->state == MS_H1_BODY && !(c->flags & MS_CONN_READ_OFF) &&
        !(h->req.v.flags & MS_REQ_EXPECT)) {
        if (c->phase != MS_PHASE_BODY) {
            h->body_start = uv_now(s->loop);
            h->body_mark = h->req.body_seen;
            ms__conn_arm(c, MS_PHASE_BODY, lim->body_timeout_ms);
        }
        return;
    }
    if (h != NULL && (h->req.v.flags & MS_REQ_IN_HANDLER)) {
        c->phase = MS_PHASE_NONE;
        ms_timer_stop(s, &c->timer);
        return;
    }
    if (c->flags & MS_CONN_CLOSING)
        return;
    if (h != NULL && h->state == MS_H1_HEAD && (h->scan > 0 || h->in.len > h->in_off)) {
        if (c->phase != MS_PHASE_HEAD)
            ms__conn_arm(c, MS_PHASE_HEAD, lim->head_timeout_ms);
        return;
    }
    ms__conn_arm_idle(c);
}

static void h1_drain_check(ms_conn_t *c)
{
    ms_h1_t *h = c->pstate;
    if (h != NULL && h->req.v.wait == MS_WAIT_DRAIN &&
        (h->req.drain_all ? ms__conn_queued(c) == 0 : !ms_reply_congested(&h->req)))
        ms__req_wake(&h->req, MS_WAIT_DRAIN);
    else if (h != NULL && h->out_paused)
        h1_out_drained(c);
    else if (h != NULL && h->state == MS_H1_TUNNEL)
        ms__conn_idle(c); /* what a tunnel wrote in the background has gone */
}

/* The server stops: a connection waiting for its next request gets the short grace. */
static void h1_stop(ms_conn_t *c)
{
    ms_h1_t *h = c->pstate;
    if (h == NULL || !(h->req.v.flags & MS_REQ_IN_HANDLER))
        ms__conn_rearm(c);
}

static void h1_abort(ms_conn_t *c)
{
    ms_h1_t *h = c->pstate;
    if (h != NULL && (h->req.v.flags & MS_REQ_IN_HANDLER))
        ms__req_abort(&h->req);
}

static ms_out_t *h1_out(ms_req_t *r)
{
    return ms__conn_out(r->conn);
}

/* A piece of a body of unknown length: a chunk on HTTP/1.1 (HTTP/1.0's ends with the close). */
static void h1_body_piece(ms_req_t *r, const char *p, size_t len, int owner, int32_t anchor)
{
    ms_conn_t *c = r->conn;
    ms_server_t *s = c->server;
    ms_out_t *o = ms__conn_out(c);
    if (!(r->v.flags & MS_REQ_CHUNKED_OUT)) {
        ms__req_queue_body(r, o, p, len, owner, anchor);
        return;
    }
    char *w = ms__out_reserve(o, 20);
    int n = 0;
    static const char hex[] = "0123456789abcdef";
    char tmp[16];
    for (size_t v = len; v != 0; v >>= 4)
        tmp[n++] = hex[v & 15];
    for (int i = 0; i < n; i++)
        w[i] = tmp[n - 1 - i];
    w[n] = '\r';
    w[n + 1] = '\n';
    ms__out_commit(s, o, (size_t)n + 2);
    ms__req_queue_body(r, o, p, len, owner, anchor);
    ms__out_text(s, o, "\r\n", 2);
}

/* The last chunk, the trailer fields, the end. */
static void h1_body_end(ms_req_t *r)
{
    ms_server_t *s = r->conn->server;
    if (!(r->v.flags & MS_REQ_CHUNKED_OUT))
        return;
    ms_out_t *o = ms__conn_out(r->conn);
    ms__out_text(s, o, "0\r\n", 3);
    if (r->res_trailers.len > 0)
        ms__out_text(s, o, r->res_trailers.base, r->res_trailers.len);
    ms__out_text(s, o, "\r\n", 2);
}

static void h1_send_continue(ms_req_t *r)
{
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    ms__out_vec(r->conn->server, ms__conn_out(r->conn), cont, sizeof(cont) - 1, MS_VEC_STATIC, -1);
}

static void h1_fail(ms_req_t *r)
{
    r->v.flags |= MS_REQ_DONE | MS_REQ_CLOSE; /* no last chunk, and the connection closes */
    r->conn->flags |= MS_CONN_CLOSING;
}

static void h1_body_wait(ms_req_t *r)
{
    (void)r; /* the connection's timer has the body's deadline (h1_rearm) */
}

static size_t h1_queued(ms_req_t *r)
{
    return ms__conn_queued(r->conn);
}

static void h1_where(ms_req_t *r, char *buf, size_t len)
{
    (void)r;
    (void)len;
    buf[0] = 0;
}

/* 101 Switching Protocols (the taker names the protocol in its Upgrade field), then the
 * connection's bytes are the tunnel's; it closes when the tunnel ends. Bytes kept behind the
 * head go to it once the handler's call into the core has returned. */
static void h1_tunnel(ms_req_t *r)
{
    ms_conn_t *c = r->conn;
    ms_h1_t *h = h1_of_req(r);
    static const char upgrade[] = "connection: upgrade\r\n"; /* (with the taker's Upgrade) */
    r->v.status = 101;
    r->v.flags &= ~MS_REQ_CLOSE; /* not "connection: close" */
    ms_reply_field(r, upgrade, sizeof(upgrade) - 1);
    h1_reply_head(r, -2);
    r->v.flags |= MS_REQ_CLOSE | MS_REQ_BODY_DONE;
    h->state = MS_H1_TUNNEL;
    if (h->in.len > h->in_off && !(c->flags & MS_CONN_IN_FEED)) {
        if (c->server->depth > 0)
            ms__server_defer(c->server, c);
        else
            h1_resume(c);
    }
}

static void h1_tunnel_read(ms_req_t *r, int on)
{
    ms_conn_t *c = r->conn;
    if (!on && !(c->flags & MS_CONN_READ_OFF)) {
        c->flags |= MS_CONN_READ_OFF;
        c->io->read_stop(c);
    } else if (on && (c->flags & MS_CONN_READ_OFF)) {
        c->flags &= ~MS_CONN_READ_OFF;
        c->io->read_start(c);
    }
}

static void h1_worker_init(ms_server_t *s)
{
    s->h1 = ms_mem_alloc(sizeof(*s->h1));
    memset(s->h1, 0, sizeof(*s->h1));
}

static void h1_worker_free(ms_server_t *s)
{
    ms__recycle_drain(&s->h1->free, h1_destroy);
    ms_mem_free(s->h1);
    s->h1 = NULL;
}

const ms_proto_t ms__h1_proto = {
    .counted_as = 1,
    .name = "http/1.1",
    .read_buf = h1_read_buf,
    .feed = h1_feed,
    .eof = h1_eof,
    .write = ms__conn_flush,
    .rearm = h1_rearm,
    .timeout = h1_timeout,
    .drain_check = h1_drain_check,
    .resume = h1_resume,
    .stop = h1_stop,
    .abort = h1_abort,
    .free = h1_free,
    .reply_head = h1_reply_head,
    .out = h1_out,
    .body_piece = h1_body_piece,
    .body_end = h1_body_end,
    .send_continue = h1_send_continue,
    .flush = ms__conn_flush,
    .finished = h1_finished,
    .fail = h1_fail,
    .refuse = h1_refuse,
    .body_taken = h1_body_taken,
    .body_wait = h1_body_wait,
    .queued = h1_queued,
    .where = h1_where,
    .tunnel = h1_tunnel,
    .tunnel_read = h1_tunnel_read,
    .tunnel_handover = 1,
    .worker_init = h1_worker_init,
    .worker_free = h1_worker_free,
};
