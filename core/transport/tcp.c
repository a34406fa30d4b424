/* tcp.c: TCP listeners, and the plain TCP transport (ms_io_t) on a libuv stream: gathered
 * writes, sendfile, cork, and a graceful close that sends FIN after the last reply. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/sendfile.h>
#include <sys/socket.h>

#include "engine/engine.h"

/* The transport's part of a TCP connection, right after its ms_conn_t. */
typedef struct ms_tcp_s {
    uv_tcp_t tcp;
    uv_write_t *wreq;        /* from the worker's recycle list while a write is pending */
    uv_shutdown_t *shutdown; /* while a graceful close is under way */
} ms_tcp_t;

static inline ms_tcp_t *tcp_of(ms_conn_t *c)
{
    return ms_conn_io_data(c);
}

/* ms_conn_new puts a transport's data right after the connection (ms_conn_io_data): the
 * way back from the handle counts on no padding between them. */
_Static_assert(sizeof(ms_conn_t) % _Alignof(ms_tcp_t) == 0,
               "a transport's data follows its connection");

static inline ms_conn_t *conn_of_handle(uv_handle_t *h)
{
    return (ms_conn_t *)((char *)h - offsetof(ms_tcp_t, tcp) - sizeof(ms_conn_t));
}

static int tcp_try_write(ms_conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    return uv_try_write((uv_stream_t *)&tcp_of(c)->tcp, bufs, n);
}

static ssize_t tcp_sendfile(ms_conn_t *c, int fd, uint64_t off, size_t len)
{
    uv_os_fd_t sock;
    if (uv_fileno((uv_handle_t *)&tcp_of(c)->tcp, &sock) != 0)
        return UV_EBADF;
    off_t at = (off_t)off;
    ssize_t n = sendfile(sock, fd, &at, len);
    if (n >= 0)
        return n;
    return errno == EAGAIN ? UV_EAGAIN : -errno;
}

static void tcp_cork(ms_conn_t *c, int on)
{
    uv_os_fd_t sock;
    if (uv_fileno((uv_handle_t *)&tcp_of(c)->tcp, &sock) == 0)
        (void)setsockopt(sock, IPPROTO_TCP, TCP_CORK, &on, sizeof(on));
}

static void write_cb(uv_write_t *w, int status)
{
    ms_conn_t *c = w->data;
    ms_mem_free(w);
    tcp_of(c)->wreq = NULL;
    ms__io_write_done(c, status);
    ms__conn_release(c);
}

static int tcp_write(ms_conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    ms_tcp_t *t = tcp_of(c);
    /* Only on a congested socket; not worth a recycle list. */
    t->wreq = ms_mem_alloc(sizeof(*t->wreq));
    t->wreq->data = c;
    int rc = uv_write(t->wreq, (uv_stream_t *)&t->tcp, bufs, n, write_cb);
    if (rc < 0) {
        ms_mem_free(t->wreq);
        t->wreq = NULL;
        return rc;
    }
    ms__conn_hold(c); /* the write request holds the connection */
    return 0;
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    ms__io_read_buf(conn_of_handle(h), buf);
}

static void read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    ms_conn_t *c = conn_of_handle((uv_handle_t *)st);
    if (nread > 0)
        ms__io_feed(c, buf->base, (size_t)nread);
    else if (nread < 0)
        ms__io_eof(c, (int)nread);
}

static void tcp_read_stop(ms_conn_t *c)
{
    uv_read_stop((uv_stream_t *)&tcp_of(c)->tcp);
}

static void tcp_read_start(ms_conn_t *c)
{
    if (!(c->flags & MS_CONN_CLOSED))
        uv_read_start((uv_stream_t *)&tcp_of(c)->tcp, alloc_cb, read_cb);
}

static void close_cb(uv_handle_t *h)
{
    ms__io_closed(conn_of_handle(h));
}

static void shutdown_cb(uv_shutdown_t *req, int status)
{
    ms_conn_t *c = req->data;
    (void)status;
    ms_mem_free(req);
    tcp_of(c)->shutdown = NULL;
    uv_close((uv_handle_t *)&tcp_of(c)->tcp, close_cb);
}

/* Sends FIN after the last reply rather than a reset that could destroy it, then closes. */
static void tcp_shutdown(ms_conn_t *c)
{
    ms_tcp_t *t = tcp_of(c);
    uv_read_stop((uv_stream_t *)&t->tcp);
    if (t->wreq == NULL) {
        t->shutdown = ms_mem_alloc(sizeof(*t->shutdown));
        t->shutdown->data = c;
        if (uv_shutdown(t->shutdown, (uv_stream_t *)&t->tcp, shutdown_cb) == 0)
            return;
        ms_mem_free(t->shutdown);
        t->shutdown = NULL;
    }
    uv_close((uv_handle_t *)&t->tcp, close_cb);
}

static void tcp_close(ms_conn_t *c)
{
    ms_tcp_t *t = tcp_of(c);
    uv_read_stop((uv_stream_t *)&t->tcp);
    uv_close((uv_handle_t *)&t->tcp, close_cb);
}

static void tcp_peer(ms_conn_t *c, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    int n = sizeof(ss);
    buf[0] = 0;
    if (uv_tcp_getpeername(&tcp_of(c)->tcp, (struct sockaddr *)&ss, &n) != 0)
        return;
    if (ss.ss_family == AF_INET6)
        uv_ip6_name((struct sockaddr_in6 *)&ss, buf, len);
    else
        uv_ip4_name((struct sockaddr_in *)&ss, buf, len);
}

static int tcp_address(ms_conn_t *c, int local, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    int n = sizeof(ss);
    buf[0] = 0;
    uv_tcp_t *h = &tcp_of(c)->tcp;
    if ((local ? uv_tcp_getsockname(h, (struct sockaddr *)&ss, &n)
               : uv_tcp_getpeername(h, (struct sockaddr *)&ss, &n)) != 0)
        return -1;
    if (ss.ss_family == AF_INET6) {
        uv_ip6_name((struct sockaddr_in6 *)&ss, buf, len);
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    uv_ip4_name((struct sockaddr_in *)&ss, buf, len);
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static int tcp_fd(ms_conn_t *c)
{
    uv_os_fd_t sock;
    return uv_fileno((uv_handle_t *)&tcp_of(c)->tcp, &sock) == 0 ? sock : -1;
}

static const ms_io_t tcp_io = {
    .try_write = tcp_try_write,
    .write = tcp_write,
    .sendfile = tcp_sendfile,
    .cork = tcp_cork,
    .read_stop = tcp_read_stop,
    .read_start = tcp_read_start,
    .shutdown = tcp_shutdown,
    .close = tcp_close,
    .peer = tcp_peer,
    .address = tcp_address,
    .fd = tcp_fd,
};

/* The bytes of the transport's own part, where a stacked transport's extra bytes begin. */
#define TCP_OWN ((sizeof(ms_tcp_t) + 15) & ~(size_t)15)

static void *tcp_extra(ms_conn_t *c)
{
    return (char *)tcp_of(c) + TCP_OWN;
}

static ms_conn_t *tcp_accept(ms_server_t *s, uv_stream_t *listener, size_t extra)
{
    ms_conn_t *c = ms_conn_new(s, &tcp_io, TCP_OWN + extra);
    ms_tcp_t *t = tcp_of(c);
    t->wreq = NULL;
    t->shutdown = NULL;
    uv_tcp_init(s->loop, &t->tcp);
    if (uv_accept(listener, (uv_stream_t *)&t->tcp) != 0) {
        /* Nothing more to accept now: undo quietly. */
        c->flags |= MS_CONN_CLOSED | MS_CONN_NONE;
        s->stats->accepted--;
        uv_close((uv_handle_t *)&t->tcp, close_cb);
        return NULL;
    }
    struct sockaddr_storage ss;
    int sl = sizeof(ss);
    if (uv_tcp_getpeername(&t->tcp, (struct sockaddr *)&ss, &sl) == 0 &&
        ms__source_key((struct sockaddr *)&ss, c->source) == 0)
        c->source_known = 1;
    uv_tcp_nodelay(&t->tcp, 1);
    return c;
}

/* -- Listeners ------------------------------------------------------------------------------ */

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

/* Whether `c`'s descriptor leaves fewer than MS_FD_RESERVE free: accept(2) gives the lowest
 * free number, so every one below it is in use. (Once none is left, libuv closes new
 * connections by itself, unseen: refusing first is what makes it seen.) */
static int near_fd_limit(ms_server_t *s, ms_conn_t *c)
{
    uv_os_fd_t fd;
    return uv_fileno((uv_handle_t *)&tcp_of(c)->tcp, &fd) == 0 &&
           (uint32_t)fd + MS_FD_RESERVE >= s->fd_limit;
}

static void on_connection(uv_stream_t *ls, int status)
{
    ms_listener_t *l = (ms_listener_t *)ls;
    ms_server_t *s = l->server;
    if (status < 0) {
        ms_log(MS_LOG_WARN, "accept: %s", uv_strerror(status));
        return;
    }
    for (int i = 0; i < MS_ACCEPT_BURST && s->listeners != NULL; i++) {
        ms_conn_t *c = tcp_accept(s, ls, l->tls != NULL ? ms__tls_size : 0);
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
        if (near_fd_limit(s, c)) {
            s->refused_fds++;
            s->stats->refused_conns++;
            ms__log_refusals(s);
            ms__conn_close(c, 0);
            continue;
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
            ms__tls_wrap(c, l->tls, tcp_extra(c));
    }
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

/* The drain delay is over (ms_server_drain): the listeners close. */
static void listeners_close(ms_server_t *s)
{
    for (ms_listener_t *l = s->listeners, *next; l != NULL; l = next) {
        next = l->next;
        uv_close((uv_handle_t *)&l->tcp, (uv_close_cb)ms_mem_free);
    }
    s->listeners = NULL;
}

const ms_part_t ms__tcp_part = {.name = "tcp", .accept_end = listeners_close};
