/* server.c: a worker's server: its life, listeners and accepted TCP connections. */
#include "moonserve.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http/accesslog.h"
#include "process/channel.h"
#include "internal.h"
#include "tunnel/ws.h"
#include "client/sock.h"
#include "http/static/static.h"

/* Accept at most this many connections per readiness event: a connect flood must not
 * starve reads on connections we already have. */
#define MS_ACCEPT_BURST 64

typedef struct ms_listener_s {
    uv_tcp_t tcp;
    ms_server_t *server;
    int flags;     /* MS_LISTEN_* */
    ms_tls_t *tls; /* a TLS listener's settings (the server's); NULL: plain TCP */
    struct ms_listener_s *next;
} ms_listener_t;

static void on_connection(uv_stream_t *ls, int status)
{
    ms_listener_t *l = (ms_listener_t *)ls;
    ms_server_t *s = l->server;
    if (status < 0) {
        ms_log(MS_LOG_WARN, "accept: %s", uv_strerror(status));
        return;
    }
    for (int i = 0; i < MS_ACCEPT_BURST && !s->stopping; i++) {
        ms_conn_t *c = ms__tcp_accept(s, ls, l->tls != NULL ? ms__tls_size : 0);
        if (c == NULL)
            return; /* nothing more to accept now */
        /* Caps on open connections, per worker and per source address: over them the
         * connection is closed at once, before any byte is read. A trusted proxy's
         * connections carry many clients and are not counted as one source; behind a PROXY
         * header, the client it names is counted once the header is read. */
        if (l->flags & MS_LISTEN_PROXY)
            c->flags |= MS_CONN_PROXY;
        if (l->flags & MS_LISTEN_REDIRECT_HTTPS)
            c->flags |= MS_CONN_REDIRECT;
        if (l->flags & MS_LISTEN_METRICS)
            c->flags |= MS_CONN_METRICS;
        if (l->tls != NULL) {
            c->mtls = 1;
            s->m->conns_proto[2]++;
        }
        if (s->stats->conns > s->limits.connections ||
            (c->source_known && !(c->flags & MS_CONN_PROXY) && !ms__trusted(s, c->source) &&
             ms__source_add(s, c) < 0)) {
            s->stats->refused_conns++;
            ms__log_refusals(s);
            ms__conn_close(c, 0);
            continue;
        }
        c->io->read_start(c);
        ms__conn_start(c);
        if (l->tls != NULL) /* (after the caps: a refused connection costs no TLS state) */
            ms__tls_wrap(c, l->tls, ms__tcp_extra(c));
    }
}

/* -- Server ------------------------------------------------------------------------------ */

void ms_limits_default(ms_limits_t *l)
{
#define MS_LIMIT_DEFAULT(key, field, type, dflt, unit, max, doc)                                   \
    l->field = (type)((dflt)*MS_UNIT_SCALE(unit));
    MS_LIMITS(MS_LIMIT_DEFAULT)
#undef MS_LIMIT_DEFAULT
}

ms_server_t *ms_server_new(uv_loop_t *loop, const ms_limits_t *limits, ms_request_cb on_request,
                           ms_request_cb on_resume, void *data)
{
    ms_server_t *s = ms_mem_alloc(sizeof(*s));
    memset(s, 0, sizeof(*s));
    s->m = &s->own_m;
    s->stats = &s->own_m.stats;
    s->loop = loop;
    if (limits)
        s->limits = *limits;
    else
        ms_limits_default(&s->limits);
    s->on_request = on_request;
    s->on_resume = on_resume;
    s->data = data;
    s->rbuf = ms_mem_alloc(MS_READ_BUF_SIZE);
    s->https_port = 443;
    s->conns.next = s->conns.prev = &s->conns;
    ms__protos_init(s);
    uv_timer_init(loop, &s->uv_timer); /* armed, it keeps the loop alive: a parked handler
                                        * is work still to do */
    uv_idle_init(loop, &s->wake_idle);
    return s;
}

int ms_server_listen_fd(ms_server_t *s, int fd, int flags)
{
    ms_listener_t *l = ms_mem_alloc(sizeof(*l));
    l->server = s;
    l->flags = flags;
    l->tls = NULL;
    uv_tcp_init(s->loop, &l->tcp);
    int rc = uv_tcp_open(&l->tcp, fd);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&l->tcp, MS_LISTEN_BACKLOG, on_connection);
    if (rc < 0) {
        uv_close((uv_handle_t *)&l->tcp, (uv_close_cb)ms_mem_free);
        return rc;
    }
    s->listen_port = (uint32_t)ms_fd_port(fd);
    l->next = s->listeners;
    s->listeners = l;
    return 0;
}

int ms_server_listen(ms_server_t *s, const char *addr, int backlog, int flags)
{
    struct sockaddr_storage ss;
    int rc = ms__parse_addr(addr, &ss);
    if (rc < 0)
        return rc;
    ms_listener_t *l = ms_mem_alloc(sizeof(*l));
    l->server = s;
    l->flags = flags;
    l->tls = NULL;
    uv_tcp_init_ex(s->loop, &l->tcp, ss.ss_family);
    uv_os_fd_t fd;
    uv_fileno((uv_handle_t *)&l->tcp, &fd);
    int one = 1;
    /* Workers each listen on the same port; the kernel spreads connections among them. */
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    rc = uv_tcp_bind(&l->tcp, (struct sockaddr *)&ss, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&l->tcp, backlog > 0 ? backlog : MS_LISTEN_BACKLOG,
                       on_connection);
    if (rc < 0) {
        uv_close((uv_handle_t *)&l->tcp, (uv_close_cb)ms_mem_free);
        return rc;
    }
    struct sockaddr_storage bound;
    int blen = sizeof(bound);
    uv_tcp_getsockname(&l->tcp, (struct sockaddr *)&bound, &blen);
    s->listen_port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                       : ((struct sockaddr_in *)&bound)->sin_port);
    l->next = s->listeners;
    s->listeners = l;
    return 0;
}

void ms_server_https_port(ms_server_t *s, int port)
{
    s->https_port = (uint16_t)port;
}

int ms_server_listen_tls(ms_server_t *s, ms_tls_t *t)
{
    if (s->listeners == NULL || t == NULL || !ms__tls_ready(t))
        return UV_EINVAL;
    s->listeners->tls = t;
    return 0;
}

int ms_server_port(ms_server_t *s)
{
    return (int)s->listen_port;
}

int ms_server_stopping(ms_server_t *s)
{
    return s->stopping;
}

uv_loop_t *ms_server_loop(ms_server_t *s)
{
    return s->loop;
}

const ms_server_stats_t *ms_server_stats(ms_server_t *s)
{
    return s->stats;
}

/* Work the handler's calls into the core could not do on the spot (it may not call back
 * into Lua), done when the outermost call into Lua returns: connections to move on, then
 * the wakes made meanwhile (ms_wake). */
static void run_deferred(ms_server_t *s)
{
    while (s->deferred != NULL) {
        ms_conn_t *c = s->deferred;
        s->deferred = c->deferred_next;
        c->deferred_next = NULL;
        c->flags &= ~MS_CONN_DEFERRED;
        c->proto->resume(c);
        ms__conn_release(c);
    }
    if (s->woken != NULL && !s->woken_running)
        ms__wakes_run(s);
}

void ms__server_leave(ms_server_t *s)
{
    if (--s->depth == 0)
        run_deferred(s);
}

/* Every call into the handler goes through here, or through ms__server_event for a wake
 * that is no request's: the same depth, the same deferred work. */
void ms__server_call(ms_server_t *s, ms_request_cb cb, ms_req_t *r)
{
    s->depth++;
    cb(r, s->data);
    if (--s->depth == 0)
        run_deferred(s);
}

void ms__server_event(ms_server_t *s, int32_t slot, int status)
{
    s->depth++;
    s->on_event(slot, status, s->data);
    if (--s->depth == 0)
        run_deferred(s);
}

void ms__server_defer(ms_server_t *s, ms_conn_t *c)
{
    if (c->flags & MS_CONN_DEFERRED)
        return; /* once in the list is enough; the list holds one reference */
    c->flags |= MS_CONN_DEFERRED;
    ms__conn_hold(c);
    c->deferred_next = s->deferred;
    s->deferred = c;
}

/* Called as each connection goes: a stopping server reports when the last is gone. */
void ms__server_conn_gone(ms_server_t *s, ms_conn_t *c)
{
    assert(c == NULL || c->refs == 0); /* NULL: a check without a connection going */
    if (s->stopping && s->stats->conns == 0 && s->stopped != NULL) {
        void (*done)(ms_server_t *) = s->stopped;
        s->stopped = NULL;
        done(s);
    }
}

void ms_server_stop(ms_server_t *s, void (*done)(ms_server_t *s))
{
    s->stopping = 1;
    s->stopped = done;
    for (ms_listener_t *l = s->listeners, *next; l != NULL; l = next) {
        next = l->next;
        uv_close((uv_handle_t *)&l->tcp, (uv_close_cb)ms_mem_free);
    }
    s->listeners = NULL;
    /* Every reply from now on says "connection: close". A connection waiting for its next
     * request gets a short grace to send it (a busy keep-alive client always has one on the
     * way, and closing under it would be an error on its side); then it closes. */
    for (ms_conn_t *c = s->conns.next; c != &s->conns; c = c->next)
        c->proto->stop(c);
    ms__ws_stop_all(s); /* close 1001: each handler sees its socket end */
    ms__server_conn_gone(s, NULL);
}

void ms_server_free(ms_server_t *s)
{
    ms__alog_free(s); /* (its timers are in the heap freed below) */
    ms__protos_free(s); /* (HTTP/2's pending writes let go of the connections they hold) */
    ms__sockets_free(s); /* its pooled connections close in the run below */
    ms__sources_free(s);
    ms__tls_free(s);
    ms_mem_free(s->trusted);
    ms_mem_free(s->livez);
    ms_mem_free(s->readyz);
    ms__recycle_drain(&s->out_free, ms__out_destroy);
    ms__recycle_drain(&s->chunk_free, ms_mem_free);
    ms__static_free(s);
    ms__wakes_free(s);
    if (!uv_is_closing((uv_handle_t *)&s->uv_timer))
        uv_close((uv_handle_t *)&s->uv_timer, NULL);
    if (!uv_is_closing((uv_handle_t *)&s->wake_idle))
        uv_close((uv_handle_t *)&s->wake_idle, NULL);
    /* The uv handles live inside `s`: let the loop finish closing them first. */
    uv_run(s->loop, UV_RUN_NOWAIT);
    ms_mem_free(s->heap);
    ms_mem_free(s->anchor_free);
    ms_mem_free(s->anchor_released);
    ms_mem_free(s->rbuf);
    ms_mem_free(s);
}
