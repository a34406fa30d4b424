/* h2_data.c: how fast a 16 MiB reply body leaves as HTTP/2 DATA frames through the engine
 * (fed bytes, no socket), against a plain memcpy of the same bytes. The client grants every
 * window at once, so the run measures framing and queueing, not flow control.
 *   h2_data [ROUNDS]   prints milliseconds per body and GB/s for both */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transport/memio.h"
#include "moonserve.h"

#define BODY (16u * 1024 * 1024)

static char *body;

static void on_request(ms_req_t *r, void *data)
{
    (void)data;
    ms_reply_send(r, body, BODY, MS_VEC_STATIC, -1);
    ms_req_finish(r);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 20;
    body = malloc(BODY);
    for (size_t i = 0; i < BODY; i++)
        body[i] = (char)i;
    /* Preface; SETTINGS with INITIAL_WINDOW_SIZE 2^31-1 and MAX_FRAME_SIZE 2^24-1 is not
     * asked for: the server's frames stay at the default 16 KiB, as a browser sees them. */
    static const char start[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                                "\x00\x00\x06\x04\x00\x00\x00\x00\x00"
                                "\x00\x04\x7f\xff\xff\xff"
                                "\x00\x00\x04\x08\x00\x00\x00\x00\x00\x7f\xff\x00\x00";
    static const char fields[] = "\x00\x07:method\x03GET"
                                 "\x00\x07:scheme\x04http"
                                 "\x00\x05:path\x01/"
                                 "\x00\x0a:authority\x01x";
    uv_loop_t loop;
    uv_loop_init(&loop);
    ms_log_set(NULL, MS_LOG_ERR);
    ms_server_t *s = ms_server_new(&loop, NULL, on_request, NULL, NULL);
    ms_memio_t m;
    ms_memio_open(s, &m);
    ms_memio_feed(&m, start, sizeof(start) - 1);
    /* The peer's buffer is made big enough once, so neither run pays for growing it. */
    char *sink = malloc(BODY + BODY / 8);
    double h2 = 0, copy = 0;
    for (int i = 0; i < rounds; i++) {
        char frame[9 + sizeof(fields)];
        uint32_t id = (uint32_t)(2 * i + 1);
        size_t fl = sizeof(fields) - 1;
        unsigned char hd[9] = {0,
                               0,
                               (unsigned char)fl,
                               1,
                               5,
                               (unsigned char)(id >> 24),
                               (unsigned char)(id >> 16),
                               (unsigned char)(id >> 8),
                               (unsigned char)id};
        memcpy(frame, hd, 9);
        memcpy(frame + 9, fields, fl);
        if (m.out.cap < BODY + BODY / 8) {
            m.out.base = realloc(m.out.base, BODY + BODY / 8);
            m.out.cap = BODY + BODY / 8;
        }
        m.out.len = 0;
        double t0 = now_ms();
        ms_memio_feed(&m, frame, 9 + fl);
        h2 += now_ms() - t0;
        if (m.out.len < BODY) {
            fprintf(stderr, "h2_data: only %zu bytes came out\n", m.out.len);
            return 1;
        }
        t0 = now_ms();
        memcpy(sink, body, BODY);
        copy += now_ms() - t0;
        if (sink[BODY - 1] != body[BODY - 1])
            return 1;
    }
    h2 /= rounds;
    copy /= rounds;
    printf("16 MiB body as DATA frames: %.2f ms a body, %.2f GB/s\n", h2, BODY / h2 / 1e6);
    printf("memcpy of the same bytes:   %.2f ms, %.2f GB/s (%.2fx the time)\n", copy,
           BODY / copy / 1e6, h2 / copy);
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    ms_server_free(s);
    uv_loop_close(&loop);
    free(sink);
    free(body);
    return 0;
}
