/* tickets_test.c: the zone of TLS session ticket keys: a new key first and two kept, what a
 * worker's mapping sees, and that no other process may write it. */
#define _GNU_SOURCE /* memfd_create, before any header */
#include "test.h"

#include "../../../core/process/tickets.c"

TEST(tickets_rotate_keeps_the_two_keys_before_the_newest)
{
    ms_tickets_t *t;
    int fd = ms_tickets_create(&t);
    ASSERT(fd >= 0);
    const ms_tickets_t *seen;
    ASSERT_EQ(0, ms_tickets_attach(fd, &seen));
    ms_ticket_key_t k[MS_TICKET_KEYS], first;
    ASSERT_EQ(1, ms_tickets_read(seen, k));
    first = k[0];
    ASSERT_EQ(0, ms_tickets_rotate(t));
    ASSERT_EQ(2, ms_tickets_read(seen, k)); /* the worker's mapping sees the master's key */
    ASSERT(memcmp(&k[1], &first, sizeof(first)) == 0);
    ASSERT(memcmp(k[0].name, first.name, sizeof(first.name)) != 0);
    ASSERT_EQ(0, ms_tickets_rotate(t));
    ASSERT_EQ(3, ms_tickets_read(seen, k));
    ASSERT(memcmp(&k[2], &first, sizeof(first)) == 0);
    ASSERT_EQ(0, ms_tickets_rotate(t));
    ASSERT_EQ(3, ms_tickets_read(seen, k));
    for (int i = 0; i < MS_TICKET_KEYS; i++)
        ASSERT(memcmp(k[i].name, first.name, sizeof(first.name)) != 0);
    ms_tickets_detach(seen);
    ms_tickets_detach(t);
    close(fd);
}

TEST(tickets_zone_cannot_be_mapped_for_writing)
{
    ms_tickets_t *t;
    int fd = ms_tickets_create(&t);
    ASSERT(fd >= 0);
    void *p = mmap(NULL, ZONE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT(p == MAP_FAILED);
    ASSERT_EQ(EPERM, errno);
    ASSERT(ftruncate(fd, 0) < 0);
    char zero[16] = {0};
    ASSERT(pwrite(fd, zero, sizeof(zero), 0) < 0);
    ms_tickets_detach(t);
    close(fd);
}

TEST(tickets_attach_refuses_a_zone_without_keys)
{
    int fd = memfd_create("not-keys", MFD_CLOEXEC);
    ASSERT(fd >= 0 && ftruncate(fd, ZONE_SIZE) == 0);
    const ms_tickets_t *t;
    ASSERT_EQ(UV_EINVAL, ms_tickets_attach(fd, &t));
    close(fd);
}

TEST_MAIN()
