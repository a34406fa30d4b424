/* counting.c: what a worker counts into its metrics block (its own, or its slot in the
 * zone the master made, process/metrics.c): requests by route, status and latency,
 * refusals, and connections by protocol. */
#include <unistd.h>

#include "engine/engine.h"

/* The latency buckets' bounds (process/metrics.h), here as well for the loop below. */
static const uint32_t buckets[MS_METRICS_NBUCKETS] = {MS_METRICS_BUCKETS_US};

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
    c->mproto = to->counted_as;
    if (c->mproto)
        b->conns_proto[c->mproto - 1]++;
}
