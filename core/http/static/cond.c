/* cond.c: validators, HTTP-dates, preconditions and byte ranges, with no I/O and no allocation. */
#include "http/static/cond.h"

#include <inttypes.h>
#include <stdio.h>
#include <time.h>

#include "http/http.h"

/* 9999-12-31T23:59:59Z: HTTP-dates have four-digit years. */
#define MAX_DATE INT64_C(253402300799)

static const char day_names[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
static const char *const day_names_long[7] = {"Sunday",   "Monday", "Tuesday", "Wednesday",
                                              "Thursday", "Friday", "Saturday"};
static const char month_names[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                        "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

static inline int is_ows(char c)
{
    return c == ' ' || c == '\t';
}

static void trim(const char **p, const char **end)
{
    while (*p < *end && is_ows(**p))
        (*p)++;
    while (*end > *p && is_ows((*end)[-1]))
        (*end)--;
}

/* -- Validators ----------------------------------------------------------------------------- */

size_t ms_etag_make(char *out, size_t cap, uint64_t size, int64_t mtime_sec, int64_t mtime_nsec)
{
    /* Nanoseconds, not seconds: a file rewritten within a second at the same size must not keep
     * its ETag, since a strong ETag promises identical bytes (ranges of two versions would
     * otherwise be spliced). Unsigned arithmetic wraps, which only ever makes another token. */
    uint64_t ns = (uint64_t)mtime_sec * UINT64_C(1000000000) + (uint64_t)mtime_nsec;
    int n = snprintf(out, cap, "\"%" PRIx64 "-%" PRIx64 "\"", size, ns);
    if (n < 0 || (size_t)n >= cap)
        return 0;
    return (size_t)n;
}

size_t ms_content_range(char *out, size_t cap, uint64_t first, uint64_t last, uint64_t size)
{
    int n = first > last
                ? snprintf(out, cap, "bytes */%" PRIu64, size)
                : snprintf(out, cap, "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, first, last, size);
    if (n < 0 || (size_t)n >= cap)
        return 0;
    return (size_t)n;
}

/* -- HTTP-dates ----------------------------------------------------------------------------- */

/* Days since 1970-01-01 of a date in the proleptic Gregorian calendar, year >= 0 (H. Hinnant's
 * days_from_civil). No timegm: it depends on TZ handling and time_t's width. */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = y / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* The inverse, for days >= 0. */
static void civil_from_days(int64_t z, int *y, int *m, int *d)
{
    z += 719468;
    int64_t era = z / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = (int)(yoe + era * 400 + (*m <= 2));
}

static int days_in_month(int y, int m)
{
    static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m == 2 && y % 4 == 0 && (y % 100 != 0 || y % 400 == 0))
        return 29;
    return days[m - 1];
}

int ms_http_date_format(char *out, size_t cap, int64_t t)
{
    if (cap < MS_HTTP_DATE_SIZE)
        return MS_ETOOBIG;
    if (t < 0 || t > MAX_DATE)
        return UV_EINVAL;
    int64_t days = t / 86400, secs = t % 86400;
    int y, m, d;
    civil_from_days(days, &y, &m, &d);
    /* 1970-01-01 was a Thursday. */
    snprintf(out, cap, "%s, %02d %s %04d %02d:%02d:%02d GMT", day_names[(days + 4) % 7], d,
             month_names[m - 1], y, (int)(secs / 3600), (int)(secs / 60 % 60), (int)(secs % 60));
    return MS_HTTP_DATE_SIZE - 1;
}

/* `n` digits at p, or -1. */
static int digits(const char *p, int n)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        v = v * 10 + (p[i] - '0');
    }
    return v;
}

/* The index of the three-letter name at p in `names`, or -1. */
static int short_name(const char *p, const char (*names)[4], int count)
{
    for (int i = 0; i < count; i++)
        if (memcmp(p, names[i], 3) == 0)
            return i;
    return -1;
}

/* "HH:MM:SS" at p into seconds of the day, or -1. */
static int time_of_day(const char *p)
{
    int h = digits(p, 2), m = digits(p + 3, 2), s = digits(p + 6, 2);
    if (p[2] != ':' || p[5] != ':' || h < 0 || h > 23 || m < 0 || m > 59 || s < 0 || s > 60)
        return -1;
    return h * 3600 + m * 60 + s;
}

/* The year the clock says, for the two-digit years of RFC 850 dates. */
static int current_year(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int y, m, d;
    civil_from_days(ts.tv_sec > 0 ? (int64_t)ts.tv_sec / 86400 : 0, &y, &m, &d);
    return y;
}

static int make_time(int y, int mon, int d, int tod, int64_t *t)
{
    if (y < 1970 || y > 9999 || mon < 1 || d < 1 || d > days_in_month(y, mon) || tod < 0)
        return MS_EBADREQ;
    /* 9999-12-31T23:59:60 would be the first second of year 10000. */
    int64_t v = days_from_civil(y, mon, d) * 86400 + tod;
    if (v > MAX_DATE)
        return MS_EBADREQ;
    *t = v;
    return 0;
}

/* Parses a trimmed HTTP-date; `now_year` <= 0 reads the clock if a two-digit year needs it. */
static int parse_date(const char *p, size_t len, int64_t *t, int now_year)
{
    if (len == 29 && p[3] == ',') {
        /* IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT" */
        if (short_name(p, day_names, 7) < 0 || p[4] != ' ' || p[7] != ' ' || p[11] != ' ' ||
            p[16] != ' ' || p[25] != ' ' || memcmp(p + 26, "GMT", 3) != 0)
            return MS_EBADREQ;
        return make_time(digits(p + 12, 4), short_name(p + 8, month_names, 12) + 1,
                         digits(p + 5, 2), time_of_day(p + 17), t);
    }
    if (len == 24 && p[3] == ' ') {
        /* asctime: "Sun Nov  6 08:49:37 1994", the day as two digits or a space and one. */
        if (short_name(p, day_names, 7) < 0 || p[7] != ' ' || p[10] != ' ' || p[19] != ' ')
            return MS_EBADREQ;
        int d = p[8] == ' ' ? digits(p + 9, 1) : digits(p + 8, 2);
        return make_time(digits(p + 20, 4), short_name(p + 4, month_names, 12) + 1, d,
                         time_of_day(p + 11), t);
    }
    /* RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT": the long day name, then 24 bytes. */
    for (int i = 0; i < 7; i++) {
        size_t n = strlen(day_names_long[i]);
        if (len != n + 24 || memcmp(p, day_names_long[i], n) != 0)
            continue;
        p += n;
        if (p[0] != ',' || p[1] != ' ' || p[4] != '-' || p[8] != '-' || p[11] != ' ' ||
            p[20] != ' ' || memcmp(p + 21, "GMT", 3) != 0)
            return MS_EBADREQ;
        int yy = digits(p + 9, 2);
        if (yy < 0)
            return MS_EBADREQ;
        /* RFC 9110 5.6.7: a year that looks more than 50 years ahead is the most recent past
         * year with the same last two digits. */
        if (now_year <= 0)
            now_year = current_year();
        int y = now_year - now_year % 100 + yy;
        if (y > now_year + 50)
            y -= 100;
        return make_time(y, short_name(p + 5, month_names, 12) + 1, digits(p + 2, 2),
                         time_of_day(p + 12), t);
    }
    return MS_EBADREQ;
}

int ms_http_date_parse(const char *s, size_t len, int64_t *t)
{
    const char *end = s + len;
    trim(&s, &end);
    return parse_date(s, (size_t)(end - s), t, 0);
}

/* -- Entity tags ---------------------------------------------------------------------------- */

/* Reads an entity-tag (RFC 9110 8.8.3) at p: sets *weak and the opaque-tag, quotes included,
 * in *tag and *tag_len, and returns where it ends, or NULL if there is none. */
static const char *scan_etag(const char *p, const char *end, int *weak, const char **tag,
                             size_t *tag_len)
{
    *weak = 0;
    if (end - p >= 2 && p[0] == 'W' && p[1] == '/') {
        *weak = 1;
        p += 2;
    }
    if (p == end || *p != '"')
        return NULL;
    const char *q = p + 1;
    /* etagc: %x21 / %x23-7E / obs-text */
    while (q < end && *q != '"' && ((unsigned char)*q >= 0x80 || (*q >= 0x21 && *q != 0x7f)))
        q++;
    if (q == end || *q != '"')
        return NULL;
    *tag = p;
    *tag_len = (size_t)(q + 1 - p);
    return q + 1;
}

/* Whether the field value `v` ("*" or a list of entity-tags) matches the current `etag`, by the
 * strong or the weak comparison (RFC 9110 8.8.3.2). Reading stops, with no match, at the first
 * member that is not an entity-tag: what follows it cannot be trusted to mean anything. */
static int etag_list_match(ms_str_t v, ms_str_t etag, int strong)
{
    int cur_weak = 0;
    const char *cur = NULL;
    size_t cur_len = 0;
    const char *e = etag.base + etag.len;
    if (etag.len > 0 && scan_etag(etag.base, e, &cur_weak, &cur, &cur_len) != e)
        cur = NULL; /* not an entity-tag: only "*" can match */
    const char *p = v.base, *end = v.base + v.len;
    for (;;) {
        while (p < end && (is_ows(*p) || *p == ','))
            p++;
        if (p == end)
            return 0;
        const char *q;
        int weak = 0;
        const char *tag = NULL;
        size_t tag_len = 0;
        if (*p == '*') {
            q = p + 1;
        } else {
            q = scan_etag(p, end, &weak, &tag, &tag_len);
            if (q == NULL)
                return 0;
        }
        const char *next = q;
        while (next < end && is_ows(*next))
            next++;
        if (next != end && *next != ',')
            return 0;
        if (tag == NULL)
            return 1; /* "*": any current representation, and there is one */
        if (cur != NULL && tag_len == cur_len && memcmp(tag, cur, cur_len) == 0 &&
            (!strong || (!weak && !cur_weak)))
            return 1;
        p = next;
    }
}

/* -- Preconditions -------------------------------------------------------------------------- */

/* Whether a field is there; a value of nothing but spaces is taken as not sent. */
static int present(ms_str_t *v)
{
    if (v->base == NULL)
        return 0;
    const char *end = v->base + v->len;
    trim(&v->base, &end);
    v->len = (size_t)(end - v->base);
    return v->len > 0;
}

/* The date in a field, or -1 when it should be ignored (RFC 9110 13.1.3, 13.1.4): there is no
 * date to compare with, or the value is not an HTTP-date. */
static int64_t field_date(ms_str_t v, int64_t mtime)
{
    int64_t t;
    if (mtime < 0 || ms_http_date_parse(v.base, v.len, &t) < 0)
        return -1;
    return t;
}

int ms_cond_evaluate(const ms_cond_in_t *in)
{
    ms_str_t im = in->if_match, inm = in->if_none_match;
    ms_str_t ims = in->if_modified_since, ius = in->if_unmodified_since;
    int safe = (in->method.len == 3 && memcmp(in->method.base, "GET", 3) == 0) ||
               (in->method.len == 4 && memcmp(in->method.base, "HEAD", 4) == 0);
    /* RFC 9110 13.2.2, steps 1 and 2: If-Unmodified-Since only counts without If-Match. */
    if (present(&im)) {
        if (!etag_list_match(im, in->etag, 1))
            return MS_COND_PRECONDITION_FAILED;
    } else if (present(&ius)) {
        int64_t t = field_date(ius, in->mtime);
        if (t >= 0 && in->mtime > t)
            return MS_COND_PRECONDITION_FAILED;
    }
    /* Steps 3 and 4: If-Modified-Since only counts without If-None-Match, and only for GET and
     * HEAD. Other methods get 412, as they would change a representation the client has. */
    if (present(&inm)) {
        if (etag_list_match(inm, in->etag, 0))
            return safe ? MS_COND_NOT_MODIFIED : MS_COND_PRECONDITION_FAILED;
    } else if (safe && present(&ims)) {
        int64_t t = field_date(ims, in->mtime);
        if (t >= 0 && in->mtime <= t)
            return MS_COND_NOT_MODIFIED;
    }
    return MS_COND_OK;
}

/* -- Ranges --------------------------------------------------------------------------------- */

/* Reads digits at *p, saturating: a position past any size is still a position. Returns
 * whether there were any. */
static int read_pos(const char **p, const char *end, uint64_t *v)
{
    const char *q = *p;
    uint64_t n = 0;
    while (q < end && *q >= '0' && *q <= '9') {
        uint64_t dgt = (uint64_t)(*q - '0');
        n = n > (UINT64_MAX - dgt) / 10 ? UINT64_MAX : n * 10 + dgt;
        q++;
    }
    *v = n;
    int any = q != *p;
    *p = q;
    return any;
}

/* Adds [first, last] to the sorted, disjoint, non-adjacent r[0..*k), joining it with the ranges
 * it overlaps or touches. Returns -1 when it would make more than `max` ranges. Positions are
 * below UINT64_MAX, so the + 1s cannot wrap. */
static int range_add(ms_range_t *r, int *k, int max, uint64_t first, uint64_t last)
{
    int i = 0;
    while (i < *k && r[i].last + 1 < first)
        i++;
    int j = i;
    while (j < *k && r[j].first <= last + 1) {
        if (r[j].first < first)
            first = r[j].first;
        if (r[j].last > last)
            last = r[j].last;
        j++;
    }
    if (j == i) {
        if (*k >= max)
            return -1;
        memmove(&r[i + 1], &r[i], (size_t)(*k - i) * sizeof(*r));
        (*k)++;
    } else if (j > i + 1) {
        memmove(&r[i + 1], &r[j], (size_t)(*k - j) * sizeof(*r));
        *k -= j - i - 1;
    }
    r[i].first = first;
    r[i].last = last;
    return 0;
}

int ms_range_parse(const char *s, size_t len, uint64_t size, ms_range_t *out, int max, int *n)
{
    *n = 0;
    const char *p = s, *end = s + len;
    trim(&p, &end);
    /* RFC 9110 14.1: range units are case-insensitive; one we don't know is ignored. */
    if (end - p < 6 || !ms__ieq(p, "bytes=", 6))
        return MS_RANGE_IGNORE;
    p += 6;
    int k = 0, specs = 0, empty_suffix = 0;
    uint64_t sum = 0;
    /* Each turn consumes at least one byte: bounded by the field's length. */
    for (;;) {
        while (p < end && (is_ows(*p) || *p == ','))
            p++;
        if (p == end)
            break;
        uint64_t a, b;
        int has_a = read_pos(&p, end, &a);
        if (p == end || *p != '-')
            return MS_RANGE_IGNORE;
        p++;
        int has_b = read_pos(&p, end, &b);
        while (p < end && is_ows(*p))
            p++;
        if ((!has_a && !has_b) || (p < end && *p != ',') || (has_a && has_b && b < a))
            return MS_RANGE_IGNORE;
        specs++;
        uint64_t first, last;
        if (!has_a) {
            /* A suffix: the last b bytes, or all of them if there are fewer. */
            if (b == 0)
                continue;
            if (size == 0) {
                empty_suffix = 1;
                continue;
            }
            first = b >= size ? 0 : size - b;
            last = size - 1;
        } else {
            if (a >= size)
                continue; /* unsatisfiable: others may still be satisfied */
            first = a;
            last = has_b && b < size ? b : size - 1;
        }
        /* Counted before joining, as sent: "0-,0-,0-" must not cost three files. */
        uint64_t bytes = last - first + 1;
        if (bytes > size - sum)
            return MS_RANGE_IGNORE;
        sum += bytes;
        if (range_add(out, &k, max, first, last) < 0)
            return MS_RANGE_IGNORE;
    }
    if (specs == 0)
        return MS_RANGE_IGNORE;
    if (k == 0)
        return empty_suffix ? MS_RANGE_IGNORE : MS_RANGE_UNSATISFIABLE;
    *n = k;
    return MS_RANGE_OK;
}

int ms_if_range_ok(const char *s, size_t len, const char *etag, size_t etag_len, int64_t mtime)
{
    const char *p = s, *end = s + len;
    trim(&p, &end);
    if (p == end)
        return 0;
    if (*p == '"' || (end - p >= 2 && p[0] == 'W' && p[1] == '/')) {
        /* RFC 9110 13.1.5: the strong comparison, so a weak tag on either side never matches. */
        int weak;
        const char *tag;
        size_t tag_len;
        if (scan_etag(p, end, &weak, &tag, &tag_len) != end || weak)
            return 0;
        return etag_len == tag_len && etag[0] == '"' && memcmp(etag, tag, tag_len) == 0;
    }
    /* A date must be Last-Modified exactly: an earlier or later one names another version. */
    int64_t t;
    return mtime >= 0 && parse_date(p, (size_t)(end - p), &t, 0) == 0 && t == mtime;
}
