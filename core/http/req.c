/* req.c: what a handler does with a request: fields, body, waits, reply, finish; and the
 * request's id. */
#include <stdio.h>
#include <unistd.h>

#include "moonserve.h"

#include "http/accesslog.h"
#include "http/http.h"

/* -- Dispatch and refusal, the same for every protocol ------------------------------------ */

/* The reason phrase of a status ("" for one the core does not know). */
const char *ms__reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 303: return "See Other";
    case 304: return "Not Modified";
    case 307: return "Temporary Redirect";
    case 308: return "Permanent Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 416: return "Range Not Satisfiable";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    }
    return "";
}

/* The body of a refusal the core answers by itself: the status and its reason,
 * "503 Service Unavailable\n". Returns its length. */
int ms__refusal_body(int status, char *buf, size_t size)
{
    return snprintf(buf, size, "%d %s\n", status, ms__reason(status));
}

/* -- The app's bodies for the core's refusals (ms_server_refusal_body) -------------------- */

#define MS__REFUSALS 7

/* The statuses the core refuses with by itself, and the kinds of body an app may give each. */
static const uint16_t refusal_statuses[MS__REFUSALS] = {400, 403, 408, 413, 414, 431, 503};
static const char *const refusal_types[3] = {"text/plain; charset=utf-8", "application/json",
                                             "text/html; charset=utf-8"};

struct ms_refusals_s {
    char *body[MS__REFUSALS][3]; /* owned; NULL: not given */
    uint32_t len[MS__REFUSALS][3];
};

static int refusal_index(int status)
{
    for (int i = 0; i < MS__REFUSALS; i++)
        if (refusal_statuses[i] == status)
            return i;
    return -1;
}

int ms_server_refusal_body(ms_server_t *s, int status, int kind, const char *body, size_t len)
{
    int i = refusal_index(status);
    if (i < 0 || kind < MS_REFUSAL_TEXT || kind > MS_REFUSAL_HTML || len > MS_REFUSAL_BODY_MAX ||
        (body == NULL && len > 0))
        return UV_EINVAL;
    if (s->refusals == NULL) {
        s->refusals = ms_mem_alloc(sizeof(*s->refusals));
        memset(s->refusals, 0, sizeof(*s->refusals));
    }
    /* Set once, at start: a body is referenced, not copied, by replies still queued. */
    if (s->refusals->body[i][kind] != NULL)
        return UV_EEXIST;
    char *copy = ms_mem_alloc(len + 1);
    if (len > 0)
        memcpy(copy, body, len);
    copy[len] = '\0';
    s->refusals->body[i][kind] = copy;
    s->refusals->len[i][kind] = (uint32_t)len;
    return 0;
}

static void refusals_free(ms_server_t *s)
{
    if (s->refusals == NULL)
        return;
    for (int i = 0; i < MS__REFUSALS; i++)
        for (int k = 0; k < 3; k++)
            ms_mem_free(s->refusals->body[i][k]);
    ms_mem_free(s->refusals);
    s->refusals = NULL;
}

const ms_part_t ms__refusal_part = {.name = "refusal bodies", .worker_free = refusals_free};

/* Where in `accept` a media type of `kind` is first named, or SIZE_MAX: JSON is
 * application/json or any "+json" suffix (RFC 6839, section 3.1), HTML text/html. A cheap
 * look, not content negotiation: q-values are not weighed. */
static size_t accept_at(const ms_str_t *accept, int kind)
{
    const char *p = accept->base;
    size_t n = accept->len;
    for (size_t i = 0; i < n; i++) {
        if (kind == MS_REFUSAL_JSON && p[i] == 'j' && i >= 1 && n - i >= 4 &&
            memcmp(p + i, "json", 4) == 0 && (p[i - 1] == '+' || p[i - 1] == '/'))
            return i;
        if (kind == MS_REFUSAL_HTML && n - i >= 9 && ms__ieq(p + i, "text/html", 9))
            return i;
    }
    return SIZE_MAX;
}

void ms__refusal(ms_req_t *r, int status, ms_refusal_t *out)
{
    ms_server_t *s = r != NULL ? r->conn->server : NULL;
    int i = s != NULL && s->refusals != NULL ? refusal_index(status) : -1;
    const struct ms_refusals_s *t = i >= 0 ? s->refusals : NULL;
    int kind = -1;
    if (t != NULL) {
        /* (A head the core refuses before it is whole has no fields yet: nheaders is 0.) */
        const ms_str_t *accept = ms_req_header(r, "accept", 6);
        size_t json = SIZE_MAX, html = SIZE_MAX;
        if (accept != NULL) {
            if (t->body[i][MS_REFUSAL_JSON] != NULL)
                json = accept_at(accept, MS_REFUSAL_JSON);
            if (t->body[i][MS_REFUSAL_HTML] != NULL)
                html = accept_at(accept, MS_REFUSAL_HTML);
        }
        if (json != SIZE_MAX || html != SIZE_MAX)
            kind = json < html ? MS_REFUSAL_JSON : MS_REFUSAL_HTML;
        else /* the text, else the first given in the order text, JSON, HTML */
            for (int k = MS_REFUSAL_TEXT; k <= MS_REFUSAL_HTML && kind < 0; k++)
                if (t->body[i][k] != NULL)
                    kind = k;
    }
    if (kind < 0) {
        out->type = refusal_types[MS_REFUSAL_TEXT];
        out->len = (size_t)ms__refusal_body(status, out->buf, sizeof(out->buf));
        out->body = out->buf;
        out->app = 0;
        return;
    }
    out->type = refusal_types[kind];
    out->body = t->body[i][kind];
    out->len = t->len[i][kind];
    out->app = 1;
}

const char *ms__refusal_first(ms_server_t *s, int status, size_t *len, const char **type)
{
    int i = s->refusals != NULL ? refusal_index(status) : -1;
    for (int k = MS_REFUSAL_TEXT; i >= 0 && k <= MS_REFUSAL_HTML; k++)
        if (s->refusals->body[i][k] != NULL) {
            *len = s->refusals->len[i][k];
            *type = refusal_types[k];
            return s->refusals->body[i][k];
        }
    return NULL;
}

/* A request over the in-flight cap (ms__req_busy): counted and logged, a flood as one line
 * a second. */
int ms__req_refused_busy(ms_server_t *s)
{
    s->stats->refused_busy++;
    ms__log_refusals(s);
    return 1;
}

void ms__req_refuse(ms_req_t *r, int status, const char *why)
{
    ms_conn_t *c = r->conn;
    ms_server_t *s = c->server;
    if (why != NULL) { /* (NULL: a 503 over in_flight, which ms__req_busy counted and logged) */
        s->stats->bad_requests++;
        ms__metrics_refused(s, status);
        /* A few a second with their reason; a flood of them as counts (ms__log_refusals). */
        uint64_t now = uv_now(s->loop);
        if (now - s->refused_logged_at >= 1000)
            s->refused_told = 0;
        if (s->refused_told < MS_REFUSALS_TOLD) {
            s->refused_told++;
            char peer[64], where[48];
            ms_conn_peer(c, peer, sizeof(peer));
            c->proto->where(r, where, sizeof(where));
            ms_log(MS_LOG_INFO, "%s: %s%d %s: %s", peer, where, status, ms__reason(status), why);
        } else {
            s->refused_quiet++;
        }
        ms__log_refusals(s);
    }
    r->refused = (uint16_t)status;
    if (MS_UNLIKELY(s->alogs != NULL) && !(r->v.flags & MS_REQ_IN_HANDLER)) {
        /* No handler will finish it: its line is now, with the body the refusal carries. */
        if (!(r->v.flags & MS_REQ_HEAD_SENT)) {
            ms_refusal_t body;
            ms__refusal(r, status, &body);
            r->bytes_out += (uint64_t)body.len;
        }
        ms__alog_req(r);
    }
    if (MS_UNLIKELY(s->metrics_on) && !(r->v.flags & MS_REQ_IN_HANDLER))
        ms__metrics_req(r);
    c->proto->refuse(r, status);
}

int ms__req_get_or_head(const ms_req_t *r)
{
    const ms_str_t *mt = &r->v.method;
    return (mt->len == 3 && memcmp(mt->base, "GET", 3) == 0) ||
           (mt->len == 4 && memcmp(mt->base, "HEAD", 4) == 0);
}

static int path_is(const ms_req_t *r, const char *p)
{
    return p != NULL && r->v.path.len == strlen(p) && memcmp(r->v.path.base, p, r->v.path.len) == 0;
}

/* The health paths: 1 when `r` asked one and is answered. Cheap, with no Lua, so that a
 * probe tells whether the worker's loop turns; never cached by anyone on the way. */
static int health(ms_req_t *r)
{
    ms_server_t *s = r->conn->server;
    int live = path_is(r, s->livez), ready = !live && path_is(r, s->readyz);
    if (!live && !ready)
        return 0;
    if (!ms__req_get_or_head(r))
        return 0; /* the app's to answer, or refuse */
    int up = live || !s->stopping || s->handing_over;
    r->v.status = up ? 200 : 503;
    static const char ctype[] = "content-type: text/plain\r\ncache-control: no-store\r\n";
    ms_reply_fields_checked(r, ctype, sizeof(ctype) - 1);
    const char *body = up ? "ok\n" : "stopping\n";
    ms_reply_send(r, body, strlen(body), MS_VEC_STATIC, -1);
    return 1;
}

void ms_server_health(ms_server_t *s, const char *livez, const char *readyz)
{
    ms_mem_free(s->livez);
    ms_mem_free(s->readyz);
    s->livez = livez != NULL && *livez != '\0' ? ms_mem_strdup(livez) : NULL;
    s->readyz = readyz != NULL && *readyz != '\0' ? ms_mem_strdup(readyz) : NULL;
}

void ms_server_handing_over(ms_server_t *s)
{
    s->handing_over = 1;
}

/* A whole request head, from any protocol: it counts, the handler's hold on the connection
 * is taken, the steps before the handler may answer it (static mounts), else the handler
 * has it. What a protocol decides of its own (a connection's last request, a malformed
 * stream) it decides before calling this. */
/* A request on a listener that sends every client to https: 308 to the same host (without
 * its port) and target, on the server's https port. No handler runs. */
static MS_NOINLINE void redirect_https(ms_req_t *r)
{
    const ms_str_t *host = ms_req_header(r, "host", 4);
    size_t hl = host != NULL ? host->len : 0;
    if (hl > 0 && host->base[0] == '[') {
        const char *close = memchr(host->base, ']', hl);
        hl = close != NULL ? (size_t)(close - host->base) + 1 : 0;
    } else if (hl > 0) {
        const char *colon = memchr(host->base, ':', hl);
        if (colon != NULL)
            hl = (size_t)(colon - host->base);
    }
    uint16_t port = r->conn->server->https_port;
    size_t cap = 8 + hl + 6 + r->v.target.len;
    char *loc = ms_pool_alloc(&r->pool, cap), *w = loc;
    memcpy(w, "https://", 8);
    w += 8;
    if (hl > 0)
        memcpy(w, host->base, hl);
    w += hl;
    if (port != 443) {
        *w++ = ':';
        w = ms__put_u64(w, port);
    }
    /* An origin-form target as it came; "*" or an absolute form: the root. */
    if (r->v.target.len > 0 && r->v.target.base[0] == '/') {
        memcpy(w, r->v.target.base, r->v.target.len);
        w += r->v.target.len;
    } else {
        *w++ = '/';
    }
    int status = 308;
    if (hl == 0 || ms_reply_header(r, "location", 8, loc, (size_t)(w - loc)) < 0)
        status = 400; /* no host to send it to, or one that cannot stand in a field */
    char body[64];
    int n = ms__refusal_body(status, body, sizeof(body));
    r->v.status = (uint16_t)status;
    ms_reply_header(r, "content-type", 12, "text/plain", 10);
    ms_reply_send(r, body, n > 0 ? (size_t)n : 0, MS_VEC_OUT, -1);
}

void ms__req_dispatch(ms_req_t *r)
{
    ms_conn_t *c = r->conn;
    ms_server_t *s = c->server;
    s->stats->in_flight++;
    s->stats->requests++;
    c->requests++;
    r->v.flags |= MS_REQ_IN_HANDLER;
    if (MS_UNLIKELY((s->alogs != NULL) | s->metrics_on))
        r->t0 = uv_hrtime();
    if (MS_UNLIKELY(c->flags & MS_CONN_METRICS))
        r->v.flags |= MS_REQ_METRICS;
    if (MS_UNLIKELY(r->v.id == 0))
        s->id_prefix[0] = 0; /* the counter wrapped: request ids take a new prefix */
    ms__conn_hold(c); /* the handler's */
    /* (Health first: a load balancer's probe on a plain listener is answered, not sent on.) */
    if (MS_UNLIKELY(s->livez != NULL || s->readyz != NULL) && health(r)) {
        ms_req_finish(r);
        return;
    }
    if (MS_UNLIKELY(c->flags & MS_CONN_REDIRECT)) {
        redirect_https(r);
        ms_req_finish(r);
        return;
    }
    if (s->before_handler != NULL && s->before_handler(r) == 0) {
        ms_req_finish(r);
        return;
    }
    ms__server_call(s, s->on_request, r);
}

/* The target as path and query. An absolute form ("http://host/p?q", RFC 9112 3.2.2) is
 * read as its path; an empty path is "/". */
void ms__req_split_target(ms_req_t *r)
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

void ms__req_headers_grow(ms_req_t *r)
{
    int cap = r->headers_cap * 2;
    ms_header_t *a = ms_pool_alloc(&r->pool, (size_t)cap * sizeof(*a));
    memcpy(a, r->headers, (size_t)r->v.nheaders * sizeof(*a));
    r->headers = a;
    r->headers_cap = cap;
}

void ms__req_init(ms_req_t *r)
{
    r->headers = r->hdr_inline;
    r->headers_cap = MS_HEADERS_INLINE;
    ms__req_reset(r);
}

void ms__req_reset(ms_req_t *r)
{
    ms_pool_reset(&r->pool);
    memset(&r->v, 0, sizeof(r->v));
    r->v.status = 200;
    r->v.handler = -1;
    r->v.content_length = -1;
    r->headers = r->hdr_inline;
    r->headers_cap = MS_HEADERS_INLINE;
    r->head.base = NULL;
    r->head.len = 0;
    r->res_headers.base = NULL;
    r->res_headers.len = r->res_headers.cap = 0;
    r->res_trailers.base = NULL;
    r->res_trailers.len = r->res_trailers.cap = 0;
    r->trailers = NULL;
    r->ntrailers = r->trailers_cap = 0;
    r->body.len = 0;
    r->body_seen = 0;
    r->refused = 0;
    r->tunnel = NULL;
    r->t0 = r->bytes_out = 0;
    r->head_in = 0;
    r->alog = 0;
    r->logged = 0;
    r->route_ix = 0;
    r->counted = 0;
    r->route.base = NULL;
    r->route.len = 0;
}

void ms__req_wake(ms_req_t *r, int wait)
{
    assert(wait != MS_WAIT_NONE);
    if (r->v.wait != wait)
        return;
    /* Only a handler that is still running may wait, and its request holds the connection. */
    assert((r->v.flags & MS_REQ_IN_HANDLER) && r->conn->refs > 0);
    r->v.wait = MS_WAIT_NONE;
    ms_server_t *s = r->conn->server;
    if (r->body_wait_timed) {
        r->body_wait_timed = 0;
        ms_timer_stop(s, &r->timer);
    }
    ms__server_call(s, s->on_resume, r);
}

void ms__req_tunnel_end(ms_req_t *r, int status)
{
    ms_tunnel_t *t = r->tunnel;
    if (t != NULL) {
        r->tunnel = NULL;
        t->on_end(t, status);
    }
}

void ms__req_abort(ms_req_t *r)
{
    r->v.flags |= MS_REQ_ABORTED;
    if (r->tunnel != NULL) {
        ms__req_tunnel_end(r, MS_ECLOSED); /* its taker hears it (and may let go of `r`) */
        return;
    }
    if (r->v.wait == MS_WAIT_BODY || r->v.wait == MS_WAIT_DRAIN)
        ms__req_wake(r, r->v.wait);
}

const char *ms_req_tls(ms_req_t *r)
{
    const ms_io_t *io = r->conn->io;
    return io->tls != NULL ? io->tls(r->conn) : NULL;
}

const ms_str_t *ms_req_header(ms_req_t *r, const char *name, size_t len)
{
    for (int i = 0; i < r->v.nheaders; i++) {
        const ms_header_t *h = &r->headers[i];
        if (h->name.len == len && ms__ieq(h->name.base, name, len))
            return &h->value;
    }
    return NULL;
}

const ms_str_t *ms_req_trailer(ms_req_t *r, const char *name, size_t len)
{
    for (int i = 0; i < r->ntrailers; i++) {
        const ms_header_t *h = &r->trailers[i];
        if (h->name.len == len && ms__ieq(h->name.base, name, len))
            return &h->value;
    }
    return NULL;
}

void ms__req_add_trailer(ms_req_t *r, const char *name, size_t nlen, const char *value, size_t vlen)
{
    if (r->ntrailers == r->trailers_cap) {
        int cap = r->trailers_cap ? r->trailers_cap * 2 : 4;
        ms_header_t *a = ms_pool_alloc(&r->pool, (size_t)cap * sizeof(*a));
        if (r->ntrailers > 0)
            memcpy(a, r->trailers, (size_t)r->ntrailers * sizeof(*a));
        r->trailers = a;
        r->trailers_cap = cap;
    }
    char *p = ms_pool_alloc(&r->pool, nlen + vlen + 1);
    memcpy(p, name, nlen);
    memcpy(p + nlen, value, vlen);
    p[nlen + vlen] = 0;
    ms_header_t *h = &r->trailers[r->ntrailers++];
    h->name.base = p;
    h->name.len = nlen;
    h->value.base = p + nlen;
    h->value.len = vlen;
}

/* -- Parking ----------------------------------------------------------------------------- */

static inline void rebase(ms_str_t *s, const char *from, size_t len, ptrdiff_t delta)
{
    if (s->base >= from && s->base < from + len)
        s->base += delta;
}

void ms_req_park(ms_req_t *r)
{
    if (r->v.flags & MS_REQ_PARKED)
        return;
    r->v.flags |= MS_REQ_PARKED;
    const char *from = r->head.base;
    size_t len = r->head.len;
    char *to = ms_pool_alloc(&r->pool, len);
    memcpy(to, from, len);
    ptrdiff_t d = to - from;
    rebase(&r->v.method, from, len, d);
    rebase(&r->v.target, from, len, d);
    rebase(&r->v.path, from, len, d);
    rebase(&r->v.query, from, len, d);
    for (int i = 0; i < r->v.nheaders; i++) {
        rebase(&r->headers[i].name, from, len, d);
        rebase(&r->headers[i].value, from, len, d);
    }
    r->head.base = to;
}

/* -- Reply ------------------------------------------------------------------------------- */

/* Room for `need` more bytes of reply fields (or trailers: `b`), in the request's pool. */
static char *reserve_in(ms_req_t *r, ms_buf_t *b, size_t need)
{
    if (b->cap - b->len < need) {
        size_t cap = b->cap ? b->cap * 2 : 512;
        while (cap - b->len < need)
            cap *= 2;
        char *p = ms_pool_alloc(&r->pool, cap);
        if (b->len)
            memcpy(p, b->base, b->len);
        b->base = p;
        b->cap = cap;
    }
    return b->base + b->len;
}

static inline char *reserve_field(ms_req_t *r, size_t need)
{
    return reserve_in(r, &r->res_headers, need);
}

/* -- Field lines ------------------------------------------------------------------------- */

/* Every field line that enters a reply or its trailers, by whichever call, is checked here:
 * a name that is a token (RFC 9110 5.6.2) and a value with no CR, LF or NUL. A line is then
 * one field for every protocol: no response splitting on HTTP/1.1, and HTTP/2 splits the
 * fields at the same line ends that HTTP/1.1 writes. */

static inline size_t name_span(const char *p, size_t n)
{
    size_t i = 0;
    while (i < n && ms__tchar[(unsigned char)p[i]])
        i++;
    return i;
}

static inline size_t value_span(const char *p, size_t n)
{
    size_t i = 0;
    while (i < n && p[i] != '\r' && p[i] != '\n' && p[i] != 0)
        i++;
    return i;
}

int ms_fields_check(const char *p, size_t len)
{
    while (len > 0) {
        size_t nlen = name_span(p, len);
        if (nlen == 0 || nlen == len || p[nlen] != ':')
            return MS_EBADHEADER;
        size_t vlen = value_span(p + nlen + 1, len - nlen - 1), line = nlen + 1 + vlen + 2;
        if (line > len || p[line - 2] != '\r' || p[line - 1] != '\n')
            return MS_EBADHEADER;
        p += line;
        len -= line;
    }
    return 0;
}

/* Appends "name: value\r\n" to `b`, the name and value checked as above. */
static int add_line(ms_req_t *r, ms_buf_t *b, const char *name, size_t nlen, const char *value,
                    size_t vlen)
{
    if (nlen == 0 || name_span(name, nlen) != nlen || value_span(value, vlen) != vlen)
        return MS_EBADHEADER;
    char *w = reserve_in(r, b, nlen + vlen + 4);
    memcpy(w, name, nlen);
    w += nlen;
    *w++ = ':';
    *w++ = ' ';
    memcpy(w, value, vlen);
    w += vlen;
    *w++ = '\r';
    *w++ = '\n';
    b->len = (size_t)(w - b->base);
    return 0;
}

int ms_reply_trailer(ms_req_t *r, const char *name, size_t nlen, const char *value, size_t vlen)
{
    if (r->v.flags & MS_REQ_DONE)
        return MS_ESENT;
    /* Fields that frame or route the message have no place after it (RFC 9110 6.5.1). */
    static const char *const framing[] = {
        "content-length", "transfer-encoding", "host", "content-type",
        "trailer",        "connection",        "te"};
    for (size_t i = 0; i < sizeof(framing) / sizeof(*framing); i++)
        if (nlen == strlen(framing[i]) && ms__ieq(name, framing[i], nlen))
            return MS_ERESERVED;
    return add_line(r, &r->res_trailers, name, nlen, value, vlen);
}

int ms_reply_header(ms_req_t *r, const char *name, size_t nlen, const char *value, size_t vlen)
{
    if (r->v.flags & MS_REQ_HEAD_SENT)
        return MS_ESENT;
    if ((nlen == 14 && ms__ieq(name, "content-length", 14)) ||
        (nlen == 17 && ms__ieq(name, "transfer-encoding", 17)) ||
        (nlen == 4 && ms__ieq(name, "date", 4)))
        return MS_ERESERVED;
    if (nlen == 10 && ms__ieq(name, "connection", 10)) {
        if (vlen == 5 && ms__ieq(value, "close", 5)) {
            r->v.flags |= MS_REQ_CLOSE;
            return 0;
        }
        return MS_ERESERVED;
    }
    return add_line(r, &r->res_headers, name, nlen, value, vlen);
}

int ms_reply_field(ms_req_t *r, const char *line, size_t len)
{
    if (r->v.flags & MS_REQ_HEAD_SENT)
        return MS_ESENT;
    if (MS_UNLIKELY(ms_fields_check(line, len) != 0))
        return MS_EBADHEADER;
    memcpy(reserve_field(r, len), line, len);
    r->res_headers.len += len;
    return 0;
}

int ms_reply_fields_checked(ms_req_t *r, const char *lines, size_t len)
{
    if (r->v.flags & MS_REQ_HEAD_SENT)
        return MS_ESENT;
    memcpy(reserve_field(r, len), lines, len);
    r->res_headers.len += len;
    return 0;
}

int ms_reply_reset(ms_req_t *r)
{
    if (r->v.flags & MS_REQ_HEAD_SENT)
        return MS_ESENT;
    r->res_headers.len = 0;
    r->v.status = 200;
    return 0;
}

static void drop_anchor(ms_server_t *s, int owner, int32_t anchor)
{
    if (owner == MS_VEC_LUA && anchor >= 0)
        s->anchor_released[s->anchor_released_n++] = anchor;
}

void ms__req_queue_body(ms_req_t *r, ms_out_t *o, const char *p, size_t len, int owner,
                        int32_t anchor)
{
    ms_conn_t *c = r->conn;
    if (owner == MS_VEC_OUT || (len <= MS_COPY_BODY_MAX && owner == MS_VEC_LUA)) {
        ms__out_text(c->server, o, p, len);
        drop_anchor(c->server, owner, anchor);
    } else {
        ms__out_vec(c->server, o, p, len, owner, anchor);
    }
}

static inline int bodyless(const ms_req_t *r)
{
    int st = r->v.status;
    return st < 200 || st == 204 || st == 304;
}

/* What differs between the protocols (how the head leaves, where body pieces queue, how
 * the queue is written) is the protocol's. A read writes once, at its end. */
static inline void reply_head(ms_req_t *r, int64_t clen)
{
    if (MS_UNLIKELY(r->conn->server->id_header))
        ms__req_id_header(r);
    r->conn->proto->reply_head(r, clen);
}

static inline void queue_body(ms_req_t *r, const char *p, size_t len, int owner, int32_t anchor)
{
    r->bytes_out += len;
    ms__req_queue_body(r, r->conn->proto->out(r), p, len, owner, anchor);
}

static inline void flush(ms_conn_t *c)
{
    if (!(c->flags & MS_CONN_IN_FEED))
        c->proto->flush(c);
}

int ms_reply_send(ms_req_t *r, const char *body, size_t len, int owner, int32_t anchor)
{
    ms_conn_t *c = r->conn;
    if (r->v.flags & MS_REQ_HEAD_SENT) {
        drop_anchor(c->server, owner, anchor);
        return MS_ESENT;
    }
    r->v.flags |= MS_REQ_DONE;
    if ((r->v.flags & MS_REQ_ABORTED) || (c->flags & MS_CONN_CLOSED)) {
        r->v.flags |= MS_REQ_HEAD_SENT;
        drop_anchor(c->server, owner, anchor);
        return 0;
    }
    int none = bodyless(r);
    reply_head(r, none ? -2 : (int64_t)len);
    if (!none && !(r->v.flags & MS_REQ_IS_HEAD) && len > 0)
        queue_body(r, body, len, owner, anchor);
    else
        drop_anchor(c->server, owner, anchor);
    flush(c);
    return 0;
}

int ms_reply_begin(ms_req_t *r, uint64_t total)
{
    ms_conn_t *c = r->conn;
    if (r->v.flags & MS_REQ_HEAD_SENT)
        return MS_ESENT;
    r->chain_left = total;
    if ((r->v.flags & MS_REQ_ABORTED) || (c->flags & MS_CONN_CLOSED)) {
        r->v.flags |= MS_REQ_HEAD_SENT;
        return 0;
    }
    reply_head(r, bodyless(r) ? -2 : (int64_t)total);
    return 0;
}

int ms_reply_piece(ms_req_t *r, const char *p, size_t len, int owner, int32_t anchor)
{
    ms_conn_t *c = r->conn;
    if (!(r->v.flags & MS_REQ_HEAD_SENT) || (r->v.flags & MS_REQ_DONE)) {
        drop_anchor(c->server, owner, anchor);
        return MS_ESENT;
    }
    if (len > r->chain_left) {
        drop_anchor(c->server, owner, anchor);
        return MS_ETOOBIG;
    }
    r->chain_left -= len;
    if ((r->v.flags & (MS_REQ_ABORTED | MS_REQ_IS_HEAD)) || (c->flags & MS_CONN_CLOSED) ||
        bodyless(r) || len == 0) {
        drop_anchor(c->server, owner, anchor);
        return 0;
    }
    queue_body(r, p, len, owner, anchor);
    return 0;
}

/* A piece of a chain that is a static file's bytes: sent with sendfile, or from memory. */
int ms__reply_file(ms_req_t *r, ms_file_t *f, uint64_t off, uint64_t len)
{
    ms_conn_t *c = r->conn;
    if (!(r->v.flags & MS_REQ_HEAD_SENT) || (r->v.flags & MS_REQ_DONE))
        return MS_ESENT;
    if (len > r->chain_left)
        return MS_ETOOBIG;
    r->chain_left -= len;
    if ((r->v.flags & (MS_REQ_ABORTED | MS_REQ_IS_HEAD)) || (c->flags & MS_CONN_CLOSED) ||
        bodyless(r))
        return 0;
    r->bytes_out += len;
    return ms__out_file(c->server, c->proto->out(r), f, off, (size_t)len);
}

int ms_reply_end(ms_req_t *r)
{
    ms_conn_t *c = r->conn;
    if (!(r->v.flags & MS_REQ_HEAD_SENT) || (r->v.flags & MS_REQ_DONE))
        return MS_ESENT;
    if (r->chain_left > 0 && !bodyless(r) && !(r->v.flags & MS_REQ_IS_HEAD)) {
        ms_req_fail(r); /* the length promised in the head was not sent: cut it off */
        return MS_ETOOBIG;
    }
    r->v.flags |= MS_REQ_DONE;
    flush(c);
    return 0;
}

int ms_reply_write(ms_req_t *r, const char *chunk, size_t len, int owner, int32_t anchor)
{
    ms_conn_t *c = r->conn;
    ms_server_t *s = c->server;
    if (r->v.flags & MS_REQ_DONE) {
        drop_anchor(s, owner, anchor);
        return MS_ESENT;
    }
    if ((r->v.flags & MS_REQ_ABORTED) || (c->flags & MS_CONN_CLOSED)) {
        r->v.flags |= MS_REQ_HEAD_SENT;
        drop_anchor(s, owner, anchor);
        return MS_ECLOSED;
    }
    if (!(r->v.flags & MS_REQ_HEAD_SENT))
        reply_head(r, bodyless(r) ? -2 : -1);
    if (len == 0 || bodyless(r) || (r->v.flags & MS_REQ_IS_HEAD)) {
        drop_anchor(s, owner, anchor);
        return 0; /* an empty chunk would end the body */
    }
    r->bytes_out += len;
    c->proto->body_piece(r, chunk, len, owner, anchor);
    flush(c);
    return 0;
}

/* -- Tunnels ----------------------------------------------------------------------------- */

int ms_req_tunnel(ms_req_t *r, ms_tunnel_t *t)
{
    ms_conn_t *c = r->conn;
    if (r->v.flags & MS_REQ_HEAD_SENT)
        return MS_ESENT;
    if ((r->v.flags & MS_REQ_ABORTED) || (c->flags & MS_CONN_CLOSED))
        return MS_ECLOSED;
    if (c->proto->tunnel == NULL)
        return MS_ESTATE;
    t->req = r;
    r->tunnel = t;
    c->proto->tunnel(r);
    flush(c);
    ms__conn_idle(c); /* a tunnel idles between writes: its written queue goes back */
    return 0;
}

int ms_req_tunnel_handover(ms_req_t *r)
{
    return r->conn->proto->tunnel_handover;
}

int ms_tunnel_write(ms_tunnel_t *t, const char *p, size_t len, int owner, int32_t anchor)
{
    ms_req_t *r = t->req;
    ms_conn_t *c = r->conn;
    if (r->v.flags & MS_REQ_DONE) {
        drop_anchor(c->server, owner, anchor);
        return MS_ESENT;
    }
    if ((r->v.flags & MS_REQ_ABORTED) || (c->flags & MS_CONN_CLOSED)) {
        drop_anchor(c->server, owner, anchor);
        return MS_ECLOSED;
    }
    if (len == 0) {
        drop_anchor(c->server, owner, anchor);
        return 0;
    }
    r->bytes_out += len;
    c->proto->body_piece(r, p, len, owner, anchor);
    flush(c);
    ms__conn_idle(c);
    return 0;
}

void ms_tunnel_read(ms_tunnel_t *t, int on)
{
    ms_req_t *r = t->req;
    if (!(r->v.flags & MS_REQ_ABORTED) && !(r->conn->flags & MS_CONN_CLOSED))
        r->conn->proto->tunnel_read(r, on);
}

void ms_req_fail(ms_req_t *r)
{
    /* A reply cut short must not look complete: no last chunk, and the connection closes
     * (on HTTP/2, the stream is reset). */
    if ((r->v.flags & MS_REQ_HEAD_SENT) && !(r->v.flags & MS_REQ_DONE))
        r->conn->proto->fail(r);
}

int ms_reply_close(ms_req_t *r)
{
    ms_conn_t *c = r->conn;
    if (!(r->v.flags & MS_REQ_HEAD_SENT) || (r->v.flags & MS_REQ_DONE))
        return MS_ESENT;
    r->v.flags |= MS_REQ_DONE;
    if (!(r->v.flags & MS_REQ_ABORTED) && !(c->flags & MS_CONN_CLOSED)) {
        c->proto->body_end(r);
        flush(c);
    }
    return 0;
}

void ms_req_finish(ms_req_t *r)
{
    ms_conn_t *c = r->conn;
    if (!(r->v.flags & MS_REQ_HEAD_SENT))
        ms_reply_send(r, "", 0, MS_VEC_STATIC, -1);
    else
        ms_reply_close(r);
    r->v.flags &= ~MS_REQ_IN_HANDLER;
    if (r->tunnel != NULL && (r->tunnel->on_handover == NULL || !c->proto->tunnel_handover))
        r->tunnel = NULL; /* (ending it: the taker hears no more) */
    /* (else the protocol's `finished` hands the connection to the taker) */
    c->server->stats->in_flight--;
    r->v.wait = MS_WAIT_NONE;
    r->body.len = 0;
    r->body_wait_timed = 0;
    ms_timer_stop(c->server, &r->timer);
    if (MS_UNLIKELY(c->server->alogs != NULL))
        ms__alog_req(r);
    if (MS_UNLIKELY(c->server->metrics_on))
        ms__metrics_req(r);
    c->proto->finished(r);
}

/* -- Waiting ----------------------------------------------------------------------------- */

int ms_req_body_limit(ms_req_t *r, uint64_t bytes)
{
    const ms_limits_t *l = &r->conn->server->limits;
    uint64_t max = l->body_bytes_max > l->body_bytes ? l->body_bytes_max : l->body_bytes;
    if (bytes > max)
        return MS_ETOOBIG;
    r->body_limit = bytes;
    return 0;
}

/* Whether the body is over this request's limit, declared or received; if so the client
 * gets 413 (once) and the connection closes. */
static int over_limit(ms_req_t *r)
{
    uint64_t declared = r->v.content_length > 0 ? (uint64_t)r->v.content_length : 0;
    if (declared <= r->body_limit && r->body_seen <= r->body_limit)
        return 0;
    if (!(r->v.flags & MS_REQ_BODY_ERROR))
        ms__req_refuse(r, 413, "body larger than the route's body_bytes");
    return 1;
}

int64_t ms_req_body_take(ms_req_t *r, const char **out)
{
    *out = NULL;
    if (r->v.flags & MS_REQ_ABORTED)
        return MS_ECLOSED;
    if (MS_UNLIKELY(over_limit(r)))
        return MS_ETOOBIG;
    if (r->v.flags & MS_REQ_BODY_ERROR)
        return r->refused == 413 || r->body_seen > r->body_limit ? MS_ETOOBIG : MS_EBADREQ;
    size_t n = r->body.len;
    if (n > 0) {
        /* The bytes stay where they are until the core appends again, which happens only
         * after the handler yields; Lua copies them before that. */
        *out = r->body.base;
        r->body.len = 0;
        r->conn->proto->body_taken(r, n);
        return (int64_t)n;
    }
    return (r->v.flags & MS_REQ_BODY_DONE) ? 0 : UV_EAGAIN;
}

int ms_req_wait_body(ms_req_t *r)
{
    ms_conn_t *c = r->conn;
    if (r->v.flags & MS_REQ_ABORTED)
        return MS_ECLOSED;
    if (over_limit(r))
        return MS_ETOOBIG; /* answered 413: the body will not be read */
    if (r->v.wait != MS_WAIT_NONE)
        return MS_EBUSY;
    if (r->v.flags & MS_REQ_EXPECT) {
        /* The client holds the body back until we ask for it. */
        r->v.flags &= ~MS_REQ_EXPECT;
        if (!(r->v.flags & MS_REQ_HEAD_SENT)) {
            c->proto->send_continue(r);
            flush(c);
        }
    }
    ms_req_park(r); /* a wait outlives the read: the head leaves the shared buffer */
    assert(r->v.wait == MS_WAIT_NONE && (r->v.flags & MS_REQ_IN_HANDLER));
    r->v.wait = MS_WAIT_BODY;
    c->proto->body_wait(r); /* (an HTTP/2 stream's body has its own deadline) */
    return 0;
}

static void body_wait_expired(ms_timer_t *t)
{
    ms_req_t *r = container_of(t, ms_req_t, timer);
    ms__req_wake(r, MS_WAIT_BODY);
}

int ms_req_wait_body_for(ms_req_t *r, uint64_t ms)
{
    int rc = ms_req_wait_body(r);
    if (rc == 0 && ms > 0 && r->timer.index == 0) {
        r->body_wait_timed = 1;
        ms_timer_start(r->conn->server, &r->timer, ms, body_wait_expired);
    }
    return rc;
}

static void sleep_done(ms_timer_t *t)
{
    ms_req_t *r = container_of(t, ms_req_t, timer);
    ms__req_wake(r, MS_WAIT_TIMER);
}

int ms_req_sleep(ms_req_t *r, uint64_t ms)
{
    if (r->v.wait != MS_WAIT_NONE)
        return MS_EBUSY;
    ms_req_park(r);
    assert(r->v.flags & MS_REQ_IN_HANDLER);
    r->v.wait = MS_WAIT_TIMER;
    ms_timer_start(r->conn->server, &r->timer, ms, sleep_done);
    return 0;
}

int ms_req_wait_drain(ms_req_t *r, int all)
{
    ms_conn_t *c = r->conn;
    if (r->v.flags & MS_REQ_ABORTED)
        return MS_ECLOSED;
    if (r->v.wait != MS_WAIT_NONE)
        return MS_EBUSY;
    flush(c);
    r->drain_all = (uint8_t)(all != 0);
    if (all ? ms__req_queued(r) == 0 : !ms_reply_congested(r))
        return 1; /* the socket took it: no need to wait */
    ms_req_park(r);
    assert(r->v.wait == MS_WAIT_NONE && (r->v.flags & MS_REQ_IN_HANDLER));
    r->v.wait = MS_WAIT_DRAIN;
    return 0;
}

/* -- Request ids ------------------------------------------------------------------------- */

static const char hex[] = "0123456789abcdef";

/* What an X-Request-Id may hold to be taken: what ids are made of (UUIDs, base64, dotted
 * or colon-separated parts), and nothing a log line or a header would have to escape. */
static int id_ok(const ms_str_t *v)
{
    if (v->len == 0 || v->len > MS_REQ_ID_MAX)
        return 0;
    for (size_t i = 0; i < v->len; i++) {
        unsigned char ch = (unsigned char)v->base[i];
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
              ch == '.' || ch == '_' || ch == ':' || ch == '-' || ch == '@' || ch == '/' ||
              ch == '+' || ch == '='))
            return 0;
    }
    return 1;
}

/* 64 random bits per worker start: two workers, or one started again, never share a
 * prefix in practice (a HUP starts new workers, and a new prefix with them). */
static void draw_prefix(ms_server_t *s)
{
    unsigned char b[8];
    if (uv_random(NULL, NULL, b, sizeof(b), 0, NULL) != 0) {
        uint64_t x = uv_hrtime() ^ ((uint64_t)getpid() << 32);
        memcpy(b, &x, sizeof(b));
    }
    for (int i = 0; i < 8; i++) {
        s->id_prefix[2 * i] = hex[b[i] >> 4];
        s->id_prefix[2 * i + 1] = hex[b[i] & 15];
    }
    s->id_prefix[16] = 0;
}

int ms_req_id(ms_req_t *r, char *buf, size_t len)
{
    ms_server_t *s = r->conn->server;
    if (s->ntrusted > 0 && ms_req_peer_trusted(r)) {
        const ms_str_t *v = ms_req_header(r, "x-request-id", 12);
        if (v != NULL && id_ok(v) && v->len < len) {
            memcpy(buf, v->base, v->len);
            buf[v->len] = 0;
            return (int)v->len;
        }
    }
    if (len < 25)
        return 0;
    if (MS_UNLIKELY(s->id_prefix[0] == 0))
        draw_prefix(s);
    memcpy(buf, s->id_prefix, 16);
    uint32_t n = r->v.id;
    for (int i = 7; i >= 0; i--, n >>= 4)
        buf[16 + i] = hex[n & 15];
    buf[24] = 0;
    return 24;
}

void ms__req_id_header(ms_req_t *r)
{
    char id[MS_REQ_ID_MAX + 1];
    int n = ms_req_id(r, id, sizeof(id));
    ms_reply_header(r, "x-request-id", 12, id, (size_t)n);
}

void ms_server_request_id_header(ms_server_t *s, int on)
{
    s->id_header = on != 0;
}
