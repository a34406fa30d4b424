/* ws_test.c: the WebSocket frame parser fed client frames as bytes (whole, and a byte at a
 * time), the close handshake's codes, UTF-8 across fragments, the caps, and the server's
 * frame builder. */
#include "test.h"

#include "../../../core/tunnel/ws.c"

/* What the parser handed on, as text: "text(hi) ping(x) close(1000,bye)", and what it sent. */
typedef struct seen_s {
    char log[8192];
    uint8_t sent[4096];
    size_t nsent;
} seen_t;

static void seen_message(ms_ws_parser_t *p, int op, const char *d, size_t n, int code)
{
    seen_t *s = p->data;
    static const char *names[] = {[MS_WS_TEXT] = "text", [MS_WS_BINARY] = "binary",
                                  [MS_WS_CLOSE] = "close", [MS_WS_PING] = "ping",
                                  [MS_WS_PONG] = "pong"};
    size_t l = strlen(s->log);
    if (op == MS_WS_CLOSE)
        snprintf(s->log + l, sizeof(s->log) - l, "%sclose(%d,%.*s)", l ? " " : "", code, (int)n,
                 d ? d : "");
    else
        snprintf(s->log + l, sizeof(s->log) - l, "%s%s(%.*s)", l ? " " : "", names[op], (int)n,
                 d ? d : "");
}

static void seen_send(ms_ws_parser_t *p, const char *d, size_t n)
{
    seen_t *s = p->data;
    memcpy(s->sent + s->nsent, d, n);
    s->nsent += n;
}

/* The clock the parser reads at a control frame (ms). */
static uint32_t clock_ms;
static uint32_t seen_now(ms_ws_parser_t *p)
{
    return clock_ms;
}

static const ms_ws_parser_ops_t seen_ops = {
    .message = seen_message, .send = seen_send, .now = seen_now};

/* A client frame: b0 is FIN|RSV|opcode, masked with a fixed key unless `unmasked`. */
static size_t client_frame(uint8_t *out, uint8_t b0, const char *payload, size_t n, int unmasked)
{
    static const uint8_t key[4] = {0x37, 0xfa, 0x21, 0x3d};
    size_t h = ms_ws_frame_head(out, 0, 0, n);
    out[0] = b0;
    if (!unmasked) {
        out[1] |= 0x80;
        memcpy(out + h, key, 4);
        h += 4;
    }
    for (size_t i = 0; i < n; i++)
        out[h + i] = (uint8_t)payload[i] ^ (unmasked ? 0 : key[i & 3]);
    return h + n;
}

/* Frames to feed, built up in one buffer. */
typedef struct wire_s {
    uint8_t b[1 << 17];
    size_t n;
} wire_t;

static void add(wire_t *w, uint8_t b0, const char *payload, size_t n)
{
    w->n += client_frame(w->b + w->n, b0, payload, n, 0);
}

static int feed(ms_ws_parser_t *p, seen_t *s, const wire_t *w, int bytewise, uint64_t cap)
{
    memset(s, 0, sizeof(*s));
    ms_ws_parser_init(p, &seen_ops, cap, cap);
    p->data = s;
    int rc = 0;
    if (bytewise) {
        for (size_t i = 0; i < w->n && rc == 0; i++)
            rc = ms_ws_parse(p, (const char *)w->b + i, 1);
    } else {
        rc = ms_ws_parse(p, (const char *)w->b, w->n);
    }
    return rc;
}

/* The close code of the close frame the parser sent, or -1. */
static int sent_close(const seen_t *s)
{
    for (size_t i = 0; i + 1 < s->nsent;) {
        size_t len = s->sent[i + 1] & 0x7F, h = 2;
        if ((s->sent[i] & 0x0F) == MS_WS_CLOSE)
            return len >= 2 ? (s->sent[i + h] << 8) | s->sent[i + h + 1] : 0;
        i += h + len;
    }
    return -1;
}

/* Both ways of feeding give `rc` and `log`; a failure sent close `code`. */
#define EXPECT(w, cap, want_rc, want_log, want_code)                                           \
    for (int bw_ = 0; bw_ < 2; bw_++) {                                                        \
        ms_ws_parser_t p_;                                                                     \
        static seen_t s_;                                                                      \
        int rc_ = feed(&p_, &s_, (w), bw_, (cap));                                             \
        ASSERT_EQ((want_rc), rc_);                                                             \
        ASSERT_STR_EQ((want_log), s_.log);                                                     \
        ASSERT_EQ((want_code), sent_close(&s_));                                               \
        ms_ws_parser_free(&p_);                                                                \
    }

#define S(lit) lit, sizeof(lit) - 1

static wire_t w;

TEST(ws_parses_masked_text_and_binary_messages)
{
    w.n = 0;
    add(&w, 0x81, S("hello"));
    add(&w, 0x82, S("\x01\x02\xff"));
    add(&w, 0x81, "", 0);
    EXPECT(&w, 1 << 20, 0, "text(hello) binary(\x01\x02\xff) text()", -1);
}

TEST(ws_reads_16_and_64_bit_lengths)
{
    static char big[70000];
    memset(big, 'a', sizeof(big));
    w.n = 0;
    add(&w, 0x82, big, 300);
    add(&w, 0x82, big, sizeof(big));
    ms_ws_parser_t p;
    static seen_t s;
    ASSERT_EQ(0, feed(&p, &s, &w, 0, 1 << 20));
    ASSERT_EQ(0, strncmp(s.log, "binary(aaa", 10));
    ASSERT_EQ(' ', s.log[strlen("binary()") + 300]); /* the first is 300 bytes long */
    ASSERT_EQ(70000, p.flen);                         /* the second's length, 64-bit */
    ms_ws_parser_free(&p);
}

TEST(ws_reassembles_fragments_with_control_frames_between_them)
{
    w.n = 0;
    add(&w, 0x01, S("hel"));
    add(&w, 0x89, S("p1")); /* ping between fragments: answered at once */
    add(&w, 0x00, S("lo "));
    add(&w, 0x8A, S("p2")); /* an unasked pong: handed on, not answered */
    add(&w, 0x80, S("world"));
    EXPECT(&w, 1 << 20, 0, "ping(p1) pong(p2) text(hello world)", -1);
    ms_ws_parser_t p;
    static seen_t s;
    feed(&p, &s, &w, 0, 1 << 20);
    ASSERT_EQ(4, s.nsent);
    ASSERT_EQ(0, memcmp(s.sent, "\x8a\x02p1", 4)); /* the pong carries the ping's bytes */
    ms_ws_parser_free(&p);
}

TEST(ws_accepts_a_code_point_split_across_fragments)
{
    w.n = 0;
    add(&w, 0x01, S("caf\xc3"));
    add(&w, 0x00, S("\xa9 \xf0\x9f"));
    add(&w, 0x80, S("\x98\x80"));
    EXPECT(&w, 1 << 20, 0, "text(caf\xc3\xa9 \xf0\x9f\x98\x80)", -1);
}

TEST(ws_refuses_bad_utf8_at_once_not_at_the_end_of_the_message)
{
    w.n = 0;
    add(&w, 0x01, S("ok"));
    add(&w, 0x00, S("\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80")); /* surrogate */
    /* no final fragment: the error comes before it */
    EXPECT(&w, 1 << 20, MS_EBADREQ, "", 1007);
    static const char *bad[] = {"\xc0\xaf", "\xe0\x80\xaf", "\xf4\x90\x80\x80", "\xff",
                                "\x80", "\xf8\x88\x80\x80\x80"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        w.n = 0;
        add(&w, 0x81, bad[i], strlen(bad[i]));
        EXPECT(&w, 1 << 20, MS_EBADREQ, "", 1007);
    }
}

TEST(ws_refuses_text_that_ends_inside_a_code_point)
{
    w.n = 0;
    add(&w, 0x01, S("a\xe2\x82"));
    add(&w, 0x80, "", 0);
    EXPECT(&w, 1 << 20, MS_EBADREQ, "", 1007);
}

TEST(ws_refuses_protocol_errors_with_1002)
{
    static const struct {
        uint8_t b0;
        const char *payload;
        size_t n;
        int unmasked;
        const char *why;
    } cases[] = {
        {0x81, "x", 1, 1, "unmasked frame from the client"},
        {0xC1, "x", 1, 0, "reserved bits set"},
        {0xA1, "x", 1, 0, "reserved bits set"},
        {0x91, "x", 1, 0, "reserved bits set"},
        {0x83, "x", 1, 0, "reserved opcode"},
        {0x87, "x", 1, 0, "reserved opcode"},
        {0x8B, "x", 1, 0, "reserved opcode"},
        {0x8F, "x", 1, 0, "reserved opcode"},
        {0x09, "x", 1, 0, "fragmented control frame"},
        {0x80, "x", 1, 0, "continuation frame outside a message"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        w.n = client_frame(w.b, cases[i].b0, cases[i].payload, cases[i].n, cases[i].unmasked);
        ms_ws_parser_t p;
        static seen_t s;
        ASSERT_EQ(MS_EBADREQ, feed(&p, &s, &w, 0, 1 << 20));
        ASSERT_STR_EQ(cases[i].why, p.why);
        ASSERT_EQ(1002, sent_close(&s));
        ms_ws_parser_free(&p);
    }
    /* A ping of 126 bytes. */
    static char x[126];
    memset(x, 'x', sizeof(x));
    w.n = 0;
    add(&w, 0x89, x, sizeof(x));
    EXPECT(&w, 1 << 20, MS_EBADREQ, "", 1002);
    /* A new message while one is fragmented. */
    w.n = 0;
    add(&w, 0x01, S("a"));
    add(&w, 0x81, S("b"));
    EXPECT(&w, 1 << 20, MS_EBADREQ, "", 1002);
}

TEST(ws_refuses_a_message_or_frame_over_its_cap_with_1009)
{
    static char x[200];
    memset(x, 'x', sizeof(x));
    w.n = 0;
    add(&w, 0x82, x, 101);
    EXPECT(&w, 100, MS_EBADREQ, "", 1009);
    /* fragments that add up past the cap: refused at the head that would pass it */
    w.n = 0;
    add(&w, 0x02, x, 60);
    add(&w, 0x80, x, 60);
    EXPECT(&w, 100, MS_EBADREQ, "", 1009);
    w.n = 0;
    add(&w, 0x82, x, 100);
    char want[128] = "binary(";
    memset(want + 7, 'x', 100);
    strcpy(want + 107, ")");
    EXPECT(&w, 100, 0, want, -1); /* at the cap: taken */
    /* a 64-bit length with the top bit set */
    w.n = 0;
    uint8_t h[] = {0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4};
    memcpy(w.b, h, sizeof(h));
    w.n = sizeof(h);
    EXPECT(&w, 100, MS_EBADREQ, "", 1002);
}

TEST(ws_takes_close_codes_in_the_allowed_ranges_and_answers_with_the_same_code)
{
    static const int ok[] = {1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999,
                             4000, 4999};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        char f[8] = {(char)(ok[i] >> 8), (char)ok[i], 'b', 'y', 'e'};
        w.n = 0;
        add(&w, 0x88, f, 5);
        add(&w, 0x81, S("after")); /* nothing is read past a close */
        char want[64];
        snprintf(want, sizeof(want), "close(%d,bye)", ok[i]);
        EXPECT(&w, 1 << 20, 0, want, ok[i]);
    }
    w.n = 0;
    add(&w, 0x88, "", 0);
    EXPECT(&w, 1 << 20, 0, "close(1005,)", 0); /* no code: answered with none */
}

TEST(ws_refuses_close_codes_outside_them_with_1002)
{
    static const int bad[] = {0, 999, 1004, 1005, 1006, 1012, 1014, 1015, 1016, 2000, 2999, 5000,
                              65535};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char f[2] = {(char)(bad[i] >> 8), (char)bad[i]};
        w.n = 0;
        add(&w, 0x88, f, 2);
        EXPECT(&w, 1 << 20, MS_EBADREQ, "", 1002);
    }
    w.n = 0;
    add(&w, 0x88, "\x03", 1); /* one byte */
    EXPECT(&w, 1 << 20, MS_EBADREQ, "", 1002);
}

TEST(ws_refuses_a_close_reason_that_is_not_utf8_with_1007)
{
    w.n = 0;
    add(&w, 0x88, S("\x03\xe8\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80"));
    EXPECT(&w, 1 << 20, MS_EBADREQ, "", 1007);
}

TEST(ws_builds_server_frames_unmasked)
{
    uint8_t h[10];
    ASSERT_EQ(2, ms_ws_frame_head(h, MS_WS_TEXT, 1, 125));
    ASSERT_EQ(0x81, h[0]);
    ASSERT_EQ(125, h[1]);
    ASSERT_EQ(4, ms_ws_frame_head(h, MS_WS_BINARY, 1, 126));
    ASSERT_EQ(0x82, h[0]);
    ASSERT_EQ(126, h[1]);
    ASSERT_EQ(0, h[2]);
    ASSERT_EQ(126, h[3]);
    ASSERT_EQ(4, ms_ws_frame_head(h, MS_WS_BINARY, 0, 65535));
    ASSERT_EQ(10, ms_ws_frame_head(h, MS_WS_BINARY, 0, 65536));
    ASSERT_EQ(0x02, h[0]);
    ASSERT_EQ(127, h[1]);
    ASSERT_EQ(1, h[7]);
    ASSERT_EQ(0, h[8]);
    /* A close reason too long for a control frame is cut where no code point splits. */
    static char reason[200];
    for (size_t i = 0; i < sizeof(reason); i += 2)
        reason[i] = '\xc3', reason[i + 1] = '\xa9';
    uint8_t f[2 + MS_WS_CONTROL_MAX];
    size_t n = ms_ws_close_frame(f, 1000, reason, sizeof(reason));
    ASSERT(n <= 2 + MS_WS_CONTROL_MAX);
    ASSERT_EQ(n - 2, f[1]);
    ASSERT(ms_ws_utf8_ok((const char *)f + 4, n - 4));
    ASSERT_EQ(0x03, f[2]);
    ASSERT_EQ(0xe8, f[3]);
}

/* -- Floods of frames that carry nothing ---------------------------------------------------- */

/* Feeds the wire to a parser with a cap on fragments and on control frames a second, its
 * clock at `now`; a byte at a time with `bytewise`. */
static int feed_counted(ms_ws_parser_t *p, seen_t *s, const wire_t *wire, uint32_t frags,
                        uint32_t control, int bytewise)
{
    memset(s, 0, sizeof(*s));
    ms_ws_parser_init(p, &seen_ops, 1 << 20, 1 << 20);
    p->data = s;
    p->max_fragments = frags;
    p->max_control = control;
    int rc = 0;
    for (size_t i = 0; i < wire->n && rc == 0; i += bytewise ? 1 : wire->n)
        rc = ms_ws_parse(p, (const char *)wire->b + i, bytewise ? 1 : wire->n);
    return rc;
}

TEST(ws_closes_a_message_of_more_fragments_than_its_cap_with_1008)
{
    w.n = 0;
    add(&w, 0x01, S("a"));
    for (int i = 0; i < 3; i++)
        add(&w, 0x00, "", 0);
    add(&w, 0x80, S("b"));
    for (int bw = 0; bw < 2; bw++) {
        ms_ws_parser_t p;
        static seen_t s;
        ASSERT_EQ(0, feed_counted(&p, &s, &w, 5, 0, bw)); /* five frames: at the cap */
        ASSERT_STR_EQ("text(ab)", s.log);
        ms_ws_parser_free(&p);
        ASSERT_EQ(MS_EBADREQ, feed_counted(&p, &s, &w, 4, 0, bw));
        ASSERT_EQ(1008, sent_close(&s));
        ASSERT_STR_EQ("too many fragments in one message", p.why);
        ASSERT_STR_EQ("", s.log);
        ms_ws_parser_free(&p);
        ASSERT_EQ(0, feed_counted(&p, &s, &w, 0, 0, bw)); /* 0: no cap */
        ms_ws_parser_free(&p);
    }
    /* A flood of empty continuations stops at the cap: nothing after it is read. */
    w.n = 0;
    add(&w, 0x02, "", 0);
    while (w.n + 6 <= sizeof(w.b))
        add(&w, 0x00, "", 0); /* six bytes each: about 21800 of them */
    ms_ws_parser_t p;
    static seen_t s;
    ASSERT_EQ(MS_EBADREQ, feed_counted(&p, &s, &w, 4096, 0, 0));
    ASSERT_EQ(1008, sent_close(&s));
    ASSERT_EQ(4096, p.frags);
    ASSERT_EQ(1, p.done);
    ms_ws_parser_free(&p);
    /* Each message counts its own frames. */
    w.n = 0;
    for (int m = 0; m < 3; m++) {
        add(&w, 0x01, S("x"));
        add(&w, 0x00, "", 0);
        add(&w, 0x80, "", 0);
    }
    ASSERT_EQ(0, feed_counted(&p, &s, &w, 3, 0, 0));
    ASSERT_STR_EQ("text(x) text(x) text(x)", s.log);
    ms_ws_parser_free(&p);
}

static void drop_message(ms_ws_parser_t *p, int op, const char *d, size_t n, int code)
{
}
static void drop_send(ms_ws_parser_t *p, const char *d, size_t n)
{
}
static const ms_ws_parser_ops_t drop_ops = {
    .message = drop_message, .send = drop_send, .now = seen_now};

/* Feeds w again and again until the parser refuses or `frames` frames have gone in. */
static int feed_until(ms_ws_parser_t *p, size_t per_feed, size_t frames)
{
    int rc = 0;
    for (size_t fed = 0; rc == 0 && fed < frames; fed += per_feed)
        rc = ms_ws_parse(p, (const char *)w.b, w.n);
    return rc;
}

TEST(ws_holds_its_frame_caps_at_their_largest_value)
{
    /* The counts are 16 bits: at a cap of 65535 they must refuse, not wrap to 0. Empty
     * continuations after a first frame, then pings within one second. */
    static const uint8_t flood[] = {0x00, 0x89};
    static const char *why[] = {"too many fragments in one message",
                                "too many control frames a second"};
    for (int k = 0; k < 2; k++) {
        ms_ws_parser_t p;
        ms_ws_parser_init(&p, &drop_ops, 1 << 20, 1 << 20);
        *(k == 0 ? &p.max_fragments : &p.max_control) = 65535;
        clock_ms = 0;
        w.n = 0;
        add(&w, 0x02, "", 0);
        ASSERT_EQ(0, ms_ws_parse(&p, (const char *)w.b, w.n));
        w.n = 0;
        for (int i = 0; i < 4096; i++)
            add(&w, flood[k], "", 0);
        ASSERT_EQ(MS_EBADREQ, feed_until(&p, 4096, 70000));
        ASSERT_EQ(65535, k == 0 ? p.frags : p.ctl_n);
        ASSERT_STR_EQ(why[k], p.why);
        ms_ws_parser_free(&p);
    }
}

TEST(ws_closes_a_peer_over_its_control_frames_a_second_with_1008)
{
    ms_ws_parser_t p;
    static seen_t s;
    w.n = 0;
    for (int i = 0; i < 3; i++)
        add(&w, 0x89, S("p"));
    clock_ms = 0;
    ASSERT_EQ(0, feed_counted(&p, &s, &w, 0, 3, 0)); /* three in a second: at the cap */
    ASSERT_STR_EQ("ping(p) ping(p) ping(p)", s.log);
    /* The next second has its own count; one more within it closes. */
    clock_ms = 1000;
    ASSERT_EQ(0, ms_ws_parse(&p, (const char *)w.b, w.n));
    clock_ms = 1999;
    uint8_t pong[16];
    size_t n = client_frame(pong, 0x8A, "", 0, 0);
    ASSERT_EQ(MS_EBADREQ, ms_ws_parse(&p, (const char *)pong, n));
    ASSERT_EQ(1008, sent_close(&s));
    ASSERT_STR_EQ("too many control frames a second", p.why);
    ms_ws_parser_free(&p);
    /* 0: no cap */
    ASSERT_EQ(0, feed_counted(&p, &s, &w, 0, 0, 0));
    ASSERT_EQ(0, ms_ws_parse(&p, (const char *)w.b, w.n));
    ms_ws_parser_free(&p);
}

/* -- permessage-deflate ------------------------------------------------------------------ */

/* `n` bytes of `in` as one compressed message's payload: raw deflate, its 00 00 ff ff off. */
static size_t squeeze(const char *in, size_t n, uint8_t *out, size_t cap)
{
    z_stream z;
    memset(&z, 0, sizeof(z));
    deflateInit2(&z, 9, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    deflate(&z, Z_SYNC_FLUSH);
    size_t len = cap - z.avail_out - 4;
    deflateEnd(&z);
    return len;
}

/* Feeds the wire to a parser with permessage-deflate agreed; with `inflate_bits`, with the
 * client's context kept in a window of that many bits (takeover). */
static int feed_deflate_kept(ms_ws_parser_t *p, seen_t *s, const wire_t *wire, uint64_t cap,
                             int inflate_bits)
{
    memset(s, 0, sizeof(*s));
    ms_ws_parser_init(p, &seen_ops, cap, cap);
    p->data = s;
    p->deflate = 1;
    p->inflate_bits = (uint8_t)inflate_bits;
    return ms_ws_parse(p, (const char *)wire->b, wire->n);
}

static int feed_deflate(ms_ws_parser_t *p, seen_t *s, const wire_t *wire, uint64_t cap)
{
    return feed_deflate_kept(p, s, wire, cap, 0);
}

TEST(ws_inflates_a_compressed_message_and_its_fragments)
{
    static uint8_t z[4096];
    const char *text = "caf\xc3\xa9 caf\xc3\xa9 caf\xc3\xa9 caf\xc3\xa9 caf\xc3\xa9";
    size_t zn = squeeze(text, strlen(text), z, sizeof(z));
    w.n = 0;
    add(&w, 0x41, (const char *)z, zn / 2);                  /* RSV1 on the first frame */
    add(&w, 0x89, S("between"));
    add(&w, 0x80, (const char *)z + zn / 2, zn - zn / 2);     /* none on the continuation */
    add(&w, 0x81, S("plain")); /* a message may go uncompressed */
    ms_ws_parser_t p;
    static seen_t s;
    int rc = feed_deflate(&p, &s, &w, 1 << 20);
    ASSERT_STR_EQ("", p.why ? p.why : "");
    ASSERT_EQ(0, rc);
    char want[256];
    snprintf(want, sizeof(want), "ping(between) text(%s) text(plain)", text);
    ASSERT_STR_EQ(want, s.log);
    ms_ws_parser_free(&p);
}

TEST(ws_takes_an_empty_message_compressed_or_not_and_empty_text_is_utf8)
{
    /* An empty message may have no buffer at all: the UTF-8 check is given NULL and 0. */
    ASSERT(ms_ws_utf8_ok(NULL, 0));
    static uint8_t z[64];
    size_t zn = squeeze("", 0, z, sizeof(z));
    w.n = 0;
    add(&w, 0xC1, (const char *)z, zn); /* compressed, inflates to nothing */
    add(&w, 0x81, "", 0);
    add(&w, 0x82, "", 0);
    ms_ws_parser_t p;
    static seen_t s;
    ASSERT_EQ(0, feed_deflate(&p, &s, &w, 1 << 20));
    ASSERT_STR_EQ("text() text() binary()", s.log);
    ms_ws_parser_free(&p);
}

TEST(ws_refuses_rsv1_on_a_continuation_or_control_frame_even_with_deflate)
{
    w.n = 0;
    add(&w, 0x01, S("a"));
    add(&w, 0xC0, S("b"));
    ms_ws_parser_t p;
    static seen_t s;
    ASSERT_EQ(MS_EBADREQ, feed_deflate(&p, &s, &w, 1 << 20));
    ASSERT_EQ(1002, sent_close(&s));
    ms_ws_parser_free(&p);
    w.n = 0;
    add(&w, 0xC9, S("ping"));
    ASSERT_EQ(MS_EBADREQ, feed_deflate(&p, &s, &w, 1 << 20));
    ASSERT_EQ(1002, sent_close(&s));
    ms_ws_parser_free(&p);
}

TEST(ws_stops_a_decompression_bomb_at_the_message_cap)
{
    static char zeros[8 << 20];
    static uint8_t z[64 << 10];
    size_t zn = squeeze(zeros, sizeof(zeros), z, sizeof(z)); /* 8 MiB in about 8 KiB */
    ASSERT(zn < sizeof(z));
    w.n = 0;
    add(&w, 0xC2, (const char *)z, zn);
    ms_ws_parser_t p;
    static seen_t s;
    uint64_t allocs = ms_mem_stats.allocs + ms_mem_stats.reallocs;
    ASSERT_EQ(MS_EBADREQ, feed_deflate(&p, &s, &w, 1 << 20));
    ASSERT_EQ(1009, sent_close(&s));
    ASSERT_STR_EQ("message over the size cap as it inflates", p.why);
    ASSERT(p.zout.cap <= (1 << 20) + 1); /* it never held more than the cap */
    ASSERT(ms_mem_stats.allocs + ms_mem_stats.reallocs - allocs < 20);
    ms_ws_parser_free(&p);
}

/* What a parser handed on last: its opcode and length. */
static int last_op;
static size_t last_len;
static void count_message(ms_ws_parser_t *p, int op, const char *d, size_t n, int code)
{
    last_op = op;
    last_len = n;
}
static const ms_ws_parser_ops_t count_ops = {.message = count_message, .send = seen_send};

TEST(ws_takes_a_compressed_message_at_the_cap_whose_frame_is_larger_than_the_cap)
{
    /* Bytes that do not shrink: deflate stores them, with a few bytes a block, so a message
     * of exactly the cap (1 MiB) takes a frame a little over it. The frame passes; the
     * check is on the message inflated. */
    enum { CAP = 1 << 20 };
    static char noise[CAP + 1];
    uint32_t x = 2463534242u;
    for (size_t i = 0; i < sizeof(noise); i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        noise[i] = (char)x;
    }
    static uint8_t z[CAP + CAP / 4], frame[CAP + CAP / 4 + 16];
    size_t zn = squeeze(noise, CAP, z, sizeof(z));
    ASSERT(zn > CAP);
    ASSERT(zn <= ms_ws_deflated_cap(CAP));
    size_t fn = client_frame(frame, 0xC2, (const char *)z, zn, 0);
    ms_ws_parser_t p;
    static seen_t s;
    memset(&s, 0, sizeof(s));
    ms_ws_parser_init(&p, &count_ops, CAP, CAP);
    p.data = &s;
    p.deflate = 1;
    last_op = 0;
    ASSERT_EQ(0, ms_ws_parse(&p, (const char *)frame, fn));
    ASSERT_EQ(MS_WS_BINARY, last_op);
    ASSERT_EQ(CAP, last_len);
    ASSERT_EQ(-1, sent_close(&s));
    /* Fragmented, the same. */
    size_t half = zn / 2;
    size_t f1 = client_frame(frame, 0x42, (const char *)z, half, 0);
    size_t f2 = client_frame(frame + f1, 0x80, (const char *)z + half, zn - half, 0);
    last_op = 0;
    ASSERT_EQ(0, ms_ws_parse(&p, (const char *)frame, f1 + f2));
    ASSERT_EQ(CAP, last_len);
    ms_ws_parser_free(&p);
    /* One byte more, inflated, is over the cap: refused as it inflates. */
    zn = squeeze(noise, CAP + 1, z, sizeof(z));
    fn = client_frame(frame, 0xC2, (const char *)z, zn, 0);
    memset(&s, 0, sizeof(s));
    ms_ws_parser_init(&p, &count_ops, CAP, CAP);
    p.data = &s;
    p.deflate = 1;
    ASSERT_EQ(MS_EBADREQ, ms_ws_parse(&p, (const char *)frame, fn));
    ASSERT_EQ(1009, sent_close(&s));
    ASSERT_STR_EQ("message over the size cap as it inflates", p.why);
    ms_ws_parser_free(&p);
    /* An uncompressed frame is held to the cap itself, and a compressed one to deflate's
     * worst case of it. */
    static wire_t big;
    memset(&s, 0, sizeof(s));
    ms_ws_parser_init(&p, &count_ops, 1000, 1000);
    p.data = &s;
    p.deflate = 1;
    big.n = client_frame(big.b, 0x82, noise, 1001, 0);
    ASSERT_EQ(MS_EBADREQ, ms_ws_parse(&p, (const char *)big.b, big.n));
    ASSERT_STR_EQ("frame over the size cap", p.why);
    ms_ws_parser_free(&p);
    memset(&s, 0, sizeof(s));
    ms_ws_parser_init(&p, &count_ops, 1000, 1000);
    p.data = &s;
    p.deflate = 1;
    big.n = client_frame(big.b, 0xC2, noise, (size_t)ms_ws_deflated_cap(1000) + 1, 0);
    ASSERT_EQ(MS_EBADREQ, ms_ws_parse(&p, (const char *)big.b, big.n));
    ASSERT_STR_EQ("frame over the size cap", p.why);
    ASSERT_EQ(1009, sent_close(&s));
    ms_ws_parser_free(&p);
}

TEST(ws_refuses_compressed_text_that_inflates_to_bad_utf8_and_data_that_does_not_inflate)
{
    static uint8_t z[256];
    size_t zn = squeeze("ok \xed\xa0\x80", 6, z, sizeof(z));
    w.n = 0;
    add(&w, 0xC1, (const char *)z, zn);
    ms_ws_parser_t p;
    static seen_t s;
    ASSERT_EQ(MS_EBADREQ, feed_deflate(&p, &s, &w, 1 << 20));
    ASSERT_EQ(1007, sent_close(&s));
    ms_ws_parser_free(&p);
    w.n = 0;
    add(&w, 0xC2, S("\xff\xff\xff\xff not deflate"));
    ASSERT_EQ(MS_EBADREQ, feed_deflate(&p, &s, &w, 1 << 20));
    ASSERT_EQ(1007, sent_close(&s));
    ms_ws_parser_free(&p);
}

TEST(ws_deflates_what_it_sends_without_the_sync_tail)
{
    static char text[5000];
    memset(text, 'q', sizeof(text));
    size_t zn;
    const char *z = ms_ws_deflate(NULL, text, sizeof(text), 15, &zn);
    ASSERT(z != NULL && zn < 100);
    /* The client's side of it: the tail put back, inflated. */
    static uint8_t back[8192];
    uint8_t in[256];
    memcpy(in, z, zn);
    memcpy(in + zn, "\x00\x00\xff\xff", 4);
    z_stream u;
    memset(&u, 0, sizeof(u));
    inflateInit2(&u, -15);
    u.next_in = in;
    u.avail_in = (uInt)zn + 4;
    u.next_out = back;
    u.avail_out = sizeof(back);
    inflate(&u, Z_SYNC_FLUSH);
    ASSERT_EQ(sizeof(text), sizeof(back) - u.avail_out);
    ASSERT_EQ(0, memcmp(back, text, sizeof(text)));
    inflateEnd(&u);
    /* Every message is deflated on its own: the same bytes twice give the same output. */
    size_t zn2;
    const char *z2 = ms_ws_deflate(NULL, text, sizeof(text), 15, &zn2);
    ASSERT_EQ(zn, zn2);
    ASSERT_EQ(0, memcmp(in, z2, zn));
}

/* -- Context takeover (RFC 7692 7.1.1) ----------------------------------------------------- */

/* The client's side of a socket with context takeover: one raw deflate stream, never reset;
 * each message flushed, its 00 00 ff ff off, and `final` ends it with a final block. */
static size_t squeeze_kept(z_stream *z, const char *in, size_t n, uint8_t *out, size_t cap,
                           int final)
{
    z->next_in = (Bytef *)in;
    z->avail_in = (uInt)n;
    z->next_out = out;
    z->avail_out = (uInt)cap;
    deflate(z, final ? Z_FINISH : Z_SYNC_FLUSH);
    return cap - z->avail_out - (final ? 0 : 4);
}

static const char takeover_text[] =
    "{\"type\":\"tick\",\"symbol\":\"MOON\",\"price\":12.5,\"volume\":1000}";

TEST(ws_inflates_messages_that_refer_to_the_ones_before_with_takeover_and_refuses_them_without)
{
    z_stream c;
    memset(&c, 0, sizeof(c));
    deflateInit2(&c, 9, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
    static uint8_t z1[256], z2[256];
    size_t n1 = squeeze_kept(&c, S(takeover_text), z1, sizeof(z1), 0);
    size_t n2 = squeeze_kept(&c, S(takeover_text), z2, sizeof(z2), 0);
    deflateEnd(&c);
    ASSERT(n2 < n1 / 2); /* the second is mostly a reference into the first */
    w.n = 0;
    add(&w, 0xC1, (const char *)z1, n1);
    add(&w, 0xC1, (const char *)z2, n2);
    ms_ws_parser_t p;
    static seen_t s;
    ASSERT_EQ(0, feed_deflate_kept(&p, &s, &w, 1 << 20, 15));
    char want[256];
    snprintf(want, sizeof(want), "text(%s) text(%s)", takeover_text, takeover_text);
    ASSERT_STR_EQ(want, s.log);
    ASSERT(p.z != NULL && p.z->in_ready); /* the client's context stays with the socket */
    ASSERT(p.zout.base == NULL);          /* but no message buffer does */
    ms_ws_parser_free(&p);
    ASSERT(p.z == NULL);
    /* Without takeover each message is inflated on its own: the second refers to nothing. */
    ASSERT_EQ(MS_EBADREQ, feed_deflate(&p, &s, &w, 1 << 20));
    ASSERT_EQ(1007, sent_close(&s));
    ms_ws_parser_free(&p);
}

TEST(ws_keeps_the_window_with_takeover_after_a_message_that_ends_with_a_final_block)
{
    /* A client may end a message with BFINAL (RFC 7692 7.2.3.3): its stream ends, and the
     * next message starts a new one that still refers to the window. */
    static uint8_t z1[256], z2[256];
    z_stream c;
    memset(&c, 0, sizeof(c));
    deflateInit2(&c, 9, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
    size_t n1 = squeeze_kept(&c, S(takeover_text), z1, sizeof(z1), 1);
    deflateEnd(&c);
    memset(&c, 0, sizeof(c));
    deflateInit2(&c, 9, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
    deflateSetDictionary(&c, (const Bytef *)takeover_text, sizeof(takeover_text) - 1);
    size_t n2 = squeeze_kept(&c, S(takeover_text), z2, sizeof(z2), 0);
    deflateEnd(&c);
    w.n = 0;
    add(&w, 0xC1, (const char *)z1, n1);
    add(&w, 0xC1, (const char *)z2, n2);
    /* The same bytes again: the window has moved on by the same text, so the references
     * still land on it. */
    add(&w, 0xC1, (const char *)z2, n2);
    ms_ws_parser_t p;
    static seen_t s;
    ASSERT_EQ(0, feed_deflate_kept(&p, &s, &w, 1 << 20, 15));
    char want[512];
    snprintf(want, sizeof(want), "text(%s) text(%s) text(%s)", takeover_text, takeover_text,
             takeover_text);
    ASSERT_STR_EQ(want, s.log);
    ms_ws_parser_free(&p);
}

TEST(ws_deflates_with_its_own_context_kept_across_messages)
{
    ms_ws_parser_t d;
    static seen_t s;
    ms_ws_parser_init(&d, &seen_ops, 1 << 20, 1 << 20);
    d.data = &s;
    d.deflate = 1;
    d.deflate_keep = 2; /* memLevel 2 */
    size_t n1, n2;
    static uint8_t m1[512], m2[512];
    const char *z = ms_ws_deflate(&d, S(takeover_text), 10, &n1);
    ASSERT(z != NULL);
    memcpy(m1, z, n1);
    ASSERT(d.z != NULL && d.z->out_ready && !d.z->in_ready);
    z = ms_ws_deflate(&d, S(takeover_text), 10, &n2);
    ASSERT(z != NULL);
    memcpy(m2, z, n2);
    ASSERT(n2 < n1 / 2);
    /* The client's side: one inflater kept across messages, the tail put back to each. */
    z_stream u;
    memset(&u, 0, sizeof(u));
    inflateInit2(&u, -10);
    const uint8_t *msgs[2] = {m1, m2};
    size_t lens[2] = {n1, n2};
    for (int i = 0; i < 2; i++) {
        uint8_t in[600], back[256];
        memcpy(in, msgs[i], lens[i]);
        memcpy(in + lens[i], "\x00\x00\xff\xff", 4);
        u.next_in = in;
        u.avail_in = (uInt)lens[i] + 4;
        u.next_out = back;
        u.avail_out = sizeof(back);
        ASSERT_EQ(Z_OK, inflate(&u, Z_SYNC_FLUSH));
        ASSERT_EQ(sizeof(takeover_text) - 1, sizeof(back) - u.avail_out);
        ASSERT_EQ(0, memcmp(back, takeover_text, sizeof(takeover_text) - 1));
    }
    inflateEnd(&u);
    ms_ws_parser_free(&d);
}

/* Under ASan nothing is recycled (a use after free must show). */
#if defined(__SANITIZE_ADDRESS__)
#define RECYCLES 0
#else
#define RECYCLES 1
#endif

TEST(ws_holds_no_buffer_between_messages_and_a_warm_parser_does_not_allocate)
{
    /* A text, a fragmented binary, and a compressed text: once each is handed on, the parser
     * keeps neither the reassembled bytes nor the inflated ones, so an idle socket holds
     * nothing of the messages it had; and the buffers come back from the recycle list, so a
     * second round allocates nothing. */
    static char big[3000];
    memset(big, 'b', sizeof(big));
    static uint8_t z[4096];
    size_t zn = squeeze(big, sizeof(big), z, sizeof(z));
    w.n = 0;
    add(&w, 0x81, S("hello"));
    add(&w, 0x02, big, 1000);
    add(&w, 0x80, big, 2000);
    add(&w, 0xC1, (const char *)z, zn);
    ms_ws_parser_t p;
    static seen_t s;
    for (int round = 0; round < 2; round++) {
        uint64_t allocs = ms_mem_stats.allocs + ms_mem_stats.reallocs;
        ASSERT_EQ(0, feed_deflate(&p, &s, &w, 1 << 20));
        ASSERT(p.msg.base == NULL && p.msg.cap == 0);
        ASSERT(p.zout.base == NULL && p.zout.cap == 0);
        if (round == 1 && RECYCLES)
            ASSERT_EQ(0, (long)(ms_mem_stats.allocs + ms_mem_stats.reallocs - allocs));
        ms_ws_parser_free(&p);
    }
}

TEST_MAIN()
