/* idle_conns.c: opens N warm keep-alive connections to a loopback server and holds them idle. */

/*
 * Usage: idle_conns PORT [N [HOLD_SECONDS]]
 *
 * Each connection sends one complete GET / and reads the whole reply, so the server
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

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: idle_conns PORT [N [HOLD_SECONDS]]\n");
        return 2;
    }
    int port = atoi(argv[1]);
    int n = argc > 2 ? atoi(argv[2]) : 10000;
    int hold = argc > 3 ? atoi(argv[3]) : 120;
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
        if (write(fd, req, sizeof(req) - 1) != (ssize_t)(sizeof(req) - 1))
            fail("write", i);
        errno = 0;
        if (read_reply(fd) < 0)
            fail("reading the reply", i);
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
