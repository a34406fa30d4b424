/* req_test.c: the request layer every protocol shares: target split, header room, reply
 * fields, refusals (status, body, one log line), health paths and the https redirect. */
#include "test.h"

#include "../../../core/http/req.c"
#include "../../../core/transport/memio.h"
#include "text.h"

#define S(lit) lit, sizeof(lit) - 1

static uv_loop_t loop;
static ms_server_t *srv;
static int requests;
static char seen[256]; /* what the handler noted */
static int rc_reserved[4], rc_bad[3];

static void on_request(ms_req_t *r, void *data)
{
    (void)data;
    requests++;
    const ms_str_t *last = ms_req_header(r, S("x-h58"));
    snprintf(seen, sizeof(seen), "%d|%.*s|%d", r->v.nheaders, last ? (int)last->len : 0,
             last ? last->base : "", r->headers_cap);
    rc_reserved[0] = ms_reply_header(r, S("Content-Length"), S("1"));
    rc_reserved[1] = ms_reply_header(r, S("transfer-encoding"), S("chunked"));
    rc_reserved[2] = ms_reply_header(r, S("Date"), S("now"));
    rc_reserved[3] = ms_reply_header(r, S("connection"), S("keep-alive"));
    rc_bad[0] = ms_reply_header(r, S("bad name"), S("v"));
    rc_bad[1] = ms_reply_header(r, S("x-split"), S("a\r\nx-forged: 1"));
    rc_bad[2] = ms_reply_field(r, S("x-ok: 1\r\nno colon\r\n"));
    ms_reply_header(r, S("x-fine"), S("yes"));
    ms_req_finish(r); /* no reply: 200 with an empty body */
}

static void on_resume(ms_req_t *r, void *data)
{
    (void)r;
    (void)data;
}

static char lines[16][512];
static int nlines;

static void keep_log(int level, const char *msg, size_t len)
{
    (void)level;
    if (nlines < 16)
        snprintf(lines[nlines], sizeof(lines[0]), "%.*s", (int)len, msg);
    nlines++;
}

static void setup(void)
{
    ms_log_set(keep_log, MS_LOG_INFO);
    uv_loop_init(&loop);
    srv = ms_server_new(&loop, NULL, on_request, on_resume, NULL);
    requests = 0;
    nlines = 0;
    seen[0] = 0;
}

static void teardown(void)
{
    ms_server_free(srv);
    uv_loop_close(&loop);
    ms_log_set(NULL, MS_LOG_ERR);
}

/* Feeds `req` on a new connection; the reply in `m` (closed by the peer after). */
static const char *ask(ms_memio_t *m, const char *req, uint32_t flags)
{
    ms_conn_t *c = ms_memio_open(srv, m);
    c->flags |= flags;
    ms_memio_feed(m, req, strlen(req));
    ms_memio_peer_close(m, UV_EOF);
    return text(&m->out);
}

TEST(req_splits_the_target_into_path_and_query)
{
    static const struct {
        const char *target, *path, *query;
    } cases[] = {
        {"/a/b?x=1&y", "/a/b", "x=1&y"},
        {"/", "/", NULL},
        {"/a?b?c", "/a", "b?c"},
        {"/a?", "/a", ""},
        {"?q", "/", "q"},
        {"*", "*", NULL},
        {"http://h.example/p/q?z=2", "/p/q", "z=2"}, /* absolute form: its path */
        {"http://h.example?z", "/", "z"},
        {"http://h.example", "/", NULL},
        {"https://h.example:8443/", "/", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        ms_req_t r;
        memset(&r, 0, sizeof(r));
        r.v.target.base = cases[i].target;
        r.v.target.len = strlen(cases[i].target);
        ms__req_split_target(&r);
        char path[64], query[64];
        snprintf(path, sizeof(path), "%.*s", (int)r.v.path.len, r.v.path.base);
        ASSERT_STR_EQ(cases[i].path, path);
        if (cases[i].query == NULL) {
            if (r.v.query.base != NULL)
                TEST_FAIL("%s: a query where none was", cases[i].target);
        } else {
            ASSERT(r.v.query.base != NULL);
            snprintf(query, sizeof(query), "%.*s", (int)r.v.query.len, r.v.query.base);
            ASSERT_STR_EQ(cases[i].query, query);
        }
    }
}

TEST(req_header_room_doubles_in_the_pool)
{
    ms_req_t r;
    memset(&r, 0, sizeof(r));
    ms_pool_init(&r.pool);
    ms__req_init(&r);
    ASSERT(r.headers == r.hdr_inline);
    ASSERT_EQ(MS_HEADERS_INLINE, r.headers_cap);
    ASSERT_EQ(200, r.v.status);
    ASSERT_EQ(-1, r.v.content_length);
    for (int i = 0; i < MS_HEADERS_INLINE; i++) {
        r.hdr_inline[i].name.base = "n";
        r.hdr_inline[i].name.len = 1;
        r.hdr_inline[i].value.len = (size_t)i;
    }
    r.v.nheaders = MS_HEADERS_INLINE;
    ms__req_headers_grow(&r);
    ASSERT_EQ(2 * MS_HEADERS_INLINE, r.headers_cap);
    ASSERT(r.headers != r.hdr_inline);
    for (int i = 0; i < MS_HEADERS_INLINE; i++)
        ASSERT_EQ(i, r.headers[i].value.len);
    ms__req_reset(&r); /* the next request starts inline again */
    ASSERT(r.headers == r.hdr_inline);
    ASSERT_EQ(MS_HEADERS_INLINE, r.headers_cap);
    ms_pool_free(&r.pool);

    /* Through HTTP/1.1: 60 fields, all found. */
    setup();
    char req[4096];
    int n = snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nHost: a\r\n");
    for (int i = 0; i < 59; i++)
        n += snprintf(req + n, sizeof(req) - (size_t)n, "X-H%d: v%d\r\n", i, i);
    snprintf(req + n, sizeof(req) - (size_t)n, "\r\n");
    ms_memio_t m;
    ask(&m, req, 0);
    ASSERT_EQ(1, requests);
    ASSERT_STR_EQ("60|v58|96", seen);
    ms_memio_free(&m);
    teardown();
}

TEST(req_reply_fields_refuse_reserved_and_malformed_ones)
{
    setup();
    ms_memio_t m;
    const char *out = ask(&m, "GET / HTTP/1.1\r\nHost: a\r\n\r\n", 0);
    ASSERT_EQ(1, requests);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(MS_ERESERVED, rc_reserved[i]);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(MS_EBADHEADER, rc_bad[i]);
    ASSERT(strncmp(out, "HTTP/1.1 200 OK\r\n", 17) == 0);
    ASSERT_HAS(out, "x-fine: yes\r\n");
    ASSERT_HAS(out, "content-length: 0\r\n");
    ASSERT_LACKS(out, "x-forged");
    ASSERT_LACKS(out, "x-ok"); /* a refused block adds nothing, not even its good lines */
    ASSERT_LACKS(out, "keep-alive");
    ms_memio_free(&m);
    ASSERT_EQ(0, ms_fields_check(S("a: b\r\nc-d: e f\r\n")));
    ASSERT_EQ(MS_EBADHEADER, ms_fields_check(S("a: b")));        /* no CRLF */
    ASSERT_EQ(MS_EBADHEADER, ms_fields_check(S("a b: c\r\n")));  /* not a token */
    ASSERT_EQ(MS_EBADHEADER, ms_fields_check(S("a: b\rc\r\n"))); /* a CR in the value */
    teardown();
}

TEST(req_refusal_answers_its_status_and_logs_one_line_then_counts)
{
    setup();
    ms_memio_t m;
    const char *out = ask(&m, "GET / HTTP/1.1\r\nHost a\r\n\r\n", 0);
    ASSERT_EQ(0, requests);
    ASSERT(strncmp(out, "HTTP/1.1 400 Bad Request\r\n", 26) == 0);
    ASSERT_HAS(out, "\r\n\r\n400 Bad Request\n");
    ASSERT_EQ(1, (int)srv->stats->bad_requests);
    ASSERT_EQ(1, nlines);
    ASSERT_HAS(lines[0], "memory: 400 Bad Request: ");
    ms_memio_free(&m);
    char body[64];
    ASSERT_EQ(36, ms__refusal_body(431, body, sizeof(body)));
    ASSERT_STR_EQ("431 Request Header Fields Too Large\n", body);
    ASSERT_STR_EQ("", ms__reason(299));

    /* A flood: MS_REFUSALS_TOLD lines a second with their reason, the rest counted. */
    for (int i = 1; i < MS_REFUSALS_TOLD + 5; i++) {
        ask(&m, "GET / HTTP/1.1\r\nHost a\r\n\r\n", 0);
        ms_memio_free(&m);
    }
    ASSERT_EQ(MS_REFUSALS_TOLD + 5, (int)srv->stats->bad_requests);
    ASSERT_EQ(MS_REFUSALS_TOLD, nlines);
    ASSERT_EQ(5, (int)srv->refused_quiet);
    teardown();
}

TEST(req_health_paths_answer_before_the_handler)
{
    setup();
    ms_server_health(srv, "/livez", "/readyz");
    ms_memio_t m;
    const char *out = ask(&m, "GET /livez HTTP/1.1\r\nHost: a\r\n\r\n", 0);
    ASSERT(strncmp(out, "HTTP/1.1 200 OK\r\n", 17) == 0);
    ASSERT_HAS(out, "cache-control: no-store\r\n");
    ASSERT_HAS(out, "\r\n\r\nok\n");
    ms_memio_free(&m);
    out = ask(&m, "HEAD /readyz HTTP/1.1\r\nHost: a\r\n\r\n", 0);
    ASSERT(strncmp(out, "HTTP/1.1 200 OK\r\n", 17) == 0);
    ms_memio_free(&m);
    ASSERT_EQ(0, requests);
    out = ask(&m, "POST /livez HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", 0);
    ASSERT_EQ(1, requests); /* not GET or HEAD: the app's */
    ms_memio_free(&m);
    /* Stopping: not ready, still live; a handover stays ready. */
    srv->stopping = 1;
    out = ask(&m, "GET /readyz HTTP/1.1\r\nHost: a\r\n\r\n", 0);
    ASSERT(strncmp(out, "HTTP/1.1 503 Service Unavailable\r\n", 34) == 0);
    ASSERT_HAS(out, "stopping\n");
    ms_memio_free(&m);
    out = ask(&m, "GET /livez HTTP/1.1\r\nHost: a\r\n\r\n", 0);
    ASSERT(strncmp(out, "HTTP/1.1 200 OK\r\n", 17) == 0);
    ms_memio_free(&m);
    ms_server_handing_over(srv);
    out = ask(&m, "GET /readyz HTTP/1.1\r\nHost: a\r\n\r\n", 0);
    ASSERT(strncmp(out, "HTTP/1.1 200 OK\r\n", 17) == 0);
    ms_memio_free(&m);
    srv->stopping = 0;
    /* Turned off: the handler's again. */
    ms_server_health(srv, "", NULL);
    ASSERT(srv->livez == NULL && srv->readyz == NULL);
    ask(&m, "GET /livez HTTP/1.1\r\nHost: a\r\n\r\n", 0);
    ASSERT_EQ(2, requests);
    ms_memio_free(&m);
    teardown();
}

TEST(req_redirect_listener_sends_308_to_https)
{
    setup();
    ms_memio_t m;
    const char *out = ask(&m, "GET /p?q=1 HTTP/1.1\r\nHost: example.com:8080\r\n\r\n",
                          MS_CONN_REDIRECT);
    ASSERT(strncmp(out, "HTTP/1.1 308 Permanent Redirect\r\n", 33) == 0);
    ASSERT_HAS(out, "location: https://example.com/p?q=1\r\n");
    ms_memio_free(&m);
    ms_server_https_port(srv, 8443);
    out = ask(&m, "GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n", MS_CONN_REDIRECT);
    ASSERT_HAS(out, "location: https://[::1]:8443/\r\n");
    ms_memio_free(&m);
    out = ask(&m, "GET / HTTP/1.0\r\n\r\n", MS_CONN_REDIRECT); /* no host to send it to */
    ASSERT(strncmp(out, "HTTP/1.1 400 Bad Request\r\n", 26) == 0 ||
           strncmp(out, "HTTP/1.0 400 Bad Request\r\n", 26) == 0);
    ms_memio_free(&m);
    ASSERT_EQ(0, requests);
    teardown();
}

TEST_MAIN()
