/* log.h: the error log's descriptor (the public functions are in moonserve.h). */
#ifndef MS_BASE_LOG_H
#define MS_BASE_LOG_H

#include "moonserve.h"

/* Writes the log's lines to `fd` from now on (2 at the start); the one it used before is
 * closed unless it is 2. */
void ms__log_use_fd(int fd);

#endif
