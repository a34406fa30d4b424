/* engine.h: the engine's structures and functions, shared with the layers above it (ms__
 * prefix): connections, reply queues, protocols, transports, the server, the table of parts. */
#ifndef MS_ENGINE_H
#define MS_ENGINE_H

#include <assert.h>
#include <llhttp.h>
#include <sys/socket.h>
#include <string.h>

#include "moonserve.h"
#include "base/addr.h"
#include "base/date.h"
#include "base/timer.h"
#include "base/util.h"
#include "process/metrics.h"

/* The worker's shared read buffer: big enough for a burst of pipelined requests. */
#define MS_READ_BUF_SIZE (64 * 1024)
/* A connection's own buffer for a partial head starts here and doubles up to the head cap. */
#define MS_CONN_BUF_MIN 2048
/* Bodies up to this size are copied next to the reply head, so both leave as one piece;
 * larger ones are referenced. */
#define MS_COPY_BODY_MAX 1024
/* Reply bytes queued past this make the handler wait for the socket to drain. */
#define MS_OUT_HIGH_WATER (256 * 1024)
/* Unread request body past this stops reading from the socket until the handler reads. */
#define MS_BODY_HIGH_WATER (256 * 1024)
/* Extensions on one chunk-size line: more is refused (400), as nobody needs them. */
#define MS_CHUNK_EXT_MAX 4096
/* How long a stopping server waits for the next request on a keep-alive connection. */
#define MS_STOP_GRACE_MS 1000
/* A file piece that cannot go out with sendfile now is read in parts of this size into a
 * buffer that is the connection's only while the part is being written. */
#define MS_FILE_CHUNK (16 * 1024)
/* ... or of this size on a corked socket, where a part only has to say when there is room. */
#define MS_FILE_PROBE 1024
/* File bytes one connection sends in one go; past this it lets the other connections run. */
#define MS_FILE_BURST (1024 * 1024)
/* One reply queue: text (heads, chunk framing, small bodies) in `buf`, pieces in `vecs`. */
struct ms_out_s {
    ms_out_t *next_free;
    ms_buf_t buf;
    ms_vec_t *vecs;
    uv_buf_t *iov; /* scratch for the write: as long as vecs */
    uint32_t nvecs, cap;
    uint32_t held;      /* vecs that hold a Lua string or a file, to let go once written */
    uint32_t pos;       /* the first vec not wholly written */
    size_t pos_off;     /* bytes of it written */
    size_t bytes;       /* queued and not yet written */
    size_t async_bytes; /* handed to io->write and not yet done */
    char *chunk;        /* MS_FILE_CHUNK bytes of a file being written, while they are */
};

/* A file that reply pieces refer to (MS_VEC_FILE): its descriptor, or its bytes when its
 * owner holds them in memory. A queued piece holds a reference and gives it back with
 * `release` once written, so the reply queue knows no owner of files (the static file
 * cache, http/static/static.c, is one). */
typedef struct ms_file_s ms_file_t;
struct ms_file_s {
    int fd;       /* open read-only; -1 for bytes held in `data` only */
    uint32_t refs;
    char *data;   /* the whole file, or NULL: read it from `fd` */
    void (*release)(ms_server_t *s, ms_file_t *f); /* gives one reference back */
};

enum {
    MS_CONN_CLOSING = 1 << 0,  /* no more reading; close once the output is written */
    MS_CONN_CLOSED = 1 << 1,   /* the transport is closed or closing */
    MS_CONN_IN_FEED = 1 << 2,  /* inside ms_conn_feed: flush at its end */
    MS_CONN_READ_OFF = 1 << 3, /* reading stopped for backpressure */
    MS_CONN_PROXY = 1 << 4,    /* a PROXY protocol header must come first */
    MS_CONN_WRITING = 1 << 5,  /* io->write is under way with part of `flight` */
    MS_CONN_CORKED = 1 << 6,   /* io->cork is on while a file goes out */
    MS_CONN_DEFERRED = 1 << 7, /* in the worker's deferred list */
    MS_CONN_REDIRECT = 1 << 8, /* on a MS_LISTEN_REDIRECT_HTTPS listener */
    MS_CONN_METRICS = 1 << 9,  /* on a MS_LISTEN_METRICS listener */
    MS_CONN_NONE = 1 << 10     /* an accept that found nothing: neither accepted nor closed */
};

/* A protocol a connection speaks (h1.c, h2.c), chosen by the accept stage (accept.c). The
 * connection layer (conn.c), the request API (req.c) and the server (server.c) reach a
 * protocol only through its table, so none of them knows a protocol's state or framing. */
typedef struct ms_proto_s {
    const char *name;
    uint8_t counted_as; /* where the metrics count its connections: 1 HTTP/1.1, 2 HTTP/2; 0 none */
    /* -- The connection's side. */
    /* Where the next read goes: the protocol's own buffer when it keeps bytes between reads
     * (a partial head); NULL for the worker's shared buffer. */
    void (*read_buf)(ms_conn_t *c, uv_buf_t *buf);
    void (*feed)(ms_conn_t *c, const char *data, size_t len);
    void (*eof)(ms_conn_t *c); /* the peer shut its sending side */
    /* Writes what is queued now, the protocol's own frames first (a background write is done,
     * or the socket has room again). */
    void (*write)(ms_conn_t *c);
    /* Points the connection's timer at what the protocol waits for (ms__conn_rearm has
     * handled a reply the socket has not taken). */
    void (*rearm)(ms_conn_t *c);
    void (*timeout)(ms_conn_t *c, int phase);
    void (*drain_check)(ms_conn_t *c); /* the reply queue shrank: wake who waits for it */
    void (*resume)(ms_conn_t *c);      /* work deferred while a handler called into the core */
    void (*stop)(ms_conn_t *c);        /* the server stops: finish what is under way */
    void (*abort)(ms_conn_t *c); /* the transport closes: handlers learn their requests are gone */
    void (*free)(ms_server_t *s, void *pstate);
    /* -- The request's side. */
    /* Queues the reply head. `clen`: the body's length, -1 unknown, -2 a status without one. */
    void (*reply_head)(ms_req_t *r, int64_t clen);
    ms_out_t *(*out)(ms_req_t *r); /* where the reply's body pieces queue */
    /* A piece of a body of unknown length (HTTP/1.1 frames it as a chunk). */
    void (*body_piece)(ms_req_t *r, const char *p, size_t len, int owner, int32_t anchor);
    void (*body_end)(ms_req_t *r);      /* the end of such a body, with the reply's trailers */
    void (*send_continue)(ms_req_t *r); /* 100 Continue: the client may send its body */
    void (*flush)(ms_conn_t *c);        /* writes the replies made outside a read */
    void (*finished)(ms_req_t *r);      /* the handler let go of the request */
    void (*fail)(ms_req_t *r);          /* a reply cut short: it must not look complete */
    /* The core answers in the handler's place (ms__req_refuse logged it): a reply with
     * ms__refusal_body unless one has begun, and no more of the request is read. */
    void (*refuse)(ms_req_t *r, int status);
    void (*body_taken)(ms_req_t *r, size_t n); /* the handler took body bytes: room for more */
    void (*body_wait)(ms_req_t *r);            /* the handler waits for body bytes */
    size_t (*queued)(ms_req_t *r);             /* reply bytes of `r` not yet written */
    /* Writes what names the request in a log line after the peer ("" or "HTTP/2 stream 3: "). */
    void (*where)(ms_req_t *r, char *buf, size_t len);
    /* Takes over a connection from the request `r` of the protocol it speaks, which answered
     * it with 101; `rest` is what the client sent after that request. NULL when the protocol
     * cannot be switched to. */
    void (*upgrade)(ms_conn_t *c, ms_req_t *r, const char *rest, size_t restlen);
    /* A request that asks to switch to this protocol (Upgrade), and may. */
    int (*upgrade_ok)(ms_req_t *r);
    /* Takes the request over as a tunnel (ms_req_tunnel): its head, and bytes both ways from
     * now on. NULL when the protocol has none. */
    void (*tunnel)(ms_req_t *r);
    void (*tunnel_read)(ms_req_t *r, int on);
    /* 1 when a tunnel may keep the connection once its request finishes (on_handover). */
    uint8_t tunnel_handover;
    void (*worker_init)(ms_server_t *s);
    void (*worker_free)(ms_server_t *s);
} ms_proto_t;

struct ms_conn_s {
    ms_server_t *server;
    const ms_io_t *io;       /* the transport */
    const ms_proto_t *proto; /* what it speaks: the accept stage's until that chooses */
    void *pstate;            /* the protocol's state; NULL while an HTTP/1.1 connection idles */
    ms_out_t *pend;          /* replies not yet written */
    ms_out_t *flight;        /* replies being written (io->write may hold part of them) */
    ms_conn_t *prev, *next;  /* the worker's list of open connections */
    ms_timer_t timer;        /* the deadline of what it waits for: MS_PHASE_* */
    uint8_t phase;
    uint8_t source_known;   /* `source` holds the client's address */
    uint8_t source_counted; /* and it is counted in the worker's per-source table */
    uint8_t source[16];     /* the client's address (IPv4 mapped into IPv6): the peer's, or
                             * the one a PROXY header gave */
    uint32_t flags;
    uint32_t requests;        /* served on this connection */
    uint8_t mproto;           /* the protocol its metrics count it under (counting.c) */
    uint8_t mtls;             /* counted as a TLS connection */
    ms_conn_t *deferred_next; /* in the worker's deferred list, holding a reference */
    int refs;                 /* 1 for the transport, 1 while a handler holds the request */
    struct ms_upper_s *upper; /* a transport stacked on `io`'s (TLS), which takes what the
                               * lower one reads and says; NULL: none. In the connection's
                               * memory (ms_conn_new's extra bytes) */
};

/* A transport stacked on another (TLS over TCP, or over memory in the tests and fuzzers).
 * The connection's `io` is the upper one, which calls the lower one's functions itself; the
 * lower one reports through ms__io_read_buf, ms__io_feed, ms__io_eof, ms__io_write_done and
 * ms__io_closed, which go to the upper transport when there is one and to the connection
 * (ms_conn_read_buf, ms_conn_feed, ...) when not. */
typedef struct ms_io_up_s {
    void (*read_buf)(ms_conn_t *c, uv_buf_t *buf);
    void (*feed)(ms_conn_t *c, const char *p, size_t n);
    void (*eof)(ms_conn_t *c, int err);
    void (*write_done)(ms_conn_t *c, int status);
    void (*closed)(ms_conn_t *c);
} ms_io_up_t;

/* The first member of an upper transport's state. */
typedef struct ms_upper_s {
    const ms_io_up_t *up;
} ms_upper_t;

static inline void ms__io_read_buf(ms_conn_t *c, uv_buf_t *buf)
{
    if (MS_UNLIKELY(c->upper != NULL))
        c->upper->up->read_buf(c, buf);
    else
        ms_conn_read_buf(c, buf);
}

static inline void ms__io_feed(ms_conn_t *c, const char *p, size_t n)
{
    if (MS_UNLIKELY(c->upper != NULL))
        c->upper->up->feed(c, p, n);
    else
        ms_conn_feed(c, p, n);
}

static inline void ms__io_eof(ms_conn_t *c, int err)
{
    if (MS_UNLIKELY(c->upper != NULL))
        c->upper->up->eof(c, err);
    else
        ms_conn_eof(c, err);
}

static inline void ms__io_write_done(ms_conn_t *c, int status)
{
    if (MS_UNLIKELY(c->upper != NULL))
        c->upper->up->write_done(c, status);
    else
        ms_conn_write_done(c, status);
}

static inline void ms__io_closed(ms_conn_t *c)
{
    if (MS_UNLIKELY(c->upper != NULL))
        c->upper->up->closed(c);
    else
        ms_conn_closed(c);
}

/* Takes one more reference on a connection that is alive: one with none left is freed, and
 * nobody may hold it again. ms__conn_release gives it back. */
static inline void ms__conn_hold(ms_conn_t *c)
{
    assert(c->refs > 0);
    c->refs++;
}

/* Resumes a handler waiting for the reply queue to drain, once it has. */
static inline void ms__conn_drain_check(ms_conn_t *c)
{
    c->proto->drain_check(c);
}


/* What a connection's timer waits for. MS_PHASE_SETTLE: idle, with the protocol's own
 * housekeeping due first (its `timeout` is called, not counted as a timeout, and arms the
 * idle deadline for the rest). */
enum { MS_PHASE_NONE, MS_PHASE_IDLE, MS_PHASE_HEAD, MS_PHASE_BODY, MS_PHASE_SEND,
       MS_PHASE_SETTLE };

struct ms_server_s {
    uv_loop_t *loop;
    ms_limits_t limits;
    ms_request_cb on_request, on_resume;
    ms_event_cb on_event;   /* waits that are no request's (wake.c); NULL: none */
    struct ms_wake_s **wakes; /* by slot, each allocated once (wake.c) */
    uint32_t wakes_cap;
    struct ms_wake_s *wake_stop;            /* MS_WAKE_STOP's, once it was queued */
    struct ms_wake_s *woken, **woken_tail;  /* wakes made while depth > 0, in order */
    uint8_t woken_running;                  /* ms__wakes_run is delivering them */
    uv_idle_t wake_idle; /* active while wakes past MS_WAKE_BATCH wait for the next turn */
    void *data;
    char *rbuf;      /* owned: the shared read buffer */
    ms_conn_t conns; /* sentinel of the open connection list */
    ms_recycle_t out_free, chunk_free;
    /* The protocols' own, made and freed by each (ms_proto_t.worker_init, worker_free) and
     * touched by no other file. */
    struct ms_h1_worker_s *h1;
    struct ms_h2_worker_s *h2;
    struct ms_static_s *statics; /* static mounts and the file cache; NULL until one is made */
    /* The step before the handler (static mounts, set by static.c): 0 when it answered the
     * request, which is then finished; NULL when there is none. */
    int (*before_handler)(ms_req_t *r);
    ms_timers_t timers;
    /* anchors */
    int32_t *anchor_free, *anchor_released;
    uint32_t anchor_free_n, anchor_released_n, anchor_cap;
    int32_t anchor_next;
    ms_date_t date; /* the Date field (ms__date_line) */
    uint32_t next_req_id;
    int stopping;
    int handing_over; /* the stop hands over to a new worker: still ready (ms_server_health) */
    void (*stopped)(ms_server_t *s);
    /* The drain (ms_server_drain): until `drain_until` (loop time, 0 when not draining) the
     * listeners still accept; then `drain_done` becomes `stopped`. */
    uint64_t drain_until;
    int delay_over; /* a drain's delay has passed (ms__conn_arm_idle) */
    ms_timer_t drain_timer;
    void (*drain_done)(ms_server_t *s);
    void (*accept_closed)(ms_server_t *s);
    char *livez, *readyz; /* the health paths (ms_server_health), owned; NULL: none */
    int depth; /* calls into the handler under way, or the socket engine at work (enter/leave) */
    struct ms_sources_s *sources; /* open connections per source address */
    ms_cidr_t *trusted;           /* proxies whose X-Forwarded-For is believed */
    uint32_t ntrusted;
    uint64_t refused_logged_at; /* refusals of floods are logged once a second */
    uint64_t refused_conns_logged, refused_busy_logged;
    /* The process's descriptor limit (RLIMIT_NOFILE, raised to its hard limit when a server
     * is made), and the connections refused because a descriptor past it was near. */
    uint32_t fd_limit;
    uint64_t refused_fds, refused_fds_logged;
    ms_conn_t *deferred; /* connections to move on once those calls return */
    struct ms_listener_s *listeners;
    struct ms_sockets_s *sockets; /* sock.c: pools, resolver; NULL until a socket is made */
    uint32_t listen_port;
    /* Where it counts (counting.c): its own block, or its slot in a metrics zone. */
    ms_metrics_block_t *m;
    ms_server_stats_t *stats;    /* &m->stats */
    uint64_t *route_counts;      /* the slot's counters by route; NULL until metrics are on */
    uint32_t routes_max;
    uint8_t metrics_on;          /* requests are counted by route, status and latency */
    ms_metrics_zone_t *mzone;    /* mapped for as long as the process runs */
    ms_metrics_block_t own_m;
    /* the access logs (accesslog.c), made at the first: requests note their start */
    struct ms_alogs_s *alogs;
    /* the app's bodies for the core's refusals (http/req.c); NULL: the core's own text */
    struct ms_refusals_s *refusals;
    /* request ids (req.c) */
    uint8_t id_header;        /* replies carry x-request-id */
    char id_prefix[17];       /* 16 random hex digits, drawn at the first id */
    /* refusals with a reason: a few a second are logged with it, the rest as counts */
    uint64_t refused_quiet, refused_quiet_logged;
    uint32_t refused_told;
    struct ms_tls_worker_s *tls; /* tls.c: buffers and settings; NULL until TLS is set up */
    uint16_t https_port;         /* where MS_LISTEN_REDIRECT_HTTPS listeners send clients */
    struct ms_ws_s *ws_open;     /* ws.c: open WebSockets, for the stop's close 1001 */
    uint32_t websockets;         /* ... and how many (the `websockets` limit) */
};

/* conn.c */
void ms__conn_close(ms_conn_t *c, int graceful);
void ms__conn_flush(ms_conn_t *c);
void ms__conn_release(ms_conn_t *c);
void ms__conn_idle(ms_conn_t *c);
void ms__conn_rearm(ms_conn_t *c);
size_t ms__conn_queued(ms_conn_t *c);
size_t ms__req_queued(ms_req_t *r);
void ms__out_advance(ms_out_t *o, size_t n);
void ms__out_release(ms_server_t *s, ms_out_t *o);
void ms__out_clear(ms_server_t *s, ms_out_t *o);
void ms__out_hold(ms_server_t *s, ms_out_t *o, int32_t anchor);
void ms__conn_arm(ms_conn_t *c, int phase, uint32_t ms);
void ms__conn_arm_idle(ms_conn_t *c);
/* What is left of the drain delay, in ms (0 when not draining). */
uint64_t ms__drain_left(ms_server_t *s);
void ms__conn_start(ms_conn_t *c);
void ms__out_destroy(void *p);
ms_out_t *ms__conn_out(ms_conn_t *c);
int ms__out_vec(ms_server_t *s, ms_out_t *o, const char *base, size_t len, int owner,
                int32_t anchor);
int ms__out_file(ms_server_t *s, ms_out_t *o, ms_file_t *f, uint64_t off, size_t len);
char *ms__out_reserve(ms_out_t *o, size_t n);
void ms__out_commit(ms_server_t *s, ms_out_t *o, size_t n);
void ms__out_text(ms_server_t *s, ms_out_t *o, const char *p, size_t n);
void ms__server_conn_gone(ms_server_t *s, ms_conn_t *c);
void ms__server_call(ms_server_t *s, ms_request_cb cb, ms_req_t *r);
/* The event callback with `slot` and `status`, under the same rules as ms__server_call. */
void ms__server_event(ms_server_t *s, int32_t slot, int status);
void ms__server_defer(ms_server_t *s, ms_conn_t *c);

/* A part of a worker with state of its own (a transport, static files, client sockets,
 * WebSockets, the access logs), as nginx's modules have init_process and exit_process. The
 * engine calls each through one list (core/parts.c) and names none of them. Any hook may be
 * NULL. */
typedef struct ms_part_s {
    const char *name;
    void (*worker_init)(ms_server_t *s); /* ms_server_new */
    void (*stop)(ms_server_t *s);        /* ms_server_drain, once each connection was told */
    void (*accept_end)(ms_server_t *s);  /* the drain delay is over: accept no more */
    void (*worker_free)(ms_server_t *s); /* ms_server_free */
} ms_part_t;
/* Every part, NULL-ended, in the order they start, stop and are freed (core/parts.c). */
extern const ms_part_t *const ms__parts[];
/* The protocols the accept stage chooses from, NULL-ended (core/parts.c): [0] is what a
 * connection speaks unless it says otherwise (HTTP/1.1), [1] the one ALPN "h2" or the
 * HTTP/2 preface asks for; any may be switched to by an Upgrade it accepts. */
extern const ms_proto_t *const ms__protos[];

/* tls.c: the TLS transport, stacked on the connection's (TCP, or memory in tests). */
typedef struct ms_tls_s ms_tls_t;
/* The bytes of a connection's TLS state, which ms__tls_wrap puts at `mem`. */
extern const size_t ms__tls_size;
/* Makes `c` speak TLS with `tls`'s settings: its transport becomes the lower one of TLS's,
 * and the handshake deadline (handshake_timeout) replaces the head's until the handshake is
 * done. `mem` holds ms__tls_size bytes that live as long as the connection. */
void ms__tls_wrap(ms_conn_t *c, ms_tls_t *tls, void *mem);
/* Whether `tls` has a default certificate, as a listener needs. */
int ms__tls_ready(const ms_tls_t *tls);

/* per_source.c */
int ms__source_key(const struct sockaddr *sa, uint8_t key[16]);
int ms__source_add(ms_server_t *s, ms_conn_t *c);
void ms__source_remove(ms_server_t *s, ms_conn_t *c);
void ms__sources_free(ms_server_t *s);
void ms__log_refusals(ms_server_t *s);
/* Raises this process's soft descriptor limit to its hard one; returns the limit in force. */
uint32_t ms__nofile_raise(void);
/* Refusals logged with their reason each second; the rest are counted (ms__log_refusals). */
#define MS_REFUSALS_TOLD 10

/* proxy_protocol.c */
/* Whether `a` is a proxy trusted to speak for its clients (ms_server_trust). */
static inline int ms__trusted(const ms_server_t *s, const uint8_t a[16])
{
    return ms__cidr_match(s->trusted, s->ntrusted, a);
}
ssize_t ms__proxy_parse(const char *p, size_t n, uint8_t src[16], int *known);

/* accept.c: the accept stage, which chooses a protocol from ms__protos. */
void ms__conn_accept(ms_conn_t *c);
/* The protocol the request `r` asks to switch its connection to (Upgrade), or NULL. */
const ms_proto_t *ms__upgrade_proto(ms_req_t *r);
/* Hands the connection to `to`, which takes over from the request `r` of the protocol it
 * speaks now (that protocol's state is freed once `to` has what it needs of it). */
void ms__conn_switch(ms_conn_t *c, const ms_proto_t *to, ms_req_t *r, const char *rest,
                     size_t restlen);
void ms__protos_init(ms_server_t *s);
void ms__protos_free(ms_server_t *s);

/* counting.c: a finished request counted (once), a refusal by status, a connection's
 * protocol (to: the one it speaks from now on). */
void ms__metrics_req(ms_req_t *r);
void ms__metrics_refused(ms_server_t *s, int status);
void ms__metrics_proto(ms_conn_t *c, const ms_proto_t *to);
/* The HTTP/2 connection preface, which a client with prior knowledge starts with. */
#define MS_H2_PREFACE     "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#define MS_H2_PREFACE_LEN 24

/* wake.c */
void ms__wakes_free(ms_server_t *s);
/* Delivers the wakes made while depth > 0 (at most MS_WAKE_BATCH; the rest go to the next
 * turn of the loop). Called by run_deferred (server.c) when depth is back to 0. */
void ms__wakes_run(ms_server_t *s);

/* server.c: work that may not call back into Lua (the socket engine's callbacks from the
 * loop) runs between these, so that what it completes is delivered once it has returned. */
static inline void ms__server_enter(ms_server_t *s)
{
    s->depth++;
}
void ms__server_leave(ms_server_t *s);

/* The Date field's line (base/date.c), "date: ...\r\n". */
static inline const char *ms__date_line(ms_server_t *s)
{
    return ms__date_text(&s->date, uv_now(s->loop));
}

#endif
