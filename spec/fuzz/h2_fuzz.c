/* h2_fuzz.c: the HTTP/2 input path: the connection preface, then arbitrary frames split
 * arbitrarily, through nghttp2 and dispatch to handlers that answer at once, stream, read
 * the body or park, with the peer's reads congested or not. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "transport/memio.h"
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
    /* First byte: the largest piece the input is fed in (1..256); with the second's bit 2,
     * each piece is as long as the input's own byte at its start says (up to that), so frame
     * headers split anywhere. Second: congestion. */
    size_t step = (size_t)data[0] + 1;
    int congested = data[1] & 1, varied = data[1] & 2;
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
    ms_memio_open(s, &m);
    m.congested = congested;
    nparked = 0;
    ms_memio_feed(&m, MS_H2_PREFACE, MS_H2_PREFACE_LEN);
    for (size_t off = 0, n; off < size && m.conn != NULL; off += n) {
        n = varied ? 1 + (size_t)data[off] % step : step;
        if (n > size - off)
            n = size - off;
        char *piece = malloc(n); /* a copy, so ASan sees any read past what was fed */
        memcpy(piece, data + off, n);
        ms_memio_feed(&m, piece, n);
        free(piece);
        if (congested)
            ms_memio_drain(&m);
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
