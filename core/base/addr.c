/* addr.c: addresses: IPv4 and IPv6 in 16 bytes (IPv4 mapped), their text, address ranges,
 * and listening sockets (which the master makes and hands to workers). */
#include "base/addr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int ms__parse_ip(const char *p, size_t n, uint8_t out[16])
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

int ms__is_v4(const uint8_t a[16])
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(a, prefix, 12) == 0;
}

void ms__format_ip(const uint8_t a[16], char *buf, size_t len)
{
    if (ms__is_v4(a))
        inet_ntop(AF_INET, a + 12, buf, (socklen_t)len);
    else
        inet_ntop(AF_INET6, a, buf, (socklen_t)len);
}

int ms__cidr_parse(const char *cidr, ms_cidr_t *c)
{
    const char *slash = strchr(cidr, '/');
    size_t n = slash ? (size_t)(slash - cidr) : strlen(cidr);
    if (ms__parse_ip(cidr, n, c->addr) < 0)
        return -1;
    int max = ms__is_v4(c->addr) ? 32 : 128;
    long bits = max;
    if (slash != NULL) {
        char *end;
        bits = strtol(slash + 1, &end, 10);
        if (*end != 0 || end == slash + 1 || bits < 0 || bits > max)
            return -1;
    }
    c->bits = (uint8_t)(bits + (max == 32 ? 96 : 0));
    return 0;
}

int ms__cidr_match(const ms_cidr_t *list, uint32_t n, const uint8_t a[16])
{
    for (uint32_t i = 0; i < n; i++) {
        const ms_cidr_t *c = &list[i];
        int full = c->bits / 8, rest = c->bits % 8;
        if (memcmp(a, c->addr, (size_t)full) != 0)
            continue;
        if (rest == 0 || ((a[full] ^ c->addr[full]) & (0xff << (8 - rest))) == 0)
            return 1;
    }
    return 0;
}

int ms__parse_addr(const char *addr, struct sockaddr_storage *ss)
{
    char host[256];
    const char *colon = strrchr(addr, ':');
    if (colon == NULL)
        return UV_EINVAL;
    size_t hl = (size_t)(colon - addr);
    if (hl >= sizeof(host))
        return UV_EINVAL;
    memcpy(host, addr, hl);
    host[hl] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end != 0 || port < 0 || port > 65535 || end == colon + 1)
        return UV_EINVAL;
    if (hl == 0)
        strcpy(host, "0.0.0.0");
    if (host[0] == '[') {
        size_t n = strlen(host);
        if (host[n - 1] != ']')
            return UV_EINVAL;
        memmove(host, host + 1, n - 2);
        host[n - 2] = 0;
        return uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)ss);
    }
    if (strcmp(host, "localhost") == 0)
        strcpy(host, "127.0.0.1");
    return uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ss);
}

int ms_listen_fd(const char *addr, int backlog, int port)
{
    struct sockaddr_storage ss;
    int rc = ms__parse_addr(addr, &ss);
    if (rc < 0)
        return rc;
    if (port >= 0) {
        if (ss.ss_family == AF_INET6)
            ((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)port);
        else
            ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)port);
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    socklen_t len =
        ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    if (bind(fd, (struct sockaddr *)&ss, len) < 0 ||
        listen(fd, backlog > 0 ? backlog : MS_LISTEN_BACKLOG) < 0) {
        rc = -errno;
        close(fd);
        return rc;
    }
    return fd;
}

int ms_fd_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
        return -errno;
    return ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                          : ((struct sockaddr_in *)&ss)->sin_port);
}

