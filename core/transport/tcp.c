/* tcp.c: TCP listeners, and the plain TCP transport (ms_io_t) on a poll handle of libuv's:
 * accept, reads and gathered writes of our own, sendfile, cork, and a graceful close that
 * sends FIN after the last reply. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* accept4, IOV_MAX */
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "engine/engine.h"

/* The transport's part of a TCP connection, right after its ms_conn_t. A poll handle on the
 * socket rather than libuv's stream: the reads and writes are ours (read, writev), and an
 * idle connection keeps 88 bytes less (uv_poll_t is 160 bytes, uv_tcp_t 248). */
typedef struct ms_tcp_s {
    uv_poll_t poll;
    struct tcp_write_s *pending; /* the rest of a write, while the socket is full */
    int fd;
    uint8_t reading;             /* the connection wants bytes (read_start) */
    uint8_t polled;              /* the events the handle is started for: UV_READABLE, ... */
} ms_tcp_t;

/* A write the socket did not take at once: what is left of its pieces. */
typedef struct tcp_write_s {
    unsigned at, n;
    uv_buf_t bufs[];
} tcp_write_t;

/* At most this many reads a readiness event, each filling its buffer: a fast sender must not
 * hold the worker from the others. */
#define TCP_READS_PER_EVENT 32

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
    return (ms_conn_t *)((char *)h - offsetof(ms_tcp_t, poll) - sizeof(ms_conn_t));
}

static int tcp_fd(ms_conn_t *c)
{
    return tcp_of(c)->fd;
}

static void on_poll(uv_poll_t *h, int status, int events);

/* Starts the handle for `events`, when that changes them. Turning reading off is left to
 * the next readiness event (on_poll): a connection that stops reading while a handler runs
 * and starts again before its peer sends costs no system call. */
static void poll_for(ms_tcp_t *t, int events)
{
    if (events == t->polled || uv_is_closing((uv_handle_t *)&t->poll))
        return;
    t->polled = (uint8_t)events;
    if (events == 0)
        uv_poll_stop(&t->poll);
    else
        uv_poll_start(&t->poll, events, on_poll);
}

/* Writes what the socket takes now: bytes written, UV_EAGAIN, or a negative code. */
static int write_now(ms_conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    /* send and sendmsg, not write and writev: a socket's own calls skip the file layer's
     * (fdget_pos, vfs_write), and a peer gone raises no SIGPIPE. */
    struct msghdr m = {.msg_iov = (struct iovec *)bufs, /* (uv_buf_t is laid out as iovec) */
                       .msg_iovlen = n < IOV_MAX ? n : IOV_MAX};
    ssize_t w;
    do
        w = n == 1 ? send(tcp_fd(c), bufs[0].base, bufs[0].len, MSG_NOSIGNAL)
                   : sendmsg(tcp_fd(c), &m, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    if (w < 0)
        return errno == EAGAIN ? UV_EAGAIN : -errno;
    return w > 0 ? (int)w : UV_EAGAIN;
}

static int tcp_try_write(ms_conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    if (tcp_of(c)->pending != NULL)
        return UV_EAGAIN; /* after what waits, in order */
    return write_now(c, bufs, n);
}

static ssize_t tcp_sendfile(ms_conn_t *c, int fd, uint64_t off, size_t len)
{
    off_t at = (off_t)off;
    ssize_t n = sendfile(tcp_fd(c), fd, &at, len);
    if (n >= 0)
        return n;
    return errno == EAGAIN ? UV_EAGAIN : -errno;
}

static void tcp_cork(ms_conn_t *c, int on)
{
    (void)setsockopt(tcp_fd(c), IPPROTO_TCP, TCP_CORK, &on, sizeof(on));
}

/* The background write is over: written (0), failed, or cancelled by a close. */
static void write_end(ms_conn_t *c, int status)
{
    ms_tcp_t *t = tcp_of(c);
    ms_mem_free(t->pending);
    t->pending = NULL;
    ms__io_write_done(c, status);
    ms__conn_release(c);
}

static int tcp_write(ms_conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    ms_tcp_t *t = tcp_of(c);
    if (t->pending != NULL || n == 0)
        return UV_EINVAL;
    /* Called once try_write found the socket full: wait until it has room. */
    t->pending = ms_mem_alloc(sizeof(*t->pending) + n * sizeof(uv_buf_t));
    t->pending->at = 0;
    t->pending->n = n;
    memcpy(t->pending->bufs, bufs, n * sizeof(uv_buf_t));
    poll_for(t, t->polled | UV_WRITABLE);
    ms__conn_hold(c); /* the write holds the connection */
    return 0;
}

/* The socket has room: goes on with the background write. */
static void write_more(ms_conn_t *c)
{
    ms_tcp_t *t = tcp_of(c);
    tcp_write_t *p = t->pending;
    int status = 0;
    while (p->at < p->n) {
        int w = write_now(c, p->bufs + p->at, p->n - p->at);
        if (w == UV_EAGAIN)
            return;
        if (w < 0) {
            status = w;
            break;
        }
        size_t done = (size_t)w;
        while (p->at < p->n && done >= p->bufs[p->at].len)
            done -= p->bufs[p->at++].len;
        if (done > 0) {
            p->bufs[p->at].base += done;
            p->bufs[p->at].len -= done;
        }
    }
    write_end(c, status);
    if (t->pending == NULL) /* (and no next write began in write_end's callback) */
        poll_for(t, t->polled & ~UV_WRITABLE);
}

/* Reads what the socket holds into the buffers the connection gives, as long as it wants
 * them; the end of the stream or an error ends reading (ms_conn_eof). */
static void read_some(ms_conn_t *c)
{
    ms_tcp_t *t = tcp_of(c);
    for (int i = 0; i < TCP_READS_PER_EVENT && t->reading; i++) {
        uv_buf_t buf;
        ms__io_read_buf(c, &buf);
        ssize_t n;
        do
            n = recv(tcp_fd(c), buf.base, buf.len, 0);
        while (n < 0 && errno == EINTR);
        if (n > 0) {
            ms__io_feed(c, buf.base, (size_t)n);
            if ((size_t)n < buf.len)
                return; /* the socket is empty */
            continue;
        }
        if (n < 0 && errno == EAGAIN)
            return;
        t->reading = 0;
        ms__io_eof(c, n == 0 ? UV_EOF : -errno);
        return;
    }
}

/* (The connection lives through this: a close here frees it only from close_cb.) */
static void on_poll(uv_poll_t *h, int status, int events)
{
    ms_conn_t *c = conn_of_handle((uv_handle_t *)h);
    ms_tcp_t *t = tcp_of(c);
    if (status < 0) {
        /* An error on the socket (a reset): libuv has stopped the handle. The write under
         * way fails with it, and the reading ends with it. */
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(tcp_fd(c), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err == 0)
            err = ECONNRESET;
        t->polled = 0;
        if (t->pending != NULL)
            write_end(c, -err);
        if (t->reading && !uv_is_closing((uv_handle_t *)h)) {
            t->reading = 0;
            ms__io_eof(c, -err);
        }
        return;
    }
    if (events & UV_WRITABLE && t->pending != NULL)
        write_more(c);
    if (events & UV_READABLE && !uv_is_closing((uv_handle_t *)h)) {
        if (t->reading)
            read_some(c);
        else
            poll_for(t, t->polled & ~UV_READABLE); /* now that bytes wait unwanted */
    }
}

static void tcp_read_stop(ms_conn_t *c)
{
    tcp_of(c)->reading = 0;
}

static void tcp_read_start(ms_conn_t *c)
{
    ms_tcp_t *t = tcp_of(c);
    if (c->flags & MS_CONN_CLOSED)
        return;
    t->reading = 1;
    poll_for(t, t->polled | UV_READABLE);
}

static void close_cb(uv_handle_t *h)
{
    ms_conn_t *c = conn_of_handle(h);
    if (tcp_of(c)->pending != NULL)
        write_end(c, UV_ECANCELED);
    ms__io_closed(c);
}

static void tcp_close(ms_conn_t *c)
{
    ms_tcp_t *t = tcp_of(c);
    int fd = tcp_fd(c);
    t->reading = 0;
    uv_close((uv_handle_t *)&t->poll, close_cb);
    close(fd); /* (a poll handle leaves its descriptor to its owner) */
}

/* Sends FIN after the last reply rather than a reset that could destroy it, then closes. A
 * write still under way is cut short. */
static void tcp_shutdown(ms_conn_t *c)
{
    if (tcp_of(c)->pending == NULL)
        (void)shutdown(tcp_fd(c), SHUT_WR);
    tcp_close(c);
}

/* Writes an address as text; returns its port. */
static int addr_text(const struct sockaddr_storage *ss, char *buf, size_t len)
{
    if (ss->ss_family == AF_INET6) {
        uv_ip6_name((const struct sockaddr_in6 *)ss, buf, len);
        return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
    }
    uv_ip4_name((const struct sockaddr_in *)ss, buf, len);
    return ntohs(((const struct sockaddr_in *)ss)->sin_port);
}

static int tcp_address(ms_conn_t *c, int local, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t n = sizeof(ss);
    buf[0] = 0;
    if ((local ? getsockname(tcp_fd(c), (struct sockaddr *)&ss, &n)
               : getpeername(tcp_fd(c), (struct sockaddr *)&ss, &n)) != 0)
        return -1;
    return addr_text(&ss, buf, len);
}

static void tcp_peer(ms_conn_t *c, char *buf, size_t len)
{
    (void)tcp_address(c, 0, buf, len);
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

/* A connection for the socket `fd` accept(2) gave, from the peer `peer`; NULL (the socket
 * closed, one log line) when libuv cannot poll it. */
static ms_conn_t *tcp_conn(ms_server_t *s, int fd, const struct sockaddr_storage *peer,
                           size_t extra)
{
    ms_conn_t *c = ms_conn_new(s, &tcp_io, TCP_OWN + extra);
    ms_tcp_t *t = tcp_of(c);
    t->pending = NULL;
    t->fd = fd;
    t->reading = 0;
    t->polled = 0;
    int rc = uv_poll_init_socket(s->loop, &t->poll, fd);
    if (rc < 0) {
        ms_log(MS_LOG_WARN, "accept: cannot poll descriptor %d: %s", fd, uv_strerror(rc));
        close(fd);
        c->flags |= MS_CONN_CLOSED | MS_CONN_NONE;
        s->stats->accepted--;
        ms__io_closed(c); /* (no handle to close: the connection goes at once) */
        return NULL;
    }
    if (ms__source_key((const struct sockaddr *)peer, c->source) == 0)
        c->source_known = 1;
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return c;
}

/* -- Listeners ------------------------------------------------------------------------------ */

/* Accept at most this many connections per readiness event: a connect flood must not
 * starve reads on connections we already have. */
#define MS_ACCEPT_BURST 64
/* How long a listener rests when no descriptor is left, not even the reserve. */
#define MS_ACCEPT_PAUSE_MS 100

typedef struct ms_listener_s {
    uv_poll_t poll;
    int fd;
    int flags; /* MS_LISTEN_* */
    ms_timer_t pause; /* while it waits for descriptors with no reserve (refuse_waiting) */
    uint64_t paused_told; /* when a line last said so (loop time, ms) */
    ms_server_t *server;
    ms_tls_t *tls; /* a TLS listener's settings (the server's); NULL: plain TCP */
    struct ms_listener_s *next;
} ms_listener_t;

/* A descriptor kept in reserve: when none is left, closing it lets the worker accept the
 * connections that wait and close them, as it must, rather than find the listener ready on
 * every turn of the loop. */
static int reserve_fd = -1;

static void reserve_open(void)
{
    if (reserve_fd < 0)
        reserve_fd = open("/", O_RDONLY | O_CLOEXEC);
}

/* Whether `fd` leaves fewer than MS_FD_RESERVE free: accept(2) gives the lowest free
 * number, so every one below it is in use. */
static int near_fd_limit(ms_server_t *s, int fd)
{
    return (uint32_t)fd + MS_FD_RESERVE >= s->fd_limit;
}

static void on_connection(uv_poll_t *h, int status, int events);

static void listener_resume(ms_timer_t *t)
{
    ms_listener_t *l = container_of(t, ms_listener_t, pause);
    uv_poll_start(&l->poll, UV_READABLE, on_connection);
}

/* No descriptor was left for a connection: those waiting are accepted with the reserve's and
 * closed, each counted and logged as a refusal. With no reserve (another part of the worker
 * took the one it freed), the listener rests for MS_ACCEPT_PAUSE_MS instead of spinning, the
 * connections waiting in the kernel's queue, with a line a second at most. */
static void refuse_waiting(ms_listener_t *l)
{
    ms_server_t *s = l->server;
    if (reserve_fd < 0) {
        reserve_open();
        if (reserve_fd < 0) {
            uint64_t now = uv_now(s->loop);
            if (l->paused_told == 0 || now - l->paused_told >= 1000) {
                l->paused_told = now;
                ms_log(MS_LOG_WARN, "accept: no descriptor left (the limit is %u; raise it: "
                       "ulimit -n, or LimitNOFILE= in a systemd unit); new connections wait",
                       s->fd_limit);
            }
            uv_poll_stop(&l->poll);
            ms_timer_start(s, &l->pause, MS_ACCEPT_PAUSE_MS, listener_resume);
            return;
        }
    }
    close(reserve_fd);
    reserve_fd = -1;
    for (int i = 0; i < MS_ACCEPT_BURST; i++) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            break;
        close(fd);
        s->refused_fds++;
        s->stats->refused_conns++;
        ms__log_refusals(s);
    }
    reserve_open();
}

static void on_connection(uv_poll_t *h, int status, int events)
{
    ms_listener_t *l = (ms_listener_t *)h;
    ms_server_t *s = l->server;
    (void)events;
    if (status < 0) {
        ms_log(MS_LOG_WARN, "accept: %s", uv_strerror(status));
        return;
    }
    for (int i = 0; i < MS_ACCEPT_BURST && s->listeners != NULL; i++) {
        struct sockaddr_storage peer;
        socklen_t plen = sizeof(peer);
        int fd = accept4(l->fd, (struct sockaddr *)&peer, &plen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE)
                refuse_waiting(l);
            else if (errno != EAGAIN)
                ms_log(MS_LOG_WARN, "accept: %s", strerror(errno));
            return;
        }
        ms_conn_t *c = tcp_conn(s, fd, &peer, l->tls != NULL ? ms__tls_size : 0);
        if (c == NULL)
            continue;
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
        if (near_fd_limit(s, fd)) {
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

/* Listens on the bound socket `fd` (the listener owns it from here, failed or not). */
static int listen_on(ms_server_t *s, int fd, int backlog, int flags)
{
    if (listen(fd, backlog) != 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    ms_listener_t *l = ms_mem_alloc(sizeof(*l));
    int rc = uv_poll_init_socket(s->loop, &l->poll, fd);
    if (rc == 0)
        rc = uv_poll_start(&l->poll, UV_READABLE, on_connection);
    if (rc < 0) {
        close(fd);
        ms_mem_free(l);
        return rc;
    }
    reserve_open();
    memset(&l->pause, 0, sizeof(l->pause));
    l->paused_told = 0;
    l->fd = fd;
    l->flags = flags;
    l->server = s;
    l->tls = NULL;
    l->next = s->listeners;
    s->listeners = l;
    s->listen_port = (uint32_t)ms_fd_port(fd);
    return 0;
}

int ms_server_listen_fd(ms_server_t *s, int fd, int flags)
{
    return listen_on(s, fd, MS_LISTEN_BACKLOG, flags);
}

int ms_server_listen(ms_server_t *s, const char *addr, int backlog, int flags)
{
    struct sockaddr_storage ss;
    int rc = ms__parse_addr(addr, &ss);
    if (rc < 0)
        return rc;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    /* Workers each listen on the same port; the kernel spreads connections among them. */
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    if (ss.ss_family == AF_INET6) /* "[::]" takes IPv4 too */
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    socklen_t len = ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                             : sizeof(struct sockaddr_in);
    if (bind(fd, (struct sockaddr *)&ss, len) != 0) {
        rc = -errno;
        close(fd);
        return rc;
    }
    return listen_on(s, fd, backlog > 0 ? backlog : MS_LISTEN_BACKLOG, flags);
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
        ms_timer_stop(s, &l->pause);
        int fd = l->fd;
        uv_close((uv_handle_t *)&l->poll, (uv_close_cb)ms_mem_free);
        close(fd);
    }
    s->listeners = NULL;
}

const ms_part_t ms__tcp_part = {.name = "tcp", .accept_end = listeners_close};
