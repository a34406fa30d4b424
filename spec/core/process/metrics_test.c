/* metrics_test.c: the metrics zone: its layout, two servers counting into slots of one
 * zone and read from a third mapping, counts that go on from a slot's earlier writer, the
 * gauges a dead writer leaves cleared, refusals by status. */
#define _GNU_SOURCE /* memfd_create, before any header */
#include "test.h"

#include "../../../core/process/metrics.c"
#include "transport/memio.h"

#include <sys/mman.h>

static void on_request_hello(ms_req_t *r, void *data)
{
    (void)data;
    r->route_ix = 1;
    ms_reply_send(r, "hello", 5, MS_VEC_STATIC, -1);
    ms_req_finish(r);
}

static const char GET[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";

/* The counter of route `route`, method GET, class 2xx in slot `slot`. */
static uint64_t get_2xx(ms_metrics_zone_t *z, int slot, int route)
{
    return ms_metrics_counts(z, slot)[(size_t)route * MS_METRICS_METHODS * MS_METRICS_CLASSES +
                                      1];
}

TEST(metrics_zone_has_four_slots_a_worker_each_page_aligned)
{
    ASSERT_EQ(UV_EINVAL, ms_metrics_create(0, 10));
    ASSERT_EQ(UV_EINVAL, ms_metrics_create(1, MS_METRICS_ROUTES_MAX + 1));
    int fd = ms_metrics_create(2, 10);
    ASSERT(fd >= 0);
    ms_metrics_zone_t *z = ms_metrics_map(fd);
    ASSERT(z != NULL);
    ASSERT_EQ(8, (int)z->nslots);
    ASSERT_EQ(10, (int)z->routes_max);
    ASSERT_EQ(0, (int)(z->slot_size % 4096));
    ASSERT((char *)ms_metrics_slot(z, 1) - (char *)ms_metrics_slot(z, 0) == (long)z->slot_size);
    ASSERT((char *)ms_metrics_counts(z, 0) >= (char *)ms_metrics_slot(z, 0) + z->names_off +
                                                  MS_METRICS_NAMES_MAX);
    ASSERT((char *)(ms_metrics_counts(z, 7) + 11 * MS_METRICS_METHODS * MS_METRICS_CLASSES) <=
           (char *)z + zone_bytes(z));
    ASSERT_EQ(0, (int)ms_metrics_slot(z, 3)->stats.requests); /* a new zone reads 0 */
    /* Not a zone: a file of another kind. */
    int other = memfd_create("other", MFD_CLOEXEC);
    ASSERT(ftruncate(other, 8192) == 0);
    ASSERT(ms_metrics_map(other) == NULL);
    close(other);
    munmap(z, zone_bytes(z));
    close(fd);
}

TEST(metrics_two_servers_count_into_their_slots_and_a_reader_sums_them)
{
    ms_log_set(NULL, MS_LOG_ERR);
    int fd = ms_metrics_create(2, 4);
    ms_metrics_zone_t *reader = ms_metrics_map(fd);
    uv_loop_t loop;
    uv_loop_init(&loop);
    ms_limits_t lim;
    ms_limits_default(&lim);
    ms_server_t *a = ms_server_new(&loop, &lim, on_request_hello, NULL, NULL);
    ms_server_t *b = ms_server_new(&loop, &lim, on_request_hello, NULL, NULL);
    /* Each maps the zone itself, at an address of its own, as a worker does. */
    ASSERT_EQ(0, ms_server_metrics(a, ms_metrics_map(fd), 0));
    ASSERT_EQ(0, ms_server_metrics(b, ms_metrics_map(fd), 4));
    ASSERT_EQ(UV_EINVAL, ms_server_metrics(b, ms_metrics_map(fd), 5)); /* once */
    ms_memio_t ma, mb;
    ms_memio_open(a, &ma);
    ms_memio_open(b, &mb);
    for (int i = 0; i < 3; i++)
        ms_memio_feed(&ma, GET, sizeof(GET) - 1);
    for (int i = 0; i < 5; i++)
        ms_memio_feed(&mb, GET, sizeof(GET) - 1);
    ms_metrics_block_t *sa = ms_metrics_slot(reader, 0), *sb = ms_metrics_slot(reader, 4);
    ASSERT_EQ(3, (int)sa->stats.requests);
    ASSERT_EQ(5, (int)sb->stats.requests);
    ASSERT_EQ(3, (int)get_2xx(reader, 0, 1));
    ASSERT_EQ(5, (int)get_2xx(reader, 4, 1));
    ASSERT_EQ(15, (int)sa->bytes_out);
    ASSERT_EQ(3 * (int)(sizeof(GET) - 1), (int)sa->bytes_in);
    uint64_t seen = 0;
    for (int k = 0; k <= MS_METRICS_NBUCKETS; k++)
        seen += sa->latency[k] + sb->latency[k];
    ASSERT_EQ(8, (int)seen);
    ASSERT_EQ(1, (int)sa->stats.conns);
    ASSERT_EQ(1, (int)sa->conns_proto[0]); /* HTTP/1.1 */
    ASSERT_EQ((int)getpid(), (int)sa->pid);
    ms_memio_peer_close(&ma, UV_EOF);
    ms_memio_peer_close(&mb, UV_EOF);
    ms_memio_free(&ma);
    ms_memio_free(&mb);
    ASSERT_EQ(0, (int)sa->stats.conns);
    ASSERT_EQ(0, (int)sa->conns_proto[0]);
    ms_server_free(a);
    ms_server_free(b);
    uv_loop_close(&loop);
    close(fd);
}

TEST(metrics_a_slots_next_writer_counts_on_and_a_dead_ones_gauges_are_cleared)
{
    ms_log_set(NULL, MS_LOG_ERR);
    int fd = ms_metrics_create(1, 4);
    ms_metrics_zone_t *z = ms_metrics_map(fd);
    ms_metrics_block_t *slot = ms_metrics_slot(z, 1);
    slot->stats.requests = 40;
    slot->stats.conns = 7; /* left by a writer that was killed */
    slot->lua_bytes = 1000;
    ms_metrics_forsake(z, 1);
    ASSERT_EQ(0, (int)slot->stats.conns);
    ASSERT_EQ(0, (int)slot->lua_bytes);
    ASSERT_EQ(0, (int)slot->pid);
    ASSERT_EQ(40, (int)slot->stats.requests);
    uv_loop_t loop;
    uv_loop_init(&loop);
    ms_limits_t lim;
    ms_limits_default(&lim);
    ms_server_t *s = ms_server_new(&loop, &lim, on_request_hello, NULL, NULL);
    ms_memio_t m;
    ms_memio_open(s, &m);
    ms_memio_feed(&m, GET, sizeof(GET) - 1); /* counted in its own block, before the zone */
    ASSERT_EQ(0, ms_server_metrics(s, ms_metrics_map(fd), 1));
    ASSERT_EQ(41, (int)slot->stats.requests);
    ASSERT_EQ(1, (int)slot->stats.conns); /* a gauge: this writer's own */
    /* 417: a refusal the core answers, by its status. */
    static const char expect[] = "GET / HTTP/1.1\r\nHost: a\r\nExpect: x\r\n\r\n";
    ms_memio_feed(&m, expect, sizeof(expect) - 1);
    ASSERT_EQ(1, (int)slot->refused[5]);
    ASSERT_EQ(1, (int)ms_metrics_counts(z, 1)[3]); /* no route, GET, 4xx */
    ms_memio_free(&m);
    ms_server_free(s);
    uv_loop_close(&loop);
    close(fd);
}

TEST_MAIN()
