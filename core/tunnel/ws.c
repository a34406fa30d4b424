/* ws.c: WebSocket (RFC 6455): the frame parser, the server's frames, and a socket on a tunnel. */
#include "tunnel/ws.h"

#include <openssl/evp.h>
#include <string.h>
#include <zlib.h>

#include "http/http.h"

/* -- The opening handshake --------------------------------------------------------------- */

int ms_ws_accept_key(const char *key, size_t len, char *out)
{
    /* A key is 16 random bytes in base64 (RFC 6455 4.1): 22 digits and "==". */
    if (len != 24 || key[22] != '=' || key[23] != '=')
        return MS_EBADREQ;
    for (size_t i = 0; i < 22; i++) {
        char c = key[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '+' || c == '/'))
            return MS_EBADREQ;
    }
    static const char guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    uint8_t in[24 + sizeof(guid) - 1], md[EVP_MAX_MD_SIZE];
    unsigned mdlen = 0;
    memcpy(in, key, 24);
    memcpy(in + 24, guid, sizeof(guid) - 1);
    if (!EVP_Digest(in, sizeof(in), md, &mdlen, EVP_sha1(), NULL) || mdlen != 20)
        return MS_ESTATE;
    return EVP_EncodeBlock((unsigned char *)out, md, 20); /* 28 digits and a NUL */
}

/* -- UTF-8 ------------------------------------------------------------------------------ */

int ms_ws_utf8_step(ms_ws_utf8_t *u, const uint8_t *p, size_t n)
{
    if (n == 0) /* (an empty message may have no buffer: NULL + 0 is undefined) */
        return 0;
    const uint8_t *end = p + n;
    while (p < end) {
        uint8_t c = *p++;
        if (u->need == 0) {
            if (c < 0x80) {
                /* The common case: a run of ASCII, eight bytes at a time. */
                while (end - p >= 8) {
                    uint64_t w;
                    memcpy(&w, p, 8);
                    if (w & 0x8080808080808080ull)
                        break;
                    p += 8;
                }
                continue;
            }
            if (c < 0xC2) /* a continuation byte, or an overlong two-byte form */
                return -1;
            if (c < 0xE0) {
                u->need = 1, u->lo = 0x80, u->hi = 0xBF;
            } else if (c < 0xF0) {
                u->need = 2;
                u->lo = c == 0xE0 ? 0xA0 : 0x80; /* overlong */
                u->hi = c == 0xED ? 0x9F : 0xBF; /* surrogates */
            } else if (c < 0xF5) {
                u->need = 3;
                u->lo = c == 0xF0 ? 0x90 : 0x80; /* overlong */
                u->hi = c == 0xF4 ? 0x8F : 0xBF; /* past U+10FFFF */
            } else {
                return -1;
            }
        } else {
            if (c < u->lo || c > u->hi)
                return -1;
            u->need--;
            u->lo = 0x80, u->hi = 0xBF;
        }
    }
    return 0;
}

int ms_ws_utf8_ok(const char *p, size_t n)
{
    ms_ws_utf8_t u = {0, 0, 0};
    return ms_ws_utf8_step(&u, (const uint8_t *)p, n) == 0 && u.need == 0;
}

/* -- Frames the server sends ------------------------------------------------------------- */

size_t ms_ws_frame_head(uint8_t *out, int op, int fin, uint64_t len)
{
    out[0] = (uint8_t)((fin ? 0x80 : 0) | (op & 0x0F));
    if (len < 126) {
        out[1] = (uint8_t)len;
        return 2;
    }
    if (len <= 0xFFFF) {
        out[1] = 126;
        out[2] = (uint8_t)(len >> 8);
        out[3] = (uint8_t)len;
        return 4;
    }
    out[1] = 127;
    for (int i = 0; i < 8; i++)
        out[2 + i] = (uint8_t)(len >> (56 - 8 * i));
    return 10;
}

size_t ms_ws_close_frame(uint8_t *out, int code, const char *reason, size_t rlen)
{
    if (code == 0)
        return ms_ws_frame_head(out, MS_WS_CLOSE, 1, 0);
    if (rlen > MS_WS_CONTROL_MAX - 2) {
        /* Cut where no code point is split: back over continuation bytes. */
        rlen = MS_WS_CONTROL_MAX - 2;
        while (rlen > 0 && ((uint8_t)reason[rlen] & 0xC0) == 0x80)
            rlen--;
    }
    size_t h = ms_ws_frame_head(out, MS_WS_CLOSE, 1, 2 + rlen);
    out[h] = (uint8_t)(code >> 8);
    out[h + 1] = (uint8_t)code;
    if (rlen > 0)
        memcpy(out + h + 2, reason, rlen);
    return h + 2 + rlen;
}

int ms_ws_close_code_ok(int code)
{
    return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1011) ||
           (code >= 3000 && code <= 4999);
}

/* -- The parser -------------------------------------------------------------------------- */

void ms_ws_parser_init(ms_ws_parser_t *p, const ms_ws_parser_ops_t *ops, uint64_t max_message,
                       uint64_t max_frame)
{
    memset(p, 0, sizeof(*p));
    p->ops = ops;
    p->max_message = max_message;
    p->max_frame = max_frame;
    p->hneed = 2;
}

uint64_t ms_ws_deflated_cap(uint64_t n)
{
    /* zlib's conservative deflateBound (any window and memLevel: stored blocks, or fixed
     * codes at 9 bits a byte), and 64 bytes for the empty stored blocks that flushes add. */
    if (n > UINT64_MAX / 2)
        return n;
    return n + ((n + 7) >> 3) + ((n + 63) >> 6) + 5 + 64;
}

/* -- Message buffers ---------------------------------------------------------------------
 * A socket holds a buffer only while a message is on its way: the frames of one being
 * reassembled, its inflated form, messages the handler has not taken yet. Buffers of up to
 * WS_BUF bytes are all that size and come from the process's recycle list, so that a warm
 * socket does not allocate and an idle one, whatever it exchanged before, holds none; larger
 * ones come from the allocator and go back to it with their message. */
#define WS_BUF 4096
static ms_recycle_t ws_bufs;

/* Room for `need` bytes in all; a buffer that grows doubles, up to `limit` (which is at
 * least `need`). */
static void buf_reserve(ms_buf_t *b, size_t need, size_t limit)
{
    if (need <= b->cap)
        return;
    if (b->cap == 0 && need <= WS_BUF) {
        b->base = ms__recycle_get(&ws_bufs);
        if (b->base == NULL)
            b->base = ms_mem_alloc(WS_BUF);
        b->cap = WS_BUF;
        return;
    }
    size_t want = b->cap ? b->cap : WS_BUF;
    while (want < need)
        want *= 2;
    if (want > limit)
        want = limit;
    b->base = ms_mem_realloc(b->base, want);
    b->cap = want;
}

static void buf_release(ms_buf_t *b)
{
    if (b->base != NULL && !(b->cap == WS_BUF && ms__recycle_put(&ws_bufs, b->base)))
        ms_mem_free(b->base);
    b->base = NULL;
    b->len = b->cap = 0;
}

/* Control frames' payloads (at most 125 bytes), held only while one is read: most sockets
 * get one whole in a read now and then, and none should carry the room for it between. */
static ms_recycle_t ctl_bufs;

static uint8_t *ctl_get(void)
{
    uint8_t *b = ms__recycle_get(&ctl_bufs);
    return b != NULL ? b : ms_mem_alloc(MS_WS_CONTROL_MAX + 3); /* (a round 128) */
}

static void ctl_release(ms_ws_parser_t *p)
{
    if (p->ctl != NULL && !ms__recycle_put(&ctl_bufs, p->ctl))
        ms_mem_free(p->ctl);
    p->ctl = NULL;
}

static void zctx_free(ms_ws_zctx_t *z);

void ms_ws_parser_free(ms_ws_parser_t *p)
{
    buf_release(&p->msg);
    buf_release(&p->zout);
    ctl_release(p);
    if (p->z != NULL) {
        zctx_free(p->z);
        p->z = NULL;
    }
}

/* A protocol error: the close with `code` goes to the peer, and nothing more is read. */
static int fail(ms_ws_parser_t *p, int code, const char *why)
{
    p->done = 1;
    p->fail_code = code;
    p->why = why;
    if (!p->close_sent) {
        uint8_t f[2 + MS_WS_CONTROL_MAX];
        p->close_sent = 1;
        p->ops->send(p, (const char *)f, ms_ws_close_frame(f, code, why, strlen(why)));
    }
    return MS_EBADREQ;
}

/* -- permessage-deflate ------------------------------------------------------------------
 * Without context takeover (the default), no socket keeps zlib state: a message is inflated
 * whole when its last frame is in, and a message sent is deflated whole, each with the one
 * stream of the process, reset between messages. An idle socket holds nothing of zlib's.
 * With takeover, agreed per endpoint, a direction's stream is the socket's own, made at its
 * first compressed message and kept, never reset, until the socket goes: an inflater holds
 * about 7 KiB and its window (2^bits), a deflater about 6 KiB and 2^(bits+2) + 2^(mem+9). */

static z_stream inflater, deflater;
static uint8_t inflater_ready, deflater_bits;

struct ms_ws_zctx_s {
    z_stream in, out;
    uint8_t in_ready, out_ready;
};

static void zctx_free(ms_ws_zctx_t *z)
{
    if (z->in_ready)
        inflateEnd(&z->in);
    if (z->out_ready)
        deflateEnd(&z->out);
    ms_mem_free(z);
}

static ms_ws_zctx_t *zctx(ms_ws_parser_t *p)
{
    if (p->z == NULL) {
        p->z = ms_mem_alloc(sizeof(*p->z));
        memset(p->z, 0, sizeof(*p->z));
    }
    return p->z;
}

/* A final block ends the peer's zlib stream, yet with takeover the next message still
 * refers to the window (RFC 7692 7.2.3.3 allows BFINAL): the window goes into the stream
 * reset for it. */
static int inflate_restart(z_stream *z)
{
    static uint8_t window[1 << 15];
    uInt n = sizeof(window);
    if (inflateGetDictionary(z, window, &n) != Z_OK || inflateReset(z) != Z_OK)
        return MS_WS_INTERNAL;
    if (n > 0 && inflateSetDictionary(z, window, n) != Z_OK)
        return MS_WS_INTERNAL;
    return 0;
}

/* The stream a compressed message is inflated with: the peer's own with takeover, else the
 * process's, reset. NULL if zlib failed. */
static z_stream *inflate_stream(ms_ws_parser_t *p)
{
    if (p->inflate_bits != 0) {
        ms_ws_zctx_t *z = zctx(p);
        if (!z->in_ready) {
            if (inflateInit2(&z->in, -(int)p->inflate_bits) != Z_OK)
                return NULL;
            z->in_ready = 1;
        }
        return &z->in;
    }
    if (!inflater_ready) {
        if (inflateInit2(&inflater, -15) != Z_OK)
            return NULL;
        inflater_ready = 1;
    } else {
        inflateReset(&inflater);
    }
    return &inflater;
}

/* Inflates the reassembled message into p->zout, never past max_message bytes of output (a
 * decompression bomb stops there). Returns 0 or the close code. */
static int inflate_message(ms_ws_parser_t *p)
{
    static const uint8_t tail[4] = {0x00, 0x00, 0xff, 0xff};
    z_stream *z = inflate_stream(p);
    if (z == NULL)
        return MS_WS_INTERNAL;
    ms_buf_t *out = &p->zout;
    out->len = 0;
    for (int pass = 0; pass < 2; pass++) {
        z->next_in = pass ? (Bytef *)tail : (Bytef *)p->msg.base;
        z->avail_in = pass ? 4 : (uInt)p->msg.len;
        for (;;) {
            if (out->len == out->cap) {
                if (out->cap > p->max_message)
                    return MS_WS_TOO_BIG;
                /* (one more than the cap: what tells "over") */
                buf_reserve(out, out->cap + 1, (size_t)p->max_message + 1);
            }
            z->next_out = (Bytef *)out->base + out->len;
            z->avail_out = (uInt)(out->cap - out->len);
            int rc = inflate(z, Z_SYNC_FLUSH);
            out->len = out->cap - z->avail_out;
            if (out->len > p->max_message)
                return MS_WS_TOO_BIG;
            if (rc == Z_STREAM_END) /* a final block: what follows it is not the message's */
                return z == &inflater ? 0 : inflate_restart(z);
            if (rc != Z_OK && rc != Z_BUF_ERROR)
                return MS_WS_BAD_DATA;
            if (z->avail_in == 0 && z->avail_out > 0)
                break;
        }
    }
    return 0;
}

/* The stream a message sent is deflated with: the socket's own with takeover, else the
 * process's, reset. NULL if zlib failed. */
static z_stream *deflate_stream(ms_ws_parser_t *p, int bits)
{
    if (p != NULL && p->deflate_keep != 0) {
        ms_ws_zctx_t *z = zctx(p);
        if (!z->out_ready) {
            if (deflateInit2(&z->out, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -bits, p->deflate_keep,
                             Z_DEFAULT_STRATEGY) != Z_OK)
                return NULL;
            z->out_ready = 1;
        }
        return &z->out;
    }
    if (deflater_bits == bits) {
        deflateReset(&deflater);
        return &deflater;
    }
    if (deflater_bits != 0)
        deflateEnd(&deflater);
    deflater_bits = 0;
    memset(&deflater, 0, sizeof(deflater));
    if (deflateInit2(&deflater, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -bits, 8,
                     Z_DEFAULT_STRATEGY) != Z_OK)
        return NULL;
    deflater_bits = (uint8_t)bits;
    return &deflater;
}

const char *ms_ws_deflate(ms_ws_parser_t *p, const char *data, size_t len, int bits,
                          size_t *out_len)
{
    static ms_buf_t out;
    *out_len = 0;
    z_stream *z = deflate_stream(p, bits);
    if (z == NULL)
        return NULL;
    size_t bound = deflateBound(z, (uLong)len) + 16;
    if (out.cap < bound) {
        out.base = ms_mem_realloc(out.base, bound);
        out.cap = bound;
    }
    z->next_in = (Bytef *)data;
    z->avail_in = (uInt)len;
    size_t n = 0;
    for (;;) {
        z->next_out = (Bytef *)out.base + n;
        z->avail_out = (uInt)(out.cap - n);
        if (deflate(z, Z_SYNC_FLUSH) == Z_STREAM_ERROR)
            return NULL;
        n = out.cap - z->avail_out;
        if (z->avail_out > 0)
            break;
        /* (the bound leaves room for all of it; the flush may still want more) */
        out.cap *= 2;
        out.base = ms_mem_realloc(out.base, out.cap);
    }
    /* The sync flush ends with an empty stored block, 00 00 ff ff, which RFC 7692 7.2.1
     * takes off (the receiver puts it back). */
    *out_len = n >= 4 ? n - 4 : n;
    return out.base;
}

static int frame_end(ms_ws_parser_t *p)
{
    p->in_payload = 0;
    p->hlen = 0;
    p->hneed = 2;
    if (p->op & 0x8) {
        uint8_t ctl[MS_WS_CONTROL_MAX];
        size_t n = (size_t)p->flen;
        if (n > 0)
            memcpy(ctl, p->ctl, n);
        ctl_release(p);
        const char *d = (const char *)ctl;
        if (p->op == MS_WS_PING) {
            if (!p->close_sent) {
                uint8_t f[2 + MS_WS_CONTROL_MAX];
                size_t h = ms_ws_frame_head(f, MS_WS_PONG, 1, n);
                memcpy(f + h, d, n);
                p->ops->send(p, (const char *)f, h + n);
            }
            p->ops->message(p, MS_WS_PING, d, n, 0);
        } else if (p->op == MS_WS_PONG) {
            p->ops->message(p, MS_WS_PONG, d, n, 0);
        } else {
            int code = MS_WS_NO_STATUS;
            if (n == 1)
                return fail(p, MS_WS_PROTOCOL, "close frame of one byte");
            if (n >= 2) {
                code = (ctl[0] << 8) | ctl[1];
                if (!ms_ws_close_code_ok(code))
                    return fail(p, MS_WS_PROTOCOL, "close code not allowed");
                if (!ms_ws_utf8_ok(d + 2, n - 2))
                    return fail(p, MS_WS_BAD_DATA, "close reason not UTF-8");
                d += 2, n -= 2;
            }
            p->close_received = 1;
            p->done = 1;
            if (!p->close_sent) {
                /* The answer echoes the code (RFC 6455 5.5.1). */
                uint8_t f[4];
                p->close_sent = 1;
                p->ops->send(p, (const char *)f,
                             ms_ws_close_frame(f, code == MS_WS_NO_STATUS ? 0 : code, "", 0));
            }
            p->ops->message(p, MS_WS_CLOSE, d, n, code);
        }
        return 0;
    }
    if (!p->fin)
        return 0;
    const char *d = p->msg.base;
    size_t n = p->msg.len;
    if (p->msg_compressed) {
        int code = inflate_message(p);
        if (code == MS_WS_TOO_BIG)
            return fail(p, code, "message over the size cap as it inflates");
        if (code != 0)
            return fail(p, code, "compressed data that does not inflate");
        d = p->zout.base, n = p->zout.len;
        if (p->msg_op == MS_WS_TEXT && !ms_ws_utf8_ok(d, n))
            return fail(p, MS_WS_BAD_DATA, "text not UTF-8");
    } else if (p->msg_op == MS_WS_TEXT && p->utf8.need != 0) {
        return fail(p, MS_WS_BAD_DATA, "text ends inside a code point");
    }
    int op = p->msg_op;
    p->msg_op = 0;
    p->ops->message(p, op, d, n, 0);
    buf_release(&p->msg);
    buf_release(&p->zout);
    return 0;
}

/* The head is whole: checks the frame before any of its payload is read. */
static int frame_begin(ms_ws_parser_t *p)
{
    const uint8_t *h = p->head;
    p->fin = h[0] >> 7;
    p->op = h[0] & 0x0F;
    uint64_t len = h[1] & 0x7F;
    if (len == 126) {
        len = ((uint64_t)h[2] << 8) | h[3];
    } else if (len == 127) {
        len = 0;
        for (int i = 0; i < 8; i++)
            len = (len << 8) | h[2 + i];
        if (len >> 63)
            return fail(p, MS_WS_PROTOCOL, "frame length with its top bit set");
    }
    /* A compressed message may take a little more on the wire than inflated (deflate
     * stores what it cannot shrink, with a few bytes a block): its frames are held to that
     * bound, and the message inflated to max_message (inflate_message). */
    int compressed = p->op == MS_WS_CONT ? p->msg_compressed : !(p->op & 0x8) && (h[0] & 0x40) != 0;
    uint64_t frame_cap = compressed ? ms_ws_deflated_cap(p->max_frame) : p->max_frame;
    uint64_t msg_cap = compressed ? ms_ws_deflated_cap(p->max_message) : p->max_message;
    if (len > frame_cap)
        return fail(p, MS_WS_TOO_BIG, "frame over the size cap");
    if (p->op & 0x8) {
        /* Each ping costs a pong and a wake: a peer may not send them without end. */
        if (p->max_control != 0) {
            uint32_t now = p->ops->now != NULL ? p->ops->now(p) : 0;
            if (now - p->ctl_since >= 1000) {
                p->ctl_since = now;
                p->ctl_n = 0;
            }
            /* (counted after the check: 16 bits, and the cap may be 65535) */
            if (p->ctl_n >= p->max_control)
                return fail(p, MS_WS_POLICY, "too many control frames a second");
            p->ctl_n++;
        }
    } else {
        if (p->op == MS_WS_CONT) {
            if (p->msg_op == 0)
                return fail(p, MS_WS_PROTOCOL, "continuation frame outside a message");
            /* Empty continuations cost the peer two bytes each and us a frame's work: a
             * message is held to a count of frames as to a size. */
            if (p->max_fragments != 0) {
                if (p->frags >= p->max_fragments)
                    return fail(p, MS_WS_POLICY, "too many fragments in one message");
                p->frags++;
            }
        } else {
            if (p->msg_op != 0)
                return fail(p, MS_WS_PROTOCOL, "new message inside a fragmented one");
            p->msg_op = p->op;
            p->msg_compressed = (uint8_t)compressed;
            p->utf8.need = 0;
            p->frags = 1;
        }
        if (p->msg.len + len > msg_cap)
            return fail(p, MS_WS_TOO_BIG, "message over the size cap");
        /* Grown to what the frames so far announce, never past the cap. */
        buf_reserve(&p->msg, (size_t)(p->msg.len + len), (size_t)msg_cap);
    }
    p->flen = len;
    p->fgot = 0;
    p->in_payload = 1;
    if ((p->op & 0x8) && len > 0 && p->ctl == NULL)
        p->ctl = ctl_get();
    if (len == 0)
        return frame_end(p);
    return 0;
}

/* The first two bytes of a head: what can be refused before the rest comes. */
static int head_start(ms_ws_parser_t *p)
{
    uint8_t b0 = p->head[0], b1 = p->head[1];
    int op = b0 & 0x0F;
    /* RSV1 marks a compressed message once permessage-deflate is agreed: on its first frame
     * only, never on a control frame or a continuation (RFC 7692 6). */
    int rsv1_ok = p->deflate && (op == MS_WS_TEXT || op == MS_WS_BINARY);
    if (b0 & (rsv1_ok ? 0x30 : 0x70))
        return fail(p, MS_WS_PROTOCOL, "reserved bits set");
    if ((op > MS_WS_BINARY && op < MS_WS_CLOSE) || op > MS_WS_PONG)
        return fail(p, MS_WS_PROTOCOL, "reserved opcode");
    if (!(b1 & 0x80))
        return fail(p, MS_WS_PROTOCOL, "unmasked frame from the client");
    if (op & 0x8) {
        if (!(b0 & 0x80))
            return fail(p, MS_WS_PROTOCOL, "fragmented control frame");
        if ((b1 & 0x7F) > MS_WS_CONTROL_MAX)
            return fail(p, MS_WS_PROTOCOL, "control frame over 125 bytes");
    }
    uint8_t l7 = b1 & 0x7F;
    p->hneed = (uint8_t)(2 + (l7 == 126 ? 2 : l7 == 127 ? 8 : 0) + 4);
    return 0;
}

static int payload(ms_ws_parser_t *p, const uint8_t *in, size_t n)
{
    const uint8_t *mask = p->head + p->hneed - 4;
    uint8_t *to;
    if (p->op & 0x8) {
        to = p->ctl + p->fgot;
    } else {
        to = (uint8_t *)p->msg.base + p->msg.len;
    }
    size_t k = (size_t)(p->fgot & 3);
    for (size_t i = 0; i < n; i++)
        to[i] = in[i] ^ mask[(k + i) & 3];
    p->fgot += n;
    if (!(p->op & 0x8)) {
        p->msg.len += n;
        if (p->msg_op == MS_WS_TEXT && !p->msg_compressed &&
            ms_ws_utf8_step(&p->utf8, to, n) < 0)
            return fail(p, MS_WS_BAD_DATA, "text not UTF-8");
    }
    return 0;
}

int ms_ws_parse(ms_ws_parser_t *p, const char *data, size_t n)
{
    const uint8_t *in = (const uint8_t *)data, *end = in + n;
    while (in < end && !p->done) {
        if (!p->in_payload) {
            while (p->hlen < p->hneed && in < end)
                p->head[p->hlen++] = *in++;
            if (p->hlen < p->hneed)
                return 0;
            int rc = p->hlen == 2 ? head_start(p) : frame_begin(p);
            if (rc < 0)
                return rc;
            continue;
        }
        size_t take = (size_t)(end - in);
        if (take > p->flen - p->fgot)
            take = (size_t)(p->flen - p->fgot);
        int rc = payload(p, in, take);
        in += take;
        if (rc == 0 && p->fgot == p->flen)
            rc = frame_end(p);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* -- A WebSocket on a tunnel ---------------------------------------------------------------
 * A socket starts on its request's tunnel. On HTTP/1.1 it outlives the request: once the
 * handler lets go of the request (ms_req_finish), the socket takes the connection over
 * (ws_handover) and the HTTP/1.1 state, the request and its pool go back to the worker, so
 * that an open socket holds only the connection and itself. On HTTP/2 it stays one stream
 * of its connection, and its request lives as long as it does. */

struct ms_ws_s {
    ms_ws_parser_t p;
    ms_tunnel_t tunnel;
    ms_server_t *server;
    ms_req_t *req;   /* the request taken over, while the socket is on its tunnel, else NULL */
    ms_conn_t *conn; /* the connection, once the socket has it (holding a reference), else NULL */
    ms_ws_t *next, *prev; /* the server's open sockets (for ms__ws_stop_all) */
    /* Messages not yet received, each [op: 1][code: 2][len: 4] then its bytes. The first
     * `taken` bytes were handed out by the last ms_ws_receive. */
    ms_buf_t inq;
    size_t taken;
    /* ms_ws_opts_t's, but the sizes the parser keeps: packed, as every open socket has them */
    uint64_t send_queue;
    uint32_t ping_ms, pong_ms, idle_ms, close_ms;
    /* loop times (ms, modulo 2^32: only differences are taken, of less than 49 days) */
    uint32_t last_rx;  /* of the last frame from the peer */
    uint32_t last_msg; /* ... and of the last message either way, for idle_ms */
    int32_t slot;      /* who to wake when something comes; -1: nobody */
    int32_t home;      /* the owner's slot (ms_ws_set_home), -1: none */
    uint8_t deflate_bits, deliver_control;
    uint8_t gone;     /* the tunnel ended, or we cut it: no more bytes either way */
    uint8_t read_off; /* reading stopped: too much received and not yet taken */
    uint8_t ping_out; /* our ping awaits a frame from the peer */
    uint8_t in_parse; /* inside ms_ws_parse (the parser's callbacks) */
    uint8_t outlive;  /* it keeps the connection once its request finishes (HTTP/1.1) */
    uint8_t freed;    /* ms_ws_free was called: the connection's free frees it */
    uint32_t ping_at;  /* when our ping went, while ping_out */
    uint32_t close_at; /* when our close went, once close_sent */
    ms_timer_t timer;  /* the first of the deadlines (arm) */
};

#define WS_REC_HEAD 7
/* Messages shorter than this go uncompressed even when permessage-deflate is agreed: their
 * frame would hardly shrink. */
#define WS_DEFLATE_MIN 64
/* Received bytes not yet taken past which the peer is no longer read. */
#define WS_INQ_HIGH (256 * 1024)

static ms_ws_t *ws_of_parser(ms_ws_parser_t *p)
{
    return container_of(p, ms_ws_t, p);
}

static uint32_t now_ms(ms_ws_t *ws)
{
    return (uint32_t)uv_now(ws->server->loop);
}

/* The connection, while there is one to reach: the socket's, or its request's until the
 * tunnel ends (cut: no more bytes either way, so nothing asks for it after). */
static ms_conn_t *conn_of(ms_ws_t *ws)
{
    assert(ws->conn != NULL || ws->req != NULL);
    return ws->conn != NULL ? ws->conn : ws->req->conn;
}

static void wake(ms_ws_t *ws)
{
    if (ws->slot >= 0) {
        int32_t slot = ws->slot;
        ws->slot = -1;
        ms_wake(ws->server, slot, 0);
    }
}

static void log_close(ms_ws_t *ws, int code, const char *why)
{
    char peer[64];
    ms_conn_peer(conn_of(ws), peer, sizeof(peer));
    ms_log(MS_LOG_INFO, "%s: WebSocket closed with %d: %s", peer, code, why);
}

/* A Lua string that will not be written: its slot is released. */
static void drop(ms_ws_t *ws, int owner, int32_t anchor)
{
    if (owner == MS_VEC_LUA && anchor >= 0)
        ws->server->anchor_released[ws->server->anchor_released_n++] = anchor;
}

/* Queues bytes to the peer: on the tunnel, or on the connection the socket has, where they
 * go at the end of a read, or at once (write_now). */
static void queue(ms_ws_t *ws, const char *p, size_t len, int owner, int32_t anchor)
{
    if (ws->conn == NULL) {
        ms_tunnel_write(&ws->tunnel, p, len, owner, anchor);
        return;
    }
    ms_conn_t *c = ws->conn;
    ms_server_t *s = ws->server;
    if ((c->flags & MS_CONN_CLOSED) || len == 0) {
        drop(ws, owner, anchor);
        return;
    }
    ms_out_t *o = ms__conn_out(c);
    if (owner == MS_VEC_OUT || (len <= MS_COPY_BODY_MAX && owner == MS_VEC_LUA)) {
        ms__out_text(s, o, p, len);
        drop(ws, owner, anchor);
    } else {
        ms__out_vec(s, o, p, len, owner, anchor);
    }
}

static void write_now(ms_ws_t *ws)
{
    ms_conn_t *c = ws->conn;
    if (c != NULL && !(c->flags & MS_CONN_IN_FEED)) {
        ms__conn_flush(c);
        ms__conn_idle(c); /* between writes the connection holds no reply queue */
    }
}

static void write_frame(ms_ws_t *ws, const char *p, size_t len)
{
    queue(ws, p, len, MS_VEC_OUT, -1);
    write_now(ws);
}

/* Stops (0) or resumes (1) reading from the peer. */
static void read_on(ms_ws_t *ws, int on)
{
    if (ws->conn == NULL) {
        ms_tunnel_read(&ws->tunnel, on);
        return;
    }
    ms_conn_t *c = ws->conn;
    if (c->flags & MS_CONN_CLOSED)
        return;
    if (!on && !(c->flags & MS_CONN_READ_OFF)) {
        c->flags |= MS_CONN_READ_OFF;
        c->io->read_stop(c);
    } else if (on && (c->flags & MS_CONN_READ_OFF)) {
        c->flags &= ~MS_CONN_READ_OFF;
        c->io->read_start(c);
    }
}

/* No more bytes either way: what was queued still goes, then the request's handler sees
 * the end and finishes it. */
static void cut(ms_ws_t *ws)
{
    ws->gone = 1;
    ms_timer_stop(ws->server, &ws->timer);
    wake(ws);
}

static void queue_record(ms_ws_t *ws, int op, const char *d, size_t n, int code)
{
    uint8_t h[WS_REC_HEAD] = {(uint8_t)op, (uint8_t)(code >> 8), (uint8_t)code,
                              (uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8),
                              (uint8_t)n};
    if (ws->freed)
        return; /* nobody will take it */
    ms_buf_t *b = &ws->inq;
    buf_reserve(b, b->len + WS_REC_HEAD + n, SIZE_MAX);
    memcpy(b->base + b->len, h, WS_REC_HEAD);
    if (n > 0)
        memcpy(b->base + b->len + WS_REC_HEAD, d, n);
    b->len += WS_REC_HEAD + n;
    if (b->len > WS_INQ_HIGH && !ws->read_off && !ws->gone) {
        ws->read_off = 1;
        read_on(ws, 0);
    }
    wake(ws);
}

/* FIXME: a message is copied twice, once unmasked into the parser's buffer and once into
 * the queue Lua takes it from; handing the parser's buffer over would save the second. */
static void on_message(ms_ws_parser_t *p, int op, const char *d, size_t n, int code)
{
    ms_ws_t *ws = ws_of_parser(p);
    ws->ping_out = 0;
    if (op == MS_WS_PING || op == MS_WS_PONG) {
        if (ws->deliver_control)
            queue_record(ws, op, d, n, 0);
        return;
    }
    if (op == MS_WS_CLOSE) {
        /* The handshake is complete when ours went first; else our answer is queued. */
        queue_record(ws, op, d, n, code);
        cut(ws);
        return;
    }
    ws->last_msg = now_ms(ws);
    queue_record(ws, op, d, n, 0);
}

static void on_send(ms_ws_parser_t *p, const char *d, size_t n)
{
    ms_ws_t *ws = ws_of_parser(p);
    if (!ws->gone)
        write_frame(ws, d, n);
}

static uint32_t on_clock(ms_ws_parser_t *p)
{
    return now_ms(ws_of_parser(p));
}

static const ms_ws_parser_ops_t ws_parser_ops = {
    .message = on_message, .send = on_send, .now = on_clock};

/* How long until `limit` ms have passed, `quiet` ms of them already. */
static uint32_t left(uint32_t quiet, uint32_t limit)
{
    return quiet >= limit ? 0 : limit - quiet;
}

static void on_timer(ms_timer_t *t);

/* Arms the socket's one timer at the first of its deadlines: once our close went, the peer's
 * answer to it; before, the pong to our ping or the next ping, and the idle close. */
static void arm(ms_ws_t *ws)
{
    uint32_t now = now_ms(ws), wait = UINT32_MAX;
    if (ws->p.close_sent) {
        wait = left(now - ws->close_at, ws->close_ms);
    } else {
        if (ws->ping_ms > 0)
            wait = ws->ping_out ? left(now - ws->ping_at, ws->pong_ms)
                                : left(now - ws->last_rx, ws->ping_ms);
        if (ws->idle_ms > 0) {
            uint32_t idle = left(now - ws->last_msg, ws->idle_ms);
            wait = idle < wait ? idle : wait;
        }
    }
    if (wait == UINT32_MAX || ws->gone)
        ms_timer_stop(ws->server, &ws->timer);
    else
        ms_timer_start(ws->server, &ws->timer, wait, on_timer);
}

/* Sends our close and gives the peer close_ms to answer it. */
static void send_close(ms_ws_t *ws, int code, const char *reason, size_t rlen)
{
    if (ws->p.close_sent || ws->gone)
        return;
    uint8_t f[2 + MS_WS_CONTROL_MAX];
    ws->p.close_sent = 1;
    write_frame(ws, (const char *)f, ms_ws_close_frame(f, code, reason, rlen));
    ws->close_at = now_ms(ws);
    arm(ws);
}

static void on_data(ms_tunnel_t *t, const char *p, size_t n)
{
    ms_ws_t *ws = t->data;
    if (ws->gone || ws->p.done || ws->freed)
        return; /* (after a close, what the peer still sends is dropped) */
    ws->last_rx = now_ms(ws);
    ws->in_parse = 1;
    int rc = ms_ws_parse(&ws->p, p, n);
    ws->in_parse = 0;
    if (rc < 0) {
        log_close(ws, ws->p.fail_code, ws->p.why);
        queue_record(ws, MS_WS_CLOSE, ws->p.why, strlen(ws->p.why), ws->p.fail_code);
        cut(ws);
    }
}

static void on_end(ms_tunnel_t *t, int status)
{
    ms_ws_t *ws = t->data;
    (void)status;
    /* The request no longer knows the tunnel, and may finish (and go) before the socket is
     * freed: nothing of it is touched from here. */
    ws->req = NULL;
    cut(ws);
}

/* A deadline came (arm): the close's answer did not, the pong did not, the socket idled, or
 * the peer was quiet for ping_ms. Deadlines that moved (a frame came) are armed again. */
static void on_timer(ms_timer_t *t)
{
    ms_ws_t *ws = container_of(t, ms_ws_t, timer);
    uint32_t now = now_ms(ws);
    if (ws->p.close_sent) {
        if (now - ws->close_at >= ws->close_ms) {
            cut(ws);
            return;
        }
    } else {
        if (ws->ping_ms > 0 && ws->ping_out && now - ws->ping_at >= ws->pong_ms) {
            log_close(ws, MS_WS_INTERNAL, "no pong before the deadline");
            send_close(ws, MS_WS_INTERNAL, "no pong", 7);
            cut(ws);
            return;
        }
        if (ws->idle_ms > 0 && now - ws->last_msg >= ws->idle_ms) {
            send_close(ws, MS_WS_GOING_AWAY, "idle", 4);
            wake(ws);
            return;
        }
        if (ws->ping_ms > 0 && !ws->ping_out && now - ws->last_rx >= ws->ping_ms) {
            uint8_t f[2];
            write_frame(ws, (const char *)f, ms_ws_frame_head(f, MS_WS_PING, 1, 0));
            ws->ping_out = 1;
            ws->ping_at = now;
        }
    }
    arm(ws);
}

/* -- The connection, once the socket has it --------------------------------------------- */

/* The protocol of a WebSocket that took its HTTP/1.1 connection over (below). */
extern const ms_proto_t ms__ws_proto;

static void ws_handover(ms_tunnel_t *t, ms_conn_t *c, const char *rest, size_t n)
{
    ms_ws_t *ws = t->data;
    ws->req = NULL;
    ws->conn = c;
    c->proto = &ms__ws_proto;
    c->pstate = ws;
    c->phase = MS_PHASE_NONE;
    ms_timer_stop(c->server, &c->timer);
    if (c->flags & MS_CONN_CLOSED) {
        cut(ws);
        return;
    }
    if (n > 0) {
        ms__conn_hold(c);
        c->flags |= MS_CONN_IN_FEED;
        on_data(&ws->tunnel, rest, n);
        c->flags &= ~MS_CONN_IN_FEED;
        write_now(ws);
        ms__conn_release(c);
    }
}

static void ws_feed(ms_conn_t *c, const char *data, size_t len)
{
    ms_ws_t *ws = c->pstate;
    ms__conn_hold(c); /* a handler woken from here may let go of the socket */
    c->flags |= MS_CONN_IN_FEED;
    on_data(&ws->tunnel, data, len);
    c->flags &= ~MS_CONN_IN_FEED;
    write_now(ws);
    ms__conn_rearm(c);
    ms__conn_release(c);
}

static void ws_eof(ms_conn_t *c)
{
    ms_ws_t *ws = c->pstate;
    if (ws->freed) {
        ms__conn_close(c, 0);
        return;
    }
    cut(ws); /* the handler sees the end and lets go of the socket, which closes it */
}

static void ws_rearm(ms_conn_t *c)
{
    /* Nothing of the connection's: the socket's own timers keep its deadlines. */
    c->phase = MS_PHASE_NONE;
    ms_timer_stop(c->server, &c->timer);
}

static void ws_timeout(ms_conn_t *c, int phase)
{
    char peer[64];
    (void)phase; /* only MS_PHASE_SEND is armed (ms__conn_rearm) */
    ms_conn_peer(c, peer, sizeof(peer));
    ms_log(MS_LOG_INFO, "%s: closed: the client read nothing for send_timeout", peer);
    ms__conn_close(c, 0);
}

static void ws_drain_check(ms_conn_t *c)
{
    ms__conn_idle(c); /* what was written in the background has gone */
}

static void ws_nothing(ms_conn_t *c)
{
    (void)c; /* resume: nothing deferred; stop: ms__ws_stop_all sends the close */
}

static void ws_abort(ms_conn_t *c)
{
    cut(c->pstate);
}

/* What the socket holds, and the socket. */
static void ws_release(ms_ws_t *ws)
{
    ms_ws_parser_free(&ws->p);
    buf_release(&ws->inq);
    ms_mem_free(ws);
}

static void ws_conn_free(ms_server_t *s, void *pstate)
{
    ms_ws_t *ws = pstate;
    (void)s;
    assert(ws->freed); /* it holds a reference on the connection until then */
    ws_release(ws);
}

const ms_proto_t ms__ws_proto = {
    .name = "websocket",
    .feed = ws_feed,
    .eof = ws_eof,
    .write = ms__conn_flush,
    .rearm = ws_rearm,
    .timeout = ws_timeout,
    .drain_check = ws_drain_check,
    .resume = ws_nothing,
    .stop = ws_nothing,
    .abort = ws_abort,
    .free = ws_conn_free,
};

/* -- The socket's API --------------------------------------------------------------------- */

ms_ws_t *ms_ws_accept(ms_req_t *r, const ms_ws_opts_t *o, int *err)
{
    ms_server_t *s = r->conn->server;
    if (s->websockets >= s->limits.websockets) {
        *err = MS_EBUSY;
        return NULL;
    }
    ms_ws_t *ws = ms_mem_alloc(sizeof(*ws));
    memset(ws, 0, sizeof(*ws));
    ms_ws_parser_init(&ws->p, &ws_parser_ops, o->max_message, o->max_frame);
    ws->p.max_fragments = (uint16_t)s->limits.websocket_fragments; /* (at most 65535) */
    ws->p.max_control = (uint16_t)s->limits.websocket_control_rate;
    ws->p.deflate = o->deflate_bits != 0;
    ws->p.inflate_bits = o->deflate_bits != 0 ? o->inflate_bits : 0;
    ws->p.deflate_keep = o->deflate_bits != 0 ? o->deflate_keep : 0;
    ws->send_queue = o->send_queue;
    ws->ping_ms = o->ping_ms;
    ws->pong_ms = o->pong_ms;
    ws->idle_ms = o->idle_ms;
    ws->close_ms = o->close_ms;
    ws->deflate_bits = o->deflate_bits;
    ws->deliver_control = o->deliver_control;
    ws->server = s;
    ws->req = r;
    ws->slot = ws->home = -1;
    ws->outlive = (uint8_t)ms_req_tunnel_handover(r);
    ws->tunnel.on_data = on_data;
    ws->tunnel.on_end = on_end;
    ws->tunnel.on_handover = ws->outlive ? ws_handover : NULL;
    ws->tunnel.data = ws;
    int rc = ms_req_tunnel(r, &ws->tunnel);
    if (rc < 0) {
        ms_ws_parser_free(&ws->p);
        ms_mem_free(ws);
        *err = rc;
        return NULL;
    }
    /* An open WebSocket is not a request in flight: it has its own cap. One that outlives
     * its request stops being one when the request finishes; one that does not, now. */
    if (!ws->outlive)
        s->stats->in_flight--;
    s->websockets++;
    ws->next = s->ws_open;
    if (ws->next != NULL)
        ws->next->prev = ws;
    s->ws_open = ws;
    ws->last_rx = ws->last_msg = now_ms(ws);
    arm(ws);
    if (s->stopping)
        send_close(ws, MS_WS_GOING_AWAY, "server stopping", 15);
    return ws;
}

int ms_ws_outlives(ms_ws_t *ws)
{
    return ws->outlive;
}

void ms_ws_set_home(ms_ws_t *ws, int32_t slot)
{
    ws->home = slot;
}

int32_t ms_ws_home(ms_ws_t *ws)
{
    return ws->home;
}

ms_server_t *ms_ws_server(ms_ws_t *ws)
{
    return ws->server;
}

void ms_ws_free(ms_ws_t *ws)
{
    ms_server_t *s = ws->server;
    if (!ws->gone && !ws->p.close_sent)
        send_close(ws, MS_WS_NORMAL, "", 0);
    ms_timer_stop(s, &ws->timer);
    if (ws->prev != NULL)
        ws->prev->next = ws->next;
    else
        s->ws_open = ws->next;
    if (ws->next != NULL)
        ws->next->prev = ws->prev;
    s->websockets--;
    ws->freed = 1;
    ms_conn_t *c = ws->conn;
    if (c != NULL) {
        /* The socket's connection closes once what was queued has gone, and its free
         * frees the socket (ws_conn_free). */
        c->flags |= MS_CONN_CLOSING;
        ms__conn_flush(c);
        ms__conn_release(c);
        return;
    }
    if (ws->req != NULL && ws->req->tunnel == &ws->tunnel)
        ws->req->tunnel = NULL; /* the request, still the handler's, closes as a tunnel does */
    if (!ws->outlive)
        s->stats->in_flight++; /* back to a request in flight, which ms_req_finish counts out */
    ws_release(ws);
}

int ms_ws_receive(ms_ws_t *ws, int *op, const char **data, size_t *len, int *code)
{
    ms_buf_t *b = &ws->inq;
    if (ws->taken > 0) {
        memmove(b->base, b->base + ws->taken, b->len - ws->taken);
        b->len -= ws->taken;
        ws->taken = 0;
        if (b->len == 0)
            buf_release(b); /* an idle socket holds no queue */
        if (ws->read_off && b->len <= WS_INQ_HIGH / 2 && !ws->gone) {
            ws->read_off = 0;
            read_on(ws, 1);
        }
    }
    if (b->len == 0)
        return ws->gone ? MS_ECLOSED : MS_WS_PENDING;
    const uint8_t *h = (const uint8_t *)b->base;
    size_t n = ((size_t)h[3] << 24) | ((size_t)h[4] << 16) | ((size_t)h[5] << 8) | h[6];
    *op = h[0];
    *code = (h[1] << 8) | h[2];
    *data = b->base + WS_REC_HEAD;
    *len = n;
    ws->taken = WS_REC_HEAD + n;
    return MS_WS_GOT;
}

void ms_ws_wait(ms_ws_t *ws, int32_t slot)
{
    ws->slot = slot;
}

static size_t queued(ms_ws_t *ws)
{
    return ws->conn != NULL ? ms__conn_queued(ws->conn) : ms__req_queued(ws->req);
}

/* Whether `len` more bytes fit the send queue; if not, the socket closes with 1008. */
static int room(ms_ws_t *ws, size_t len)
{
    if (queued(ws) + len <= ws->send_queue)
        return 1;
    log_close(ws, MS_WS_POLICY, "the peer does not read: send queue over its cap");
    send_close(ws, MS_WS_POLICY, "send queue full", 15);
    if (ws->conn != NULL)
        ws->conn->flags |= MS_CONN_CLOSING;
    else
        ms_req_fail(ws->req);
    cut(ws);
    return 0;
}

int ms_ws_send(ms_ws_t *ws, int op, const char *p, size_t len, int owner, int32_t anchor)
{
    if (ws->gone || ws->p.close_sent || ((op & 0x8) && len > MS_WS_CONTROL_MAX)) {
        drop(ws, owner, anchor);
        return (op & 0x8) && len > MS_WS_CONTROL_MAX ? MS_ETOOBIG : MS_ECLOSED;
    }
    if (ws->deflate_bits && !(op & 0x8) && len >= WS_DEFLATE_MIN) {
        size_t zn;
        const char *z = ms_ws_deflate(&ws->p, p, len, ws->deflate_bits, &zn);
        if (z != NULL) {
            /* Compressed into the process's buffer: copied into the queue, and the string
             * is not needed. */
            drop(ws, owner, anchor);
            uint8_t zh[10];
            size_t zhl = ms_ws_frame_head(zh, op, 1, zn);
            zh[0] |= 0x40; /* RSV1: compressed */
            if (!room(ws, zhl + zn))
                return MS_ETOOBIG;
            ws->last_msg = now_ms(ws);
            queue(ws, (const char *)zh, zhl, MS_VEC_OUT, -1);
            queue(ws, z, zn, MS_VEC_OUT, -1);
            write_now(ws);
            return 0;
        }
    }
    uint8_t h[10];
    size_t hl = ms_ws_frame_head(h, op, 1, len);
    if (!room(ws, hl + len)) {
        drop(ws, owner, anchor);
        return MS_ETOOBIG;
    }
    if (!(op & 0x8))
        ws->last_msg = now_ms(ws);
    queue(ws, (const char *)h, hl, MS_VEC_OUT, -1);
    if (len > 0)
        queue(ws, p, len, owner, anchor);
    else
        drop(ws, owner, anchor);
    write_now(ws);
    return 0;
}

int ms_ws_send_frame(ms_ws_t *ws, const char *frame, size_t len, int owner, int32_t anchor)
{
    if (ws->gone || ws->p.close_sent || !room(ws, len)) {
        drop(ws, owner, anchor);
        return ws->gone || ws->p.close_sent ? MS_ECLOSED : MS_ETOOBIG;
    }
    ws->last_msg = now_ms(ws);
    queue(ws, frame, len, owner, anchor);
    write_now(ws);
    return 0;
}

int ms_ws_close(ms_ws_t *ws, int code, const char *reason, size_t rlen)
{
    if (ws->gone || ws->p.close_sent)
        return MS_ECLOSED;
    send_close(ws, code, reason, rlen);
    return 0;
}

int ms_ws_closed(ms_ws_t *ws)
{
    return ws->gone || ws->p.close_sent;
}

void ms__ws_stop_all(ms_server_t *s)
{
    for (ms_ws_t *ws = s->ws_open; ws != NULL; ws = ws->next) {
        send_close(ws, MS_WS_GOING_AWAY, "server stopping", 15);
        wake(ws);
    }
}

const ms_part_t ms__ws_part = {.name = "websocket", .stop = ms__ws_stop_all};
