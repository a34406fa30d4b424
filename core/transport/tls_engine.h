/* tls_engine.h: the TLS engine (transport/tls.c), one for both directions: a connection's SSL
 * object and the BIO through which OpenSSL reads the ciphertext its owner hands it and writes
 * ciphertext into a buffer its owner sends; handshake steps, records decrypted into the
 * caller's buffer, records encrypted, close_notify. Its owners: the server's TLS transport
 * (tls.c, an upper ms_io_t on an accepted connection) and client sockets (client/tls_client.c,
 * which adds what only a client has: its context, verification, SNI, client certificates,
 * sessions to resume). The owner does the socket I/O and keeps OpenSSL's app data. */
#ifndef MS_TLS_ENGINE_H
#define MS_TLS_ENGINE_H

#include <sys/types.h>

#include "moonserve.h"

struct ssl_st;
struct ssl_ctx_st;
struct bio_st;

typedef struct ms_tls_eng_s {
    struct ssl_st *ssl; /* NULL until ms__tls_eng_open */
    const char *in;     /* ciphertext OpenSSL may read now; it takes bytes from the front */
    size_t in_len;
    ms_buf_t *out; /* where OpenSSL's ciphertext goes (the owner may point it elsewhere) */
} ms_tls_eng_t;

/* ms__tls_eng_handshake's results besides a negative code. */
enum { MS_TLS_ENG_WANT = 0, MS_TLS_ENG_DONE = 1 };

/* Makes the SSL of `ctx` on the engine's BIO, as a client (connect state) or a server; with
 * `wbio`, OpenSSL writes there instead (the server's kernel TLS), and that BIO is the SSL's
 * (or freed here on a failure). Returns 0 or UV_ENOMEM. */
int ms__tls_eng_open(ms_tls_eng_t *e, struct ssl_ctx_st *ctx, int client, struct bio_st *wbio);
/* Frees the SSL (and its BIOs). */
void ms__tls_eng_close(ms_tls_eng_t *e);
/* One step of the handshake on the bytes in `in`: MS_TLS_ENG_DONE, MS_TLS_ENG_WANT (more
 * bytes, or room, or the certificate hook), or UV_EPROTO with OpenSSL's error queue left for
 * the caller to read (and clear). */
int ms__tls_eng_handshake(ms_tls_eng_t *e);
/* Decrypts into [p, p + n): bytes (> 0), 0 when it needs more ciphertext, UV_EOF at the
 * peer's close_notify, or UV_EPROTO with the error queue left for the caller. */
ssize_t ms__tls_eng_read(ms_tls_eng_t *e, char *p, size_t n);
/* Encrypts all of [p, p + n) into `out`: 0 or UV_EPROTO. */
int ms__tls_eng_write(ms_tls_eng_t *e, const char *p, size_t n);
/* close_notify into `out`; the peer's is not waited for. */
void ms__tls_eng_shutdown(ms_tls_eng_t *e);

#endif
