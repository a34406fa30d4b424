/* match_test.c: receiveuntil's pattern matcher, fed bytes as its callers feed it. */
#include "../../../core/base/match.c" /* first: it asks for memmem */

#include "test.h"

/* The caller's unread bytes, as ngx.req.socket's string.buffer or a socket's buffer holds
 * them: appended at the back, consumed from the front. */
typedef struct {
    char buf[4096];
    size_t pos, len;
} unread_t;

/* Feeds `in` to `m` cut in pieces of `cut` bytes (0: all at once), calling the matcher after
 * each piece until it wants more, and writes what a reader returns into `out`: "[data]" for
 * a piece before the pattern, "<data>" for the last piece (the pattern reached), "END" for
 * the end after a sized read's last piece. */
static void run(ms_match_t *m, const char *in, size_t in_len, size_t cut, size_t size, char *out,
                size_t out_len)
{
    static unread_t u;
    u.pos = u.len = 0;
    out[0] = 0;
    size_t fed = 0;
    while (fed < in_len) {
        size_t step = cut == 0 || cut > in_len - fed ? in_len - fed : cut;
        memmove(u.buf, u.buf + u.pos, u.len - u.pos); /* the bytes move: only they count */
        u.len -= u.pos;
        u.pos = 0;
        memcpy(u.buf + u.len, in + fed, step);
        u.len += step;
        fed += step;
        for (;;) {
            size_t len = 99999, used = 99999;
            int rc = ms_match_feed(m, u.buf + u.pos, u.len - u.pos, size, &len, &used);
            if (rc == MS_MATCH_MORE)
                break;
            size_t o = strlen(out);
            if (rc == MS_MATCH_END) {
                if (len != 0 || used != 0)
                    snprintf(out + o, out_len - o, "(END with bytes)");
                else
                    snprintf(out + o, out_len - o, "END");
                continue;
            }
            if (len > used || used > u.len - u.pos) {
                snprintf(out + o, out_len - o, "(bad counts %zu %zu)", len, used);
                return;
            }
            snprintf(out + o, out_len - o, rc == MS_MATCH_PIECE ? "[%.*s]" : "<%.*s>", (int)len,
                     u.buf + u.pos);
            u.pos += used;
        }
    }
}

/* The same input cut at every size from 1 byte to all at once must give `want`. */
static int check(const char *pat, int inclusive, size_t size, const char *in, const char *want)
{
    char out[1024];
    size_t n = strlen(in);
    for (size_t cut = 0; cut <= n; cut++) {
        ms_match_t *m = ms_match_new(pat, strlen(pat), inclusive);
        run(m, in, n, cut, size, out, sizeof(out));
        ms_match_free(m);
        if (strcmp(out, want) != 0) {
            fprintf(stderr, "  pattern \"%s\" inclusive %d size %zu, cut %zu: want %s, got %s\n",
                    pat, inclusive, size, cut, want, out);
            return 0;
        }
    }
    return 1;
}

TEST(match_without_a_size_returns_the_data_before_each_pattern)
{
    ASSERT(check("\r\n--abcedhb", 0, 0, "hello, world! -agentzh\r\n--abcedhb blah",
                 "<hello, world! -agentzh>"));
    ASSERT(check("\r\n--abcedhb", 1, 0, "hello, world! -agentzh\r\n--abcedhb blah",
                 "<hello, world! -agentzh\r\n--abcedhb>"));
    ASSERT(check("--", 0, 0, "a--b----c--", "<a><b><><c>"));
    ASSERT(check("x", 0, 0, "axbxxc", "<a><b><>"));
}

TEST(match_finds_patterns_with_a_repeated_prefix)
{
    /* After "aa" the third "a" fails "b": the pattern restarts from its border "a", not from
     * nothing, or the match at 1 is missed. */
    ASSERT(check("aab", 0, 0, "aaab", "<a>"));
    ASSERT(check("aab", 0, 0, "aaaaab", "<aaa>"));
    ASSERT(check("aab", 1, 0, "aaab", "<aaab>"));
    ASSERT(check("abab", 0, 0, "abababx abab", "<><abx >"));
    ASSERT(check("aaa", 0, 0, "aaaaaaa", "<><>"));
    ASSERT(check("abcabd", 0, 0, "abcabcabd!", "<abc>"));
    ASSERT(check("aab", 0, 2, "aaaab", "[aa]<>END"));
    ASSERT(check("aab", 0, 2, "aaaaab", "[aa]<a>END"));
}

TEST(match_finds_a_pattern_fed_byte_by_byte)
{
    /* check() cuts at every size, 1 included; here each byte goes alone and the matcher is
     * asked after each one, with the pattern split at every place. */
    static const char in[] = "hello\r\n--abc\r\n--abworld\r\n--abc";
    char out[256];
    ms_match_t *m = ms_match_new("\r\n--abc", 7, 0);
    run(m, in, sizeof(in) - 1, 1, 0, out, sizeof(out));
    ASSERT_STR_EQ("<hello><\r\n--abworld>", out);
    run(m, in, sizeof(in) - 1, 1, 4, out, sizeof(out));
    ASSERT_STR_EQ("[hell]<o>END[\r\n--][abwo]<rld>END", out);
    ms_match_free(m);
}

TEST(match_waits_for_a_pattern_longer_than_the_data)
{
    ASSERT(check("0123456789abcdef", 0, 0, "0123", ""));
    /* With a size, only bytes that cannot begin the pattern go out: "0123" might. */
    ASSERT(check("0123456789abcdef", 0, 2, "xyz0123", "[xy]"));
    ASSERT(check("0123456789abcdef", 0, 1, "0123", ""));
    ASSERT(check("0123456789abcdef", 0, 1, "0120123", "[0][1][2]"));
    ASSERT(check("0123456789abcdef", 1, 3, "xx0123456789abcdef", "<xx0123456789abcdef>END"));
}

TEST(match_with_a_size_returns_lua_nginx_modules_pieces)
{
    /* OpenResty's example of the iterator with a size. */
    ASSERT(check("\r\n--abcedhb", 0, 4, "hello, world! -agentzh\r\n--abcedhb blah",
                 "[hell][o, w][orld][! -a][gent]<zh>END[ bla]"));
    /* A piece of exactly the size before the pattern: "" comes next, then the end. */
    ASSERT(check("abcabd", 0, 3, "abcabcabd!", "[abc]<>END"));
    ASSERT(check("ab", 0, 1, "xab", "[x]<>END"));
    ASSERT(check("ab", 0, 4, "abab", "<>END<>END"));
    /* Inclusive: the pattern ends the last piece whole, which may so pass the size. */
    ASSERT(check("--b", 1, 5, "x--a--b-y--b", "<x--a--b>END<-y--b>END"));
    ASSERT(check("--b", 1, 3, "abcdef--b", "[abc][def]<--b>END"));
}

TEST(match_end_is_told_once_and_without_bytes)
{
    ms_match_t *m = ms_match_new("--", 2, 0);
    size_t len, used;
    ASSERT_EQ(0, ms_match_take_end(m));
    ASSERT_EQ(MS_MATCH_LAST, ms_match_feed(m, "ab--cd", 6, 8, &len, &used));
    ASSERT_EQ(2, len);
    ASSERT_EQ(4, used);
    /* A reset (another read consumed) does not drop the end not yet told. */
    ms_match_reset(m);
    ASSERT_EQ(1, ms_match_take_end(m));
    ASSERT_EQ(0, ms_match_take_end(m));
    ASSERT_EQ(MS_MATCH_LAST, ms_match_feed(m, "--", 2, 8, &len, &used));
    ASSERT_EQ(MS_MATCH_END, ms_match_feed(m, NULL, 0, 8, &len, &used));
    ASSERT_EQ(0, len);
    ASSERT_EQ(MS_MATCH_MORE, ms_match_feed(m, "c", 1, 8, &len, &used));
    ms_match_free(m);
}

TEST(match_starts_over_when_the_bytes_changed)
{
    ms_match_t *m = ms_match_new("abc", 3, 0);
    size_t len, used;
    /* "xab" searched: "ab" pending. Another read took "xab" and "c--abc" came: without the
     * reset, the pending "ab" and the "c" would make a match that is not there. */
    ASSERT_EQ(MS_MATCH_MORE, ms_match_feed(m, "xab", 3, 0, &len, &used));
    ms_match_reset(m);
    ASSERT_EQ(MS_MATCH_LAST, ms_match_feed(m, "c--abc", 6, 0, &len, &used));
    ASSERT_EQ(3, len);
    ASSERT_EQ(6, used);
    /* Fewer bytes than were searched cannot be the same ones: it starts over by itself. */
    ASSERT_EQ(MS_MATCH_MORE, ms_match_feed(m, "zzzzzzab", 8, 0, &len, &used));
    ASSERT_EQ(MS_MATCH_LAST, ms_match_feed(m, "abc", 3, 0, &len, &used));
    ASSERT_EQ(0, len);
    ms_match_free(m);
}

TEST(match_lives_in_a_callers_allocation)
{
    _Alignas(void *) char mem[256];
    ASSERT(ms_match_size(5) <= sizeof(mem));
    ms_match_t *m = ms_match_init(mem, "hello", 5, 1);
    size_t len, used;
    ASSERT_EQ(MS_MATCH_LAST, ms_match_feed(m, "say hello!", 10, 0, &len, &used));
    ASSERT_EQ(9, len);
    ASSERT_EQ(9, used);
}

/* The naive reference, over the whole input at once: each match from the last one's end,
 * pieces of `size` while that many come before it, then the rest, then END; after the last
 * match, the pieces whose bytes cannot begin one (all but the longest suffix of the input
 * that is a proper prefix of the pattern). */
static void naive(const char *pat, size_t plen, int inclusive, size_t size, const char *in,
                  size_t n, char *out, size_t out_len)
{
    size_t pos = 0, o = 0;
    out[0] = 0;
    for (;;) {
        size_t m = pos;
        while (m + plen <= n && memcmp(in + m, pat, plen) != 0)
            m++;
        if (m + plen > n)
            break;
        while (size && m - pos >= size) {
            o += (size_t)snprintf(out + o, out_len - o, "[%.*s]", (int)size, in + pos);
            pos += size;
        }
        size_t len = m - pos + (inclusive ? plen : 0);
        o += (size_t)snprintf(out + o, out_len - o, "<%.*s>%s", (int)len, in + pos,
                              size ? "END" : "");
        pos = m + plen;
    }
    if (size == 0)
        return;
    size_t keep = plen - 1 < n - pos ? plen - 1 : n - pos;
    while (keep > 0 && memcmp(in + n - keep, pat, keep) != 0)
        keep--;
    while (n - keep - pos >= size) {
        o += (size_t)snprintf(out + o, out_len - o, "[%.*s]", (int)size, in + pos);
        pos += size;
    }
}

TEST(match_agrees_with_a_naive_search_on_every_small_input)
{
    /* Every pattern of 1 to 4 bytes and every input of up to 10 bytes over "ab" (the
     * alphabet where borders are the most tangled), fed whole and byte by byte, with and
     * without a size, inclusive or not. */
    char pat[5], in[11], want[1024], got[1024];
    long runs = 0;
    for (size_t plen = 1; plen <= 4; plen++)
        for (unsigned pb = 0; pb < 1u << plen; pb++) {
            for (size_t k = 0; k < plen; k++)
                pat[k] = pb >> k & 1 ? 'b' : 'a';
            for (size_t n = 1; n <= 10; n++)
                for (unsigned ib = 0; ib < 1u << n; ib++) {
                    for (size_t k = 0; k < n; k++)
                        in[k] = ib >> k & 1 ? 'b' : 'a';
                    for (size_t size = 0; size <= 3; size++)
                        for (int inc = 0; inc <= 1; inc++) {
                            naive(pat, plen, inc, size, in, n, want, sizeof(want));
                            for (size_t cut = 0; cut <= 1; cut++) {
                                ms_match_t *m = ms_match_new(pat, plen, inc);
                                run(m, in, n, cut, size, got, sizeof(got));
                                ms_match_free(m);
                                runs++;
                                if (strcmp(want, got) != 0)
                                    TEST_FAIL("\"%.*s\" in \"%.*s\" size %zu inclusive %d cut "
                                              "%zu: want %s, got %s",
                                              (int)plen, pat, (int)n, in, size, inc, cut, want,
                                              got);
                            }
                        }
                }
        }
    ASSERT(runs > 100000);
}

int main(int argc, char **argv)
{
    return test_main(argc, argv);
}
