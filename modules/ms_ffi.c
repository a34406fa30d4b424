/* ms_ffi.c: the hot path Lua calls through LuaJIT's FFI: flat arguments, caller-owned
 * out-buffers, int results. Declared again in lua/moonserve/host/core/base.lua. */
#include <string.h>

#include "moonserve.h"
#include "http/accesslog.h"
#include "transport/memio.h"
#include "http/static/static.h"

#define MS_FFI MS_EXPORT

/* Bodies up to this size are copied next to the reply head; larger Lua strings are
 * referenced and the caller anchors them (see ms_ffi_res_send). */
#define COPY_MAX 1024

static inline int fold(char ch)
{
    return ch >= 'A' && ch <= 'Z' ? ch | 0x20 : ch;
}

/* The header whose name matches `name` in any case. Returns its value and length, or NULL. */
MS_FFI const char *ms_ffi_req_header(ms_req_t *r, const char *name, size_t len, size_t *vlen)
{
    for (int i = 0; i < r->v.nheaders; i++) {
        const ms_header_t *h = &r->headers[i];
        if (h->name.len != len)
            continue;
        size_t k = 0;
        while (k < len && fold(h->name.base[k]) == fold(name[k]))
            k++;
        if (k == len) {
            *vlen = h->value.len;
            return h->value.base;
        }
    }
    return NULL;
}

/* The request's fields, for req:headers(). Returns how many there are; fills at most n. */
MS_FFI int ms_ffi_req_headers(ms_req_t *r, ms_header_t *out, int n)
{
    int k = r->v.nheaders < n ? r->v.nheaders : n;
    memcpy(out, r->headers, (size_t)k * sizeof(*out));
    return r->v.nheaders;
}

/* The trailer fields of the request body, for req:trailers(); as ms_ffi_req_headers. */
MS_FFI int ms_ffi_req_trailers(ms_req_t *r, ms_header_t *out, int n)
{
    int k = r->ntrailers < n ? r->ntrailers : n;
    if (k > 0)
        memcpy(out, r->trailers, (size_t)k * sizeof(*out));
    return r->ntrailers;
}

/* Whether every byte of `p` may stand in a URL path as it is (RFC 3986 3.3: pchar, "/" and
 * the "%" of escapes). A loop in Lua over the bytes would be a trace of its own whose exit
 * the JIT cannot follow back into the dispatcher. */
MS_FFI int ms_ffi_path_plain(const char *p, size_t n)
{
    static const char extra[] = "-._~!$&'()*+,;=:@/%";
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              (c != 0 && memchr(extra, c, sizeof(extra) - 1) != NULL)))
            return 0;
    }
    return 1;
}

/* Whether `p` holds none of the printable bytes no URL may hold as they are (RFC 3986 2:
 * space " < > \\ ^ ` { | }), for res:redirect; in C for the same reason. */
MS_FFI int ms_ffi_url_check(const char *p, size_t n)
{
    static const char never[] = " \"<>\\^`{|}";
    int plain = 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c < 0x20 || c == 0x7f)
            return -1;
        if (plain && memchr(never, c, sizeof(never) - 1) != NULL)
            plain = 0;
    }
    return plain;
}

MS_FFI int ms_ffi_req_client_ip(ms_req_t *r, char *buf, size_t len)
{
    return ms_req_client_ip(r, buf, len);
}

/* The connection's own address (`local`) or its peer's into buf; returns the port or -1. */
MS_FFI int ms_ffi_req_address(ms_req_t *r, int local, char *buf, size_t len)
{
    return ms_conn_address(r->conn, local, buf, len);
}

/* The status the core answered with in the handler's place (a limit, a deadline), or 0. */
MS_FFI int ms_ffi_req_refused(ms_req_t *r)
{
    return r->refused;
}

MS_FFI int ms_ffi_req_peer_trusted(ms_req_t *r)
{
    return ms_req_peer_trusted(r);
}

/* The TLS version the request came over into buf[0..len); returns its length, 0 over plain
 * TCP. */
MS_FFI int ms_ffi_req_tls(ms_req_t *r, char *buf, size_t len)
{
    const char *v = ms_req_tls(r);
    size_t n = v != NULL ? strlen(v) : 0;
    if (n >= len)
        n = len - 1;
    memcpy(buf, v != NULL ? v : "", n);
    return (int)n;
}

/* The request id (ms_req_id) into buf[0..len), len > MS_REQ_ID_MAX; returns its length. */
MS_FFI int ms_ffi_req_id(ms_req_t *r, char *buf, size_t len)
{
    return ms_req_id(r, buf, len);
}

/* The access log the request goes to (-1 none, -2 as it is) and its route's name. */
MS_FFI void ms_ffi_req_access(ms_req_t *r, int log, const char *route, size_t len)
{
    ms_req_access(r, log, route, len);
}

/* The route's index in the metrics (0: none), as the framework numbered the app's routes. */
MS_FFI void ms_ffi_req_metric(ms_req_t *r, uint32_t ix)
{
    r->route_ix = ix;
}

/* Adds field lines ("name: value\r\n"...), checked. */
MS_FFI int ms_ffi_res_fields(ms_req_t *r, const char *lines, size_t len)
{
    return ms_reply_field(r, lines, len);
}

/* Field lines that passed ms_ffi_fields_check once (the framework's security fields). */
MS_FFI int ms_ffi_res_fields_checked(ms_req_t *r, const char *lines, size_t len)
{
    return ms_reply_fields_checked(r, lines, len);
}

MS_FFI int ms_ffi_fields_check(const char *lines, size_t len)
{
    return ms_fields_check(lines, len);
}

MS_FFI int ms_ffi_res_header(ms_req_t *r, const char *name, size_t nlen, const char *value,
                             size_t vlen)
{
    return ms_reply_header(r, name, nlen, value, vlen);
}

MS_FFI int ms_ffi_res_trailer(ms_req_t *r, const char *name, size_t nlen, const char *value,
                              size_t vlen)
{
    return ms_reply_trailer(r, name, nlen, value, vlen);
}

/* The reply's fields so far as lines ("name: value\r\n"...): returns their length and points
 * *out at them, valid until a field is added or the request is finished. */
MS_FFI int64_t ms_ffi_res_fields_get(ms_req_t *r, const char **out)
{
    *out = r->res_headers.base;
    return (int64_t)r->res_headers.len;
}

MS_FFI int ms_ffi_res_reset(ms_req_t *r)
{
    return ms_reply_reset(r);
}

static const char default_type[] = "content-type: text/plain; charset=utf-8\r\n";

typedef int (*reply_fn)(ms_req_t *r, const char *p, size_t len, int owner, int32_t anchor);

/* Hands a Lua string to `fn`: copied when small, else referenced under an anchor slot. */
static int queue(ms_req_t *r, reply_fn fn, const char *p, size_t len)
{
    if (len <= COPY_MAX)
        return fn(r, p, len, MS_VEC_OUT, -1);
    int32_t slot = ms_anchor_get(ms_conn_server(r->conn));
    int rc = fn(r, p, len, MS_VEC_LUA, slot);
    return rc < 0 ? rc : slot + 1;
}

/* Sends the reply, with the default content type if `text` (the handler set none). Returns
 * 0, a negative code, or slot + 1 when `body` is referenced by the write: the caller keeps
 * the string in its anchor table at that slot. */
MS_FFI int ms_ffi_res_send(ms_req_t *r, const char *body, size_t len, int text)
{
    if (text && len > 0)
        ms_reply_fields_checked(r, default_type, sizeof(default_type) - 1);
    return queue(r, ms_reply_send, body, len);
}

/* A reply sent as a chain of pieces of `total` bytes: begin, pieces, end. */
MS_FFI int ms_ffi_res_begin(ms_req_t *r, double total, int text)
{
    if (text && total > 0)
        ms_reply_fields_checked(r, default_type, sizeof(default_type) - 1);
    return ms_reply_begin(r, (uint64_t)total);
}

MS_FFI int ms_ffi_res_piece(ms_req_t *r, const char *p, size_t len)
{
    return queue(r, ms_reply_piece, p, len);
}

MS_FFI int ms_ffi_res_end(ms_req_t *r)
{
    return ms_reply_end(r);
}

MS_FFI int ms_ffi_res_close(ms_req_t *r)
{
    return ms_reply_close(r);
}

/* Streams a piece of the reply; returns as ms_ffi_res_send. */
MS_FFI int ms_ffi_res_write(ms_req_t *r, const char *chunk, size_t len, int text)
{
    if (text && !(r->v.flags & MS_REQ_HEAD_SENT))
        ms_reply_fields_checked(r, default_type, sizeof(default_type) - 1);
    return queue(r, ms_reply_write, chunk, len);
}

MS_FFI int ms_ffi_res_congested(ms_req_t *r)
{
    return ms_reply_congested(r);
}

/* The anchor slots whose writes are done, for Lua to let go of their strings. */
MS_FFI int ms_ffi_anchor_drain(ms_req_t *r, int32_t *out, int n)
{
    return ms_anchor_drain(ms_conn_server(r->conn), out, n);
}

MS_FFI int64_t ms_ffi_req_body_take(ms_req_t *r, const char **out)
{
    return ms_req_body_take(r, out);
}

MS_FFI int ms_ffi_req_body_limit(ms_req_t *r, double bytes)
{
    return ms_req_body_limit(r, bytes < 0 ? 0 : (uint64_t)bytes);
}

MS_FFI int ms_ffi_req_wait_body(ms_req_t *r)
{
    return ms_req_wait_body(r);
}

MS_FFI int ms_ffi_req_sleep(ms_req_t *r, double seconds)
{
    return ms_req_sleep(r, seconds <= 0 ? 0 : (uint64_t)(seconds * 1000.0 + 0.5));
}

MS_FFI int ms_ffi_req_wait_drain(ms_req_t *r, int all)
{
    return ms_req_wait_drain(r, all);
}

MS_FFI void ms_ffi_req_park(ms_req_t *r)
{
    ms_req_park(r);
}

MS_FFI void ms_ffi_req_finish(ms_req_t *r)
{
    ms_req_finish(r);
}

MS_FFI void ms_ffi_req_fail(ms_req_t *r)
{
    ms_req_fail(r);
}

MS_FFI const char *ms_ffi_err_name(int err)
{
    return ms_err_name(err);
}

MS_FFI const char *ms_ffi_strerror(int err)
{
    return ms_strerror(err);
}

MS_FFI void ms_ffi_log(int level, const char *msg, size_t len)
{
    ms_log_msg(level, msg, len);
}

/* Static files from a handler: the mount's rules for a hooked mount, and res:file(). */
MS_FFI int ms_ffi_static_serve(ms_req_t *r, int id)
{
    return ms_static_serve(r, id);
}

MS_FFI int ms_ffi_static_file(ms_req_t *r, const char *path, size_t len, int typed)
{
    return ms_static_file(r, path, len, typed);
}

MS_FFI double ms_ffi_static_generation(ms_req_t *r)
{
    return (double)ms_static_generation(ms_conn_server(r->conn));
}

MS_FFI int ms_ffi_server_stopping(ms_req_t *r)
{
    return ms_server_stopping(ms_conn_server(r->conn));
}

/* -- Wakes: waits that are no request's (core/engine/wake.c) ----------------------------------- */

/* Wakes `slot` with `status` after `seconds` (0: the next turn of the loop). */
MS_FFI int ms_ffi_wake_after(ms_server_t *s, int32_t slot, double seconds, int status)
{
    return ms_wake_after(s, slot, seconds <= 0 ? 0 : (uint64_t)(seconds * 1000.0 + 0.5), status);
}

MS_FFI void ms_ffi_wake_cancel(ms_server_t *s, int32_t slot)
{
    ms_wake_cancel(s, slot);
}

/* The tag of the in-process connection `r` came over (server:memconn), or 0. */
MS_FFI uint32_t ms_ffi_req_memtag(ms_req_t *r)
{
    return ms_memio_tag(r->conn);
}

MS_FFI ms_server_t *ms_ffi_req_server(ms_req_t *r)
{
    return ms_conn_server(r->conn);
}

/* -- The boundary, checked -------------------------------------------------------------- */

/* What lua/moonserve/host/core/base.lua must agree with: the layout of the types it declares
 * again, the request flags, the wait states, the error codes it compares with and the log levels.
 * base.lua reads this at load, checks its cdef against the layouts and takes the constants
 * from here, so a core and a framework of different builds fail at once with a message
 * instead of reading the wrong bytes. Names are as the Lua side spells them. */
typedef struct ms_ffi_abi_s {
    const char *name;
    int64_t value;
} ms_ffi_abi_t;

#define SIZE(t) {"sizeof(" #t ")", (int64_t)sizeof(t)}
#define OFF(t, f) {"offsetof(" #t ", " #f ")", (int64_t)offsetof(t, f)}
#define CONST(name) {#name, (int64_t)MS_##name}

static const ms_ffi_abi_t abi[] = {
    SIZE(ms_str_t),
    OFF(ms_str_t, base),
    OFF(ms_str_t, len),
    SIZE(ms_header_t),
    OFF(ms_header_t, name),
    OFF(ms_header_t, value),
    SIZE(ms_req_view_t),
    OFF(ms_req_view_t, method),
    OFF(ms_req_view_t, target),
    OFF(ms_req_view_t, path),
    OFF(ms_req_view_t, query),
    OFF(ms_req_view_t, id),
    OFF(ms_req_view_t, version),
    OFF(ms_req_view_t, status),
    OFF(ms_req_view_t, handler),
    OFF(ms_req_view_t, wait),
    OFF(ms_req_view_t, nheaders),
    OFF(ms_req_view_t, flags),
    OFF(ms_req_view_t, content_length),
    CONST(REQ_HEAD_SENT),
    CONST(REQ_DONE),
    CONST(REQ_ABORTED),
    CONST(REQ_BODY_DONE),
    CONST(REQ_HAS_BODY),
    CONST(REQ_EXPECT),
    CONST(REQ_CHUNKED_OUT),
    CONST(REQ_IS_HEAD),
    CONST(REQ_CLOSE),
    CONST(REQ_PARKED),
    CONST(REQ_IN_HANDLER),
    CONST(REQ_BODY_ERROR),
    CONST(REQ_STATIC_DIR),
    CONST(REQ_METRICS),
    CONST(REQ_PEER_EOF),
    CONST(WAIT_NONE),
    CONST(WAIT_BODY),
    CONST(WAIT_TIMER),
    CONST(WAIT_DRAIN),
    CONST(LOG_ERR),
    CONST(LOG_WARN),
    CONST(LOG_INFO),
    CONST(LOG_DEBUG),
    {"EAGAIN", UV_EAGAIN},
    {"ETIMEDOUT", UV_ETIMEDOUT},
    CONST(WAKE_STOP),
#define MS_ERR_ABI(name, value, msg) {#name, (int64_t)(value)},
    MS_ERRNO_MAP(MS_ERR_ABI)
#undef MS_ERR_ABI
};

#undef SIZE
#undef OFF
#undef CONST

/* The table above: *n entries. Its own shape is the one thing the two sides must take on
 * trust, so it never changes; new entries are added, none is renamed. */
MS_FFI const ms_ffi_abi_t *ms_ffi_abi(int *n)
{
    *n = (int)(sizeof(abi) / sizeof(abi[0]));
    return abi;
}
