/* tls_idle_conns.c: opens N TLS connections to 127.0.0.1:PORT, sends one keep-alive GET on
 * each and reads its reply, then holds them all idle. bench/tls_compare measures the server's
 * memory before and after.
 *   tls_idle_conns PORT N HOLD_SECONDS
 * Prints "open N" and "ready" once every connection has had its reply; exits on SIGUSR1 or
 * after HOLD_SECONDS. TLS 1.3, the server's certificate not verified (the client is ours). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static volatile sig_atomic_t done;

static void on_usr1(int sig)
{
    (void)sig;
    done = 1;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s PORT N HOLD_SECONDS\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[1]), n = atoi(argv[2]), hold = atoi(argv[3]);
    signal(SIGUSR1, on_usr1);
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    static const unsigned char alpn[] = "\x08http/1.1";
    SSL_CTX_set_alpn_protos(ctx, alpn, sizeof(alpn) - 1);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    SSL **conns = calloc((size_t)n, sizeof(*conns));
    int open = 0;
    static const char req[] = "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
    for (int i = 0; i < n; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
            perror("connect");
            break;
        }
        SSL *ssl = SSL_new(ctx);
        SSL_set_fd(ssl, fd);
        SSL_set_tlsext_host_name(ssl, "localhost");
        char buf[4096];
        if (SSL_connect(ssl) != 1 || SSL_write(ssl, req, sizeof(req) - 1) <= 0 ||
            SSL_read(ssl, buf, sizeof(buf)) <= 0) {
            fprintf(stderr, "connection %d failed\n", i);
            SSL_free(ssl);
            close(fd);
            break;
        }
        conns[open++] = ssl;
    }
    printf("open %d\nready\n", open);
    fflush(stdout);
    for (int t = 0; t < hold * 10 && !done; t++)
        usleep(100000);
    for (int i = 0; i < open; i++) {
        close(SSL_get_fd(conns[i]));
        SSL_free(conns[i]);
    }
    free(conns);
    SSL_CTX_free(ctx);
    return 0;
}
