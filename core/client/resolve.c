/* resolve.c: name resolution off the loop (uv_getaddrinfo), capped and cached per worker. */
#include "client/sock.h"

#include <arpa/inet.h>
#include <netdb.h>

#include "client/sockets.h"

/* One getaddrinfo for a name, however many wait for it. */
struct ms_lookup_s {
    uv_getaddrinfo_t req;
    ms_sockets_t *sk; /* NULL once the worker has gone: the callback only frees it */
    ms_lookup_t *next;  /* in sk->lookups */
    ms_lookup_t *qnext; /* in the queue, until started */
    ms_resolve_t *waiters;
    uint32_t hash;
    uint16_t len;
    char name[MS_HOST_MAX + 1];
};

static uint32_t name_hash(const char *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)ms__lower((unsigned char)p[i])) * 16777619u;
    return h;
}

static int name_eq(const char *a, const char *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ms__lower((unsigned char)a[i]) != ms__lower((unsigned char)b[i]))
            return 0;
    return 1;
}

static void set_port(ms_addr_t *a, uint16_t port)
{
    if (a->sa.sa_family == AF_INET6)
        a->in6.sin6_port = htons(port);
    else
        a->in.sin_port = htons(port);
}

static void answer(ms_resolve_t *r, const ms_addr_t *addrs, int n)
{
    r->naddrs = n;
    for (int i = 0; i < n; i++) {
        r->addrs[i] = addrs[i];
        set_port(&r->addrs[i], r->port);
    }
}

/* An IPv4 or IPv6 literal ("[::1]" too) needs no lookup. */
static int literal(ms_resolve_t *r)
{
    char tmp[MS_HOST_MAX + 1];
    const char *p = r->name;
    size_t n = strlen(p);
    ms_addr_t *a = &r->addrs[0];
    memset(a, 0, sizeof(*a));
    if (uv_inet_pton(AF_INET, p, &a->in.sin_addr) == 0) {
        a->in.sin_family = AF_INET;
    } else {
        if (n >= 2 && p[0] == '[' && p[n - 1] == ']') {
            memcpy(tmp, p + 1, n - 2);
            tmp[n - 2] = 0;
            p = tmp;
        }
        if (uv_inet_pton(AF_INET6, p, &a->in6.sin6_addr) != 0)
            return 0;
        a->in6.sin6_family = AF_INET6;
    }
    r->naddrs = 1;
    set_port(a, r->port);
    return 1;
}

/* -- The cache --------------------------------------------------------------------------- */

static void cache_remove(ms_sockets_t *sk, ms_rcache_t *e)
{
    ms_rcache_t **pp = &sk->cache[e->hash % MS_RESOLVE_CACHE_BUCKETS];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    if (e->older)
        e->older->newer = e->newer;
    else
        sk->cache_oldest = e->newer;
    if (e->newer)
        e->newer->older = e->older;
    else
        sk->cache_newest = e->older;
    sk->cache_n--;
    ms_mem_free(e);
}

static ms_rcache_t *cache_find(ms_sockets_t *sk, const char *name, size_t n, uint32_t h)
{
    for (ms_rcache_t *e = sk->cache[h % MS_RESOLVE_CACHE_BUCKETS]; e != NULL; e = e->hnext)
        if (e->hash == h && e->len == n && name_eq(e->name, name, n))
            return e;
    return NULL;
}

static void cache_put(ms_sockets_t *sk, ms_lookup_t *l, int status, const ms_addr_t *addrs,
                      int n)
{
    uint32_t ttl = status < 0 ? sk->cfg.resolve_negative_ttl : sk->cfg.resolve_ttl;
    if (ttl == 0 || sk->cfg.resolve_cache_max == 0)
        return;
    ms_rcache_t *e = cache_find(sk, l->name, l->len, l->hash);
    if (e != NULL)
        cache_remove(sk, e);
    while (sk->cache_n >= sk->cfg.resolve_cache_max)
        cache_remove(sk, sk->cache_oldest);
    e = ms_mem_alloc(sizeof(*e) + l->len);
    memset(e, 0, sizeof(*e));
    e->expires = uv_now(sk->server->loop) + ttl;
    e->status = status;
    e->naddrs = n;
    if (n > 0)
        memcpy(e->addrs, addrs, (size_t)n * sizeof(*addrs));
    e->hash = l->hash;
    e->len = l->len;
    memcpy(e->name, l->name, l->len);
    ms_rcache_t **b = &sk->cache[e->hash % MS_RESOLVE_CACHE_BUCKETS];
    e->hnext = *b;
    *b = e;
    e->older = sk->cache_newest;
    if (sk->cache_newest)
        sk->cache_newest->newer = e;
    else
        sk->cache_oldest = e;
    sk->cache_newest = e;
    sk->cache_n++;
}

/* -- Lookups ----------------------------------------------------------------------------- */

static int lookup_start(ms_sockets_t *sk, ms_lookup_t *l);

static int gai_status(int status)
{
    switch (status) {
    case 0: return 0;
    case UV_EAI_NONAME:
    case UV_EAI_NODATA:
    case UV_EAI_FAMILY:
    case UV_EAI_ADDRFAMILY: return MS_SOCK_ENOTFOUND;
    default: return MS_SOCK_ERESOLVE;
    }
}

static void lookup_unlink(ms_sockets_t *sk, ms_lookup_t *l)
{
    ms_lookup_t **pp = &sk->lookups;
    while (*pp != l)
        pp = &(*pp)->next;
    *pp = l->next;
}

static void lookup_finish(ms_sockets_t *sk, ms_lookup_t *l, int rc, const ms_addr_t *addrs,
                          int n)
{
    sk->inflight--;
    lookup_unlink(sk, l);
    cache_put(sk, l, rc, addrs, n);
    while (sk->inflight < sk->cfg.resolve_max && sk->queue_head != NULL) {
        ms_lookup_t *q = sk->queue_head;
        sk->queue_head = q->qnext;
        if (sk->queue_head == NULL)
            sk->queue_tail = NULL;
        int qrc = lookup_start(sk, q);
        if (qrc < 0)
            lookup_finish(sk, q, MS_SOCK_ERESOLVE, NULL, 0);
    }
    /* One waiter at a time: a callback may cancel another waiter of this lookup. */
    ms_resolve_t *w;
    while ((w = l->waiters) != NULL) {
        l->waiters = w->next;
        w->next = NULL;
        w->lookup = NULL;
        if (rc == 0)
            answer(w, addrs, n);
        w->cb(w, rc == 0 ? MS_SOCK_DONE : rc);
    }
    ms_mem_free(l);
}

static void on_gai(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    ms_lookup_t *l = container_of(req, ms_lookup_t, req);
    ms_sockets_t *sk = l->sk;
    if (sk == NULL) {
        uv_freeaddrinfo(res);
        ms_mem_free(l);
        return;
    }
    ms_addr_t addrs[MS_RESOLVE_ADDRS];
    int n = 0;
    for (struct addrinfo *ai = status == 0 ? res : NULL; ai && n < MS_RESOLVE_ADDRS;
         ai = ai->ai_next) {
        size_t alen = ai->ai_family == AF_INET    ? sizeof(struct sockaddr_in)
                      : ai->ai_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                  : 0;
        if (alen == 0 || ai->ai_addrlen < alen)
            continue;
        ms_addr_t a;
        memset(&a, 0, sizeof(a));
        memcpy(&a, ai->ai_addr, alen);
        int dup = 0;
        for (int i = 0; i < n && !dup; i++)
            dup = memcmp(&addrs[i], &a, sizeof(a)) == 0;
        if (!dup)
            addrs[n++] = a;
    }
    uv_freeaddrinfo(res);
    int rc = gai_status(status);
    if (rc == 0 && n == 0)
        rc = MS_SOCK_ENOTFOUND;
    ms_server_t *srv = sk->server;
    ms__server_enter(srv);
    lookup_finish(sk, l, rc, addrs, n);
    ms__server_leave(srv);
}

static int lookup_start(ms_sockets_t *sk, ms_lookup_t *l)
{
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM; /* one answer per address, not one per socket type */
    sk->inflight++;
    sk->lookups_started++;
    return uv_getaddrinfo(sk->server->loop, &l->req, on_gai, l->name, NULL, &hints);
}

int ms_resolve(ms_server_t *srv, ms_resolve_t *r, const char *name, size_t len, int port,
               ms_resolve_cb cb)
{
    if (len == 0 || len > MS_HOST_MAX || memchr(name, 0, len) != NULL)
        return UV_EINVAL;
    if (r->name != name)
        memmove(r->name, name, len);
    r->name[len] = 0;
    r->port = (uint16_t)port;
    r->cb = cb;
    r->lookup = NULL;
    r->next = NULL;
    r->naddrs = 0;
    if (literal(r))
        return MS_SOCK_DONE;

    ms_sockets_t *sk = ms__sockets(srv);
    uint32_t h = name_hash(name, len);
    ms_rcache_t *e = cache_find(sk, r->name, len, h);
    if (e != NULL) {
        if (e->expires > uv_now(srv->loop)) {
            if (e->status < 0)
                return e->status;
            answer(r, e->addrs, e->naddrs);
            return MS_SOCK_DONE;
        }
        cache_remove(sk, e);
    }
    ms_lookup_t *l;
    for (l = sk->lookups; l != NULL; l = l->next)
        if (l->hash == h && l->len == len && name_eq(l->name, r->name, len))
            break;
    if (l == NULL) {
        l = ms_mem_alloc(sizeof(*l));
        memset(l, 0, sizeof(*l));
        l->sk = sk;
        l->hash = h;
        l->len = (uint16_t)len;
        memcpy(l->name, r->name, len + 1);
        l->next = sk->lookups;
        sk->lookups = l;
        r->lookup = l;
        l->waiters = r;
        if (sk->inflight < sk->cfg.resolve_max) {
            if (lookup_start(sk, l) < 0) {
                sk->inflight--;
                lookup_unlink(sk, l);
                ms_mem_free(l);
                r->lookup = NULL;
                return MS_SOCK_ERESOLVE;
            }
        } else {
            if (sk->queue_tail)
                sk->queue_tail->qnext = l;
            else
                sk->queue_head = l;
            sk->queue_tail = l;
        }
        return MS_SOCK_PENDING;
    }
    r->lookup = l;
    r->next = l->waiters;
    l->waiters = r;
    return MS_SOCK_PENDING;
}

void ms_resolve_cancel(ms_resolve_t *r)
{
    ms_lookup_t *l = r->lookup;
    if (l == NULL)
        return;
    ms_resolve_t **pp = &l->waiters;
    while (*pp != r)
        pp = &(*pp)->next;
    *pp = r->next;
    r->next = NULL;
    r->lookup = NULL;
}

void ms__resolver_free(ms_sockets_t *sk)
{
    while (sk->cache_oldest != NULL)
        cache_remove(sk, sk->cache_oldest);
    for (ms_lookup_t *q = sk->queue_head, *next; q != NULL; q = next) {
        next = q->qnext;
        lookup_unlink(sk, q);
        ms_mem_free(q);
    }
    sk->queue_head = sk->queue_tail = NULL;
    /* Lookups on the thread pool cannot be taken back: each frees itself when it ends. */
    for (ms_lookup_t *l = sk->lookups; l != NULL; l = l->next)
        l->sk = NULL;
    sk->lookups = NULL;
}
