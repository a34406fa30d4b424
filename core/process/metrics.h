/* metrics.h: the workers' counters in a shared-memory zone, one slot per worker, read by
 * whichever worker answers a scrape. docs/metrics.md describes the zone and the series. */
#ifndef MS_METRICS_H
#define MS_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "moonserve.h"

#define MS_METRICS_API __attribute__((visibility("default")))

/* The latency buckets' upper bounds, in microseconds; a last bucket holds the rest (+Inf). */
#define MS_METRICS_BUCKETS_US                                                                      \
    500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000, 2500000,          \
        5000000, 10000000
#define MS_METRICS_NBUCKETS 14
/* Methods counted by name (GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS), then the rest. */
#define MS_METRICS_METHODS 8
/* Status classes 1xx to 5xx. */
#define MS_METRICS_CLASSES 5
/* Statuses the core refuses requests with by itself (a cap or a malformed request), then
 * the rest: 400 405 408 413 414 417 431 501 505. */
#define MS_METRICS_REFUSALS 10
/* Slots per worker: a worker being replaced (a reload) drains in one while its successor
 * serves in another, so each slot has one writer. */
#define MS_METRICS_GENERATIONS 4
/* The bytes a slot keeps for its route names ("\n" after each). */
#define MS_METRICS_NAMES_MAX ((size_t)1 << 20)
#define MS_METRICS_ROUTES_MAX 100000

/* One worker's counters. Each is written by its worker alone (plain increments: no lock, no
 * atomic) and read by any; an aligned 64-bit word is read whole on the platforms we run on. */
typedef struct ms_metrics_block_s {
    ms_server_stats_t stats;    /* the server's own counters, kept here */
    uint64_t pid;               /* the process that writes the slot; 0: none now */
    uint64_t conns_proto[3];    /* open now: HTTP/1.1, HTTP/2, TLS (beside one of the two) */
    uint64_t bytes_in;          /* request heads and bodies */
    uint64_t bytes_out;         /* reply bodies */
    uint64_t refused[MS_METRICS_REFUSALS];
    uint64_t static_hits, static_misses; /* the static file cache */
    uint64_t pool_idle;         /* outbound connections idle in the socket pools now */
    uint64_t lua_bytes;         /* the Lua heap, as its worker last wrote it (once a second) */
    uint64_t latency[MS_METRICS_NBUCKETS + 1]; /* requests by bucket (not cumulative) */
    uint64_t latency_sum_us;
    uint64_t nroutes;   /* route names written below (Lua writes them at start) */
    uint64_t names_len; /* their bytes */
} ms_metrics_block_t;

/* The zone's first page. Every offset is from the zone's start. */
typedef struct ms_metrics_zone_s {
    uint64_t magic, version;
    uint64_t nslots;     /* workers * MS_METRICS_GENERATIONS */
    uint64_t routes_max; /* per slot: route 0 is "no route", 1..routes_max the app's */
    uint64_t slot_size;  /* bytes */
    uint64_t names_off;  /* within a slot: the route names */
    uint64_t counts_off; /* within a slot: (routes_max + 1) * METHODS * CLASSES counters */
} ms_metrics_zone_t;

/* Makes a zone for `workers` workers and `routes` routes each, in a sealed memfd. Returns
 * the fd or a negative code (UV_EINVAL, -errno). */
MS_METRICS_API int ms_metrics_create(int workers, int routes);
/* Maps the zone of `fd` (the fd stays the caller's). Returns the zone or NULL. */
MS_METRICS_API ms_metrics_zone_t *ms_metrics_map(int fd);
/* Slot `i`'s block, and the counters of its routes. */
MS_METRICS_API ms_metrics_block_t *ms_metrics_slot(ms_metrics_zone_t *z, int i);
MS_METRICS_API uint64_t *ms_metrics_counts(ms_metrics_zone_t *z, int i);
/* The master, when the writer of slot `i` has exited: its gauges go to 0 (it has no
 * connections any more), its counters stay, for the next writer of the slot to go on from. */
MS_METRICS_API void ms_metrics_forsake(ms_metrics_zone_t *z, int i);
/* The latency buckets' bounds in microseconds: MS_METRICS_NBUCKETS of them. */
MS_METRICS_API const uint32_t *ms_metrics_buckets(void);

/* The server counts into slot `slot` of the zone `z` (mapped by ms_metrics_map) from now
 * on: what it counted so far is added there. Returns 0 or UV_EINVAL. */
MS_METRICS_API int ms_server_metrics(ms_server_t *s, ms_metrics_zone_t *z, int slot);
/* The zone `s` counts into, or NULL. */
MS_METRICS_API ms_metrics_zone_t *ms_server_metrics_zone(ms_server_t *s);

#endif
