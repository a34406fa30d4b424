/* engine_bench.c: GETs through the HTTP/1 engine alone, fed bytes through the memory
 * transport, answered by a C hello handler. For callgrind: run it with two counts and
 * divide the difference in instructions by the difference in requests.
 *   engine_bench N [PIPELINE] [keepalive|churn|refuse|static|static304|h2|h2idx]
 * churn: a new connection per request; refuse: the same with the in-flight cap at 0, so
 * the core answers 503 and closes; static: GET /static/10k.bin from a static mount of a
 * directory holding a 10 KiB file (held in memory), static304 the same with a matching
 * If-None-Match; h2: HTTP/2 with prior knowledge on one connection, PIPELINE streams in
 * each read (HEADERS with END_STREAM), as h2load -m sends them, with every field a literal;
 * h2idx: the same with the fields indexed, as h2load's own HPACK encoder sends them.
 * ACCESS_LOG=FILE (and ACCESS_LOG_FORMAT=combined|json|template) turns the access log on,
 * with a turn of the loop every 64 requests, which waits for a write under way to complete
 * (a loop with clients to serve meanwhile), so that no line is dropped. METRICS=1 counts
 * into a metrics zone (core/process/metrics.h), as a worker with metrics on does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "http/accesslog.h"
#include "transport/memio.h"
#include "process/metrics.h"
#include "moonserve.h"
#include "http/static/static.h"

/* A directory with a 10 KiB file for the static modes; returns its path. */
static const char *static_dir(void)
{
    static char dir[] = "/tmp/ms-engine-bench-XXXXXX";
    char path[64];
    if (mkdtemp(dir) == NULL)
        abort();
    snprintf(path, sizeof(path), "%s/10k.bin", dir);
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < 10240; i++)
        fputc(i * 7 % 251, f);
    fclose(f);
    return dir;
}

static void on_request(ms_req_t *r, void *data)
{
    (void)data;
    ms_reply_header(r, "content-type", 12, "text/plain", 10);
    ms_reply_send(r, "hello world", 11, MS_VEC_STATIC, -1);
    ms_req_finish(r);
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 100000;
    int pipeline = argc > 2 ? atoi(argv[2]) : 1;
    const char *mode = argc > 3 ? argv[3] : getenv("MODE") ? getenv("MODE") : "keepalive";
    int churn = strcmp(mode, "churn") == 0 || strcmp(mode, "refuse") == 0;
    static const char hello[] = "GET / HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
                                "User-Agent: bench\r\nAccept: */*\r\n\r\n";
    char req[512];
    int is_static = strncmp(mode, "static", 6) == 0;
    int is_h2 = strncmp(mode, "h2", 2) == 0;
    snprintf(req, sizeof(req), "%s", hello);
    if (is_static)
        snprintf(req, sizeof(req),
                 "GET /static/10k.bin HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
                 "User-Agent: bench\r\nAccept: */*\r\n%s\r\n",
                 strcmp(mode, "static304") == 0 ? "If-None-Match: \"2800-0\"\r\n" : "");
    size_t len = strlen(req);
    uv_loop_t loop;
    uv_loop_init(&loop);
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.requests_per_connection = 0xffffffffu;
    if (strcmp(mode, "refuse") == 0)
        lim.in_flight = 0;
    ms_log_set(NULL, MS_LOG_ERR);
    ms_server_t *s = ms_server_new(&loop, &lim, on_request, NULL, NULL);
    const char *alog = getenv("ACCESS_LOG");
    if (alog != NULL && *alog) {
        const char *why;
        int id = ms_server_access_log(s, alog, getenv("ACCESS_LOG_FORMAT"), &why);
        if (id < 0) {
            fprintf(stderr, "ACCESS_LOG: %s\n", why ? why : uv_strerror(id));
            return 1;
        }
        ms_server_access_default(s, id);
    }
    const char *metrics = getenv("METRICS");
    if (metrics != NULL && strcmp(metrics, "1") == 0) {
        int fd = ms_metrics_create(1, 1024);
        if (fd < 0 || ms_server_metrics(s, ms_metrics_map(fd), 0) != 0)
            abort();
        close(fd);
    }
    const char *dir = NULL;
    if (is_static) {
        dir = static_dir();
        ms_static_opts_t o;
        ms_static_opts_default(&o);
        if (ms_static_mount(s, "/static", dir, &o) != 0)
            abort();
        if (strcmp(mode, "static304") == 0) {
            /* The file's own entity-tag, so that every request is a 304. */
            ms_memio_t probe;
            ms_memio_open(s, &probe);
            ms_memio_feed(&probe, req, len);
            char head[1024];
            snprintf(head, sizeof(head), "%.*s", (int)probe.out.len, probe.out.base);
            char *etag = strstr(head, "etag: ");
            char *q = strstr(req, "If-None-Match: ") + 15;
            memcpy(q, etag + 6, strchr(etag, '\r') - etag - 6);
            strcpy(q + (strchr(etag, '\r') - etag - 6), "\r\n\r\n");
            len = strlen(req);
            ms_memio_peer_close(&probe, UV_EOF);
            ms_memio_free(&probe);
        }
    }
    char *batch = malloc(len * (size_t)pipeline);
    for (int i = 0; i < pipeline; i++)
        memcpy(batch + len * (size_t)i, req, len);
    ms_memio_t m;
    ms_memio_open(s, &m);
    size_t out = 0;
    if (is_h2) {
        /* The preface, SETTINGS, a window for every reply, then n streams' HEADERS. */
        static const char start[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                                    "\x00\x00\x00\x04\x00\x00\x00\x00\x00"
                                    "\x00\x00\x04\x08\x00\x00\x00\x00\x00\x7f\xff\x00\x00";
        /* h2: every field a literal, its name too, never indexed. h2idx: as h2load's encoder
         * sends them, :method, :scheme and :path from the static table, :authority and
         * user-agent literals the first time (indexed incrementally), then from the dynamic
         * table. */
        static const char literal[] = "\x00\x07:method\x03GET"
                                      "\x00\x07:scheme\x04http"
                                      "\x00\x05:path\x01/"
                                      "\x00\x0a:authority\x0e"
                                      "127.0.0.1:8080";
        static const char first[] = "\x82\x86\x41\x0e"
                                    "127.0.0.1:8080"
                                    "\x84\x7a\x15h2load nghttp2/1.52.0";
        static const char indexed[] = "\x82\x86\xbf\x84\xbe";
        int idx = strcmp(mode, "h2idx") == 0;
        const char *fields = idx ? indexed : literal;
        size_t fl = idx ? sizeof(indexed) - 1 : sizeof(literal) - 1;
        size_t fl0 = idx ? sizeof(first) - 1 : fl; /* the first stream's */
        char *frames = malloc(9 * (size_t)n + fl0 + fl * (size_t)(n - 1));
        size_t *at = malloc(sizeof(*at) * (size_t)(n + 1));
        at[0] = 0;
        for (long i = 0; i < n; i++) {
            size_t plen = i == 0 ? fl0 : fl;
            unsigned char *f = (unsigned char *)frames + at[i];
            uint32_t id = (uint32_t)(2 * i + 1);
            unsigned char hd[9] = {0,
                                   (unsigned char)(plen >> 8),
                                   (unsigned char)plen,
                                   1,
                                   5,
                                   (unsigned char)(id >> 24),
                                   (unsigned char)(id >> 16),
                                   (unsigned char)(id >> 8),
                                   (unsigned char)id};
            memcpy(f, hd, 9);
            memcpy(f + 9, i == 0 && idx ? first : fields, plen);
            at[i + 1] = at[i] + 9 + plen;
        }
        ms_memio_feed(&m, start, sizeof(start) - 1);
        for (long i = 0; i < n; i += pipeline) {
            long k = n - i < pipeline ? n - i : pipeline;
            ms_memio_feed(&m, frames + at[i], at[i + k] - at[i]);
            out += m.out.len;
            m.out.len = 0;
        }
        free(at);
        free(frames);
    }
    for (long i = 0; i < n && !is_h2; i += pipeline) {
        if (churn && i > 0) {
            ms_memio_peer_close(&m, UV_EOF);
            ms_memio_free(&m);
            ms_memio_open(s, &m);
        }
        ms_memio_feed(&m, batch, len * (size_t)pipeline);
        out += m.out.len;
        m.out.len = 0;
        if (alog != NULL && i % 64 < (long)pipeline) {
            uv_run(&loop, UV_RUN_NOWAIT);
            while (ms_server_access_busy(s)) /* as a loop that has other work meanwhile */
                uv_run(&loop, UV_RUN_ONCE);
        }
    }
    printf("%ld requests, %zu bytes out, %llu allocations\n", n, out,
           (unsigned long long)ms_mem_stats.allocs);
    if (alog != NULL && ms_server_access_dropped(s, 0) > 0)
        printf("%llu access log lines dropped\n", (unsigned long long)ms_server_access_dropped(s, 0));
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    ms_server_free(s);
    uv_loop_close(&loop);
    free(batch);
    if (dir != NULL) {
        char path[64];
        snprintf(path, sizeof(path), "%s/10k.bin", dir);
        unlink(path);
        rmdir(dir);
    }
    return 0;
}
