/* mime_test.c: the content-type table: mime.types files, built-in types, lookups. */
#include "test.h"

#include <unistd.h>

#include "../../../../core/http/static/mime.c"

#define S(lit) lit, sizeof(lit) - 1

/* The Content-Type for a NUL-terminated name, checking that the length agrees. */
static const char *type_of(const ms_mime_t *m, const char *name)
{
    size_t len = 12345;
    const char *t = ms_mime_type(m, name, strlen(name), &len);
    return len == strlen(t) ? t : "(length disagrees)";
}

/* Writes `text` to a new temporary file and puts its name in `path`. */
static int write_temp(char *path, size_t size, const char *text)
{
    const char *dir = getenv("TMPDIR");
    snprintf(path, size, "%s/mime_test_XXXXXX", dir != NULL && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0)
        return -1;
    size_t n = strlen(text);
    int ok = write(fd, text, n) == (ssize_t)n;
    close(fd);
    return ok ? 0 : -1;
}

TEST(mime_builtin_table_without_a_file)
{
    static const char *const want[][2] = {
        {"index.html", "text/html; charset=utf-8"},
        {"index.htm", "text/html; charset=utf-8"},
        {"site.css", "text/css; charset=utf-8"},
        {"app.js", "text/javascript; charset=utf-8"},
        {"mod.mjs", "text/javascript; charset=utf-8"},
        {"data.json", "application/json; charset=utf-8"},
        {"notes.txt", "text/plain; charset=utf-8"},
        {"feed.xml", "application/xml; charset=utf-8"},
        {"logo.svg", "image/svg+xml; charset=utf-8"},
        {"a.png", "image/png"},
        {"a.jpg", "image/jpeg"},
        {"a.jpeg", "image/jpeg"},
        {"a.gif", "image/gif"},
        {"a.webp", "image/webp"},
        {"a.avif", "image/avif"},
        {"favicon.ico", "image/vnd.microsoft.icon"},
        {"f.woff", "font/woff"},
        {"f.woff2", "font/woff2"},
        {"f.ttf", "font/ttf"},
        {"f.otf", "font/otf"},
        {"m.wasm", "application/wasm"},
        {"doc.pdf", "application/pdf"},
        {"a.zip", "application/zip"},
        {"a.gz", "application/gzip"},
        {"v.mp4", "video/mp4"},
        {"v.webm", "video/webm"},
        {"s.mp3", "audio/mpeg"},
        {"s.ogg", "audio/ogg"},
        {"app.js.map", "application/json; charset=utf-8"},
        {"t.csv", "text/csv; charset=utf-8"},
        {"README.md", "text/markdown; charset=utf-8"},
    };
    ms_mime_t *m = ms_mime_load(NULL);
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        ASSERT_STR_EQ(want[i][1], type_of(m, want[i][0]));
    ASSERT_EQ(31, (int)m->len); /* the 30 asked for, and htm */
    ms_mime_free(m);
    /* A missing file, a directory and an empty file all leave the built-in table. */
    char path[512];
    ASSERT_EQ(0, write_temp(path, sizeof(path), ""));
    const char *dir = getenv("TMPDIR");
    const char *paths[] = {"/nonexistent/mime.types", dir != NULL && *dir ? dir : "/tmp", path};
    for (int i = 0; i < 3; i++) {
        m = ms_mime_load(paths[i]);
        ASSERT_EQ(31, (int)m->len);
        ASSERT_STR_EQ("image/png", type_of(m, "x.png"));
        ms_mime_free(m);
    }
    unlink(path);
}

TEST(mime_reads_a_mime_types_file_and_fills_in_from_the_builtin_table)
{
    char path[512];
    ASSERT_EQ(0, write_temp(path, sizeof(path),
                            "# a comment line\n"
                            "\n"
                            "   \t \n"
                            "text/x-foo\tfoo FOOB  #bar trailing comment\n"
                            "application/x-first dup\n"
                            "application/x-second dup other\r\n"
                            "image/x-custom png\n"
                            "  #application/x-commented cmt\n"
                            "no-slash-here zzz\n"
                            "bad/type/twice yyy\n"
                            "application/x-none\n"
                            "application/x-long abcdefghijklmnop abcdefghijklmno a.b\n"
                            "application/x-last last"));
    ms_mime_t *m = ms_mime_load(path);
    unlink(path);
    ASSERT_STR_EQ("text/x-foo; charset=utf-8", type_of(m, "a.foo"));
    ASSERT_STR_EQ("text/x-foo; charset=utf-8", type_of(m, "a.foob")); /* stored lowercase */
    ASSERT_STR_EQ("application/octet-stream", type_of(m, "a.bar"));   /* commented out */
    /* An extension named twice keeps the first type, in file order. */
    ASSERT_STR_EQ("application/x-first", type_of(m, "a.dup"));
    ASSERT_STR_EQ("application/x-second", type_of(m, "a.other")); /* CRLF line end */
    /* The file wins over the built-in table; the built-in table fills what it lacks. */
    ASSERT_STR_EQ("image/x-custom", type_of(m, "a.png"));
    ASSERT_STR_EQ("text/html; charset=utf-8", type_of(m, "a.html"));
    ASSERT_STR_EQ("application/octet-stream", type_of(m, "a.cmt"));
    ASSERT_STR_EQ("application/octet-stream", type_of(m, "a.zzz")); /* malformed types */
    ASSERT_STR_EQ("application/octet-stream", type_of(m, "a.yyy"));
    ASSERT_STR_EQ("application/octet-stream", type_of(m, "a.abcdefghijklmnop")); /* 16 bytes */
    ASSERT_STR_EQ("application/x-long", type_of(m, "a.abcdefghijklmno"));        /* 15 bytes */
    ASSERT_STR_EQ("application/x-last", type_of(m, "a.last")); /* no final newline */
    /* foo foob dup other png last abcdefghijklmno, then the 31 built-in less png. */
    ASSERT_EQ(7 + 30, (int)m->len);
    /* Extensions of one line share one string. */
    ASSERT(ms_mime_type(m, S("a.foo"), NULL) == ms_mime_type(m, S("a.foob"), NULL));
    ms_mime_free(m);
}

TEST(mime_grows_the_table_for_a_large_file)
{
    static char text[128 * 1024];
    size_t n = 0;
    for (int i = 0; i < 2000; i++)
        n += (size_t)snprintf(text + n, sizeof(text) - n, "application/x-t%d e%d E%dx\n", i, i, i);
    char path[512];
    ASSERT_EQ(0, write_temp(path, sizeof(path), text));
    ms_mime_t *m = ms_mime_load(path);
    unlink(path);
    ASSERT_EQ(4000 + 31, (int)m->len);
    ASSERT(m->len * 2 <= m->cap);
    for (int i = 0; i < 2000; i++) {
        char name[32], want[32];
        snprintf(want, sizeof(want), "application/x-t%d", i);
        snprintf(name, sizeof(name), "f.e%d", i);
        ASSERT_STR_EQ(want, type_of(m, name));
        snprintf(name, sizeof(name), "f.E%dX", i);
        ASSERT_STR_EQ(want, type_of(m, name));
    }
    ASSERT_STR_EQ("text/css; charset=utf-8", type_of(m, "f.css"));
    ms_mime_free(m);
}

TEST(mime_reads_the_system_file_when_there_is_one)
{
    if (access("/etc/mime.types", R_OK) != 0)
        return;
    ms_mime_t *m = ms_mime_load("/etc/mime.types");
    ASSERT(m->len > 100);
    ASSERT_STR_EQ("text/html; charset=utf-8", type_of(m, "index.html"));
    ASSERT_STR_EQ("image/png", type_of(m, "a.png"));
    ASSERT_STR_EQ("application/json; charset=utf-8", type_of(m, "a.map")); /* built-in */
    ms_mime_free(m);
}

TEST(mime_extensions_ignore_case)
{
    ms_mime_t *m = ms_mime_load(NULL);
    ASSERT_STR_EQ("text/html; charset=utf-8", type_of(m, "INDEX.HTML"));
    ASSERT_STR_EQ("text/javascript; charset=utf-8", type_of(m, "/static/App.Js"));
    ASSERT_STR_EQ("image/jpeg", type_of(m, "IMG_0001.JPeG"));
    ms_mime_free(m);
}

TEST(mime_finds_the_extension_of_the_last_segment_only)
{
    ms_mime_t *m = ms_mime_load(NULL);
    static const char *const octet[] = {
        "",
        "README",
        "/dir/Makefile",
        ".bashrc",
        "/home/.profile",
        "..rc",
        "/x/..js",
        "trailing.",
        "/a.b/c",
        "/a.css/",
        "/",
        ".",
        "..",
        "/static/.css",
        "a.unknownext",
        "a.tar.xyz",
        "a.abcdefghijklmnopqrs",
    };
    for (size_t i = 0; i < sizeof(octet) / sizeof(octet[0]); i++)
        ASSERT_STR_EQ("application/octet-stream", type_of(m, octet[i]));
    ASSERT_STR_EQ("application/gzip", type_of(m, "archive.tar.gz"));
    ASSERT_STR_EQ("text/css; charset=utf-8", type_of(m, ".hidden.css")); /* a dotfile with one */
    ASSERT_STR_EQ("text/css; charset=utf-8", type_of(m, "/a.b/c.d/site.min.css"));
    ASSERT_STR_EQ("text/css; charset=utf-8", type_of(m, "a..css"));
    ASSERT_STR_EQ("image/png", type_of(m, "/a-very-long-directory-name/and-a-long-file-name.png"));
    /* Only `len` bytes count, and an embedded NUL is not padding. */
    ASSERT_STR_EQ("text/css; charset=utf-8", ms_mime_type(m, "site.css.map", 8, NULL));
    ASSERT_STR_EQ("application/octet-stream", ms_mime_type(m, "a.js\0", 5, NULL));
    ASSERT_STR_EQ("application/octet-stream", ms_mime_type(m, "a.j\0s", 5, NULL));
    size_t len = 0;
    ASSERT_STR_EQ("application/octet-stream", ms_mime_type(m, S("x.nope"), &len));
    ASSERT_EQ(24, (int)len);
    ms_mime_free(m);
}

TEST(mime_adds_a_charset_to_text_types_only)
{
    char path[512];
    ASSERT_EQ(0, write_temp(path, sizeof(path),
                            "text/x-a a\nTEXT/X-Upper up\napplication/javascript ajs\n"
                            "application/json js1\napplication/xml x1\nimage/svg+xml s1\n"
                            "application/xhtml+xml xh\napplication/wasm w1\ntext/ t0\n"));
    ms_mime_t *m = ms_mime_load(path);
    unlink(path);
    ASSERT_STR_EQ("text/x-a; charset=utf-8", type_of(m, "f.a"));
    ASSERT_STR_EQ("TEXT/X-Upper; charset=utf-8", type_of(m, "f.up"));
    ASSERT_STR_EQ("application/javascript; charset=utf-8", type_of(m, "f.ajs"));
    ASSERT_STR_EQ("application/json; charset=utf-8", type_of(m, "f.js1"));
    ASSERT_STR_EQ("application/xml; charset=utf-8", type_of(m, "f.x1"));
    ASSERT_STR_EQ("image/svg+xml; charset=utf-8", type_of(m, "f.s1"));
    ASSERT_STR_EQ("application/xhtml+xml", type_of(m, "f.xh"));
    ASSERT_STR_EQ("application/wasm", type_of(m, "f.w1"));
    ASSERT_STR_EQ("application/octet-stream", type_of(m, "f.t0")); /* "text/" is no type */
    ASSERT_STR_EQ("image/png", type_of(m, "f.png"));
    ASSERT_STR_EQ("application/pdf", type_of(m, "f.pdf"));
    ms_mime_free(m);
}

TEST(mime_says_what_is_worth_compressing)
{
    static const char *const yes[] = {
        "text/html",
        "text/plain; charset=utf-8",
        "TEXT/CSS",
        "text/javascript; charset=utf-8",
        "application/javascript",
        "application/json ; charset=utf-8",
        "application/ld+json",
        "application/manifest+json",
        "application/xml",
        "application/atom+xml",
        "image/svg+xml; charset=utf-8",
        "application/wasm",
        "font/ttf",
        "font/otf",
    };
    static const char *const no[] = {
        "image/png",
        "image/jpeg",
        "image/webp",
        "video/mp4",
        "audio/mpeg",
        "application/zip",
        "application/gzip",
        "font/woff2",
        "application/pdf",
        "application/octet-stream",
        "",
        "text/",
        "application/jsonx",
        "application/xml-dtd",
    };
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
        if (!ms_mime_compressible(yes[i], strlen(yes[i])))
            TEST_FAIL("%s should be compressible", yes[i]);
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
        if (ms_mime_compressible(no[i], strlen(no[i])))
            TEST_FAIL("%s should not be compressible", no[i]);
    /* Only `len` bytes count. */
    ASSERT_EQ(0, ms_mime_compressible("image/svg+xml", 9));
    /* Every value the built-in table gives is judged as its type is. */
    ms_mime_t *m = ms_mime_load(NULL);
    size_t len;
    const char *t = ms_mime_type(m, S("a.js"), &len);
    ASSERT_EQ(1, ms_mime_compressible(t, len));
    t = ms_mime_type(m, S("a.png"), &len);
    ASSERT_EQ(0, ms_mime_compressible(t, len));
    ms_mime_free(m);
}

TEST(mime_lookups_allocate_nothing)
{
    ms_mime_t *m = ms_mime_load(NULL);
    static const char *const names[] = {"/index.html", "a.PNG",  "x.tar.gz", ".bashrc",
                                        "README",      "a.nope", "/a.b/c",   "app.js.map"};
    uint64_t allocs = ms_mem_stats.allocs, reallocs = ms_mem_stats.reallocs;
    size_t total = 0;
    for (int i = 0; i < 1000; i++) {
        const char *name = names[i % 8];
        size_t len;
        ms_mime_type(m, name, strlen(name), &len);
        total += len;
        total += (size_t)ms_mime_compressible(name, strlen(name));
    }
    ASSERT_EQ(allocs, ms_mem_stats.allocs);
    ASSERT_EQ(reallocs, ms_mem_stats.reallocs);
    ASSERT(total > 0);
    ms_mime_free(m);
}

TEST_MAIN()
