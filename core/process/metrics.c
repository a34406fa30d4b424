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

#include "base/util.h"

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
