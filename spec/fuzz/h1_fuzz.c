/* h1_fuzz.c: the HTTP/1 input path: arbitrary bytes, split arbitrarily, through parsing and
 * dispatch to a handler that answers at once, parks, reads the body or streams. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "memio.h"
#include "moonserve.h"

#include "handlers.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet) {
        ms_log_set(NULL, MS_LOG_ERR);
        quiet = 1;
    }
    if (size < 2)
        return 0;
    /* First byte: the piece size the input is fed in (1..256). Second: congestion, and
     * whether a PROXY protocol header comes first. */
    size_t step = (size_t)data[0] + 1;
    int congested = data[1] & 1, proxy = data[1] & 2;
    data += 2;
    size -= 2;

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
    for (size_t off = 0; off < size && m.conn != NULL; off += step) {
        size_t n = size - off < step ? size - off : step;
        /* Copy, so ASan sees any read past what was fed. */
        char *piece = malloc(n);
        memcpy(piece, data + off, n);
        ms_memio_feed(&m, piece, n);
        free(piece);
        if (congested)
            ms_memio_drain(&m);
        /* Whatever was written is a sequence of HTTP/1.1 responses. */
        if (m.out.len > 0 && memcmp(m.out.base, "HTTP/1.1 ", 9) != 0)
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
    return 0;
}
