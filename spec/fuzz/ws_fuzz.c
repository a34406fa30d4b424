/* ws_fuzz.c: the WebSocket frame parser on arbitrary bytes, fed whole and then in pieces
 * whose sizes the input picks, checking that both ways agree and that what it hands on keeps
 * its promises (text is UTF-8, messages under the cap, control frames under 126 bytes), with
 * and without permessage-deflate (the inflater, and a bomb stopped at the cap), with and
 * without the client's context kept across messages. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tunnel/ws.h"

#define CAP 4096

typedef struct trace_s {
    uint64_t hash; /* of every message and every byte sent, in order */
    int messages;
} trace_t;

static void mix(trace_t *t, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        t->hash = (t->hash ^ b[i]) * 1099511628211ull;
}

static void on_message(ms_ws_parser_t *p, int op, const char *d, size_t n, int code)
{
    trace_t *t = p->data;
    if (n > 0 && d == NULL)
        abort();
    switch (op) {
    case MS_WS_TEXT:
        if (!ms_ws_utf8_ok(d, n))
            abort();
        /* fall through */
    case MS_WS_BINARY:
        if (n > CAP)
            abort();
        break;
    case MS_WS_CLOSE:
        if (code != MS_WS_NO_STATUS && !ms_ws_close_code_ok(code))
            abort();
        if (!ms_ws_utf8_ok(d, n))
            abort();
        /* fall through */
    case MS_WS_PING:
    case MS_WS_PONG:
        if (n > MS_WS_CONTROL_MAX)
            abort();
        break;
    default:
        abort();
    }
    t->messages++;
    mix(t, &op, sizeof(op));
    mix(t, &code, sizeof(code));
    mix(t, d, n);
}

static void on_send(ms_ws_parser_t *p, const char *d, size_t n)
{
    trace_t *t = p->data;
    /* What the parser sends is a single unmasked control frame. */
    if (n < 2 || (d[1] & 0x80) || ((uint8_t)d[0] & 0x80) == 0 || !((uint8_t)d[0] & 0x08) ||
        (size_t)(d[1] & 0x7F) + 2 != n)
        abort();
    mix(t, d, n);
}

static const ms_ws_parser_ops_t ops = {.message = on_message, .send = on_send};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t step = data[0];
    data++, size--;

    ms_ws_parser_t a, b;
    trace_t ta = {14695981039346656037ull, 0}, tb = {14695981039346656037ull, 0};
    /* The first byte's top bit: permessage-deflate agreed (RSV1 inflates, up to the cap);
     * the next: with context takeover, in a window of 2^9 to 2^15 bytes. */
    int deflate = step >> 7;
    uint8_t inflate_bits = deflate && (step & 0x40) ? (uint8_t)(9 + step % 7) : 0;
    ms_ws_parser_init(&a, &ops, CAP, CAP);
    a.data = &ta;
    a.deflate = (uint8_t)deflate;
    a.inflate_bits = inflate_bits;
    int ra = ms_ws_parse(&a, (const char *)data, size);

    ms_ws_parser_init(&b, &ops, CAP, CAP);
    b.data = &tb;
    b.deflate = (uint8_t)deflate;
    b.inflate_bits = inflate_bits;
    int rb = 0;
    size_t piece = (size_t)(step % 13) + 1;
    for (size_t off = 0; off < size && rb == 0;) {
        size_t n = size - off < piece ? size - off : piece;
        rb = ms_ws_parse(&b, (const char *)data + off, n);
        off += n;
    }
    if (ra != rb || ta.hash != tb.hash || ta.messages != tb.messages || a.done != b.done)
        abort();
    if (ra < 0 && (a.why == NULL || a.fail_code == 0))
        abort();
    ms_ws_parser_free(&a);
    ms_ws_parser_free(&b);
    return 0;
}
