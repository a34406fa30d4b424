/* proxy_protocol.c: the PROXY protocol (v1 text, v2 binary) on listeners that ask for it,
 * and the proxies trusted to speak for clients (here and in http/trusted.c). */
#include "moonserve.h"

#include <stdio.h>
#include <stdlib.h>

#include "engine/engine.h"

int ms_server_trust(ms_server_t *s, const char *cidr)
{
    ms_cidr_t c;
    if (ms__cidr_parse(cidr, &c) < 0)
        return UV_EINVAL;
    s->trusted = ms_mem_realloc(s->trusted, (s->ntrusted + 1) * sizeof(ms_cidr_t));
    s->trusted[s->ntrusted++] = c;
    return 0;
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
    if (ms__parse_ip(s_ip, strlen(s_ip), src) < 0 || (proto[3] == '4') != ms__is_v4(src))
        return MS_EBADREQ;
    *known = 1;
    return (ssize_t)total;
}
