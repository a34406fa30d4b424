/* cond_test.c: ETags, HTTP-dates, the order of preconditions, Range and If-Range. */
/* Some cases truncate output on purpose, which gcc sees through the included file. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#include "test.h"

#include "../../../../core/http/static/cond.c"

/* Sun, 06 Nov 1994 08:49:37 GMT, the RFC's own example, and the seconds either side. */
#define T_EX      INT64_C(784111777)
#define D_EX      "Sun, 06 Nov 1994 08:49:37 GMT"
#define D_EX_850  "Sunday, 06-Nov-94 08:49:37 GMT"
#define D_EX_ASC  "Sun Nov  6 08:49:37 1994"
#define D_BEFORE  "Sun, 06 Nov 1994 08:49:36 GMT"
#define D_AFTER   "Sun, 06 Nov 1994 08:49:38 GMT"
#define ETAG      "\"abc\""
#define ETAG_WEAK "W/\"abc\""

#define S(lit) lit, sizeof(lit) - 1

static ms_str_t str(const char *s)
{
    ms_str_t v = {s, s ? strlen(s) : 0};
    return v;
}

/* -- Validators ----------------------------------------------------------------------------- */

TEST(cond_makes_strong_etags_from_size_and_nanoseconds)
{
    char buf[MS_ETAG_SIZE];
    ASSERT_EQ(15, ms_etag_make(buf, sizeof(buf), 0x1234, 1, 5));
    ASSERT_STR_EQ("\"1234-3b9aca05\"", buf);
    ASSERT_EQ(5, ms_etag_make(buf, sizeof(buf), 0, 0, 0));
    ASSERT_STR_EQ("\"0-0\"", buf);
    /* A rewrite within the same second changes it. */
    char other[MS_ETAG_SIZE];
    ms_etag_make(buf, sizeof(buf), 100, 1700000000, 1);
    ms_etag_make(other, sizeof(other), 100, 1700000000, 2);
    ASSERT(strcmp(buf, other) != 0);
    /* The longest fits MS_ETAG_SIZE; a buffer too small gets nothing. */
    ASSERT_EQ(MS_ETAG_SIZE - 1, ms_etag_make(buf, sizeof(buf), UINT64_MAX, -1, 0));
    ASSERT_EQ(0, ms_etag_make(buf, 5, 0, 0, 0));
    ASSERT_EQ(5, ms_etag_make(buf, 6, 0, 0, 0));
}

TEST(cond_formats_content_ranges)
{
    static const struct {
        uint64_t first, last, size;
        const char *want;
    } cases[] = {
        {0, 99, 1000, "bytes 0-99/1000"},
        {999, 999, 1000, "bytes 999-999/1000"},
        {1, 0, 1000, "bytes */1000"},
        {1, 0, 0, "bytes */0"},
        {UINT64_MAX - 1, UINT64_MAX - 1, UINT64_MAX,
         "bytes 18446744073709551614-18446744073709551614/18446744073709551615"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char buf[MS_CONTENT_RANGE_SIZE];
        size_t n = ms_content_range(buf, sizeof(buf), cases[i].first, cases[i].last, cases[i].size);
        ASSERT_STR_EQ(cases[i].want, buf);
        ASSERT_EQ(strlen(cases[i].want), n);
    }
    char small[8];
    ASSERT_EQ(0, ms_content_range(small, sizeof(small), 0, 99, 1000));
}

/* -- HTTP-dates ----------------------------------------------------------------------------- */

TEST(cond_formats_imf_fixdates)
{
    static const struct {
        int64_t t;
        const char *want;
    } cases[] = {
        {0, "Thu, 01 Jan 1970 00:00:00 GMT"},
        {T_EX, D_EX},
        {951825600, "Tue, 29 Feb 2000 12:00:00 GMT"},
        {1709164800, "Thu, 29 Feb 2024 00:00:00 GMT"},
        {INT64_C(2147483648), "Tue, 19 Jan 2038 03:14:08 GMT"},
        {INT64_C(253402300799), "Fri, 31 Dec 9999 23:59:59 GMT"},
    };
    char buf[MS_HTTP_DATE_SIZE];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ASSERT_EQ(29, ms_http_date_format(buf, sizeof(buf), cases[i].t));
        ASSERT_STR_EQ(cases[i].want, buf);
    }
    ASSERT_EQ(UV_EINVAL, ms_http_date_format(buf, sizeof(buf), -1));
    ASSERT_EQ(UV_EINVAL, ms_http_date_format(buf, sizeof(buf), INT64_C(253402300800)));
    ASSERT_EQ(MS_ETOOBIG, ms_http_date_format(buf, 29, 0));
}

TEST(cond_formats_and_parses_like_gmtime_across_the_years)
{
    /* A stride prime to days and seconds visits every weekday, month and leap rule. */
    char buf[MS_HTTP_DATE_SIZE], want[MS_HTTP_DATE_SIZE];
    for (int64_t t = 0; t <= INT64_C(253402300799); t += INT64_C(86400) * 997 + 7919) {
        time_t tt = (time_t)t;
        struct tm tm;
        gmtime_r(&tt, &tm);
        strftime(want, sizeof(want), "%a, %d %b %Y %H:%M:%S GMT", &tm);
        ASSERT_EQ(29, ms_http_date_format(buf, sizeof(buf), t));
        ASSERT_STR_EQ(want, buf);
        int64_t back = -1;
        ASSERT_EQ(0, ms_http_date_parse(buf, 29, &back));
        ASSERT_EQ(t, back);
    }
}

TEST(cond_parses_the_three_date_formats)
{
    static const struct {
        const char *s;
        int64_t want;
    } cases[] = {
        {D_EX, T_EX},
        {D_EX_850, T_EX},
        {D_EX_ASC, T_EX},
        {"Sun Nov 06 08:49:37 1994", T_EX},
        {" \t" D_EX "\t ", T_EX},
        {"Thu, 01 Jan 1970 00:00:00 GMT", 0},
        {"Fri, 31 Dec 9999 23:59:59 GMT", INT64_C(253402300799)},
        {"Tue, 29 Feb 2000 12:00:00 GMT", 951825600},
        {"Thu, 29 Feb 2024 00:00:00 GMT", 1709164800},
        {"Thu Feb 29 00:00:00 2024", 1709164800},
        {"Wed Jun  9 10:18:14 2021", 1623233894},
        {"Wed Jun 09 10:18:14 2021", 1623233894},
        {"Wednesday, 09-Jun-21 10:18:14 GMT", 1623233894},
        /* A leap second is the next minute's first. */
        {"Sat, 31 Dec 2016 23:59:60 GMT", 1483228800},
        /* The day name is spelled right but not checked against the date. */
        {"Mon, 06 Nov 1994 08:49:37 GMT", T_EX},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int64_t t = -1;
        int rc = ms_http_date_parse(cases[i].s, strlen(cases[i].s), &t);
        if (rc != 0 || t != cases[i].want)
            TEST_FAIL("\"%s\": want %lld, got rc %d, t %lld", cases[i].s, (long long)cases[i].want,
                      rc, (long long)t);
    }
}

TEST(cond_refuses_what_is_not_an_http_date)
{
    static const char *const cases[] = {
        "",
        "   ",
        "Sux, 06 Nov 1994 08:49:37 GMT",    /* no such day */
        "sun, 06 Nov 1994 08:49:37 GMT",    /* names are case-sensitive */
        "Sun, 06 nov 1994 08:49:37 GMT",    /* months too */
        "Sun, 06 Nov 1994 08:49:37 gmt",    /* and GMT */
        "Sun, 06 Nov 1994 08:49:37 UTC",    /* only GMT */
        "Sun, 06 Nox 1994 08:49:37 GMT",    /* no such month */
        "Sunday, 06 Nov 1994 08:49:37 GMT", /* a long name in an IMF-fixdate */
        "Sun, 06-Nov-94 08:49:37 GMT",      /* a short name in an RFC 850 date */
        "Sundae, 06-Nov-94 08:49:37 GMT",   /* a long name misspelled */
        "Sun Nov  6 08:49:37 1994 GMT",     /* asctime has no zone */
        "Sun, 30 Feb 2024 08:49:37 GMT",    /* no Feb 30, even in a leap year */
        "Wed, 29 Feb 2023 08:49:37 GMT",    /* no Feb 29 outside one */
        "Mon, 29 Feb 1900 08:49:37 GMT",    /* nor in a century that is not one */
        "Thu, 31 Apr 2024 08:49:37 GMT",
        "Sun, 00 Nov 1994 08:49:37 GMT",
        "Sun, 32 Dec 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 24:00:00 GMT", /* hour 24 */
        "Sun, 06 Nov 1994 08:60:00 GMT",
        "Sun, 06 Nov 1994 08:49:61 GMT",
        "Sun, 06 Nov 1994 08-49-37 GMT",
        "Sun, 06 Nov 1994 8:49:37 GMT",
        "Sun, 6 Nov 1994 08:49:37 GMT",
        "Sun, +6 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 94 08:49:37 GMT",
        "Sun,  06 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 08:49:37 GMTX", /* trailing garbage */
        "Sun, 06 Nov 1994 08:49:37 GMT, x",
        D_EX_ASC "x",
        D_EX_850 " x",
        "Sun Nov 6 08:49:37 1994",
        "Sun Nov  6 08:49:37 94",
        "Sunday, 06-Nov-1994 08:49:37 GMT",
        "Wed, 31 Dec 1969 23:59:59 GMT", /* before 1970 */
        "Sat, 01 Jan 10000 00:00:00 GMT",
        "Fri, 31 Dec 9999 23:59:60 GMT", /* a leap second into year 10000 */
        "1994-11-06T08:49:37Z",
        "784111777",
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int64_t t = -1;
        int rc = ms_http_date_parse(cases[i], strlen(cases[i]), &t);
        if (rc != MS_EBADREQ)
            TEST_FAIL("\"%s\": want MS_EBADREQ, got rc %d, t %lld", cases[i], rc, (long long)t);
    }
    /* The length counts, not a NUL. */
    int64_t t;
    ASSERT_EQ(MS_EBADREQ, ms_http_date_parse(D_EX, 28, &t));
}

TEST(cond_reads_two_digit_years_within_fifty_years_of_now)
{
    static const struct {
        int now;
        const char *s;
        int want_year; /* 0: refused */
    } cases[] = {
        {2025, "Sunday, 06-Nov-94 08:49:37 GMT", 1994},
        {2025, "Monday, 06-Nov-75 08:49:37 GMT", 2075}, /* 50 years ahead: still ahead */
        {2025, "Saturday, 06-Nov-76 08:49:37 GMT", 1976},
        {2025, "Friday, 06-Nov-00 08:49:37 GMT", 2000},
        {2025, "Saturday, 06-Nov-99 08:49:37 GMT", 1999},
        {2070, "Friday, 06-Nov-20 08:49:37 GMT", 2020}, /* the past stays in this century */
        {2070, "Friday, 06-Nov-21 08:49:37 GMT", 2021},
        {2099, "Friday, 06-Nov-49 08:49:37 GMT", 2049},
        {2000, "Friday, 06-Nov-50 08:49:37 GMT", 2050},
        {2000, "Thursday, 06-Nov-70 08:49:37 GMT", 1970},
        {2000, "Friday, 06-Nov-60 08:49:37 GMT", 0}, /* 1960: before the epoch */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int64_t t = -1;
        int rc = parse_date(cases[i].s, strlen(cases[i].s), &t, cases[i].now);
        if (cases[i].want_year == 0) {
            ASSERT_EQ(MS_EBADREQ, rc);
            continue;
        }
        ASSERT_EQ(0, rc);
        int y, m, d;
        civil_from_days(t / 86400, &y, &m, &d);
        ASSERT_EQ(cases[i].want_year, y);
        ASSERT_EQ(11, m);
        ASSERT_EQ(6, d);
    }
}

/* -- Preconditions -------------------------------------------------------------------------- */

TEST(cond_evaluates_preconditions_in_rfc_order)
{
    static const struct {
        const char *why, *method, *im, *inm, *ims, *ius, *etag;
        int64_t mtime;
        int want;
    } cases[] = {
        {"no conditions", "GET", NULL, NULL, NULL, NULL, ETAG, T_EX, MS_COND_OK},
        /* If-None-Match: the weak comparison. */
        {"inm same", "GET", NULL, ETAG, NULL, NULL, ETAG, T_EX, MS_COND_NOT_MODIFIED},
        {"inm weak", "GET", NULL, ETAG_WEAK, NULL, NULL, ETAG, T_EX, MS_COND_NOT_MODIFIED},
        {"inm weak current", "GET", NULL, ETAG, NULL, NULL, ETAG_WEAK, T_EX, MS_COND_NOT_MODIFIED},
        {"inm other", "GET", NULL, "\"xyz\"", NULL, NULL, ETAG, T_EX, MS_COND_OK},
        {"inm prefix", "GET", NULL, "\"ab\"", NULL, NULL, ETAG, T_EX, MS_COND_OK},
        {"inm list", "GET", NULL, "\"xyz\", \"abc\"", NULL, NULL, ETAG, T_EX, MS_COND_NOT_MODIFIED},
        {"inm list spaces", "GET", NULL, " \"xyz\" ,\tW/\"abc\" , ", NULL, NULL, ETAG, T_EX,
         MS_COND_NOT_MODIFIED},
        {"inm empty members", "GET", NULL, ", ,\"abc\"", NULL, NULL, ETAG, T_EX,
         MS_COND_NOT_MODIFIED},
        {"inm list misses", "GET", NULL, "\"x\", W/\"y\"", NULL, NULL, ETAG, T_EX, MS_COND_OK},
        {"inm star", "GET", NULL, "*", NULL, NULL, ETAG, T_EX, MS_COND_NOT_MODIFIED},
        {"inm head", "HEAD", NULL, ETAG, NULL, NULL, ETAG, T_EX, MS_COND_NOT_MODIFIED},
        {"inm unquoted", "GET", NULL, "abc", NULL, NULL, ETAG, T_EX, MS_COND_OK},
        {"inm unterminated", "GET", NULL, "\"abc", NULL, NULL, ETAG, T_EX, MS_COND_OK},
        {"inm stops at garbage", "GET", NULL, "abc, \"abc\"", NULL, NULL, ETAG, T_EX, MS_COND_OK},
        {"inm without commas", "GET", NULL, "\"abc\" \"x\"", NULL, NULL, ETAG, T_EX, MS_COND_OK},
        {"inm no current etag", "GET", NULL, ETAG, NULL, NULL, "", T_EX, MS_COND_OK},
        /* Methods other than GET and HEAD get 412, not 304; methods are case-sensitive. */
        {"inm post", "POST", NULL, ETAG, NULL, NULL, ETAG, T_EX, MS_COND_PRECONDITION_FAILED},
        {"inm put star", "PUT", NULL, "*", NULL, NULL, ETAG, T_EX, MS_COND_PRECONDITION_FAILED},
        {"inm delete", "DELETE", NULL, ETAG, NULL, NULL, ETAG, T_EX, MS_COND_PRECONDITION_FAILED},
        {"inm lowercase get", "get", NULL, ETAG, NULL, NULL, ETAG, T_EX,
         MS_COND_PRECONDITION_FAILED},
        {"inm post misses", "POST", NULL, "\"xyz\"", NULL, NULL, ETAG, T_EX, MS_COND_OK},
        /* If-Match: the strong comparison. */
        {"im same", "PUT", ETAG, NULL, NULL, NULL, ETAG, T_EX, MS_COND_OK},
        {"im weak", "PUT", ETAG_WEAK, NULL, NULL, NULL, ETAG, T_EX, MS_COND_PRECONDITION_FAILED},
        {"im weak current", "PUT", ETAG, NULL, NULL, NULL, ETAG_WEAK, T_EX,
         MS_COND_PRECONDITION_FAILED},
        {"im both weak", "PUT", ETAG_WEAK, NULL, NULL, NULL, ETAG_WEAK, T_EX,
         MS_COND_PRECONDITION_FAILED},
        {"im list", "PUT", "\"xyz\" , \"abc\"", NULL, NULL, NULL, ETAG, T_EX, MS_COND_OK},
        {"im other", "GET", "\"xyz\"", NULL, NULL, NULL, ETAG, T_EX, MS_COND_PRECONDITION_FAILED},
        {"im star", "PUT", "*", NULL, NULL, NULL, ETAG, T_EX, MS_COND_OK},
        {"im star no etag", "PUT", "*", NULL, NULL, NULL, "", -1, MS_COND_OK},
        {"im no current etag", "PUT", ETAG, NULL, NULL, NULL, "", T_EX,
         MS_COND_PRECONDITION_FAILED},
        {"im garbage", "PUT", "abc", NULL, NULL, NULL, ETAG, T_EX, MS_COND_PRECONDITION_FAILED},
        {"im stops at garbage", "PUT", "x, \"abc\"", NULL, NULL, NULL, ETAG, T_EX,
         MS_COND_PRECONDITION_FAILED},
        /* If-Unmodified-Since. */
        {"ius same", "PUT", NULL, NULL, NULL, D_EX, ETAG, T_EX, MS_COND_OK},
        {"ius later", "PUT", NULL, NULL, NULL, D_AFTER, ETAG, T_EX, MS_COND_OK},
        {"ius earlier", "PUT", NULL, NULL, NULL, D_BEFORE, ETAG, T_EX, MS_COND_PRECONDITION_FAILED},
        {"ius earlier get", "GET", NULL, NULL, NULL, D_BEFORE, ETAG, T_EX,
         MS_COND_PRECONDITION_FAILED},
        {"ius bad date", "PUT", NULL, NULL, NULL, "yesterday", ETAG, T_EX, MS_COND_OK},
        {"ius no mtime", "PUT", NULL, NULL, NULL, D_BEFORE, ETAG, -1, MS_COND_OK},
        /* If-Match comes first, and If-Unmodified-Since counts only without it. */
        {"im passes, ius ignored", "PUT", ETAG, NULL, NULL, D_BEFORE, ETAG, T_EX, MS_COND_OK},
        {"im fails, ius passes", "PUT", "\"x\"", NULL, NULL, D_AFTER, ETAG, T_EX,
         MS_COND_PRECONDITION_FAILED},
        /* If-Modified-Since, for GET and HEAD only. */
        {"ims same", "GET", NULL, NULL, D_EX, NULL, ETAG, T_EX, MS_COND_NOT_MODIFIED},
        {"ims later", "GET", NULL, NULL, D_AFTER, NULL, ETAG, T_EX, MS_COND_NOT_MODIFIED},
        {"ims earlier", "GET", NULL, NULL, D_BEFORE, NULL, ETAG, T_EX, MS_COND_OK},
        {"ims rfc 850", "GET", NULL, NULL, D_EX_850, NULL, ETAG, T_EX, MS_COND_NOT_MODIFIED},
        {"ims asctime", "HEAD", NULL, NULL, D_EX_ASC, NULL, ETAG, T_EX, MS_COND_NOT_MODIFIED},
        {"ims bad date", "GET", NULL, NULL, "Sun, 06 Nov 1994 24:49:37 GMT", NULL, ETAG, T_EX,
         MS_COND_OK},
        {"ims garbage", "GET", NULL, NULL, D_EX "; length=3", NULL, ETAG, T_EX, MS_COND_OK},
        {"ims post", "POST", NULL, NULL, D_EX, NULL, ETAG, T_EX, MS_COND_OK},
        {"ims no mtime", "GET", NULL, NULL, D_EX, NULL, ETAG, -1, MS_COND_OK},
        /* If-None-Match comes first, and If-Modified-Since counts only without it. */
        {"inm misses, ims ignored", "GET", NULL, "\"xyz\"", D_AFTER, NULL, ETAG, T_EX, MS_COND_OK},
        {"inm matches, ims earlier", "GET", NULL, ETAG, D_BEFORE, NULL, ETAG, T_EX,
         MS_COND_NOT_MODIFIED},
        {"inm empty is absent", "GET", NULL, " ", D_EX, NULL, ETAG, T_EX, MS_COND_NOT_MODIFIED},
        {"im empty is absent", "PUT", "", NULL, NULL, D_BEFORE, ETAG, T_EX,
         MS_COND_PRECONDITION_FAILED},
        /* 412 from the first two steps wins over a 304 from the last two. */
        {"im fails, inm matches", "GET", "\"x\"", ETAG, NULL, NULL, ETAG, T_EX,
         MS_COND_PRECONDITION_FAILED},
        {"ius fails, inm matches", "GET", NULL, ETAG, NULL, D_BEFORE, ETAG, T_EX,
         MS_COND_PRECONDITION_FAILED},
        {"ius fails, ims same", "GET", NULL, NULL, D_EX, D_BEFORE, ETAG, T_EX,
         MS_COND_PRECONDITION_FAILED},
        {"im passes, inm matches", "GET", ETAG, ETAG, NULL, NULL, ETAG, T_EX, MS_COND_NOT_MODIFIED},
        {"im passes, inm matches, put", "PUT", ETAG, "*", NULL, NULL, ETAG, T_EX,
         MS_COND_PRECONDITION_FAILED},
        {"all four pass", "GET", ETAG, "\"x\"", D_BEFORE, D_EX, ETAG, T_EX, MS_COND_OK},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ms_cond_in_t in = {
            .method = str(cases[i].method),
            .if_match = str(cases[i].im),
            .if_none_match = str(cases[i].inm),
            .if_modified_since = str(cases[i].ims),
            .if_unmodified_since = str(cases[i].ius),
            .etag = str(cases[i].etag),
            .mtime = cases[i].mtime,
        };
        int got = ms_cond_evaluate(&in);
        if (got != cases[i].want)
            TEST_FAIL("%s: want %d, got %d", cases[i].why, cases[i].want, got);
    }
}

/* -- Ranges --------------------------------------------------------------------------------- */

/* Cases give the ranges found as text, "first-last" joined by commas, empty unless OK. */
static const struct {
    const char *s;
    uint64_t size;
    int want;
    const char *ranges;
} range_cases[] = {
    {"bytes=0-99", 1000, MS_RANGE_OK, "0-99"},
    {"bytes=500-", 1000, MS_RANGE_OK, "500-999"},
    {"bytes=-500", 1000, MS_RANGE_OK, "500-999"},
    {"bytes=-5000", 1000, MS_RANGE_OK, "0-999"}, /* a suffix longer than the file */
    {"bytes=-1000", 1000, MS_RANGE_OK, "0-999"},
    {"bytes=0-1000", 1000, MS_RANGE_OK, "0-999"}, /* the last position cut */
    {"bytes=0-99999999999999999999999", 1000, MS_RANGE_OK, "0-999"},
    {"BYTES=0-1", 1000, MS_RANGE_OK, "0-1"},
    {" bytes=0-1\t", 1000, MS_RANGE_OK, "0-1"},
    /* The edges. */
    {"bytes=0-0", 1000, MS_RANGE_OK, "0-0"},
    {"bytes=999-999", 1000, MS_RANGE_OK, "999-999"},
    {"bytes=999-", 1000, MS_RANGE_OK, "999-999"},
    {"bytes=-1", 1000, MS_RANGE_OK, "999-999"},
    {"bytes=0-", 1000, MS_RANGE_OK, "0-999"},
    {"bytes=0-0", 1, MS_RANGE_OK, "0-0"},
    {"bytes=-1", 1, MS_RANGE_OK, "0-0"},
    {"bytes=18446744073709551613-", UINT64_MAX, MS_RANGE_OK,
     "18446744073709551613-18446744073709551614"},
    {"bytes=0-0,-1", UINT64_MAX, MS_RANGE_OK, "0-0,18446744073709551614-18446744073709551614"},
    /* Several: sorted, overlaps and neighbours joined. */
    {"bytes=0-99,200-299", 1000, MS_RANGE_OK, "0-99,200-299"},
    {"bytes=200-299,0-99", 1000, MS_RANGE_OK, "0-99,200-299"},
    {"bytes=0-99,50-149", 1000, MS_RANGE_OK, "0-149"},
    {"bytes=50-149,0-99", 1000, MS_RANGE_OK, "0-149"},
    {"bytes=0-99,100-199", 1000, MS_RANGE_OK, "0-199"},
    {"bytes=0-99, 300-399 ,\t101-200", 1000, MS_RANGE_OK, "0-99,101-200,300-399"},
    {"bytes=300-399,0-99,50-350", 1000, MS_RANGE_OK, "0-399"},
    {"bytes=0-9,-10,500-509", 1000, MS_RANGE_OK, "0-9,500-509,990-999"},
    {"bytes=0-1,,4-5,", 1000, MS_RANGE_OK, "0-1,4-5"},
    {"bytes=0-499,0-499", 1000, MS_RANGE_OK, "0-499"},
    /* Unsatisfiable members are dropped while another is satisfied. */
    {"bytes=0-0,2000-", 1000, MS_RANGE_OK, "0-0"},
    {"bytes=-0,5-5", 1000, MS_RANGE_OK, "5-5"},
    /* Sixteen ranges are served, seventeen are not, unless they join into fewer. */
    {"bytes=0-0,2-2,4-4,6-6,8-8,10-10,12-12,14-14,16-16,18-18,20-20,22-22,24-24,26-26,28-28,"
     "30-30",
     1000, MS_RANGE_OK,
     "0-0,2-2,4-4,6-6,8-8,10-10,12-12,14-14,16-16,18-18,20-20,22-22,24-24,26-26,28-28,30-30"},
    {"bytes=0-0,2-2,4-4,6-6,8-8,10-10,12-12,14-14,16-16,18-18,20-20,22-22,24-24,26-26,28-28,"
     "30-30,32-32",
     1000, MS_RANGE_IGNORE, ""},
    {"bytes=32-32,30-30,28-28,26-26,24-24,22-22,20-20,18-18,16-16,14-14,12-12,10-10,8-8,6-6,"
     "4-4,2-2,0-0",
     1000, MS_RANGE_IGNORE, ""},
    {"bytes=0-0,1-1,2-2,3-3,4-4,5-5,6-6,7-7,8-8,9-9,10-10,11-11,12-12,13-13,14-14,15-15,16-16",
     1000, MS_RANGE_OK, "0-16"},
    /* More bytes asked for than the file has: an amplification. */
    {"bytes=0-,0-", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=0-499,0-499,0-1", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=-600,0-500", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=0-0,0-0", 1, MS_RANGE_IGNORE, ""},
    /* Unsatisfiable: nothing overlaps. */
    {"bytes=1000-", 1000, MS_RANGE_UNSATISFIABLE, ""},
    {"bytes=1000-2000", 1000, MS_RANGE_UNSATISFIABLE, ""},
    {"bytes=99999999999999999999999-", 1000, MS_RANGE_UNSATISFIABLE, ""},
    {"bytes=-0", 1000, MS_RANGE_UNSATISFIABLE, ""},
    {"bytes=1000-,2000-3000,-0", 1000, MS_RANGE_UNSATISFIABLE, ""},
    {"bytes=1-", 1, MS_RANGE_UNSATISFIABLE, ""},
    /* An empty file: no position is in it, and a suffix of it is all of it (nothing). */
    {"bytes=0-", 0, MS_RANGE_UNSATISFIABLE, ""},
    {"bytes=0-0", 0, MS_RANGE_UNSATISFIABLE, ""},
    {"bytes=-0", 0, MS_RANGE_UNSATISFIABLE, ""},
    {"bytes=-5", 0, MS_RANGE_IGNORE, ""},
    {"bytes=0-,-5", 0, MS_RANGE_IGNORE, ""},
    /* Not a bytes range, or not valid: the field is ignored. */
    {"", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=", 1000, MS_RANGE_IGNORE, ""},
    {"bytes= ,, ", 1000, MS_RANGE_IGNORE, ""},
    {"items=0-1", 1000, MS_RANGE_IGNORE, ""},
    {"bytes 0-1", 1000, MS_RANGE_IGNORE, ""},
    {"bytes =0-1", 1000, MS_RANGE_IGNORE, ""},
    {"byte=0-1", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=5-1", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=0-1,5-1", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=5-1", 0, MS_RANGE_IGNORE, ""},
    {"bytes=-", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=--1", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=1", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=1-2-3", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=0-1 2-3", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=0 -1", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=0- 1", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=+1-2", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=0x10-20", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=a-b", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=0-1;q=1", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=0-1,x", 1000, MS_RANGE_IGNORE, ""},
    {"bytes=2000-,x", 1000, MS_RANGE_IGNORE, ""}, /* invalid wins over unsatisfiable */
};

TEST(cond_parses_ranges)
{
    for (size_t i = 0; i < sizeof(range_cases) / sizeof(range_cases[0]); i++) {
        ms_range_t out[MS_RANGES_MAX];
        int n = -1;
        int rc = ms_range_parse(range_cases[i].s, strlen(range_cases[i].s), range_cases[i].size,
                                out, MS_RANGES_MAX, &n);
        char got[1024];
        size_t len = 0;
        got[0] = 0;
        for (int j = 0; j < n && len < sizeof(got); j++)
            len +=
                (size_t)snprintf(got + len, sizeof(got) - len, "%s%llu-%llu", j ? "," : "",
                                 (unsigned long long)out[j].first, (unsigned long long)out[j].last);
        if (rc != range_cases[i].want || strcmp(got, range_cases[i].ranges) != 0)
            TEST_FAIL("\"%s\" of %llu bytes: want %d \"%s\", got %d \"%s\"", range_cases[i].s,
                      (unsigned long long)range_cases[i].size, range_cases[i].want,
                      range_cases[i].ranges, rc, got);
    }
}

TEST(cond_ranges_stay_within_max)
{
    ms_range_t out[2];
    int n;
    ASSERT_EQ(MS_RANGE_OK, ms_range_parse(S("bytes=0-0,4-4"), 1000, out, 2, &n));
    ASSERT_EQ(2, n);
    ASSERT_EQ(MS_RANGE_IGNORE, ms_range_parse(S("bytes=0-0,2-2,4-4"), 1000, out, 2, &n));
    /* Counted as they come: a third range that a fourth would have bridged is already one
     * too many, and ignoring the field is always allowed. */
    ASSERT_EQ(MS_RANGE_IGNORE, ms_range_parse(S("bytes=0-0,2-2,4-4,1-3"), 1000, out, 2, &n));
    ASSERT_EQ(MS_RANGE_OK, ms_range_parse(S("bytes=0-0,2-2,1-1,4-4"), 1000, out, 2, &n));
    ASSERT_EQ(2, n);
    ASSERT_EQ(MS_RANGE_IGNORE, ms_range_parse(S("bytes=0-0"), 1000, NULL, 0, &n));
}

TEST(cond_reads_thousands_of_ranges_in_fixed_space)
{
    /* A long field of tiny neighbouring ranges over a big file: every one is read, and they
     * join as they come, so `out` never holds more than one. */
    static char field[64 * 1024];
    size_t len = (size_t)snprintf(field, sizeof(field), "bytes=");
    uint64_t pos = 0;
    while (len + 32 < sizeof(field)) {
        len += (size_t)snprintf(field + len, sizeof(field) - len, "%llu-%llu,",
                                (unsigned long long)pos, (unsigned long long)pos);
        pos++;
    }
    ms_range_t out[MS_RANGES_MAX];
    int n;
    ASSERT_EQ(MS_RANGE_OK, ms_range_parse(field, len, 1u << 30, out, MS_RANGES_MAX, &n));
    ASSERT_EQ(1, n);
    ASSERT_EQ(0, out[0].first);
    ASSERT_EQ(pos - 1, out[0].last);
}

TEST(cond_applies_if_range_on_a_strong_etag_or_the_exact_date)
{
    static const struct {
        const char *s, *etag;
        int64_t mtime;
        int want;
    } cases[] = {
        {ETAG, ETAG, T_EX, 1},
        {" " ETAG "\t", ETAG, T_EX, 1},
        {ETAG_WEAK, ETAG, T_EX, 0}, /* never weak */
        {ETAG, ETAG_WEAK, T_EX, 0},
        {ETAG_WEAK, ETAG_WEAK, T_EX, 0},
        {"\"abd\"", ETAG, T_EX, 0},
        {"\"ab\"", ETAG, T_EX, 0},
        {ETAG ", \"x\"", ETAG, T_EX, 0}, /* one tag, not a list */
        {"*", ETAG, T_EX, 0},
        {"abc", ETAG, T_EX, 0},
        {"\"abc", ETAG, T_EX, 0},
        {ETAG, "", T_EX, 0},
        {"", ETAG, T_EX, 0},
        {D_EX, ETAG, T_EX, 1},
        {D_EX_850, ETAG, T_EX, 1},
        {D_EX_ASC, ETAG, T_EX, 1},
        {D_BEFORE, ETAG, T_EX, 0}, /* exact, not "not modified since" */
        {D_AFTER, ETAG, T_EX, 0},
        {D_EX, ETAG, -1, 0},
        {"Wed, 09 Jun 2021 10:18:14 GMT", ETAG, 1623233894, 1}, /* a date that starts with W */
        {"Wed, 09 Jun 2021 10:18:14 GMTx", ETAG, 1623233894, 0},
        {"Wed, 30 Feb 2021 10:18:14 GMT", ETAG, 1623233894, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int got = ms_if_range_ok(cases[i].s, strlen(cases[i].s), cases[i].etag,
                                 strlen(cases[i].etag), cases[i].mtime);
        if (got != cases[i].want)
            TEST_FAIL("If-Range \"%s\" against %s, %lld: want %d, got %d", cases[i].s,
                      cases[i].etag, (long long)cases[i].mtime, cases[i].want, got);
    }
}

TEST_MAIN()
