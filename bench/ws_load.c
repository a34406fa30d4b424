/* ws_load.c: a WebSocket load client on libuv (HTTP/1.1 upgrade, or HTTP/2's extended CONNECT
 * on nghttp2; RFC 6455 client frames). */

/*
 * Usage:
 *   ws_load echo PORT PATH CONNS SECONDS [SERVER_PID [SIZE]]
 *   ws_load broadcast PORT PATH CONNS SECONDS [SERVER_PID]
 *   ws_load idle PORT PATH CONNS HOLD_SECONDS [deflate|kept [MESSAGES]]
 *   ws_load echo-h2 PORT PATH CONNS SECONDS [SERVER_PID [STREAMS]]
 *
 * echo: CONNS connections each send a SIZE-byte (64) masked text message and send the next
 * when the echo is back, for SECONDS after every connection is open (and one second of
 * warm-up). Prints the messages echoed, per second, and, with SERVER_PID, the server's CPU
 * seconds over the same window (user + kernel from /proc/PID/stat, all its threads), the
 * messages per CPU-second and its CPU %.
 *
 * echo-h2: the same echo over HTTP/2 (RFC 8441, cleartext with prior knowledge): CONNS
 * WebSockets, STREAMS (10) on each connection, each an extended CONNECT stream whose DATA
 * carries the frames.
 *
 * broadcast: CONNS connections; the first sends a short text, to which the server answers
 * by sending one message to every connection (the first too), and sends the next once all
 * but CONNS deliveries of the ones before have come (two broadcasts in flight). Prints the
 * deliveries as echo prints messages.
 *
 * idle: CONNS connections (offering permessage-deflate without context takeover either way
 * with "deflate", and with it, as browsers do, with "kept"), each, with MESSAGES, sending that
 * many 1 KiB text messages (compressed when deflate was agreed: each on its own, which a
 * server that keeps our context inflates as well) and reading each echo (not inflated: its
 * size is all that matters here); then prints "ready N" and holds them
 * until SIGUSR1 or HOLD_SECONDS, answering pings, and prints "open K of N": how many the
 * server did not close.
 */
#define _GNU_SOURCE /* strcasestr */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <unistd.h>
#include <nghttp2/nghttp2.h>
#include <uv.h>
#include <zlib.h>

enum { MODE_ECHO, MODE_BROADCAST, MODE_IDLE, MODE_ECHO_H2 };

/* Connections connecting or in their handshake at once: more would overflow the server's
 * listen backlog. */
#define CONNECTING_MAX 128
#define IDLE_MESSAGE 1024

typedef struct conn_s {
    uv_tcp_t tcp;
    uv_connect_t connect;
    int index;
    int open;      /* the handshake is done */
    int closed;    /* the server closed, or sent a close */
    char head[4096];
    size_t head_len; /* handshake reply bytes so far (until open) */
    /* the frame being read */
    uint8_t fh[14];
    uint8_t fh_len, fh_need, op;
    uint64_t left; /* payload bytes of it still to come */
    uint64_t flen;
    uint8_t ctl[125];
    int sent; /* messages sent (idle) */
    int deflate;
    /* over HTTP/2: the connection that carries it, its stream, and the bytes it has for the
     * stream that nghttp2 has not taken yet */
    struct h2c_s *h2;
    int32_t stream_id;
    int deferred; /* the stream's data source waits for bytes (nghttp2_session_resume_data) */
    size_t npending;
    uint8_t pending[512];
} conn_t;

/* An HTTP/2 connection carrying the WebSockets conns[first .. first + n). */
typedef struct h2c_s {
    uv_tcp_t tcp;
    uv_connect_t connect;
    nghttp2_session *session;
    int first, n;
    int requested; /* the CONNECTs went, after the server's SETTINGS */
} h2c_t;

static uv_loop_t *loop;
static int mode, nconns, port, seconds, msg_size = 64, messages, want_deflate;
static int server_pid;
static const char *path;
static conn_t *conns;
static int next_connect, connecting, opened, closed_count, failed;
static int counting;       /* inside the measured window */
static uint64_t counted;   /* messages echoed, or deliveries, in the window */
static uint64_t received;  /* every message received */
static uint64_t triggers;  /* broadcasts asked for */
static uint8_t frame[14 + 65536]; /* the echo message, masked (one mask for all: a benchmark) */
static size_t frame_len;
static uint8_t trigger[8];
static uv_timer_t timer;
static uv_signal_t usr1;
static double t_start, cpu_start;
static int idle_done;
static char readbuf[65536];

static void die(const char *what, int rc)
{
    fprintf(stderr, "ws_load: %s: %s\n", what, rc ? uv_strerror(rc) : "");
    exit(1);
}

static double now_s(void)
{
    return (double)uv_hrtime() / 1e9;
}

/* The server's CPU seconds: fields 14 and 15 of /proc/PID/stat. */
static double server_cpu(void)
{
    if (server_pid <= 0)
        return 0;
    char p[64], buf[1024];
    snprintf(p, sizeof(p), "/proc/%d/stat", server_pid);
    FILE *f = fopen(p, "r");
    if (f == NULL)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    char *s = strrchr(buf, ')');
    if (s == NULL)
        return 0;
    unsigned long ut = 0, st = 0;
    /* after ")": state is field 3; utime and stime are 14 and 15 */
    if (sscanf(s + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* -- Writing ----------------------------------------------------------------------------- */

typedef struct wreq_s {
    uv_write_t w;
    char data[];
} wreq_t;

static void on_written(uv_write_t *w, int status)
{
    (void)status;
    free(w);
}

static void h2_put(conn_t *c, const void *p, size_t n);

/* Writes now if the socket takes it, else queues a copy. */
static void tcp_put(uv_tcp_t *tcp, const void *p, size_t n)
{
    uv_buf_t b = uv_buf_init((char *)p, (unsigned)n);
    int rc = uv_try_write((uv_stream_t *)tcp, &b, 1);
    if (rc == (int)n)
        return;
    size_t done = rc > 0 ? (size_t)rc : 0;
    if (rc < 0 && rc != UV_EAGAIN)
        return; /* the read side will see it go */
    wreq_t *w = malloc(sizeof(*w) + n - done);
    memcpy(w->data, (const char *)p + done, n - done);
    b = uv_buf_init(w->data, (unsigned)(n - done));
    if (uv_write(&w->w, (uv_stream_t *)tcp, &b, 1, on_written) < 0)
        free(w);
}

/* Sends bytes on the WebSocket: its TCP connection, or its HTTP/2 stream. */
static void put(conn_t *c, const void *p, size_t n)
{
    if (c->h2 != NULL)
        h2_put(c, p, n);
    else
        tcp_put(&c->tcp, p, n);
}

/* A masked client frame of `len` bytes into out; returns its length. */
static size_t client_frame(uint8_t *out, int op, int rsv1, const uint8_t *p, size_t len)
{
    static const uint8_t mask[4] = {0x37, 0xfa, 0x21, 0x3d};
    size_t h = 0;
    out[h++] = (uint8_t)(0x80 | (rsv1 ? 0x40 : 0) | op);
    if (len < 126) {
        out[h++] = (uint8_t)(0x80 | len);
    } else if (len <= 0xFFFF) {
        out[h++] = 0x80 | 126;
        out[h++] = (uint8_t)(len >> 8);
        out[h++] = (uint8_t)len;
    } else {
        out[h++] = 0x80 | 127;
        for (int i = 0; i < 8; i++)
            out[h++] = (uint8_t)((uint64_t)len >> (56 - 8 * i));
    }
    memcpy(out + h, mask, 4);
    h += 4;
    for (size_t i = 0; i < len; i++)
        out[h + i] = p[i] ^ mask[i & 3];
    return h + len;
}

/* One permessage-deflate message without context takeover: raw deflate, sync flush, its
 * trailing 00 00 ff ff taken off. */
static size_t deflate_message(const uint8_t *p, size_t len, uint8_t *out, size_t cap)
{
    z_stream z;
    memset(&z, 0, sizeof(z));
    if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        die("deflateInit2", 0);
    z.next_in = (Bytef *)p;
    z.avail_in = (uInt)len;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    deflate(&z, Z_SYNC_FLUSH);
    size_t n = cap - z.avail_out;
    deflateEnd(&z);
    return n >= 4 ? n - 4 : n;
}

static void send_idle_message(conn_t *c)
{
    static uint8_t text[IDLE_MESSAGE], z[IDLE_MESSAGE + 64], f[IDLE_MESSAGE + 128];
    for (size_t i = 0; i < sizeof(text); i++)
        text[i] = (uint8_t)("moonserve idle "[i % 15]);
    size_t n;
    if (c->deflate) {
        size_t zn = deflate_message(text, sizeof(text), z, sizeof(z));
        n = client_frame(f, 0x1, 1, z, zn);
    } else {
        n = client_frame(f, 0x1, 0, text, sizeof(text));
    }
    c->sent++;
    put(c, f, n);
}

/* -- Reading ----------------------------------------------------------------------------- */

static void start_connects(void);

static void conn_gone(conn_t *c)
{
    if (c->closed)
        return;
    c->closed = 1;
    closed_count++;
    if (!c->open) {
        failed++;
        connecting--;
        start_connects();
    }
    if (c->h2 == NULL)
        uv_read_stop((uv_stream_t *)&c->tcp);
}

static void send_trigger(void)
{
    triggers++;
    put(&conns[0], trigger, sizeof(trigger));
}

/* A whole message (text or binary) of `len` bytes from the server. */
static void on_message(conn_t *c, uint64_t len)
{
    received++;
    if (counting)
        counted++;
    switch (mode) {
    case MODE_ECHO:
    case MODE_ECHO_H2:
        if (len != (uint64_t)msg_size) {
            fprintf(stderr, "ws_load: an echo of %llu bytes, not %d\n", (unsigned long long)len,
                    msg_size);
            exit(1);
        }
        put(c, frame, frame_len);
        break;
    case MODE_BROADCAST:
        /* Two broadcasts in flight: the next is asked for once all but one's deliveries are
         * in. */
        while (received + (uint64_t)nconns >= triggers * (uint64_t)nconns && triggers > 0)
            send_trigger();
        break;
    case MODE_IDLE:
        if (c->sent < messages)
            send_idle_message(c);
        else
            idle_done++; /* (on_idle_check starts the hold once every connection is done) */
        break;
    }
}

static void on_frame(conn_t *c)
{
    switch (c->op) {
    case 0x1:
    case 0x2: on_message(c, c->flen); break;
    case 0x9: {
        uint8_t f[14 + 125];
        put(c, f, client_frame(f, 0xA, 0, c->ctl, (size_t)c->flen));
        break;
    }
    case 0x8: {
        uint8_t f[14 + 2];
        uint8_t code[2] = {0x03, 0xE8};
        put(c, f, client_frame(f, 0x8, 0, code, 2));
        conn_gone(c);
        break;
    }
    default: break;
    }
}

/* Server frames: unmasked, never fragmented here (the servers send whole messages). */
static void feed(conn_t *c, const uint8_t *p, size_t n)
{
    const uint8_t *end = p + n;
    while (p < end && !c->closed) {
        if (c->left == 0 && c->fh_len < c->fh_need) {
            while (c->fh_len < c->fh_need && p < end) {
                c->fh[c->fh_len++] = *p++;
                if (c->fh_len == 2) {
                    uint8_t l7 = c->fh[1] & 0x7F;
                    c->fh_need = (uint8_t)(2 + (l7 == 126 ? 2 : l7 == 127 ? 8 : 0));
                }
            }
            if (c->fh_len < c->fh_need)
                return;
            uint64_t len = c->fh[1] & 0x7F;
            if (len == 126) {
                len = ((uint64_t)c->fh[2] << 8) | c->fh[3];
            } else if (len == 127) {
                len = 0;
                for (int i = 0; i < 8; i++)
                    len = (len << 8) | c->fh[2 + i];
            }
            c->op = c->fh[0] & 0x0F;
            c->flen = len;
            c->left = len;
            if (len == 0) {
                c->fh_len = 0, c->fh_need = 2;
                on_frame(c);
                continue;
            }
        }
        size_t take = (size_t)(end - p);
        if (take > c->left)
            take = (size_t)c->left;
        if ((c->op & 0x8) && c->flen <= 125)
            memcpy(c->ctl + (c->flen - c->left), p, take);
        c->left -= take;
        p += take;
        if (c->left == 0) {
            c->fh_len = 0, c->fh_need = 2;
            on_frame(c);
        }
    }
}

static void all_open(void);

static void on_handshake(conn_t *c, const char *p, size_t n)
{
    size_t room = sizeof(c->head) - 1 - c->head_len;
    if (n > room)
        die("handshake reply too long", 0);
    memcpy(c->head + c->head_len, p, n);
    c->head_len += n;
    c->head[c->head_len] = 0;
    char *end = strstr(c->head, "\r\n\r\n");
    if (end == NULL)
        return;
    if (strncmp(c->head, "HTTP/1.1 101", 12) != 0) {
        fprintf(stderr, "ws_load: connection %d: the upgrade was refused:\n%.*s\n", c->index,
                (int)(end - c->head), c->head);
        exit(1);
    }
    c->deflate = strcasestr(c->head, "permessage-deflate") != NULL &&
                 strcasestr(c->head, "sec-websocket-extensions") != NULL;
    c->open = 1;
    opened++;
    connecting--;
    size_t used = (size_t)(end + 4 - c->head);
    if (used < c->head_len)
        feed(c, (const uint8_t *)c->head + used, c->head_len - used);
    if (opened + failed == nconns)
        all_open();
    else
        start_connects();
}

static void on_alloc(uv_handle_t *h, size_t want, uv_buf_t *b)
{
    (void)h;
    (void)want;
    *b = uv_buf_init(readbuf, sizeof(readbuf)); /* used before the next read: one will do */
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    conn_t *c = (conn_t *)s;
    if (n < 0) {
        conn_gone(c);
        return;
    }
    if (c->open)
        feed(c, (const uint8_t *)b->base, (size_t)n);
    else
        on_handshake(c, b->base, (size_t)n);
}

/* -- Connecting -------------------------------------------------------------------------- */

static void on_connect(uv_connect_t *r, int status)
{
    conn_t *c = r->data;
    if (status < 0)
        die("connect", status);
    char req[1024];
    int n = snprintf(req, sizeof(req),
                     "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\n"
                     "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     "Sec-WebSocket-Version: 13\r\n%s\r\n",
                     path, port,
                     want_deflate == 2 ? "Sec-WebSocket-Extensions: permessage-deflate; "
                                         "client_max_window_bits\r\n"
                     : want_deflate    ? "Sec-WebSocket-Extensions: permessage-deflate; "
                                         "server_no_context_takeover; client_no_context_takeover\r\n"
                                       : "");
    uv_tcp_nodelay(&c->tcp, 1);
    put(c, req, (size_t)n);
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

static void start_connects(void)
{
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", port, &a);
    while (connecting < CONNECTING_MAX && next_connect < nconns) {
        conn_t *c = &conns[next_connect];
        c->index = next_connect++;
        c->fh_need = 2;
        uv_tcp_init(loop, &c->tcp);
        c->connect.data = c;
        int rc = uv_tcp_connect(&c->connect, &c->tcp, (const struct sockaddr *)&a, on_connect);
        if (rc < 0)
            die("connect", rc);
        connecting++;
    }
}

/* -- Over HTTP/2 ------------------------------------------------------------------------- */

static h2c_t *h2conns;
static int nh2, streams_per_conn = 10;

static void h2_flush(h2c_t *h)
{
    if (nghttp2_session_send(h->session) != 0)
        die("nghttp2_session_send", 0);
}

/* The stream's data source: what the WebSocket has put, never the stream's end. */
static ssize_t h2_read_data(nghttp2_session *session, int32_t stream_id, uint8_t *buf,
                            size_t length, uint32_t *flags, nghttp2_data_source *src,
                            void *user)
{
    conn_t *c = src->ptr;
    (void)session, (void)stream_id, (void)flags, (void)user;
    if (c->npending == 0) {
        c->deferred = 1;
        return NGHTTP2_ERR_DEFERRED;
    }
    size_t n = c->npending < length ? c->npending : length;
    memcpy(buf, c->pending, n);
    memmove(c->pending, c->pending + n, c->npending - n);
    c->npending -= n;
    return (ssize_t)n;
}

static void h2_put(conn_t *c, const void *p, size_t n)
{
    if (c->npending + n > sizeof(c->pending))
        die("an HTTP/2 stream's send buffer is full", 0);
    memcpy(c->pending + c->npending, p, n);
    c->npending += n;
    if (c->deferred && c->stream_id > 0) {
        c->deferred = 0;
        nghttp2_session_resume_data(c->h2->session, c->stream_id);
    }
}

static ssize_t h2_send(nghttp2_session *session, const uint8_t *data, size_t length, int flags,
                       void *user)
{
    h2c_t *h = user;
    (void)session, (void)flags;
    tcp_put(&h->tcp, data, length);
    return (ssize_t)length;
}

/* The CONNECT of each WebSocket the connection carries, once the server's SETTINGS came
 * (they must enable the extended CONNECT). */
static void h2_request(h2c_t *h)
{
    char authority[32];
    snprintf(authority, sizeof(authority), "127.0.0.1:%d", port);
#define NV(n, v) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v), NGHTTP2_NV_FLAG_NONE}
    nghttp2_nv nva[] = {NV(":method", "CONNECT"), NV(":protocol", "websocket"),
                        NV(":scheme", "http"),    NV(":path", path),
                        NV(":authority", authority), NV("sec-websocket-version", "13")};
#undef NV
    for (int i = 0; i < h->n; i++) {
        conn_t *c = &conns[h->first + i];
        nghttp2_data_provider dp = {.source.ptr = c, .read_callback = h2_read_data};
        int32_t id = nghttp2_submit_request(h->session, NULL, nva, sizeof(nva) / sizeof(nva[0]),
                                            &dp, c);
        if (id < 0)
            die(nghttp2_strerror(id), 0);
        c->stream_id = id;
    }
    h->requested = 1;
}

static int h2_on_frame(nghttp2_session *session, const nghttp2_frame *f, void *user)
{
    h2c_t *h = user;
    if (f->hd.type == NGHTTP2_SETTINGS && !(f->hd.flags & NGHTTP2_FLAG_ACK) && !h->requested) {
        if (!nghttp2_session_get_remote_settings(session,
                                                 NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL))
            die("the server does not enable the extended CONNECT", 0);
        h2_request(h);
    } else if (f->hd.type == NGHTTP2_HEADERS && f->headers.cat == NGHTTP2_HCAT_RESPONSE) {
        conn_t *c = nghttp2_session_get_stream_user_data(session, f->hd.stream_id);
        if (c != NULL && !c->open) {
            c->open = 1;
            if (++opened + failed == nconns)
                all_open();
        }
    }
    return 0;
}

static int h2_on_header(nghttp2_session *session, const nghttp2_frame *f, const uint8_t *name,
                        size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                        void *user)
{
    (void)session, (void)flags, (void)user;
    if (f->hd.type == NGHTTP2_HEADERS && namelen == 7 && !memcmp(name, ":status", 7) &&
        (valuelen != 3 || memcmp(value, "200", 3) != 0)) {
        fprintf(stderr, "ws_load: the extended CONNECT was answered %.*s\n", (int)valuelen,
                (const char *)value);
        exit(1);
    }
    return 0;
}

static int h2_on_data(nghttp2_session *session, uint8_t flags, int32_t stream_id,
                      const uint8_t *data, size_t len, void *user)
{
    (void)flags, (void)user;
    conn_t *c = nghttp2_session_get_stream_user_data(session, stream_id);
    if (c != NULL)
        feed(c, data, len);
    return 0;
}

static int h2_on_close(nghttp2_session *session, int32_t stream_id, uint32_t code, void *user)
{
    (void)code, (void)user;
    conn_t *c = nghttp2_session_get_stream_user_data(session, stream_id);
    if (c != NULL)
        conn_gone(c);
    return 0;
}

static void h2_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    h2c_t *h = (h2c_t *)s;
    if (n < 0) {
        for (int i = 0; i < h->n; i++)
            conn_gone(&conns[h->first + i]);
        uv_read_stop(s);
        return;
    }
    if (nghttp2_session_mem_recv(h->session, (const uint8_t *)b->base, (size_t)n) < 0)
        die("nghttp2_session_mem_recv", 0);
    h2_flush(h); /* what the callbacks put, and nghttp2's own (acks, window updates) */
}

static void h2_on_connect(uv_connect_t *r, int status)
{
    h2c_t *h = r->data;
    if (status < 0)
        die("connect", status);
    nghttp2_session_callbacks *cb;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_send_callback(cb, h2_send);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, h2_on_frame);
    nghttp2_session_callbacks_set_on_header_callback(cb, h2_on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, h2_on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, h2_on_close);
    if (nghttp2_session_client_new(&h->session, cb, h) != 0)
        die("nghttp2_session_client_new", 0);
    nghttp2_session_callbacks_del(cb);
    nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20}};
    nghttp2_submit_settings(h->session, NGHTTP2_FLAG_NONE, iv, 1);
    uv_tcp_nodelay(&h->tcp, 1);
    h2_flush(h);
    uv_read_start((uv_stream_t *)&h->tcp, on_alloc, h2_on_read);
}

static void h2_start(void)
{
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", port, &a);
    nh2 = (nconns + streams_per_conn - 1) / streams_per_conn;
    h2conns = calloc((size_t)nh2, sizeof(*h2conns));
    for (int i = 0; i < nh2; i++) {
        h2c_t *h = &h2conns[i];
        h->first = i * streams_per_conn;
        h->n = nconns - h->first < streams_per_conn ? nconns - h->first : streams_per_conn;
        for (int k = 0; k < h->n; k++) {
            conn_t *c = &conns[h->first + k];
            c->index = h->first + k;
            c->fh_need = 2;
            c->h2 = h;
        }
        uv_tcp_init(loop, &h->tcp);
        h->connect.data = h;
        int rc = uv_tcp_connect(&h->connect, &h->tcp, (const struct sockaddr *)&a,
                                h2_on_connect);
        if (rc < 0)
            die("connect", rc);
    }
}

/* -- The window ------------------------------------------------------------------------- */

static void report(void)
{
    double t = now_s() - t_start, cpu = server_cpu() - cpu_start;
    const char *what = mode == MODE_BROADCAST ? "deliveries" : "messages";
    printf("%s %llu seconds %.2f per_second %.0f", what, (unsigned long long)counted, t,
           (double)counted / t);
    if (server_pid > 0)
        printf(" server_cpu_seconds %.2f per_cpu_second %.0f server_cpu_pct %.0f", cpu,
               cpu > 0 ? (double)counted / cpu : 0.0, 100.0 * cpu / t);
    printf(" conns %d closed %d\n", nconns, closed_count);
    fflush(stdout);
}

static void on_end(uv_timer_t *t)
{
    (void)t;
    counting = 0;
    report();
    exit(0); /* the kernel closes the sockets */
}

static void on_warm(uv_timer_t *t)
{
    counting = 1;
    t_start = now_s();
    cpu_start = server_cpu();
    uv_timer_start(t, on_end, (uint64_t)seconds * 1000, 0);
}

static int count_open(void)
{
    int k = 0;
    for (int i = 0; i < nconns; i++)
        k += conns[i].open && !conns[i].closed;
    return k;
}

static void on_hold_end(void)
{
    /* Anything the server sent in the meantime (a close) is read first. */
    uv_run(loop, UV_RUN_NOWAIT);
    printf("open %d of %d\n", count_open(), nconns);
    fflush(stdout);
    exit(0);
}

static void on_usr1(uv_signal_t *s, int sig)
{
    (void)s;
    (void)sig;
    on_hold_end();
}

static void on_hold_timer(uv_timer_t *t)
{
    (void)t;
    on_hold_end();
}

static void on_idle_check(uv_timer_t *t)
{
    if (idle_done < nconns - failed) {
        uv_timer_start(t, on_idle_check, 10, 0);
        return;
    }
    uv_signal_init(loop, &usr1);
    uv_signal_start(&usr1, on_usr1, SIGUSR1);
    printf("ready %d\n", count_open());
    fflush(stdout);
    uv_timer_start(t, on_hold_timer, (uint64_t)seconds * 1000, 0);
}

static void all_open(void)
{
    if (failed > 0) {
        fprintf(stderr, "ws_load: %d of %d connections failed to open\n", failed, nconns);
        exit(1);
    }
    switch (mode) {
    case MODE_ECHO:
    case MODE_ECHO_H2:
        for (int i = 0; i < nconns; i++)
            put(&conns[i], frame, frame_len);
        for (int i = 0; i < nh2; i++)
            h2_flush(&h2conns[i]);
        uv_timer_start(&timer, on_warm, 1000, 0);
        break;
    case MODE_BROADCAST:
        send_trigger();
        send_trigger();
        uv_timer_start(&timer, on_warm, 1000, 0);
        break;
    case MODE_IDLE:
        if (messages == 0)
            idle_done = nconns;
        for (int i = 0; i < nconns && messages > 0; i++)
            send_idle_message(&conns[i]);
        uv_timer_start(&timer, on_idle_check, 0, 0);
        break;
    }
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: ws_load echo|broadcast|idle PORT PATH CONNS SECONDS [...]\n");
        return 2;
    }
    mode = !strcmp(argv[1], "echo")        ? MODE_ECHO
           : !strcmp(argv[1], "broadcast") ? MODE_BROADCAST
           : !strcmp(argv[1], "idle")      ? MODE_IDLE
           : !strcmp(argv[1], "echo-h2")   ? MODE_ECHO_H2
                                           : -1;
    if (mode < 0)
        die("mode is echo, broadcast, idle or echo-h2", 0);
    port = atoi(argv[2]);
    path = argv[3];
    nconns = atoi(argv[4]);
    seconds = atoi(argv[5]);
    if (mode == MODE_IDLE) {
        if (argc > 6)
            want_deflate = !strcmp(argv[6], "deflate") ? 1 : !strcmp(argv[6], "kept") ? 2 : 0;
        messages = argc > 7 ? atoi(argv[7]) : 0;
    } else {
        server_pid = argc > 6 ? atoi(argv[6]) : 0;
        if (mode == MODE_ECHO && argc > 7)
            msg_size = atoi(argv[7]);
        if (mode == MODE_ECHO_H2 && argc > 7)
            streams_per_conn = atoi(argv[7]);
    }
    if (nconns <= 0 || msg_size < 0 || msg_size > 65536 || streams_per_conn <= 0)
        die("bad CONNS, SIZE or STREAMS", 0);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    signal(SIGPIPE, SIG_IGN);
    uint8_t text[65536];
    for (int i = 0; i < msg_size; i++)
        text[i] = (uint8_t)('a' + i % 26);
    frame_len = client_frame(frame, 0x1, 0, text, (size_t)msg_size);
    client_frame(trigger, 0x1, 0, (const uint8_t *)"go", 2);
    loop = uv_default_loop();
    uv_timer_init(loop, &timer);
    conns = calloc((size_t)nconns, sizeof(*conns));
    if (mode == MODE_ECHO_H2)
        h2_start();
    else
        start_connects();
    uv_run(loop, UV_RUN_DEFAULT);
    return 0;
}
