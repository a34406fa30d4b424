/* handlers.h: the handlers the protocol fuzz targets serve with. The path's last byte picks
 * what a request gets, so the fuzzer can steer it: an answer at once, a handler that parks
 * (answered after the input, some after the peer left), one that reads the whole body, or a
 * reply streamed in pieces. */
#ifndef MS_FUZZ_HANDLERS_H
#define MS_FUZZ_HANDLERS_H

#include "transport/memio.h"
#include "moonserve.h"

#define PARKED_MAX 128

static ms_req_t *parked[PARKED_MAX];
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
    unsigned char k = r->v.path.len ? (unsigned char)r->v.path.base[r->v.path.len - 1] : 0;
    switch (k % 4) {
    case 0: answer(r); break;
    case 1:
        if (nparked < PARKED_MAX) {
            ms_req_park(r);
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

/* Parked handlers finish after the input, in order; from the middle on, after the peer
 * reset the connection. */
static void finish_parked(ms_memio_t *m)
{
    for (int i = 0; i < nparked; i++) {
        if (i == nparked / 2)
            ms_memio_peer_close(m, UV_ECONNRESET);
        answer(parked[i]);
    }
}

#endif
