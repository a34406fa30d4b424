/* server.c: a worker's server: its life (start, stop, free, going through the table of parts),
 * and the depth guard around calls into the handler. */
#include "engine/engine.h"

#include <sys/resource.h>

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
    for (const ms_part_t *const *p = ms__parts; *p != NULL; p++)
        if ((*p)->worker_init != NULL)
            (*p)->worker_init(s);
    ms__timers_init(&s->timers, loop);
    uv_idle_init(loop, &s->wake_idle);
    s->fd_limit = ms__nofile_raise();
    return s;
}

/* The soft limit on descriptors is raised to the hard one (a Debian login's 1024 holds a
 * thousand connections at most; its hard limit, or systemd's LimitNOFILE, far more), as
 * Go's runtime and many servers do at start. Returns the limit now in force (at most 2^31). */
uint32_t ms__nofile_raise(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return UINT32_MAX;
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit want = {rl.rlim_max, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &want) == 0)
            rl.rlim_cur = rl.rlim_max;
    }
    return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > INT32_MAX ? INT32_MAX
                                                                 : (uint32_t)rl.rlim_cur;
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

void ms_timer_start(ms_server_t *s, ms_timer_t *t, uint64_t ms, ms_timer_cb cb)
{
    ms__timers_start(&s->timers, t, ms, cb);
}

void ms_timer_stop(ms_server_t *s, ms_timer_t *t)
{
    ms__timers_stop(&s->timers, t);
}

/* -- The drain ------------------------------------------------------------------------------
 * A stop in two steps, so that a load balancer that polls /readyz loses nothing: first the
 * server says it is going (readyz 503, "connection: close" on every reply, GOAWAY, WebSocket
 * close 1001, event streams end) while its listeners still accept for the drain delay, long
 * enough for the balancer to see the 503 and send elsewhere; then the listeners close and the
 * connections left finish. A connection waiting for its next request is not closed while the
 * balancer may still send one on it; once the delay is over, it closes (ms__conn_arm_idle). */

static void tell_connections(ms_server_t *s)
{
    /* Every reply from now on says "connection: close". A connection waiting for its next
     * request gets a grace to send it (a busy keep-alive client always has one on the way,
     * and closing under it would be an error on its side); then it closes. */
    for (ms_conn_t *c = s->conns.next; c != &s->conns; c = c->next)
        c->proto->stop(c);
}

/* The listeners close. */
static void accept_end(ms_server_t *s)
{
    int draining = s->drain_until != 0;
    s->drain_until = 0;
    s->delay_over = draining;
    for (const ms_part_t *const *p = ms__parts; *p != NULL; p++)
        if ((*p)->accept_end != NULL)
            (*p)->accept_end(s);
    if (draining) {
        ms_log(MS_LOG_INFO, "drain: listeners closed; %u connection%s finishing",
               (unsigned)s->stats->conns, s->stats->conns == 1 ? "" : "s");
        /* Again: those accepted during the delay, and the idle ones close now. */
        tell_connections(s);
    }
}

/* The server is stopped once its last connection has gone. */
static void finish(ms_server_t *s)
{
    if (s->accept_closed != NULL)
        s->accept_closed(s);
    s->stopped = s->drain_done;
    ms__server_conn_gone(s, NULL);
}

static void drain_expired(ms_timer_t *t)
{
    ms_server_t *s = container_of(t, ms_server_t, drain_timer);
    accept_end(s);
    finish(s);
}

int ms_server_drain_now(ms_server_t *s)
{
    if (!s->stopping || s->drain_until == 0)
        return 0;
    ms_timer_stop(s, &s->drain_timer);
    drain_expired(&s->drain_timer);
    return 1;
}

uint64_t ms__drain_left(ms_server_t *s)
{
    uint64_t now = uv_now(s->loop);
    return s->drain_until > now ? s->drain_until - now : 0;
}

void ms_server_drain(ms_server_t *s, uint32_t delay_ms, void (*accept_closed)(ms_server_t *s),
                     void (*done)(ms_server_t *s))
{
    if (s->stopping)
        return;
    s->stopping = 1;
    s->drain_done = done;
    s->accept_closed = accept_closed;
    if (delay_ms > 0) {
        s->drain_until = uv_now(s->loop) + delay_ms;
        ms_timer_start(s, &s->drain_timer, delay_ms, drain_expired);
        ms_log(MS_LOG_INFO, "drain: not ready; accepting for %.3g s more, replies say close",
               delay_ms / 1000.0);
    }
    tell_connections(s);
    if (delay_ms == 0)
        accept_end(s); /* (the listeners before the parts below, as a stop always did) */
    /* The parts: WebSockets send close 1001 (each handler sees its socket end). */
    for (const ms_part_t *const *p = ms__parts; *p != NULL; p++)
        if ((*p)->stop != NULL)
            (*p)->stop(s);
    if (delay_ms == 0)
        finish(s);
}

void ms_server_stop(ms_server_t *s, void (*done)(ms_server_t *s))
{
    ms_server_drain(s, 0, NULL, done);
}

void ms_server_free(ms_server_t *s)
{
    ms__protos_free(s); /* (HTTP/2's pending writes let go of the connections they hold) */
    /* The parts' state: the access logs' timers are in the heap freed below, and client
     * sockets' pooled connections close in the run below. */
    for (const ms_part_t *const *p = ms__parts; *p != NULL; p++)
        if ((*p)->worker_free != NULL)
            (*p)->worker_free(s);
    ms__sources_free(s);
    ms_mem_free(s->trusted);
    ms_mem_free(s->livez);
    ms_mem_free(s->readyz);
    ms__recycle_drain(&s->out_free, ms__out_destroy);
    ms__recycle_drain(&s->chunk_free, ms_mem_free);
    ms__wakes_free(s);
    ms__timers_close(&s->timers);
    if (!uv_is_closing((uv_handle_t *)&s->wake_idle))
        uv_close((uv_handle_t *)&s->wake_idle, NULL);
    /* The uv handles live inside `s`: let the loop finish closing them first. */
    uv_run(s->loop, UV_RUN_NOWAIT);
    ms__timers_free(&s->timers);
    ms_mem_free(s->anchor_free);
    ms_mem_free(s->anchor_released);
    ms_mem_free(s->rbuf);
    ms_mem_free(s);
}
