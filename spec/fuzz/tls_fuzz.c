/* tls_fuzz.c: the accept stage behind the TLS transport. Either the input is what a client
 * sends, byte for byte (ClientHellos, records, garbage), or an OpenSSL client in memory does
 * a real handshake and then sends the input as records of application data, so that the
 * bytes reach the accept stage, HTTP/1.1 and HTTP/2 decrypted, in records of the input's
 * sizes, with ALPN as the input chooses. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../core/tls_peer.h"
#include "handlers.h"

static char *cert, *key;
static size_t cert_len, key_len;

static int settings_first(const ms_buf_t *o)
{
    return o->len >= 9 && o->base[3] == 4 && memcmp(o->base + 5, "\0\0\0\0", 4) == 0;
}

static void run(const uint8_t *data, size_t size, int flags, size_t step)
{
    static const char *const alpns[] = {NULL, "\x08http/1.1", "\x02h2", "\x02h2\x08http/1.1"};
    int raw = flags & 1, alpn = (flags >> 1) & 3, congested = flags & 8, after = flags & 16;
    uv_loop_t loop;
    uv_loop_init(&loop);
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.head_bytes = 4096;
    lim.body_bytes = 65536;
    ms_server_t *s = ms_server_new(&loop, &lim, on_request, on_resume, NULL);
    char err[256];
    ms_tls_opts_t o = {.refuse_unknown = (flags & 32) != 0};
    ms_tls_t *t = ms_tls_new(s, &o, err, sizeof(err));
    if (t == NULL || ms_tls_cert(t, NULL, cert, cert_len, key, key_len, err, sizeof(err)) < 0)
        abort();
    peer_t p;
    peer_open(&p, s, t, (flags & 64) ? "other.test" : "localhost", alpns[alpn],
              alpns[alpn] ? strlen(alpns[alpn]) : 0);
    p.m.congested = congested != 0;
    nparked = 0;
    int shook = !raw || after ? peer_handshake(&p) : 0;
    ms_buf_t got = {0};
    for (size_t off = 0, n; off < size && p.m.conn != NULL; off += n) {
        n = step < size - off ? step : size - off;
        if (raw) {
            char *piece = malloc(n); /* a copy of its own: ASan sees a read past it */
            memcpy(piece, data + off, n);
            ms_memio_feed(&p.m, piece, n);
            free(piece);
            peer_to_client(&p);
        } else if (shook) {
            peer_send(&p, (const char *)data + off, n);
            peer_recv(&p, &got);
        }
    }
    finish_parked(&p.m);
    if (shook && !raw) {
        peer_recv(&p, &got);
        /* What came back is HTTP/1.1 responses, or HTTP/2 frames starting with SETTINGS. */
        if (got.len > 0 && memcmp(got.base, "HTTP/1.1 ", 9) != 0 && !settings_first(&got))
            abort();
    }
    ms_mem_free(got.base);
    if (p.m.conn != NULL)
        ms_memio_peer_close(&p.m, UV_EOF);
    for (int i = 0; i < 100 && p.m.held.len > 0; i++)
        ms_memio_drain(&p.m);
    peer_close(&p);
    ms_server_free(s);
    uv_loop_close(&loop);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (cert == NULL) {
        ms_log_set(NULL, MS_LOG_ERR);
        peer_make_cert("localhost", 0, &cert, &cert_len, &key, &key_len);
    }
    if (size < 2)
        return 0;
    /* First byte: the mode (bit 0: the input is the client's bytes as they are, bit 4: after
     * a real handshake), ALPN offered (bits 1-2), a congested transport (bit 3), unknown names
     * refused (bit 5), an unknown name sent (bit 6). Second: the largest piece or record
     * (1..256). */
    run(data + 2, size - 2, data[0], (size_t)data[1] + 1);
    return 0;
}
