/* tickets.c: the keys of TLS session tickets, in a zone the master writes and every worker
 * reads (tickets.h). A rotation is rare and the reads are one per ticket, so a sequence
 * count guards the keys: odd while the maker writes, and a reader that saw it change copies
 * again. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif
#include "process/tickets.h"

#include <openssl/rand.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "moonserve.h"

struct ms_tickets_s {
    uint32_t seq; /* odd while the maker writes */
    uint32_t n;   /* keys made, at most MS_TICKET_KEYS */
    uint64_t made_ms;
    ms_ticket_key_t key[MS_TICKET_KEYS]; /* newest first */
};

#define ZONE_SIZE 4096
_Static_assert(sizeof(ms_tickets_t) <= ZONE_SIZE, "the keys fit a page");

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int ms_tickets_create(ms_tickets_t **out)
{
    int fd = memfd_create("moonserve:tickets", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -errno;
    ms_tickets_t *t = MAP_FAILED;
    if (ftruncate(fd, ZONE_SIZE) == 0)
        t = mmap(NULL, ZONE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    /* Sealed once mapped: this mapping stays writable, any later one may only read. */
    if (t == MAP_FAILED ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) <
            0) {
        int rc = -errno;
        if (t != MAP_FAILED)
            munmap(t, ZONE_SIZE);
        close(fd);
        return rc;
    }
    int rc = ms_tickets_rotate(t);
    if (rc < 0) {
        munmap(t, ZONE_SIZE);
        close(fd);
        return rc;
    }
    *out = t;
    return fd;
}

int ms_tickets_attach(int fd, const ms_tickets_t **out)
{
    void *p = mmap(NULL, ZONE_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return -errno;
    const ms_tickets_t *t = p;
    if (__atomic_load_n(&t->n, __ATOMIC_ACQUIRE) == 0) {
        munmap(p, ZONE_SIZE); /* not a zone of keys */
        return UV_EINVAL;
    }
    *out = t;
    return 0;
}

void ms_tickets_detach(const ms_tickets_t *t)
{
    if (t != NULL)
        munmap((void *)t, ZONE_SIZE);
}

int ms_tickets_rotate(ms_tickets_t *t)
{
    ms_ticket_key_t k;
    if (RAND_bytes((unsigned char *)&k, sizeof(k)) != 1)
        return UV_EIO;
    uint32_t seq = t->seq;
    __atomic_store_n(&t->seq, seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memmove(&t->key[1], &t->key[0], (MS_TICKET_KEYS - 1) * sizeof(k));
    t->key[0] = k;
    if (t->n < MS_TICKET_KEYS)
        t->n++;
    t->made_ms = now_ms();
    __atomic_store_n(&t->seq, seq + 2, __ATOMIC_RELEASE);
    memset(&k, 0, sizeof(k));
    return 0;
}

int ms_tickets_read(const ms_tickets_t *t, ms_ticket_key_t out[MS_TICKET_KEYS])
{
    for (;;) {
        uint32_t seq = __atomic_load_n(&t->seq, __ATOMIC_ACQUIRE);
        if (seq & 1)
            continue; /* a rotation is a few hundred bytes copied: it ends at once */
        uint32_t n = t->n;
        memcpy(out, t->key, sizeof(t->key));
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&t->seq, __ATOMIC_RELAXED) == seq && n >= 1 && n <= MS_TICKET_KEYS)
            return (int)n;
    }
}

uint64_t ms_tickets_made(const ms_tickets_t *t)
{
    return __atomic_load_n(&t->made_ms, __ATOMIC_RELAXED);
}
