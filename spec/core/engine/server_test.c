/* server_test.c: a worker's server on a real loop: listening on loopback, serving, the caps
 * on open connections, stopping and freeing; the limits' defaults. */
#include "test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../../core/engine/server.c"
#include "loopback.h"
#include "tls_peer.h"

#include <fcntl.h>

#define S(lit) lit, sizeof(lit) - 1

static uv_loop_t loop;
static ms_server_t *srv;
static int requests, stopped;

static void on_request(ms_req_t *r, void *data)
{
    (void)data;
    requests++;
    ms_reply_send(r, S("served"), MS_VEC_STATIC, -1);
    ms_req_finish(r);
}

static void on_resume(ms_req_t *r, void *data)
{
    (void)r;
    (void)data;
}

static void on_stopped(ms_server_t *s)
{
    (void)s;
    stopped++;
}

static void setup(const ms_limits_t *lim)
{
    ms_log_set(NULL, MS_LOG_ERR);
    uv_loop_init(&loop);
    srv = ms_server_new(&loop, lim, on_request, on_resume, NULL);
    requests = stopped = 0;
}

static void teardown(void)
{
    ms_server_free(srv);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(0, uv_loop_close(&loop)); /* every handle closed */
}

TEST(server_limits_defaults_are_the_table)
{
    ms_limits_t l;
    memset(&l, 0xff, sizeof(l));
    ms_limits_default(&l);
    ASSERT_EQ(10000, l.head_timeout_ms);  /* 10 s */
    ASSERT_EQ(15000, l.idle_timeout_ms);  /* 15 s */
    ASSERT_EQ(30000, l.send_timeout_ms);  /* 30 s */
#define CHECK_DEFAULT(key, field, type, dflt, unit, max, doc)                                     \
    if (l.field != (type)((dflt)*MS_UNIT_SCALE(unit)))                                             \
        TEST_FAIL("%s: not its default", #key);
    MS_LIMITS(CHECK_DEFAULT)
#undef CHECK_DEFAULT
    /* A server made without limits takes the defaults. */
    uv_loop_init(&loop);
    srv = ms_server_new(&loop, NULL, on_request, on_resume, NULL);
#define CHECK_SAME(key, field, type, dflt, unit, max, doc)                                        \
    if (srv->limits.field != l.field)                                                              \
        TEST_FAIL("%s: not its default", #key);
    MS_LIMITS(CHECK_SAME)
#undef CHECK_SAME
    ASSERT_EQ(443, srv->https_port);
    ASSERT(!ms_server_stopping(srv));
    ASSERT(ms_server_loop(srv) == &loop);
    ASSERT(ms_server_stats(srv) == srv->stats);
    teardown();
}

TEST(server_listen_parses_addresses_and_refuses_bad_ones)
{
    setup(NULL);
    static const char *const bad[] = {"nocolon", "127.0.0.1:", "127.0.0.1:70000",
                                      "127.0.0.1:-1", "[::1:80", "127.0.0.1:8x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
        if (ms_server_listen(srv, bad[i], 0, 0) != UV_EINVAL)
            TEST_FAIL("%s: not refused", bad[i]);
    ASSERT(srv->listeners == NULL);
    ASSERT_EQ(0, ms_server_listen(srv, "localhost:0", 0, 0));
    int port = ms_server_port(srv);
    ASSERT(port > 0);
    /* ms_listen_fd: the same parse, a socket of its own, the port overridden */
    ASSERT_EQ(UV_EINVAL, ms_listen_fd("nocolon", 0, -1));
    int fd = ms_listen_fd("127.0.0.1:1", 16, 0);
    ASSERT(fd >= 0);
    int fport = ms_fd_port(fd);
    ASSERT(fport > 0 && fport != 1);
    ASSERT_EQ(0, ms_server_listen_fd(srv, fd, 0)); /* the server owns it now */
    ASSERT_EQ(fport, ms_server_port(srv));
    ASSERT_EQ(UV_EINVAL, ms_server_listen_tls(srv, NULL));
    ms_server_stop(srv, on_stopped);
    ASSERT_EQ(1, stopped); /* no connection: done at once */
    ASSERT(srv->listeners == NULL);
    teardown();
}

TEST(server_serves_a_loopback_client_then_stops)
{
    setup(NULL);
    ASSERT_EQ(0, ms_server_listen(srv, "127.0.0.1:0", 0, 0));
    static const char req[] = "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    client_t cl;
    client_start(&cl, &loop, ms_server_port(srv), S(req));
    ASSERT(run_until(&loop, &cl.done, 5000));
    ASSERT_EQ(UV_EOF, cl.status);
    ASSERT_EQ(1, requests);
    ASSERT(cl.got.base != NULL && strncmp(cl.got.base, "HTTP/1.1 200 OK\r\n", 17) == 0);
    ASSERT_HAS(cl.got.base, "\r\n\r\nserved");
    ASSERT_EQ(1, (int)srv->stats->accepted);
    ASSERT_EQ(1, (int)srv->stats->requests);
    client_free(&cl);

    /* Stopping with a connection open: done once it is gone, and no new one is taken. */
    static const char keep[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    client_t k;
    client_start(&k, &loop, ms_server_port(srv), S(keep));
    while (requests < 2)
        uv_run(&loop, UV_RUN_ONCE);
    int port = ms_server_port(srv);
    ms_server_stop(srv, on_stopped);
    ASSERT(ms_server_stopping(srv));
    ASSERT_EQ(0, stopped); /* the keep-alive connection gets its grace */
    ASSERT(run_until(&loop, &k.done, 5000));
    ASSERT(run_until(&loop, &stopped, 5000));
    ASSERT_EQ(1, stopped);
    ASSERT_EQ(0, (int)srv->stats->conns);
    client_t late;
    client_start(&late, &loop, port, S(keep));
    ASSERT(run_until(&loop, &late.done, 5000));
    ASSERT(late.status < 0 && late.status != UV_EOF); /* refused: nobody listens */
    ASSERT_EQ(2, requests);
    client_free(&k);
    client_free(&late);
    teardown();
}

TEST(server_closes_connections_over_its_cap_before_reading)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.connections = 0;
    setup(&lim);
    ASSERT_EQ(0, ms_server_listen(srv, "127.0.0.1:0", 0, 0));
    static const char req[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    client_t cl;
    client_start(&cl, &loop, ms_server_port(srv), S(req));
    ASSERT(run_until(&loop, &cl.done, 5000));
    ASSERT(cl.status < 0);
    ASSERT_EQ(0, cl.got.len);
    ASSERT_EQ(0, requests);
    ASSERT_EQ(1, (int)srv->stats->refused_conns);
    ASSERT_EQ(0, (int)srv->stats->conns);
    client_free(&cl);
    ms_server_stop(srv, on_stopped);
    uv_run(&loop, UV_RUN_NOWAIT);
    teardown();
}

/* A blocking loopback client of the server's port, for steps the loop must not see yet. */
static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
        return fd;
    if (fd >= 0)
        close(fd);
    return -1;
}

TEST(server_drains_accepting_for_its_delay_then_refuses)
{
    setup(NULL);
    ASSERT_EQ(0, ms_server_listen(srv, "127.0.0.1:0", 0, 0));
    int port = ms_server_port(srv);
    ms_server_drain(srv, 300, NULL, on_stopped);
    ASSERT(ms_server_stopping(srv));
    /* During the delay: accepted and served, and told to close. */
    static const char keep[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    client_t in;
    client_start(&in, &loop, port, S(keep));
    ASSERT(run_until(&loop, &in.done, 5000));
    ASSERT_EQ(1, requests);
    ASSERT_HAS(in.got.base, "connection: close\r\n");
    ASSERT_EQ(0, stopped); /* not before the delay is over */
    client_free(&in);
    /* Then the listeners close, and the stop is done. */
    ASSERT(run_until(&loop, &stopped, 5000));
    client_t late;
    client_start(&late, &loop, port, S(keep));
    ASSERT(run_until(&loop, &late.done, 5000));
    ASSERT(late.status < 0 && late.status != UV_EOF); /* refused */
    ASSERT_EQ(1, requests);
    client_free(&late);
    teardown();
}

/* Two kept-alive connections idle through a drain's delay: as it ends, the one with nothing
 * to say closes at once (not a grace later), and the one whose request came just then is
 * answered, with close. */
TEST(server_closes_connections_idle_through_a_drains_delay_as_it_ends)
{
    setup(NULL);
    ASSERT_EQ(0, ms_server_listen(srv, "127.0.0.1:0", 0, 0));
    static const char keep[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    int fd[2];
    char buf[4096];
    for (int i = 0; i < 2; i++) {
        fd[i] = raw_connect(ms_server_port(srv));
        ASSERT(fd[i] >= 0);
        ASSERT_EQ((ssize_t)sizeof(keep) - 1, send(fd[i], keep, sizeof(keep) - 1, 0));
        while (requests < i + 1)
            uv_run(&loop, UV_RUN_ONCE);
        ASSERT(recv(fd[i], buf, sizeof(buf), 0) > 0);
    }
    ms_server_drain(srv, 100, NULL, on_stopped);
    uv_run(&loop, UV_RUN_NOWAIT);
    /* The delay passes while the loop is away; a request comes on the second just then. */
    usleep(150 * 1000);
    ASSERT_EQ((ssize_t)sizeof(keep) - 1, send(fd[1], keep, sizeof(keep) - 1, 0));
    uint64_t t0 = uv_now(&loop);
    ASSERT(run_until(&loop, &stopped, 5000));
    uv_update_time(&loop);
    ASSERT(uv_now(&loop) - t0 < MS_STOP_GRACE_MS / 2);
    ASSERT_EQ(3, requests);
    ASSERT_EQ(0, recv(fd[0], buf, sizeof(buf), 0));
    ssize_t n = recv(fd[1], buf, sizeof(buf) - 1, 0);
    ASSERT(n > 0);
    buf[n] = '\0';
    ASSERT_HAS(buf, "HTTP/1.1 200 OK\r\n");
    ASSERT_HAS(buf, "connection: close\r\n");
    close(fd[0]);
    close(fd[1]);
    teardown();
}

TEST(server_answers_a_request_that_came_as_an_idle_connection_ended)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.idle_timeout_ms = 50;
    setup(&lim);
    ASSERT_EQ(0, ms_server_listen(srv, "127.0.0.1:0", 0, 0));
    int fd = raw_connect(ms_server_port(srv));
    ASSERT(fd >= 0);
    static const char keep[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    ASSERT_EQ((ssize_t)sizeof(keep) - 1, send(fd, keep, sizeof(keep) - 1, 0));
    while (requests < 1)
        uv_run(&loop, UV_RUN_ONCE);
    char buf[4096];
    ASSERT(recv(fd, buf, sizeof(buf), 0) > 0);
    /* The idle deadline passes while the loop is away; the next request arrives just then,
     * and is in the socket, unread, when the deadline runs (before the loop reads). */
    usleep(120 * 1000);
    ASSERT_EQ((ssize_t)sizeof(keep) - 1, send(fd, keep, sizeof(keep) - 1, 0));
    for (int i = 0; i < 50 && requests < 2; i++)
        uv_run(&loop, UV_RUN_NOWAIT);
    ASSERT_EQ(2, requests);
    ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
    ASSERT(n > 0);
    buf[n] = '\0';
    ASSERT_HAS(buf, "HTTP/1.1 200 OK\r\n");
    close(fd);
    /* Then it goes idle, and closes at its deadline. */
    ASSERT_EQ(1, (int)srv->stats->conns);
    ms_server_stop(srv, on_stopped);
    ASSERT(run_until(&loop, &stopped, 5000));
    teardown();
}

/* Runs the loop a turn at a time until the OpenSSL call `op` on the client's non-blocking
 * socket goes through (or 200 turns); returns its result. */
#define TLS_STEP(ssl, op)                                                                          \
    ({                                                                                             \
        int r_ = -1;                                                                               \
        for (int i_ = 0; i_ < 200; i_++) {                                                         \
            r_ = (op);                                                                             \
            if (r_ > 0)                                                                            \
                break;                                                                             \
            int e_ = SSL_get_error((ssl), r_);                                                     \
            if (e_ != SSL_ERROR_WANT_READ && e_ != SSL_ERROR_WANT_WRITE)                           \
                break;                                                                             \
            uv_run(&loop, UV_RUN_NOWAIT);                                                          \
            usleep(1000);                                                                          \
        }                                                                                          \
        r_;                                                                                        \
    })

/* The same race on HTTPS (with and without kernel TLS where the kernel offers it): the
 * request is in the socket as ciphertext, under the TLS transport. */
TEST(server_answers_a_tls_request_that_came_as_an_idle_connection_ended)
{
    for (int kernel = 0; kernel <= ms_tls_kernel(NULL); kernel++) {
        ms_limits_t lim;
        ms_limits_default(&lim);
        lim.idle_timeout_ms = 50;
        setup(&lim);
        char err[256];
        ms_tls_opts_t o = {.no_ktls = !kernel};
        ms_tls_t *t = ms_tls_new(srv, &o, err, sizeof(err));
        ASSERT(t != NULL);
        ASSERT_EQ(0, peer_add_cert(t, NULL, "a.test", 0));
        ASSERT_EQ(0, ms_server_listen(srv, "127.0.0.1:0", 0, 0));
        ASSERT_EQ(0, ms_server_listen_tls(srv, t));
        int fd = raw_connect(ms_server_port(srv));
        ASSERT(fd >= 0);
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
        SSL *ssl = SSL_new(ctx);
        SSL_set_fd(ssl, fd);
        ASSERT_EQ(1, TLS_STEP(ssl, SSL_connect(ssl)));
        static const char keep[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        ASSERT(TLS_STEP(ssl, SSL_write(ssl, keep, sizeof(keep) - 1)) > 0);
        char buf[4096];
        ASSERT(TLS_STEP(ssl, SSL_read(ssl, buf, sizeof(buf))) > 0);
        ASSERT_EQ(1, requests);
        /* The idle deadline passes while the loop is away; the next request is in the socket,
         * unread, when the deadline runs. */
        usleep(120 * 1000);
        ASSERT_EQ((int)sizeof(keep) - 1, SSL_write(ssl, keep, sizeof(keep) - 1));
        for (int i = 0; i < 50 && requests < 2; i++)
            uv_run(&loop, UV_RUN_NOWAIT);
        ASSERT_EQ(2, requests);
        int n = TLS_STEP(ssl, SSL_read(ssl, buf, sizeof(buf) - 1));
        ASSERT(n > 0);
        buf[n] = '\0';
        ASSERT_HAS(buf, "HTTP/1.1 200 OK\r\n");
        SSL_free(ssl);
        SSL_CTX_free(ctx);
        close(fd);
        ms_server_stop(srv, on_stopped);
        ASSERT(run_until(&loop, &stopped, 5000));
        teardown();
    }
}

TEST_MAIN()
