/* sock.h: outbound TCP and UDP sockets, connection pools and name resolution on a worker's
 * loop, with OpenResty's cosocket semantics (ngx.socket.tcp, ngx.socket.udp). */
#ifndef MS_SOCK_H
#define MS_SOCK_H

#include <netinet/in.h>

#include "moonserve.h"

/* -- Errors -----------------------------------------------------------------------------
 * Operations return a negative UV_E* code or one of these. ms_sock_strerror() gives the text
 * OpenResty returns: UV_ETIMEDOUT is "timeout", UV_EOF (and any use of a socket that is not
 * connected) is "closed", UV_ECONNREFUSED "connection refused", and so on. */
#define MS_SOCK_ERRORS(X)                                                                          \
    X(EBUSY_READ, -10101, "socket busy reading")                                                   \
    X(EBUSY_WRITE, -10102, "socket busy writing")                                                  \
    X(EBUSY_CONNECT, -10103, "socket busy connecting")                                             \
    X(EBACKLOG, -10104, "too many waiting connect operations")                                     \
    X(EUNREAD, -10105, "unread data in buffer")                                                    \
    X(ENOTFOUND, -10106, "could not be resolved (3: Host not found)")                              \
    X(ERESOLVE, -10107, "could not be resolved (2: Server failure)")                               \
    X(ESSL, -10108, "handshake failed")                                                            \
    X(EHOST, -10109, "certificate host mismatch")                                                  \
    X(EVERIFY, -10110, "certificate verify failed")                                                \
    X(ETLSPOOL, -10111, "pooled connection was set up with other TLS options")

enum {
#define MS_SOCK_ERR_ENUM(name, value, msg) MS_SOCK_##name = (value),
    MS_SOCK_ERRORS(MS_SOCK_ERR_ENUM)
#undef MS_SOCK_ERR_ENUM
};

/* OpenResty's error string for a code. For the two resolution errors it lacks the name:
 * ms_sock_errmsg() writes the whole "<name> could not be resolved (...)"; for EVERIFY it
 * writes OpenResty's "<code>: <reason>" ("20: unable to get local issuer certificate"). */
const char *ms_sock_strerror(int err);

/* -- Configuration (per worker) --------------------------------------------------------- */

typedef struct ms_sock_config_s {
    uint32_t connect_timeout, send_timeout, read_timeout; /* ms; a new socket's; 0: none */
    uint32_t keepalive_timeout; /* ms an idle pooled connection is kept; 0: forever */
    uint32_t pool_size;         /* idle connections per pool, unless connect or
                                 * setkeepalive names a size */
    /* getaddrinfo tells no TTL: an answer is kept this long, a failure this long. */
    uint32_t resolve_ttl, resolve_negative_ttl; /* ms */
    uint32_t resolve_max;       /* lookups in flight on libuv's thread pool; the rest queue */
    uint32_t resolve_cache_max; /* names kept */
} ms_sock_config_t;

/* The configuration of the default limits (core/base/settings.h: socket_*, resolver_*). */
void ms_sock_config_default(ms_sock_config_t *cfg);
/* Sets the worker's configuration (NULL: what the server's limits say, as at first use).
 * Sockets made after take it. resolve_max is kept below libuv's thread pool's size. */
void ms_sock_config(ms_server_t *s, const ms_sock_config_t *cfg);

/* -- Results ----------------------------------------------------------------------------
 * Every operation that may wait takes a callback and returns MS_SOCK_DONE (finished now),
 * MS_SOCK_PENDING (the callback will be called exactly once, with what the call would have
 * returned: MS_SOCK_DONE, MS_SOCK_END or a negative code) or a negative code (the callback
 * is never called). The callback is not called from inside the call that started it. */
enum { MS_SOCK_PENDING = 0, MS_SOCK_DONE = 1, MS_SOCK_END = 2 /* receiveuntil(size): nil */ };

/* What the binding reads straight through the FFI. */
typedef struct ms_sock_view_s {
    /* The last read's data, or on a read error the partial data (OpenResty's third return
     * value). Points into the socket's buffer: valid until the next read on this socket,
     * ms_sock_connect or ms_sock_free. */
    const char *data;
    size_t len;
    uint32_t reused;   /* getreusedtimes(): how often the connection came from the pool */
    int32_t slot;      /* free for the binding */
    uint8_t connected; /* a connection is established (and not closed, not pooled) */
} ms_sock_view_t;

/* -- TCP (and stream unix) sockets ------------------------------------------------------- */

typedef struct ms_sock_s ms_sock_t;
typedef void (*ms_sock_cb)(ms_sock_t *s, int status);

/* A socket of the worker `srv`, not connected. It owns its connection while connected;
 * ms_sock_setkeepalive hands that to the pool and the socket may connect again. */
ms_sock_t *ms_sock_new(ms_server_t *srv);
/* Closes a connection it holds and frees the socket. Callbacks under way are not called. */
void ms_sock_free(ms_sock_t *s);
ms_sock_view_t *ms_sock_view(ms_sock_t *s);

/* settimeouts(connect, send, read), in ms; 0: no deadline; MS_SOCK_TIMEOUT_DEFAULT: the
 * worker's configured one (socket_*_timeout). settimeout(ms) sets all three. */
#define MS_SOCK_TIMEOUT_DEFAULT UINT32_MAX
void ms_sock_settimeouts(ms_sock_t *s, uint32_t connect_ms, uint32_t send_ms, uint32_t read_ms);

typedef struct ms_sock_opts_s {
    const char *pool; /* the pool's name; NULL: "host:port" (or the "unix:" path) */
    size_t pool_len;
    uint32_t pool_size; /* 0: the configured one */
    uint32_t backlog;   /* > 0: at most pool_size connections of this pool are open at once,
                         * and up to `backlog` connects wait for one (then MS_SOCK_EBACKLOG);
                         * a connect waits at most the connect timeout */
    uint8_t fresh;      /* a new connection, not an idle one of the pool (sslhandshake's
                         * MS_SOCK_ETLSPOOL) */
} ms_sock_opts_t;

/* Connects to `host` (an IPv4 or IPv6 address, a name to resolve, or "unix:/path", where
 * `port` is ignored). A connected socket is closed first. An idle connection of the pool is
 * taken first: then it returns MS_SOCK_DONE at once. */
int ms_sock_connect(ms_sock_t *s, const char *host, size_t host_len, int port,
                    const ms_sock_opts_t *opts, ms_sock_cb cb);

/* Sends the buffers gathered, without joining them. Their bytes must stay valid until the
 * callback (or the return, when it is MS_SOCK_DONE). Any error closes the socket. */
int ms_sock_send(ms_sock_t *s, const uv_buf_t *bufs, unsigned n, ms_sock_cb cb);

enum {
    MS_SOCK_LINE,  /* "*l": a line, without the LF, every CR dropped */
    MS_SOCK_ALL,   /* "*a": until the peer closes (which is then not an error) */
    MS_SOCK_BYTES, /* n bytes */
    MS_SOCK_ANY    /* receiveany(n): what has come, at most n bytes, once there is any */
};
/* Reads by `pattern`; the data is in the view. A read timeout leaves the socket usable, any
 * other error closes it; either way the view holds the partial data, which is consumed. */
int ms_sock_receive(ms_sock_t *s, int pattern, size_t n, ms_sock_cb cb);

/* receiveuntil(pattern[, { inclusive = true }]): the pattern matcher of match.h, right across
 * reads. Without a size each call returns the data before the next occurrence (with it when
 * inclusive). With a size each call returns `size` bytes while at least that many come before
 * the pattern, then the rest before it, fewer than `size` and possibly none (with the pattern
 * when inclusive), and the call after that returns MS_SOCK_END (OpenResty's nil, nil, nil),
 * after which the iterator starts over: lua-nginx-module's pieces exactly. May be shared
 * with other reads of the socket; the pattern is copied. */
typedef struct ms_sock_until_s ms_sock_until_t;
ms_sock_until_t *ms_sock_until_new(const char *pattern, size_t len, int inclusive);
void ms_sock_until_free(ms_sock_until_t *u);
int ms_sock_receiveuntil(ms_sock_t *s, ms_sock_until_t *u, size_t size, ms_sock_cb cb);

/* Puts the connection in its pool, idle for `idle_ms` (< 0: the configured time; 0: no
 * expiry); `pool_size` > 0 sizes a pool that connect did not size. Refused while a read or
 * a write is under way, or with unread bytes (MS_SOCK_EUNREAD). A connection its peer has
 * already closed is closed instead. Returns MS_SOCK_DONE or a negative code. */
int ms_sock_setkeepalive(ms_sock_t *s, int64_t idle_ms, uint32_t pool_size);

/* Closes the connection; a read, write or connect under way completes now with "closed".
 * Returns MS_SOCK_DONE, or UV_ENOTCONN when there was none. */
int ms_sock_close(ms_sock_t *s);

/* The connected socket's descriptor, for setsockopt (setoption), or UV_ENOTCONN. */
int ms_sock_fd(ms_sock_t *s);

/* Writes OpenResty's message for `err` as this socket met it (with the name that could not
 * be resolved) into buf; returns its length. */
int ms_sock_errmsg(ms_sock_t *s, int err, char *buf, size_t len);

/* -- TLS (tls_client.c) ------------------------------------------------------------------
 * sslhandshake on a connected socket, OpenSSL driven by the socket's reads and writes on the
 * loop. The TLS state belongs to the connection: setkeepalive pools it with it, and a pooled
 * connection handed out again needs no handshake (ms_sock_sslhandshake returns at once). */

/* A session to resume: reference-counted; the connection that made it updates it when the
 * server sends a ticket after the handshake, as TLS 1.3 servers do. */
typedef struct ms_tls_session_s ms_tls_session_t;
void ms_tls_session_free(ms_tls_session_t *sess); /* drops one reference */

typedef struct ms_sock_tls_opts_s {
    const char *name; /* sent as SNI (unless an address) and, with verify, checked against the
                       * certificate; NULL: neither */
    size_t name_len;
    int verify;                /* the chain against the trusted CAs, and the name */
    int ocsp;                  /* ask for a stapled OCSP response (send_status_req) */
    ms_tls_session_t *session; /* to resume; NULL: a full handshake */
} ms_sock_tls_opts_t;

/* Handshakes within the connect timeout (UV_ETIMEDOUT). Fails with MS_SOCK_ESSL, EHOST or
 * EVERIFY and closes the socket; MS_SOCK_EUNREAD with plaintext bytes still unread. On a
 * connection from the pool, already through its handshake, returns MS_SOCK_DONE at once when
 * that handshake was asked for the same name, verification, trusted CAs and client
 * certificate; else closes it and returns MS_SOCK_ETLSPOOL: the caller connects anew with
 * `fresh` set (moonserve.socket does) and handshakes on that. */
int ms_sock_sslhandshake(ms_sock_t *s, const ms_sock_tls_opts_t *o, ms_sock_cb cb);
/* The connection's session (a new reference), or NULL when it speaks no TLS. */
ms_tls_session_t *ms_sock_tls_session(ms_sock_t *s);
/* The protocol and cipher, and whether the session was resumed (0 or 1); UV_ENOTCONN
 * without TLS. The strings are static. */
int ms_sock_tls_info(ms_sock_t *s, const char **version, const char **cipher);
/* The certificate chain (PEM, leaf first) and key the next handshakes present when the server
 * asks; cert NULL: none. Returns 0, or UV_EINVAL with the reason in `err`. */
int ms_sock_setclientcert(ms_sock_t *s, const char *cert, size_t cert_len, const char *key,
                          size_t key_len, char *err, size_t errlen);
/* Trusts the CA certificates of a PEM file too, besides the system's store, for the worker's
 * handshakes that verify (OpenResty's lua_ssl_trusted_certificate). Returns 0, or a negative
 * code with the reason in `err`. */
int ms_sock_tls_trust(ms_server_t *srv, const char *file, char *err, size_t errlen);

/* -- Name resolution ---------------------------------------------------------------------
 * uv_getaddrinfo on libuv's thread pool, at most resolve_max lookups at once (the threads
 * also do file work), one lookup per name however many ask, answers cached per worker. */
#define MS_RESOLVE_ADDRS 8
#define MS_HOST_MAX      255

typedef union ms_addr_u {
    struct sockaddr sa;
    struct sockaddr_in in;
    struct sockaddr_in6 in6;
} ms_addr_t;

typedef struct ms_resolve_s ms_resolve_t;
typedef void (*ms_resolve_cb)(ms_resolve_t *r, int status);
struct ms_resolve_s {
    ms_addr_t addrs[MS_RESOLVE_ADDRS]; /* the answer, each with `port` */
    int naddrs;
    uint16_t port;
    ms_resolve_cb cb;
    void *data;                 /* the caller's */
    struct ms_lookup_s *lookup; /* while waiting */
    ms_resolve_t *next;         /* in the lookup's waiters */
    char name[MS_HOST_MAX + 1];
};

/* Resolves `name` (an address literal is taken as it is). Returns MS_SOCK_DONE (a literal or
 * a cached answer), MS_SOCK_PENDING, or a negative code (MS_SOCK_ENOTFOUND, a cached
 * failure). */
int ms_resolve(ms_server_t *srv, ms_resolve_t *r, const char *name, size_t len, int port,
               ms_resolve_cb cb);
/* Stops waiting; the callback is not called. */
void ms_resolve_cancel(ms_resolve_t *r);

/* -- UDP --------------------------------------------------------------------------------- */

typedef struct ms_udp_s ms_udp_t;
typedef void (*ms_udp_cb)(ms_udp_t *u, int status);

ms_udp_t *ms_udp_new(ms_server_t *srv);
void ms_udp_free(ms_udp_t *u);
ms_sock_view_t *ms_udp_view(ms_udp_t *u);
/* The timeout of a send or receive, in ms, as ms_sock_settimeouts takes it. */
void ms_udp_settimeout(ms_udp_t *u, uint32_t ms);
/* Binds the socket to one peer (a name is resolved, within the timeout). */
int ms_udp_setpeername(ms_udp_t *u, const char *host, size_t host_len, int port, ms_udp_cb cb);
/* Sends one datagram of the gathered buffers, now. Returns MS_SOCK_DONE or a negative code. */
int ms_udp_send(ms_udp_t *u, const uv_buf_t *bufs, unsigned n);
/* Receives one datagram of at most `size` bytes (0: 8192, at most 65536) into the view. */
int ms_udp_receive(ms_udp_t *u, size_t size, ms_udp_cb cb);
int ms_udp_close(ms_udp_t *u);

/* -- The worker's ------------------------------------------------------------------------ */

/* Closes the pools' connections and frees the worker's pools, cache and lists; every socket
 * must have been freed. Called by ms_server_free. */
void ms__sockets_free(ms_server_t *srv);

#endif
