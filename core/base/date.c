/* date.c: the Date field, formatted once a second. */
#include "moonserve.h"

#include <stdio.h>
#include <time.h>

#include "internal.h"

const char *ms__date_line(ms_server_t *s)
{
    /* Look at the wall clock (vDSO, no system call) at most once per loop turn. */
    uint64_t now = uv_now(s->loop);
    if (MS_LIKELY(now == s->date_checked))
        return s->date_line;
    s->date_checked = now;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t sec = (uint64_t)ts.tv_sec;
    if (sec != s->date_sec) {
        static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
        static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                           "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
        time_t t = (time_t)sec;
        struct tm tm;
        gmtime_r(&t, &tm);
        snprintf(s->date_line, sizeof(s->date_line),
                 "date: %s, %02d %s %04d %02d:%02d:%02d GMT\r\n", days[tm.tm_wday], tm.tm_mday,
                 months[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
        s->date_sec = sec;
    }
    return s->date_line;
}
