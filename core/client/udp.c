/* udp.c: connected UDP sockets (ngx.socket.udp): one peer, a datagram per send and receive. */
#include "client/sock.h"

#include "client/sockets.h"

/* OpenResty's default receive size, and the largest datagram. */
#define MS_UDP_RECV_DEFAULT 8192
#define MS_UDP_RECV_MAX     65536

/* The handle lives apart from the socket: libuv closes it later, and the socket may be given
 * a new one (setpeername again) or be freed before. */
typedef struct ms_uhandle_s {
    uv_udp_t udp;
    ms_udp_t *u; /* NULL once the socket let go of it */
} ms_uhandle_t;

struct ms_udp_s {
    ms_sock_view_t v; /* first, as for TCP */
    ms_server_t *server;
    ms_sockets_t *sk;
    ms_uhandle_t *h; /* owned until closed: set by setpeername */
    uint32_t timeout_ms;
    ms_udp_cb peer_cb, recv_cb;
    ms_timer_t ptimer, rtimer;
    ms_resolve_t res;
    char *buf; /* owned: where a datagram is received */
    size_t cap, want;
};

ms_udp_t *ms_udp_new(ms_server_t *srv)
{
    ms_sockets_t *sk = ms__sockets(srv);
    ms_udp_t *u = ms_mem_alloc(sizeof(*u));
    memset(u, 0, sizeof(*u));
    u->v.slot = -1;
    u->server = srv;
    u->sk = sk;
    u->timeout_ms = sk->cfg.read_timeout;
    u->res.data = u;
    sk->socks++;
    return u;
}

ms_sock_view_t *ms_udp_view(ms_udp_t *u)
{
    return &u->v;
}

void ms_udp_settimeout(ms_udp_t *u, uint32_t ms)
{
    u->timeout_ms = ms == MS_SOCK_TIMEOUT_DEFAULT ? u->sk->cfg.read_timeout : ms;
}

static void handle_closed(uv_handle_t *h)
{
    ms_mem_free(h->data);
}

/* Lets go of the handle; whatever waits completes with `err` when `notify`. */
static void udp_close(ms_udp_t *u, int err, int notify)
{
    ms_udp_cb pcb = u->peer_cb, rcb = u->recv_cb;
    u->peer_cb = u->recv_cb = NULL;
    ms_timer_stop(u->server, &u->ptimer);
    ms_timer_stop(u->server, &u->rtimer);
    ms_resolve_cancel(&u->res);
    if (u->h != NULL) {
        u->h->u = NULL;
        uv_close((uv_handle_t *)&u->h->udp, handle_closed);
        u->h = NULL;
    }
    u->v.connected = 0;
    if (!notify)
        return;
    if (pcb)
        pcb(u, err);
    if (rcb)
        rcb(u, err);
}

void ms_udp_free(ms_udp_t *u)
{
    udp_close(u, UV_EOF, 0);
    u->sk->socks--;
    ms_mem_free(u->buf);
    ms_mem_free(u);
}

int ms_udp_close(ms_udp_t *u)
{
    if (u->h == NULL && u->peer_cb == NULL)
        return UV_ENOTCONN;
    udp_close(u, UV_EOF, 1);
    return MS_SOCK_DONE;
}

static int udp_open(ms_udp_t *u)
{
    ms_addr_t *a = &u->res.addrs[0];
    ms_uhandle_t *h = ms_mem_alloc(sizeof(*h));
    h->u = u;
    uv_udp_init_ex(u->server->loop, &h->udp, a->sa.sa_family);
    h->udp.data = h;
    int rc = uv_udp_connect(&h->udp, &a->sa);
    if (rc < 0) {
        h->u = NULL;
        uv_close((uv_handle_t *)&h->udp, handle_closed);
        return rc;
    }
    u->h = h;
    u->v.connected = 1;
    return MS_SOCK_DONE;
}

static void peer_done(ms_udp_t *u, int rc)
{
    ms_udp_cb cb = u->peer_cb;
    u->peer_cb = NULL;
    ms_timer_stop(u->server, &u->ptimer);
    cb(u, rc);
}

/* From the resolver's callback, which the engine's work brackets (resolve.c). */
static void on_peer_resolved(ms_resolve_t *r, int status)
{
    ms_udp_t *u = r->data;
    peer_done(u, status < 0 ? status : udp_open(u));
}

static void on_peer_timeout(ms_timer_t *t)
{
    ms_udp_t *u = container_of(t, ms_udp_t, ptimer);
    ms_server_t *srv = u->server;
    ms__server_enter(srv);
    ms_resolve_cancel(&u->res);
    peer_done(u, UV_ETIMEDOUT);
    ms__server_leave(srv);
}

int ms_udp_setpeername(ms_udp_t *u, const char *host, size_t host_len, int port, ms_udp_cb cb)
{
    if (u->peer_cb)
        return MS_SOCK_EBUSY_CONNECT;
    if (port <= 0 || port > 65535)
        return UV_EINVAL;
    udp_close(u, UV_EOF, 1); /* a new peer: the old socket goes */
    int rc = ms_resolve(u->server, &u->res, host, host_len, port, on_peer_resolved);
    if (rc == MS_SOCK_DONE)
        return udp_open(u);
    if (rc < 0)
        return rc;
    u->peer_cb = cb;
    if (u->timeout_ms)
        ms_timer_start(u->server, &u->ptimer, u->timeout_ms, on_peer_timeout);
    return MS_SOCK_PENDING;
}

int ms_udp_send(ms_udp_t *u, const uv_buf_t *bufs, unsigned n)
{
    if (u->h == NULL)
        return UV_ENOTCONN;
    int rc = uv_udp_try_send(&u->h->udp, bufs, n, NULL);
    return rc < 0 ? rc : MS_SOCK_DONE;
}

static void on_udp_alloc(uv_handle_t *hd, size_t hint, uv_buf_t *buf)
{
    ms_uhandle_t *h = hd->data;
    ms_udp_t *u = h->u;
    *buf = uv_buf_init(u->buf, (unsigned)u->want);
}

static void recv_done(ms_udp_t *u, int rc)
{
    ms_udp_cb cb = u->recv_cb;
    u->recv_cb = NULL;
    ms_timer_stop(u->server, &u->rtimer);
    uv_udp_recv_stop(&u->h->udp);
    cb(u, rc);
}

static void on_udp_recv(uv_udp_t *hd, ssize_t nread, const uv_buf_t *buf,
                        const struct sockaddr *addr, unsigned flags)
{
    ms_uhandle_t *h = hd->data;
    ms_udp_t *u = h->u;
    if (u == NULL || u->recv_cb == NULL)
        return;
    if (nread == 0 && addr == NULL) /* nothing more to read now */
        return;
    ms_server_t *srv = u->server;
    ms__server_enter(srv);
    if (nread < 0) {
        recv_done(u, (int)nread); /* ICMP said no one listens: "connection refused" */
    } else {
        u->v.data = u->buf;
        u->v.len = (size_t)nread;
        recv_done(u, MS_SOCK_DONE);
    }
    ms__server_leave(srv);
}

static void on_recv_timeout(ms_timer_t *t)
{
    ms_udp_t *u = container_of(t, ms_udp_t, rtimer);
    ms_server_t *srv = u->server;
    ms_udp_cb cb = u->recv_cb;
    u->recv_cb = NULL;
    uv_udp_recv_stop(&u->h->udp);
    ms__server_enter(srv);
    cb(u, UV_ETIMEDOUT);
    ms__server_leave(srv);
}

int ms_udp_receive(ms_udp_t *u, size_t size, ms_udp_cb cb)
{
    if (u->recv_cb)
        return MS_SOCK_EBUSY_READ;
    if (u->h == NULL)
        return UV_ENOTCONN;
    if (size == 0)
        size = MS_UDP_RECV_DEFAULT;
    if (size > MS_UDP_RECV_MAX)
        size = MS_UDP_RECV_MAX;
    if (size > u->cap) {
        u->buf = ms_mem_realloc(u->buf, size);
        u->cap = size;
    }
    u->want = size;
    u->v.data = NULL;
    u->v.len = 0;
    /* Reading only while asked: datagrams that come between receives wait in the kernel. */
    int rc = uv_udp_recv_start(&u->h->udp, on_udp_alloc, on_udp_recv);
    if (rc < 0)
        return rc;
    u->recv_cb = cb;
    if (u->timeout_ms)
        ms_timer_start(u->server, &u->rtimer, u->timeout_ms, on_recv_timeout);
    return MS_SOCK_PENDING;
}
