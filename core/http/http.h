/* http.h: what the HTTP files share (ms__ prefix): the protocols' tables and the request
 * layer (req.c) that every protocol dispatches through. */
#ifndef MS_HTTP_H
#define MS_HTTP_H

#include "engine/engine.h"

/* HTTP/1.1 and HTTP/2, for the table of parts (core/parts.c) and for each other's upgrades. */
extern const ms_proto_t ms__h1_proto, ms__h2_proto;

/* -- The request layer (req.c) */
const char *ms__reason(int status);
int ms__refusal_body(int status, char *buf, size_t size);
/* The body a refusal of `status` carries: the app's (ms_server_refusal_body) as the request's
 * Accept asks for it, else the core's text in `buf`. `r` may be NULL (no request yet). */
typedef struct {
    const char *type; /* the content type */
    const char *body;
    size_t len;
    int app; /* the app's, which lives as long as the server (MS_VEC_STATIC); else `buf` */
    char buf[64];
} ms_refusal_t;
void ms__refusal(ms_req_t *r, int status, ms_refusal_t *out);
/* The app's body for a refusal before any request (503 over in_flight on HTTP/1.1): its text,
 * else the first it gave; NULL when it gave none. */
const char *ms__refusal_first(ms_server_t *s, int status, size_t *len, const char **type);
int ms__req_refused_busy(ms_server_t *s);
/* Over the in-flight cap? Then the refusal is counted and logged, and the protocol answers
 * 503 with ms__refusal_body and retry-after: 1, the same on every protocol. */
static inline int ms__req_busy(ms_server_t *s)
{
    return MS_UNLIKELY(s->stats->in_flight >= s->limits.in_flight) && ms__req_refused_busy(s);
}
void ms__req_dispatch(ms_req_t *r);
/* The core answers `r` in the handler's place (a limit, a malformed head, a deadline): one
 * log line and one body (ms__refusal_body), the same on every protocol. */
void ms__req_refuse(ms_req_t *r, int status, const char *why);
/* Queues a body piece on `o`: copied if small or not ours to keep, referenced otherwise. */
void ms__req_queue_body(ms_req_t *r, ms_out_t *o, const char *p, size_t len, int owner,
                        int32_t anchor);
void ms__req_init(ms_req_t *r);
/* Splits r->v.target into path and query, the same for every protocol. */
void ms__req_split_target(ms_req_t *r);
/* Whether the request's method is GET or HEAD. */
int ms__req_get_or_head(const ms_req_t *r);
/* Doubles the room for header fields (in the pool), once r->headers is full. */
MS_NOINLINE void ms__req_headers_grow(ms_req_t *r);
void ms__req_reset(ms_req_t *r);
void ms__req_wake(ms_req_t *r, int wait);
void ms__req_abort(ms_req_t *r);
/* The tunnel of `r` learns that no more bytes will come (ms_tunnel_t.on_end), once. */
void ms__req_tunnel_end(ms_req_t *r, int status);
/* Adds a trailer field of the request body (HTTP/1.1 chunked trailers, an HTTP/2 HEADERS
 * frame after DATA), copied into the pool: trailers arrive among body bytes, which the shared
 * read buffer does not keep. They are kept apart from the headers, so a trailer never stands
 * for a header field (Host, X-Forwarded-For, Cookie). */
void ms__req_add_trailer(ms_req_t *r, const char *name, size_t nlen, const char *value,
                         size_t vlen);
int ms__reply_file(ms_req_t *r, ms_file_t *f, uint64_t off, uint64_t len);

#endif
