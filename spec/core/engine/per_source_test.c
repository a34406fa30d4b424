/* per_source_test.c: the per-source table and the in-flight cap. */
#include "test.h"

#include <arpa/inet.h>

#include "../../../core/engine/per_source.c"
#include "../../../core/transport/memio.h"

/* A connection record from `ip`, as accept would fill it. */
static void from(ms_conn_t *c, const char *ip)
{
    struct sockaddr_storage ss;
    struct sockaddr_in *sa = (struct sockaddr_in *)&ss;
    memset(&ss, 0, sizeof(ss));
    sa->sin_family = AF_INET;
    inet_pton(AF_INET, ip, &sa->sin_addr);
    ms__source_key((struct sockaddr *)&ss, c->source);
    c->source_known = 1;
}

static void from6(ms_conn_t *c, const char *ip)
{
    struct sockaddr_storage ss;
    struct sockaddr_in6 *sa = (struct sockaddr_in6 *)&ss;
    memset(&ss, 0, sizeof(ss));
    sa->sin6_family = AF_INET6;
    if (inet_pton(AF_INET6, ip, &sa->sin6_addr) != 1)
        abort();
    ms__source_key((struct sockaddr *)&ss, c->source);
    c->source_known = 1;
}

/* Adds connections from each of `ips` in turn; returns how many were counted. */
static int add_all(ms_server_t *s, ms_conn_t *conns, const char *const *ips, int n)
{
    int counted = 0;
    for (int i = 0; i < n; i++) {
        memset(&conns[i], 0, sizeof(conns[i]));
        from6(&conns[i], ips[i]);
        counted += ms__source_add(s, &conns[i]) == 0;
    }
    return counted;
}

static void remove_all(ms_server_t *s, ms_conn_t *conns, int n)
{
    for (int i = 0; i < n; i++)
        if (conns[i].source_counted)
            ms__source_remove(s, &conns[i]);
}

TEST(caps_counts_ipv6_sources_by_their_prefix_64_unless_told)
{
    /* three of one /64, one of the next, two IPv4 */
    static const char *const ips[] = {
        "2001:db8:1:2::1",      "2001:db8:1:2:ffff:ffff:ffff:ffff",
        "2001:db8:1:2:aaaa::7", "2001:db8:1:3::1",
        "::ffff:10.0.0.1",      "::ffff:10.0.0.2",
    };
    int n = (int)(sizeof(ips) / sizeof(*ips));
    ms_conn_t conns[6];
    uv_loop_t loop;
    uv_loop_init(&loop);
    ms_limits_t lim;
    ms_limits_default(&lim);
    ASSERT_EQ(64, (int)lim.source_ipv6_prefix);
    lim.per_source = 2;
    ms_server_t *s = ms_server_new(&loop, &lim, NULL, NULL, NULL);
    /* one /64 takes two; the next /64 and IPv4 (mapped, each its own) are not held to it */
    ASSERT_EQ(5, add_all(s, conns, ips, n));
    ASSERT_EQ(0, conns[2].source_counted);
    ASSERT_EQ(4, (int)s->sources->len);
    remove_all(s, conns, n);
    ASSERT_EQ(0, (int)s->sources->len);
    ms_server_free(s);

    static const struct {
        uint32_t bits;
        int counted;
    } cases[] = {{128, 6}, {63, 4}, {56, 4}, {47, 4}, {0, 4}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        lim.source_ipv6_prefix = cases[i].bits;
        s = ms_server_new(&loop, &lim, NULL, NULL, NULL);
        if (add_all(s, conns, ips, n) != cases[i].counted)
            TEST_FAIL("/%u: want %d counted", cases[i].bits, cases[i].counted);
        remove_all(s, conns, n);
        ASSERT_EQ(0, (int)s->sources->len);
        ms_server_free(s);
    }
    uv_loop_close(&loop);
}

static void on_request_park(ms_req_t *r, void *data)
{
    ms_req_t **slot = data;
    ms_req_park(r);
    *slot = r;
}

static void on_resume_none(ms_req_t *r, void *data)
{
    (void)r;
    (void)data;
}

TEST(caps_counts_connections_per_source_up_to_the_cap)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.per_source = 2;
    ms_server_t *s = ms_server_new(&loop, &lim, NULL, NULL, NULL);
    ms_conn_t conns[600];
    memset(conns, 0, sizeof(conns));
    for (int i = 0; i < 3; i++)
        from(&conns[i], "10.0.0.1");
    from(&conns[3], "10.0.0.2");
    ASSERT_EQ(0, ms__source_add(s, &conns[0]));
    ASSERT_EQ(0, ms__source_add(s, &conns[1]));
    ASSERT_EQ(MS_EBUSY, ms__source_add(s, &conns[2]));
    ASSERT_EQ(0, conns[2].source_counted);
    ASSERT_EQ(0, ms__source_add(s, &conns[3])); /* others go on */
    ms__source_remove(s, &conns[0]);
    ASSERT_EQ(0, ms__source_add(s, &conns[2]));
    /* Many sources: the table grows, and every one can be removed and found again. */
    for (int i = 10; i < 600; i++) {
        char ip[32];
        snprintf(ip, sizeof(ip), "192.168.%d.%d", i / 250, i % 250);
        from(&conns[i], ip);
        ASSERT_EQ(0, ms__source_add(s, &conns[i]));
    }
    for (int i = 10; i < 600; i += 2)
        ms__source_remove(s, &conns[i]);
    for (int i = 11; i < 600; i += 2) {
        char ip[32];
        snprintf(ip, sizeof(ip), "192.168.%d.%d", i / 250, i % 250);
        ms_conn_t extra;
        memset(&extra, 0, sizeof(extra));
        from(&extra, ip);
        ASSERT_EQ(0, ms__source_add(s, &extra)); /* second of 2 */
        ASSERT_EQ(MS_EBUSY, ms__source_add(s, &extra));
        ms__source_remove(s, &extra);
        ms__source_remove(s, &conns[i]);
    }
    ASSERT_EQ(2, (int)s->sources->len); /* a (two connections) and b remain */
    ms__source_remove(s, &conns[1]);
    ms__source_remove(s, &conns[2]);
    ms__source_remove(s, &conns[3]);
    ASSERT_EQ(0, (int)s->sources->len);
    ms_server_free(s);
    uv_loop_close(&loop);
}

TEST(caps_answers_503_and_closes_past_in_flight_without_running_the_handler)
{
    ms_log_set(NULL, MS_LOG_ERR);
    uv_loop_t loop;
    uv_loop_init(&loop);
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.in_flight = 1;
    ms_req_t *parked = NULL;
    ms_server_t *s = ms_server_new(&loop, &lim, on_request_park, on_resume_none, &parked);
    ms_memio_t m1, m2;
    ms_memio_open(s, &m1);
    ms_memio_open(s, &m2);
    ms_memio_feed(&m1, "GET / HTTP/1.1\r\nHost: a\r\n\r\n", 27);
    ASSERT(parked != NULL);
    ms_req_t *first = parked;
    parked = NULL;
    ms_memio_feed(&m2, "GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 54);
    ASSERT(parked == NULL);
    ms__buf_append(&m2.out, "", 1);
    ASSERT(strncmp(m2.out.base, "HTTP/1.1 503 Service Unavailable\r\n", 34) == 0);
    ASSERT(strstr(m2.out.base, "retry-after: 1\r\n") != NULL);
    ASSERT(strstr(m2.out.base, "connection: close\r\n") != NULL);
    ASSERT(strstr(m2.out.base + 10, "HTTP/1.1 503") == NULL); /* then it closes */
    ASSERT_EQ(1, m2.closed);
    ASSERT_EQ(1, (int)s->stats->refused_busy);
    ms_memio_free(&m2);
    /* Once the first finishes, the next request is served. */
    ms_reply_send(first, "ok", 2, MS_VEC_STATIC, -1);
    ms_req_finish(first);
    ms_memio_open(s, &m2);
    ms_memio_feed(&m2, "GET / HTTP/1.1\r\nHost: a\r\n\r\n", 27);
    ASSERT(parked != NULL);
    ms_reply_send(parked, "ok", 2, MS_VEC_STATIC, -1);
    ms_req_finish(parked);
    ms_memio_peer_close(&m1, UV_EOF);
    ms_memio_peer_close(&m2, UV_EOF);
    ms_memio_free(&m1);
    ms_memio_free(&m2);
    ms_server_free(s);
    uv_loop_close(&loop);
}

TEST(caps_defaults_set_every_limit_from_the_table)
{
    /* Whatever the caller's struct held before, ms_limits_default() leaves the table's values
     * in every field (body_bytes_max once kept what the stack had). */
    ms_limits_t lim;
    memset(&lim, 0xa5, sizeof(lim));
    ms_limits_default(&lim);
#define CHECK_DEFAULT(key, field, type, dflt, unit, max, doc)                                      \
    ASSERT((uint64_t)lim.field == (uint64_t)((dflt)*MS_UNIT_SCALE(unit)));
    MS_LIMITS(CHECK_DEFAULT)
#undef CHECK_DEFAULT
    ASSERT_EQ(0, (int)lim.body_bytes_max);
    ASSERT_EQ(10000, (int)lim.head_timeout_ms); /* seconds in the table, milliseconds here */
    ASSERT_EQ(8 * 1024 * 1024, (int)lim.body_bytes);
    ASSERT_EQ(1000, (int)lim.requests_per_connection);
}

TEST_MAIN()
