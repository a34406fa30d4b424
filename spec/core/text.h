/* text.h: an output buffer (a memory transport's, a test transport's) read as a C string. */
#ifndef MS_TEST_TEXT_H
#define MS_TEST_TEXT_H

#include "base/util.h"

/* The bytes of `b`, NUL-terminated past its length (which stays as it was). */
static inline const char *text(ms_buf_t *b)
{
    ms__buf_append(b, "", 1);
    b->len--;
    return b->base;
}

#endif
