/* memio.h: a transport that keeps what the engine writes in memory, for tests, fuzzers,
 * benchmarks and in-process requests: the engine fed bytes, with no socket. */
#ifndef MS_MEMIO_H
#define MS_MEMIO_H

#include "moonserve.h"

typedef struct ms_memio_s {
    ms_buf_t out;     /* owned: every byte written */
    ms_buf_t held;    /* owned: bytes of a write the peer has not taken yet (congested) */
    ms_conn_t *conn;  /* NULL once the engine closed the connection */
    int closed;       /* 1 after a graceful close, 2 after an abortive one */
    int reading;      /* 0 while the engine asked to stop reading */
    int congested;    /* try_write takes nothing; writes wait for ms_memio_drain() */
    const char *alpn; /* the protocol the transport says it agreed, as TLS's ALPN would */
    uint32_t tag;     /* the opener's mark, which the connection's requests report
                       * (ms_memio_tag): 0 for none */
    int32_t wake;     /* slot + 1 to wake (ms_wake, status 0) once the engine ends the
                       * connection; 0: none */
} ms_memio_t;

/* Opens a connection whose output goes to `m`. `m` must outlive the connection. */
ms_conn_t *ms_memio_open(ms_server_t *s, ms_memio_t *m);
/* The same, with `extra` bytes after the transport's own for one stacked on it (TLS in the
 * tests and fuzzers): ms_memio_extra(c) is where they are. */
ms_conn_t *ms_memio_open_ex(ms_server_t *s, ms_memio_t *m, size_t extra);
void *ms_memio_extra(ms_conn_t *c);
/* Feeds bytes from the peer, as they are (not copied into the connection's read buffer). */
void ms_memio_feed(ms_memio_t *m, const char *p, size_t n);
/* Delivers bytes from the peer as a socket read does: copied into the buffer the connection
 * offers (ms_conn_read_buf), in as many reads as that takes. A test chooses the segments by
 * calling it once per segment. Returns how many bytes were taken: fewer than `n` when the
 * connection stopped reading or closed. */
size_t ms_memio_read(ms_memio_t *m, const char *p, size_t n);
/* The peer takes the bytes of a pending write. */
void ms_memio_drain(ms_memio_t *m);
/* The peer closes its side (EOF) or resets (err < 0). */
void ms_memio_peer_close(ms_memio_t *m, int err);
/* The tag of the memory transport `c` runs on (ms_memio_t.tag), or 0: another transport,
 * or none set. What a request asks to learn whether it came from an in-process caller. */
uint32_t ms_memio_tag(ms_conn_t *c);
/* Frees `m`'s buffers; the connection must be closed. */
void ms_memio_free(ms_memio_t *m);

#endif
