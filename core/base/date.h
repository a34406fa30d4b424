/* date.h: the time as text (base/date.c). */
#ifndef MS_BASE_DATE_H
#define MS_BASE_DATE_H

#include <stdint.h>
#include <stddef.h>
#include <time.h>

/* The Date field, "date: Sun, 06 Nov 1994 08:49:37 GMT\r\n", kept by its user (a worker). */
typedef struct ms_date_s {
    char line[40];
    uint64_t sec, checked;
} ms_date_t;

/* The Date field line for `now` (the loop's time in ms): the wall clock is looked at once per
 * loop time, and the text made once a second. */
const char *ms__date_text(ms_date_t *d, uint64_t now);

/* The local time's texts of the current second, made once a second: localtime_r is not
 * cheap. The loop thread alone uses them, so one cache serves the process. */
typedef struct ms_now_text_s {
    time_t sec;
    char iso[64]; /* "2000-10-10T13:55:36" */
    char off[40]; /* "-07:00" */
    char clf[96]; /* "10/Oct/2000:13:55:36 -0700" */
    int iso_len, off_len, clf_len;
} ms_now_text_t;

/* Reads the clock into `ts` and returns the texts of its second. */
const ms_now_text_t *ms__now_texts(struct timespec *ts);
/* "2000-10-10T13:55:36.123-07:00", the local time; returns its length. */
int ms__time_iso(char *buf, size_t len);

#endif
