/* conn.c: a connection's life, its reply queue and the gathered write. */
#include "moonserve.h"

#include <assert.h>
#include <errno.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "engine/engine.h"

/* -- Life -------------------------------------------------------------------------------- */

ms_conn_t *ms_conn_new(ms_server_t *s, const ms_io_t *io, size_t extra)
{
    ms_conn_t *c = ms_mem_alloc(sizeof(*c) + extra);
    memset(c, 0, sizeof(*c));
    c->server = s;
    c->io = io;
    c->refs = 1;
    ms__conn_accept(c); /* the accept stage reads first */
    c->next = s->conns.next;
    c->prev = &s->conns;
    s->conns.next->prev = c;
    s->conns.next = c;
    s->stats->accepted++;
    s->stats->conns++;
    return c;
}

void *ms_conn_io_data(ms_conn_t *c)
{
    return c + 1;
}

ms_server_t *ms_conn_server(ms_conn_t *c)
{
    return c->server;
}

void ms_conn_peer(ms_conn_t *c, char *buf, size_t len)
{
    buf[0] = 0;
    if (c->source_known)
        ms__format_ip(c->source, buf, len);
    else if (c->io->peer != NULL && !(c->flags & MS_CONN_CLOSED))
        c->io->peer(c, buf, len);
}

int ms_conn_address(ms_conn_t *c, int local, char *buf, size_t len)
{
    buf[0] = 0;
    if (c->io->address == NULL || (c->flags & MS_CONN_CLOSED))
        return -1;
    return c->io->address(c, local, buf, len);
}

static void conn_free(ms_conn_t *c)
{
    ms_server_t *s = c->server;
    assert(c->refs == 0);
    ms_timer_stop(s, &c->timer);
    if (c->pstate != NULL)
        c->proto->free(s, c->pstate);
    if (c->pend != NULL)
        ms__out_release(s, c->pend);
    if (c->flight != NULL)
        ms__out_release(s, c->flight);
    if (c->source_counted)
        ms__source_remove(s, c);
    c->prev->next = c->next;
    c->next->prev = c->prev;
    s->stats->closed += !(c->flags & MS_CONN_NONE);
    s->stats->conns--;
    if (c->mproto)
        s->m->conns_proto[c->mproto - 1]--;
    if (c->mtls)
        s->m->conns_proto[2]--;
    /* Before the free: a stopping server's callback may look at what is left of it. */
    ms__server_conn_gone(s, c);
    ms_mem_free(c);
}

/* Closes the transport. A request still held by a handler is aborted: its replies are
 * dropped and the connection's memory lives until the handler lets go of it. */
void ms__conn_close(ms_conn_t *c, int graceful)
{
    assert(c->refs > 0);
    if (c->flags & MS_CONN_CLOSED)
        return;
    c->flags |= MS_CONN_CLOSED | MS_CONN_CLOSING;
    ms_timer_stop(c->server, &c->timer);
    c->proto->abort(c);
    if (graceful && c->io->shutdown != NULL)
        c->io->shutdown(c);
    else
        c->io->close(c);
}

void ms_conn_closed(ms_conn_t *c)
{
    ms__conn_release(c);
}

void ms__conn_release(ms_conn_t *c)
{
    assert(c->refs > 0);
    if (--c->refs == 0)
        conn_free(c);
}

void ms_conn_eof(ms_conn_t *c, int err)
{
    if (err != UV_EOF) {
        ms__conn_close(c, 0);
        return;
    }
    c->proto->eof(c);
}

void ms_conn_read_buf(ms_conn_t *c, uv_buf_t *buf)
{
    buf->base = NULL;
    if (c->proto->read_buf != NULL)
        c->proto->read_buf(c, buf);
    if (buf->base == NULL) {
        buf->base = c->server->rbuf;
        buf->len = MS_READ_BUF_SIZE;
    }
}

void ms_conn_feed(ms_conn_t *c, const char *data, size_t len)
{
    /* Bytes end idleness; a head's and a body's deadlines stay (trickling earns nothing). */
    if (c->phase == MS_PHASE_IDLE || c->phase == MS_PHASE_SETTLE)
        c->phase = MS_PHASE_NONE;
    c->proto->feed(c, data, len);
}

/* -- Reply queue ------------------------------------------------------------------------- */

ms_out_t *ms__conn_out(ms_conn_t *c)
{
    if (MS_UNLIKELY(c->pend == NULL)) {
        ms_out_t *o = ms__recycle_get(&c->server->out_free);
        if (o == NULL) {
            o = ms_mem_alloc(sizeof(*o));
            memset(o, 0, sizeof(*o));
        }
        c->pend = o;
    }
    return c->pend;
}

void ms__out_destroy(void *p)
{
    ms_out_t *o = p;
    ms_mem_free(o->buf.base);
    ms_mem_free(o->vecs);
    ms_mem_free(o->iov);
    ms_mem_free(o->chunk);
    ms_mem_free(o);
}

/* Puts a queue's Lua strings on the released list, lets go of its files and empties it. */
static inline void out_written(ms_server_t *s, ms_out_t *o);

void ms__out_clear(ms_server_t *s, ms_out_t *o)
{
    out_written(s, o);
}

/* Keeps the Lua string of `anchor` alive until what is queued before this point is written. */
void ms__out_hold(ms_server_t *s, ms_out_t *o, int32_t anchor)
{
    ms__out_vec(s, o, "", 1, MS_VEC_LUA, anchor);
    o->vecs[o->nvecs - 1].len = 0;
    o->bytes--;
}

static inline void out_written(ms_server_t *s, ms_out_t *o)
{
    for (uint32_t i = 0; o->held > 0 && i < o->nvecs; i++) {
        const ms_vec_t *v = &o->vecs[i];
        if (v->owner == MS_VEC_LUA)
            s->anchor_released[s->anchor_released_n++] = v->anchor;
        else if (v->owner == MS_VEC_FILE)
            ((ms_file_t *)v->base)->release(s, (ms_file_t *)v->base);
    }
    o->nvecs = o->pos = o->held = 0;
    o->pos_off = o->async_bytes = 0;
    o->bytes = 0;
    o->buf.len = 0;
}

void ms__out_release(ms_server_t *s, ms_out_t *o)
{
    out_written(s, o);
    if (!ms__recycle_put(&s->out_free, o))
        ms__out_destroy(o);
}

/* Makes room for `n` more bytes of text; returns where they go. */
char *ms__out_reserve(ms_out_t *o, size_t n)
{
    if (MS_UNLIKELY(o->buf.cap - o->buf.len < n)) {
        size_t cap = o->buf.cap ? o->buf.cap : 4096;
        while (cap - o->buf.len < n)
            cap *= 2;
        o->buf.base = ms_mem_realloc(o->buf.base, cap);
        o->buf.cap = cap;
    }
    return o->buf.base + o->buf.len;
}

int ms__out_vec(ms_server_t *s, ms_out_t *o, const char *base, size_t len, int owner,
                int32_t anchor)
{
    if (len == 0)
        return 0;
    o->bytes += len;
    if (owner == MS_VEC_OUT && o->nvecs > 0) {
        /* Text right after the previous text piece extends it. */
        ms_vec_t *last = &o->vecs[o->nvecs - 1];
        if (last->owner == MS_VEC_OUT && (size_t)last->base + last->len == (size_t)base) {
            last->len += len;
            return 0;
        }
    }
    if (MS_UNLIKELY(o->nvecs == o->cap)) {
        o->cap = o->cap ? o->cap * 2 : 16;
        o->vecs = ms_mem_realloc(o->vecs, o->cap * sizeof(*o->vecs));
        o->iov = ms_mem_realloc(o->iov, o->cap * sizeof(*o->iov));
    }
    ms_vec_t *v = &o->vecs[o->nvecs++];
    o->held += owner == MS_VEC_LUA || owner == MS_VEC_FILE;
    v->base = base;
    v->len = len;
    v->owner = (uint8_t)owner;
    v->anchor = anchor;
    return 0;
}

int ms__out_file(ms_server_t *s, ms_out_t *o, ms_file_t *f, uint64_t off, size_t len)
{
    if (len == 0)
        return 0;
    f->refs++;
    ms__out_vec(s, o, (const char *)f, len, MS_VEC_FILE, -1);
    o->vecs[o->nvecs - 1].off = off;
    return 0;
}

/* Closes a connection that has nothing left to write and was told to close. */
static void maybe_close(ms_conn_t *c)
{
    if ((c->flags & (MS_CONN_CLOSING | MS_CONN_CLOSED)) == MS_CONN_CLOSING && c->flight == NULL &&
        (c->pend == NULL || c->pend->nvecs == 0))
        ms__conn_close(c, 1);
}

/* Moves the queue's write position `n` bytes on. */
void ms__out_advance(ms_out_t *o, size_t n)
{
    assert(n <= o->bytes);
    o->bytes -= n;
    while (n > 0) {
        assert(o->pos < o->nvecs && o->pos_off <= o->vecs[o->pos].len);
        size_t left = o->vecs[o->pos].len - o->pos_off;
        if (n < left) {
            o->pos_off += n;
            return;
        }
        n -= left;
        o->pos++;
        o->pos_off = 0;
    }
}

/* Hands the rest of a write to the transport, to finish once the socket takes it. */
static int write_later(ms_conn_t *c, ms_out_t *o, uv_buf_t *iov, unsigned n, size_t bytes)
{
    o->async_bytes = bytes;
    int rc = c->io->write(c, iov, n);
    if (rc == 0)
        c->flags |= MS_CONN_WRITING;
    return rc;
}

/* Writes the file piece at the queue's position: sendfile while the socket takes it, up to
 * `*budget` bytes (so one large file does not hold the worker); past that, or on a full
 * socket, one part is read into a buffer and written in the background, and its completion
 * says the socket can take more. Returns 1 to go on, 0 when a write is under way, or a
 * negative code. */
static int write_file(ms_conn_t *c, ms_out_t *o, size_t *budget)
{
    ms_server_t *s = c->server;
    assert(o->pos < o->nvecs);
    const ms_vec_t *v = &o->vecs[o->pos];
    assert(v->owner == MS_VEC_FILE && o->pos_off < v->len);
    const ms_file_t *f = (const ms_file_t *)v->base;
    uint64_t off = v->off + o->pos_off;
    size_t left = v->len - o->pos_off;
    if (c->io->sendfile != NULL && *budget > 0) {
        ssize_t n = c->io->sendfile(c, f->fd, off, left < *budget ? left : *budget);
        if (n > 0) {
            ms__out_advance(o, (size_t)n);
            *budget -= (size_t)n < *budget ? (size_t)n : *budget;
            return 1;
        }
        if (n == 0)
            return UV_EIO; /* the file is shorter than when it was opened */
        if (n != UV_EAGAIN)
            return (int)n;
    }
    if (o->chunk == NULL) {
        o->chunk = ms__recycle_get(&s->chunk_free);
        if (o->chunk == NULL)
            o->chunk = ms_mem_alloc(MS_FILE_CHUNK);
    }
    /* Under cork, a small part is enough: its write completing says the socket has room,
     * and the cork joins it to the sendfile that follows, so no short segment leaves. */
    size_t part = (c->flags & MS_CONN_CORKED) ? MS_FILE_PROBE : MS_FILE_CHUNK;
    size_t want = left < part ? left : part;
    ssize_t got = pread(f->fd, o->chunk, want, (off_t)off);
    if (got <= 0)
        return got == 0 ? UV_EIO : -errno;
    uv_buf_t b = {.base = o->chunk, .len = (size_t)got};
    if (c->io->sendfile == NULL && *budget > 0) {
        /* A transport without sendfile: the part goes out like any other bytes. */
        int rc = c->io->try_write(c, &b, 1);
        if (rc < 0 && rc != UV_EAGAIN)
            return rc;
        size_t done = rc > 0 ? (size_t)rc : 0;
        ms__out_advance(o, done);
        *budget -= done < *budget ? done : *budget;
        if (done == (size_t)got)
            return 1;
        b.base += done;
        b.len -= done;
    }
    return write_later(c, o, &b, 1, b.len);
}

/* Writes a queue from its position on, as far as the socket takes it now: runs of text,
 * Lua strings and files in memory in one writev each, other files with sendfile. Returns 1
 * when all of it is written, 0 when the rest is under way in the background, or a negative
 * code. */
/* Whether the queue holds a file that goes out from the disk (not from memory). */
static int has_disk_file(const ms_out_t *o)
{
    for (uint32_t i = o->pos; i < o->nvecs; i++)
        if (o->vecs[i].owner == MS_VEC_FILE && ((const ms_file_t *)o->vecs[i].base)->data == NULL)
            return 1;
    return 0;
}

static int out_write(ms_conn_t *c, ms_out_t *o)
{
    size_t budget = MS_FILE_BURST;
    if (o->held > 0 && c->io->cork != NULL && !(c->flags & MS_CONN_CORKED) && has_disk_file(o)) {
        /* The head would leave alone in a short segment before the file: hold it back. */
        c->io->cork(c, 1);
        c->flags |= MS_CONN_CORKED;
    }
    while (o->pos < o->nvecs) {
        /* The run of pieces in memory from here: text, Lua strings, files held in memory. */
        uv_buf_t *iov = o->iov;
        unsigned n = 0;
        size_t total = 0;
        uint32_t i;
        for (i = o->pos; i < o->nvecs; i++) {
            const ms_vec_t *v = &o->vecs[i];
            char *base = (char *)v->base;
            if (v->owner == MS_VEC_OUT) {
                base = o->buf.base + (size_t)v->base;
            } else if (v->owner == MS_VEC_FILE) {
                const ms_file_t *f = (const ms_file_t *)v->base;
                if (f->data == NULL)
                    break;
                base = f->data + v->off;
            }
            iov[n].base = base;
            iov[n].len = v->len;
            total += v->len;
            n++;
        }
        if (n == 0) {
            int rc = write_file(c, o, &budget);
            if (rc <= 0)
                return rc;
            continue;
        }
        assert(o->pos_off <= iov[0].len);
        iov[0].base += o->pos_off;
        iov[0].len -= o->pos_off;
        total -= o->pos_off;
        int rc = c->io->try_write(c, iov, n);
        if (rc < 0 && rc != UV_EAGAIN)
            return rc;
        size_t done = rc > 0 ? (size_t)rc : 0;
        if (done == total) {
            o->pos = i;
            o->pos_off = 0;
            o->bytes -= done;
            continue;
        }
        ms__out_advance(o, done);
        /* The kernel's buffer is full: skip what went out, the rest waits for the socket. */
        unsigned k = 0;
        while (done >= iov[k].len) {
            done -= iov[k].len;
            k++;
        }
        iov[k].base += done;
        iov[k].len -= done;
        size_t rest = 0;
        for (unsigned j = k; j < n; j++)
            rest += iov[j].len;
        return write_later(c, o, iov + k, n - k, rest);
    }
    return 1;
}

/* Writes the queued replies: at once if the socket takes them, the rest in the background.
 * `flight` is the queue being written; replies made meanwhile gather in `pend`. */
void ms__conn_flush(ms_conn_t *c)
{
    ms_server_t *s = c->server;
    if (c->flags & MS_CONN_CLOSED) {
        if (c->pend != NULL)
            out_written(s, c->pend);
        return;
    }
    if (c->flags & MS_CONN_WRITING)
        return; /* ms_conn_write_done() comes back here */
    for (;;) {
        /* What a write left behind goes first; else the replies queued since. */
        ms_out_t *o = c->flight != NULL ? c->flight : c->pend;
        if (o == NULL || (o == c->pend && o->nvecs == 0))
            break;
        int rc = out_write(c, o);
        if (rc < 0) {
            ms__conn_close(c, 0);
            return;
        }
        if (rc == 0) {
            c->flight = o; /* the rest is under way; new replies gather in pend */
            if (o == c->pend)
                c->pend = NULL;
            ms__conn_rearm(c);
            return;
        }
        out_written(s, o);
        if (o == c->pend)
            break;
        c->flight = NULL;
        if (c->pend == NULL)
            c->pend = o; /* kept for the next reply, with its buffers */
        else
            ms__out_release(s, o);
    }
    if (c->flags & MS_CONN_CORKED) {
        c->flags &= ~MS_CONN_CORKED;
        c->io->cork(c, 0); /* all written: out with the last segment */
    }
    maybe_close(c);
}

void ms_conn_write_done(ms_conn_t *c, int status)
{
    ms_server_t *s = c->server;
    ms_out_t *o = c->flight;
    c->flags &= ~MS_CONN_WRITING;
    if (o != NULL) {
        if (o->chunk != NULL) {
            if (!ms__recycle_put(&s->chunk_free, o->chunk))
                ms_mem_free(o->chunk);
            o->chunk = NULL;
        }
        if (status >= 0)
            ms__out_advance(o, o->async_bytes);
        o->async_bytes = 0;
    }
    if (status < 0) {
        ms__conn_close(c, 0);
        return;
    }
    if (c->phase == MS_PHASE_SEND)
        c->phase = MS_PHASE_NONE; /* progress */
    c->proto->write(c);           /* (HTTP/2's frames that waited for room) */
    ms__conn_drain_check(c);
    ms__conn_rearm(c);
}

size_t ms__conn_queued(ms_conn_t *c)
{
    return (c->pend ? c->pend->bytes : 0) + (c->flight ? c->flight->bytes : 0);
}

/* Reply bytes of `r` not yet written: the connection's, and on HTTP/2 its stream's. */
size_t ms__req_queued(ms_req_t *r)
{
    return r->conn->proto->queued(r);
}

int ms_reply_congested(ms_req_t *r)
{
    return ms__req_queued(r) > MS_OUT_HIGH_WATER;
}

/* Gives an idle connection's reply queue back to the worker. */
void ms__conn_idle(ms_conn_t *c)
{
    if (c->pend != NULL && c->pend->nvecs == 0 && c->flight == NULL) {
        ms__out_release(c->server, c->pend);
        c->pend = NULL;
    }
}

/* -- Anchors ------------------------------------------------------------------------------ */

int32_t ms_anchor_get(ms_server_t *s)
{
    if (s->anchor_free_n > 0)
        return s->anchor_free[--s->anchor_free_n];
    if ((uint32_t)s->anchor_next == s->anchor_cap) {
        s->anchor_cap = s->anchor_cap ? s->anchor_cap * 2 : 256;
        s->anchor_free = ms_mem_realloc(s->anchor_free, s->anchor_cap * sizeof(int32_t));
        s->anchor_released = ms_mem_realloc(s->anchor_released, s->anchor_cap * sizeof(int32_t));
    }
    return s->anchor_next++;
}

int ms_anchor_drain(ms_server_t *s, int32_t *out, int n)
{
    int k = 0;
    while (k < n && s->anchor_released_n > 0) {
        int32_t slot = s->anchor_released[--s->anchor_released_n];
        out[k++] = slot;
        s->anchor_free[s->anchor_free_n++] = slot;
    }
    return k;
}

/* Queues `n` bytes that were written at the queue's text end by the caller. */
void ms__out_commit(ms_server_t *s, ms_out_t *o, size_t n)
{
    size_t off = o->buf.len;
    o->buf.len += n;
    ms__out_vec(s, o, (const char *)off, n, MS_VEC_OUT, -1);
}

void ms__out_text(ms_server_t *s, ms_out_t *o, const char *p, size_t n)
{
    memcpy(ms__out_reserve(o, n), p, n);
    ms__out_commit(s, o, n);
}

/* Whether bytes from the peer wait, unread, with reading on: in the socket, or in the
 * transport (TLS: decrypted, not yet handed up). */
static int request_waiting(ms_conn_t *c)
{
    if (c->flags & MS_CONN_READ_OFF)
        return 0;
    if (c->io->pending != NULL && c->io->pending(c))
        return 1;
    int fd = c->io->fd != NULL ? c->io->fd(c) : -1, n = 0;
    return fd >= 0 && ioctl(fd, FIONREAD, &n) == 0 && n > 0;
}

static void timer_expired(ms_timer_t *t)
{
    ms_conn_t *c = container_of(t, ms_conn_t, timer);
    int phase = c->phase;
    c->phase = MS_PHASE_NONE;
    if (phase == MS_PHASE_IDLE) {
        if (request_waiting(c)) {
            /* Its next request came as the idle time (or a stop's grace) ended, and is still
             * unread, as deadlines run before the loop reads: it is answered (with
             * "connection: close" when stopping), not lost under the close. */
            ms__conn_arm(c, MS_PHASE_IDLE, MS_STOP_GRACE_MS);
            return;
        }
        ms__conn_close(c, 0);
        return;
    }
    if (phase != MS_PHASE_SETTLE)
        c->server->stats->timeouts++;
    c->proto->timeout(c, phase);
}

void ms__conn_arm(ms_conn_t *c, int phase, uint32_t ms)
{
    c->phase = (uint8_t)phase;
    ms_timer_start(c->server, &c->timer, ms, timer_expired);
}

/* Points the connection's one timer at what it waits for now: the socket to take a reply
 * (send_timeout, reset by progress), or what its protocol waits for. */
void ms__conn_rearm(ms_conn_t *c)
{
    if (c->flags & MS_CONN_CLOSED)
        return;
    if (c->flight != NULL) {
        if (c->phase != MS_PHASE_SEND)
            ms__conn_arm(c, MS_PHASE_SEND, c->server->limits.send_timeout_ms);
        return;
    }
    c->proto->rearm(c);
}

/* Waits for the next request: idle_timeout, or a short grace once the server stops. */
void ms__conn_arm_idle(ms_conn_t *c)
{
    ms_server_t *s = c->server;
    uint32_t ms = s->limits.idle_timeout_ms;
    if (s->stopping && s->delay_over && c->requests > 0) {
        /* A drain's delay is over, and this connection has been idle all through it (each
         * reply since the drain began said close; HTTP/2 had its GOAWAY): the balancer has
         * stopped using it. It closes now, through the deadline (a request already here is
         * still answered), not a grace later, when a balancer that took the instance out
         * for a failure timeout (nginx's fail_timeout) may be trying it again on this very
         * connection. */
        ms = 0;
    } else if (s->stopping && ms > MS_STOP_GRACE_MS + ms__drain_left(s)) {
        /* Draining, a balancer may still send a request on it until the delay is over, and a
         * client whose request is on its way gets a grace after that. */
        ms = (uint32_t)(MS_STOP_GRACE_MS + ms__drain_left(s));
    }
    if (c->phase != MS_PHASE_IDLE || s->stopping)
        ms__conn_arm(c, MS_PHASE_IDLE, ms);
}

/* A new connection gets head_timeout for its first request. */
void ms__conn_start(ms_conn_t *c)
{
    ms__conn_arm(c, MS_PHASE_HEAD, c->server->limits.head_timeout_ms);
}
