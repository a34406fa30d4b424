/* errors.h: moonserve's own error codes, beside libuv's negative UV_E* codes. */
#ifndef MS_ERRORS_H
#define MS_ERRORS_H

/* X(name, value, message). Values sit far below libuv's range so both fit in one int. */
#define MS_ERRNO_MAP(X)                                                                            \
    X(EBADREQ, -10001, "malformed request")                                                        \
    X(EBADHEADER, -10002, "invalid header name or value")                                          \
    X(ERESERVED, -10003, "header is set by the server")                                            \
    X(ESENT, -10004, "reply already sent")                                                         \
    X(ECLOSED, -10005, "connection closed")                                                        \
    X(ETOOBIG, -10006, "too large")                                                                \
    X(EBUSY, -10007, "already waiting")                                                            \
    X(ESTATE, -10008, "not allowed in this state")

enum {
#define MS_ERR_ENUM(name, value, msg) MS_##name = (value),
    MS_ERRNO_MAP(MS_ERR_ENUM)
#undef MS_ERR_ENUM
};

/* The symbolic name ("EBADREQ", or libuv's "ECONNRESET") of a negative code. */
const char *ms_err_name(int err);
/* The message of a negative code. */
const char *ms_strerror(int err);

#endif
