/* replies.h: what the protocol fuzz targets check of what a connection wrote. */
#ifndef MS_FUZZ_REPLIES_H
#define MS_FUZZ_REPLIES_H

#include <string.h>

#include "moonserve.h"

/* Whether `o` begins with a SETTINGS frame on stream 0: an HTTP/2 connection's first frame,
 * where the client began with the preface (prior knowledge). */
static inline int settings_first(const ms_buf_t *o)
{
    return o->len >= 9 && o->base[3] == 4 && memcmp(o->base + 5, "\0\0\0\0", 4) == 0;
}

#endif
