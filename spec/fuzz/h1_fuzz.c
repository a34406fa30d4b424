/* h1_fuzz.c: the HTTP/1 input path: arbitrary bytes, split arbitrarily, through parsing and
 * dispatch to a handler that answers at once, parks, reads the body or streams. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "transport/memio.h"
#include "moonserve.h"

#include "handlers.h"
#include "replies.h"

/* Runs one connection over the input. `reads`: each piece arrives as a socket read does, into
 * the buffer the connection offers (so kept bytes are moved and read after), in pieces whose
 * sizes come from the input's own bytes (deterministic, so libFuzzer can minimise); otherwise
 * in pieces of `step` bytes, each a copy of its own, so ASan sees any read past a piece. */
static void run(const uint8_t *data, size_t size, size_t step, int flags, int reads)
{
    int congested = flags & 1, proxy = flags & 2;
    uv_loop_t loop;
    uv_loop_init(&loop);
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.head_bytes = 4096;
    lim.body_bytes = 65536;
    ms_server_t *s = ms_server_new(&loop, &lim, on_request, on_resume, NULL);
    ms_memio_t m;
    ms_conn_t *c = ms_memio_open(s, &m);
    m.congested = congested;
    if (proxy)
        c->flags |= MS_CONN_PROXY;
    nparked = 0;
    for (size_t off = 0, n; off < size && m.conn != NULL; off += n) {
        n = reads ? 1 + (size_t)data[off] % step : step;
        if (n > size - off)
            n = size - off;
        if (reads) {
            ms_memio_read(&m, (const char *)data + off, n);
        } else {
            char *piece = malloc(n);
            memcpy(piece, data + off, n);
            ms_memio_feed(&m, piece, n);
            free(piece);
        }
        if (congested)
            ms_memio_drain(&m);
        /* Whatever was written is a sequence of HTTP/1.1 responses, or HTTP/2 frames when the
         * connection began with the preface (prior knowledge): a SETTINGS frame first. */
        if (m.out.len > 0 && memcmp(m.out.base, "HTTP/1.1 ", 9) != 0 && !settings_first(&m.out))
            abort();
    }
    finish_parked(&m);
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_drain(&m);
    if (m.conn != NULL)
        ms_memio_peer_close(&m, UV_ECONNRESET);
    ms_memio_free(&m);
    ms_server_free(s);
    uv_loop_close(&loop);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet) {
        ms_log_set(NULL, MS_LOG_ERR);
        quiet = 1;
    }
    if (size < 2)
        return 0;
    /* First byte: the largest piece the input is fed in (1..256). Second: congestion, and
     * whether a PROXY protocol header comes first. Each input runs as copied pieces and
     * again as split socket reads. */
    size_t step = (size_t)data[0] + 1;
    run(data + 2, size - 2, step, data[1], 0);
    run(data + 2, size - 2, step, data[1], 1);
    return 0;
}
