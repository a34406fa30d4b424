/* log.c: the error log: one line per message, text or JSON, written with one write to the
 * descriptor it was handed (process/log_file.c opens the file). */
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/date.h"

/* -- Lines ------------------------------------------------------------------------------- */

static int log_fd = 2;
static int log_json;

/* A JSON string's contents for the error log: '"', '\' and control characters escaped. */
static size_t json_escape(char *w, size_t room, const char *p, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = 0; i < n && o + 6 < room; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == '"' || ch == '\\') {
            w[o++] = '\\';
            w[o++] = (char)ch;
        } else if (ch == '\n') {
            w[o++] = '\\';
            w[o++] = 'n';
        } else if (ch < 0x20 || ch == 0x7f) {
            memcpy(w + o, "\\u00", 4);
            w[o + 4] = hex[ch >> 4];
            w[o + 5] = hex[ch & 15];
            o += 6;
        } else {
            w[o++] = (char)ch;
        }
    }
    return o;
}

/* Whether the text log writes `ch` as an escape: a control byte (a message often holds what
 * a client sent, and a CR or LF in it would forge a line of its own) and the backslash (so
 * that an escape in a line can only be the log's). */
static inline int text_escaped(unsigned char ch)
{
    return ch < 0x20 || ch == 0x7f || ch == '\\';
}

/* A message for the text log from its first escaped byte on: \n, \r, \t, \\ and \xHH (the
 * access log's form) for the other control bytes; bytes from 0x80 stay as they are, so UTF-8
 * text stays readable. Writes at most `room` bytes and returns how many. */
static size_t text_escape(char *w, size_t room, const char *p, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = 0; i < n && o + 4 <= room; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (!text_escaped(ch)) {
            w[o++] = (char)ch;
            continue;
        }
        w[o++] = '\\';
        switch (ch) {
        case '\n': w[o++] = 'n'; break;
        case '\r': w[o++] = 'r'; break;
        case '\t': w[o++] = 't'; break;
        case '\\': w[o++] = '\\'; break;
        default:
            w[o++] = 'x';
            w[o++] = hex[ch >> 4];
            w[o++] = hex[ch & 15];
        }
    }
    return o;
}

/* One write per line, so that lines of several workers on one file never interleave:
 * "2000-10-10T13:55:36.123-07:00 moonserve[42] warn: ...", or with --log-format json
 * {"time":"...","level":"warn","pid":42,"msg":"..."}. Either way a message is one line:
 * its control bytes are escaped. */
static void log_stderr(int level, const char *msg, size_t len)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    char line[2400], t[128];
    ms__time_iso(t, sizeof(t));
    int n;
    if (log_json) {
        n = snprintf(line, sizeof(line), "{\"time\":\"%s\",\"level\":\"%s\",\"pid\":%d,\"msg\":\"", t,
                     names[level], (int)getpid());
        n += (int)json_escape(line + n, sizeof(line) - (size_t)n - 3, msg, len);
        memcpy(line + n, "\"}\n", 3);
        n += 3;
    } else {
        n = snprintf(line, sizeof(line), "%s moonserve[%d] %s: ", t, (int)getpid(), names[level]);
        /* The plain run first (most messages are all of it), then the rest escaped; a
         * message cut short is still one line. */
        size_t room = sizeof(line) - (size_t)n - 1, k = 0;
        while (k < len && !text_escaped((unsigned char)msg[k]))
            k++;
        if (k > room)
            k = room;
        memcpy(line + n, msg, k);
        n += (int)k;
        if (k < len)
            n += (int)text_escape(line + n, room - k, msg + k, len - k);
        line[n++] = '\n';
    }
    if (n > 0 && write(log_fd, line, (size_t)n) < 0) {
        /* nowhere left to say it */
    }
}

void ms_log_format(int json)
{
    log_json = json != 0;
}

void ms__log_use_fd(int fd)
{
    if (log_fd != 2 && log_fd != fd)
        close(log_fd);
    log_fd = fd;
}

static ms_log_fn log_fn = log_stderr;
static ms_log_fn log_tap; /* sees every line the log writes, as well (in-process tests) */
static int log_level = MS_LOG_INFO;

void ms_log_tap(ms_log_fn fn)
{
    log_tap = fn;
}

void ms_log_set(ms_log_fn fn, int level)
{
    log_fn = fn ? fn : log_stderr;
    log_level = level < MS_LOG_ERR ? MS_LOG_ERR : level > MS_LOG_DEBUG ? MS_LOG_DEBUG : level;
}

int ms_log_level(void)
{
    return log_level;
}

void ms_log(int level, const char *fmt, ...)
{
    /* Levels name the lines (log_stderr's table): one outside them is an error's. */
    if (level < MS_LOG_ERR || level > MS_LOG_DEBUG)
        level = MS_LOG_ERR;
    if (level > log_level)
        return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    size_t len = (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1;
    log_fn(level, buf, len);
    if (log_tap != NULL)
        log_tap(level, buf, len);
}

void ms_log_msg(int level, const char *msg, size_t len)
{
    if (level < MS_LOG_ERR || level > MS_LOG_DEBUG)
        level = MS_LOG_ERR;
    if (level > log_level)
        return;
    len = len < 1023 ? len : 1023; /* as ms_log's lines */
    log_fn(level, msg, len);
    if (log_tap != NULL)
        log_tap(level, msg, len);
}

