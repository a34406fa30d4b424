/* resolve_test.c: name resolution on a real loop, with no name server: address literals need
 * no lookup; names come from /etc/hosts ("localhost") or are numbers getaddrinfo reads
 * ("127.1"); one lookup per name, capped, cached for a time and in number, cancelled, and
 * outliving the worker. (getaddrinfo reads its servers from the system's resolv.conf, which a
 * test cannot point at a server of its own: a name that does not resolve is under .invalid.) */
#include "test.h"

#include <arpa/inet.h>

#include "../../../core/client/resolve.c"

#include "real_loop.h"

/* Completions, per resolution. */
#define N 8
static ms_resolve_t res[N];
static int done_n[N], done_rc[N];

static void on_res(ms_resolve_t *r, int status)
{
    int i = (int)(r - res);
    done_n[i]++;
    done_rc[i] = status;
}

static int start(int i, const char *name, int port)
{
    done_n[i] = 0;
    return ms_resolve(srv, &res[i], name, strlen(name), port, on_res);
}

/* What ms_resolve returned, or, when it is pending, what its callback got. */
static int await(int i, int rc)
{
    if (rc != MS_SOCK_PENDING)
        return rc;
    while (done_n[i] == 0)
        run_once();
    return done_rc[i];
}

static int resolve(int i, const char *name, int port)
{
    return await(i, start(i, name, port));
}

/* An answer's address and port as "ip port". */
static const char *addr_text(const ms_addr_t *a)
{
    static char buf[80];
    char ip[64];
    int port;
    if (a->sa.sa_family == AF_INET6) {
        uv_ip6_name(&a->in6, ip, sizeof(ip));
        port = ntohs(a->in6.sin6_port);
    } else {
        uv_ip4_name(&a->in, ip, sizeof(ip));
        port = ntohs(a->in.sin_port);
    }
    snprintf(buf, sizeof(buf), "%s %d", ip, port);
    return buf;
}

static ms_sockets_t *sk(void)
{
    return ms__sockets(srv);
}

TEST(resolve_takes_address_literals_without_a_lookup)
{
    setup();
    ASSERT_EQ(MS_SOCK_DONE, start(0, "127.0.0.1", 53));
    ASSERT_EQ(1, res[0].naddrs);
    ASSERT_STR_EQ("127.0.0.1 53", addr_text(&res[0].addrs[0]));
    ASSERT_EQ(MS_SOCK_DONE, start(0, "::1", 8080));
    ASSERT_STR_EQ("::1 8080", addr_text(&res[0].addrs[0]));
    ASSERT_EQ(MS_SOCK_DONE, start(0, "[2001:db8::7]", 443));
    ASSERT_EQ(1, res[0].naddrs);
    ASSERT_STR_EQ("2001:db8::7 443", addr_text(&res[0].addrs[0]));
    ASSERT_EQ(MS_SOCK_DONE, start(0, "::ffff:10.0.0.1", 1));
    ASSERT_EQ(AF_INET6, res[0].addrs[0].sa.sa_family);
    /* The name may be the request's own buffer. */
    strcpy(res[1].name, "10.1.2.3");
    ASSERT_EQ(MS_SOCK_DONE, ms_resolve(srv, &res[1], res[1].name, 8, 9, on_res));
    ASSERT_STR_EQ("10.1.2.3 9", addr_text(&res[1].addrs[0]));
    /* None asked the worker's resolver: its state was not even made. */
    ASSERT(srv->sockets == NULL);
    ASSERT_EQ(0, done_n[0] + done_n[1]);
    /* Refused: empty, too long, a NUL inside. */
    char longname[MS_HOST_MAX + 2];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = 0;
    ASSERT_EQ(UV_EINVAL, ms_resolve(srv, &res[0], "", 0, 80, on_res));
    ASSERT_EQ(UV_EINVAL, ms_resolve(srv, &res[0], longname, MS_HOST_MAX + 1, 80, on_res));
    ASSERT_EQ(UV_EINVAL, ms_resolve(srv, &res[0], "a\0b", 3, 80, on_res));
    ASSERT(srv->sockets == NULL);
    ASSERT(teardown());
}

TEST(resolve_looks_up_names_and_caches_the_answer)
{
    setup();
    int rc = start(0, "localhost", 80);
    ASSERT_EQ(MS_SOCK_PENDING, rc); /* never from inside the call */
    ASSERT_EQ(0, done_n[0]);
    ASSERT_EQ(MS_SOCK_DONE, await(0, rc));
    ASSERT(res[0].naddrs >= 1 && res[0].naddrs <= MS_RESOLVE_ADDRS);
    int v4 = 0;
    for (int i = 0; i < res[0].naddrs; i++) {
        const char *t = addr_text(&res[0].addrs[i]);
        v4 |= strcmp(t, "127.0.0.1 80") == 0;
        if (strcmp(t, "127.0.0.1 80") != 0 && strcmp(t, "::1 80") != 0)
            TEST_FAIL("localhost gave %s", t);
        for (int k = 0; k < i; k++) /* one per address, not one per socket type */
            if (memcmp(&res[0].addrs[k], &res[0].addrs[i], sizeof(ms_addr_t)) == 0)
                TEST_FAIL("%s twice", t);
    }
    ASSERT(v4); /* /etc/hosts */
    ASSERT_EQ(1, sk()->lookups_started);
    ASSERT_EQ(1, sk()->cache_n);
    ASSERT_EQ(0, sk()->inflight);
    /* Cached: no second lookup, whatever the case, and the port is the new call's. */
    ASSERT_EQ(MS_SOCK_DONE, start(1, "LOCALHOST", 5353));
    ASSERT_EQ(res[0].naddrs, res[1].naddrs);
    ASSERT_HAS(addr_text(&res[1].addrs[0]), " 5353");
    ASSERT_EQ(1, sk()->lookups_started);
    /* A number getaddrinfo reads (inet_aton's short form), which is no literal here. */
    ASSERT_EQ(MS_SOCK_DONE, resolve(2, "127.1", 7));
    ASSERT_EQ(1, res[2].naddrs);
    ASSERT_STR_EQ("127.0.0.1 7", addr_text(&res[2].addrs[0]));
    ASSERT_EQ(2, sk()->lookups_started);
    ASSERT(teardown());
}

TEST(resolve_a_name_that_does_not_resolve_fails_and_the_failure_is_cached)
{
    setup();
    int rc = resolve(0, "nonexistent.invalid", 80);
    ASSERT_EQ(MS_SOCK_ENOTFOUND, rc);
    ASSERT_STR_EQ("could not be resolved (3: Host not found)", ms_sock_strerror(rc));
    ASSERT_EQ(0, res[0].naddrs);
    ASSERT_EQ(1, sk()->lookups_started);
    /* Cached: the failure at once, from the call. */
    ASSERT_EQ(MS_SOCK_ENOTFOUND, start(1, "NonExistent.Invalid", 80));
    ASSERT_EQ(0, done_n[1]);
    ASSERT_EQ(1, sk()->lookups_started);
    /* With no negative TTL, failures are not kept. */
    ms_sock_config_t cfg = sk()->cfg;
    cfg.resolve_negative_ttl = 0;
    ms_sock_config(srv, &cfg);
    ASSERT_EQ(MS_SOCK_ENOTFOUND, resolve(2, "other.invalid", 80));
    ASSERT_EQ(MS_SOCK_ENOTFOUND, resolve(2, "other.invalid", 80));
    ASSERT_EQ(3, sk()->lookups_started);
    ASSERT(teardown());
}

TEST(resolve_cache_expires_and_holds_at_most_its_size)
{
    setup();
    ms_sock_config_t cfg;
    ms_sock_config_default(&cfg);
    cfg.resolve_ttl = 30;
    cfg.resolve_cache_max = 2;
    ms_sock_config(srv, &cfg);
    ASSERT_EQ(MS_SOCK_DONE, resolve(0, "127.1", 1));
    ASSERT_EQ(MS_SOCK_DONE, start(0, "127.1", 1));
    ASSERT_EQ(1, sk()->lookups_started);
    /* Past its TTL: looked up again. */
    uv_update_time(&loop);
    uint64_t end = uv_now(&loop) + 40;
    while (uv_now(&loop) < end) {
        uv_sleep(5);
        uv_update_time(&loop);
    }
    ASSERT_EQ(MS_SOCK_DONE, resolve(0, "127.1", 1));
    ASSERT_EQ(2, sk()->lookups_started);
    ASSERT_EQ(1, sk()->cache_n);
    /* The oldest goes to make room. */
    ASSERT_EQ(MS_SOCK_DONE, resolve(1, "127.0.1", 1));
    ASSERT_EQ(MS_SOCK_DONE, resolve(2, "2130706433", 1)); /* 127.0.0.1 as one number */
    ASSERT_STR_EQ("127.0.0.1 1", addr_text(&res[2].addrs[0]));
    ASSERT_EQ(4, sk()->lookups_started);
    ASSERT_EQ(2, sk()->cache_n);
    ASSERT_EQ(MS_SOCK_DONE, start(2, "2130706433", 1));
    ASSERT_EQ(MS_SOCK_DONE, start(1, "127.0.1", 1));
    ASSERT_EQ(4, sk()->lookups_started);
    ASSERT_EQ(MS_SOCK_PENDING, start(0, "127.1", 1));
    ASSERT_EQ(MS_SOCK_DONE, await(0, MS_SOCK_PENDING));
    ASSERT_EQ(5, sk()->lookups_started);
    ASSERT_EQ(2, sk()->cache_n);
    /* With no TTL, nothing is kept. */
    cfg.resolve_ttl = 0;
    ms_sock_config(srv, &cfg);
    ASSERT_EQ(MS_SOCK_DONE, resolve(3, "127.0.0.01", 1));
    ASSERT_EQ(MS_SOCK_DONE, resolve(3, "127.0.0.01", 1));
    ASSERT_EQ(7, sk()->lookups_started);
    ASSERT(teardown());
}

TEST(resolve_one_lookup_per_name_capped_and_cancelled)
{
    setup();
    ms_sock_config_t cfg;
    ms_sock_config_default(&cfg);
    cfg.resolve_max = 8; /* kept below the pool's two threads: one */
    ms_sock_config(srv, &cfg);
    ASSERT_EQ(1, sk()->cfg.resolve_max);
    pool_hold();
    ASSERT_EQ(MS_SOCK_PENDING, start(0, "127.1", 1));
    ASSERT_EQ(MS_SOCK_PENDING, start(1, "127.1", 2));
    ASSERT_EQ(MS_SOCK_PENDING, start(2, "127.0.1", 3)); /* queued behind the cap */
    ASSERT_EQ(MS_SOCK_PENDING, start(3, "127.0.1", 4));
    ASSERT_EQ(1, sk()->lookups_started);
    ASSERT_EQ(1, sk()->inflight);
    ASSERT(res[0].lookup == res[1].lookup && res[2].lookup == res[3].lookup);
    ASSERT(sk()->queue_head == res[2].lookup);
    /* Cancelled waiters hear nothing; the others get the answer with their own port. */
    ms_resolve_cancel(&res[1]);
    ms_resolve_cancel(&res[2]);
    ASSERT(res[1].lookup == NULL);
    ms_resolve_cancel(&res[1]); /* twice: nothing */
    pool_release();
    while (done_n[0] == 0 || done_n[3] == 0)
        run_once();
    ASSERT_EQ(MS_SOCK_DONE, done_rc[0]);
    ASSERT_STR_EQ("127.0.0.1 1", addr_text(&res[0].addrs[0]));
    ASSERT_EQ(MS_SOCK_DONE, done_rc[3]);
    ASSERT_STR_EQ("127.0.0.1 4", addr_text(&res[3].addrs[0]));
    ASSERT_EQ(0, done_n[1] + done_n[2]);
    ASSERT_EQ(2, sk()->lookups_started);
    ASSERT_EQ(0, sk()->inflight);
    ASSERT(sk()->lookups == NULL && sk()->queue_head == NULL);
    ASSERT(teardown());
}

TEST(resolve_a_lookup_outlives_the_worker_that_started_it)
{
    setup();
    pool_hold();
    ms_sock_config_t cfg;
    ms_sock_config_default(&cfg);
    cfg.resolve_max = 1;
    ms_sock_config(srv, &cfg);
    ASSERT_EQ(MS_SOCK_PENDING, start(0, "127.1", 1));
    ASSERT_EQ(MS_SOCK_PENDING, start(1, "127.0.1", 1)); /* queued */
    /* The worker goes while one lookup is on the thread pool and one is queued: the queued
     * one is freed now, the running one when it ends, and no one is called. */
    ms_server_free(srv);
    srv = NULL;
    pool_release();
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(0, done_n[0] + done_n[1]);
    ASSERT(teardown());
}

TEST_MAIN()
