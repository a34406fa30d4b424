/* accesslog_test.c: the access log: templates compiled or refused, combined and JSON lines
 * written to a real file on the thread pool, escaping of what a client sends, which log a
 * request goes to, a full buffer dropping lines, and reopening after rotation. */
#include "test.h"

#include <sys/stat.h>
#include <unistd.h>

#include "../../../core/http/accesslog.c"
#include "../../../core/transport/memio.h"

#define S(lit) lit, sizeof(lit) - 1

static uv_loop_t loop;
static ms_server_t *srv;
static char dir[64];
static int requests;
/* What the handler does with its request's log: -2 leaves it, else ms_req_access's `log`. */
static int use_log = -2;
static const char *route; /* given to ms_req_access when set */
static size_t route_len;

static void on_request(ms_req_t *r, void *data)
{
    (void)data;
    requests++;
    if (use_log != -2 || route != NULL)
        ms_req_access(r, use_log, route, route_len);
    ms_reply_send(r, S("hello"), MS_VEC_STATIC, -1);
    ms_req_finish(r);
}

static void on_resume(ms_req_t *r, void *data)
{
    (void)r;
    (void)data;
}

static char warns[8][512];
static int nwarns;

static void keep_log(int level, const char *msg, size_t len)
{
    if (level <= MS_LOG_WARN && nwarns < 8)
        snprintf(warns[nwarns], sizeof(warns[0]), "%.*s", (int)len, msg);
    if (level <= MS_LOG_WARN)
        nwarns++;
}

static void setup(void)
{
    ms_log_set(keep_log, MS_LOG_INFO);
    uv_loop_init(&loop);
    srv = ms_server_new(&loop, NULL, on_request, on_resume, NULL);
    snprintf(dir, sizeof(dir), "/tmp/ms-alog-XXXXXX");
    if (mkdtemp(dir) == NULL)
        abort();
    requests = nwarns = 0;
    use_log = -2;
    route = NULL;
}

static char path_buf[4][128];
/* A file of the temporary folder (four names at once). */
static const char *file(const char *name)
{
    static int n;
    char *p = path_buf[n++ % 4];
    snprintf(p, sizeof(path_buf[0]), "%s/%s", dir, name);
    return p;
}

static void teardown(void)
{
    ms_server_free(srv);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(0, uv_loop_close(&loop));
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ASSERT_EQ(0, system(cmd));
    ms_log_set(NULL, MS_LOG_ERR);
}

/* One request on a connection of its own, answered before this returns. */
static void ask(const char *req)
{
    ms_memio_t m;
    ms_memio_open(srv, &m);
    ms_memio_feed(&m, req, strlen(req));
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
}

static char content[1 << 17];
/* The file's text ("" when it is missing). */
static const char *slurp(const char *path)
{
    content[0] = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return content;
    size_t n = fread(content, 1, sizeof(content) - 1, f);
    content[n] = 0;
    fclose(f);
    return content;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* Runs the loop until every log's lines are written (the flush timer, then the thread pool's
 * write), at most about 5 s. */
static int settle(void)
{
    for (int i = 0; i < 500; i++) {
        int gathered = 0;
        for (int k = 0; k < MS_ALOG_MAX && srv->alogs; k++)
            if (srv->alogs->log[k] != NULL && srv->alogs->log[k]->glen > 0)
                gathered = 1;
        if (!gathered && !ms_server_access_busy(srv))
            return 1;
        uv_run(&loop, UV_RUN_ONCE);
    }
    return 0;
}

TEST(alog_compiles_templates_and_refuses_bad_ones_with_their_reason)
{
    setup();
    const char *why = "unset";
    int id = ms_server_access_log(srv, "-", "$status ${route}x $$ $method:$nope", &why);
    ASSERT_EQ(MS_EBADREQ, id);
    ASSERT_HAS(why, "unknown field (time, time_local");
    ASSERT_EQ(MS_EBADREQ, ms_server_access_log(srv, "-", "[${status]", &why));
    ASSERT_STR_EQ("a ${ without its }", why);
    ASSERT_EQ(MS_EBADREQ, ms_server_access_log(srv, "-", "${status", &why));
    ASSERT_STR_EQ("a ${ without its }", why);

    /* A good one: literals, "$$", ${name} against letters, fields. */
    id = ms_server_access_log(srv, "-", "$status ${route}x $$ [$method]", &why);
    ASSERT_EQ(0, id);
    ASSERT(why == NULL);
    ms_alog_t *l = srv->alogs->log[0];
    ASSERT_EQ(FMT_TEMPLATE, l->format);
    static const uint8_t want[] = {F_STATUS, F_TEXT, F_ROUTE, F_TEXT, F_TEXT, F_METHOD, F_TEXT};
    ASSERT_EQ(sizeof(want), l->npieces);
    for (int i = 0; i < l->npieces; i++)
        if (l->pieces[i].field != want[i])
            TEST_FAIL("piece %d: field %d, not %d", i, l->pieces[i].field, want[i]);
    ASSERT_EQ(2, l->pieces[3].len); /* "x ", then "$ [" from the "$$" on */
    ASSERT(memcmp(l->text + l->pieces[4].off, "$ [", l->pieces[4].len) == 0);
    ASSERT(!l->wants_client && !l->wants_id && !l->wants_fields);
    ASSERT_EQ(1, ms_server_access_log(srv, "-", "json", &why));
    ASSERT_EQ(FMT_JSON, srv->alogs->log[1]->format);
    ASSERT_EQ(2, ms_server_access_log(srv, "-", NULL, &why)); /* combined */
    ASSERT(srv->alogs->log[2]->wants_client && srv->alogs->log[2]->wants_fields);

    /* A file that cannot be opened: the code says why. */
    ASSERT_EQ(UV_ENOENT, ms_server_access_log(srv, file("no/such/dir"), NULL, &why));
    ASSERT(why == NULL);
    /* At most MS_ALOG_MAX logs. */
    for (int i = 3; i < MS_ALOG_MAX; i++)
        ASSERT_EQ(i, ms_server_access_log(srv, "-", "$status", &why));
    ASSERT_EQ(MS_EBADREQ, ms_server_access_log(srv, "-", "$status", &why));
    ASSERT_STR_EQ("too many access logs", why);
    teardown();
}

TEST(alog_writes_a_combined_line_to_its_file_on_the_thread_pool)
{
    setup();
    const char *why;
    const char *path = file("access.log");
    int id = ms_server_access_log(srv, path, "combined", &why);
    ASSERT_EQ(0, id);
    ms_server_access_default(srv, id);
    ask("GET /a?b=1 HTTP/1.1\r\nHost: h\r\nReferer: http://r.example/\r\n"
        "User-Agent: curl/8 \"quoted\"\xff\r\n\r\n");
    ASSERT_EQ(1, requests);
    /* Gathered, not written yet: the write waits for the flush timer. */
    ASSERT_STR_EQ("", slurp(path));
    ASSERT(srv->alogs->log[0]->glen > 0);
    ASSERT(settle());
    const char *got = slurp(path);
    ASSERT_EQ(1, count_lines(got));
    ASSERT(strncmp(got, "memory - - [", 12) == 0);
    ASSERT_HAS(got, "] \"GET /a?b=1 HTTP/1.1\" 200 ");
    /* The reply's bytes, the fields; '"' and bytes past ASCII as \xHH (one field, one line). */
    ASSERT_HAS(got, " \"http://r.example/\" \"curl/8 \\x22quoted\\x22\\xff\"\n");
    /* [10/Oct/2000:13:55:36 +0000]: the local time as nginx writes it */
    const char *t = strchr(got, '[');
    ASSERT(t != NULL && t[3] == '/' && t[7] == '/' && t[12] == ':' && t[21] == ' ' &&
           (t[22] == '+' || t[22] == '-') && t[27] == ']');
    ASSERT_EQ(0, ms_server_access_dropped(srv, id));
    teardown();
}

TEST(alog_writes_json_lines_that_stay_json_whatever_the_client_sends)
{
    setup();
    const char *why;
    const char *path = file("access.json");
    ms_server_access_default(srv, ms_server_access_log(srv, path, "json", &why));
    /* Quotes, a backslash, control bytes, valid and invalid UTF-8 (a lone continuation byte,
     * a surrogate, an overlong form, a lead byte past U+10FFFF), in a route the handler
     * names. */
    static const char hostile[] =
        "a\"b\\c\n\x01\x7f\xc3\xa9\x80\xed\xa0\x80\xc0\xaf\xf5\x80\x80\x80!";
    route = hostile;
    route_len = sizeof(hostile) - 1;
    use_log = -2; /* the default log, as it is */
    ask("GET /x HTTP/1.1\r\nHost: h\r\nUser-Agent: ua \xe2\x82\xac \xff\r\n\r\n");
    ASSERT(settle());
    const char *got = slurp(path);
    ASSERT_EQ(1, count_lines(got));
    ASSERT(strncmp(got, "{\"time\":\"", 9) == 0);
    ASSERT_HAS(got,
               "\",\"client\":\"memory\",\"method\":\"GET\",\"target\":\"/x\",\"status\":200,");
    ASSERT_HAS(got, ",\"protocol\":\"HTTP/1.1\",\"tls\":null,\"request_id\":\"");
    ASSERT_HAS(got, ",\"route\":\"a\\\"b\\\\c\\u000a\\u0001\\u007f\xc3\xa9\\u0080\\u00ed\\u00a0"
                    "\\u0080\\u00c0\\u00af\\u00f5\\u0080\\u0080\\u0080!\",");
    ASSERT_HAS(got, ",\"referer\":null,\"user_agent\":\"ua \xe2\x82\xac \\u00ff\"}\n");
    /* And a JSON reader takes it. */
    char cmd[256];
    snprintf(cmd, sizeof(cmd),
             "/usr/bin/python3 -c 'import json,sys; json.load(open(sys.argv[1], \"rb\"))' %s",
             path);
    ASSERT_EQ(0, system(cmd));
    teardown();
}

TEST(alog_a_request_goes_to_the_default_log_or_the_one_it_names_or_none)
{
    setup();
    const char *why;
    const char *a = file("a.log"), *b = file("b.log");
    int ia = ms_server_access_log(srv, a, "$target $route", &why);
    int ib = ms_server_access_log(srv, b, "$target $route", &why);
    ASSERT(ia == 0 && ib == 1);
    ask("GET /before-default HTTP/1.1\r\nHost: h\r\n\r\n"); /* no default yet: no log */
    ms_server_access_default(srv, ia);
    ask("GET /default HTTP/1.1\r\nHost: h\r\n\r\n");
    use_log = ib;
    route = "users";
    route_len = 5;
    ask("GET /named HTTP/1.1\r\nHost: h\r\n\r\n");
    use_log = -1;
    route = NULL;
    ask("GET /none HTTP/1.1\r\nHost: h\r\n\r\n");
    use_log = -2;
    ms_server_access_default(srv, -1);
    ask("GET /no-default HTTP/1.1\r\nHost: h\r\n\r\n");
    ms_server_access_default(srv, 7); /* no such log: none */
    ask("GET /bad-default HTTP/1.1\r\nHost: h\r\n\r\n");
    ASSERT_EQ(6, requests);
    ASSERT(settle());
    ASSERT_STR_EQ("/default -\n", slurp(a));
    ASSERT_STR_EQ("/named users\n", slurp(b));
    teardown();
}

TEST(alog_a_full_buffer_drops_lines_counts_them_and_says_so_once)
{
    setup();
    const char *why;
    const char *path = file("full.log");
    int id = ms_server_access_log(srv, path, "$target", &why);
    ms_server_access_default(srv, id);
    /* Requests answered without the loop running: the first write goes at 32 KiB, and the
     * lines after gather until the buffer has no room for one more. */
    char req[256];
    int n = 3000;
    for (int i = 0; i < n; i++) {
        snprintf(req, sizeof(req), "GET /%05d-%0100d HTTP/1.1\r\nHost: h\r\n\r\n", i, 0);
        ask(req);
    }
    ASSERT_EQ(n, requests);
    uint64_t dropped = ms_server_access_dropped(srv, id);
    ASSERT(dropped > 0);
    ASSERT_EQ(1, nwarns);
    ASSERT_HAS(warns[0], "buffer full");
    ASSERT(settle());
    const char *got = slurp(path);
    ASSERT_EQ(n, count_lines(got) + (int)dropped);
    ASSERT(strncmp(got, "/00000-", 7) == 0); /* the first lines are kept, in order */
    /* Written again: said once, with the count. */
    ask("GET /after HTTP/1.1\r\nHost: h\r\n\r\n");
    ASSERT(settle());
    ASSERT_EQ(2, nwarns);
    ASSERT_HAS(warns[1], "writing again");
    ASSERT_HAS(slurp(path), "/after\n");
    teardown();
}

TEST(alog_reopen_after_rotation_writes_to_the_new_file)
{
    setup();
    const char *why;
    const char *path = file("r.log"), *old = file("r.log.1");
    int id = ms_server_access_log(srv, path, "$target", &why);
    ms_server_access_default(srv, id);
    ask("GET /first HTTP/1.1\r\nHost: h\r\n\r\n");
    ASSERT(settle());
    ASSERT_EQ(0, rename(path, old));
    ms_server_access_reopen(srv);
    ask("GET /second HTTP/1.1\r\nHost: h\r\n\r\n");
    ASSERT(settle());
    ASSERT_STR_EQ("/first\n", slurp(old));
    ASSERT_STR_EQ("/second\n", slurp(path));

    /* A reopen while a write is under way waits for it: that write goes to the old file. */
    ASSERT_EQ(0, rename(path, old));
    ask("GET /third HTTP/1.1\r\nHost: h\r\n\r\n");
    ms_alog_t *l = srv->alogs->log[id];
    start_write(l);
    ASSERT(l->writing);
    int fd = l->fd;
    ms_server_access_reopen(srv);
    ASSERT(l->reopen);
    ASSERT_EQ(fd, l->fd);
    ASSERT(settle());
    ASSERT(!l->reopen);
    ask("GET /fourth HTTP/1.1\r\nHost: h\r\n\r\n");
    ASSERT(settle());
    ASSERT_STR_EQ("/second\n/third\n", slurp(old));
    ASSERT_STR_EQ("/fourth\n", slurp(path));
    teardown();
}

TEST(alog_lines_gathered_at_the_end_are_written_when_the_server_is_freed)
{
    setup();
    const char *why;
    const char *path = file("end.log");
    ms_server_access_default(srv, ms_server_access_log(srv, path, "$method $status", &why));
    ask("POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n");
    ASSERT_STR_EQ("", slurp(path));
    ms_server_free(srv);
    srv = ms_server_new(&loop, NULL, on_request, on_resume, NULL);
    ASSERT_STR_EQ("POST 200\n", slurp(path));
    teardown();
}

TEST_MAIN()
