/* static_fuzz.c: requests for static files, arbitrary bytes split arbitrarily, against a
 * mount of a small tree: paths, ranges, validators and codings through the whole reply. */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "transport/memio.h"
#include "moonserve.h"
#include "http/static/static.h"
#include "replies.h"

/* A secret outside the tree, reachable only through a symlink that must not be followed. */
#define SECRET "moonserve-fuzz-secret"

static char root[64];

static void put(const char *name, const char *data, size_t len)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", root, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, len, f) != len)
        abort();
    fclose(f);
}

/* The tree, made once per process. */
static void make_tree(void)
{
    snprintf(root, sizeof(root), "/tmp/ms-static-fuzz-XXXXXX");
    if (mkdtemp(root) == NULL)
        abort();
    char path[128], text[6000];
    for (size_t i = 0; i < sizeof(text); i++)
        text[i] = "abcdefgh \n"[i % 10];
    snprintf(path, sizeof(path), "%s/site", root);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/site/d", root);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/site/list", root);
    mkdir(path, 0755);
    put("secret.txt", SECRET, strlen(SECRET));
    put("site/a.txt", text, 3000);
    put("site/big.bin", text, sizeof(text)); /* over memory_max below: read in parts */
    put("site/s.css", text, 2000);
    put("site/s.css.br", "br-bytes", 8);
    put("site/s.css.gz", "gz-bytes", 8);
    put("site/d/index.html", "<p>index</p>", 12);
    put("site/list/x<y>.txt", "x", 1);
    put("site/.env", SECRET, strlen(SECRET));
    put("site/app.3f9a1c.js", "js", 2);
    snprintf(path, sizeof(path), "%s/site/out", root);
    char target[128];
    snprintf(target, sizeof(target), "%s/secret.txt", root);
    if (symlink(target, path) != 0)
        abort();
}

static void on_request(ms_req_t *r, void *data)
{
    (void)data;
    r->v.status = 404;
    ms_reply_send(r, "miss", 4, MS_VEC_STATIC, -1);
    ms_req_finish(r);
}

static void on_resume(ms_req_t *r, void *data)
{
    (void)r;
    (void)data;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (root[0] == 0) {
        ms_log_set(NULL, MS_LOG_ERR);
        make_tree();
    }
    if (size < 2)
        return 0;
    /* First byte: the piece size the input is fed in (1..256). Second: congestion, and the
     * mount's options. */
    size_t step = (size_t)data[0] + 1;
    int congested = data[1] & 1;
    ms_static_opts_t o;
    ms_static_opts_default(&o);
    o.memory_max = 4096;
    o.listing = (data[1] >> 1) & 1;
    o.spa = (data[1] >> 2) & 1;
    o.live_reload = (data[1] >> 3) & 1;
    o.compress = (data[1] >> 4) & 1;
    data += 2;
    size -= 2;

    /* One loop for every input: a loop closed closes its inotify descriptor (live_reload's),
     * which waits on the kernel's grace period, some milliseconds each time: a loop a input
     * left the target idle four fifths of the clock. */
    static uv_loop_t loop;
    static int loop_ready;
    if (!loop_ready) {
        uv_loop_init(&loop);
        loop_ready = 1;
    }
    ms_server_t *s = ms_server_new(&loop, NULL, on_request, on_resume, NULL);
    char dir[128];
    snprintf(dir, sizeof(dir), "%s/site", root);
    if (ms_static_mount(s, "/", dir, &o) != 0)
        abort();
    ms_memio_t m;
    ms_memio_open(s, &m);
    m.congested = congested;
    for (size_t off = 0; off < size && m.conn != NULL; off += step) {
        size_t n = size - off < step ? size - off : step;
        char *piece = malloc(n); /* a copy, so ASan sees any read past what was fed */
        memcpy(piece, data + off, n);
        ms_memio_feed(&m, piece, n);
        free(piece);
        for (int i = 0; i < 64 && congested && m.held.len > 0; i++)
            ms_memio_drain(&m);
    }
    /* What was written is HTTP/1.1 responses, or HTTP/2 frames after the preface (a mount
     * serves both), and never the secret behind the symlink or the dotfile (unless the
     * request itself named it: a redirect gives its query back). */
    if (m.out.len > 0 && memcmp(m.out.base, "HTTP/1.1 ", 9) != 0 && !settings_first(&m.out))
        abort();
    if (m.out.len > 0 && memmem(m.out.base, m.out.len, SECRET, strlen(SECRET)) != NULL &&
        memmem(data, size, SECRET, strlen(SECRET)) == NULL)
        abort();
    ms_memio_peer_close(&m, UV_EOF);
    while (m.conn != NULL && m.held.len > 0)
        ms_memio_drain(&m);
    if (m.conn != NULL)
        ms_memio_peer_close(&m, UV_ECONNRESET);
    ms_memio_free(&m);
    ms_server_free(s);
    uv_run(&loop, UV_RUN_NOWAIT); /* (the handles the server closed) */
    return 0;
}
