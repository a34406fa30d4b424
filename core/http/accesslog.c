/* accesslog.c: the access log, a line per request formatted in the worker and written on
 * libuv's thread pool. */
#include "http/accesslog.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "process/channel.h"
#include "http/http.h"

static const char hex[] = "0123456789abcdef";

/* -- Formats ----------------------------------------------------------------------------- */

enum { FMT_COMBINED, FMT_JSON, FMT_TEMPLATE };

/* The fields of a template ($name or ${name}); F_TEXT is a literal part. */
#define MS_ALOG_FIELDS(X)                                                                          \
    X(TIME, "time")                                                                                \
    X(TIME_LOCAL, "time_local")                                                                    \
    X(CLIENT, "client")                                                                            \
    X(METHOD, "method")                                                                            \
    X(TARGET, "target")                                                                            \
    X(REQUEST, "request")                                                                          \
    X(STATUS, "status")                                                                            \
    X(BYTES_IN, "bytes_in")                                                                        \
    X(BYTES_OUT, "bytes_out")                                                                      \
    X(DURATION, "duration")                                                                        \
    X(PROTOCOL, "protocol")                                                                        \
    X(TLS, "tls")                                                                                  \
    X(REQUEST_ID, "request_id")                                                                    \
    X(ROUTE, "route")                                                                              \
    X(REFERER, "referer")                                                                          \
    X(USER_AGENT, "user_agent")

enum {
    F_TEXT,
#define F_ENUM(name, text) F_##name,
    MS_ALOG_FIELDS(F_ENUM)
#undef F_ENUM
};

static const char *const field_names[] = {
    "",
#define F_NAME(name, text) text,
    MS_ALOG_FIELDS(F_NAME)
#undef F_NAME
};

typedef struct piece_s {
    uint8_t field;
    uint32_t off, len; /* F_TEXT: the literal in the log's `text` */
} piece_t;

typedef struct ms_alog_s {
    ms_server_t *server;
    char *path; /* owned; NULL: stdout */
    int fd;
    int format;
    piece_t *pieces; /* FMT_TEMPLATE's, owned */
    int npieces;
    char *text;             /* the template's literals, owned */
    char *gather, *flight;  /* MS_ALOG_BUF each, owned: lines being gathered, being written */
    size_t glen, flen, foff;
    uint32_t glines, flines;
    uv_fs_t req;
    ms_timer_t timer; /* the write of lines that gathered slowly */
    uint8_t writing, reopen, dropping;
    uint8_t wants_client, wants_id, wants_fields; /* what the template shows */
    uint64_t dropped, dropped_told;
} ms_alog_t;

/* A worker's access logs, by id; made when the first is added (ms_server_t.alogs). */
struct ms_alogs_s {
    ms_alog_t *log[MS_ALOG_MAX];
    uint8_t dflt; /* the default log's id + 1; 0: none */
};

static const char combined[] =
    "$client - - [$time_local] \"$request\" $status $bytes_out \"$referer\" \"$user_agent\"";

/* Compiles a template into pieces; returns 0, or MS_EBADREQ with `*why` set. */
static int compile(ms_alog_t *l, const char *t, const char **why)
{
    size_t n = strlen(t);
    l->text = ms_mem_alloc(n + 1);
    memcpy(l->text, t, n + 1);
    l->pieces = ms_mem_alloc(sizeof(piece_t) * (n + 1));
    l->npieces = 0;
    size_t i = 0;
    while (i < n) {
        piece_t *p = &l->pieces[l->npieces++];
        if (t[i] != '$' || t[i + 1] == '$') {
            size_t j = i + (t[i] == '$' ? 1 : 0); /* "$$" is a "$" */
            p->field = F_TEXT;
            p->off = (uint32_t)j;
            size_t k = j + 1;
            while (k < n && t[k] != '$')
                k++;
            p->len = (uint32_t)(k - j);
            i = k;
            continue;
        }
        int braced = t[i + 1] == '{';
        size_t s0 = i + 1 + (size_t)braced, e = s0;
        while (e < n && ((t[e] >= 'a' && t[e] <= 'z') || t[e] == '_'))
            e++;
        if (braced && (e >= n || t[e] != '}')) {
            *why = "a ${ without its }";
            return MS_EBADREQ;
        }
        p->field = F_TEXT;
        for (size_t f = 1; f < sizeof(field_names) / sizeof(*field_names); f++)
            if (strlen(field_names[f]) == e - s0 && memcmp(field_names[f], t + s0, e - s0) == 0)
                p->field = (uint8_t)f;
        l->wants_client |= p->field == F_CLIENT;
        l->wants_id |= p->field == F_REQUEST_ID;
        l->wants_fields |= p->field == F_REFERER || p->field == F_USER_AGENT;
        if (p->field == F_TEXT) {
            *why = "unknown field (time, time_local, client, method, target, request, status, "
                   "bytes_in, bytes_out, duration, protocol, tls, request_id, route, referer, "
                   "user_agent)";
            return MS_EBADREQ;
        }
        i = e + (size_t)braced;
    }
    return 0;
}

/* -- Lines ------------------------------------------------------------------------------- */

/* Bytes that stand as they are in a line of either kind: printable ASCII but '"' and '\'. */
static uint8_t plain[256];

static void plain_init(void)
{
    for (int ch = 0x20; ch < 0x7f; ch++)
        plain[ch] = ch != '"' && ch != '\\';
}

/* The length of the run of plain bytes at p[0..n). */
static inline size_t plain_run(const char *p, size_t n)
{
    size_t i = 0;
    while (i < n && plain[(unsigned char)p[i]])
        i++;
    return i;
}

/* Bytes as a text log shows them (nginx's rule): '"', '\' and bytes outside printable ASCII
 * as \xHH, so that a line is one line and a field ends at its quote. */
static char *put_text(char *w, char *end, const char *p, size_t n)
{
    for (size_t i = 0; i < n && w + 4 <= end;) {
        size_t k = plain_run(p + i, n - i);
        if (k > 0) {
            if (k > (size_t)(end - w))
                k = (size_t)(end - w);
            memcpy(w, p + i, k);
            w += k;
            i += k;
        } else {
            unsigned char ch = (unsigned char)p[i++];
            *w++ = '\\';
            *w++ = 'x';
            *w++ = hex[ch >> 4];
            *w++ = hex[ch & 15];
        }
    }
    return w;
}

/* The length of the UTF-8 sequence at p[0..n), or 0 if it is not a well-formed one. */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    size_t len = p[0] >= 0xf0 && p[0] <= 0xf4 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc2 ? 2 : 0;
    if (len == 0 || len > n || p[0] > 0xf4)
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0) ||
        (p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90))
        return 0; /* overlong, a surrogate, past U+10FFFF */
    return len;
}

/* A JSON string's contents: well-formed UTF-8 as it is; '"', '\' and control characters
 * escaped; a byte that is not UTF-8 as the code point of its value (\u00HH), so the line
 * stays valid JSON whatever a client sends. */
static char *put_json(char *w, char *end, const char *p, size_t n)
{
    for (size_t i = 0; i < n && w + 6 <= end;) {
        unsigned char ch = (unsigned char)p[i];
        size_t k = plain_run(p + i, n - i);
        if (k > 0) {
            if (k > (size_t)(end - w))
                k = (size_t)(end - w);
            memcpy(w, p + i, k);
            w += k;
            i += k;
        } else if (ch == '"' || ch == '\\') {
            *w++ = '\\';
            *w++ = (char)ch;
            i++;
        } else if (ch >= 0x80 && (k = utf8_len((const unsigned char *)p + i, n - i)) > 0) {
            memcpy(w, p + i, k);
            w += k;
            i += k;
        } else {
            memcpy(w, "\\u00", 4);
            w[4] = hex[ch >> 4];
            w[5] = hex[ch & 15];
            w += 6;
            i++;
        }
    }
    return w;
}

static char *put_raw(char *w, char *end, const char *p, size_t n)
{
    if (n > (size_t)(end - w))
        n = (size_t)(end - w);
    memcpy(w, p, n);
    return w + n;
}

static char *put_u64(char *w, char *end, uint64_t v)
{
    if (end - w < 20)
        return w;
    return ms__put_u64(w, v);
}

/* Milliseconds with microseconds: "12.345". */
static char *put_ms(char *w, char *end, uint64_t us)
{
    if (end - w < 28)
        return w;
    w = ms__put_u64(w, us / 1000);
    *w++ = '.';
    unsigned frac = (unsigned)(us % 1000);
    *w++ = (char)('0' + frac / 100);
    *w++ = (char)('0' + frac / 10 % 10);
    *w++ = (char)('0' + frac % 10);
    return w;
}

/* What a line says of a request; the costlier facts (the client's address, the id, the
 * duration, fields looked up) are made by the formats that show them. */
typedef struct facts_s {
    struct timespec ts;
    const ms_now_text_t *now; /* the local time's texts of ts's second */
    char client[64];
    int client_len;
    char id[MS_REQ_ID_MAX + 1];
    int id_len;
    int status;
    uint64_t in, out, us;
    const char *proto;
    const char *tls; /* "TLSv1.3", NULL over plain TCP */
    const ms_str_t *referer, *agent;
} facts_t;

static void client_of(ms_req_t *r, facts_t *f)
{
    f->client_len = ms_req_client_ip(r, f->client, sizeof(f->client));
}

static void id_of(ms_req_t *r, facts_t *f)
{
    f->id_len = ms_req_id(r, f->id, sizeof(f->id));
}

static uint64_t micros(ms_req_t *r)
{
    return r->t0 ? (uv_hrtime() - r->t0) / 1000 : 0;
}

/* The Referer and User-Agent fields, in one pass over the head. */
static void fields_of(ms_req_t *r, facts_t *f)
{
    f->referer = f->agent = NULL;
    for (int i = 0; i < r->v.nheaders; i++) {
        const ms_header_t *h = &r->headers[i];
        if (f->referer == NULL && h->name.len == 7 && ms__ieq(h->name.base, "referer", 7))
            f->referer = &h->value;
        else if (f->agent == NULL && h->name.len == 10 && ms__ieq(h->name.base, "user-agent", 10))
            f->agent = &h->value;
    }
}

static void gather_facts(ms_req_t *r, facts_t *f)
{
    f->now = ms__now_texts(&f->ts);
    f->status = r->refused ? r->refused : r->v.status;
    f->in = (r->head.len ? r->head.len : r->head_in) + r->body_seen;
    f->out = r->bytes_out;
    /* (A head refused before its request line was read has no version: HTTP/2 streams
     * always have theirs, so it is HTTP/1.1's.) */
    f->proto = r->v.version == 20 ? "HTTP/2" : r->v.version == 10 ? "HTTP/1.0" : "HTTP/1.1";
    f->tls = ms_req_tls(r);
}

/* A text field: its value escaped, or "-" when it has none. */
static char *put_field(char *w, char *end, const char *p, size_t n)
{
    return n > 0 ? put_text(w, end, p, n) : put_raw(w, end, "-", 1);
}

static char *put_template(const ms_alog_t *l, char *w, char *end, ms_req_t *r, facts_t *f)
{
    if (l->wants_client)
        client_of(r, f);
    if (l->wants_id)
        id_of(r, f);
    if (l->wants_fields)
        fields_of(r, f);
    for (int i = 0; i < l->npieces; i++) {
        const piece_t *p = &l->pieces[i];
        const ms_str_t *v;
        switch (p->field) {
        case F_TEXT: w = put_raw(w, end, l->text + p->off, p->len); break;
        case F_TIME:
            w = put_raw(w, end, f->now->iso, (size_t)f->now->iso_len);
            if (end - w > 4) {
                int ms = (int)(f->ts.tv_nsec / 1000000);
                *w++ = '.';
                *w++ = (char)('0' + ms / 100);
                *w++ = (char)('0' + ms / 10 % 10);
                *w++ = (char)('0' + ms % 10);
            }
            w = put_raw(w, end, f->now->off, (size_t)f->now->off_len);
            break;
        case F_TIME_LOCAL:
            w = put_raw(w, end, f->now->clf, (size_t)f->now->clf_len);
            break;
        case F_CLIENT: w = put_field(w, end, f->client, (size_t)f->client_len); break;
        case F_METHOD: w = put_field(w, end, r->v.method.base, r->v.method.len); break;
        case F_TARGET: w = put_field(w, end, r->v.target.base, r->v.target.len); break;
        case F_REQUEST:
            if (r->v.method.len == 0) {
                w = put_raw(w, end, "-", 1);
                break;
            }
            w = put_text(w, end, r->v.method.base, r->v.method.len);
            w = put_raw(w, end, " ", 1);
            w = put_field(w, end, r->v.target.base, r->v.target.len);
            w = put_raw(w, end, " ", 1);
            w = put_field(w, end, f->proto, strlen(f->proto));
            break;
        case F_STATUS: w = put_u64(w, end, (uint64_t)f->status); break;
        case F_BYTES_IN: w = put_u64(w, end, f->in); break;
        case F_BYTES_OUT: w = put_u64(w, end, f->out); break;
        case F_DURATION: w = put_ms(w, end, micros(r)); break;
        case F_PROTOCOL: w = put_field(w, end, f->proto, strlen(f->proto)); break;
        case F_TLS: w = put_field(w, end, f->tls, f->tls ? strlen(f->tls) : 0); break;
        case F_REQUEST_ID: w = put_field(w, end, f->id, (size_t)f->id_len); break;
        case F_ROUTE: w = put_field(w, end, r->route.base, r->route.len); break;
        case F_REFERER:
            v = f->referer;
            w = put_field(w, end, v ? v->base : NULL, v ? v->len : 0);
            break;
        case F_USER_AGENT:
            v = f->agent;
            w = put_field(w, end, v ? v->base : NULL, v ? v->len : 0);
            break;
        }
    }
    return w;
}

/* "key":"value" (or "key":null when there is none), with the comma before it. */
static char *put_jstr(char *w, char *end, const char *key, const char *p, size_t n, int null)
{
    w = put_raw(w, end, key, strlen(key));
    if (null)
        return put_raw(w, end, "null", 4);
    w = put_raw(w, end, "\"", 1);
    w = put_json(w, end, p, n);
    return put_raw(w, end, "\"", 1);
}

static char *put_json_line(char *w, char *end, ms_req_t *r, facts_t *f)
{
    client_of(r, f);
    id_of(r, f);
    fields_of(r, f);
    f->us = micros(r);
    char t[128];
    int tn = snprintf(t, sizeof(t), "%s.%03d%s", f->now->iso, (int)(f->ts.tv_nsec / 1000000),
                      f->now->off);
    w = put_jstr(w, end, "{\"time\":", t, (size_t)tn, 0);
    w = put_jstr(w, end, ",\"client\":", f->client, (size_t)f->client_len, 0);
    w = put_jstr(w, end, ",\"method\":", r->v.method.base, r->v.method.len, 0);
    w = put_jstr(w, end, ",\"target\":", r->v.target.base, r->v.target.len, 0);
    w = put_raw(w, end, ",\"status\":", 10);
    w = put_u64(w, end, (uint64_t)f->status);
    w = put_raw(w, end, ",\"bytes_in\":", 12);
    w = put_u64(w, end, f->in);
    w = put_raw(w, end, ",\"bytes_out\":", 13);
    w = put_u64(w, end, f->out);
    w = put_raw(w, end, ",\"duration\":", 12);
    w = put_ms(w, end, f->us);
    w = put_jstr(w, end, ",\"protocol\":", f->proto, strlen(f->proto), 0);
    w = put_jstr(w, end, ",\"tls\":", f->tls, f->tls ? strlen(f->tls) : 0, f->tls == NULL);
    w = put_jstr(w, end, ",\"request_id\":", f->id, (size_t)f->id_len, 0);
    w = put_jstr(w, end, ",\"route\":", r->route.base, r->route.len, r->route.len == 0);
    w = put_jstr(w, end, ",\"referer\":", f->referer ? f->referer->base : NULL,
                 f->referer ? f->referer->len : 0, f->referer == NULL);
    w = put_jstr(w, end, ",\"user_agent\":", f->agent ? f->agent->base : NULL,
                 f->agent ? f->agent->len : 0, f->agent == NULL);
    return put_raw(w, end, "}", 1);
}

/* -- Writing ----------------------------------------------------------------------------- */

static const char *log_name(const ms_alog_t *l)
{
    return l->path ? l->path : "stdout";
}

static void reopen_now(ms_alog_t *l)
{
    l->reopen = 0;
    if (l->path == NULL)
        return;
    char why[512];
    int fd = ms_chan_open(l->path, 1, why, sizeof(why)); /* (a worker's: through its master) */
    if (fd < 0) {
        ms_log(MS_LOG_WARN, "access log %s: cannot reopen (%s); writing to the old file", l->path,
               why[0] != '\0' ? why : strerror(-fd));
        return;
    }
    close(l->fd);
    l->fd = fd;
}

static void start_write(ms_alog_t *l);

static void write_cb(uv_fs_t *req)
{
    ms_alog_t *l = req->data;
    ssize_t n = req->result;
    uv_fs_req_cleanup(req);
    if (n < 0) {
        l->dropped += l->flines;
        if (!l->dropping)
            ms_log(MS_LOG_WARN, "access log %s: %s; lines are dropped until it can write again",
                   log_name(l), uv_strerror((int)n));
        l->dropping = 1;
    } else {
        l->foff += (size_t)n;
        if (l->foff < l->flen && n > 0) { /* a short write: the rest */
            uv_buf_t b = uv_buf_init(l->flight + l->foff, (unsigned)(l->flen - l->foff));
            if (uv_fs_write(l->server->loop, &l->req, l->fd, &b, 1, -1, write_cb) == 0)
                return;
        }
        if (l->dropping) {
            ms_log(MS_LOG_WARN, "access log %s: writing again; %llu lines were dropped",
                   log_name(l), (unsigned long long)(l->dropped - l->dropped_told));
            l->dropped_told = l->dropped;
            l->dropping = 0;
        }
    }
    l->writing = 0;
    l->flen = l->foff = 0;
    l->flines = 0;
    if (l->reopen)
        reopen_now(l);
    if (l->glen > 0)
        start_write(l);
}

/* Hands what has gathered to the thread pool: at most one write is in flight, so lines
 * stay in order and a slow disk holds one buffer, not a queue of them. */
static void start_write(ms_alog_t *l)
{
    if (l->writing || l->glen == 0)
        return;
    ms_timer_stop(l->server, &l->timer);
    char *t = l->flight;
    l->flight = l->gather;
    l->gather = t;
    l->flen = l->glen;
    l->flines = l->glines;
    l->foff = 0;
    l->glen = 0;
    l->glines = 0;
    l->req.data = l;
    uv_buf_t b = uv_buf_init(l->flight, (unsigned)l->flen);
    int rc = uv_fs_write(l->server->loop, &l->req, l->fd, &b, 1, -1, write_cb);
    if (rc < 0) {
        l->dropped += l->flines;
        l->flen = l->flines = 0;
        return;
    }
    l->writing = 1;
}

static void flush_due(ms_timer_t *t)
{
    start_write(container_of(t, ms_alog_t, timer));
}

void ms__alog_req(ms_req_t *r)
{
    ms_server_t *s = r->conn->server;
    if (r->logged)
        return;
    r->logged = 1;
    int id = r->alog == 0 ? (int)s->alogs->dflt - 1 : r->alog - 1;
    if (id < 0 || id >= MS_ALOG_MAX || s->alogs->log[id] == NULL)
        return;
    ms_alog_t *l = s->alogs->log[id];
    if (MS_ALOG_BUF - l->glen < MS_ALOG_LINE_MAX) {
        l->dropped++;
        if (!l->dropping)
            ms_log(MS_LOG_WARN,
                   "access log %s: buffer full (the disk is slow); lines are dropped until it "
                   "catches up",
                   log_name(l));
        l->dropping = 1;
        return;
    }
    facts_t f;
    gather_facts(r, &f);
    char *w0 = l->gather + l->glen, *end = w0 + MS_ALOG_LINE_MAX - 1, *w;
    w = l->format == FMT_JSON ? put_json_line(w0, end, r, &f) : put_template(l, w0, end, r, &f);
    *w++ = '\n';
    l->glen += (size_t)(w - w0);
    l->glines++;
    if (l->writing)
        return;
    if (l->glen >= MS_ALOG_FLUSH_BYTES)
        start_write(l);
    else if (l->timer.index == 0)
        ms_timer_start(s, &l->timer, MS_ALOG_FLUSH_MS, flush_due);
}

/* -- Logs -------------------------------------------------------------------------------- */

static void alog_free(ms_alog_t *l)
{
    ms_mem_free(l->path);
    ms_mem_free(l->pieces);
    ms_mem_free(l->text);
    ms_mem_free(l->gather);
    ms_mem_free(l->flight);
    ms_mem_free(l);
}

int ms_server_access_log(ms_server_t *s, const char *path, const char *format, const char **why)
{
    *why = NULL;
    if (s->alogs == NULL) {
        s->alogs = ms_mem_alloc(sizeof(*s->alogs));
        memset(s->alogs, 0, sizeof(*s->alogs));
    }
    int id = 0;
    while (id < MS_ALOG_MAX && s->alogs->log[id] != NULL)
        id++;
    if (id == MS_ALOG_MAX) {
        *why = "too many access logs";
        return MS_EBADREQ;
    }
    if (!plain['a'])
        plain_init();
    ms_alog_t *l = ms_mem_alloc(sizeof(*l));
    memset(l, 0, sizeof(*l));
    l->server = s;
    l->fd = 1;
    if (format == NULL || strcmp(format, "combined") == 0) {
        l->format = FMT_COMBINED;
        format = combined;
    } else if (strcmp(format, "json") == 0) {
        l->format = FMT_JSON;
    } else {
        l->format = FMT_TEMPLATE;
    }
    if (l->format != FMT_JSON) {
        int rc = compile(l, format, why);
        if (rc < 0) {
            alog_free(l);
            return rc;
        }
    }
    if (path != NULL && strcmp(path, "-") != 0) {
        char msg[512];
        l->fd = ms_chan_open(path, 1, msg, sizeof(msg)); /* (a worker's: through its master) */
        if (l->fd < 0) {
            int err = -l->fd;
            if (msg[0] != '\0')
                ms_log(MS_LOG_ERR, "%s", msg);
            alog_free(l);
            return uv_translate_sys_error(err);
        }
        size_t n = strlen(path);
        l->path = ms_mem_alloc(n + 1);
        memcpy(l->path, path, n + 1);
    }
    l->gather = ms_mem_alloc(MS_ALOG_BUF);
    l->flight = ms_mem_alloc(MS_ALOG_BUF);
    s->alogs->log[id] = l;
    return id;
}

void ms_server_access_default(ms_server_t *s, int id)
{
    if (s->alogs != NULL)
        s->alogs->dflt = id >= 0 && id < MS_ALOG_MAX && s->alogs->log[id] ? (uint8_t)(id + 1) : 0;
}

void ms_server_access_reopen(ms_server_t *s)
{
    for (int i = 0; s->alogs != NULL && i < MS_ALOG_MAX; i++) {
        ms_alog_t *l = s->alogs->log[i];
        if (l == NULL || l->path == NULL)
            continue;
        if (l->writing)
            l->reopen = 1;
        else
            reopen_now(l);
    }
}

uint64_t ms_server_access_dropped(ms_server_t *s, int id)
{
    if (s->alogs == NULL || id < 0 || id >= MS_ALOG_MAX || s->alogs->log[id] == NULL)
        return 0;
    return s->alogs->log[id]->dropped;
}

int ms_server_access_busy(ms_server_t *s)
{
    for (int i = 0; s->alogs != NULL && i < MS_ALOG_MAX; i++)
        if (s->alogs->log[i] != NULL && s->alogs->log[i]->writing)
            return 1;
    return 0;
}

void ms_req_access(ms_req_t *r, int log, const char *route, size_t len)
{
    if (log >= -1 && log < MS_ALOG_MAX)
        r->alog = (int8_t)(log + 1 == 0 ? -1 : log + 1);
    if (route != NULL && len > 0) {
        if (len > 256)
            len = 256;
        char *p = ms_pool_alloc(&r->pool, len);
        memcpy(p, route, len);
        r->route.base = p;
        r->route.len = len;
    }
}

void ms__alog_free(ms_server_t *s)
{
    if (s->alogs == NULL)
        return;
    for (int i = 0; i < MS_ALOG_MAX; i++) {
        ms_alog_t *l = s->alogs->log[i];
        if (l == NULL)
            continue;
        while (l->writing) /* its uv_fs_t lives in `l` */
            uv_run(s->loop, UV_RUN_ONCE);
        ms_timer_stop(s, &l->timer);
        /* The last lines, written here: the worker is on its way out. */
        for (size_t off = 0; off < l->glen;) {
            ssize_t n = write(l->fd, l->gather + off, l->glen - off);
            if (n <= 0)
                break;
            off += (size_t)n;
        }
        if (l->path != NULL)
            close(l->fd);
        alog_free(l);
    }
    ms_mem_free(s->alogs);
    s->alogs = NULL;
}

const ms_part_t ms__alog_part = {.name = "access log", .worker_free = ms__alog_free};
