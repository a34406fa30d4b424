/* h2.c: HTTP/2 with nghttp2. Each stream is a request like an HTTP/1.1 one (ms_req_t, the
 * same dispatch, the same reply calls); what differs is where the bytes go. A stream's reply
 * pieces wait in its own queue; nghttp2 frames them when the client's windows allow, and the
 * send-data callback moves them, uncopied, into the connection's queue behind their frame
 * header, so the connection's one gathered write carries frames of every stream. */
#include <nghttp2/nghttp2.h>
#include <stdio.h>
#include <sys/mman.h>

#include "http/http.h"

/* What a server advertises, and what a connection may do before it is told to go away. */
#define H2_MAX_STREAMS       100
#define H2_WINDOW            (256 * 1024) /* per stream: what an unread body may reach */
#define H2_RESET_BURST       1000         /* Rapid Reset: streams a client may reset at once */
#define H2_RESET_RATE        33           /* ... and per second after that */
#define H2_MAX_CONTINUATIONS 8
#define H2_MAX_SETTINGS      32 /* entries in one SETTINGS frame */
#define H2_MAX_OUTBOUND_ACK  1000
/* Protocol glitches (frames on closed streams, zero window updates, empty DATA frames,
 * streams we had to reset) a connection may make before it gets GOAWAY. */
#define H2_GLITCHES_MAX 1000
/* What the frame pre-scan looks at of each frame: the 9-byte header, a pad length and a
 * stream dependency. */
#define H2_SCAN_HEAD 14
/* What the pre-scan returns when it has answered a connection error itself (GOAWAY queued,
 * logged): no NGHTTP2_ERR_* is -1. */
#define H2_ANSWERED (-1)

/* Closed streams (RFC 9113 5.1): nghttp2 forgets a stream once it closes
 * (no_closed_streams, which keeps its memory flat), so for the client's last H2_CLOSED_IDS
 * stream ids the connection keeps 2 bits each of how they closed, enough to answer a frame
 * that still comes on one. An older id is answered as a stream we reset: ignored. */
#define H2_CLOSED_IDS 64
enum {
    CLOSED_OTHER,  /* open, older than the window, or reset by us: ignore its frames (5.1) */
    CLOSED_ENDED,  /* both sides ended it: DATA or HEADERS is a connection STREAM_CLOSED */
    CLOSED_RESET,  /* the client reset it: DATA or HEADERS is a stream STREAM_CLOSED */
    CLOSED_UNUSED, /* skipped by a higher id, never opened: HEADERS is a PROTOCOL_ERROR */
};

/* A stream whose reply is complete before the client ended its side (DISCARD_*). */
enum { DISCARD_NONE, DISCARD_ON, DISCARD_OVER };

typedef struct ms_stream_s ms_stream_t;

/* A stopping server's two GOAWAYs: a notice (the largest stream id) and a PING, then, once the
 * PING comes back (or after H2_NOTICE_MS, for a client that does not answer), the last stream
 * id taken: streams the client sent before it saw the notice are served, not refused. */
enum { GOAWAY_NONE, GOAWAY_NOTICE, GOAWAY_SENT };
#define H2_NOTICE_MS 1000

typedef struct ms_h2_s {
    nghttp2_session *ng;
    ms_conn_t *conn;
    ms_stream_t *streams; /* open, or held by a handler */
    uint32_t nstreams;
    uint32_t glitches;
    uint8_t going_away;    /* GOAWAY_* */
    ms_timer_t notice;     /* the last GOAWAY's deadline */
    uint8_t flush_pending; /* in the worker's list of connections to write this turn */
    ms_conn_t *next_pending;
    /* The frame pre-scan (scan_frames): bytes of the preface or of a frame's payload still
     * to pass over, and the start of a frame header split across reads. */
    uint32_t scan_skip;
    uint8_t scan_len;
    uint8_t scan_hd[H2_SCAN_HEAD];
    int32_t malformed_id; /* a HEADERS frame the pre-scan found malformed opens this stream */
    ms_stream_t *fields_st; /* the stream whose field block is being decoded (NULL: none) */
    /* How the client's streams up to top_id closed (CLOSED_*): bit d of closed_lo and
     * closed_hi for stream top_id - 2d. */
    int32_t top_id;                 /* the client's highest stream id opened (-1: none yet) */
    int32_t reset_sent, reset_recv; /* the stream whose RST_STREAM was sent, received last */
    uint64_t closed_lo, closed_hi;
    nghttp2_mem mem;      /* the worker's blocks, and the mapping below */
    ms_blocks_t *blocks;  /* the worker's */
    void *framebuf;       /* nghttp2's frame buffer, a mapping of its own (NULL: none yet) */
    size_t framebuf_size;
    uint8_t trimmed;      /* its pages given back while the connection is idle */
} ms_h2_t;

struct ms_stream_s {
    ms_req_t req; /* first: a request is a stream */
    ms_h2_t *h2;
    ms_stream_t *prev, *next;
    ms_out_t *out; /* reply pieces not yet framed */
    int32_t id;
    uint32_t head_bytes; /* decoded field bytes, counted as HPACK does (+32 each) */
    uint16_t refused;    /* the status the core answers with instead of the handler (431) */
    uint8_t closed;      /* nghttp2 closed the stream */
    uint8_t deferred;    /* the data source waits for pieces */
    uint8_t provider;    /* the reply has a body that DATA frames carry */
    uint8_t dispatched;  /* its head was whole: a handler (or the core) has it */
    uint8_t reset_after; /* RST_STREAM(NO_ERROR) once the reply is sent: the rest of the
                          * request body is not wanted (RFC 9113 8.1) */
    uint8_t end_sent;    /* the reply's last frame (END_STREAM) has gone */
    uint8_t malformed;   /* reset with PROTOCOL_ERROR instead of being dispatched */
    uint8_t tunnel;      /* a tunnel (extended CONNECT): its body has no deadline, and it is
                          * not reset when its handler is done */
    uint8_t read_paused; /* a tunnel that reads no more for now: its window is not granted */
    uint8_t discard;     /* DISCARD_*: the rest of the body is read and dropped */
    uint32_t unconsumed; /* ... of so many bytes */
    int32_t lua_anchor;  /* a Lua string partly framed: released with its last part */
    uint64_t body_start; /* when the body's budget began (loop ms; 0: not yet) */
    uint64_t body_mark;  /* body bytes received by then */
};

_Static_assert(offsetof(ms_stream_t, req) == 0, "a stream is its request");

/* The connection's session: NULL before it is made, or once the connection has gone. */
static inline ms_h2_t *h2_of(ms_conn_t *c)
{
    return c->proto == &ms__h2_proto ? c->pstate : NULL;
}

static void h2_flush(ms_conn_t *c);
static void h2_flush_soon(ms_conn_t *c);
static void h2_drain_check(ms_conn_t *c);

static ms_stream_t *stream_of(ms_req_t *r)
{
    return (ms_stream_t *)r; /* the request is the stream's first member */
}

/* -- Streams -------------------------------------------------------------------------------- */

/* HTTP/2's own per worker: recycled streams, and the connections replied to outside a read,
 * whose frames are written once a turn of the loop. */
typedef struct ms_h2_worker_s {
    ms_recycle_t stream_free;
    ms_blocks_t blocks; /* nghttp2's memory (its streams, frames, fields, HPACK tables) */
    uv_prepare_t turn; /* writes the connections in `pending` */
    uv_idle_t again;   /* keeps the next poll from blocking while `turn` has work that its
                        * own run made (a handler woken by a write) */
    ms_conn_t *pending;
    int open_handles;  /* while the worker's state is being freed */
} ms_h2_worker_t;

/* A stream from the worker's recycle list (with its pool's first chunk and its body buffer)
 * or a new one. */
static ms_stream_t *stream_new(ms_h2_t *h2, int32_t id)
{
    ms_stream_t *st = ms__recycle_get(&h2->conn->server->h2->stream_free);
    if (st == NULL) {
        st = ms_mem_alloc(sizeof(*st));
        memset(st, 0, sizeof(*st));
        ms_pool_init(&st->req.pool);
        ms__req_init(&st->req);
    } else {
        ms__req_reset(&st->req);
        st->out = NULL;
        st->prev = NULL;
        st->head_bytes = 0;
        st->refused = 0;
        st->closed = st->deferred = st->provider = st->reset_after = st->dispatched = 0;
        st->end_sent = st->malformed = st->tunnel = st->read_paused = st->discard = 0;
        st->unconsumed = 0;
        st->body_start = st->body_mark = 0;
    }
    st->req.conn = h2->conn;
    st->req.v.version = 20;
    st->req.v.flags = MS_REQ_PARKED; /* the head lives in the pool from the start */
    st->req.body_limit = h2->conn->server->limits.body_bytes;
    st->h2 = h2;
    st->id = id;
    st->lua_anchor = -1;
    st->next = h2->streams;
    if (h2->streams != NULL)
        h2->streams->prev = st;
    h2->streams = st;
    h2->nstreams++;
    return st;
}

static void stream_destroy(void *p);

static void stream_free(ms_stream_t *st)
{
    ms_h2_t *h2 = st->h2;
    ms_server_t *s = h2->conn->server;
    if (st->prev != NULL)
        st->prev->next = st->next;
    else
        h2->streams = st->next;
    if (st->next != NULL)
        st->next->prev = st->prev;
    h2->nstreams--;
    if (h2->fields_st == st)
        h2->fields_st = NULL;
    if (MS_UNLIKELY(st->req.timer.index != 0))
        ms_timer_stop(s, &st->req.timer); /* (discard_expired) */
    if (st->out != NULL) {
        /* A string framed in part must outlive what the connection still writes of it: the
         * connection's queue takes its anchor. */
        if (st->lua_anchor >= 0 && !(h2->conn->flags & MS_CONN_CLOSED)) {
            st->out->vecs[st->out->pos].owner = MS_VEC_STATIC;
            st->out->held--;
            ms__out_hold(s, ms__conn_out(h2->conn), st->lua_anchor);
        }
        ms__out_release(s, st->out);
    }
    if (!ms__recycle_put(&s->h2->stream_free, st))
        stream_destroy(st);
}

static void stream_destroy(void *p)
{
    ms_stream_t *st = p;
    ms_mem_free(st->req.body.base);
    ms_pool_free(&st->req.pool);
    ms_mem_free(st);
}

static ms_out_t *stream_out(ms_req_t *r)
{
    ms_stream_t *st = stream_of(r);
    if (st->out == NULL) {
        ms_server_t *s = r->conn->server;
        st->out = ms__recycle_get(&s->out_free);
        if (st->out == NULL) {
            st->out = ms_mem_alloc(sizeof(*st->out));
            memset(st->out, 0, sizeof(*st->out));
        }
    }
    return st->out;
}

static void glitch(ms_h2_t *h2)
{
    if (++h2->glitches == H2_GLITCHES_MAX) {
        char peer[64];
        ms_conn_peer(h2->conn, peer, sizeof(peer));
        ms_log(MS_LOG_INFO, "%s: HTTP/2: GOAWAY after %d protocol glitches", peer, H2_GLITCHES_MAX);
        nghttp2_session_terminate_session(h2->ng, NGHTTP2_ENHANCE_YOUR_CALM);
    }
}

/* -- Closed streams ---------------------------------------------------------------------------- */

/* How client stream `id` (odd, at most top_id) closed: CLOSED_*. */
static inline int closed_state(const ms_h2_t *h2, uint32_t id)
{
    uint32_t d = ((uint32_t)h2->top_id - id) / 2;
    if (d >= H2_CLOSED_IDS)
        return CLOSED_OTHER;
    return (int)((h2->closed_lo >> d) & 1) | (int)((h2->closed_hi >> d) & 1) << 1;
}

/* The client opened (or tried to open) stream `id`: the ids it skipped can never be opened
 * (RFC 9113 5.1.1), and the window moves up. */
static void closed_advance(ms_h2_t *h2, int32_t id)
{
    if (id <= h2->top_id || !(id & 1))
        return;
    /* (top_id starts at -1: id 1 moves by 1; in uint32_t, as 2^31 - 1 - -1 is not an int) */
    uint32_t k = ((uint32_t)id - (uint32_t)h2->top_id) / 2;
    uint64_t unused = (k >= H2_CLOSED_IDS ? ~(uint64_t)0 : ((uint64_t)1 << k) - 1) & ~(uint64_t)1;
    h2->closed_lo = (k >= H2_CLOSED_IDS ? 0 : h2->closed_lo << k) | unused;
    h2->closed_hi = (k >= H2_CLOSED_IDS ? 0 : h2->closed_hi << k) | unused;
    h2->top_id = id;
}

/* nghttp2 closed stream `id`: remember how, while it is in the window. */
static void closed_mark(ms_h2_t *h2, int32_t id)
{
    int state = id == h2->reset_sent   ? CLOSED_OTHER
                : id == h2->reset_recv ? CLOSED_RESET
                                       : CLOSED_ENDED;
    uint32_t d = ((uint32_t)h2->top_id - (uint32_t)id) / 2;
    if (id > h2->top_id || !(id & 1) || d >= H2_CLOSED_IDS)
        return;
    h2->closed_lo |= (uint64_t)(state & 1) << d;
    h2->closed_hi |= (uint64_t)(state >> 1) << d;
}

/* A connection error the pre-scan found (RFC 9113 5.4.1): one log line, and GOAWAY. */
static ssize_t conn_error(ms_h2_t *h2, uint32_t code, uint32_t id, const char *why)
{
    char peer[64];
    ms_conn_peer(h2->conn, peer, sizeof(peer));
    ms_log(MS_LOG_INFO, "%s: HTTP/2: GOAWAY: stream %u: %s", peer, id, why);
    h2->conn->server->stats->bad_requests++;
    nghttp2_session_terminate_session(h2->ng, code);
    return H2_ANSWERED;
}

/* A DATA or HEADERS frame on client stream `id`, which is at most top_id and not open, or a
 * PRIORITY frame on stream 0: answered as RFC 9113 5.1 and 6.3 say (nghttp2, which has
 * forgotten the stream, would ignore it). Returns 0 (the frame goes on to nghttp2, which
 * drops it, HPACK state and all) or H2_ANSWERED. */
static ssize_t closed_frame(ms_h2_t *h2, int type, uint32_t id)
{
    if (type == NGHTTP2_PRIORITY)
        return conn_error(h2, NGHTTP2_PROTOCOL_ERROR, id, "PRIORITY on stream 0");
    int state = (int32_t)id <= h2->top_id ? closed_state(h2, id) : CLOSED_OTHER;
    if (state == CLOSED_UNUSED && type == NGHTTP2_HEADERS)
        return conn_error(h2, NGHTTP2_PROTOCOL_ERROR, id,
                          "HEADERS on a stream id below one already used");
    if (state == CLOSED_ENDED)
        return conn_error(h2, NGHTTP2_STREAM_CLOSED, id,
                          type == NGHTTP2_DATA ? "DATA on a closed stream"
                                               : "HEADERS on a closed stream");
    if (state != CLOSED_OTHER) {
        /* Reset by the client, or never opened: a stream error (5.1, 6.1). */
        char peer[64];
        ms_conn_peer(h2->conn, peer, sizeof(peer));
        ms_log(MS_LOG_INFO, "%s: HTTP/2 stream %u: reset: %s on a stream %s", peer, id,
               type == NGHTTP2_DATA ? "DATA" : "HEADERS",
               state == CLOSED_RESET ? "the client reset" : "never opened");
        h2->conn->server->stats->bad_requests++;
        glitch(h2);
        nghttp2_submit_rst_stream(h2->ng, NGHTTP2_FLAG_NONE, (int32_t)id, NGHTTP2_STREAM_CLOSED);
    }
    return 0;
}

/* -- Replies --------------------------------------------------------------------------------- */

/* A field line of the reply ("Name: value\r\n") as an HTTP/2 field: the name in lowercase
 * (in the request's pool), connection-specific fields left out (RFC 9113 8.2.2). */
static int field_nv(ms_req_t *r, const char *line, size_t len, nghttp2_nv *nv)
{
    const char *colon = memchr(line, ':', len);
    if (colon == NULL)
        return 0;
    size_t nlen = (size_t)(colon - line);
    const char *v = colon + 1;
    while (v < line + len && *v == ' ')
        v++;
    size_t vlen = (size_t)(line + len - v);
    char *name = ms_pool_alloc(&r->pool, nlen);
    for (size_t i = 0; i < nlen; i++)
        name[i] = (char)ms__lower((unsigned char)line[i]);
    static const char *const drop[] = {"connection", "keep-alive", "proxy-connection",
                                       "transfer-encoding", "upgrade"};
    for (size_t i = 0; i < sizeof(drop) / sizeof(*drop); i++)
        if (strlen(drop[i]) == nlen && memcmp(name, drop[i], nlen) == 0)
            return 0;
    nv->name = (uint8_t *)name;
    nv->namelen = nlen;
    nv->value = (uint8_t *)v;
    nv->valuelen = vlen;
    nv->flags = NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE;
    return 1;
}

/* How many field lines `b` holds, a last one without its LF included. */
static int count_lines(const ms_buf_t *b)
{
    int n = 0;
    for (size_t i = 0; i < b->len; i++)
        n += b->base[i] == '\n';
    return n + (b->len > 0 && b->base[b->len - 1] != '\n');
}

/* Field lines ("name: value\r\n"...) as HTTP/2 fields into `nva`, which has room for
 * count_lines(b); returns how many. The lines were checked as they entered the reply
 * (req.c); a last one without its LF would still end at the buffer's end. */
static int fields_nv(ms_req_t *r, const ms_buf_t *b, nghttp2_nv *nva)
{
    int n = 0;
    const char *p = b->base, *end = p != NULL ? p + b->len : p;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (eol == NULL)
            eol = end;
        size_t len = (size_t)(eol - p);
        n += field_nv(r, p, len > 0 && p[len - 1] == '\r' ? len - 1 : len, &nva[n]);
        p = eol + 1;
    }
    return n;
}

static int submit_trailers(nghttp2_session *ng, ms_stream_t *st)
{
    ms_req_t *r = &st->req;
    nghttp2_nv *nva = ms_pool_alloc(&r->pool, (size_t)count_lines(&r->res_trailers) * sizeof(*nva));
    int n = fields_nv(r, &r->res_trailers, nva);
    return nghttp2_submit_trailer(ng, st->id, nva, (size_t)n);
}

/* The body's DATA frames take what the stream's queue holds; without anything there yet the
 * source waits (resumed when a piece or the end comes). */
static ssize_t data_read(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t length,
                         uint32_t *flags, nghttp2_data_source *source, void *user)
{
    ms_stream_t *st = source->ptr;
    size_t have = st->out != NULL ? st->out->bytes : 0;
    int done = (st->req.v.flags & MS_REQ_DONE) != 0;
    if (have == 0 && !done) {
        st->deferred = 1;
        return NGHTTP2_ERR_DEFERRED;
    }
    size_t n = have < length ? have : length;
    *flags |= NGHTTP2_DATA_FLAG_NO_COPY;
    if (done && n == have) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
        /* Trailer fields end the stream instead, in a HEADERS frame after this one. */
        if (st->req.res_trailers.len > 0 && submit_trailers(ng, st) == 0)
            *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
    }
    return (ssize_t)n;
}

/* Moves `length` bytes of the stream's queue behind the frame header into the connection's
 * queue: text is copied, strings and files are referenced. A string framed in parts keeps
 * its anchor until its last part. */
static int data_send(nghttp2_session *ng, nghttp2_frame *frame, const uint8_t *framehd,
                     size_t length, nghttp2_data_source *source, void *user)
{
    ms_h2_t *h2 = user;
    ms_stream_t *st = source->ptr;
    ms_server_t *s = h2->conn->server;
    /* The connection holds what it has not written within bounds: the frame waits. */
    if (ms__conn_queued(h2->conn) >= MS_OUT_HIGH_WATER)
        return NGHTTP2_ERR_WOULDBLOCK;
    ms_out_t *o = ms__conn_out(h2->conn), *so = st->out;
    ms__out_text(s, o, (const char *)framehd, 9);
    while (length > 0) {
        ms_vec_t *v = &so->vecs[so->pos];
        size_t off = so->pos_off, take = v->len - off;
        if (take > length)
            take = length;
        int whole_rest = off + take == v->len;
        switch (v->owner) {
        case MS_VEC_OUT: ms__out_text(s, o, so->buf.base + (size_t)v->base + off, take); break;
        case MS_VEC_FILE: ms__out_file(s, o, (ms_file_t *)v->base, v->off + off, take); break;
        case MS_VEC_LUA:
            if (whole_rest) {
                ms__out_vec(s, o, v->base + off, take, MS_VEC_LUA, v->anchor);
                v->owner = MS_VEC_STATIC; /* the anchor went with it */
                so->held--;
                st->lua_anchor = -1;
            } else {
                ms__out_vec(s, o, v->base + off, take, MS_VEC_STATIC, -1);
                st->lua_anchor = v->anchor;
            }
            break;
        default: ms__out_vec(s, o, v->base + off, take, MS_VEC_STATIC, -1);
        }
        ms__out_advance(so, take);
        length -= take;
    }
    if (so->pos == so->nvecs)
        ms__out_clear(s, so); /* all framed: it starts again empty, with its buffers */
    (void)ng;
    (void)frame;
    return 0;
}

/* The reply head as a HEADERS frame; a body, if any, follows in DATA frames. `clen` as for
 * HTTP/1.1: the length, -1 unknown, -2 none. */
static void h2_reply_head(ms_req_t *r, int64_t clen)
{
    ms_stream_t *st = stream_of(r);
    ms_h2_t *h2 = st->h2;
    r->v.flags |= MS_REQ_HEAD_SENT;
    if (st->closed)
        return;
    /* Fields: :status, server, date, content-length, the reply's own. */
    int max = 4 + count_lines(&r->res_headers);
    nghttp2_nv *nva = ms_pool_alloc(&r->pool, (size_t)max * sizeof(*nva));
    char *status = ms_pool_alloc(&r->pool, 3);
    status[0] = (char)('0' + r->v.status / 100 % 10);
    status[1] = (char)('0' + r->v.status / 10 % 10);
    status[2] = (char)('0' + r->v.status % 10);
    int n = 0;
    /* Names and values live in the stream's pool (or forever) until it is freed, after its
     * HEADERS have gone: nghttp2 need not copy them. */
    const uint8_t none = NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE;
    nva[n++] = (nghttp2_nv){(uint8_t *)":status", (uint8_t *)status, 7, 3, none};
    nva[n++] = (nghttp2_nv){(uint8_t *)"server", (uint8_t *)"moonserve", 6, 9,
                            NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE};
    /* "date: " + an IMF-fixdate: the value is copied, the line changes each second */
    nva[n++] = (nghttp2_nv){(uint8_t *)"date", (uint8_t *)ms__date_line(h2->conn->server) + 6, 4,
                            29, NGHTTP2_NV_FLAG_NO_COPY_NAME};
    if (clen >= 0) {
        char digits[20], *len;
        size_t ll = (size_t)(ms__put_u64(digits, (uint64_t)clen) - digits);
        len = ms_pool_alloc(&r->pool, ll);
        memcpy(len, digits, ll);
        nva[n++] = (nghttp2_nv){(uint8_t *)"content-length", (uint8_t *)len, 14, ll, none};
    }
    n += fields_nv(r, &r->res_headers, nva + n);
    int body = clen != -2 && clen != 0 && !(r->v.flags & MS_REQ_IS_HEAD);
    nghttp2_data_provider prd = {.source.ptr = st, .read_callback = data_read};
    st->provider = (uint8_t)body;
    int rc = nghttp2_submit_response(h2->ng, st->id, nva, (size_t)n, body ? &prd : NULL);
    if (rc != 0)
        nghttp2_submit_rst_stream(h2->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
}

/* Lets streams whose data source waited go on with what was queued since. */
static void resume_streams(ms_h2_t *h2)
{
    for (ms_stream_t *st = h2->streams; st != NULL; st = st->next) {
        if (!st->deferred || st->closed)
            continue;
        if ((st->out != NULL && st->out->bytes > 0) || (st->req.v.flags & MS_REQ_DONE)) {
            st->deferred = 0;
            nghttp2_session_resume_data(h2->ng, st->id);
        }
    }
}

/* Frames what nghttp2 has to send into the connection's queue, while the queue has room,
 * and writes it. */
static void h2_flush(ms_conn_t *c)
{
    ms_h2_t *h2 = h2_of(c);
    if (h2 == NULL || (c->flags & MS_CONN_CLOSED))
        return;
    resume_streams(h2);
    ms_server_t *s = c->server;
    /* Frames up to the high-water mark, written; again while the socket takes them all at
     * once (a write left to the background comes back through ms_conn_write_done). */
    size_t framed;
    do {
        size_t before = ms__conn_queued(c);
        while (ms__conn_queued(c) < MS_OUT_HIGH_WATER) {
            const uint8_t *data;
            ssize_t n = nghttp2_session_mem_send(h2->ng, &data);
            if (n < 0) {
                ms__conn_close(c, 0);
                return;
            }
            if (n == 0)
                break;
            ms__out_text(s, ms__conn_out(c), (const char *)data, (size_t)n);
        }
        framed = ms__conn_queued(c) - before;
        ms__conn_flush(c);
    } while (framed > 0 && !(c->flags & (MS_CONN_CLOSED | MS_CONN_WRITING)) &&
             ms__conn_queued(c) == 0 && nghttp2_session_want_write(h2->ng));
    if (!nghttp2_session_want_read(h2->ng) && !nghttp2_session_want_write(h2->ng) &&
        ms__conn_queued(c) == 0)
        ms__conn_close(c, 1); /* after GOAWAY, or a session error: done */
}

/* Writes the connections whose handlers replied outside a read (a timer, a resumed
 * handler), once per turn of the loop: their frames leave together. */
static void poll_once(uv_idle_t *idle)
{
    uv_idle_stop(idle); /* it only had to keep one poll from blocking */
}

static void write_pending(uv_prepare_t *p)
{
    ms_h2_worker_t *w = container_of(p, ms_h2_worker_t, turn);
    ms_conn_t *c = w->pending;
    w->pending = NULL;
    uv_prepare_stop(p);
    while (c != NULL) {
        ms_h2_t *h2 = h2_of(c);
        ms_conn_t *next = h2 != NULL ? h2->next_pending : NULL;
        if (h2 != NULL) {
            h2->flush_pending = 0;
            h2->next_pending = NULL;
            h2_flush(c);
            if (h2_of(c) != NULL && !(c->flags & MS_CONN_CLOSED))
                h2_drain_check(c);
            ms__conn_rearm(c);
        }
        ms__conn_release(c);
        c = next;
    }
    /* A handler woken here (its write went out at once) may have replied again: that waits
     * for the next turn, which must come without waiting for an event (a prepare handle
     * does not shorten the poll; an idle one does). */
    if (w->pending != NULL)
        uv_idle_start(&w->again, poll_once);
}

static void h2_flush_soon(ms_conn_t *c)
{
    ms_h2_t *h2 = h2_of(c);
    ms_server_t *s = c->server;
    if (h2 == NULL || h2->flush_pending || (c->flags & MS_CONN_CLOSED))
        return;
    h2->flush_pending = 1;
    ms__conn_hold(c); /* the list's */
    h2->next_pending = s->h2->pending;
    s->h2->pending = c;
    uv_prepare_start(&s->h2->turn, write_pending);
}

static void h2_fail(ms_req_t *r)
{
    ms_stream_t *st = stream_of(r);
    r->v.flags |= MS_REQ_DONE;
    if (!st->closed)
        nghttp2_submit_rst_stream(st->h2->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
}

/* Past discard_bytes or discard_timeout: the stream is reset with NO_ERROR (RFC 9113 8.1)
 * once the reply's last frame has gone. */
static void discard_over(ms_stream_t *st)
{
    st->discard = DISCARD_OVER;
    if (st->closed)
        return;
    if (st->end_sent)
        nghttp2_submit_rst_stream(st->h2->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_NO_ERROR);
    else
        st->reset_after = 1;
}

static void discard_expired(ms_timer_t *t)
{
    ms_stream_t *st = (ms_stream_t *)container_of(t, ms_req_t, timer);
    ms_conn_t *c = st->req.conn;
    discard_over(st);
    h2_flush_soon(c);
}

/* A stream whose reply is complete, or will be, while the client has not ended its side:
 * nothing reads what it still sends. A reset at once would lose the reply for common clients
 * (curl drops a reply whose stream is reset while it still uploads), so, as nginx does, the
 * rest is read and dropped (its window granted: on_data), within discard_bytes from now and
 * discard_timeout from the handler's end; the client ends its side, or past either bound
 * the stream is reset (discard_over). */
static void discard_rest(ms_stream_t *st)
{
    ms_req_t *r = &st->req;
    if (st->closed || (r->v.flags & MS_REQ_BODY_DONE))
        return;
    ms_server_t *s = r->conn->server;
    if (st->discard == DISCARD_NONE) {
        st->discard = DISCARD_ON;
        st->body_mark = r->body_seen;
    }
    if (st->discard == DISCARD_OVER || s->limits.discard_bytes == 0 ||
        s->limits.discard_timeout_ms == 0)
        discard_over(st);
    else if (!(r->v.flags & MS_REQ_IN_HANDLER) && r->timer.index == 0)
        ms_timer_start(s, &r->timer, s->limits.discard_timeout_ms, discard_expired);
}

/* The handler is done with the stream: it goes when nghttp2 is done with it too, at the
 * latest once its reply has gone (a tunnel ends as its handler says). */
static void h2_finished(ms_req_t *r)
{
    ms_stream_t *st = stream_of(r);
    ms_conn_t *c = r->conn;
    if (st->closed)
        stream_free(st);
    else if (!st->tunnel)
        discard_rest(st);
    if (!(c->flags & MS_CONN_IN_FEED))
        h2_flush_soon(c);
    ms__conn_rearm(c);
    ms__conn_release(c); /* the handler's reference */
}

/* -- Request bodies ---------------------------------------------------------------------------- */

/* The core answers the stream (ms__req_refuse logged it): the refusal as its reply unless
 * one has begun, then a handler waiting for the body learns. The rest of the body is not
 * wanted: it is dropped (discard_rest; a reset now would lose the reply). */
static void h2_refuse(ms_req_t *r, int status)
{
    ms_stream_t *st = stream_of(r);
    r->v.flags |= MS_REQ_BODY_ERROR;
    if (!(r->v.flags & MS_REQ_HEAD_SENT)) {
        static const char retry[] = "retry-after: 1\r\n";
        ms_refusal_t body;
        ms__refusal(r, status, &body);
        ms_reply_reset(r);
        r->v.status = (uint16_t)status;
        ms_reply_header(r, "content-type", 12, body.type, strlen(body.type));
        if (status == 503)
            ms_reply_field(r, retry, sizeof(retry) - 1);
        /* (the app's body lives as long as the server) */
        ms_reply_send(r, body.body, body.len, body.app ? MS_VEC_STATIC : MS_VEC_OUT, -1);
    }
    discard_rest(st);
    if (r->v.wait == MS_WAIT_BODY)
        ms__req_wake(r, MS_WAIT_BODY);
}

/* A body has body_timeout; past it, it may go on while it keeps body_min_rate on average
 * since its budget began, as on HTTP/1.1, looked at each second. It is looked at only while
 * the handler waits for it: a handler at work is not the client's delay. A late body gets
 * 408 and RST_STREAM; the connection and its other streams go on. */
static void body_check(ms_timer_t *t)
{
    ms_req_t *r = container_of(t, ms_req_t, timer);
    ms_stream_t *st = stream_of(r);
    ms_conn_t *c = r->conn;
    ms_server_t *s = c->server;
    const ms_limits_t *lim = &s->limits;
    if (r->v.wait != MS_WAIT_BODY || st->closed)
        return; /* woken since: its next wait looks again */
    uint64_t ms = uv_now(s->loop) - st->body_start;
    if (ms < lim->body_timeout_ms) {
        ms_timer_start(s, t, lim->body_timeout_ms - ms, body_check);
        return;
    }
    uint64_t got = r->body_seen - st->body_mark;
    if (ms > 0 && got * 1000 / ms >= lim->body_min_rate) {
        ms_timer_start(s, t, 1000, body_check);
        return;
    }
    s->stats->timeouts++;
    ms__conn_hold(c);
    st->discard = DISCARD_OVER; /* a client this slow has had its time: reset once answered */
    ms__req_refuse(r, 408, "body not complete within body_timeout at body_min_rate");
    if (h2_of(c) != NULL && !(c->flags & MS_CONN_CLOSED))
        ms__conn_rearm(c);
    ms__conn_release(c);
}

/* The handler waits for the body: its deadline, from when the budget began (the first wait). */
static void h2_body_wait(ms_req_t *r)
{
    ms_stream_t *st = stream_of(r);
    ms_server_t *s = r->conn->server;
    if (st->tunnel || st->closed || r->timer.index != 0 ||
        (r->v.flags & (MS_REQ_BODY_DONE | MS_REQ_BODY_ERROR)))
        return;
    uint64_t now = uv_now(s->loop), due;
    if (st->body_start == 0) {
        st->body_start = now;
        st->body_mark = r->body_seen;
    }
    due = st->body_start + s->limits.body_timeout_ms;
    ms_timer_start(s, &r->timer, due > now ? due - now : 0, body_check);
}

/* The handler took `n` body bytes: the client may send as many more (WINDOW_UPDATE). A handler
 * that does not read grants nothing, so an unread body never grows past the window. */
static void h2_body_taken(ms_req_t *r, size_t n)
{
    ms_stream_t *st = stream_of(r);
    if (n >= H2_WINDOW / 2 && st->body_start != 0) {
        /* Half a window or more waited for the handler: the client may have been held back
         * by us, so its budget starts again (as HTTP/1.1's does after backpressure). */
        st->body_start = uv_now(r->conn->server->loop);
        st->body_mark = r->body_seen;
        ms_timer_stop(r->conn->server, &r->timer);
    }
    if (!st->closed)
        nghttp2_session_consume(st->h2->ng, st->id, n);
    if (!(r->conn->flags & MS_CONN_IN_FEED))
        h2_flush_soon(r->conn);
}

/* -- nghttp2 callbacks ---------------------------------------------------------------------------
 */

static int on_begin_headers(nghttp2_session *ng, const nghttp2_frame *frame, void *user)
{
    ms_h2_t *h2 = user;
    h2->fields_st = NULL;
    if (frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    if (frame->headers.cat == NGHTTP2_HCAT_HEADERS) {
        /* Trailers: held to the limits of a head, with a budget of their own. */
        ms_stream_t *st = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
        if (st != NULL)
            st->head_bytes = 0;
        h2->fields_st = st;
        return 0;
    }
    if (frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    closed_advance(h2, frame->hd.stream_id);
    if (h2->going_away == GOAWAY_SENT) {
        nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, frame->hd.stream_id,
                                  NGHTTP2_REFUSED_STREAM);
        return 0;
    }
    ms_stream_t *st = stream_new(h2, frame->hd.stream_id);
    if (frame->hd.stream_id == h2->malformed_id) {
        st->malformed = 1; /* (scan_frames) */
        h2->malformed_id = 0;
    }
    nghttp2_session_set_stream_user_data(ng, frame->hd.stream_id, st);
    h2->fields_st = st; /* (on_header's, without a lookup a field) */
    return 0;
}

static void copy_str(ms_req_t *r, ms_str_t *to, const uint8_t *p, size_t n)
{
    char *d = ms_pool_alloc(&r->pool, n + 1);
    memcpy(d, p, n);
    d[n] = 0;
    to->base = d;
    to->len = n;
}

/* A field of the HEADERS frame after DATA: a trailer, kept apart from the head. nghttp2 has
 * checked it (no pseudo-fields, valid name and value). */
static int on_trailer(ms_stream_t *st, const uint8_t *name, size_t nlen, const uint8_t *value,
                      size_t vlen, const ms_limits_t *lim)
{
    ms_req_t *r = &st->req;
    if (!(r->v.flags & MS_REQ_IN_HANDLER) || (r->v.flags & MS_REQ_BODY_ERROR))
        return 0; /* nobody reads them */
    st->head_bytes += (uint32_t)(nlen + vlen + 32);
    if (st->head_bytes > lim->head_bytes || (uint32_t)r->ntrailers >= lim->header_count) {
        const char *why = st->head_bytes > lim->head_bytes ? "trailer fields larger than head_bytes"
                                                           : "too many trailer fields";
        ms__req_refuse(r, 431, why);
        return 0;
    }
    ms__req_add_trailer(r, (const char *)name, nlen, (const char *)value, vlen);
    return 0;
}

static int on_header(nghttp2_session *ng, const nghttp2_frame *frame, const uint8_t *name,
                     size_t nlen, const uint8_t *value, size_t vlen, uint8_t flags, void *user)
{
    (void)flags;
    /* From an upgrade, the HTTP/1.1 request's fields come with no frame, and the stream. */
    ms_stream_t *st = frame == NULL ? user : NULL;
    if (frame != NULL && frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    if (frame != NULL) {
        /* The block's fields come between its on_begin_headers and its on_frame_recv. */
        st = ((ms_h2_t *)user)->fields_st;
        if (st == NULL || st->id != frame->hd.stream_id)
            st = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
    }
    if (st == NULL || st->refused)
        return 0;
    ms_req_t *r = &st->req;
    const ms_limits_t *lim = &r->conn->server->limits;
    if (frame != NULL && frame->headers.cat == NGHTTP2_HCAT_HEADERS)
        return on_trailer(st, name, nlen, value, vlen, lim);
    /* The head's size as HPACK counts it: a field list larger than head_bytes, or with more
     * fields than header_count, is answered 431. */
    st->head_bytes += (uint32_t)(nlen + vlen + 32);
    if (st->head_bytes > lim->head_bytes || r->v.nheaders >= (int)lim->header_count) {
        st->refused = 431;
        return 0;
    }
    if (nlen > 0 && name[0] == ':') {
        ms_str_t *to = NULL;
        if (nlen == 7 && memcmp(name, ":method", 7) == 0)
            to = &r->v.method;
        else if (nlen == 5 && memcmp(name, ":path", 5) == 0)
            to = &r->v.target;
        else if (nlen == 10 && memcmp(name, ":authority", 10) == 0)
            name = (const uint8_t *)"host", nlen = 4; /* kept as Host for the handler */
        else if (nlen == 7 && memcmp(name, ":scheme", 7) == 0) {
            /* nghttp2 checks :path only for http and https: any other scheme is refused, so
             * that every request reaches the handler with a path it checked. */
            if (!(vlen == 4 && memcmp(value, "http", 4) == 0) &&
                !(vlen == 5 && memcmp(value, "https", 5) == 0))
                st->malformed = 1;
            return 0;
        }
        if (to != NULL) {
            copy_str(r, to, value, vlen);
            return 0;
        }
        /* :protocol (RFC 8441, which nghttp2 checked: only on CONNECT) is kept as a field
         * of that name, which no HTTP/1.1 field can have; the rest is dropped. */
        if (nlen != 4 && !(nlen == 9 && memcmp(name, ":protocol", 9) == 0))
            return 0;
    }
    if (r->v.nheaders == r->headers_cap)
        ms__req_headers_grow(r);
    ms_header_t *h = &r->headers[r->v.nheaders++];
    copy_str(r, &h->name, name, nlen);
    copy_str(r, &h->value, value, vlen);
    if (nlen == 14 && memcmp(name, "content-length", 14) == 0) {
        char *end;
        long long v = strtoll(h->value.base, &end, 10);
        if (*end == 0 && v >= 0)
            r->v.content_length = v;
    }
    return 0;
}

/* A request target is a path from the root, or "*" for OPTIONS (RFC 9113 8.3.1): anything
 * else would meet checks and routes that each read it their own way. */
static int target_ok(const ms_req_t *r)
{
    const ms_str_t *t = &r->v.target;
    if (t->len > 0 && t->base[0] == '/')
        return 1;
    return t->len == 1 && t->base[0] == '*' && r->v.method.len == 7 &&
           memcmp(r->v.method.base, "OPTIONS", 7) == 0;
}

/* A malformed request (RFC 9113 8.1.1): a stream error, never served. */
static void reset_malformed(ms_h2_t *h2, ms_stream_t *st, const char *why)
{
    char peer[64];
    ms_conn_peer(h2->conn, peer, sizeof(peer));
    ms_log(MS_LOG_INFO, "%s: HTTP/2 stream %d: reset: %s", peer, st->id, why);
    h2->conn->server->stats->bad_requests++;
    glitch(h2);
    nghttp2_submit_rst_stream(h2->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_PROTOCOL_ERROR);
}

/* A whole request head: the stream becomes a request, dispatched like an HTTP/1.1 one. */
static void dispatch(ms_h2_t *h2, ms_stream_t *st, int end_stream)
{
    ms_conn_t *c = h2->conn;
    ms_server_t *s = c->server;
    ms_req_t *r = &st->req;
    st->dispatched = 1;
    r->head_in = st->head_bytes; /* (the access log's bytes in) */
    if (end_stream)
        r->v.flags |= MS_REQ_BODY_DONE;
    else
        r->v.flags |= MS_REQ_HAS_BODY;
    if (st->refused) {
        ms__req_refuse(r, st->refused, "head larger than head_bytes or header_count");
        return;
    }
    if (r->v.method.base == NULL || r->v.target.base == NULL) {
        glitch(h2);
        nghttp2_submit_rst_stream(h2->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_PROTOCOL_ERROR);
        return;
    }
    if (st->malformed || !target_ok(r)) {
        reset_malformed(h2, st,
                        st->malformed ? "a :scheme other than http or https, or a stream that "
                                        "depends on itself"
                                      : ":path does not start with /");
        return;
    }
    if (ms__req_busy(s)) {
        ms__req_refuse(r, 503, NULL); /* (the flood is logged as one line a second) */
        return;
    }
    if (r->v.content_length > 0 && (uint64_t)r->v.content_length > s->limits.body_bytes_max &&
        (uint64_t)r->v.content_length > s->limits.body_bytes) {
        ms__req_refuse(r, 413, "body larger than body_bytes_max");
        return;
    }
    ms__req_split_target(r);
    r->v.id = ++s->next_req_id;
    if (r->v.method.len == 4 && memcmp(r->v.method.base, "HEAD", 4) == 0)
        r->v.flags |= MS_REQ_IS_HEAD;
    ms__req_dispatch(r);
}

#define GOAWAY_PING "goaway\0\0" /* the opaque data of the notice's PING */

/* The last GOAWAY: the streams taken so far finish, no new ones start. */
static void goaway(ms_h2_t *h2)
{
    h2->going_away = GOAWAY_SENT;
    ms_timer_stop(h2->conn->server, &h2->notice);
    nghttp2_submit_goaway(h2->ng, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(h2->ng), NGHTTP2_NO_ERROR, NULL,
                          0);
}

static int on_frame_recv(nghttp2_session *ng, const nghttp2_frame *frame, void *user)
{
    ms_h2_t *h2 = user;
    int end_stream = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
    ms_stream_t *st = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
    switch (frame->hd.type) {
    case NGHTTP2_HEADERS:
        if (st != NULL && frame->headers.cat == NGHTTP2_HCAT_REQUEST)
            dispatch(h2, st, end_stream);
        else if (st != NULL && end_stream)
            goto body_done; /* trailers end the body */
        break;
    case NGHTTP2_DATA:
        if (frame->hd.length == 0 && !end_stream)
            glitch(h2); /* an empty DATA frame says nothing */
        if (st != NULL && end_stream)
            goto body_done;
        break;
    case NGHTTP2_RST_STREAM:
        h2->reset_recv = frame->hd.stream_id; /* (closed next: on_stream_close) */
        break;
    case NGHTTP2_PING:
        if ((frame->hd.flags & NGHTTP2_FLAG_ACK) && h2->going_away == GOAWAY_NOTICE &&
            memcmp(frame->ping.opaque_data, GOAWAY_PING, 8) == 0)
            goaway(h2);
        break;
    }
    return 0;
body_done:
    st->req.v.flags |= MS_REQ_BODY_DONE;
    ms__req_tunnel_end(&st->req, 0);
    if (st->req.v.wait == MS_WAIT_BODY)
        ms__req_wake(&st->req, MS_WAIT_BODY);
    return 0;
}

static int on_data(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *data, size_t len,
                   void *user)
{
    (void)flags;
    (void)user;
    ms_stream_t *st = nghttp2_session_get_stream_user_data(ng, id);
    if (st == NULL || !(st->req.v.flags & MS_REQ_IN_HANDLER)) {
        nghttp2_session_consume(ng, id, len); /* nobody reads it: let it go */
        if (st != NULL && st->discard == DISCARD_ON &&
            (st->req.body_seen += len) - st->body_mark > st->req.conn->server->limits.discard_bytes)
            discard_over(st);
        return 0;
    }
    ms_req_t *r = &st->req;
    if (r->tunnel != NULL) {
        r->tunnel->on_data(r->tunnel, (const char *)data, len);
        if (st->read_paused)
            st->unconsumed += len; /* granted when the tunnel reads again */
        else
            nghttp2_session_consume(ng, id, len);
        return 0;
    }
    r->body_seen += len;
    if (r->body_seen > r->body_limit) {
        nghttp2_session_consume(ng, id, len);
        if (!(r->v.flags & MS_REQ_BODY_ERROR))
            ms__req_refuse(r, 413, "body larger than the route's body_bytes");
        return 0;
    }
    ms__buf_append(&r->body, (const char *)data, len);
    if (r->v.wait == MS_WAIT_BODY)
        ms__req_wake(r, MS_WAIT_BODY);
    return 0;
}

static int on_stream_close(nghttp2_session *ng, int32_t id, uint32_t code, void *user)
{
    (void)code;
    closed_mark(user, id);
    ms_stream_t *st = nghttp2_session_get_stream_user_data(ng, id);
    if (st == NULL)
        return 0;
    st->closed = 1;
    ms_req_t *r = &st->req;
    if (r->v.flags & MS_REQ_IN_HANDLER) {
        /* The client reset it, or the connection ends: the handler learns (one that replied
         * and still waits for the body too), then lets go. */
        ms__req_abort(r);
        return 0;
    }
    stream_free(st);
    return 0;
}

/* A reply's last frame has gone: a stream whose client has not ended it and whose body
 * nobody reads (refused, late, or its handler done) is reset now. */
static int on_frame_send(nghttp2_session *ng, const nghttp2_frame *frame, void *user)
{
    if (frame->hd.type == NGHTTP2_RST_STREAM) {
        ms_h2_t *h2 = user;
        h2->reset_sent = frame->hd.stream_id;    /* (closed next: on_stream_close) */
        closed_advance(h2, frame->hd.stream_id); /* (nghttp2 refused it unopened) */
        return 0;
    }
    if ((frame->hd.type != NGHTTP2_DATA && frame->hd.type != NGHTTP2_HEADERS) ||
        !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
        return 0;
    ms_stream_t *st = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
    if (st == NULL)
        return 0;
    st->end_sent = 1;
    if (st->reset_after && !st->closed && !(st->req.v.flags & MS_REQ_BODY_DONE)) {
        st->reset_after = 0;
        nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_NO_ERROR);
    }
    return 0;
}

/* A field nghttp2 finds invalid (an uppercase name, a forbidden connection field, a bad
 * value): the stream is reset, never served without it, and the glitch counted. */
static int on_invalid_header(nghttp2_session *ng, const nghttp2_frame *frame, const uint8_t *name,
                             size_t nlen, const uint8_t *value, size_t vlen, uint8_t flags,
                             void *user)
{
    (void)ng, (void)frame, (void)name, (void)nlen, (void)value, (void)vlen, (void)flags;
    glitch(user);
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
}

static int on_invalid_frame(nghttp2_session *ng, const nghttp2_frame *frame, int err, void *user)
{
    (void)ng;
    (void)frame;
    (void)err;
    glitch(user);
    return 0;
}

/* -- The session ---------------------------------------------------------------------------- */

static nghttp2_session_callbacks *callbacks;
static nghttp2_option *options;

static void setup_once(void)
{
    if (callbacks != NULL)
        return;
    nghttp2_session_callbacks_new(&callbacks);
    nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(callbacks, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, on_stream_close);
    nghttp2_session_callbacks_set_on_invalid_frame_recv_callback(callbacks, on_invalid_frame);
    nghttp2_session_callbacks_set_on_invalid_header_callback(callbacks, on_invalid_header);
    nghttp2_session_callbacks_set_on_frame_send_callback(callbacks, on_frame_send);
    nghttp2_session_callbacks_set_send_data_callback(callbacks, data_send);
    nghttp2_option_new(&options);
    nghttp2_option_set_no_auto_window_update(options, 1); /* granted as handlers read */
    nghttp2_option_set_max_settings(options, H2_MAX_SETTINGS);
    nghttp2_option_set_max_outbound_ack(options, H2_MAX_OUTBOUND_ACK);
    nghttp2_option_set_stream_reset_rate_limit(options, H2_RESET_BURST, H2_RESET_RATE);
    nghttp2_option_set_max_continuations(options, H2_MAX_CONTINUATIONS);
    nghttp2_option_set_no_closed_streams(options, 1);
}

/* nghttp2's allocator: the worker's blocks, by size class (base/mem.c). nghttp2 allocates
 * about a dozen blocks a stream: malloc and free were a seventh of a stream's instructions.
 * Its frame buffer (16 KiB and more, one a session, the one block that large) is a mapping of
 * its own, whose pages an idle connection gives back (h2_settle): nghttp2 writes a frame into
 * it before each send and keeps nothing there between sends, and we copy out what it sends. */
#ifndef MS_ASAN
#define H2_FRAMEBUF_MIN (16 * 1024)
#else
#define H2_FRAMEBUF_MIN SIZE_MAX /* (under ASan, a heap block, with its redzones) */
#endif
/* A connection idle this long gives its frame buffer's pages back. */
#define H2_SETTLE_MS 1000

static void *ng_malloc(size_t n, void *ud)
{
    return ms__blocks_alloc(((ms_h2_t *)ud)->blocks, n);
}

static MS_NOINLINE void framebuf_unmap(ms_h2_t *h2)
{
    munmap(h2->framebuf, h2->framebuf_size);
    h2->framebuf = NULL;
}

static void ng_free(void *p, void *ud)
{
    ms_h2_t *h2 = ud;
    if (MS_UNLIKELY(p == h2->framebuf) && p != NULL) {
        framebuf_unmap(h2);
        return;
    }
    ms__blocks_free(h2->blocks, p);
}

static void *ng_calloc(size_t nmemb, size_t size, void *ud)
{
    return ms__blocks_calloc(((ms_h2_t *)ud)->blocks, nmemb, size);
}

static void *ng_realloc(void *p, size_t n, void *ud)
{
    ms_h2_t *h2 = ud;
    if (p != NULL && p == h2->framebuf) {
        if (n <= h2->framebuf_size)
            return p;
    } else if (n < H2_FRAMEBUF_MIN || h2->framebuf != NULL) {
        return ms__blocks_realloc(h2->blocks, p, n);
    }
    /* the frame buffer: (re)mapped */
    size_t size = (n + 4095) & ~(size_t)4095;
    void *q = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (q == MAP_FAILED)
        return NULL;
    if (p != NULL) {
        size_t old = p == h2->framebuf ? h2->framebuf_size : ms__blocks_size(p);
        memcpy(q, p, old < n ? old : n);
        ng_free(p, h2);
    }
    h2->framebuf = q;
    h2->framebuf_size = size;
    return q;
}

/* The connection has been idle for H2_SETTLE_MS: its frame buffer's pages go back to the
 * system (they come back zeroed at the next frame), then the idle deadline runs on. */
static void h2_settle(ms_conn_t *c)
{
    ms_h2_t *h2 = c->pstate;
    if (h2 != NULL && h2->framebuf != NULL && !nghttp2_session_want_write(h2->ng)) {
        madvise(h2->framebuf, h2->framebuf_size, MADV_DONTNEED);
        h2->trimmed = 1;
    }
    uint32_t idle = c->server->limits.idle_timeout_ms;
    if (c->server->stopping)
        ms__conn_arm_idle(c);
    else
        ms__conn_arm(c, MS_PHASE_IDLE, idle > H2_SETTLE_MS ? idle - H2_SETTLE_MS : 0);
}

/* A server session for `c`, with our SETTINGS queued. NULL if nghttp2 could not make one. */
static ms_h2_t *session_new(ms_conn_t *c)
{
    setup_once();
    ms_h2_t *h2 = ms_mem_alloc(sizeof(*h2));
    memset(h2, 0, sizeof(*h2));
    h2->conn = c;
    h2->scan_skip = MS_H2_PREFACE_LEN; /* every session's input starts with the preface */
    h2->top_id = -1;
    h2->blocks = &c->server->h2->blocks;
    h2->mem = (nghttp2_mem){h2, ng_malloc, ng_free, ng_calloc, ng_realloc};
    if (nghttp2_session_server_new3(&h2->ng, callbacks, h2, options, &h2->mem) != 0) {
        ms_mem_free(h2);
        return NULL;
    }
    const ms_limits_t *lim = &c->server->limits;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, H2_MAX_STREAMS},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, H2_WINDOW},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, lim->head_bytes},
        {NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1},
        /* Extended CONNECT (RFC 8441): WebSocket over a stream, taken by ms_req_tunnel. */
        {NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL, 1},
    };
    nghttp2_submit_settings(h2->ng, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(*iv));
    return h2;
}

/* base64url without padding (RFC 4648 5), as HTTP2-Settings carries it. Returns the length,
 * or -1 for anything else. */
static ssize_t base64url(const char *in, size_t n, uint8_t *out, size_t cap)
{
    uint32_t acc = 0;
    int bits = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int ch = (unsigned char)in[i], v;
        if (ch >= 'A' && ch <= 'Z')
            v = ch - 'A';
        else if (ch >= 'a' && ch <= 'z')
            v = ch - 'a' + 26;
        else if (ch >= '0' && ch <= '9')
            v = ch - '0' + 52;
        else if (ch == '-')
            v = 62;
        else if (ch == '_')
            v = 63;
        else if (ch == '=' && i + 2 >= n)
            break; /* padding, tolerated at the end */
        else
            return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (k == cap)
                return -1;
            out[k++] = (uint8_t)(acc >> bits);
        }
    }
    return (ssize_t)k;
}

/* "Upgrade: h2c" (RFC 7540 3.2): 101, then the request `r` (HTTP/1.1's, head and all) goes
 * on as stream 1 of an HTTP/2 session; `rest` is what the client sent after it (its preface,
 * its frames). */
static void h2_feed(ms_conn_t *c, const char *data, size_t len);
static void h2_stop(ms_conn_t *c);

static void h2_upgrade(ms_conn_t *c, ms_req_t *r, const char *rest, size_t restlen)
{
    const ms_str_t *hs = ms_req_header(r, "http2-settings", 14);
    uint8_t settings[256];
    ssize_t slen = base64url(hs->base, hs->len, settings, sizeof(settings));
    ms_h2_t *h2 = slen >= 0 && slen % 6 == 0 ? session_new(c) : NULL;
    int is_head = r->v.method.len == 4 && memcmp(r->v.method.base, "HEAD", 4) == 0;
    ms_stream_t *st = h2 != NULL ? stream_new(h2, 1) : NULL;
    if (h2 == NULL || nghttp2_session_upgrade2(h2->ng, settings, (size_t)slen, is_head, st) != 0) {
        char peer[64];
        ms_conn_peer(c, peer, sizeof(peer));
        ms_log(MS_LOG_INFO, "%s: closed: a bad HTTP2-Settings in an upgrade to h2c", peer);
        c->server->stats->bad_requests++;
        c->pstate = h2; /* so that the session goes with the connection */
        ms__conn_close(c, 0);
        return;
    }
    static const char switching[] = "HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\n"
                                    "upgrade: h2c\r\n\r\n";
    ms__out_vec(c->server, ms__conn_out(c), switching, sizeof(switching) - 1, MS_VEC_STATIC, -1);
    /* The request, copied out of the HTTP/1 buffers, without its hop-by-hop fields. */
    ms_req_t *sr = &st->req;
    copy_str(sr, &sr->v.method, (const uint8_t *)r->v.method.base, r->v.method.len);
    /* The target as HTTP/1.1 understood it (an absolute form without its scheme and
     * authority): what :path would have said. */
    size_t plen = r->v.path.len, qlen = r->v.query.base != NULL ? r->v.query.len + 1 : 0;
    char *target = ms_pool_alloc(&sr->pool, plen + qlen + 1);
    memcpy(target, r->v.path.base, plen);
    if (qlen > 0) {
        target[plen] = '?';
        memcpy(target + plen + 1, r->v.query.base, qlen - 1);
    }
    target[plen + qlen] = 0;
    sr->v.target.base = target;
    sr->v.target.len = plen + qlen;
    for (int i = 0; i < r->v.nheaders; i++) {
        const ms_header_t *f = &r->headers[i];
        static const char *const hop[] = {"connection", "upgrade", "http2-settings", "keep-alive"};
        int skip = 0;
        for (size_t k = 0; k < sizeof(hop) / sizeof(*hop); k++)
            skip |= f->name.len == strlen(hop[k]) && ms__ieq(f->name.base, hop[k], f->name.len);
        if (!skip)
            on_header(h2->ng, NULL, (const uint8_t *)f->name.base, f->name.len,
                      (const uint8_t *)f->value.base, f->value.len, 0, st);
    }
    c->pstate = h2;
    closed_advance(h2, 1);
    dispatch(h2, st, 1);
    if (restlen > 0)
        h2_feed(c, rest, restlen);
    h2_flush(c); /* (the HTTP/1.1 read this came from writes only its own queue) */
}

/* -- The frame pre-scan ------------------------------------------------------------------- */

/* How much of a frame's start (its 9-byte header `hd` and what follows) the pre-scan looks
 * at: the stream dependency of PRIORITY, and of HEADERS with the PRIORITY flag (after the
 * pad length, if PADDED); never more than the frame. */
static size_t scan_want(const uint8_t *hd)
{
    size_t len = (size_t)hd[0] << 16 | (size_t)hd[1] << 8 | hd[2], want = 0;
    if (hd[3] == NGHTTP2_PRIORITY)
        want = 4;
    else if (hd[3] == NGHTTP2_HEADERS && (hd[4] & NGHTTP2_FLAG_PRIORITY))
        want = (hd[4] & NGHTTP2_FLAG_PADDED ? 1 : 0) + 4;
    return 9 + (want < len ? want : len);
}

/* Where the stream dependency lies in `have` bytes of a frame's start that depends on its
 * own stream, or NULL. */
static uint8_t *scan_self_dependency(uint8_t *hd, size_t have)
{
    uint32_t id =
        (uint32_t)(hd[5] & 0x7f) << 24 | (uint32_t)hd[6] << 16 | (uint32_t)hd[7] << 8 | hd[8];
    size_t off = hd[3] == NGHTTP2_HEADERS && (hd[4] & NGHTTP2_FLAG_PADDED) ? 10 : 9;
    if (have < off + 4 || id == 0)
        return NULL; /* nothing to look at, or a frame too short: nghttp2's FRAME_SIZE_ERROR */
    uint8_t *d = hd + off;
    uint32_t dep =
        (uint32_t)(d[0] & 0x7f) << 24 | (uint32_t)d[1] << 16 | (uint32_t)d[2] << 8 | d[3];
    return dep == id ? d : NULL;
}

/* A frame makes stream `id` depend on itself: the stream is reset with PROTOCOL_ERROR, or,
 * when this HEADERS frame opens it, reset instead of being dispatched. A PRIORITY frame on a
 * stream not yet opened is a connection error: an idle stream cannot be reset (5.1), and
 * nghttp2 would drop the RST_STREAM unsent. Returns 0 or H2_ANSWERED. */
static ssize_t self_dependent(ms_h2_t *h2, int32_t id, int type)
{
    ms_stream_t *st = nghttp2_session_get_stream_user_data(h2->ng, id);
    if (type == NGHTTP2_HEADERS && st == NULL) {
        h2->malformed_id = id; /* (on_begin_headers) */
        return 0;
    }
    if (id > h2->top_id)
        return conn_error(h2, NGHTTP2_PROTOCOL_ERROR, (uint32_t)id,
                          "PRIORITY makes an idle stream depend on itself");
    char peer[64];
    ms_conn_peer(h2->conn, peer, sizeof(peer));
    ms_log(MS_LOG_INFO, "%s: HTTP/2 stream %d: reset: it depends on itself", peer, id);
    h2->conn->server->stats->bad_requests++;
    glitch(h2);
    if (st != NULL)
        st->malformed = 1;
    nghttp2_submit_rst_stream(h2->ng, NGHTTP2_FLAG_NONE, id, NGHTTP2_PROTOCOL_ERROR);
    return 0;
}

/* Feeds nghttp2 `n` bytes; 0, or its error (a negative NGHTTP2_ERR_*). */
static ssize_t feed_ng(ms_h2_t *h2, const uint8_t *p, size_t n)
{
    ssize_t rc = n > 0 ? nghttp2_session_mem_recv(h2->ng, p, n) : 0;
    return rc < 0 ? rc : 0;
}

/* The client's bytes, through the pre-scan and into nghttp2. nghttp2 1.52 makes some checks
 * of RFC 9113 in code that priorities being off skips: a stream that depends on itself is a
 * stream error (5.3.1: PROTOCOL_ERROR), which it does not look for in PRIORITY (dropped
 * unread) and makes a connection error in HEADERS. So the frame headers are looked at
 * first; a frame that breaks the rule reaches nghttp2 depending on the root instead, and
 * its stream is reset here. The pre-scan also answers DATA and HEADERS on streams nghttp2
 * has forgotten (closed_frame) and PRIORITY on stream 0, which nghttp2 drops. Such a frame
 * is looked at once what came before it is in nghttp2, when that could have changed its
 * stream: a HEADERS frame scanned but not fed (top_id is behind), or a frame that may close
 * the stream (RST_STREAM, END_STREAM; `dirty`, one bit per id modulo 64). A frame's start
 * split across reads waits in scan_hd, unfed, until it is whole. Common case: one look at
 * each frame header, and one call to nghttp2. Returns what nghttp2_session_mem_recv
 * returns, or H2_ANSWERED. */
static ssize_t recv_frames(ms_h2_t *h2, const uint8_t *p, size_t n)
{
    size_t pos = 0, fed = 0, hold = n;
    ssize_t rc;
    int32_t scan_top = h2->top_id; /* the highest HEADERS id scanned, fed or not */
    uint64_t dirty = 0;
    while (pos < n) {
        if (h2->scan_skip > 0) {
            size_t k = n - pos < h2->scan_skip ? n - pos : h2->scan_skip;
            pos += k;
            h2->scan_skip -= (uint32_t)k;
            continue;
        }
        size_t start = pos, have;
        uint8_t *hd = (uint8_t *)(uintptr_t)(p + pos), copy[H2_SCAN_HEAD];
        if (h2->scan_len == 0 && n - pos >= 9 && n - pos >= (have = scan_want(hd))) {
            pos += have; /* the common case: whole in this read, looked at where it lies */
        } else {
            /* Split across reads: gathered, the header first, then what it says to look at. */
            size_t need = h2->scan_len < 9 ? 9 : scan_want(h2->scan_hd);
            for (int round = 0; round < 2 && pos < n; round++) {
                size_t k = need - h2->scan_len < n - pos ? need - h2->scan_len : n - pos;
                memcpy(h2->scan_hd + h2->scan_len, p + pos, k);
                h2->scan_len = (uint8_t)(h2->scan_len + k);
                pos += k;
                if (h2->scan_len < need)
                    break;
                need = scan_want(h2->scan_hd);
            }
            if (h2->scan_len < 9 || h2->scan_len < scan_want(h2->scan_hd)) {
                hold = start; /* (pos == n) held back until the rest comes */
                break;
            }
            hd = h2->scan_hd;
            have = h2->scan_len;
            h2->scan_len = 0;
        }
        size_t len = (size_t)hd[0] << 16 | (size_t)hd[1] << 8 | hd[2];
        h2->scan_skip = (uint32_t)(9 + len - have);
        uint8_t *dep = have > 9 ? scan_self_dependency(hd, have) : NULL;
        uint32_t id =
            (uint32_t)(hd[5] & 0x7f) << 24 | (uint32_t)hd[6] << 16 | (uint32_t)hd[7] << 8 | hd[8];
        uint64_t bit = (uint64_t)1 << (id / 2 % 64), own_dirty = 0;
        int32_t own_top = -1; /* what this frame does to scan_top and dirty */
        int closed = 0;       /* the frame may be on a closed stream, or is PRIORITY on stream 0 */
        if (hd[3] <= NGHTTP2_HEADERS && (id & 1)) {
            if ((int32_t)id <= scan_top)
                closed = (int32_t)id > h2->top_id || (dirty & bit) ||
                         closed_state(h2, id) != CLOSED_OTHER;
            else if (hd[3] == NGHTTP2_HEADERS)
                scan_top = own_top = (int32_t)id;
            if (hd[4] & NGHTTP2_FLAG_END_STREAM)
                dirty |= own_dirty = bit;
        } else if (hd[3] == NGHTTP2_RST_STREAM) {
            dirty |= own_dirty = bit;
        } else if (hd[3] == NGHTTP2_PRIORITY && id == 0) {
            closed = 1;
        }
        if (MS_LIKELY(dep == NULL && !closed && hd != h2->scan_hd))
            continue;
        /* This frame's start goes to nghttp2 from here, after what came before it: what came
         * before is now in nghttp2's state and top_id, but this frame (whose rest is fed with
         * the frames after it) still counts for them (5.1: a lower HEADERS id after it, DATA
         * after its RST_STREAM or END_STREAM). */
        if ((rc = feed_ng(h2, p + fed, start - fed)) < 0)
            return rc;
        fed = start;
        scan_top = own_top > h2->top_id ? own_top : h2->top_id;
        dirty = own_dirty;
        if (closed && (rc = closed_frame(h2, hd[3], id)) < 0)
            return rc;
        if (dep != NULL) {
            memcpy(copy, hd, have);
            memset(copy + (dep - hd), 0, 4); /* on the root, not exclusive */
            if ((rc = self_dependent(h2, (int32_t)id, hd[3])) < 0)
                return rc;
            hd = copy;
        }
        if ((rc = feed_ng(h2, hd, have)) < 0)
            return rc;
        fed = pos;
    }
    return feed_ng(h2, p + fed, hold - fed);
}

/* Bytes of the connection; the first start with the client's preface, and make the session. */
static void h2_feed(ms_conn_t *c, const char *data, size_t len)
{
    ms_h2_t *h2 = c->pstate;
    if (MS_UNLIKELY(h2 == NULL)) {
        h2 = session_new(c);
        if (h2 == NULL) {
            ms__conn_close(c, 0);
            return;
        }
        c->pstate = h2;
    }
    h2->trimmed = 0; /* (the frame buffer's pages come back as frames are written) */
    ms__conn_hold(c);
    uint32_t in_feed = c->flags & MS_CONN_IN_FEED;
    c->flags |= MS_CONN_IN_FEED;
    ssize_t n = recv_frames(h2, (const uint8_t *)data, len);
    c->flags = (c->flags & ~MS_CONN_IN_FEED) | in_feed;
    if (n < 0 && n != H2_ANSWERED) {
        char peer[64];
        ms_conn_peer(c, peer, sizeof(peer));
        ms_log(MS_LOG_INFO, "%s: HTTP/2: %s", peer, nghttp2_strerror((int)n));
        c->server->stats->bad_requests++;
        if (n == NGHTTP2_ERR_BAD_CLIENT_MAGIC)
            ms__conn_close(c, 0);
        else
            nghttp2_session_terminate_session(h2->ng, n == NGHTTP2_ERR_FLOODED
                                                          ? NGHTTP2_ENHANCE_YOUR_CALM
                                                          : NGHTTP2_PROTOCOL_ERROR);
    }
    if (!in_feed) {
        h2_flush(c);
        /* Handlers that waited for room while the read went on: the write may have made it. */
        if (h2_of(c) != NULL && !(c->flags & MS_CONN_CLOSED))
            h2_drain_check(c);
    }
    /* A connection made while the server drains: the streams it sent first are taken, and
     * it is told to go, as the connections before it were (ms_server_drain). */
    if (MS_UNLIKELY(c->server->stopping) && h2_of(c) == h2 && !(c->flags & MS_CONN_CLOSED) &&
        h2->going_away == GOAWAY_NONE)
        h2_stop(c);
    ms__conn_rearm(c);
    ms__conn_release(c);
}

/* The connection's one deadline, for what its streams wait for, the most pressing first:
 * replies the client does not take (its windows shut, or its socket full: send_timeout), a
 * head not whole (head_timeout, from when a stream's head began). A body a handler waits for
 * has its own deadline, per stream (body_check). Streams at work in their handlers have none
 * here; with no stream open, the idle timeout. */
static void h2_rearm(ms_conn_t *c)
{
    ms_server_t *s = c->server;
    const ms_limits_t *lim = &s->limits;
    ms_h2_t *h2 = c->pstate;
    if (h2 != NULL && h2->nstreams > 0) {
        int phase = MS_PHASE_NONE;
        for (ms_stream_t *st = h2->streams; st != NULL; st = st->next) {
            if (st->closed)
                continue;
            if (st->out != NULL && st->out->bytes > 0) {
                phase = MS_PHASE_SEND;
                break;
            }
            if (!st->dispatched)
                phase = MS_PHASE_HEAD;
        }
        if (phase == MS_PHASE_NONE) {
            c->phase = MS_PHASE_NONE;
            ms_timer_stop(s, &c->timer);
        } else if (c->phase != phase) {
            ms__conn_arm(c, phase,
                         phase == MS_PHASE_SEND ? lim->send_timeout_ms : lim->head_timeout_ms);
        }
        return;
    }
    ms__conn_idle(c); /* (no stream open: the reply queue goes back, as HTTP/1.1's does) */
    if (h2 != NULL && h2->framebuf != NULL && !h2->trimmed && !s->stopping &&
        lim->idle_timeout_ms > H2_SETTLE_MS) {
        if (c->phase != MS_PHASE_SETTLE)
            ms__conn_arm(c, MS_PHASE_SETTLE, H2_SETTLE_MS);
        return;
    }
    ms__conn_arm_idle(c);
}

/* A deadline of h2_rearm() passed: one log line, then GOAWAY and a close (at once for a
 * client that takes nothing). Handlers still at work learn that their streams are gone. */
static void h2_timeout(ms_conn_t *c, int phase)
{
    if (phase == MS_PHASE_SETTLE) {
        h2_settle(c);
        return;
    }
    char peer[64];
    ms_conn_peer(c, peer, sizeof(peer));
    ms_log(MS_LOG_INFO, "%s: HTTP/2: closed: %s", peer,
           phase == MS_PHASE_SEND ? "the client took no reply bytes for send_timeout"
                                  : "head not complete within head_timeout");
    if (phase == MS_PHASE_SEND || c->pstate == NULL) {
        ms__conn_close(c, 0);
        return;
    }
    ms__conn_hold(c);
    nghttp2_session_terminate_session(h2_of(c)->ng, NGHTTP2_NO_ERROR);
    h2_flush(c);
    if (!(c->flags & MS_CONN_CLOSED))
        ms__conn_close(c, 1);
    ms__conn_release(c);
}

static void h2_drain_check(ms_conn_t *c)
{
    /* A woken handler may finish, and its stream go, at once: start over after each. */
    for (int woke = 1; woke && h2_of(c) != NULL;) {
        woke = 0;
        for (ms_stream_t *st = h2_of(c)->streams; st != NULL; st = st->next) {
            ms_req_t *r = &st->req;
            if (r->v.wait == MS_WAIT_DRAIN &&
                (r->drain_all ? ms__req_queued(r) == 0 : !ms_reply_congested(r))) {
                ms__req_wake(r, MS_WAIT_DRAIN);
                woke = 1;
                break;
            }
        }
    }
}

static void notice_expired(ms_timer_t *t)
{
    ms_h2_t *h2 = container_of(t, ms_h2_t, notice);
    goaway(h2);
    if (!(h2->conn->flags & MS_CONN_CLOSED))
        h2_flush(h2->conn); /* (which closes a connection with nothing left to do) */
}

/* The server stops: a GOAWAY notice and a PING, whose answer brings the last GOAWAY
 * (on_frame_recv), or H2_NOTICE_MS. */
static void h2_stop(ms_conn_t *c)
{
    ms_h2_t *h2 = c->pstate;
    if (h2 == NULL || h2->going_away)
        return;
    h2->going_away = GOAWAY_NOTICE;
    if (nghttp2_submit_shutdown_notice(h2->ng) != 0 ||
        nghttp2_submit_ping(h2->ng, NGHTTP2_FLAG_NONE, (const uint8_t *)GOAWAY_PING) != 0)
        goaway(h2);
    else
        ms_timer_start(c->server, &h2->notice, H2_NOTICE_MS, notice_expired);
    h2_flush(c);
    ms__conn_rearm(c);
}

/* The connection is closing: handlers still at work learn that their streams are gone. */
static void h2_abort(ms_conn_t *c)
{
    ms_h2_t *h2 = c->pstate;
    if (h2 == NULL)
        return;
    ms_timer_stop(c->server, &h2->notice);
    for (ms_stream_t *st = h2->streams; st != NULL; st = st->next)
        st->closed = 1;
    /* A woken handler may finish, and its stream go, at once: start over after each. */
    for (int woke = 1; woke;) {
        woke = 0;
        for (ms_stream_t *st = h2->streams; st != NULL; st = st->next) {
            ms_req_t *r = &st->req;
            if ((r->v.flags & MS_REQ_IN_HANDLER) && !(r->v.flags & MS_REQ_ABORTED)) {
                ms__req_abort(r);
                woke = 1;
                break;
            }
        }
    }
}

static void h2_free(ms_server_t *s, void *pstate)
{
    ms_h2_t *h2 = pstate;
    ms_timer_stop(s, &h2->notice);
    while (h2->streams != NULL)
        stream_free(h2->streams);
    nghttp2_session_del(h2->ng);
    ms_mem_free(h2);
}

/* -- The protocol's table ----------------------------------------------------------------- */

/* "Upgrade: h2c" with its HTTP2-Settings, on a connection's first request, without a body
 * (RFC 7540 3.2): the request becomes stream 1 of an HTTP/2 connection. */
static int h2_upgrade_ok(ms_req_t *r)
{
    const ms_str_t *up = ms_req_header(r, "upgrade", 7);
    return up != NULL && up->len == 3 && ms__ieq(up->base, "h2c", 3) && r->conn->requests == 0 &&
           ms_req_header(r, "http2-settings", 14) != NULL && r->v.content_length <= 0 &&
           !(r->v.flags & MS_REQ_HAS_BODY);
}

static void h2_eof(ms_conn_t *c)
{
    ms__conn_close(c, 0); /* a client that shuts its side has ended the session */
}

static void h2_nothing(ms_conn_t *c)
{
    (void)c; /* (nothing waits for a handler's call into the core to return) */
}

static void h2_body_piece(ms_req_t *r, const char *p, size_t len, int owner, int32_t anchor)
{
    ms__req_queue_body(r, stream_out(r), p, len, owner, anchor);
}

static void h2_req_nothing(ms_req_t *r)
{
    (void)r; /* the body's end, with trailers, is the data source's (data_read); the client
              * sends its body without waiting for 100 Continue */
}

static size_t h2_queued(ms_req_t *r)
{
    return ms__conn_queued(r->conn) + stream_out(r)->bytes;
}

static void h2_where(ms_req_t *r, char *buf, size_t len)
{
    snprintf(buf, len, "HTTP/2 stream %d: ", (int)stream_of(r)->id);
}

/* The stream is a tunnel: 200, then DATA both ways, with no body deadline, until the taker
 * finishes the request (END_STREAM) or the client resets it. */
static void h2_tunnel(ms_req_t *r)
{
    ms_stream_t *st = stream_of(r);
    st->tunnel = 1;
    ms_timer_stop(r->conn->server, &r->timer); /* (a body deadline) */
    r->v.status = 200;
    h2_reply_head(r, -1);
    if (r->v.flags & MS_REQ_BODY_DONE)
        ms__req_tunnel_end(r, 0); /* the client had ended its side already */
}

static void h2_tunnel_read(ms_req_t *r, int on)
{
    ms_stream_t *st = stream_of(r);
    st->read_paused = (uint8_t)!on;
    if (on && st->unconsumed > 0 && !st->closed) {
        nghttp2_session_consume(st->h2->ng, st->id, st->unconsumed);
        st->unconsumed = 0;
        if (!(r->conn->flags & MS_CONN_IN_FEED))
            h2_flush_soon(r->conn);
    }
}

static void h2_worker_init(ms_server_t *s)
{
    ms_h2_worker_t *w = ms_mem_alloc(sizeof(*w));
    memset(w, 0, sizeof(*w));
    uv_prepare_init(s->loop, &w->turn);
    uv_unref((uv_handle_t *)&w->turn);
    uv_idle_init(s->loop, &w->again);
    uv_unref((uv_handle_t *)&w->again);
    s->h2 = w;
}

/* The state goes once the loop has closed both of its handles. */
static void worker_handle_closed(uv_handle_t *h)
{
    ms_h2_worker_t *w = h->data;
    if (--w->open_handles == 0)
        ms_mem_free(w);
}

static void h2_worker_free(ms_server_t *s)
{
    ms_h2_worker_t *w = s->h2;
    if (w->pending != NULL)
        write_pending(&w->turn); /* lets go of the connections it holds */
    ms__recycle_drain(&w->stream_free, stream_destroy);
    ms__blocks_drain(&w->blocks);
    w->open_handles = 2;
    w->turn.data = w->again.data = w;
    uv_close((uv_handle_t *)&w->turn, worker_handle_closed);
    uv_close((uv_handle_t *)&w->again, worker_handle_closed);
    s->h2 = NULL;
}
const ms_proto_t ms__h2_proto = {
    .counted_as = 2,
    .name = "h2",
    .feed = h2_feed,
    .eof = h2_eof,
    .write = h2_flush,
    .rearm = h2_rearm,
    .timeout = h2_timeout,
    .drain_check = h2_drain_check,
    .resume = h2_nothing,
    .stop = h2_stop,
    .abort = h2_abort,
    .free = h2_free,
    .reply_head = h2_reply_head,
    .out = stream_out,
    .body_piece = h2_body_piece,
    .body_end = h2_req_nothing,
    .send_continue = h2_req_nothing,
    .flush = h2_flush_soon,
    .finished = h2_finished,
    .fail = h2_fail,
    .refuse = h2_refuse,
    .body_taken = h2_body_taken,
    .body_wait = h2_body_wait,
    .queued = h2_queued,
    .where = h2_where,
    .tunnel = h2_tunnel,
    .tunnel_read = h2_tunnel_read,
    .upgrade = h2_upgrade,
    .upgrade_ok = h2_upgrade_ok,
    .worker_init = h2_worker_init,
    .worker_free = h2_worker_free,
};
