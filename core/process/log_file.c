/* log_file.c: the error log's file: opened by the master as it was named, or by a worker
 * through its master (process/channel.c), and reopened on a signal to rotate it. */
#include "process/log_file.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "process/channel.h"

static char *log_path;

int (*ms__log_opener)(const char *path);

int ms_log_open(const char *path)
{
    int fd = 2;
    if (path != NULL && ms__log_opener != NULL) {
        fd = ms__log_opener(path); /* the master's: its named log, opened as it was named */
        if (fd < 0)
            return fd;
    } else if (path != NULL) {
        char why[512];
        fd = ms_chan_open(path, 1, why, sizeof(why)); /* (a worker's: through its master) */
        if (fd < 0) {
            if (why[0] != '\0')
                ms_log(MS_LOG_ERR, "%s", why);
            return fd;
        }
    }
    ms__log_use_fd(fd);
    free(log_path);
    log_path = path ? strdup(path) : NULL;
    return 0;
}

int ms_log_reopen(void)
{
    if (log_path == NULL)
        return 0;
    char *path = strdup(log_path);
    int rc = ms_log_open(path);
    free(path);
    return rc;
}

