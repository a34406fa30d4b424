/* core/process/proctitle.h: the process title `ps` shows (argv rewritten in place). */
#ifndef MS_PROCTITLE_H
#define MS_PROCTITLE_H

/* Sets the title: /proc/self/cmdline and `ps` show `title`, `comm` (and `top`) its first 15
 * bytes. Returns 0, or a negative errno (no argv area found). */
int ms_proctitle_set(const char *title);

#endif
