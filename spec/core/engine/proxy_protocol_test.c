/* proxy_protocol_test.c: PROXY protocol headers, trusted ranges and the X-Forwarded-For walk. */
#include "test.h"

#include "../../../core/transport/memio.h"
#include "../../../core/engine/proxy_protocol.c"

#define S(lit) lit, sizeof(lit) - 1

static char ip_text[64];

static const char *ip(const uint8_t a[16])
{
    ms__format_ip(a, ip_text, sizeof(ip_text));
    return ip_text;
}

TEST(proxy_reads_v1_headers)
{
    uint8_t src[16];
    int known;
    static const char v4[] = "PROXY TCP4 192.0.2.7 198.51.100.2 56324 443\r\nGET /";
    ASSERT_EQ(sizeof(v4) - 1 - 5, ms__proxy_parse(v4, sizeof(v4) - 1, src, &known));
    ASSERT_EQ(1, known);
    ASSERT_STR_EQ("192.0.2.7", ip(src));
    static const char v6[] = "PROXY TCP6 2001:db8::1 2001:db8::2 4000 80\r\n";
    ASSERT_EQ(sizeof(v6) - 1, ms__proxy_parse(v6, sizeof(v6) - 1, src, &known));
    ASSERT_STR_EQ("2001:db8::1", ip(src));
    ASSERT_EQ(15, ms__proxy_parse(S("PROXY UNKNOWN\r\n"), src, &known));
    ASSERT_EQ(0, known);
    /* Partial headers wait for more, at every length. */
    for (size_t n = 1; n < sizeof(v4) - 1 - 5; n++)
        ASSERT_EQ(0, ms__proxy_parse(v4, n, src, &known));
}

TEST(proxy_refuses_bad_v1_headers)
{
    uint8_t src[16];
    int known;
    ASSERT_EQ(MS_EBADREQ, ms__proxy_parse(S("GET / HTTP/1.1\r\n"), src, &known));
    ASSERT_EQ(MS_EBADREQ, ms__proxy_parse(S("PROXY TCP4 1.2.3 4.5.6.7 1 2\r\n"), src, &known));
    ASSERT_EQ(MS_EBADREQ, ms__proxy_parse(S("PROXY TCP4 ::1 ::1 1 2\r\n"), src, &known));
    ASSERT_EQ(MS_EBADREQ, ms__proxy_parse(S("PROXY UDP4 1.2.3.4 1.2.3.4 1 2\r\n"), src, &known));
    ASSERT_EQ(MS_EBADREQ,
              ms__proxy_parse(S("PROXY TCP4 1.2.3.4 1.2.3.4 1 99999\r\n"), src, &known));
    ASSERT_EQ(MS_EBADREQ, ms__proxy_parse(S("PROXY TCP4 1.2.3.4 1.2.3.4 1 2\rX"), src, &known));
    char longline[200];
    memset(longline, 'a', sizeof(longline));
    memcpy(longline, "PROXY ", 6);
    ASSERT_EQ(MS_EBADREQ, ms__proxy_parse(longline, sizeof(longline), src, &known));
}

TEST(proxy_v1_lines_are_107_bytes_at_most_with_their_crlf)
{
    uint8_t src[16];
    int known;
    char line[120];
    memset(line, 'x', sizeof(line));
    memcpy(line, "PROXY UNKNOWN ", 14); /* what follows UNKNOWN is ignored, so any length */
    memcpy(line + 105, "\r\n", 2);
    ASSERT_EQ(107, ms__proxy_parse(line, 107, src, &known));
    ASSERT_EQ(107, ms__proxy_parse(line, sizeof(line), src, &known));
    memset(line + 105, 'x', 2);
    memcpy(line + 106, "\r\n", 2); /* 108 bytes */
    ASSERT_EQ(MS_EBADREQ, ms__proxy_parse(line, 108, src, &known));
    ASSERT_EQ(MS_EBADREQ, ms__proxy_parse(line, 106, src, &known)); /* no CR in time */
    ASSERT_EQ(0, ms__proxy_parse(line, 105, src, &known));          /* may still come */
}

TEST(proxy_v2_headers_over_512_bytes_are_refused_in_one_read_or_many)
{
    uint8_t src[16];
    int known;
    static uint8_t h[16 + 600];
    memcpy(h, v2_sig, 12);
    h[12] = 0x21; /* v2, PROXY */
    h[13] = 0x11; /* TCP over IPv4 */
    uint8_t addrs[12] = {203, 0, 113, 9, 10, 0, 0, 1, 0x1f, 0x90, 0x00, 0x50};
    memcpy(h + 16, addrs, 12);
    h[14] = 512 >> 8;
    h[15] = 512 & 0xff; /* the addresses and 500 bytes of TLVs: the most we take */
    ASSERT_EQ(16 + 512, ms__proxy_parse((char *)h, 16 + 512, src, &known));
    ASSERT_EQ(0, ms__proxy_parse((char *)h, 16 + 511, src, &known));
    h[14] = 513 >> 8;
    h[15] = 513 & 0xff;
    ASSERT_EQ(MS_EBADREQ, ms__proxy_parse((char *)h, 16 + 513, src, &known)); /* in one read */
    ASSERT_EQ(MS_EBADREQ, ms__proxy_parse((char *)h, sizeof(h), src, &known));
    ASSERT_EQ(MS_EBADREQ, ms__proxy_parse((char *)h, 16, src, &known)); /* as soon as it says */
    h[12] = 0x20; /* LOCAL is held to it too */
    ASSERT_EQ(MS_EBADREQ, ms__proxy_parse((char *)h, 16 + 513, src, &known));
}

TEST(proxy_reads_v2_headers)
{
    uint8_t src[16];
    int known;
    uint8_t h[16 + 12 + 4];
    memcpy(h, v2_sig, 12);
    h[12] = 0x21; /* v2, PROXY */
    h[13] = 0x11; /* TCP over IPv4 */
    h[14] = 0;
    h[15] = 12 + 4; /* addresses and a TLV of 4 bytes */
    uint8_t addrs[12] = {203, 0, 113, 9, 10, 0, 0, 1, 0x1f, 0x90, 0x00, 0x50};
    memcpy(h + 16, addrs, 12);
    memset(h + 28, 0, 4);
    ASSERT_EQ(sizeof(h), ms__proxy_parse((char *)h, sizeof(h), src, &known));
    ASSERT_EQ(1, known);
    ASSERT_STR_EQ("203.0.113.9", ip(src));
    for (size_t n = 1; n < sizeof(h); n++)
        ASSERT_EQ(0, ms__proxy_parse((char *)h, n, src, &known));
    h[12] = 0x20; /* LOCAL: the proxy's own health check */
    ASSERT_EQ(sizeof(h), ms__proxy_parse((char *)h, sizeof(h), src, &known));
    ASSERT_EQ(0, known);
    h[12] = 0x31; /* version 3 */
    ASSERT_EQ(MS_EBADREQ, ms__proxy_parse((char *)h, sizeof(h), src, &known));
    h[12] = 0x21;
    h[5] = 0x0e; /* broken signature */
    ASSERT_EQ(MS_EBADREQ, ms__proxy_parse((char *)h, sizeof(h), src, &known));
}

static char client[64];

static void on_request(ms_req_t *r, void *data)
{
    (void)data;
    ms_req_client_ip(r, client, sizeof(client));
    ms_reply_send(r, "ok", 2, MS_VEC_STATIC, -1);
    ms_req_finish(r);
}

/* The client address a request from `peer` with `head` gets. */
static const char *client_of(ms_server_t *s, const char *peer, const char *head)
{
    ms_memio_t m;
    ms_conn_t *c = ms_memio_open(s, &m);
    ms__parse_ip(peer, strlen(peer), c->source);
    c->source_known = 1;
    client[0] = 0;
    ms_memio_feed(&m, head, strlen(head));
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    return client;
}

TEST(proxy_walks_x_forwarded_for_through_trusted_hops_only)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    ms_server_t *s = ms_server_new(&loop, NULL, on_request, NULL, NULL);
    ASSERT_EQ(0, ms_server_trust(s, "10.0.0.0/8"));
    ASSERT_EQ(0, ms_server_trust(s, "2001:db8::/32"));
    ASSERT_EQ(UV_EINVAL, ms_server_trust(s, "10.0.0.0/33"));
    ASSERT_EQ(UV_EINVAL, ms_server_trust(s, "nonsense"));
    /* An untrusted peer's header is ignored. */
    ASSERT_STR_EQ(
        "192.0.2.1",
        client_of(s, "192.0.2.1", "GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n"));
    /* From a trusted proxy: the rightmost untrusted entry. */
    ASSERT_STR_EQ("198.51.100.7", client_of(s, "10.1.2.3",
                                            "GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: "
                                            "6.6.6.6, 198.51.100.7, 10.9.9.9\r\n\r\n"));
    /* Repeated fields read as one list, in order. */
    ASSERT_STR_EQ(
        "198.51.100.8",
        client_of(s, "10.1.2.3",
                  "GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 6.6.6.6, 198.51.100.8\r\n"
                  "X-Forwarded-For: 10.0.0.5\r\n\r\n"));
    /* Every hop trusted: the leftmost. */
    ASSERT_STR_EQ(
        "10.0.0.9",
        client_of(s, "10.1.2.3",
                  "GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 10.0.0.9 ,10.0.0.8\r\n\r\n"));
    /* Garbage stops the walk at the last good hop. */
    ASSERT_STR_EQ(
        "10.0.0.8",
        client_of(
            s, "10.1.2.3",
            "GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 6.6.6.6, bogus, 10.0.0.8\r\n\r\n"));
    ASSERT_STR_EQ("2001:db9::1",
                  client_of(s, "2001:db8::5",
                            "GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 2001:db9::1\r\n\r\n"));
    ASSERT_STR_EQ("10.1.2.3", client_of(s, "10.1.2.3", "GET / HTTP/1.1\r\nHost: a\r\n\r\n"));
    ms_server_free(s);
    uv_loop_close(&loop);
}

TEST_MAIN()
