/* loopback.h: a libuv TCP client on 127.0.0.1 for tests: sends its bytes, reads until the
 * server ends the connection, and a bounded run of the loop until that is done. */
#ifndef MS_TEST_LOOPBACK_H
#define MS_TEST_LOOPBACK_H

#include <uv.h>

#include "../../core/moonserve.h"

typedef struct {
    uv_tcp_t h;
    uv_connect_t cr;
    uv_write_t wr;
    uv_buf_t out;   /* what it sends once connected */
    ms_buf_t got;   /* what it read; owned */
    int status;     /* connect's, or the read's end: UV_EOF when the server closed */
    int done;       /* 1 once its handle is closed */
    int half_close; /* shut its sending side after the write */
} client_t;

static void client_closed(uv_handle_t *h)
{
    ((client_t *)h->data)->done = 1;
}

static void client_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    static char rbuf[64 * 1024];
    (void)h;
    (void)hint;
    buf->base = rbuf;
    buf->len = sizeof(rbuf);
}

static void client_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    client_t *cl = st->data;
    if (n > 0) {
        size_t k = (size_t)n;
        if (cl->got.cap - cl->got.len < k + 1) {
            cl->got.cap = (cl->got.len + k + 1) * 2;
            cl->got.base = ms_mem_realloc(cl->got.base, cl->got.cap);
        }
        memcpy(cl->got.base + cl->got.len, buf->base, k);
        cl->got.len += k;
        cl->got.base[cl->got.len] = 0;
    } else if (n < 0) {
        cl->status = (int)n;
        uv_close((uv_handle_t *)&cl->h, client_closed);
    }
}

static void client_shut(uv_shutdown_t *req, int status)
{
    (void)status;
    ms_mem_free(req);
}

static void client_wrote(uv_write_t *w, int status)
{
    client_t *cl = w->data;
    if (status == 0 && cl->half_close) {
        uv_shutdown_t *req = ms_mem_alloc(sizeof(*req));
        uv_shutdown(req, (uv_stream_t *)&cl->h, client_shut);
    }
}

static void client_connected(uv_connect_t *cr, int status)
{
    client_t *cl = cr->data;
    if (status < 0) {
        cl->status = status;
        uv_close((uv_handle_t *)&cl->h, client_closed);
        return;
    }
    uv_read_start((uv_stream_t *)&cl->h, client_alloc, client_read);
    if (cl->out.len > 0) {
        cl->wr.data = cl;
        uv_write(&cl->wr, (uv_stream_t *)&cl->h, &cl->out, 1, client_wrote);
    }
}

/* Connects to 127.0.0.1:`port` and sends `req` (kept by the caller until done). */
static void client_start(client_t *cl, uv_loop_t *loop, int port, const char *req, size_t len)
{
    memset(cl, 0, sizeof(*cl));
    struct sockaddr_in sa;
    uv_ip4_addr("127.0.0.1", port, &sa);
    uv_tcp_init(loop, &cl->h);
    cl->h.data = cl;
    cl->cr.data = cl;
    cl->out = uv_buf_init((char *)req, (unsigned)len);
    uv_tcp_connect(&cl->cr, &cl->h, (const struct sockaddr *)&sa, client_connected);
}

static void client_free(client_t *cl)
{
    ms_mem_free(cl->got.base);
    cl->got.base = NULL;
}

static void loop_guard(uv_timer_t *t)
{
    *(int *)t->data = 1;
}

/* Runs `loop` until *flag is set, or `ms` pass (then returns 0). */
static int run_until(uv_loop_t *loop, const int *flag, uint64_t ms)
{
    uv_timer_t guard;
    int expired = 0;
    uv_timer_init(loop, &guard);
    guard.data = &expired;
    uv_timer_start(&guard, loop_guard, ms, 0);
    while (!*flag && !expired)
        uv_run(loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&guard, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    return *flag != 0;
}

#endif
