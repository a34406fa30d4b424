/* h2_fuzz.c: the HTTP/2 input path: the connection preface, then arbitrary frames split
 * arbitrarily, through nghttp2 and dispatch to handlers that answer at once, stream, read
 * the body or park, with the peer's reads congested or not. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "memio.h"
#include "moonserve.h"

static ms_req_t *parked[128];
static int nparked;

static void answer(ms_req_t *r)
{
    ms_reply_header(r, "content-type", 12, "text/plain", 10);
    ms_reply_send(r, "fuzz", 4, MS_VEC_STATIC, -1);
    ms_req_finish(r);
}

static void read_body(ms_req_t *r)
{
    for (;;) {
        const char *p;
        int64_t n = ms_req_body_take(r, &p);
        if (n > 0)
            continue;
        if (n == UV_EAGAIN && ms_req_wait_body(r) == 0)
            return;
        answer(r);
        return;
    }
}

static void on_request(ms_req_t *r, void *data)
{
    (void)data;
    /* The path's last byte picks the behaviour, so the fuzzer can steer it. */
    unsigned char k = r->v.path.len ? (unsigned char)r->v.path.base[r->v.path.len - 1] : 0;
    switch (k % 4) {
    case 0: answer(r); break;
    case 1:
        if (nparked < 128) {
            parked[nparked++] = r;
        } else {
            answer(r);
        }
        break;
    case 2: read_body(r); break;
    default:
        ms_reply_write(r, "a", 1, MS_VEC_STATIC, -1);
        ms_reply_write(r, "bc", 2, MS_VEC_STATIC, -1);
        ms_req_finish(r);
        break;
    }
}

static void on_resume(ms_req_t *r, void *data)
{
    (void)data;
    if (r->v.wait == MS_WAIT_NONE)
        read_body(r);
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
    /* First byte: the piece size the input is fed in (1..256). Second: congestion. */
    size_t step = (size_t)data[0] + 1;
    int congested = data[1] & 1;
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
    for (size_t off = 0; off < size && m.conn != NULL; off += step) {
        size_t n = size - off < step ? size - off : step;
        char *piece = malloc(n); /* a copy, so ASan sees any read past what was fed */
        memcpy(piece, data + off, n);
        ms_memio_feed(&m, piece, n);
        free(piece);
        if (congested)
            ms_memio_drain(&m);
    }
    /* Parked handlers finish after the input, in order, some after the peer left. */
    for (int i = 0; i < nparked; i++) {
        if (i == nparked / 2)
            ms_memio_peer_close(&m, UV_ECONNRESET);
        answer(parked[i]);
    }
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_drain(&m);
    if (m.conn != NULL)
        ms_memio_peer_close(&m, UV_ECONNRESET);
    ms_memio_free(&m);
    ms_server_free(s);
    uv_loop_close(&loop);
    return 0;
}
