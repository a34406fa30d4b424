/* fields.h: a request's header and trailer fields as one string, for tests to compare. */
#ifndef MS_TEST_FIELDS_H
#define MS_TEST_FIELDS_H

#include <stdio.h>

#include "../../core/moonserve.h"

static size_t put_fields(char *buf, size_t size, size_t k, const ms_header_t *f, int n)
{
    for (int i = 0; i < n && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, "%.*s=%.*s;", (int)f[i].name.len,
                              f[i].name.base, (int)f[i].value.len, f[i].value.base);
    return k;
}

/* Writes "name=value;...|name=value;..." (the headers, then the trailers) into buf. */
static void note_fields(const ms_req_t *r, char *buf, size_t size)
{
    size_t k = put_fields(buf, size, 0, r->headers, r->v.nheaders);
    if (k < size)
        k += (size_t)snprintf(buf + k, size - k, "|");
    put_fields(buf, size, k, r->trailers, r->ntrailers);
}

#endif
