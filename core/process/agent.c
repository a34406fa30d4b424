/* agent.c: HAProxy's agent-check responder: one line a connection, the instance's state. */
#include "process/agent.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"

/* HAProxy's agent-check connects, reads one line and closes (configuration manual, 5.2,
 * "agent-check"): "ready" puts a server that was drained or in maintenance back, "drain"
 * sends it no new connections (only persistent ones), "maint" takes it out. The state lives
 * here, in the process that outlives its workers (the master), so that a reload, whose old
 * and new workers both serve, never shows as a drain. */
struct ms_agent_s {
    uv_tcp_t tcp; /* first: the handle's close frees the agent */
    char *maint;  /* owned; NULL: never in maintenance */
    int draining;
};

typedef struct peer_s {
    uv_tcp_t tcp;
    uv_timer_t timer; /* bounds the wait for the peer's close */
    uv_shutdown_t shutdown;
    int handles;
    char line[16];
} peer_t;

/* How long a peer may keep its side open after the reply (HAProxy closes at once). */
#define MS_AGENT_LINGER_MS 2000

const char *ms_agent_word(ms_agent_t *a)
{
    struct stat st;
    if (a->maint != NULL && stat(a->maint, &st) == 0)
        return "maint";
    return a->draining ? "drain" : "ready";
}

static void peer_closed(uv_handle_t *h)
{
    peer_t *p = h->data;
    if (--p->handles == 0)
        ms_mem_free(p);
}

static void peer_close(peer_t *p)
{
    if (!uv_is_closing((uv_handle_t *)&p->tcp)) {
        uv_close((uv_handle_t *)&p->tcp, peer_closed);
        uv_close((uv_handle_t *)&p->timer, peer_closed);
    }
}

static void peer_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    peer_t *p = h->data;
    (void)hint;
    *buf = uv_buf_init(p->line, sizeof(p->line)); /* (what it sends is read and dropped) */
}

static void peer_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    (void)buf;
    if (n < 0)
        peer_close(st->data); /* its close (or an error): ours follows, a FIN, no RST */
}

static void peer_timeout(uv_timer_t *t)
{
    peer_close(t->data);
}

/* The reply's FIN has gone: wait for the peer's, reading what it sent (HAProxy's
 * agent-send), so that the close finds no unread bytes, which would make it an RST that can
 * destroy the reply before the peer reads it (RFC 9293 3.6.1). */
static void peer_shut(uv_shutdown_t *req, int status)
{
    peer_t *p = req->handle->data;
    if (status < 0 || uv_read_start((uv_stream_t *)&p->tcp, peer_alloc, peer_read) < 0)
        peer_close(p);
}

static void on_agent(uv_stream_t *ls, int status)
{
    ms_agent_t *a = ls->data;
    if (status < 0)
        return;
    peer_t *p = ms_mem_alloc(sizeof(*p));
    uv_tcp_init(ls->loop, &p->tcp);
    uv_timer_init(ls->loop, &p->timer);
    p->tcp.data = p->timer.data = p;
    p->handles = 2;
    if (uv_accept(ls, (uv_stream_t *)&p->tcp) == 0) {
        const char *w = ms_agent_word(a);
        size_t n = strlen(w);
        memcpy(p->line, w, n);
        p->line[n++] = '\n';
        /* A few bytes into an empty socket buffer: they go at once, or the check fails
         * and HAProxy keeps the state it had (a failed agent changes nothing). */
        uv_buf_t b = uv_buf_init(p->line, (unsigned)n);
        if (uv_try_write((uv_stream_t *)&p->tcp, &b, 1) == (int)n &&
            uv_shutdown(&p->shutdown, (uv_stream_t *)&p->tcp, peer_shut) == 0) {
            uv_timer_start(&p->timer, peer_timeout, MS_AGENT_LINGER_MS, 0);
            uv_unref((uv_handle_t *)&p->timer); /* (the loop's end does not wait for it) */
            return;
        }
    }
    peer_close(p);
}

int ms_agent_start(uv_loop_t *loop, const char *addr, const char *maint_file, ms_agent_t **out)
{
    int fd = ms_listen_fd(addr, 64, -1);
    if (fd < 0)
        return fd;
    ms_agent_t *a = ms_mem_alloc(sizeof(*a));
    memset(a, 0, sizeof(*a));
    a->maint = ms_mem_strdup(maint_file);
    uv_tcp_init(loop, &a->tcp);
    a->tcp.data = a;
    int rc = uv_tcp_open(&a->tcp, fd);
    if (rc < 0)
        close(fd); /* (not the handle's yet) */
    else
        rc = uv_listen((uv_stream_t *)&a->tcp, 64, on_agent);
    if (rc < 0) {
        ms_agent_close(a);
        return rc;
    }
    uv_unref((uv_handle_t *)&a->tcp);
    *out = a;
    return 0;
}

void ms_agent_drain(ms_agent_t *a)
{
    if (a != NULL)
        a->draining = 1;
}

static void agent_closed(uv_handle_t *h)
{
    ms_agent_t *a = h->data;
    ms_mem_free(a->maint);
    ms_mem_free(a);
}

void ms_agent_close(ms_agent_t *a)
{
    if (a != NULL && !uv_is_closing((uv_handle_t *)&a->tcp))
        uv_close((uv_handle_t *)&a->tcp, agent_closed);
}
