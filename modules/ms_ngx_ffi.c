/* ms_ngx_ffi.c: the few of nginx's own C functions that OpenResty libraries declare in their
 * ffi.cdef and call through ffi.C (docs/ngx.md has the survey), with nginx's names,
 * signatures and results, so those libraries run unchanged on the ngx layer. */
#include <stdint.h>
#include <string.h>

#include "moonserve.h"

/* nginx's ngx_str_t: the length first, then the bytes (not NUL-terminated). */
typedef struct ms_ngx_str_s {
    size_t len;
    unsigned char *data;
} ms_ngx_str_t;

/* nginx's NGX_OK and NGX_ERROR. */
#define NGX_OK    0
#define NGX_ERROR (-1)

/* -- Hex ---------------------------------------------------------------------------------- */

/* Two lowercase hex digits a byte, no terminating NUL; returns the end of what it wrote, as
 * nginx's does (lua-resty-string's to_hex). */
MS_EXPORT unsigned char *ngx_hex_dump(unsigned char *dst, const unsigned char *src, size_t len)
{
    static const char digits[] = "0123456789abcdef";
    while (len-- > 0) {
        *dst++ = (unsigned char)digits[*src >> 4];
        *dst++ = (unsigned char)digits[*src++ & 0xf];
    }
    return dst;
}

/* A decimal number of digits only (no sign, no space): the value, or NGX_ERROR for an empty
 * string, any other byte, or a value past intptr_t's maximum (lua-resty-string's atoi). */
MS_EXPORT intptr_t ngx_atoi(const unsigned char *line, size_t n)
{
    if (n == 0)
        return NGX_ERROR;
    intptr_t value = 0;
    for (; n > 0; n--, line++) {
        if (*line < '0' || *line > '9')
            return NGX_ERROR;
        int d = *line - '0';
        if (value > (INTPTR_MAX - d) / 10)
            return NGX_ERROR;
        value = value * 10 + d;
    }
    return value;
}

/* -- Base64 (RFC 4648) -------------------------------------------------------------------- */

static const char b64_std[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static const char b64_url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* dst->data has room for ((src->len + 2) / 3) * 4 bytes (nginx's
 * ngx_base64_encoded_length); dst->len is set to what was written. */
static void b64_encode(ms_ngx_str_t *dst, const ms_ngx_str_t *src, const char *alphabet, int pad)
{
    const unsigned char *s = src->data;
    unsigned char *d = dst->data;
    size_t n = src->len;
    for (; n > 2; n -= 3, s += 3) {
        *d++ = (unsigned char)alphabet[s[0] >> 2];
        *d++ = (unsigned char)alphabet[((s[0] & 3) << 4) | (s[1] >> 4)];
        *d++ = (unsigned char)alphabet[((s[1] & 0x0f) << 2) | (s[2] >> 6)];
        *d++ = (unsigned char)alphabet[s[2] & 0x3f];
    }
    if (n > 0) {
        *d++ = (unsigned char)alphabet[s[0] >> 2];
        if (n == 1) {
            *d++ = (unsigned char)alphabet[(s[0] & 3) << 4];
            if (pad)
                *d++ = '=';
        } else {
            *d++ = (unsigned char)alphabet[((s[0] & 3) << 4) | (s[1] >> 4)];
            *d++ = (unsigned char)alphabet[(s[1] & 0x0f) << 2];
        }
        if (pad)
            *d++ = '=';
    }
    dst->len = (size_t)(d - dst->data);
}

/* A digit's value in `alphabet`, or -1. */
static int b64_value(unsigned char c, int url)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == (url ? '-' : '+'))
        return 62;
    if (c == (url ? '_' : '/'))
        return 63;
    return -1;
}

/* nginx's decoding: the digits up to the first '=' (what follows it is not looked at), each
 * of the alphabet, and not one digit alone in the last group; the bits a short last group
 * leaves over are dropped. dst->data has room for ((src->len + 3) / 4) * 3 bytes. */
static intptr_t b64_decode(ms_ngx_str_t *dst, const ms_ngx_str_t *src, int url)
{
    size_t len = 0;
    for (; len < src->len; len++) {
        if (src->data[len] == '=')
            break;
        if (b64_value(src->data[len], url) < 0)
            return NGX_ERROR;
    }
    if (len % 4 == 1)
        return NGX_ERROR;
    const unsigned char *s = src->data;
    unsigned char *d = dst->data;
    for (; len > 3; len -= 4, s += 4) {
        uint32_t v = (uint32_t)b64_value(s[0], url) << 18 | (uint32_t)b64_value(s[1], url) << 12 |
                     (uint32_t)b64_value(s[2], url) << 6 | (uint32_t)b64_value(s[3], url);
        *d++ = (unsigned char)(v >> 16);
        *d++ = (unsigned char)(v >> 8);
        *d++ = (unsigned char)v;
    }
    if (len > 1)
        *d++ = (unsigned char)(b64_value(s[0], url) << 2 | b64_value(s[1], url) >> 4);
    if (len > 2)
        *d++ = (unsigned char)(b64_value(s[1], url) << 4 | b64_value(s[2], url) >> 2);
    dst->len = (size_t)(d - dst->data);
    return NGX_OK;
}

MS_EXPORT void ngx_encode_base64(ms_ngx_str_t *dst, ms_ngx_str_t *src)
{
    b64_encode(dst, src, b64_std, 1);
}

/* The URL alphabet (RFC 4648 5), without padding, as nginx's. */
MS_EXPORT void ngx_encode_base64url(ms_ngx_str_t *dst, ms_ngx_str_t *src)
{
    b64_encode(dst, src, b64_url, 0);
}

/* NGX_OK, or NGX_ERROR for a byte outside the alphabet before any '=', or a lone last digit. */
MS_EXPORT intptr_t ngx_decode_base64(ms_ngx_str_t *dst, ms_ngx_str_t *src)
{
    return b64_decode(dst, src, 0);
}

MS_EXPORT intptr_t ngx_decode_base64url(ms_ngx_str_t *dst, ms_ngx_str_t *src)
{
    return b64_decode(dst, src, 1);
}
