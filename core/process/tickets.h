/* tickets.h: the keys of TLS session tickets. The master makes them in a zone of its own and
 * hands that zone to every worker over the channel (channel.h), so that a ticket one worker
 * issued resumes on any other, and after a reload: the master and its keys outlive the
 * workers. It makes a new key every `rotate` seconds; the two before it still decrypt. */
#ifndef MS_TICKETS_H
#define MS_TICKETS_H

#include <stddef.h>
#include <stdint.h>

#define MS_TICKET_KEYS 3 /* the key that encrypts, and the two before it */

typedef struct ms_ticket_key_s {
    unsigned char name[16]; /* sent in the clear in each ticket: which key made it */
    unsigned char aes[32];  /* AES-256-CBC */
    unsigned char hmac[32]; /* HMAC-SHA256 */
} ms_ticket_key_t;

typedef struct ms_tickets_s ms_tickets_t;

/* Makes a zone with one new key: its descriptor (sealed: no other process can map it for
 * writing, nor change its size) and the maker's mapping in `*out`. Returns the descriptor or
 * a negative code. */
int ms_tickets_create(ms_tickets_t **out);
/* Maps the zone behind `fd` for reading. Returns 0 or a negative code. */
int ms_tickets_attach(int fd, const ms_tickets_t **out);
void ms_tickets_detach(const ms_tickets_t *t);
/* The maker's: a new key first, the oldest beyond MS_TICKET_KEYS dropped. 0 or a negative
 * code (no randomness). */
int ms_tickets_rotate(ms_tickets_t *t);
/* Copies the keys, newest first, into `out`; returns how many (1 to MS_TICKET_KEYS). A copy
 * made while the maker rotates is taken again. */
int ms_tickets_read(const ms_tickets_t *t, ms_ticket_key_t out[MS_TICKET_KEYS]);
/* When the newest key was made, in ms of the monotonic clock. */
uint64_t ms_tickets_made(const ms_tickets_t *t);

#endif
