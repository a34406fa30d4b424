/* moonserve.h: the public interface of the moonserve core (no Lua in here). */
#ifndef MOONSERVE_H
#define MOONSERVE_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "base/errors.h"
#include "base/settings.h"

#define MS_LIKELY(x)   __builtin_expect(!!(x), 1)
#define MS_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define MS_NOINLINE    __attribute__((noinline))
#define MS_EXPORT      __attribute__((visibility("default")))

/* The struct a member belongs to. The conditional is never taken; it makes the compiler
 * check that `ptr` points to the member's type, so a cast cannot hide a wrong member. */
#ifndef container_of
#define container_of(ptr, type, member)                                                            \
    ((type *)((char *)(1 ? (ptr) : &((type *)0)->member) - offsetof(type, member)))
#endif

typedef struct ms_server_s ms_server_t;
typedef struct ms_conn_s ms_conn_t;
typedef struct ms_req_s ms_req_t;
typedef struct ms_out_s ms_out_t;

/* -- Memory ---------------------------------------------------------------------------- */

/* Never return NULL: they abort with a message. Caps bound memory instead. */
void *ms_mem_alloc(size_t n);
void *ms_mem_realloc(void *p, size_t n);
void ms_mem_free(void *p);
/* A copy of the string `s` from ms_mem_alloc, or NULL for NULL. */
char *ms_mem_strdup(const char *s);

/* Counted by every call above; tests and benchmarks read them to prove zero allocations. */
typedef struct ms_mem_stats_s {
    uint64_t allocs, reallocs, frees;
} ms_mem_stats_t;
extern ms_mem_stats_t ms_mem_stats;

/* A view of bytes owned by someone else; the owner is named where it is used. */
typedef struct ms_str_s {
    const char *base;
    size_t len;
} ms_str_t;

/* A growable byte buffer. `base` is owned by whoever holds the ms_buf_t. */
typedef struct ms_buf_s {
    char *base;
    size_t len, cap;
} ms_buf_t;

/* Per-request arena: allocations are bump-pointer, released all at once by reset.
 * The first chunk is kept across resets, so a warm request allocates nothing. */
typedef struct ms_pool_chunk_s ms_pool_chunk_t;
typedef struct ms_pool_s {
    ms_pool_chunk_t *chunks; /* owned; the last one is the reusable first chunk */
    char *cur, *end;
} ms_pool_t;

void ms_pool_init(ms_pool_t *p);
void *ms_pool_alloc(ms_pool_t *p, size_t n);
void ms_pool_reset(ms_pool_t *p);
void ms_pool_free(ms_pool_t *p);

/* -- Reply vectors ------------------------------------------------------------------- */

enum {
    MS_VEC_STATIC, /* lives forever */
    MS_VEC_OUT,    /* `off` bytes into the output queue's own buffer */
    MS_VEC_LUA,    /* a Lua string kept alive by anchor slot `anchor` until written */
    MS_VEC_FILE    /* `len` bytes at `off` of a static file (the core's; referenced) */
};

typedef struct ms_vec_s {
    const char *base; /* MS_VEC_OUT: an offset into the queue's buffer; MS_VEC_FILE: the file */
    size_t len;
    uint64_t off; /* MS_VEC_FILE: where in the file */
    uint8_t owner;
    int32_t anchor;
} ms_vec_t;

/* -- Timers -------------------------------------------------------------------------- */

/* A deadline in the worker's timer heap; one uv_timer per worker drives them all, so a
 * timer costs its own 24 bytes and nothing else. */
typedef struct ms_timer_s ms_timer_t;
typedef void (*ms_timer_cb)(ms_timer_t *t);
struct ms_timer_s {
    uint64_t due;   /* loop time in ms */
    uint32_t index; /* position in the heap plus one; 0 when not armed */
    ms_timer_cb cb;
};

void ms_timer_start(ms_server_t *s, ms_timer_t *t, uint64_t ms, ms_timer_cb cb);
void ms_timer_stop(ms_server_t *s, ms_timer_t *t);

/* -- Requests ------------------------------------------------------------------------ */

/* What a handler waits for, parked. The core resumes it when that happens. */
enum { MS_WAIT_NONE, MS_WAIT_BODY, MS_WAIT_TIMER, MS_WAIT_DRAIN };

/* The part of a request that Lua reads directly through FFI. Keep in step with the cdef in
 * lua/moonserve/host/core/base.lua. Every ms_str_t points into the head, which lives in the
 * worker's read buffer while the handler runs without parking, and in the request's pool
 * after. */
typedef struct ms_req_view_s {
    ms_str_t method, target, path, query;
    uint32_t id;      /* per worker, increasing */
    uint16_t version; /* 10, 11, 20 */
    uint16_t status;  /* the reply's status; the handler may set it until the head leaves */
    int32_t handler;  /* free for the binding: it keeps the handler coroutine's slot here */
    int32_t wait;     /* MS_WAIT_*: what the parked handler waits for */
    int32_t nheaders;
    uint32_t flags;         /* MS_REQ_* below */
    int64_t content_length; /* -1 when unknown (chunked or none sent) */
} ms_req_view_t;

enum {
    MS_REQ_HEAD_SENT = 1 << 0,   /* the reply head has been queued */
    MS_REQ_DONE = 1 << 1,        /* the reply is complete */
    MS_REQ_ABORTED = 1 << 2,     /* the connection went away; replies are dropped */
    MS_REQ_BODY_DONE = 1 << 3,   /* the whole request body has arrived */
    MS_REQ_HAS_BODY = 1 << 4,    /* the request declares a body */
    MS_REQ_EXPECT = 1 << 5,      /* Expect: 100-continue, not yet answered */
    MS_REQ_CHUNKED_OUT = 1 << 6, /* the reply streams with chunked encoding */
    MS_REQ_IS_HEAD = 1 << 7,     /* HEAD: the reply carries no body */
    MS_REQ_CLOSE = 1 << 8,       /* close the connection after this reply */
    MS_REQ_PARKED = 1 << 9,      /* the handler yielded: the head was copied to the pool */
    MS_REQ_IN_HANDLER = 1 << 10, /* dispatched and not yet finished by the handler */
    MS_REQ_BODY_ERROR = 1 << 11, /* the body could not be read whole */
    MS_REQ_STATIC_DIR = 1 << 12, /* a static mount found a directory it does not answer for */
    MS_REQ_METRICS = 1 << 13,    /* on a MS_LISTEN_METRICS listener: for the scrape alone */
    MS_REQ_PEER_EOF = 1 << 14    /* HTTP/1.1: the client shut its side while in the handler */
};

typedef struct ms_header_s {
    ms_str_t name, value; /* borrowed like the rest of the head */
} ms_header_t;

#define MS_HEADERS_INLINE 24

struct ms_req_s {
    ms_req_view_t v;      /* first: Lua casts an ms_req_t * to an ms_req_view_t * */
    ms_conn_t *conn;      /* owner; kept alive while the handler holds the request */
    ms_pool_t pool;       /* everything below that is pooled lives until the request ends */
    ms_str_t head;        /* the raw head, which every view above points into */
    ms_header_t *headers; /* hdr_inline, or pooled when there are more */
    int headers_cap;
    ms_buf_t res_headers;  /* the reply's fields as text, pooled */
    ms_buf_t res_trailers; /* the reply's trailer fields as text, pooled */
    ms_header_t *trailers; /* the request's trailer fields, copied into the pool as they
                            * arrive; never among the headers */
    int ntrailers, trailers_cap;
    ms_buf_t body;              /* request body bytes not yet read by the handler; owned */
    uint64_t body_seen;         /* request body bytes received so far */
    uint64_t body_limit;        /* body_bytes, or what the handler's route allows */
    uint64_t chain_left;        /* bytes a reply sent in pieces still owes (ms_reply_begin) */
    uint8_t drain_all;          /* MS_WAIT_DRAIN until nothing is queued, not just below the mark */
    uint8_t body_wait_timed;    /* MS_WAIT_BODY holds `timer` (ms_req_wait_body_for) */
    uint16_t refused;           /* the status the core answered with in the handler's place */
    struct ms_tunnel_s *tunnel; /* who took the request over (ms_req_tunnel), until it ends */
    ms_timer_t timer;           /* moonserve.sleep() */
    /* The access log's (accesslog.c): */
    uint64_t t0;        /* uv_hrtime() at dispatch, while some access log is on */
    uint64_t bytes_out; /* reply body bytes queued */
    uint32_t head_in;   /* HTTP/2: the head's bytes as HPACK counts them (HTTP/1.1: head.len) */
    int8_t alog;        /* 0: the server's default log, -1: none, k + 1: log k */
    uint8_t logged;     /* its line is written */
    ms_str_t route;     /* the name of the route that took it, pooled */
    /* The metrics' (metrics.c): */
    uint32_t route_ix; /* the route's index in the metrics (0: none) */
    uint8_t counted;   /* it is counted */
    ms_header_t hdr_inline[MS_HEADERS_INLINE];
};
_Static_assert(offsetof(ms_req_t, v) == 0, "an ms_req_t * is an ms_req_view_t * (Lua's view)");

/* -- Tunnels ----------------------------------------------------------------------------
 * A request taken over: after a 101 on HTTP/1.1, or on an HTTP/2 stream (an extended CONNECT,
 * RFC 8441), the bytes both ways belong to whoever took it (WebSocket, a raw request socket),
 * with no framing and no deadline of the core's. The request stays the taker's until it calls
 * ms_req_finish(), which ends the tunnel: on HTTP/1.1 the connection closes once what was
 * written has gone, on HTTP/2 the stream ends (END_STREAM). */
typedef struct ms_tunnel_s ms_tunnel_t;
struct ms_tunnel_s {
    /* Bytes from the peer, as they come; `p` is valid only during the call. */
    void (*on_data)(ms_tunnel_t *t, const char *p, size_t n);
    /* No more bytes will come: 0 when the peer ended its side, MS_ECLOSED when the connection
     * or the stream is gone. Called once. */
    void (*on_end)(ms_tunnel_t *t, int status);
    /* NULL, or the taker keeps the connection once the request finishes: on HTTP/1.1,
     * ms_req_finish() gives the protocol's state and the request back and calls this with
     * the connection, whose reference the handler held is the taker's from now on, and what
     * the client sent behind the head so far (valid only during the call). The taker then
     * speaks for the connection as its protocol (c->proto, c->pstate). */
    void (*on_handover)(ms_tunnel_t *t, ms_conn_t *c, const char *rest, size_t n);
    ms_req_t *req; /* set by ms_req_tunnel */
    void *data;    /* the taker's */
};

/* Takes `r` over: its head goes now (101 Switching Protocols on HTTP/1.1, 200 on HTTP/2, with
 * the fields set so far), then the peer's bytes go to `t`. On HTTP/1.1, bytes that came
 * behind the head come once the handler's call into the core has returned; on HTTP/2, DATA
 * that came before the call stays the request's body (ms_req_body_take). Returns MS_ESENT if
 * a reply has begun, MS_ECLOSED if the request is gone. */
int ms_req_tunnel(ms_req_t *r, ms_tunnel_t *t);
/* Whether a tunnel on `r` can keep the connection past the request (ms_tunnel_t.on_handover):
 * on HTTP/1.1, not on HTTP/2, where it is one stream among others. */
int ms_req_tunnel_handover(ms_req_t *r);
/* Queues bytes to the peer; `owner` and `anchor` as for ms_reply_write. */
int ms_tunnel_write(ms_tunnel_t *t, const char *p, size_t len, int owner, int32_t anchor);
/* Stops (0) or resumes (1) the peer's bytes: a taker that cannot keep up holds the peer back
 * (HTTP/1.1: the socket is not read; HTTP/2: the stream's window is not granted). */
void ms_tunnel_read(ms_tunnel_t *t, int on);

/* The client's address as text: the peer, or the address a PROXY header named, or, when
 * that is a trusted proxy, the first untrusted address of X-Forwarded-For from the right.
 * Returns its length. */
int ms_req_client_ip(ms_req_t *r, char *buf, size_t len);

/* The TLS version the request came over ("TLSv1.3"), or NULL over plain TCP. */
const char *ms_req_tls(ms_req_t *r);

/* Whether the peer is a trusted proxy, whose X-Forwarded-* fields may be believed. */
int ms_req_peer_trusted(ms_req_t *r);

/* Header lookup by lowercase name. Returns the first value or NULL. */
const ms_str_t *ms_req_header(ms_req_t *r, const char *name, size_t len);

/* Trailer lookup by lowercase name, once the body is whole. Returns the first value or NULL. */
const ms_str_t *ms_req_trailer(ms_req_t *r, const char *name, size_t len);

/* -- Replies ------------------------------------------------------------------------- */

/* Adds a reply field. Names must be tokens, values must not hold CR, LF or NUL.
 * content-length, transfer-encoding and date belong to the core (MS_ERESERVED);
 * "connection: close" asks the core to close after this reply. */
int ms_reply_header(ms_req_t *r, const char *name, size_t nlen, const char *value, size_t vlen);

/* Adds a trailer field, sent after a body streamed with ms_reply_write (HTTP/1.1: after the
 * last chunk; HTTP/2: a HEADERS frame after the last DATA, for any reply with a body).
 * Checked as ms_reply_header; fields that frame the message are MS_ERESERVED; MS_ESENT once
 * the reply is complete. */
int ms_reply_trailer(ms_req_t *r, const char *name, size_t nlen, const char *value, size_t vlen);

/* Adds whole field lines ("name: value\r\n"...), checked by ms_fields_check(): anything
 * else is MS_EBADHEADER and adds nothing. */
int ms_reply_field(ms_req_t *r, const char *line, size_t len);

/* 0 if `p` is whole field lines as a reply may carry them: "name: value\r\n"..., each name a
 * token, each value without CR, LF or NUL (what ms_reply_header checks of a name and value).
 * MS_EBADHEADER otherwise. */
int ms_fields_check(const char *p, size_t len);

/* Adds field lines that passed ms_fields_check() once and cannot change since (a constant,
 * lines checked when a mount or the framework's security fields were set up), without
 * checking them again. Anything that comes with a request goes through ms_reply_field. */
int ms_reply_fields_checked(ms_req_t *r, const char *lines, size_t len);

/* Forgets the fields added so far (an error page replaces the reply). MS_ESENT if too late. */
int ms_reply_reset(ms_req_t *r);

/* Sends the whole reply with `body`. If `anchor` is >= 0, body is a Lua string kept alive by
 * that slot until written; otherwise it is copied or static as `owner` says. Returns 0 or a
 * negative code. A request whose connection is gone accepts and drops the reply. */
int ms_reply_send(ms_req_t *r, const char *body, size_t len, int owner, int32_t anchor);

/* A reply of `total` bytes sent as a chain of pieces: ms_reply_begin() sends the head
 * (Content-Length: total), ms_reply_piece() queues each piece without joining them (copied
 * when small, referenced otherwise, as in ms_reply_send), ms_reply_end() completes it. Pieces
 * beyond `total` are MS_ETOOBIG; ending short of it cuts the connection (ms_req_fail). */
int ms_reply_begin(ms_req_t *r, uint64_t total);
int ms_reply_piece(ms_req_t *r, const char *p, size_t len, int owner, int32_t anchor);
int ms_reply_end(ms_req_t *r);
/* Ends a reply streamed with ms_reply_write before the handler ends (OpenResty's ngx.eof):
 * the body's end (and trailers) go out now. MS_ESENT when no head left yet or it is done. */
int ms_reply_close(ms_req_t *r);

/* Streams one piece of a reply of unknown length (chunked on HTTP/1.1). */
int ms_reply_write(ms_req_t *r, const char *chunk, size_t len, int owner, int32_t anchor);

/* True when so much of the reply is queued that the handler should wait (MS_WAIT_DRAIN). */
int ms_reply_congested(ms_req_t *r);

/* -- Request bodies ------------------------------------------------------------------ */

/* Takes the body bytes that have arrived. Returns their count (0 when none are there yet)
 * and points *out at them; they stay valid until the next call. Returns MS_ECLOSED if the
 * connection went away, MS_EBADREQ if the body was malformed. At the end of the body
 * (MS_REQ_BODY_DONE and nothing left) returns 0 with *out NULL. */
int64_t ms_req_body_take(ms_req_t *r, const char **out);

/* Asks for the handler to be resumed when more body bytes arrive; sends 100 Continue if the
 * client waits for it. Returns 0 (park now) or a negative code. */
int ms_req_wait_body(ms_req_t *r);
/* As ms_req_wait_body, and resumes the handler after `ms` milliseconds if nothing came
 * (ms_req_body_take then still says UV_EAGAIN). On HTTP/2 the stream's own body deadline
 * holds the request's timer: the wait is not timed there. */
int ms_req_wait_body_for(ms_req_t *r, uint64_t ms);

/* Sets how large this request's body may be (the route's limit), up to body_bytes_max.
 * Call it before reading the body. Returns 0 or MS_ETOOBIG (over body_bytes_max). */
int ms_req_body_limit(ms_req_t *r, uint64_t bytes);

/* Parks the handler for `ms` milliseconds. */
int ms_req_sleep(ms_req_t *r, uint64_t ms);

/* Asks for the handler to be resumed when the reply queue drains below its high-water mark,
 * or, with `all`, when everything queued is written. Returns 1 when there is nothing to
 * wait for, 0 (park now) or a negative code. */
int ms_req_wait_drain(ms_req_t *r, int all);

/* The handler is finished with the request: completes the reply if it is not (200 with an
 * empty body, or the last chunk), and lets the connection move on. `r` is invalid after. */
void ms_req_finish(ms_req_t *r);

/* The handler failed: a reply already under way is cut off and the connection closes;
 * call ms_req_finish() after. */
void ms_req_fail(ms_req_t *r);

/* Copies the head out of the shared read buffer into the request's pool, so that buffer can
 * serve other connections. The binding calls it when a handler yields; every wait
 * (ms_req_wait_body, ms_req_sleep, ms_req_wait_drain) calls it too. Idempotent. */
void ms_req_park(ms_req_t *r);

/* -- Anchors ------------------------------------------------------------------------- */

/* Lua strings referenced by queued writes are kept alive in a Lua table by slot number.
 * The core hands out slots and, when the write that used one completes, puts it on the
 * released list. The binding drains that list (clearing its table) before slots are reused. */
int32_t ms_anchor_get(ms_server_t *s);
int ms_anchor_drain(ms_server_t *s, int32_t *out, int n);

/* -- Server (one per worker) --------------------------------------------------------- */

typedef void (*ms_request_cb)(ms_req_t *r, void *data);

/* -- Wakes: waits that belong to no request ------------------------------------------
 * A coroutine that waits on something other than its request's body or reply (a sleep in a
 * timer, a hook or a light thread, a semaphore, a thread's end; next, a socket's read) is
 * parked by the binding on a slot, a small number it chooses. Whatever completes the wait
 * calls ms_wake(s, slot, status), and the server's event callback runs with them, under the
 * rules of a handler's resume (ms__server_call: calls back into the core are deferred until
 * the outermost call returns). A slot's timer (ms_wake_after) is that completion for time:
 * a sleep, a timeout, a wake on the next turn of the loop. Slot MS_WAKE_STOP (negative) is
 * the worker stopping. */
typedef struct ms_wake_s ms_wake_t;
typedef void (*ms_event_cb)(int32_t slot, int status, void *data);
#define MS_WAKE_STOP     (-1)
#define MS_WAKE_SLOT_MAX (1 << 24)

void ms_server_on_event(ms_server_t *s, ms_event_cb cb);
/* Calls the event callback with `slot` and `status`: now from the loop, or, while a call into
 * the handler (and so any call from Lua) or the socket engine's work is under way, once the
 * outermost of them returns; never inside them. A timer armed on the slot is void. */
void ms_wake(ms_server_t *s, int32_t slot, int status);
/* Wakes `slot` with `status` in `ms` milliseconds (0: the next turn of the loop), replacing
 * what its timer was armed for. Returns 0 or UV_EINVAL (a slot out of range). */
int ms_wake_after(ms_server_t *s, int32_t slot, uint64_t ms, int status);
/* Disarms the slot's timer, if armed. */
void ms_wake_cancel(ms_server_t *s, int32_t slot);

/* A worker's limits: one member for each line of MS_LIMITS (settings.h), in its order. */
typedef struct ms_limits_s {
#define MS_LIMIT_FIELD(key, field, type, dflt, unit, max, doc) type field;
    MS_LIMITS(MS_LIMIT_FIELD)
#undef MS_LIMIT_FIELD
} ms_limits_t;

/* Fills `l` with the defaults of MS_LIMITS. */
void ms_limits_default(ms_limits_t *l);

typedef struct ms_server_stats_s {
    uint64_t accepted, closed, requests, bad_requests;
    uint64_t refused_conns; /* over `connections` or `per_source` */
    uint64_t refused_busy;  /* 503 over `in_flight` */
    uint64_t timeouts;
    uint64_t conns;     /* open now */
    uint64_t in_flight; /* requests in handlers now */
} ms_server_stats_t;

/* Creates a worker's server on `loop`. `on_request` is called once per request (the one
 * crossing into the handler); `on_resume` when a parked handler's wait is over. */
ms_server_t *ms_server_new(uv_loop_t *loop, const ms_limits_t *limits, ms_request_cb on_request,
                           ms_request_cb on_resume, void *data);
/* Listener flags. */
enum {
    MS_LISTEN_PROXY = 1,         /* every connection starts with a PROXY protocol header */
    MS_LISTEN_REDIRECT_HTTPS = 2, /* every request is answered 308 to the same host and target
                                   * over https, on the port ms_server_https_port() set */
    MS_LISTEN_METRICS = 4         /* its requests carry MS_REQ_METRICS: the scrape's listener */
};

/* Listens on "HOST:PORT" ("127.0.0.1:8080", "[::1]:8080", ":8080"). SO_REUSEPORT is set
 * so that workers can share the port. Returns 0 or a negative code. */
int ms_server_listen(ms_server_t *s, const char *addr, int backlog, int flags);
/* Serves on an already listening socket (a worker's, inherited from the master). */
int ms_server_listen_fd(ms_server_t *s, int fd, int flags);
/* -- TLS ------------------------------------------------------------------------------
 * A TLS listener's settings (tls.c, OpenSSL 3): TLS 1.2 and 1.3 only, ALPN choosing h2 or
 * http/1.1, a default certificate and one per server name (SNI). Certificates and keys come
 * as PEM bytes in memory, never as paths, so that whoever reads the files (today the
 * worker, later the master) hands them over. */
typedef struct ms_tls_s ms_tls_t;

typedef struct ms_tls_opts_s {
    const char *ciphers;      /* TLS 1.2 cipher list (OpenSSL's syntax); NULL: MS_TLS_CIPHERS */
    const char *ciphersuites; /* TLS 1.3 suites; NULL: MS_TLS_CIPHERSUITES */
    const char *groups;       /* key exchange groups; NULL: MS_TLS_GROUPS */
    int refuse_unknown;       /* a server name no certificate has: 1 refuses the handshake
                               * (unrecognized_name), 0 answers with the default certificate */
    int no_ktls;              /* 1: no kernel TLS on this listener even where it is offered */
} ms_tls_opts_t;

/* The defaults: Mozilla's "intermediate" profile (TLS 1.2 with ECDHE and DHE AEAD ciphers,
 * TLS 1.3's three suites, X25519, P-256 and P-384). */
#define MS_TLS_CIPHERS                                                                             \
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"     \
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:"       \
    "DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384:DHE-RSA-CHACHA20-POLY1305"
#define MS_TLS_CIPHERSUITES "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
#define MS_TLS_GROUPS       "X25519:P-256:P-384"

/* Session tickets are encrypted with keys from the zone behind `fd` (the master's, over its
 * channel: core.master_tickets), so that any worker resumes a session, and after a reload.
 * A process given none makes its own at its first TLS setting, and a new one every
 * ms_tls_ticket_rotate() seconds (MS_TLS_TICKET_ROTATE by default); the two keys before the
 * newest still resume. Returns 0 or a negative code. */
int ms_tls_tickets(int fd);
void ms_tls_ticket_rotate(double seconds);

/* Whether the kernel and OpenSSL offer kernel TLS (the kernel encrypts what is written to a
 * TLS connection's socket once the handshake is done, so that files go out with sendfile):
 * 1, or 0 with why not in `*why` (static text; may be NULL). Tried once per process, on a
 * loopback TCP connection of its own (TCP_ULP "tls", which also loads the kernel's module
 * for a process that may). */
int ms_tls_kernel(const char **why);
#define MS_TLS_TICKET_ROTATE 3600

/* Makes TLS settings for listeners of `s`, which owns them (freed with the server). Returns
 * NULL when an option is refused, with why in `err`. */
ms_tls_t *ms_tls_new(ms_server_t *s, const ms_tls_opts_t *o, char *err, size_t errlen);
/* Adds a certificate (its chain: the leaf first, then intermediates) and its private key,
 * both PEM, for the server name `name` ("example.com", "*.example.com"), or with `name` NULL
 * the default one. A name may have one RSA and one ECDSA certificate; the handshake takes the
 * one the client can use. Returns 0, or UV_EINVAL with why in `err`. */
int ms_tls_cert(ms_tls_t *t, const char *name, const char *cert, size_t cert_len,
                const char *key, size_t key_len, char *err, size_t errlen);
/* Staples the OCSP response `der` (DER, as `openssl ocsp -respout` writes it) to handshakes
 * that send the certificate `cert` (PEM: the leaf, then its issuer) to a client that asks for
 * its status, until the response's next update. The response must be a successful one, for
 * that certificate, saying it is good: else UV_EINVAL with why in `err`. One that is not
 * current is kept but never stapled (a warning says so). */
int ms_tls_staple(ms_tls_t *t, const char *cert, size_t cert_len, const char *der,
                  size_t der_len, char *err, size_t errlen);
/* The certificate hook: every full handshake of a listener with `t` pauses once OpenSSL has
 * read the ClientHello (after SNI chose the name's certificates), and the server's event
 * callback is woken on `slot` (ms_wake: at once when no call into Lua is under way). The
 * binding takes each waiting handshake with ms_tls_hook_next, may change its certificates
 * through OpenSSL on ms_tls_hook_ssl's SSL, and ends the call with ms_tls_hook_done: the
 * handshake goes on (ok) or fails. The handshake's deadline (handshake_timeout) runs on. */
typedef struct ms_tls_hook_s ms_tls_hook_t;
void ms_tls_cert_hook(ms_tls_t *t, int32_t slot);
/* The next handshake waiting for its hook, or NULL; the caller holds it until
 * ms_tls_hook_done, which must come (the connection may be gone by then). */
ms_tls_hook_t *ms_tls_hook_next(ms_server_t *s);
void ms_tls_hook_done(ms_tls_hook_t *h, int ok);
/* The handshake's SSL (an `SSL *`), or NULL once its connection is gone or the call is done. */
struct ssl_st *ms_tls_hook_ssl(ms_tls_hook_t *h);
/* Its connection, or NULL likewise (for its addresses). */
ms_conn_t *ms_tls_hook_conn(ms_tls_hook_t *h);
/* The port MS_LISTEN_REDIRECT_HTTPS listeners send clients to (443, the default, is left out
 * of the URL). */
void ms_server_https_port(ms_server_t *s, int port);
/* Makes the listener added last to `s` a TLS one with `t`. Returns 0, or UV_EINVAL when `s`
 * has no listener or `t` no default certificate. */
int ms_server_listen_tls(ms_server_t *s, ms_tls_t *t);

/* Trusts a proxy address range ("10.0.0.0/8", "::1"): X-Forwarded-For from it is believed,
 * and its connections are not capped as one source. Returns 0 or UV_EINVAL. */
int ms_server_trust(ms_server_t *s, const char *cidr);
/* A listening TCP socket for "HOST:PORT" with SO_REUSEPORT; `port` >= 0 overrides the
 * address's port. Returns the fd or a negative code. */
int ms_listen_fd(const char *addr, int backlog, int port);
/* The local port of a socket. */
int ms_fd_port(int fd);
/* The port actually bound by the last listen (useful with port 0). */
int ms_server_port(ms_server_t *s);
/* Answers GET and HEAD of `livez` with 200 while the process serves, and of `readyz` with 200
 * until it stops, then 503, unless the stop hands over to a new worker (a reload: the service
 * stays ready). Before any static mount or handler; NULL or "" turns a path off. */
void ms_server_health(ms_server_t *s, const char *livez, const char *readyz);
/* The bodies of the core's own refusals (400, 403, 408, 413, 414, 431, 503) in place of its
 * text ("413 Content Too Large\n"), for an API that answers in JSON or a site in HTML: a body of
 * `kind` MS_REFUSAL_TEXT (text/plain), MS_REFUSAL_JSON (application/json) or MS_REFUSAL_HTML
 * (text/html), at most MS_REFUSAL_BODY_MAX bytes, set once at start (its bytes are sent by
 * reference). A refusal answers with the JSON body when the request's Accept names
 * application/json or a +json type, the HTML one when it names text/html (whichever comes
 * first), else the text, else the first given of JSON and HTML. Returns 0, UV_EINVAL (a
 * status the core does not refuse with, an unknown kind, a body too large) or UV_EEXIST. */
enum { MS_REFUSAL_TEXT, MS_REFUSAL_JSON, MS_REFUSAL_HTML };
#define MS_REFUSAL_BODY_MAX 16384
int ms_server_refusal_body(ms_server_t *s, int status, int kind, const char *body, size_t len);
/* Marks the coming stop as a handover to a new worker (readyz stays 200). */
void ms_server_handing_over(ms_server_t *s);
/* Stops accepting, closes idle connections, lets in-flight requests finish. `done` runs when
 * no connection is left. The same as ms_server_drain with no delay. */
void ms_server_stop(ms_server_t *s, void (*done)(ms_server_t *s));
/* Drains: from now on readyz answers 503, replies say "connection: close", HTTP/2 connections
 * get GOAWAY, WebSockets close 1001, event streams end (ms_server_stopping); the listeners
 * still accept for `delay_ms`, then close (`accept_closed` runs, may be NULL); a connection
 * waiting for its next request gets its grace from then. `done` runs when no connection is
 * left. A second call, or one after ms_server_stop, does nothing. */
void ms_server_drain(ms_server_t *s, uint32_t delay_ms, void (*accept_closed)(ms_server_t *s),
                     void (*done)(ms_server_t *s));
/* Ends a drain's delay now (the listeners close, as when it runs out); returns 1, or 0 when
 * no delay is running (no drain, or its delay is over). */
int ms_server_drain_now(ms_server_t *s);
/* Frees the server; the loop must have run until `done` was called. */
void ms_server_free(ms_server_t *s);
uv_loop_t *ms_server_loop(ms_server_t *s);
/* Whether the server is stopping: long-lived replies (event streams) should end. */
int ms_server_stopping(ms_server_t *s);
const ms_server_stats_t *ms_server_stats(ms_server_t *s);

/* The logger: one line per event, to stderr unless replaced. */
typedef void (*ms_log_fn)(int level, const char *msg, size_t len);
enum { MS_LOG_ERR, MS_LOG_WARN, MS_LOG_INFO, MS_LOG_DEBUG };
/* Lines above `level` are dropped; a level outside MS_LOG_ERR..MS_LOG_DEBUG is taken as the
 * nearest one. ms_log() logs a line of an unknown level as MS_LOG_ERR. */
void ms_log_set(ms_log_fn fn, int level);
/* The level ms_log_set set last: lines above it are dropped. */
int ms_log_level(void);
/* `fn` also sees every line the log keeps (after the level's filter), NULL none: an
 * in-process test client hands a request's lines to its spec. Called on the loop's thread. */
void ms_log_tap(ms_log_fn fn);
void ms_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Logs `msg` as it is (no format: a NUL in it is a byte like any other), as ms_log's lines. */
void ms_log_msg(int level, const char *msg, size_t len);
/* Logs to a file (appending) instead of stderr; NULL goes back to stderr. */
int ms_log_open(const char *path);
/* Reopens the log file (after rotation: SIGUSR1). */
int ms_log_reopen(void);
/* Lines as JSON objects ({"time", "level", "pid", "msg"}) instead of text. */
void ms_log_format(int json);

/* -- Connections without sockets ---------------------------------------------------------
 * The engine is transport-agnostic: a connection writes through an ms_io_t. The server
 * uses libuv TCP; tests, fuzzers and benchmarks use a memory transport and feed bytes. */

/* A transport: what carries a connection's bytes (plain TCP in tcp.c, memory in memio.c; TLS
 * wraps one). The engine above it never touches a socket. */
typedef struct ms_io_s {
    /* Writes what it can now: returns bytes written, UV_EAGAIN, or a negative code. */
    int (*try_write)(ms_conn_t *c, const uv_buf_t *bufs, unsigned n);
    /* Writes all of it later, then calls ms_conn_write_done(c, status). */
    int (*write)(ms_conn_t *c, const uv_buf_t *bufs, unsigned n);
    /* Sends up to `len` bytes of the file `fd` from `off` straight from the kernel (TLS:
     * through a buffer of its own): returns bytes sent, 0 at the end of the file, UV_EAGAIN,
     * or a negative code. NULL when the transport has no such thing: files are then read into
     * a buffer and written. */
    ssize_t (*sendfile)(ms_conn_t *c, int fd, uint64_t off, size_t len);
    /* Holds partial segments back while on (a head and the file after it leave in full
     * segments), and sends them when off. May be NULL. */
    void (*cork)(ms_conn_t *c, int on);
    /* Reading: bytes come in through ms_conn_read_buf() and ms_conn_feed(), the end of them
     * through ms_conn_eof(). */
    void (*read_stop)(ms_conn_t *c);
    void (*read_start)(ms_conn_t *c);
    /* Ends the connection once what was written has gone (TCP: FIN, not a reset that could
     * destroy the last reply), then closes. May be NULL: close instead. */
    void (*shutdown)(ms_conn_t *c);
    /* Closes the transport now; once it is closed it calls ms_conn_closed(c). */
    void (*close)(ms_conn_t *c);
    /* Writes the peer's address as text, for log lines. May be NULL. */
    void (*peer)(ms_conn_t *c, char *buf, size_t len);
    /* Writes the transport's own address (`local`) or its peer's as text, and returns its
     * port, or -1 when it has none (the buffer is then ""). May be NULL. */
    int (*address)(ms_conn_t *c, int local, char *buf, size_t len);
    /* The protocol the transport agreed with the peer (TLS ALPN: "h2", "http/1.1"), which
     * the accept stage takes; NULL, or a NULL function, when it agreed none. */
    const char *(*alpn)(ms_conn_t *c);
    /* The TLS version the connection speaks ("TLSv1.3"), which makes its requests https;
     * NULL, or a NULL function, for a transport that is not TLS. */
    const char *(*tls)(ms_conn_t *c);
    /* The descriptor of the socket under the transport (kernel TLS takes it over), or -1.
     * May be NULL: it has none. */
    int (*fd)(ms_conn_t *c);
    /* Whether the transport holds bytes from the peer it has not handed up yet (TLS: a
     * record OpenSSL has decrypted, SSL_pending). May be NULL: it holds none. */
    int (*pending)(ms_conn_t *c);
} ms_io_t;

/* Creates a connection on `io`; `extra` bytes follow the ms_conn_t for the transport. */
ms_conn_t *ms_conn_new(ms_server_t *s, const ms_io_t *io, size_t extra);
/* Bytes from the peer. `data` may be the worker's shared buffer: the engine copies out
 * whatever it still needs before returning. */
void ms_conn_feed(ms_conn_t *c, const char *data, size_t len);
/* The peer closed its side (or an error): nread < 0 from libuv. */
void ms_conn_eof(ms_conn_t *c, int err);
void ms_conn_write_done(ms_conn_t *c, int status);
void ms_conn_closed(ms_conn_t *c);
/* For transports: the buffer to read into next (the connection's own when it holds a
 * partial head, else the worker's shared one). */
void ms_conn_read_buf(ms_conn_t *c, uv_buf_t *buf);
/* The transport's extra bytes. */
void *ms_conn_io_data(ms_conn_t *c);
ms_server_t *ms_conn_server(ms_conn_t *c);
/* The peer's address as text ("" when the transport cannot tell). */
void ms_conn_peer(ms_conn_t *c, char *buf, size_t len);
/* The transport's own address (`local`) or its peer's, as text in `buf`; returns the port,
 * or -1 when the transport has none. The peer here is the socket's, not a PROXY header's. */
int ms_conn_address(ms_conn_t *c, int local, char *buf, size_t len);

#endif
