/* tls_handshakes.c: TLS 1.3 handshakes with one request each against 127.0.0.1:PORT, for
 * SECONDS, from PROCS processes at once, each offering the session of its last connection
 * (as a browser resumes), or with `full` none. bench/tls_compare measures the server's CPU
 * meanwhile.
 *   tls_handshakes PORT SECONDS PROCS [full]
 * Prints "handshakes N resumed R": a resumed count below N means the server did not resume.
 * The server's certificate is not verified (the client is ours). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One process's loop; writes "N R" to `out`. */
static void run(int port, double secs, int full, int out)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256");
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    static const unsigned char alpn[] = "\x08http/1.1";
    SSL_CTX_set_alpn_protos(ctx, alpn, sizeof(alpn) - 1);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    static const char req[] = "GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    SSL_SESSION *sess = NULL;
    long n = -1, resumed = 0; /* (the first, a full handshake, is not counted) */
    double end = now() + secs;
    while (now() < end) {
        int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        /* (Without it the request waits behind the client's Finished for the server's
         * delayed ACK: the handshake's cost would be 40 ms of nothing.) */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
            perror("connect");
            break;
        }
        SSL *ssl = SSL_new(ctx);
        SSL_set_fd(ssl, fd);
        SSL_set_tlsext_host_name(ssl, "localhost");
        if (sess != NULL && !full)
            SSL_set_session(ssl, sess);
        char buf[4096];
        int ok = SSL_connect(ssl) == 1 && SSL_write(ssl, req, sizeof(req) - 1) > 0;
        /* The reply, to the server's close: TLS 1.3's tickets come before it. */
        while (ok && SSL_read(ssl, buf, sizeof(buf)) > 0)
            ;
        if (!ok) {
            fprintf(stderr, "a handshake failed\n");
            SSL_free(ssl);
            close(fd);
            break;
        }
        if (n++ >= 0)
            resumed += SSL_session_reused(ssl);
        SSL_SESSION_free(sess);
        sess = SSL_get1_session(ssl);
        SSL_set_shutdown(ssl, SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
        SSL_free(ssl);
        close(fd);
    }
    dprintf(out, "%ld %ld\n", n > 0 ? n : 0, resumed);
    SSL_SESSION_free(sess);
    SSL_CTX_free(ctx);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s PORT SECONDS PROCS [full]\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[1]), procs = atoi(argv[3]);
    double secs = atof(argv[2]);
    int full = argc > 4 && strcmp(argv[4], "full") == 0;
    int p[2];
    if (pipe(p) < 0)
        return 1;
    for (int i = 0; i < procs; i++) {
        if (fork() == 0) {
            close(p[0]);
            run(port, secs, full, p[1]);
            _exit(0);
        }
    }
    close(p[1]);
    while (wait(NULL) > 0)
        ;
    FILE *f = fdopen(p[0], "r");
    long n = 0, r = 0, a, b;
    while (fscanf(f, "%ld %ld", &a, &b) == 2)
        n += a, r += b;
    printf("handshakes %ld resumed %ld\n", n, r);
    return 0;
}
