/* idle_conns.c: opens N warm keep-alive connections to a loopback server and holds them idle. */

/*
 * Usage: idle_conns PORT [N [HOLD_SECONDS [h2]]]
 *
 * Each connection sends one complete GET / and reads the whole reply (with "h2", over
 * HTTP/2 with prior knowledge: the preface, SETTINGS, one stream, and the SETTINGS ack
 * after the reply), so the server
 * has parsed, answered and parked it as an idle keep-alive connection. Then the
 * program prints "ready N" and holds every connection until SIGUSR1 (or SIGTERM, or
 * HOLD_SECONDS, default 120), and then prints "open K of N": how many the server
 * still kept open, so a caller can tell a real measurement from one where the server
 * dropped connections.
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static void fail(const char *what, int i)
{
    fprintf(stderr, "idle_conns: connection %d: %s: %s\n", i, what, errno ? strerror(errno) : "");
    exit(1);
}

/* Reads one reply: the head, then Content-Length bytes or chunks up to the last one.
 * Returns 0, or -1 on a short or malformed reply. Replies here are small, so one
 * fixed buffer is enough; a longer one is an error, not a crash. */
static int read_reply(int fd)
{
    char buf[16384];
    size_t len = 0;
    char *end = NULL;

    while (!end) {
        if (len == sizeof(buf) - 1)
            return -1;
        ssize_t n = read(fd, buf + len, sizeof(buf) - 1 - len);
        if (n <= 0)
            return -1;
        len += (size_t)n;
        buf[len] = '\0';
        end = strstr(buf, "\r\n\r\n");
    }
    size_t head = (size_t)(end - buf) + 4;

    /* Each header line starts after a CRLF; the status line is skipped. */
    long clen = -1;
    for (char *eol = strstr(buf, "\r\n"); eol && eol < end; eol = strstr(eol + 2, "\r\n")) {
        if (strncasecmp(eol + 2, "content-length:", 15) == 0)
            clen = strtol(eol + 17, NULL, 10);
    }

    if (clen >= 0) {
        size_t want = head + (size_t)clen;
        while (len < want) {
            char sink[16384];
            size_t ask = want - len < sizeof(sink) ? want - len : sizeof(sink);
            ssize_t n = read(fd, sink, ask);
            if (n <= 0)
                return -1;
            len += (size_t)n;
        }
        return 0;
    }

    /* No length: a chunked body. Small replies end with the zero-size chunk. */
    while (!strstr(buf + head - 4, "\r\n0\r\n\r\n")) {
        if (len == sizeof(buf) - 1)
            return -1;
        ssize_t n = read(fd, buf + len, sizeof(buf) - 1 - len);
        if (n <= 0)
            return -1;
        len += (size_t)n;
        buf[len] = '\0';
    }
    return 0;
}

/* The HTTP/2 exchange: preface, empty SETTINGS, and a GET / on stream 1 (HEADERS with
 * END_STREAM | END_HEADERS; HPACK literals without indexing or Huffman). */
static const char h2_req[] =
    "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    "\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    "\x00\x00\x3a\x01\x05\x00\x00\x00\x01"
    "\x00\x07:method\x03GET"
    "\x00\x07:scheme\x04http"
    "\x00\x05:path\x01/"
    "\x00\x0a:authority\x09" "127.0.0.1";
static const char h2_settings_ack[] = "\x00\x00\x00\x04\x01\x00\x00\x00\x00";

/* Reads HTTP/2 frames until stream 1 ends (END_STREAM on its HEADERS or DATA). Returns 0,
 * or -1 on a GOAWAY, a reset of the stream, or a short read. */
static int read_h2_reply(int fd)
{
    for (;;) {
        unsigned char hd[9];
        size_t got = 0;
        while (got < 9) {
            ssize_t n = read(fd, hd + got, 9 - got);
            if (n <= 0)
                return -1;
            got += (size_t)n;
        }
        size_t len = (size_t)hd[0] << 16 | (size_t)hd[1] << 8 | hd[2];
        int type = hd[3], flags = hd[4];
        uint32_t stream = ((uint32_t)hd[5] << 24 | (uint32_t)hd[6] << 16 | hd[7] << 8 | hd[8]) &
                          0x7fffffff;
        char sink[16384];
        while (len > 0) {
            ssize_t n = read(fd, sink, len < sizeof(sink) ? len : sizeof(sink));
            if (n <= 0)
                return -1;
            len -= (size_t)n;
        }
        if (type == 7 || (type == 3 && stream == 1))
            return -1;
        if ((type == 0 || type == 1) && stream == 1 && (flags & 1))
            return 0;
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: idle_conns PORT [N [HOLD_SECONDS]]\n");
        return 2;
    }
    int port = atoi(argv[1]);
    int n = argc > 2 ? atoi(argv[2]) : 10000;
    int hold = argc > 3 ? atoi(argv[3]) : 120;
    int h2 = argc > 4 && strcmp(argv[4], "h2") == 0;
    if (port <= 0 || port > 65535 || n <= 0 || hold <= 0) {
        fprintf(stderr, "idle_conns: bad arguments\n");
        return 2;
    }

    /* One descriptor per connection, plus a few for stdio. */
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < (rlim_t)n + 16) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        if (rl.rlim_cur < (rlim_t)n + 16) {
            fprintf(stderr, "idle_conns: open-file limit %lu is too low for %d connections\n",
                    (unsigned long)rl.rlim_cur, n);
            return 1;
        }
    }

    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    static const char req[] = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    /* A server that stalls must not hang the benchmark. */
    struct timeval tv = {.tv_sec = 5};

    int *fds = calloc((size_t)n, sizeof(int));
    if (!fds)
        return 1;
    for (int i = 0; i < n; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0)
            fail("socket", i);
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
            fail("connect", i);
        const char *out = h2 ? h2_req : req;
        size_t out_len = h2 ? sizeof(h2_req) - 1 : sizeof(req) - 1;
        if (write(fd, out, out_len) != (ssize_t)out_len)
            fail("write", i);
        errno = 0;
        if ((h2 ? read_h2_reply(fd) : read_reply(fd)) < 0)
            fail("reading the reply", i);
        if (h2 && write(fd, h2_settings_ack, 9) != 9)
            fail("write", i);
        fds[i] = fd;
    }

    signal(SIGUSR1, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGALRM, on_signal);
    alarm((unsigned)hold);
    printf("ready %d\n", n);
    fflush(stdout);

    while (!stop)
        pause();

    /* A connection the server closed (or wrote to) is readable: count the quiet ones. */
    struct pollfd *pfds = calloc((size_t)n, sizeof(struct pollfd));
    if (!pfds)
        return 1;
    for (int i = 0; i < n; i++)
        pfds[i] = (struct pollfd){.fd = fds[i], .events = POLLIN | POLLRDHUP};
    poll(pfds, (nfds_t)n, 0);
    int open = 0;
    for (int i = 0; i < n; i++)
        open += pfds[i].revents == 0;
    printf("open %d of %d\n", open, n);
    fflush(stdout);
    return 0;
}
