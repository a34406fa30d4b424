/* rawsock.c: a raw socket on a request's tunnel (ms_raw_t): bytes in, bytes out. */
#include "tunnel/rawsock.h"
#include <string.h>
#include "http/http.h"

struct ms_raw_s {
    ms_tunnel_t tunnel;
    ms_server_t *server;
    ms_req_t *req;   /* the request taken over; kept by its handler until ms_raw_free */
    ms_buf_t inq;    /* bytes from the peer not yet consumed; owned */
    size_t off;      /* ... from here */
    uint64_t send_queue;
    int32_t slot;    /* who to wake when bytes come; -1: nobody */
    uint8_t gone;    /* the peer ended, or the connection went: no more bytes come */
    uint8_t cut;     /* the connection is gone or was cut: nothing more goes either */
    uint8_t read_off;
};

/* Bytes received and not consumed past which the peer is no longer read (it is held back
 * by TCP), until the handler consumes half of them. */
#define RAW_INQ_HIGH (256 * 1024)
/* A buffer emptied by the handler is let go when it grew past this. */
#define RAW_KEEP 16384

static void wake(ms_raw_t *t)
{
    if (t->slot >= 0) {
        int32_t slot = t->slot;
        t->slot = -1;
        ms_wake(t->server, slot, 0);
    }
}

static void on_data(ms_tunnel_t *tn, const char *p, size_t n)
{
    ms_raw_t *t = tn->data;
    ms_buf_t *b = &t->inq;
    if (t->off > 0 && b->cap - b->len < n) {
        memmove(b->base, b->base + t->off, b->len - t->off);
        b->len -= t->off;
        t->off = 0;
    }
    if (b->cap - b->len < n) {
        size_t want = b->cap ? b->cap : 4096;
        while (want - b->len < n)
            want *= 2;
        b->base = ms_mem_realloc(b->base, want);
        b->cap = want;
    }
    memcpy(b->base + b->len, p, n);
    b->len += n;
    if (b->len - t->off > RAW_INQ_HIGH && !t->read_off && !t->gone) {
        t->read_off = 1;
        ms_tunnel_read(&t->tunnel, 0);
    }
    wake(t);
}

static void on_end(ms_tunnel_t *tn, int status)
{
    ms_raw_t *t = tn->data;
    t->gone = 1;
    if (status < 0) {
        t->cut = 1;
        /* A handler waiting for its sends to drain hears the end too: nothing will drain. */
        if (t->req->v.wait == MS_WAIT_DRAIN)
            ms__req_wake(t->req, MS_WAIT_DRAIN);
    }
    wake(t);
}

ms_raw_t *ms_raw_accept(ms_req_t *r, uint64_t send_queue, int *err)
{
    ms_server_t *s = r->conn->server;
    if (s->websockets >= s->limits.websockets) {
        *err = MS_EBUSY;
        return NULL;
    }
    ms_raw_t *t = ms_mem_alloc(sizeof(*t));
    memset(t, 0, sizeof(*t));
    t->server = s;
    t->req = r;
    t->slot = -1;
    t->send_queue = send_queue;
    t->tunnel.on_data = on_data;
    t->tunnel.on_end = on_end;
    t->tunnel.data = t;
    int rc = ms_req_tunnel(r, &t->tunnel);
    if (rc < 0) {
        ms_mem_free(t);
        *err = rc;
        return NULL;
    }
    /* The connection is no request in flight any more: it counts as a WebSocket does. */
    s->stats->in_flight--;
    s->websockets++;
    return t;
}

void ms_raw_free(ms_raw_t *t)
{
    ms_server_t *s = t->server;
    /* The request outlives the socket (its handler finishes it after): it must not call
     * the freed tunnel when its connection ends or it finishes. */
    if (t->req->tunnel == &t->tunnel)
        t->req->tunnel = NULL;
    /* Back to a request in flight, which ms_req_finish counts out. */
    s->websockets--;
    s->stats->in_flight++;
    ms_mem_free(t->inq.base);
    ms_mem_free(t);
}

int64_t ms_raw_peek(ms_raw_t *t, const char **p)
{
    ms_buf_t *b = &t->inq;
    *p = b->base + t->off;
    if (b->len > t->off)
        return (int64_t)(b->len - t->off);
    return t->gone ? MS_ECLOSED : 0;
}

void ms_raw_consume(ms_raw_t *t, size_t n)
{
    ms_buf_t *b = &t->inq;
    assert(n <= b->len - t->off);
    t->off += n;
    if (t->off == b->len) {
        t->off = b->len = 0;
        if (b->cap > RAW_KEEP) {
            ms_mem_free(b->base);
            b->base = NULL;
            b->cap = 0;
        }
    }
    if (t->read_off && b->len - t->off <= RAW_INQ_HIGH / 2 && !t->gone) {
        t->read_off = 0;
        ms_tunnel_read(&t->tunnel, 1);
    }
}

void ms_raw_wait(ms_raw_t *t, int32_t slot)
{
    t->slot = slot;
}

int ms_raw_send(ms_raw_t *t, const char *p, size_t len, int owner, int32_t anchor)
{
    ms_req_t *r = t->req;
    ms_server_t *s = t->server;
    if (t->cut) {
        if (owner == MS_VEC_LUA && anchor >= 0)
            s->anchor_released[s->anchor_released_n++] = anchor;
        return MS_ECLOSED;
    }
    size_t queued = r->conn->proto->queued(r);
    if (queued > 0 && queued + len > t->send_queue) {
        /* The peer does not read: the connection is cut rather than buffered without bound. */
        char peer[64];
        ms_conn_peer(r->conn, peer, sizeof(peer));
        ms_log(MS_LOG_INFO, "%s: raw request socket cut: the peer does not read (send queue "
                            "over its cap)", peer);
        if (owner == MS_VEC_LUA && anchor >= 0)
            s->anchor_released[s->anchor_released_n++] = anchor;
        t->cut = t->gone = 1;
        ms_req_fail(r);
        wake(t);
        return MS_ETOOBIG;
    }
    int rc = ms_tunnel_write(&t->tunnel, p, len, owner, anchor);
    if (rc == MS_ECLOSED)
        t->cut = 1;
    return rc;
}

uint32_t ms_raw_timeout_ms(ms_server_t *s, int send)
{
    return send ? s->limits.socket_send_timeout_ms : s->limits.socket_read_timeout_ms;
}

uint32_t ms_raw_buffer_cap(ms_server_t *s)
{
    return s->limits.raw_socket_buffer_bytes;
}

int ms_raw_closed(ms_raw_t *t)
{
    return t->cut;
}
