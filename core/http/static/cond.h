/* cond.h: conditional and range requests (RFC 9110 8.8, 13, 14) as pure functions over text. */
#ifndef MS_COND_H
#define MS_COND_H

#include "moonserve.h"

/* Buffer sizes, NUL included: the longest ETag ms_etag_make() writes, an IMF-fixdate, and the
 * longest Content-Range value. */
#define MS_ETAG_SIZE          36
#define MS_HTTP_DATE_SIZE     30
#define MS_CONTENT_RANGE_SIZE 69
/* Byte ranges a request may ask for, after coalescing; past that the Range field is ignored. */
#define MS_RANGES_MAX 16

/* What the preconditions decide. Apart from OK, each value is the status to answer with. */
enum {
    MS_COND_OK = 0,                   /* go on: serve the representation (or its ranges) */
    MS_COND_NOT_MODIFIED = 304,       /* only ever for GET and HEAD */
    MS_COND_PRECONDITION_FAILED = 412 /* answer 412 and do nothing */
};

/* What a Range field asks for. Each value is the status it leads to. */
enum {
    MS_RANGE_IGNORE = 200,       /* serve the whole representation, as if no Range was sent */
    MS_RANGE_OK = 206,           /* serve the ranges found */
    MS_RANGE_UNSATISFIABLE = 416 /* answer 416; Content-Range: ms_content_range() */
};

/* A request's preconditions and the state of the resource they are checked against. Each
 * field value is borrowed for the call; base NULL (or nothing but spaces) means the field is
 * absent. A field sent more than once must be joined with commas first (RFC 9110 5.3). */
typedef struct ms_cond_in_s {
    ms_str_t method; /* case-sensitive: only "GET" and "HEAD" may get a 304 */
    ms_str_t if_match, if_none_match, if_modified_since, if_unmodified_since;
    ms_str_t etag; /* the representation's, quotes included, "W/" first if weak; len 0: none */
    int64_t mtime; /* its Last-Modified in seconds since the epoch; < 0: it has none */
} ms_cond_in_t;

/* A byte range, both ends included. */
typedef struct ms_range_s {
    uint64_t first, last;
} ms_range_t;

/**
 * Writes a strong ETag, the size and the mtime in nanoseconds in lowercase hex between double
 * quotes ("3e8-1652d3b4a0c2b4e1", the quotes included), and a NUL. Returns its length, or 0 if
 * it needs more than `cap` bytes (MS_ETAG_SIZE is always enough).
 */
size_t ms_etag_make(char *out, size_t cap, uint64_t size, int64_t mtime_sec, int64_t mtime_nsec);

/**
 * Writes `t` (seconds since the epoch, years 1970 to 9999) as an IMF-fixdate, "Sun, 06 Nov
 * 1994 08:49:37 GMT", and a NUL. Returns 29, MS_ETOOBIG if `cap` is under MS_HTTP_DATE_SIZE,
 * or UV_EINVAL if `t` is out of range.
 */
int ms_http_date_format(char *out, size_t cap, int64_t t);

/**
 * Parses an HTTP-date (RFC 9110 5.6.7): an IMF-fixdate, or the obsolete RFC 850 ("Sunday,
 * 06-Nov-94 08:49:37 GMT") and asctime ("Sun Nov  6 08:49:37 1994") formats, with spaces or
 * tabs around it. Names are case-sensitive, the day name is checked for spelling but not
 * against the date, and a second of 60 (leap) is the next minute's first. A two-digit year
 * that would be more than 50 years ahead of the clock is in the past century (the clock is read
 * for RFC 850 dates only). Sets *t and returns 0, or returns MS_EBADREQ for anything else and
 * for dates outside the years 1970 to 9999.
 */
int ms_http_date_parse(const char *s, size_t len, int64_t *t);

/**
 * Evaluates the preconditions in the order of RFC 9110 13.2.2: If-Match (strong comparison),
 * else If-Unmodified-Since; then If-None-Match (weak comparison), else, for GET and HEAD,
 * If-Modified-Since. A "*" matches, as the resource exists. An entity-tag list that stops
 * making sense matches nothing from there on; a date that does not parse is ignored, and so
 * are both dates when the resource has no mtime. Returns an MS_COND_* value.
 */
int ms_cond_evaluate(const ms_cond_in_t *in);

/**
 * Parses a Range field value for a representation of `size` bytes into out[0..*n), sorted,
 * with overlapping and adjacent ranges joined; last positions past the end are cut to
 * size - 1. Returns MS_RANGE_OK; MS_RANGE_IGNORE when the unit is not "bytes" or the value is
 * invalid (RFC 9110 14.1.1: "bytes=", "bytes=5-1"), when more than `max` disjoint ranges come
 * up as they are read in order, when the ranges asked for add up to more than `size` bytes
 * (one request must not make us send a file many times over), or when the only satisfiable
 * ranges are suffixes of an empty representation (there is nothing to send but all of it);
 * or MS_RANGE_UNSATISFIABLE when no range overlaps the representation. out[] and *n mean
 * something only with MS_RANGE_OK.
 */
int ms_range_parse(const char *s, size_t len, uint64_t size, ms_range_t *out, int max, int *n);

/**
 * Whether a Range may be applied under If-Range (RFC 9110 13.1.5): returns 1 when the value
 * is an entity-tag identical to `etag` and both are strong, or a date equal to `mtime`
 * (>= 0); 0 otherwise, which means: serve the whole representation.
 */
int ms_if_range_ok(const char *s, size_t len, const char *etag, size_t etag_len, int64_t mtime);

/**
 * Writes a Content-Range value, "bytes first-last/size", and a NUL. When first > last it
 * writes the unsatisfied form of a 416 instead: "bytes *" followed by "/size". Returns its
 * length, or 0 if it needs more than `cap` bytes (MS_CONTENT_RANGE_SIZE is always enough).
 */
size_t ms_content_range(char *out, size_t cap, uint64_t first, uint64_t last, uint64_t size);

#endif
