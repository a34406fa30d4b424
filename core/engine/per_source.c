/* per_source.c: counting open connections per source (an address; an IPv6 network), and logging
 * refused floods. */
#include "moonserve.h"

#include <netinet/in.h>

#include "engine/engine.h"

/* An open-addressing table: address -> open connections. Rows with a count of zero are
 * removed at once (backward-shift deletion), so a scan never crosses tombstones. */
typedef struct source_row_s {
    uint8_t addr[16];
    uint32_t count;
} source_row_t;

typedef struct ms_sources_s {
    source_row_t *rows;
    uint32_t cap, len; /* cap is a power of two */
} ms_sources_t;

static int empty(const source_row_t *r)
{
    return r->count == 0;
}

static void grow(ms_sources_t *t)
{
    source_row_t *old = t->rows;
    uint32_t old_cap = t->cap;
    t->cap = old_cap ? old_cap * 2 : 256;
    t->rows = ms_mem_alloc(t->cap * sizeof(source_row_t));
    memset(t->rows, 0, t->cap * sizeof(source_row_t));
    for (uint32_t i = 0; i < old_cap; i++) {
        if (empty(&old[i]))
            continue;
        uint32_t j = ms__hash16(old[i].addr) & (t->cap - 1);
        while (!empty(&t->rows[j]))
            j = (j + 1) & (t->cap - 1);
        t->rows[j] = old[i];
    }
    ms_mem_free(old);
}

/* The address as 16 bytes: IPv6 as is, IPv4 mapped (::ffff:a.b.c.d). */
int ms__source_key(const struct sockaddr *sa, uint8_t key[16])
{
    if (sa->sa_family == AF_INET6) {
        memcpy(key, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        return 0;
    }
    if (sa->sa_family == AF_INET) {
        memset(key, 0, 10);
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        return 0;
    }
    return -1;
}

/* What a connection from `src` is counted under: an IPv4 address as it is, an IPv6 one cut
 * to its first `source_ipv6_prefix` bits. One subscriber or host is given a /64 (RFC 6177)
 * and may take any of its 2^64 addresses, so counting /128s would not cap it at all. */
static void source_of(const ms_server_t *s, const uint8_t src[16], uint8_t key[16])
{
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    memcpy(key, src, 16);
    uint32_t bits = s->limits.source_ipv6_prefix;
    if (bits >= 128 || memcmp(src, mapped, 12) == 0)
        return;
    uint32_t full = bits / 8;
    if (bits % 8)
        key[full++] &= (uint8_t)(0xff << (8 - bits % 8));
    memset(key + full, 0, 16 - full);
}

/* Counts a connection from c->source. Returns 0, or MS_EBUSY when the source already has
 * `per_source` open (the connection is then not counted). */
int ms__source_add(ms_server_t *s, ms_conn_t *c)
{
    ms_sources_t *t = s->sources;
    if (t == NULL) {
        t = s->sources = ms_mem_alloc(sizeof(*t));
        memset(t, 0, sizeof(*t));
    }
    if ((t->len + 1) * 2 > t->cap)
        grow(t);
    uint8_t key[16];
    source_of(s, c->source, key);
    uint32_t j = ms__hash16(key) & (t->cap - 1);
    while (!empty(&t->rows[j]) && memcmp(t->rows[j].addr, key, 16) != 0)
        j = (j + 1) & (t->cap - 1);
    source_row_t *r = &t->rows[j];
    if (empty(r)) {
        memcpy(r->addr, key, 16);
        t->len++;
    } else if (r->count >= s->limits.per_source) {
        return MS_EBUSY;
    }
    r->count++;
    c->source_counted = 1;
    return 0;
}

void ms__source_remove(ms_server_t *s, ms_conn_t *c)
{
    ms_sources_t *t = s->sources;
    uint8_t key[16];
    source_of(s, c->source, key); /* the limits do not change while the server lives */
    uint32_t mask = t->cap - 1, j = ms__hash16(key) & mask;
    while (memcmp(t->rows[j].addr, key, 16) != 0)
        j = (j + 1) & mask;
    c->source_counted = 0;
    if (--t->rows[j].count > 0)
        return;
    /* Backward shift: pull later rows of the same run into the hole. */
    t->len--;
    uint32_t hole = j;
    for (uint32_t k = (j + 1) & mask; !empty(&t->rows[k]); k = (k + 1) & mask) {
        uint32_t home = ms__hash16(t->rows[k].addr) & mask;
        /* Move row k if its home is not in (hole, k], cyclically. */
        if (((k - home) & mask) >= ((k - hole) & mask)) {
            t->rows[hole] = t->rows[k];
            t->rows[k].count = 0;
            hole = k;
        }
    }
}

void ms__sources_free(ms_server_t *s)
{
    if (s->sources != NULL) {
        ms_mem_free(s->sources->rows);
        ms_mem_free(s->sources);
        s->sources = NULL;
    }
}

/* Floods are logged as one line a second with counts, not a line per refusal: the log
 * must not become the next thing that overloads the worker. */
void ms__log_refusals(ms_server_t *s)
{
    uint64_t now = uv_now(s->loop);
    if (s->refused_logged_at != 0 && now - s->refused_logged_at < 1000)
        return;
    uint64_t conns = s->stats->refused_conns - s->refused_conns_logged;
    uint64_t busy = s->stats->refused_busy - s->refused_busy_logged;
    uint64_t quiet = s->refused_quiet - s->refused_quiet_logged;
    uint64_t fds = s->refused_fds - s->refused_fds_logged;
    s->refused_logged_at = now;
    s->refused_conns_logged = s->stats->refused_conns;
    s->refused_busy_logged = s->stats->refused_busy;
    s->refused_quiet_logged = s->refused_quiet;
    s->refused_fds_logged = s->refused_fds;
    if (fds) {
        ms_log(MS_LOG_WARN, "refused %llu connections: descriptors nearly exhausted (the "
               "limit is %u; raise it: ulimit -n, or LimitNOFILE= in a systemd unit)",
               (unsigned long long)fds, s->fd_limit);
        conns -= fds < conns ? fds : conns;
    }
    if (quiet)
        ms_log(MS_LOG_WARN, "refused %llu more requests (400, 408, 413, 414, 431: %d a second "
               "are logged with their reason)", (unsigned long long)quiet, MS_REFUSALS_TOLD);
    if (conns)
        ms_log(MS_LOG_WARN, "refused %llu connections (connections or per_source cap)",
               (unsigned long long)conns);
    if (busy)
        ms_log(MS_LOG_WARN, "answered %llu requests 503 (in_flight cap)", (unsigned long long)busy);
}
