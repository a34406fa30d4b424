/* ms_sock_ffi.c: the FFI surface of moonserve.socket: each socket's completion wakes the
 * slot the Lua side parked its coroutine on (core/engine/wake.c). Declared again in
 * lua/moonserve/host/core/socket.lua. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>

#include "moonserve.h"
#include "client/sock.h"

#define MS_FFI MS_EXPORT

/* What Lua holds for one socket. Lua allocates it (ffi.new), so its memory is the GC's and
 * needs neither a malloc nor a finaliser; the socket's owner ends before it can become
 * garbage (moonserve.socket: the owner holds the socket) and releases it, and from then on
 * the engine has no pointer to it. The engine's callback has only the ms_sock_t, so the
 * view's slot holds this object's index in `glues`. */
typedef struct ms_ffi_sock_s {
    ms_sock_view_t *view; /* the engine's: valid while `s` is */
    ms_sock_t *s;         /* owned; NULL once released (its owner ended) */
    ms_udp_t *u;          /* the same, for UDP */
    ms_server_t *srv;
    int32_t rslot, wslot; /* woken by a connect or read, by a write; -1: nobody waits */
    int32_t index;        /* in `glues`; -1 once released */
} ms_ffi_sock_t;

_Static_assert(sizeof(uv_buf_t) == 2 * sizeof(void *), "uv_buf_t is { base, len }");

static ms_ffi_sock_t **glues;
static int32_t nglues, cap_glues, free_glue = -1;

static int32_t glue_put(ms_ffi_sock_t *g)
{
    int32_t i;
    if (free_glue >= 0) {
        i = free_glue;
        free_glue = (int32_t)(intptr_t)glues[i];
    } else {
        if (nglues == cap_glues) {
            cap_glues = cap_glues ? cap_glues * 2 : 64;
            glues = ms_mem_realloc(glues, (size_t)cap_glues * sizeof(*glues));
        }
        i = nglues++;
    }
    glues[i] = g;
    return i;
}

static void glue_drop(int32_t i)
{
    glues[i] = (ms_ffi_sock_t *)(intptr_t)free_glue; /* the free list threads the slots */
    free_glue = i;
}

/* Wakes whoever waits on `*slot`, once. ms_wake resumes it now when the completion comes
 * from the loop, and queues it when a call into Lua or the engine's own work is under way
 * (core/engine/wake.c): the engine completes a connect in the backlog inside the setkeepalive or
 * close that gave a connection back, and a close completes the reads and writes under way,
 * all inside an FFI call from Lua, which LuaJIT cannot be entered again from. */
static void wake(ms_ffi_sock_t *g, int32_t *slot, int status)
{
    int32_t sl = *slot;
    *slot = -1;
    if (sl >= 0)
        ms_wake(g->srv, sl, status);
}

static void on_read(ms_sock_t *s, int status)
{
    ms_ffi_sock_t *g = glues[ms_sock_view(s)->slot];
    wake(g, &g->rslot, status);
}

static void on_write(ms_sock_t *s, int status)
{
    ms_ffi_sock_t *g = glues[ms_sock_view(s)->slot];
    wake(g, &g->wslot, status);
}

static void on_udp(ms_udp_t *u, int status)
{
    ms_ffi_sock_t *g = glues[ms_udp_view(u)->slot];
    wake(g, &g->rslot, status);
}

static void glue_init(ms_ffi_sock_t *g, ms_server_t *srv)
{
    memset(g, 0, sizeof(*g));
    g->srv = srv;
    g->rslot = g->wslot = -1;
    g->index = glue_put(g);
}

/* -- TCP ----------------------------------------------------------------------------------- */

/* A new socket of `srv` in `g` (Lua's memory, zeroed or released). */
MS_FFI void ms_ffi_sock_init(ms_ffi_sock_t *g, ms_server_t *srv)
{
    glue_init(g, srv);
    g->s = ms_sock_new(srv);
    g->view = ms_sock_view(g->s);
    g->view->slot = g->index;
}

MS_FFI void ms_ffi_udp_init(ms_ffi_sock_t *g, ms_server_t *srv)
{
    glue_init(g, srv);
    g->u = ms_udp_new(srv);
    g->view = ms_udp_view(g->u);
    g->view->slot = g->index;
}

/* Frees the engine's socket now (its owner ended): no callback comes after, and the engine
 * keeps no pointer to `g`. Once only has an effect. */
MS_FFI void ms_ffi_sock_release(ms_ffi_sock_t *g)
{
    g->rslot = g->wslot = -1;
    if (g->s != NULL)
        ms_sock_free(g->s);
    if (g->u != NULL)
        ms_udp_free(g->u);
    g->s = NULL;
    g->u = NULL;
    g->view = NULL;
    if (g->index >= 0)
        glue_drop(g->index);
    g->index = -1;
}

/* A timeout from Lua in ms: a negative one is the worker's configured default. */
static uint32_t timeout_ms(double ms)
{
    return ms < 0 ? MS_SOCK_TIMEOUT_DEFAULT : (uint32_t)ms;
}

MS_FFI void ms_ffi_sock_settimeouts(ms_ffi_sock_t *g, double c, double s, double r)
{
    if (g->s != NULL)
        ms_sock_settimeouts(g->s, timeout_ms(c), timeout_ms(s), timeout_ms(r));
    else if (g->u != NULL)
        ms_udp_settimeout(g->u, timeout_ms(r));
}

MS_FFI int ms_ffi_sock_connect(ms_ffi_sock_t *g, const char *host, size_t len, int port,
                               const char *pool, size_t pool_len, int pool_size, int backlog,
                               int fresh)
{
    ms_sock_opts_t o = {pool, pool_len, pool_size > 0 ? (uint32_t)pool_size : 0,
                        backlog > 0 ? (uint32_t)backlog : 0, fresh != 0};
    return ms_sock_connect(g->s, host, len, port, &o, on_read);
}

MS_FFI int ms_ffi_sock_send(ms_ffi_sock_t *g, const uv_buf_t *bufs, unsigned n)
{
    return ms_sock_send(g->s, bufs, n, on_write);
}

MS_FFI int ms_ffi_sock_receive(ms_ffi_sock_t *g, int pattern, double n)
{
    return ms_sock_receive(g->s, pattern, (size_t)n, on_read);
}

MS_FFI int ms_ffi_sock_receiveuntil(ms_ffi_sock_t *g, ms_sock_until_t *u, double size)
{
    return ms_sock_receiveuntil(g->s, u, (size_t)size, on_read);
}

MS_FFI int ms_ffi_sock_setkeepalive(ms_ffi_sock_t *g, double idle_ms, int pool_size)
{
    return ms_sock_setkeepalive(g->s, (int64_t)idle_ms, pool_size > 0 ? (uint32_t)pool_size : 0);
}

MS_FFI int ms_ffi_sock_close(ms_ffi_sock_t *g)
{
    if (g->s == NULL && g->u == NULL)
        return UV_ENOTCONN; /* released */
    return g->s != NULL ? ms_sock_close(g->s) : ms_udp_close(g->u);
}

/* The connection's descriptor (a key that stays the same while a pooled connection lives),
 * or UV_ENOTCONN. */
MS_FFI int ms_ffi_sock_fd(ms_ffi_sock_t *g)
{
    return g->s != NULL ? ms_sock_fd(g->s) : UV_ENOTCONN;
}

/* setoption(name, value): 0, or a negative code (UV_ENOTCONN, UV_EINVAL, -errno). */
MS_FFI int ms_ffi_sock_setoption(ms_ffi_sock_t *g, const char *name, int value)
{
    int fd = ms_sock_fd(g->s);
    if (fd < 0)
        return fd;
    int level = SOL_SOCKET, opt;
    if (strcmp(name, "keepalive") == 0)
        opt = SO_KEEPALIVE;
    else if (strcmp(name, "sndbuf") == 0)
        opt = SO_SNDBUF;
    else if (strcmp(name, "rcvbuf") == 0)
        opt = SO_RCVBUF;
    else if (strcmp(name, "tcp-nodelay") == 0)
        level = IPPROTO_TCP, opt = TCP_NODELAY;
    else
        return UV_EINVAL;
    if (setsockopt(fd, level, opt, &value, sizeof(value)) < 0)
        return -errno;
    return 0;
}

MS_FFI int ms_ffi_sock_errmsg(ms_ffi_sock_t *g, int err, char *buf, size_t len)
{
    if (g->s != NULL)
        return ms_sock_errmsg(g->s, err, buf, len);
    const char *m = ms_sock_strerror(err);
    size_t n = strlen(m);
    if (n >= len)
        n = len - 1;
    memcpy(buf, m, n);
    buf[n] = '\0';
    return (int)n;
}

/* -- TLS ----------------------------------------------------------------------------------- */

/* sslhandshake: MS_SOCK_DONE, MS_SOCK_PENDING (the read slot is woken) or a negative code. */
MS_FFI int ms_ffi_sock_sslhandshake(ms_ffi_sock_t *g, ms_tls_session_t *sess, const char *name,
                                    size_t name_len, int verify, int ocsp)
{
    ms_sock_tls_opts_t o = {name, name_len, verify, ocsp, sess};
    return ms_sock_sslhandshake(g->s, &o, on_read);
}

/* A new reference to the connection's session (ms_ffi_tls_session_free drops it), or NULL. */
MS_FFI ms_tls_session_t *ms_ffi_sock_session(ms_ffi_sock_t *g)
{
    return ms_sock_tls_session(g->s);
}

MS_FFI void ms_ffi_tls_session_free(ms_tls_session_t *sess)
{
    ms_tls_session_free(sess);
}

/* Whether the session was resumed (0, 1), with the protocol and cipher; or UV_ENOTCONN. */
MS_FFI int ms_ffi_sock_sslinfo(ms_ffi_sock_t *g, const char **version, const char **cipher)
{
    return ms_sock_tls_info(g->s, version, cipher);
}

MS_FFI int ms_ffi_sock_setclientcert(ms_ffi_sock_t *g, const char *cert, size_t cert_len,
                                     const char *key, size_t key_len, char *err, size_t errlen)
{
    return ms_sock_setclientcert(g->s, cert, cert_len, key, key_len, err, errlen);
}

MS_FFI int ms_ffi_tls_trust(ms_server_t *srv, const char *file, char *err, size_t errlen)
{
    return ms_sock_tls_trust(srv, file, err, errlen);
}

MS_FFI ms_sock_until_t *ms_ffi_until_new(const char *p, size_t len, int inclusive)
{
    return ms_sock_until_new(p, len, inclusive);
}

MS_FFI void ms_ffi_until_free(ms_sock_until_t *u)
{
    ms_sock_until_free(u);
}

/* -- UDP ----------------------------------------------------------------------------------- */

MS_FFI int ms_ffi_udp_setpeername(ms_ffi_sock_t *g, const char *host, size_t len, int port)
{
    return ms_udp_setpeername(g->u, host, len, port, on_udp);
}

MS_FFI int ms_ffi_udp_send(ms_ffi_sock_t *g, const uv_buf_t *bufs, unsigned n)
{
    return ms_udp_send(g->u, bufs, n);
}

MS_FFI int ms_ffi_udp_receive(ms_ffi_sock_t *g, double size)
{
    return ms_udp_receive(g->u, (size_t)size, on_udp);
}
