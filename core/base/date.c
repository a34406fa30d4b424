/* date.c: the time as text, made once a second: the Date field (GMT) and the local time of
 * log lines. */
#include "base/date.h"

#include <stdio.h>

#include "moonserve.h"

static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                   "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

const char *ms__date_text(ms_date_t *d, uint64_t now)
{
    /* Look at the wall clock (vDSO, no system call) at most once per loop turn. */
    if (MS_LIKELY(now == d->checked))
        return d->line;
    d->checked = now;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t sec = (uint64_t)ts.tv_sec;
    if (sec != d->sec) {
        static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
        time_t t = (time_t)sec;
        struct tm tm;
        gmtime_r(&t, &tm);
        snprintf(d->line, sizeof(d->line),
                 "date: %s, %02d %s %04d %02d:%02d:%02d GMT\r\n", days[tm.tm_wday], tm.tm_mday,
                 months[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
        d->sec = sec;
    }
    return d->line;
}

/* -- Local time text ------------------------------------------------------------------- */

/* The texts of the current second, made once a second: localtime_r is not cheap. The loop
 * thread alone logs, so one cache serves the process. */
static ms_now_text_t now_text = {-1, "", "", "", 0, 0, 0};

const ms_now_text_t *ms__now_texts(struct timespec *ts)
{
    clock_gettime(CLOCK_REALTIME, ts);
    if (ts->tv_sec == now_text.sec)
        return &now_text;
    struct tm tm;
    localtime_r(&ts->tv_sec, &tm);
    long off = tm.tm_gmtoff / 60;
    char sign = off < 0 ? '-' : '+';
    off = (off < 0 ? -off : off) % (100 * 60);
    now_text.iso_len = snprintf(now_text.iso, sizeof(now_text.iso), "%04d-%02d-%02dT%02d:%02d:%02d",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
    now_text.off_len = snprintf(now_text.off, sizeof(now_text.off), "%c%02ld:%02ld", sign, off / 60, off % 60);
    now_text.clf_len = snprintf(now_text.clf, sizeof(now_text.clf), "%02d/%s/%04d:%02d:%02d:%02d %c%02ld%02ld",
             tm.tm_mday, months[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec,
             sign, off / 60, off % 60);
    now_text.sec = ts->tv_sec;
    return &now_text;
}

int ms__time_iso(char *buf, size_t len)
{
    struct timespec ts;
    ms__now_texts(&ts);
    return snprintf(buf, len, "%s.%03d%s", now_text.iso, (int)(ts.tv_nsec / 1000000),
                    now_text.off);
}
