/* log_file.h: who opens the error log's file (ms_log_open, ms_log_reopen in moonserve.h). */
#ifndef MS_PROCESS_LOG_FILE_H
#define MS_PROCESS_LOG_FILE_H

#include "moonserve.h"

/* When set (by the master), what ms_log_open calls for a path instead of opening it: a
 * descriptor the caller owns, or -errno. */
extern int (*ms__log_opener)(const char *path);

#endif
