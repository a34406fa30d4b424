/* udp_test.c: connected UDP sockets on a real loop, against plain sockets made here on
 * 127.0.0.1 and ::1: datagrams each way, the receive size, timeouts, a new peer, closing. */
#include "test.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../../core/client/udp.c"

#include "real_loop.h"

/* -- Completions, per socket slot ---------------------------------------------------------- */

#define SLOTS 4
static int done_n[SLOTS], done_rc[SLOTS];

static void on_done(ms_udp_t *u, int status)
{
    done_n[u->v.slot]++;
    done_rc[u->v.slot] = status;
}

static ms_udp_t *udp(int slot)
{
    ms_udp_t *u = ms_udp_new(srv);
    u->v.slot = slot;
    done_n[slot] = 0;
    return u;
}

/* What the call returned, or, when it is pending, what its callback got. */
static int await(ms_udp_t *u, int rc)
{
    if (rc != MS_SOCK_PENDING)
        return rc;
    int n = done_n[u->v.slot];
    while (done_n[u->v.slot] == n)
        run_once();
    return done_rc[u->v.slot];
}

static int peer_to(ms_udp_t *u, const char *host, int port)
{
    return await(u, ms_udp_setpeername(u, host, strlen(host), port, on_done));
}

static int send_str(ms_udp_t *u, const char *p)
{
    uv_buf_t b = uv_buf_init((char *)p, (unsigned)strlen(p));
    return ms_udp_send(u, &b, 1);
}

static char got_copy[1 << 17];
static const char *got(ms_udp_t *u)
{
    if (u->v.data == NULL)
        return "(nil)";
    memcpy(got_copy, u->v.data, u->v.len);
    got_copy[u->v.len] = 0;
    return got_copy;
}

/* -- Peers: plain sockets -------------------------------------------------------------------- */

typedef struct {
    int fd, port;
    ms_addr_t addr; /* of the last datagram it read */
} peer_t;

/* A datagram socket bound to `ip` (port 0: any; else that one), reads waiting at most 2 s. */
static int peer_open(peer_t *p, const char *ip, int port)
{
    ms_addr_t a;
    memset(&a, 0, sizeof(a));
    int v6 = strchr(ip, ':') != NULL;
    if (v6)
        uv_ip6_addr(ip, port, &a.in6);
    else
        uv_ip4_addr(ip, port, &a.in);
    p->fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_DGRAM, 0);
    socklen_t len = v6 ? sizeof(a.in6) : sizeof(a.in);
    if (p->fd < 0 || bind(p->fd, &a.sa, len) < 0)
        return -1;
    getsockname(p->fd, &a.sa, &len);
    p->port = ntohs(v6 ? a.in6.sin6_port : a.in.sin_port);
    struct timeval tv = {2, 0};
    setsockopt(p->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return 0;
}

/* Reads one datagram as a string; NULL after 2 s. */
static const char *peer_read(peer_t *p)
{
    static char buf[1 << 17];
    socklen_t len = sizeof(p->addr);
    ssize_t n = recvfrom(p->fd, buf, sizeof(buf) - 1, 0, &p->addr.sa, &len);
    if (n < 0)
        return NULL;
    buf[n] = 0;
    return buf;
}

/* Sends to where its last datagram came from. */
static void peer_reply(peer_t *p, const char *data, size_t n)
{
    socklen_t len = p->addr.sa.sa_family == AF_INET6 ? sizeof(p->addr.in6) : sizeof(p->addr.in);
    if (sendto(p->fd, data, n, 0, &p->addr.sa, len) != (ssize_t)n)
        abort();
}

/* -- Tests ----------------------------------------------------------------------------------- */

TEST(udp_sends_and_receives_datagrams_over_ipv4_and_ipv6)
{
    setup();
    static const char *const hosts[] = {"127.0.0.1", "::1", "[::1]"};
    for (int i = 0; i < 3; i++) {
        peer_t p;
        ASSERT_EQ(0, peer_open(&p, i == 0 ? "127.0.0.1" : "::1", 0));
        ms_udp_t *u = udp(0);
        ASSERT(!u->v.connected);
        ASSERT_EQ(UV_ENOTCONN, send_str(u, "early"));
        /* An address: no lookup, connected at once. */
        ASSERT_EQ(MS_SOCK_DONE, ms_udp_setpeername(u, hosts[i], strlen(hosts[i]), p.port, on_done));
        ASSERT(u->v.connected);
        ASSERT_EQ(0, done_n[0]);
        /* Gathered buffers go as one datagram. */
        uv_buf_t b[] = {uv_buf_init("ab", 2), uv_buf_init("", 0), uv_buf_init("cde", 3)};
        ASSERT_EQ(MS_SOCK_DONE, ms_udp_send(u, b, 3));
        ASSERT_STR_EQ("abcde", peer_read(&p));
        ASSERT_EQ(MS_SOCK_DONE, send_str(u, "second"));
        ASSERT_STR_EQ("second", peer_read(&p));
        /* Two datagrams come before a receive: they wait in the kernel, one per receive. */
        peer_reply(&p, "one", 3);
        peer_reply(&p, "two!", 4);
        ASSERT_EQ(MS_SOCK_DONE, await(u, ms_udp_receive(u, 0, on_done)));
        ASSERT_STR_EQ("one", got(u));
        ASSERT_EQ(MS_SOCK_DONE, await(u, ms_udp_receive(u, 0, on_done)));
        ASSERT_STR_EQ("two!", got(u));
        /* An empty datagram is one too. */
        peer_reply(&p, "", 0);
        ASSERT_EQ(MS_SOCK_DONE, await(u, ms_udp_receive(u, 0, on_done)));
        ASSERT_EQ(0, u->v.len);
        ms_udp_free(u);
        close(p.fd);
    }
    ASSERT(teardown());
}

TEST(udp_receive_size_defaults_cuts_and_caps)
{
    setup();
    peer_t p;
    ASSERT_EQ(0, peer_open(&p, "127.0.0.1", 0));
    ms_udp_t *u = udp(0);
    ASSERT_EQ(MS_SOCK_DONE, peer_to(u, "127.0.0.1", p.port));
    ASSERT_EQ(MS_SOCK_DONE, send_str(u, "hi"));
    ASSERT(peer_read(&p) != NULL);
    /* 0: OpenResty's 8192. */
    static char big[MS_UDP_RECV_MAX];
    memset(big, 'x', sizeof(big));
    peer_reply(&p, big, 9000);
    ASSERT_EQ(MS_SOCK_DONE, await(u, ms_udp_receive(u, 0, on_done)));
    ASSERT_EQ(MS_UDP_RECV_DEFAULT, u->v.len);
    /* A datagram longer than the size is cut; the rest of it is gone. */
    peer_reply(&p, "0123456789", 10);
    peer_reply(&p, "next", 4);
    ASSERT_EQ(MS_SOCK_DONE, await(u, ms_udp_receive(u, 3, on_done)));
    ASSERT_STR_EQ("012", got(u));
    ASSERT_EQ(MS_SOCK_DONE, await(u, ms_udp_receive(u, 3, on_done)));
    ASSERT_STR_EQ("nex", got(u));
    /* Past the largest datagram: that one. */
    ASSERT_EQ(MS_SOCK_PENDING, ms_udp_receive(u, 1 << 20, on_done));
    ASSERT_EQ(MS_UDP_RECV_MAX, u->want);
    ASSERT_EQ(MS_UDP_RECV_MAX, u->cap);
    peer_reply(&p, big, 60000);
    ASSERT_EQ(MS_SOCK_DONE, await(u, MS_SOCK_PENDING));
    ASSERT_EQ(60000, u->v.len);
    ms_udp_free(u);
    close(p.fd);
    ASSERT(teardown());
}

TEST(udp_receive_timeout_leaves_the_socket_usable_and_one_receive_at_a_time)
{
    setup();
    peer_t p;
    ASSERT_EQ(0, peer_open(&p, "127.0.0.1", 0));
    ms_udp_t *u = udp(0);
    ASSERT_EQ(ms__sockets(srv)->cfg.read_timeout, u->timeout_ms); /* the worker's */
    ms_udp_settimeout(u, 30);
    ASSERT_EQ(30, u->timeout_ms);
    ASSERT_EQ(MS_SOCK_DONE, peer_to(u, "127.0.0.1", p.port));
    uv_update_time(&loop);
    uint64_t t0 = uv_now(&loop);
    ASSERT_EQ(MS_SOCK_PENDING, ms_udp_receive(u, 0, on_done));
    ASSERT_EQ(MS_SOCK_EBUSY_READ, ms_udp_receive(u, 0, on_done));
    ASSERT_STR_EQ("socket busy reading", ms_sock_strerror(MS_SOCK_EBUSY_READ));
    int rc = await(u, MS_SOCK_PENDING);
    ASSERT_EQ(UV_ETIMEDOUT, rc);
    ASSERT_STR_EQ("timeout", ms_sock_strerror(rc));
    ASSERT(uv_now(&loop) - t0 >= 30);
    ASSERT_EQ(1, done_n[0]);
    /* Still connected, and the next receive gets what comes. */
    ASSERT(u->v.connected);
    ASSERT_EQ(MS_SOCK_DONE, send_str(u, "ping"));
    ASSERT_STR_EQ("ping", peer_read(&p));
    peer_reply(&p, "pong", 4);
    ASSERT_EQ(MS_SOCK_DONE, await(u, ms_udp_receive(u, 0, on_done)));
    ASSERT_STR_EQ("pong", got(u));
    ASSERT_EQ(2, done_n[0]);
    /* MS_SOCK_TIMEOUT_DEFAULT: the worker's again. */
    ms_udp_settimeout(u, MS_SOCK_TIMEOUT_DEFAULT);
    ASSERT_EQ(ms__sockets(srv)->cfg.read_timeout, u->timeout_ms);
    ms_udp_free(u);
    close(p.fd);
    ASSERT(teardown());
}

TEST(udp_takes_datagrams_from_its_peer_only)
{
    setup();
    peer_t p, stranger;
    ASSERT_EQ(0, peer_open(&p, "127.0.0.1", 0));
    ASSERT_EQ(0, peer_open(&stranger, "127.0.0.1", 0));
    ms_udp_t *u = udp(0);
    ms_udp_settimeout(u, 2000);
    ASSERT_EQ(MS_SOCK_DONE, peer_to(u, "127.0.0.1", p.port));
    ASSERT_EQ(MS_SOCK_DONE, send_str(u, "hello"));
    ASSERT_STR_EQ("hello", peer_read(&p));
    /* The stranger sends to the socket's own address first: a connected socket drops it. */
    stranger.addr = p.addr;
    peer_reply(&stranger, "forged", 6);
    peer_reply(&p, "real", 4);
    ASSERT_EQ(MS_SOCK_DONE, await(u, ms_udp_receive(u, 0, on_done)));
    ASSERT_STR_EQ("real", got(u));
    ms_udp_free(u);
    close(p.fd);
    close(stranger.fd);
    ASSERT(teardown());
}

TEST(udp_a_new_peer_replaces_the_old_socket)
{
    setup();
    peer_t a, b;
    ASSERT_EQ(0, peer_open(&a, "127.0.0.1", 0));
    ASSERT_EQ(0, peer_open(&b, "::1", 0));
    ms_udp_t *u = udp(0);
    ASSERT_EQ(UV_EINVAL, ms_udp_setpeername(u, "127.0.0.1", 9, 0, on_done));
    ASSERT_EQ(UV_EINVAL, ms_udp_setpeername(u, "127.0.0.1", 9, 65536, on_done));
    ASSERT_EQ(UV_EINVAL, ms_udp_setpeername(u, "", 0, 53, on_done));
    ASSERT(!u->v.connected);
    ASSERT_EQ(MS_SOCK_DONE, peer_to(u, "127.0.0.1", a.port));
    ms_uhandle_t *first = u->h;
    ASSERT_EQ(MS_SOCK_DONE, send_str(u, "to a"));
    ASSERT_STR_EQ("to a", peer_read(&a));
    /* A receive under way completes with "closed" when the peer changes. */
    ASSERT_EQ(MS_SOCK_PENDING, ms_udp_receive(u, 0, on_done));
    ASSERT_EQ(MS_SOCK_DONE, peer_to(u, "::1", b.port));
    ASSERT_EQ(1, done_n[0]);
    ASSERT_EQ(UV_EOF, done_rc[0]);
    ASSERT(u->h != first);
    ASSERT_EQ(MS_SOCK_DONE, send_str(u, "to b"));
    ASSERT_STR_EQ("to b", peer_read(&b));
    /* The old peer's datagrams no longer reach it. */
    peer_reply(&a, "from a", 6);
    peer_reply(&b, "from b", 6);
    ASSERT_EQ(MS_SOCK_DONE, await(u, ms_udp_receive(u, 0, on_done)));
    ASSERT_STR_EQ("from b", got(u));
    ms_udp_free(u);
    close(a.fd);
    close(b.fd);
    ASSERT(teardown());
}

TEST(udp_no_one_listening_is_connection_refused)
{
    setup();
    peer_t p;
    ASSERT_EQ(0, peer_open(&p, "127.0.0.1", 0));
    int port = p.port;
    close(p.fd); /* nobody on that port now: the kernel answers with ICMP */
    ms_udp_t *u = udp(0);
    ms_udp_settimeout(u, 2000);
    ASSERT_EQ(MS_SOCK_DONE, peer_to(u, "127.0.0.1", port));
    ASSERT_EQ(MS_SOCK_DONE, send_str(u, "anyone?"));
    int rc = await(u, ms_udp_receive(u, 0, on_done));
    ASSERT_EQ(UV_ECONNREFUSED, rc);
    ASSERT_STR_EQ("connection refused", ms_sock_strerror(rc));
    ms_udp_free(u);
    ASSERT(teardown());
}

TEST(udp_close_ends_a_receive_with_closed_and_free_calls_nothing)
{
    setup();
    peer_t p;
    ASSERT_EQ(0, peer_open(&p, "127.0.0.1", 0));
    ms_udp_t *u = udp(0);
    ASSERT_EQ(UV_ENOTCONN, ms_udp_close(u));
    ASSERT_EQ(MS_SOCK_DONE, peer_to(u, "127.0.0.1", p.port));
    ASSERT_EQ(MS_SOCK_PENDING, ms_udp_receive(u, 0, on_done));
    ASSERT_EQ(MS_SOCK_DONE, ms_udp_close(u));
    ASSERT_EQ(1, done_n[0]);
    ASSERT_EQ(UV_EOF, done_rc[0]);
    ASSERT_STR_EQ("closed", ms_sock_strerror(done_rc[0]));
    ASSERT(!u->v.connected && u->h == NULL);
    ASSERT_EQ(UV_ENOTCONN, ms_udp_close(u));
    ASSERT_EQ(UV_ENOTCONN, send_str(u, "x"));
    ASSERT_EQ(UV_ENOTCONN, ms_udp_receive(u, 0, on_done));
    /* It may take a peer again. */
    ASSERT_EQ(MS_SOCK_DONE, peer_to(u, "127.0.0.1", p.port));
    ASSERT_EQ(MS_SOCK_DONE, send_str(u, "again"));
    ASSERT_STR_EQ("again", peer_read(&p));
    /* Freed with a receive under way: no callback, and a datagram that comes after finds
     * the handle closing, not the freed socket. */
    ASSERT_EQ(MS_SOCK_PENDING, ms_udp_receive(u, 0, on_done));
    ms_uhandle_t *h = u->h;
    ms_udp_free(u);
    ASSERT(h->u == NULL);
    peer_reply(&p, "late", 4);
    for (int i = 0; i < 5; i++)
        uv_run(&loop, UV_RUN_NOWAIT);
    ASSERT_EQ(1, done_n[0]);
    ASSERT_EQ(0, ms__sockets(srv)->socks);
    close(p.fd);
    ASSERT(teardown());
}

/* -- A peer by name ------------------------------------------------------------------------ */

TEST(udp_a_peer_by_name_is_resolved_within_the_timeout)
{
    setup();
    peer_t p;
    ASSERT_EQ(0, peer_open(&p, "127.0.0.1", 0));
    ms_udp_t *u = udp(0);
    /* "localhost" comes from /etc/hosts: no name server is asked. */
    int rc = ms_udp_setpeername(u, "localhost", 9, p.port, on_done);
    ASSERT_EQ(MS_SOCK_PENDING, rc);
    ASSERT(!u->v.connected);
    ASSERT_EQ(MS_SOCK_EBUSY_CONNECT, ms_udp_setpeername(u, "localhost", 9, p.port, on_done));
    ASSERT_EQ(MS_SOCK_DONE, await(u, rc));
    ASSERT(u->v.connected);
    if (u->res.addrs[0].sa.sa_family == AF_INET) {
        ASSERT_EQ(MS_SOCK_DONE, send_str(u, "by name"));
        ASSERT_STR_EQ("by name", peer_read(&p));
    }
    /* A lookup that does not come back in time: "timeout", and the answer that comes later
     * finds no one waiting. */
    pool_hold();
    ms_udp_settimeout(u, 20);
    rc = ms_udp_setpeername(u, "127.1", 5, p.port, on_done);
    ASSERT_EQ(MS_SOCK_PENDING, rc);
    ASSERT(!u->v.connected); /* the old peer went */
    ASSERT_EQ(UV_ETIMEDOUT, await(u, rc));
    ASSERT(u->res.lookup == NULL);
    int n = done_n[0];
    pool_release();
    while (ms__sockets(srv)->inflight > 0)
        run_once();
    ASSERT_EQ(n, done_n[0]);
    ASSERT(!u->v.connected);
    /* A name that does not resolve. */
    ms_udp_settimeout(u, 5000);
    rc = peer_to(u, "nonexistent.invalid", p.port);
    ASSERT_EQ(MS_SOCK_ENOTFOUND, rc);
    ASSERT(!u->v.connected);
    ms_udp_free(u);
    close(p.fd);
    ASSERT(teardown());
}

TEST_MAIN()
