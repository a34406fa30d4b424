/* addr.h: addresses, address ranges and listening sockets (base/addr.c). */
#ifndef MS_BASE_ADDR_H
#define MS_BASE_ADDR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "moonserve.h"

/* An address range: 16 bytes (IPv4 mapped) and a prefix length out of 128. */
typedef struct ms_cidr_s {
    uint8_t addr[16];
    uint8_t bits;
} ms_cidr_t;

/* Parses an IPv4 or IPv6 address into 16 bytes (IPv4 mapped). Returns 0 or -1. */
int ms__parse_ip(const char *p, size_t n, uint8_t out[16]);
/* Whether `a` is an IPv4 address (mapped). */
int ms__is_v4(const uint8_t a[16]);
/* The address as text: dotted for IPv4, RFC 5952 for IPv6. */
void ms__format_ip(const uint8_t a[16], char *buf, size_t len);
/* Parses "192.0.2.0/24", "2001:db8::/32" or a single address. Returns 0 or -1. */
int ms__cidr_parse(const char *cidr, ms_cidr_t *c);
/* Whether `a` falls in one of the `n` ranges of `list`. */
int ms__cidr_match(const ms_cidr_t *list, uint32_t n, const uint8_t a[16]);

/* Parses "host:port" ("[v6]:port", ":port" for every IPv4 address, "localhost"). Returns 0
 * or UV_EINVAL. */
int ms__parse_addr(const char *addr, struct sockaddr_storage *ss);

#endif
