/* ms_ws_ffi.c: the FFI surface of moonserve.websocket (core/tunnel/ws.c): flat arguments, int
 * results. Declared again in lua/moonserve/host/core/websocket.lua. */
#include <string.h>

#include "moonserve.h"
#include "tunnel/ws.h"

#define MS_FFI MS_EXPORT

/* Lua strings up to this size are copied into the reply queue; larger ones are referenced
 * and the caller anchors them (as ms_ffi_res_send's). */
#define COPY_MAX 1024

/* What ms_ffi_ws_receive fills. */
typedef struct ms_ffi_ws_msg_s {
    const char *data;
    size_t len;
    int32_t op, code;
} ms_ffi_ws_msg_t;

/* Sec-WebSocket-Accept for `key` into out[0..29). Returns 28 or MS_EBADREQ. */
MS_FFI int ms_ffi_ws_accept_key(const char *key, size_t len, char *out)
{
    return ms_ws_accept_key(key, len, out);
}

/* Takes the request over as a WebSocket (sizes in bytes, times in seconds). Returns the
 * socket, or NULL with *err. */
MS_FFI ms_ws_t *ms_ffi_ws_accept(ms_req_t *r, double max_message, double max_frame,
                                 double send_queue, double ping, double pong, double idle,
                                 double close, int control, int deflate_bits,
                                 int deflate_keep, int inflate_bits, int *err)
{
    ms_ws_opts_t o = {
        .max_message = (uint64_t)max_message,
        .max_frame = (uint64_t)max_frame,
        .send_queue = (uint64_t)send_queue,
        .ping_ms = (uint32_t)(ping * 1000.0 + 0.5),
        .pong_ms = (uint32_t)(pong * 1000.0 + 0.5),
        .idle_ms = (uint32_t)(idle * 1000.0 + 0.5),
        .close_ms = (uint32_t)(close * 1000.0 + 0.5),
        .deliver_control = (uint8_t)(control != 0),
        .deflate_bits = (uint8_t)(deflate_bits >= 9 && deflate_bits <= 15 ? deflate_bits : 0),
        .deflate_keep = (uint8_t)(deflate_keep >= 1 && deflate_keep <= 9 ? deflate_keep : 0),
        .inflate_bits = (uint8_t)(inflate_bits >= 9 && inflate_bits <= 15 ? inflate_bits : 0),
    };
    return ms_ws_accept(r, &o, err);
}

/* 1 when the socket outlives its request (ms_ws_outlives). */
MS_FFI int ms_ffi_ws_outlives(ms_ws_t *ws)
{
    return ms_ws_outlives(ws);
}

/* The slot of a socket with callbacks, which the socket keeps for Lua (-1: none). */
MS_FFI void ms_ffi_ws_set_home(ms_ws_t *ws, int32_t slot)
{
    ms_ws_set_home(ws, slot);
}

MS_FFI int32_t ms_ffi_ws_home(ms_ws_t *ws)
{
    return ms_ws_home(ws);
}

/* The anchor slots of the socket's server whose writes are done (as ms_ffi_anchor_drain,
 * with no request). */
MS_FFI int ms_ffi_ws_anchor_drain(ms_ws_t *ws, int32_t *out, int n)
{
    return ms_anchor_drain(ms_ws_server(ws), out, n);
}

MS_FFI void ms_ffi_ws_free(ms_ws_t *ws)
{
    ms_ws_free(ws);
}

/* MS_WS_GOT with *m filled (valid until the next call), MS_WS_PENDING, or MS_ECLOSED. */
MS_FFI int ms_ffi_ws_receive(ms_ws_t *ws, ms_ffi_ws_msg_t *m)
{
    int op = 0, code = 0;
    int rc = ms_ws_receive(ws, &op, &m->data, &m->len, &code);
    m->op = op;
    m->code = code;
    return rc;
}

MS_FFI void ms_ffi_ws_wait(ms_ws_t *ws, int32_t slot)
{
    ms_ws_wait(ws, slot);
}

/* Sends a message or ping. Returns 0, a negative code, or slot + 1 when `p` is referenced by
 * the write: the caller keeps the string in its anchor table at that slot. */
MS_FFI int ms_ffi_ws_send(ms_ws_t *ws, int op, const char *p, size_t len)
{
    if (len <= COPY_MAX)
        return ms_ws_send(ws, op, p, len, MS_VEC_OUT, -1);
    int32_t slot = ms_anchor_get(ms_ws_server(ws));
    int rc = ms_ws_send(ws, op, p, len, MS_VEC_LUA, slot);
    return rc < 0 ? rc : slot + 1;
}

/* Sends a frame built once (ms_ffi_ws_frame_head) for many sockets, always referenced so that
 * no recipient copies it. Returns as ms_ffi_ws_send. */
MS_FFI int ms_ffi_ws_send_frame(ms_ws_t *ws, const char *frame, size_t len)
{
    int32_t slot = ms_anchor_get(ms_ws_server(ws));
    int rc = ms_ws_send_frame(ws, frame, len, MS_VEC_LUA, slot);
    return rc < 0 ? rc : slot + 1;
}

/* The head of an unmasked frame into out[0..10); returns its length. */
MS_FFI int ms_ffi_ws_frame_head(char *out, int op, double len)
{
    return (int)ms_ws_frame_head((uint8_t *)out, op, 1, (uint64_t)len);
}

MS_FFI int ms_ffi_ws_close(ms_ws_t *ws, int code, const char *reason, size_t len)
{
    return ms_ws_close(ws, code, reason, len);
}

MS_FFI int ms_ffi_ws_closed(ms_ws_t *ws)
{
    return ms_ws_closed(ws);
}

MS_FFI int ms_ffi_ws_utf8_ok(const char *p, size_t n)
{
    return ms_ws_utf8_ok(p, n);
}

MS_FFI int ms_ffi_ws_close_code_ok(int code)
{
    return ms_ws_close_code_ok(code);
}
