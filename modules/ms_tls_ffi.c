/* ms_tls_ffi.c: the FFI surface of the certificate hook (core/transport/tls.c's ms_tls_hook_*) and of the
 * certificate and key conversions that work anywhere: what lua/moonserve/host/core/tls_hook.lua calls,
 * and through it the ngx layer's ngx.ssl. Results are 0 or a negative code; the reason of a
 * failure is OpenSSL's, taken with ms_ffi_tls_error. */
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <limits.h>
#include <string.h>

#include "moonserve.h"

#define MS_FFI MS_EXPORT

/* What the last failure here was, for the Lua side's error text: OpenSSL's reason when it
 * has one, else `what`. */
static const char *last_error = "";

static int fail(const char *what)
{
    unsigned long e = ERR_peek_last_error();
    const char *r = e != 0 ? ERR_reason_error_string(e) : NULL;
    last_error = r != NULL ? r : what;
    ERR_clear_error();
    return -1;
}

MS_FFI const char *ms_ffi_tls_error(void)
{
    return last_error;
}

/* -- Conversions ---------------------------------------------------------------------------- */

/* The certificates of a PEM chain, in order; NULL if there is none or one is bad. */
static STACK_OF(X509) * read_chain(const char *pem, size_t len)
{
    if (len > INT_MAX)
        return NULL;
    BIO *b = BIO_new_mem_buf(pem, (int)len);
    STACK_OF(X509) *chain = sk_X509_new_null();
    if (b == NULL || chain == NULL)
        goto bad;
    X509 *x;
    while ((x = PEM_read_bio_X509(b, NULL, NULL, NULL)) != NULL)
        if (!sk_X509_push(chain, x)) {
            X509_free(x);
            goto bad;
        }
    /* The end of the text, and nothing else, ends the loop. */
    if (ERR_GET_REASON(ERR_peek_last_error()) != PEM_R_NO_START_LINE || sk_X509_num(chain) == 0)
        goto bad;
    ERR_clear_error();
    BIO_free(b);
    return chain;
bad:
    BIO_free(b);
    sk_X509_pop_free(chain, X509_free);
    return NULL;
}

static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    (void)buf, (void)size, (void)rwflag, (void)u;
    return -1;
}

static EVP_PKEY *read_key(const char *pem, size_t len)
{
    if (len > INT_MAX)
        return NULL;
    BIO *b = BIO_new_mem_buf(pem, (int)len);
    EVP_PKEY *k = b != NULL ? PEM_read_bio_PrivateKey(b, NULL, no_passphrase, NULL) : NULL;
    BIO_free(b);
    return k;
}

/* A PEM chain as the DER of each certificate, one after another (OpenResty's
 * cert_pem_to_der): the length, -1 for bad PEM, or the length needed when over `cap`. */
MS_FFI long ms_ffi_tls_cert_pem_to_der(const char *pem, size_t len, unsigned char *out, size_t cap)
{
    STACK_OF(X509) *chain = read_chain(pem, len);
    if (chain == NULL)
        return fail("bad PEM certificate");
    long n = 0;
    for (int i = 0; i < sk_X509_num(chain); i++) {
        int k = i2d_X509(sk_X509_value(chain, i), NULL);
        if (k < 0) {
            sk_X509_pop_free(chain, X509_free);
            return fail("bad certificate");
        }
        if ((size_t)(n + k) <= cap) {
            unsigned char *p = out + n;
            i2d_X509(sk_X509_value(chain, i), &p);
        }
        n += k;
    }
    sk_X509_pop_free(chain, X509_free);
    return n;
}

/* A PEM private key as DER (i2d_PrivateKey, which d2i_AutoPrivateKey reads back). */
MS_FFI long ms_ffi_tls_key_pem_to_der(const char *pem, size_t len, unsigned char *out, size_t cap)
{
    EVP_PKEY *k = read_key(pem, len);
    if (k == NULL)
        return fail("bad PEM private key");
    int n = i2d_PrivateKey(k, NULL);
    if (n > 0 && (size_t)n <= cap) {
        unsigned char *p = out;
        i2d_PrivateKey(k, &p);
    }
    EVP_PKEY_free(k);
    return n > 0 ? n : fail("bad private key");
}

/* The parsed forms (ngx.ssl's parse_pem_cert, parse_pem_priv_key): a STACK_OF(X509) and an
 * EVP_PKEY, or NULL; the caller frees them with the functions below (ffi.gc). */
MS_FFI void *ms_ffi_tls_parse_chain(const char *pem, size_t len)
{
    STACK_OF(X509) *chain = read_chain(pem, len);
    if (chain == NULL)
        fail("bad PEM certificate");
    return chain;
}

MS_FFI void *ms_ffi_tls_parse_key(const char *pem, size_t len)
{
    EVP_PKEY *k = read_key(pem, len);
    if (k == NULL)
        fail("bad PEM private key");
    return k;
}

MS_FFI void ms_ffi_tls_chain_free(void *chain)
{
    sk_X509_pop_free(chain, X509_free);
}

MS_FFI void ms_ffi_tls_key_free(void *key)
{
    EVP_PKEY_free(key);
}

/* -- The certificate hook ------------------------------------------------------------------- */

MS_FFI ms_tls_hook_t *ms_ffi_tls_hook_next(ms_server_t *s)
{
    return ms_tls_hook_next(s);
}

MS_FFI void ms_ffi_tls_hook_done(ms_tls_hook_t *h, int ok)
{
    ms_tls_hook_done(h, ok);
}

#define HOOK_SSL(h)                                                                                \
    SSL *ssl = ms_tls_hook_ssl(h);                                                                 \
    if (ssl == NULL) {                                                                             \
        last_error = "the connection is gone";                                                     \
        return -1;                                                                                 \
    }

/* The server name the client sent (SNI) into `buf`: its length, 0 for none, -1. */
MS_FFI int ms_ffi_tls_hook_server_name(ms_tls_hook_t *h, char *buf, size_t len)
{
    HOOK_SSL(h);
    const char *name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
    if (name == NULL)
        return 0;
    size_t n = strlen(name);
    if (n > len)
        return fail("server name too long");
    memcpy(buf, name, n);
    return (int)n;
}

/* The client's address as text ("127.0.0.1:5000", "[::1]:5000"), as ms_conn_peer writes it. */
MS_FFI int ms_ffi_tls_hook_peer(ms_tls_hook_t *h, char *buf, size_t len)
{
    ms_conn_t *c = ms_tls_hook_conn(h);
    if (c == NULL) {
        last_error = "the connection is gone";
        return -1;
    }
    ms_conn_peer(c, buf, len);
    return (int)strlen(buf);
}

/* The protocol version the handshake is agreeing (SSL_version: 0x0304 for TLS 1.3). */
MS_FFI int ms_ffi_tls_hook_version(ms_tls_hook_t *h)
{
    HOOK_SSL(h);
    return SSL_version(ssl);
}

MS_FFI int ms_ffi_tls_hook_clear_certs(ms_tls_hook_t *h)
{
    HOOK_SSL(h);
    SSL_certs_clear(ssl);
    return 0;
}

/* The leaf, then its chain, for this handshake. */
static int use_chain(SSL *ssl, STACK_OF(X509) * chain)
{
    if (sk_X509_num(chain) == 0)
        return fail("no certificate");
    if (SSL_use_certificate(ssl, sk_X509_value(chain, 0)) != 1)
        return fail("cannot use the certificate");
    for (int i = 1; i < sk_X509_num(chain); i++)
        if (SSL_add1_chain_cert(ssl, sk_X509_value(chain, i)) != 1)
            return fail("cannot add a chain certificate");
    return 0;
}

/* DER certificates one after another (cert_pem_to_der's form). */
MS_FFI int ms_ffi_tls_hook_set_der_cert(ms_tls_hook_t *h, const unsigned char *der, size_t len)
{
    HOOK_SSL(h);
    STACK_OF(X509) *chain = sk_X509_new_null();
    const unsigned char *p = der, *end = der + len;
    int rc = 0;
    while (chain != NULL && p < end) {
        X509 *x = d2i_X509(NULL, &p, end - p);
        if (x == NULL || !sk_X509_push(chain, x)) {
            X509_free(x);
            rc = fail("bad DER certificate");
            break;
        }
    }
    if (chain == NULL)
        rc = fail("out of memory");
    else if (rc == 0)
        rc = use_chain(ssl, chain);
    sk_X509_pop_free(chain, X509_free);
    return rc;
}

MS_FFI int ms_ffi_tls_hook_set_der_key(ms_tls_hook_t *h, const unsigned char *der, size_t len)
{
    HOOK_SSL(h);
    const unsigned char *p = der;
    EVP_PKEY *k = d2i_AutoPrivateKey(NULL, &p, (long)len);
    if (k == NULL)
        return fail("bad DER private key");
    int rc = SSL_use_PrivateKey(ssl, k) == 1 ? 0 : fail("the key does not match");
    EVP_PKEY_free(k);
    return rc;
}

MS_FFI int ms_ffi_tls_hook_set_chain(ms_tls_hook_t *h, void *chain)
{
    HOOK_SSL(h);
    return use_chain(ssl, chain);
}

MS_FFI int ms_ffi_tls_hook_set_key(ms_tls_hook_t *h, void *key)
{
    HOOK_SSL(h);
    return SSL_use_PrivateKey(ssl, key) == 1 ? 0 : fail("the key does not match");
}
