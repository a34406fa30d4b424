/* proxy_protocol.c: who the client is behind proxies: trusted address ranges, X-Forwarded-For, and
 * the PROXY protocol (v1 text, v2 binary) on listeners that ask for it. */
#include "moonserve.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

/* -- Addresses ---------------------------------------------------------------------------- */

/* Parses an IPv4 or IPv6 address into 16 bytes (IPv4 mapped). Returns 0 or -1. */
static int parse_ip(const char *p, size_t n, uint8_t out[16])
{
    char tmp[INET6_ADDRSTRLEN + 1];
    if (n == 0 || n >= sizeof(tmp))
        return -1;
    memcpy(tmp, p, n);
    tmp[n] = 0;
    if (inet_pton(AF_INET6, tmp, out) == 1)
        return 0;
    uint8_t v4[4];
    if (inet_pton(AF_INET, tmp, v4) != 1)
        return -1;
    memset(out, 0, 10);
    out[10] = out[11] = 0xff;
    memcpy(out + 12, v4, 4);
    return 0;
}

static int is_v4(const uint8_t a[16])
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(a, prefix, 12) == 0;
}

void ms__format_ip(const uint8_t a[16], char *buf, size_t len)
{
    if (is_v4(a))
        inet_ntop(AF_INET, a + 12, buf, (socklen_t)len);
    else
        inet_ntop(AF_INET6, a, buf, (socklen_t)len);
}

int ms_server_trust(ms_server_t *s, const char *cidr)
{
    const char *slash = strchr(cidr, '/');
    size_t n = slash ? (size_t)(slash - cidr) : strlen(cidr);
    ms_cidr_t c;
    if (parse_ip(cidr, n, c.addr) < 0)
        return UV_EINVAL;
    int max = is_v4(c.addr) ? 32 : 128;
    long bits = max;
    if (slash != NULL) {
        char *end;
        bits = strtol(slash + 1, &end, 10);
        if (*end != 0 || end == slash + 1 || bits < 0 || bits > max)
            return UV_EINVAL;
    }
    c.bits = (uint8_t)(bits + (max == 32 ? 96 : 0));
    s->trusted = ms_mem_realloc(s->trusted, (s->ntrusted + 1) * sizeof(ms_cidr_t));
    s->trusted[s->ntrusted++] = c;
    return 0;
}

int ms__trusted(const ms_server_t *s, const uint8_t a[16])
{
    for (uint32_t i = 0; i < s->ntrusted; i++) {
        const ms_cidr_t *c = &s->trusted[i];
        int full = c->bits / 8, rest = c->bits % 8;
        if (memcmp(a, c->addr, (size_t)full) != 0)
            continue;
        if (rest == 0 || ((a[full] ^ c->addr[full]) & (0xff << (8 - rest))) == 0)
            return 1;
    }
    return 0;
}

/* -- X-Forwarded-For ---------------------------------------------------------------------- */

/* Walks one X-Forwarded-For value from the right. Returns 1 and sets `out` when it found an
 * untrusted (so: the client's) address, 0 when every entry was trusted (`out` is the
 * leftmost), -1 on an entry that is not an address (`out` untouched). */
static int walk_xff(const ms_server_t *s, const ms_str_t *v, uint8_t out[16])
{
    const char *p = v->base, *end = v->base + v->len;
    while (end > p) {
        const char *comma = end;
        while (comma > p && comma[-1] != ',')
            comma--;
        const char *a = comma, *b = end;
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
            b--;
        uint8_t ip[16];
        if (parse_ip(a, (size_t)(b - a), ip) < 0)
            return -1;
        memcpy(out, ip, 16);
        if (!ms__trusted(s, ip))
            return 1;
        end = comma > p ? comma - 1 : p;
    }
    return 0;
}

int ms_req_peer_trusted(ms_req_t *r)
{
    ms_conn_t *c = r->conn;
    return c->source_known && ms__trusted(c->server, c->source);
}

int ms_req_client_ip(ms_req_t *r, char *buf, size_t len)
{
    ms_conn_t *c = r->conn;
    ms_server_t *s = c->server;
    buf[0] = 0;
    if (!c->source_known) {
        ms_conn_peer(c, buf, len);
        return (int)strlen(buf);
    }
    uint8_t client[16];
    memcpy(client, c->source, 16);
    /* Only a trusted peer may say who it forwards for; its list is read from the right, the
     * last hop first, through trusted addresses only. Repeated fields count in order. */
    if (ms__trusted(s, client)) {
        for (int i = r->v.nheaders - 1; i >= 0; i--) {
            const ms_header_t *h = &r->headers[i];
            if (h->name.len != 15 || !ms__ieq(h->name.base, "x-forwarded-for", 15))
                continue;
            if (walk_xff(s, &h->value, client) != 0)
                break;
        }
    }
    ms__format_ip(client, buf, len);
    return (int)strlen(buf);
}

/* -- PROXY protocol ----------------------------------------------------------------------- */

static const uint8_t v2_sig[12] = {0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d,
                                   0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a};

/* What we take after a v2 header's 16 bytes: the addresses (36 bytes at most) and TLVs. The
 * format allows 65535; a proxy of ours sends nowhere near that, and a longer claim is refused
 * whether it comes in one read or in many. */
#define V2_LEN_MAX 512
/* A v1 line, "PROXY" to CRLF, is 107 bytes at most (the spec's worst case, TCP6). */
#define V1_LINE_MAX 107

/* Parses a PROXY header at the start of `p`. Returns the bytes it takes, 0 when more are
 * needed, or MS_EBADREQ. `src` gets the client's address; *known is 0 when the header says
 * nothing about it (v1 UNKNOWN, v2 LOCAL: a health check from the proxy itself). */
ssize_t ms__proxy_parse(const char *p, size_t n, uint8_t src[16], int *known)
{
    *known = 0;
    if (n >= 1 && (uint8_t)p[0] == 0x0d) {
        size_t k = n < 12 ? n : 12;
        if (memcmp(p, v2_sig, k) != 0)
            return MS_EBADREQ;
        if (n < 16)
            return 0;
        uint8_t ver_cmd = (uint8_t)p[12], fam = (uint8_t)p[13];
        size_t len = ((size_t)(uint8_t)p[14] << 8) | (uint8_t)p[15];
        if ((ver_cmd >> 4) != 2 || len > V2_LEN_MAX)
            return MS_EBADREQ;
        if (n < 16 + len)
            return 0;
        const uint8_t *a = (const uint8_t *)p + 16;
        if ((ver_cmd & 0xf) == 0) /* LOCAL */
            return (ssize_t)(16 + len);
        if ((ver_cmd & 0xf) != 1)
            return MS_EBADREQ;
        if (fam == 0x11 && len >= 12) { /* TCP over IPv4 */
            memset(src, 0, 10);
            src[10] = src[11] = 0xff;
            memcpy(src + 12, a, 4);
            *known = 1;
        } else if (fam == 0x21 && len >= 36) { /* TCP over IPv6 */
            memcpy(src, a, 16);
            *known = 1;
        } else if (fam != 0x00) {
            return MS_EBADREQ;
        }
        return (ssize_t)(16 + len);
    }
    /* v1: "PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\n": its CR is within the first
     * V1_LINE_MAX - 1 bytes, so that the LF after it is byte V1_LINE_MAX at the latest. */
    size_t k = n < 6 ? n : 6;
    if (memcmp(p, "PROXY ", k) != 0)
        return MS_EBADREQ;
    const char *eol = memchr(p, '\r', n < V1_LINE_MAX - 1 ? n : V1_LINE_MAX - 1);
    if (eol == NULL)
        return n >= V1_LINE_MAX - 1 ? MS_EBADREQ : 0;
    if ((size_t)(eol - p) + 1 >= n)
        return 0;
    if (eol[1] != '\n')
        return MS_EBADREQ;
    size_t total = (size_t)(eol - p) + 2;
    char line[V1_LINE_MAX];
    memcpy(line, p, (size_t)(eol - p));
    line[eol - p] = 0;
    if (strncmp(line, "PROXY UNKNOWN", 13) == 0)
        return (ssize_t)total;
    char proto[8], s_ip[64], d_ip[64];
    unsigned sport, dport;
    if (sscanf(line, "PROXY %7s %63s %63s %u %u", proto, s_ip, d_ip, &sport, &dport) != 5 ||
        (strcmp(proto, "TCP4") != 0 && strcmp(proto, "TCP6") != 0) || sport > 65535 ||
        dport > 65535)
        return MS_EBADREQ;
    if (parse_ip(s_ip, strlen(s_ip), src) < 0 || (proto[3] == '4') != is_v4(src))
        return MS_EBADREQ;
    *known = 1;
    return (ssize_t)total;
}
