/* ms_match_ffi.c: the FFI surface of reading by pattern (core/base/match.h), for readers whose
 * bytes wait in Lua: ngx.req.socket (lua/moonserve/ngx/reqsock.lua). Outbound sockets use
 * it inside the engine (core/client/sock.c). */
#include "base/match.h"
#include "moonserve.h"

#define MS_FFI MS_EXPORT

/* A matcher of p[0..len) (len > 0). Lua frees it with ms_ffi_match_free (ffi.gc). */
MS_FFI ms_match_t *ms_ffi_match_new(const char *p, size_t len, int inclusive)
{
    return ms_match_new(p, len, inclusive);
}

MS_FFI void ms_ffi_match_free(ms_match_t *m)
{
    ms_match_free(m);
}

MS_FFI void ms_ffi_match_reset(ms_match_t *m)
{
    ms_match_reset(m);
}

/* ms_match_feed over the caller's unread bytes p[0..n): returns MS_MATCH_*, and for a piece
 * out[0] = its bytes from p, out[1] = the bytes to consume (doubles: Lua numbers, no boxed
 * 64-bit integers). */
MS_FFI int ms_ffi_match_feed(ms_match_t *m, const char *p, size_t n, size_t size, double *out)
{
    size_t len = 0, used = 0;
    int rc = ms_match_feed(m, p, n, size, &len, &used);
    out[0] = (double)len;
    out[1] = (double)used;
    return rc;
}

/* ms_match_line over p[0..n), looking from `scanned` on: returns the line's length, its CRs
 * dropped in place, with *used = the bytes to consume; or -1 with *used = n, where the next
 * call looks from (doubles: Lua numbers, no boxed 64-bit integers). */
MS_FFI double ms_ffi_match_line(char *p, size_t n, double scanned, double *used)
{
    size_t from = (size_t)scanned, take = 0;
    long len = ms_match_line(p, n, &from, &take);
    *used = (double)(len < 0 ? from : take);
    return (double)len;
}
