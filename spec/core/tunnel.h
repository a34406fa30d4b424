/* tunnel.h: a taker of tunnels for the engines' tests. It sends each piece back in brackets,
 * ends the tunnel on "quit", and lets go of the request when the peer's bytes end. */
#ifndef MS_TEST_TUNNEL_H
#define MS_TEST_TUNNEL_H

#include <stdio.h>
#include <string.h>

typedef struct echo_tunnel_s {
    ms_tunnel_t t;
    char seen[256]; /* every byte it was given */
    int ended;      /* on_end was called, so many times */
    int end_status;
} echo_tunnel_t;

static void echo_tunnel_data(ms_tunnel_t *t, const char *p, size_t n)
{
    echo_tunnel_t *e = t->data;
    size_t have = strlen(e->seen);
    snprintf(e->seen + have, sizeof(e->seen) - have, "%.*s", (int)n, p);
    ms_tunnel_write(t, "<", 1, MS_VEC_STATIC, -1);
    ms_tunnel_write(t, p, n, MS_VEC_OUT, -1);
    ms_tunnel_write(t, ">", 1, MS_VEC_STATIC, -1);
    if (n >= 4 && memcmp(p + n - 4, "quit", 4) == 0)
        ms_req_finish(t->req);
}

static void echo_tunnel_end(ms_tunnel_t *t, int status)
{
    echo_tunnel_t *e = t->data;
    e->ended++;
    e->end_status = status;
    ms_req_finish(t->req);
}

static ms_tunnel_t *echo_tunnel(echo_tunnel_t *e)
{
    memset(e, 0, sizeof(*e));
    e->t.on_data = echo_tunnel_data;
    e->t.on_end = echo_tunnel_end;
    e->t.data = e;
    return &e->t;
}

#endif
