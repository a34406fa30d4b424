/* tcp_test.c: the TCP transport on a real loopback connection: reading, a write the socket
 * takes only in part, the addresses, and closing. */
#define _GNU_SOURCE /* tcp.c's accept4 and IOV_MAX, before any header */
#include "test.h"

#include "../../../core/transport/tcp.c"
#include "loopback.h"

#include <sys/resource.h>

#define S(lit) lit, sizeof(lit) - 1
#define BIG (4 * 1024 * 1024)

static uv_loop_t loop;
static ms_server_t *srv;
static int requests;
static char peer[64], local[64], remote[64];
static int local_port, remote_port, fd, has_sendfile;
static char *big;

static void on_request(ms_req_t *r, void *data)
{
    (void)data;
    requests++;
    ms_conn_t *c = r->conn;
    ms_conn_peer(c, peer, sizeof(peer));
    local_port = ms_conn_address(c, 1, local, sizeof(local));
    remote_port = ms_conn_address(c, 0, remote, sizeof(remote));
    fd = c->io->fd(c);
    has_sendfile = c->io->sendfile != NULL;
    /* Larger than the socket takes at once: the rest goes as a background write. */
    ms_reply_send(r, big, BIG, MS_VEC_STATIC, -1);
    ms_req_finish(r);
}

static void on_request_small(ms_req_t *r, void *data)
{
    (void)data;
    requests++;
    ms_reply_send(r, S("hello"), MS_VEC_STATIC, -1);
    ms_req_finish(r);
}

static void on_resume(ms_req_t *r, void *data)
{
    (void)r;
    (void)data;
}

TEST(tcp_reads_a_request_and_writes_a_large_reply_over_loopback)
{
    ms_log_set(NULL, MS_LOG_ERR);
    uv_loop_init(&loop);
    srv = ms_server_new(&loop, NULL, on_request, on_resume, NULL);
    big = ms_mem_alloc(BIG);
    for (size_t i = 0; i < BIG; i++)
        big[i] = (char)('a' + i % 26);
    ASSERT_EQ(0, ms_server_listen(srv, "127.0.0.1:0", 0, 0));
    int port = ms_server_port(srv);
    /* The client sends its request and ends its side; the server closes
     * once the reply is out. */
    static const char req[] = "GET /x HTTP/1.1\r\nHost: a\r\n\r\n";
    client_t cl;
    client_start(&cl, &loop, port, S(req));
    cl.half_close = 1;
    ASSERT(run_until(&loop, &cl.done, 10000));
    ASSERT_EQ(1, requests);
    ASSERT_EQ(UV_EOF, cl.status);
    ASSERT_STR_EQ("127.0.0.1", peer);
    ASSERT_STR_EQ("127.0.0.1", local);
    ASSERT_STR_EQ("127.0.0.1", remote);
    ASSERT_EQ(port, local_port);
    ASSERT(remote_port > 0 && remote_port != port);
    ASSERT(fd >= 0);
    ASSERT(has_sendfile);
    /* Every byte, in order, behind the head. */
    ASSERT(cl.got.base != NULL);
    ASSERT(strncmp(cl.got.base, "HTTP/1.1 200 OK\r\n", 17) == 0);
    const char *body = strstr(cl.got.base, "\r\n\r\n");
    ASSERT(body != NULL);
    body += 4;
    ASSERT_EQ(BIG, cl.got.len - (size_t)(body - cl.got.base));
    ASSERT(memcmp(body, big, BIG) == 0);
    /* The server's side is closed and freed once the client's end came. */
    for (int i = 0; i < 100 && srv->stats->conns > 0; i++)
        uv_run(&loop, UV_RUN_NOWAIT);
    ASSERT_EQ(0, (int)srv->stats->conns);
    ASSERT_EQ(1, (int)srv->stats->closed);
    client_free(&cl);
    ms_mem_free(big);
    ms_server_stop(srv, NULL);
    ms_server_free(srv);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(0, uv_loop_close(&loop));
}

/* A client that resets: the server's connection goes without a reply. */
static void on_request_park(ms_req_t *r, void *data)
{
    (void)data;
    requests++;
    ms_req_park(r);
    *(ms_req_t **)ms_server_loop(r->conn->server)->data = r;
}

TEST(tcp_peer_reset_aborts_a_parked_request)
{
    ms_log_set(NULL, MS_LOG_ERR);
    uv_loop_init(&loop);
    ms_req_t *parked = NULL;
    loop.data = &parked;
    requests = 0;
    srv = ms_server_new(&loop, NULL, on_request_park, on_resume, NULL);
    ASSERT_EQ(0, ms_server_listen(srv, "127.0.0.1:0", 0, 0));
    static const char req[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    client_t cl;
    client_start(&cl, &loop, ms_server_port(srv), S(req));
    while (parked == NULL)
        uv_run(&loop, UV_RUN_ONCE);
    /* a reset: SO_LINGER 0, then close */
    uv_os_fd_t cfd;
    uv_fileno((uv_handle_t *)&cl.h, &cfd);
    struct linger lg = {1, 0};
    setsockopt(cfd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    uv_close((uv_handle_t *)&cl.h, client_closed);
    for (int i = 0; i < 200 && !(parked->v.flags & MS_REQ_ABORTED); i++)
        uv_run(&loop, UV_RUN_ONCE);
    ASSERT(parked->v.flags & MS_REQ_ABORTED);
    ASSERT_EQ(1, (int)srv->stats->conns); /* the handler still holds it */
    ASSERT_EQ(0, ms_reply_send(parked, S("late"), MS_VEC_STATIC, -1)); /* dropped */
    ms_req_finish(parked);
    for (int i = 0; i < 100 && srv->stats->conns > 0; i++)
        uv_run(&loop, UV_RUN_NOWAIT);
    ASSERT_EQ(0, (int)srv->stats->conns);
    client_free(&cl);
    ms_server_stop(srv, NULL);
    ms_server_free(srv);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(0, uv_loop_close(&loop));
}


/* Lowers the soft limit on descriptors to the lowest one free, so that none more can be
 * opened; `was` keeps the limits to put back. */
static int no_more_descriptors(struct rlimit *was)
{
    if (getrlimit(RLIMIT_NOFILE, was) != 0)
        return -1;
    int probe = dup(0); /* the lowest free descriptor */
    close(probe);
    struct rlimit low = *was;
    low.rlim_cur = (rlim_t)probe;
    return setrlimit(RLIMIT_NOFILE, &low);
}

/* A server on a loopback port whose own check for MS_FD_RESERVE never fires, so that the
 * kernel's limit is what runs out. */
static int listen_unguarded(void)
{
    ms_log_set(NULL, MS_LOG_ERR);
    uv_loop_init(&loop);
    requests = 0;
    srv = ms_server_new(&loop, NULL, on_request_small, on_resume, NULL);
    int rc = ms_server_listen(srv, "127.0.0.1:0", 0, 0);
    srv->fd_limit = UINT32_MAX / 2;
    return rc;
}

/* Out of descriptors (the worker's own check for MS_FD_RESERVE left aside): the connections
 * waiting are accepted with the reserve descriptor and closed, each counted as refused, the
 * listener does not spin, and once descriptors are free again it serves. */
TEST(tcp_out_of_descriptors_refuses_waiting_connections_then_serves)
{
    ASSERT_EQ(0, listen_unguarded());
    static const char req[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    client_t cl[3];
    for (int i = 0; i < 3; i++)
        client_start(&cl[i], &loop, ms_server_port(srv), S(req));
    struct rlimit was;
    ASSERT_EQ(0, no_more_descriptors(&was));
    for (int i = 0; i < 3; i++)
        ASSERT(run_until(&loop, &cl[i].done, 5000));
    ASSERT_EQ(0, setrlimit(RLIMIT_NOFILE, &was));
    ASSERT_EQ(0, requests);
    ASSERT_EQ(3, (int)srv->stats->refused_conns);
    for (int i = 0; i < 3; i++) {
        ASSERT(cl[i].status == UV_EOF || cl[i].status == UV_ECONNRESET);
        client_free(&cl[i]);
    }
    /* Descriptors again: served, and the reserve is back for next time. */
    client_t ok;
    client_start(&ok, &loop, ms_server_port(srv), S(req));
    ok.half_close = 1;
    ASSERT(run_until(&loop, &ok.done, 5000));
    ASSERT_EQ(1, requests);
    ASSERT(ok.got.base != NULL && strncmp(ok.got.base, "HTTP/1.1 200 OK\r\n", 17) == 0);
    ASSERT(reserve_fd >= 0);
    client_free(&ok);
    ms_server_stop(srv, NULL);
    ms_server_free(srv);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(0, uv_loop_close(&loop));
}

/* Out of descriptors with no reserve either: the listener rests (no busy loop), the waiting
 * connections stay in the kernel's queue, and once descriptors are back they are served. */
TEST(tcp_out_of_descriptors_without_reserve_rests_then_serves)
{
    ASSERT_EQ(0, listen_unguarded());
    ms_listener_t *l = srv->listeners;
    close(reserve_fd); /* as if another part of the worker had taken it */
    reserve_fd = -1;
    static const char req[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    client_t cl;
    client_start(&cl, &loop, ms_server_port(srv), S(req));
    cl.half_close = 1;
    struct rlimit was;
    ASSERT_EQ(0, no_more_descriptors(&was));
    for (int i = 0; i < 200 && uv_is_active((uv_handle_t *)&l->poll); i++)
        uv_run(&loop, UV_RUN_ONCE);
    ASSERT(!uv_is_active((uv_handle_t *)&l->poll)); /* resting, not spinning */
    ASSERT_EQ(0, (int)srv->stats->refused_conns);   /* the connection waits, not refused */
    ASSERT_EQ(0, requests);
    ASSERT_EQ(0, setrlimit(RLIMIT_NOFILE, &was));
    ASSERT(run_until(&loop, &cl.done, 5000)); /* the rest is over: served */
    ASSERT_EQ(1, requests);
    ASSERT(cl.got.base != NULL && strncmp(cl.got.base, "HTTP/1.1 200 OK\r\n", 17) == 0);
    client_free(&cl);
    ms_server_stop(srv, NULL);
    ms_server_free(srv);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(0, uv_loop_close(&loop));
}

TEST_MAIN()
