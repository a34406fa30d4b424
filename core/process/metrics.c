/* metrics.c: the workers' counters in a shared-memory zone the master makes: a slot per
 * worker, written by its worker with plain increments, read and summed by any. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif
#include "process/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

#define ZONE_MAGIC   0x6d736d6574726963ull /* "msmetric" */
#define ZONE_VERSION 1
#define PAGE         4096

_Static_assert(sizeof(ms_metrics_block_t) <= PAGE, "a slot's block fits its first page");
_Static_assert(sizeof(ms_metrics_block_t) % 8 == 0, "every counter is an aligned word");

static const uint32_t buckets[MS_METRICS_NBUCKETS] = {MS_METRICS_BUCKETS_US};

const uint32_t *ms_metrics_buckets(void)
{
    return buckets;
}

static size_t zone_bytes(const ms_metrics_zone_t *z)
{
    return PAGE + (size_t)(z->nslots * z->slot_size);
}

static void layout(ms_metrics_zone_t *z, int workers, int routes)
{
    z->nslots = (uint64_t)workers * MS_METRICS_GENERATIONS;
    z->routes_max = (uint64_t)routes;
    z->names_off = PAGE;
    z->counts_off = PAGE + MS_METRICS_NAMES_MAX;
    size_t counts = (size_t)(routes + 1) * MS_METRICS_METHODS * MS_METRICS_CLASSES * 8;
    z->slot_size = (z->counts_off + counts + PAGE - 1) & ~(uint64_t)(PAGE - 1);
}

int ms_metrics_create(int workers, int routes)
{
    if (workers < 1 || workers > 1024 || routes < 0 || routes > MS_METRICS_ROUTES_MAX)
        return UV_EINVAL;
    ms_metrics_zone_t hdr = {.magic = ZONE_MAGIC, .version = ZONE_VERSION};
    layout(&hdr, workers, routes);
    size_t size = zone_bytes(&hdr);
    int fd = memfd_create("moonserve:metrics", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -errno;
    /* Sparse: only the pages a worker writes take memory. Sealed, as a dictionary's zone. */
    if (ftruncate(fd, (off_t)size) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 ||
        pwrite(fd, &hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr)) {
        int rc = errno ? -errno : UV_EIO;
        close(fd);
        return rc;
    }
    return fd;
}

ms_metrics_zone_t *ms_metrics_map(int fd)
{
    ms_metrics_zone_t hdr;
    if (pread(fd, &hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr) || hdr.magic != ZONE_MAGIC ||
        hdr.version != ZONE_VERSION || hdr.nslots == 0 || hdr.routes_max > MS_METRICS_ROUTES_MAX)
        return NULL;
    void *base = mmap(NULL, zone_bytes(&hdr), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return base == MAP_FAILED ? NULL : base;
}

ms_metrics_block_t *ms_metrics_slot(ms_metrics_zone_t *z, int i)
{
    return (ms_metrics_block_t *)((char *)z + PAGE + (size_t)i * z->slot_size);
}

uint64_t *ms_metrics_counts(ms_metrics_zone_t *z, int i)
{
    return (uint64_t *)((char *)ms_metrics_slot(z, i) + z->counts_off);
}

void ms_metrics_forsake(ms_metrics_zone_t *z, int i)
{
    ms_metrics_block_t *b = ms_metrics_slot(z, i);
    b->stats.conns = b->stats.in_flight = 0;
    memset(b->conns_proto, 0, sizeof(b->conns_proto));
    b->pool_idle = b->lua_bytes = 0;
    b->pid = 0;
}

/* -- Counting ------------------------------------------------------------------------------ */

int ms_server_metrics(ms_server_t *s, ms_metrics_zone_t *z, int slot)
{
    if (z == NULL || slot < 0 || (uint64_t)slot >= z->nslots || s->mzone != NULL)
        return UV_EINVAL;
    ms_metrics_block_t *b = ms_metrics_slot(z, slot), *own = s->m;
    /* Counters go on from what the slot's earlier writers left (so a sum across workers
     * never falls at a reload); gauges are this worker's. */
    const uint64_t *from = (const uint64_t *)own;
    uint64_t *to = (uint64_t *)b;
    for (size_t k = 0; k < sizeof(*b) / 8; k++)
        to[k] += from[k];
    b->stats.conns = own->stats.conns;
    b->stats.in_flight = own->stats.in_flight;
    memcpy(b->conns_proto, own->conns_proto, sizeof(b->conns_proto));
    b->pool_idle = own->pool_idle;
    b->lua_bytes = own->lua_bytes;
    b->pid = (uint64_t)getpid();
    b->nroutes = b->names_len = 0; /* until Lua writes this worker's names */
    s->mzone = z;
    s->m = b;
    s->stats = &b->stats;
    s->route_counts = ms_metrics_counts(z, slot);
    s->routes_max = (uint32_t)z->routes_max;
    s->metrics_on = 1;
    return 0;
}

ms_metrics_zone_t *ms_server_metrics_zone(ms_server_t *s)
{
    return s->mzone;
}

static int method_index(const ms_str_t *m)
{
    const char *p = m->base;
    switch (m->len) {
    case 3: return memcmp(p, "GET", 3) == 0 ? 0 : memcmp(p, "PUT", 3) == 0 ? 3 : 7;
    case 4: return memcmp(p, "HEAD", 4) == 0 ? 1 : memcmp(p, "POST", 4) == 0 ? 2 : 7;
    case 5: return memcmp(p, "PATCH", 5) == 0 ? 5 : 7;
    case 6: return memcmp(p, "DELETE", 6) == 0 ? 4 : 7;
    case 7: return memcmp(p, "OPTIONS", 7) == 0 ? 6 : 7;
    default: return 7;
    }
}

static int refusal_index(int status)
{
    switch (status) {
    case 400: return 0;
    case 405: return 1;
    case 408: return 2;
    case 413: return 3;
    case 414: return 4;
    case 417: return 5;
    case 431: return 6;
    case 501: return 7;
    case 505: return 8;
    default: return 9;
    }
}

void ms__metrics_refused(ms_server_t *s, int status)
{
    s->m->refused[refusal_index(status)]++;
}

void ms__metrics_req(ms_req_t *r)
{
    ms_server_t *s = r->conn->server;
    ms_metrics_block_t *b = s->m;
    if (r->counted)
        return;
    r->counted = 1;
    int status = r->refused ? r->refused : r->v.status;
    int cls = status >= 100 && status < 600 ? status / 100 - 1 : 4;
    uint32_t route = r->route_ix <= s->routes_max ? r->route_ix : 0;
    s->route_counts[((size_t)route * MS_METRICS_METHODS + (size_t)method_index(&r->v.method)) *
                        MS_METRICS_CLASSES +
                    (size_t)cls]++;
    b->bytes_in += (r->head.len ? r->head.len : r->head_in) + r->body_seen;
    b->bytes_out += r->bytes_out;
    uint64_t us = r->t0 ? (uv_hrtime() - r->t0) / 1000 : 0;
    int k = 0;
    while (k < MS_METRICS_NBUCKETS && us > buckets[k])
        k++;
    b->latency[k]++;
    b->latency_sum_us += us;
}

/* The protocol a connection is counted under: 0 none, 1 HTTP/1.1, 2 HTTP/2. */
void ms__metrics_proto(ms_conn_t *c, const ms_proto_t *to)
{
    ms_metrics_block_t *b = c->server->m;
    if (c->mproto)
        b->conns_proto[c->mproto - 1]--;
    c->mproto = to == &ms__h1_proto ? 1 : to == &ms__h2_proto ? 2 : 0;
    if (c->mproto)
        b->conns_proto[c->mproto - 1]++;
}
