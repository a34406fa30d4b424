/* memio.c: the in-memory transport. */
#include "transport/memio.h"

#include <stdio.h>

#include "engine/engine.h"

static ms_memio_t *memio_of(ms_conn_t *c)
{
    return *(ms_memio_t **)ms_conn_io_data(c);
}

static void gather(ms_buf_t *b, const uv_buf_t *bufs, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        ms__buf_append(b, bufs[i].base, bufs[i].len);
}

static int mem_try_write(ms_conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    ms_memio_t *m = memio_of(c);
    if (m->congested)
        return UV_EAGAIN;
    size_t before = m->out.len;
    gather(&m->out, bufs, n);
    return (int)(m->out.len - before);
}

static int mem_write(ms_conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    ms_memio_t *m = memio_of(c);
    gather(&m->held, bufs, n);
    ms__conn_hold(c); /* as a socket write would, the pending write holds the connection */
    return 0;
}

static void mem_read_stop(ms_conn_t *c)
{
    memio_of(c)->reading = 0;
}

static void mem_read_start(ms_conn_t *c)
{
    memio_of(c)->reading = 1;
}

static void mem_end(ms_conn_t *c, int graceful)
{
    ms_memio_t *m = memio_of(c);
    m->closed = graceful ? 1 : 2;
    m->conn = NULL;
    if (m->wake > 0) /* the opener hears of it once the calls under way have returned */
        ms_wake(ms_conn_server(c), m->wake - 1, 0);
    if (m->held.len > 0 && m->held.base != NULL) {
        m->held.len = 0;
        ms__io_write_done(c, UV_ECANCELED);
        ms__conn_release(c);
    }
    ms__io_closed(c);
}

static void mem_shutdown(ms_conn_t *c)
{
    mem_end(c, 1);
}

static void mem_close(ms_conn_t *c)
{
    mem_end(c, 0);
}

static const char *mem_alpn(ms_conn_t *c)
{
    return memio_of(c)->alpn;
}

static void mem_peer(ms_conn_t *c, char *buf, size_t len)
{
    snprintf(buf, len, "memory");
}

static const ms_io_t mem_io = {
    .try_write = mem_try_write,
    .write = mem_write,
    .read_stop = mem_read_stop,
    .read_start = mem_read_start,
    .shutdown = mem_shutdown,
    .close = mem_close,
    .peer = mem_peer,
    .alpn = mem_alpn,
};

ms_conn_t *ms_memio_open(ms_server_t *s, ms_memio_t *m)
{
    return ms_memio_open_ex(s, m, 0);
}

/* The memory transport's own part: a pointer to `m`, then the `extra` bytes. */
#define MEMIO_OWN 16

ms_conn_t *ms_memio_open_ex(ms_server_t *s, ms_memio_t *m, size_t extra)
{
    memset(m, 0, sizeof(*m));
    ms_conn_t *c = ms_conn_new(s, &mem_io, MEMIO_OWN + extra);
    *(ms_memio_t **)ms_conn_io_data(c) = m;
    m->conn = c;
    m->reading = 1;
    ms__conn_start(c);
    return c;
}

void ms_memio_feed(ms_memio_t *m, const char *p, size_t n)
{
    if (m->conn != NULL)
        ms__io_feed(m->conn, p, n);
}

size_t ms_memio_read(ms_memio_t *m, const char *p, size_t n)
{
    size_t taken = 0;
    while (m->conn != NULL && m->reading && n > 0) {
        uv_buf_t buf;
        ms__io_read_buf(m->conn, &buf);
        size_t k = n < buf.len ? n : buf.len;
        memcpy(buf.base, p, k);
        ms__io_feed(m->conn, buf.base, k);
        p += k;
        n -= k;
        taken += k;
    }
    return taken;
}

void ms_memio_drain(ms_memio_t *m)
{
    if (m->conn == NULL || m->held.len == 0)
        return;
    ms_conn_t *c = m->conn;
    ms__buf_append(&m->out, m->held.base, m->held.len);
    m->held.len = 0;
    ms__io_write_done(c, 0);
    ms__conn_release(c);
}

void ms_memio_peer_close(ms_memio_t *m, int err)
{
    if (m->conn != NULL)
        ms__io_eof(m->conn, err);
}

uint32_t ms_memio_tag(ms_conn_t *c)
{
    return c->io == &mem_io ? memio_of(c)->tag : 0;
}

void *ms_memio_extra(ms_conn_t *c)
{
    return (char *)ms_conn_io_data(c) + MEMIO_OWN;
}

void ms_memio_free(ms_memio_t *m)
{
    ms_mem_free(m->out.base);
    ms_mem_free(m->held.base);
    m->out.base = m->held.base = NULL;
    m->out.len = m->held.len = 0;
    m->out.cap = m->held.cap = 0;
}
