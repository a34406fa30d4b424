/* sockets.h: a worker's sockets state, shared by sock.c, resolve.c and udp.c (ms__ prefix). */
#ifndef MS_SOCKETS_H
#define MS_SOCKETS_H

#include "engine/engine.h"
#include "client/sock.h"

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
    struct ssl_ctx_st *tls_ctx; /* tls_client.c: the client context, made at first use */
    uint32_t trust_gen;         /* tls_client.c: counts ms_sock_tls_trust calls */
};

/* The worker's sockets state, made at first use. */
ms_sockets_t *ms__sockets(ms_server_t *srv);
void ms__resolver_free(ms_sockets_t *sk);

/* tls_client.c: one connection's TLS state, which does no I/O: sock.c gives it the ciphertext
 * read (into ms__stls_in_space) and sends what it leaves in ms__stls_out. */
typedef struct ms_stls_s ms_stls_t;
typedef struct ms_stls_cert_s ms_stls_cert_t;
/* NULL with *err set (MS_SOCK_ESSL, UV_EINVAL). */
ms_stls_t *ms__stls_new(ms_sockets_t *sk, const ms_sock_tls_opts_t *o, const ms_stls_cert_t *cert,
                        int *err);
void ms__stls_free(ms_stls_t *t);
/* MS_SOCK_DONE, MS_SOCK_PENDING (wants bytes), or MS_SOCK_ESSL, EHOST, EVERIFY. */
int ms__stls_handshake(ms_stls_t *t);
int ms__stls_done(const ms_stls_t *t);
/* 1 when `t` was set up for the same wishes (name, verify, trusted CAs, client certificate). */
int ms__stls_same(const ms_stls_t *t, const ms_sockets_t *sk, const ms_sock_tls_opts_t *o,
                  const ms_stls_cert_t *cert);
int ms__stls_verr(const ms_stls_t *t);
const char *ms__stls_verify_text(int verr);
char *ms__stls_in_space(ms_stls_t *t, size_t *len);
void ms__stls_in_added(ms_stls_t *t, size_t n);
size_t ms__stls_in_pending(const ms_stls_t *t);
/* Plaintext: > 0 bytes, 0 when it needs more ciphertext, UV_EOF (close_notify), UV_EPROTO. */
ssize_t ms__stls_read(ms_stls_t *t, char *p, size_t n);
int ms__stls_write(ms_stls_t *t, const char *p, size_t n);
ms_buf_t *ms__stls_out(ms_stls_t *t);
void ms__stls_shutdown(ms_stls_t *t); /* close_notify into out, once the handshake is done */
void ms__stls_idle(ms_stls_t *t);     /* lets go of empty buffers */
ms_tls_session_t *ms__stls_session(ms_stls_t *t);
int ms__stls_info(const ms_stls_t *t, const char **version, const char **cipher);
ms_stls_cert_t *ms__stls_cert_new(const char *cert, size_t cert_len, const char *key,
                                  size_t key_len, char *err, size_t errlen);
void ms__stls_cert_free(ms_stls_cert_t *c);
void ms__stls_ctx_free(ms_sockets_t *sk);

#endif
