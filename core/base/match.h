/* match.h: reading by pattern ("*l" lines, and receiveuntil's patterns), over bytes its caller
 * holds; no I/O of its own. */
#ifndef MS_MATCH_H
#define MS_MATCH_H

#include <stddef.h>

/* One matcher serves every reader by pattern: outbound sockets (sock.c: moonserve.socket,
 * ngx.socket.tcp) and ngx.req.socket, whose bytes wait in Lua (modules/ms_match_ffi.c).
 * Each call is handed the caller's unread bytes and says what the reader returns now, with
 * lua-nginx-module's pieces: without a size, the data before the next occurrence of the
 * pattern (with it when inclusive). With a size, `size` bytes while at least that many come
 * before the pattern, then the rest before it, fewer than `size` and possibly none (with the
 * pattern when inclusive, so that piece may be longer than `size`), and the call after that
 * is the end (OpenResty's nil, nil, nil), after which the matcher starts over. */
typedef struct ms_match_s ms_match_t;

enum {
    MS_MATCH_MORE = 0,  /* nothing to return yet: call again with more bytes */
    MS_MATCH_PIECE = 1, /* `size` bytes before the pattern, which has not been reached */
    MS_MATCH_LAST = 2,  /* the bytes before the pattern (with it when inclusive) */
    MS_MATCH_END = 3,   /* the call after a sized MS_MATCH_LAST: no data */
};

/* A matcher of `pattern` (len > 0; copied). ms_match_new allocates it with ms_mem_alloc;
 * ms_match_init lays it out in `mem`, ms_match_size(len) bytes aligned for a pointer, for a
 * caller that keeps it inside an allocation of its own. */
size_t ms_match_size(size_t len);
ms_match_t *ms_match_init(void *mem, const char *pattern, size_t len, int inclusive);
ms_match_t *ms_match_new(const char *pattern, size_t len, int inclusive);
void ms_match_free(ms_match_t *m);

/* Looks at the caller's unread bytes p[0..n) for a read of pieces of `size` bytes (0: no
 * size). Returns MS_MATCH_*; for PIECE and LAST, the result is p[0..*len) and the caller
 * consumes p[0..*used) (the pattern too). The matcher keeps what it searched: the next call
 * must be handed the same unread bytes, less those consumed, with any new ones after them.
 * A caller whose unread bytes changed otherwise (another read consumed some) calls
 * ms_match_reset first. Linear in the bytes handed, however they are cut. */
int ms_match_feed(ms_match_t *m, const char *p, size_t n, size_t size, size_t *len, size_t *used);

/* A "*l" read over the caller's unread bytes p[0..n): the line ends at the first LF at or
 * after p + *scanned. Returns its length once its CRs are dropped in place (lua-nginx-module
 * drops every CR of a line), and sets *used to the bytes to consume, the LF included; or -1
 * when there is no LF yet, with *scanned = n, where the next call starts looking. */
long ms_match_line(char *p, size_t n, size_t *scanned, size_t *used);
/* Drops every CR of p[0..n) in place (what a line's partial data gives up); returns the new
 * length. */
size_t ms_match_drop_cr(char *p, size_t n);

/* Forgets what was searched (the caller's bytes changed); an end not yet told stays. */
void ms_match_reset(ms_match_t *m);

/* 1 when the last result was a sized read's MS_MATCH_LAST: the end is told now (the caller
 * returns MS_MATCH_END's nil) and the matcher starts over; 0 otherwise. ms_match_feed
 * calls it first: a caller needs it only to tell the end without bytes at hand. */
int ms_match_take_end(ms_match_t *m);

#endif
