/* trusted.c: who the client is behind trusted proxies: X-Forwarded-For, read from the right
 * through trusted addresses only. */
#include "http/http.h"

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
        if (ms__parse_ip(a, (size_t)(b - a), ip) < 0)
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

