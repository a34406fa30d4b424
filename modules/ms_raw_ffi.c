/* ms_raw_ffi.c: the FFI surface of the ngx layer's request sockets (core/tunnel/rawsock.c, and the
 * timed body wait of ngx.req.socket()): flat arguments, int results. Declared again in
 * lua/moonserve/ngx/reqsock.lua. */
#include "moonserve.h"
#include "tunnel/rawsock.h"

#define MS_FFI MS_EXPORT

/* Lua strings up to this size are copied into the reply queue; larger ones are referenced
 * and the caller anchors them (as ms_ffi_ws_send's). */
#define COPY_MAX 1024

MS_FFI ms_raw_t *ms_ffi_raw_accept(ms_req_t *r, double send_queue, int *err)
{
    return ms_raw_accept(r, (uint64_t)send_queue, err);
}

MS_FFI void ms_ffi_raw_free(ms_raw_t *t)
{
    ms_raw_free(t);
}

MS_FFI int64_t ms_ffi_raw_peek(ms_raw_t *t, const char **p)
{
    return ms_raw_peek(t, p);
}

MS_FFI void ms_ffi_raw_consume(ms_raw_t *t, double n)
{
    ms_raw_consume(t, (size_t)n);
}

MS_FFI void ms_ffi_raw_wait(ms_raw_t *t, int32_t slot)
{
    ms_raw_wait(t, slot);
}

/* Sends bytes. Returns 0, a negative code, or slot + 1 when `p` is referenced by the write:
 * the caller keeps the string in its anchor table at that slot. */
MS_FFI int ms_ffi_raw_send(ms_raw_t *t, ms_server_t *s, const char *p, size_t len)
{
    if (len <= COPY_MAX)
        return ms_raw_send(t, p, len, MS_VEC_OUT, -1);
    int32_t slot = ms_anchor_get(s);
    int rc = ms_raw_send(t, p, len, MS_VEC_LUA, slot);
    return rc < 0 ? rc : slot + 1;
}

/* 1 when the connection is congested (the sender should wait for it to drain), -1 when
 * nothing more goes to the peer, else 0. */
MS_FFI int ms_ffi_raw_congested(ms_raw_t *t, ms_req_t *r)
{
    if (ms_raw_closed(t))
        return -1;
    return ms_reply_congested(r) ? 1 : 0;
}

/* ms_req_wait_body with a limit in seconds (0: none). */
MS_FFI int ms_ffi_req_wait_body_for(ms_req_t *r, double seconds)
{
    return ms_req_wait_body_for(r, seconds <= 0 ? 0 : (uint64_t)(seconds * 1000.0 + 0.5));
}

/* The server's socket_read_timeout and socket_send_timeout, in seconds: the request sockets'
 * defaults, as OpenResty's lua_socket_read_timeout and lua_socket_send_timeout are theirs. */
MS_FFI double ms_ffi_raw_default_timeout(ms_server_t *s, int send)
{
    return ms_raw_timeout_ms(s, send) / 1000.0;
}

/* The server's raw_socket_buffer_bytes: the most a raw request socket's line, pattern or "*a"
 * read holds before it fails. */
MS_FFI double ms_ffi_raw_buffer_cap(ms_server_t *s)
{
    return (double)ms_raw_buffer_cap(s);
}
