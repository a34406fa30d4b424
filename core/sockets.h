/* sockets.h: a worker's sockets state, shared by sock.c, resolve.c and udp.c (ms__ prefix). */
#ifndef MS_SOCKETS_H
#define MS_SOCKETS_H

#include "internal.h"
#include "sock.h"

#define MS_SOCK_POOL_BUCKETS    64
#define MS_RESOLVE_CACHE_BUCKETS 256

typedef struct ms_sconn_s ms_sconn_t;
typedef struct ms_sockets_s ms_sockets_t;
typedef struct ms_lookup_s ms_lookup_t;
typedef struct ms_rcache_s ms_rcache_t;

/* A pool of connections to one place, by key ("host:port", the "unix:" path, or a name). */
typedef struct ms_spool_s ms_spool_t;
struct ms_spool_s {
    ms_spool_t *hnext;
    ms_sconn_t *newest, *oldest; /* idle connections, the newest taken first */
    uint32_t nidle;
    uint32_t active; /* connections of this pool open or opening (idle ones included) */
    uint32_t size;   /* idle ones kept; with a backlog, also the cap on `active` */
    uint32_t backlog, nwait;
    uint8_t size_set; /* sized by connect or setkeepalive, not by the default */
    struct ms_sock_s *wait_head, *wait_tail; /* connects waiting for a slot */
    uint16_t keylen;
    char key[];
};

/* A name in the resolver's cache: an answer or a failure, until `expires`. */
struct ms_rcache_s {
    ms_rcache_t *hnext;
    ms_rcache_t *older, *newer; /* insertion order, for eviction */
    uint64_t expires;           /* loop ms */
    int status;                 /* 0 or a negative code */
    int naddrs;
    ms_addr_t addrs[MS_RESOLVE_ADDRS];
    uint32_t hash;
    uint16_t len;
    char name[];
};

struct ms_sockets_s {
    ms_server_t *server;
    ms_sock_config_t cfg;
    ms_spool_t *pools[MS_SOCK_POOL_BUCKETS];
    ms_recycle_t sock_free, buf_free;
    uint32_t socks, sconns; /* made and not freed: what tests check for leaks */
    char scratch[64];       /* where an idle pooled connection reads (and drops) to */
    /* the resolver */
    ms_rcache_t *cache[MS_RESOLVE_CACHE_BUCKETS];
    ms_rcache_t *cache_oldest, *cache_newest;
    uint32_t cache_n;
    ms_lookup_t *lookups;               /* in flight or queued, by name */
    ms_lookup_t *queue_head, *queue_tail; /* not yet started */
    uint32_t inflight;
    uint64_t lookups_started; /* getaddrinfo calls made: tests count them */
};

/* The worker's sockets state, made at first use. */
ms_sockets_t *ms__sockets(ms_server_t *srv);
void ms__resolver_free(ms_sockets_t *sk);

#endif
