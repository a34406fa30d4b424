/* accesslog.h: the access log (a line per request, written off the loop) and request ids. */
#ifndef MS_ACCESSLOG_H
#define MS_ACCESSLOG_H

#include "moonserve.h"

/* Access logs per worker: the server's default and those sites name. */
#define MS_ALOG_MAX 16
/* Lines gather in a buffer this large while a write is under way; past it they are dropped
 * and counted (a slow or full disk must not grow the worker or stall its loop). */
#define MS_ALOG_BUF (64 * 1024)
/* One line at most: longer fields are cut. */
#define MS_ALOG_LINE_MAX 4096
/* Lines are written once this many bytes have gathered, or this long after the first. */
#define MS_ALOG_FLUSH_BYTES (32 * 1024)
#define MS_ALOG_FLUSH_MS    100
/* A request id a trusted proxy sends (X-Request-Id) is taken up to this length. */
#define MS_REQ_ID_MAX 64

/**
 * Adds an access log to the server: `path` a file (appended to, created 0644) or "-" for
 * stdout; `format` "combined", "json" or a template of $fields ("$client $status $route").
 * Returns its id (>= 0), or a negative code with `*why` saying what was wrong (an unknown
 * field, too many logs, a file that cannot be opened: then `*why` is NULL and the code says).
 * Requests use no log until ms_server_access_default() names one.
 */
int ms_server_access_log(ms_server_t *s, const char *path, const char *format, const char **why);
/* The log every request uses unless the handler names another (ms_req_access); -1: none. */
void ms_server_access_default(ms_server_t *s, int id);
/* Reopens every access log that is a file (after rotation: SIGUSR1); a log whose write is
 * under way reopens when it is done. */
void ms_server_access_reopen(ms_server_t *s);
/* Lines of log `id` dropped so far (buffer full or write failed). */
uint64_t ms_server_access_dropped(ms_server_t *s, int id);
/* Whether some access log has a write under way (benchmarks wait for it). */
int ms_server_access_busy(ms_server_t *s);
/* With `on`, every reply carries x-request-id (ms_req_id). */
void ms_server_request_id_header(ms_server_t *s, int on);

/* Which log `r` goes to (-1: none, -2: leave it as it is) and the name of the route that
 * took it (copied; NULL or empty: none). */
void ms_req_access(ms_req_t *r, int log, const char *route, size_t len);

/**
 * The request's id: the X-Request-Id of a trusted proxy (ms_req_peer_trusted) when it is
 * 1 to MS_REQ_ID_MAX bytes of [A-Za-z0-9._:@/+=-]; else 24 lowercase hex digits, the first 16
 * drawn at random when the worker starts and the last 8 the worker's request counter. Writes
 * it to `buf` (NUL-terminated, `len` >= MS_REQ_ID_MAX + 1) and returns its length.
 */
int ms_req_id(ms_req_t *r, char *buf, size_t len);

/* -- Inside the core -------------------------------------------------------------------- */

/* The line of a finished or refused request, once. */
void ms__alog_req(ms_req_t *r);
/* Writes what is gathered and closes the logs (the server is being freed). */
void ms__alog_free(ms_server_t *s);
/* Adds x-request-id to the reply's fields. */
void ms__req_id_header(ms_req_t *r);

#endif
