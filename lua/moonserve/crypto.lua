--- moonserve/crypto.lua: random bytes, digests (SHA-256, SHA-1, MD5, PBKDF2), HMAC-SHA256, AES-256-GCM,
-- base64url and hex, over libcrypto.
-- @module moonserve.crypto
local ffi = require "ffi"
local bit = require "bit"

local ffi_new, ffi_str, ffi_gc = ffi.new, ffi.string, ffi.gc
local band, bor, lshift, rshift = bit.band, bit.bor, bit.lshift, bit.rshift
local byte, sub = string.byte, string.sub
local type = type

ffi.cdef[[
typedef struct evp_md_st EVP_MD;
typedef struct evp_cipher_st EVP_CIPHER;
typedef struct evp_cipher_ctx_st EVP_CIPHER_CTX;
typedef struct engine_st ENGINE;

int RAND_bytes(unsigned char *buf, int num);
int CRYPTO_memcmp(const void *a, const void *b, size_t len);

const EVP_MD *EVP_sha256(void);
const EVP_MD *EVP_sha1(void);
const EVP_MD *EVP_md5(void);
int EVP_Digest(const void *data, size_t count, unsigned char *md, unsigned int *size,
               const EVP_MD *type, ENGINE *impl);
int PKCS5_PBKDF2_HMAC(const char *pass, int passlen, const unsigned char *salt, int saltlen,
                      int iter, const EVP_MD *digest, int keylen, unsigned char *out);
unsigned char *HMAC(const EVP_MD *md, const void *key, int key_len,
                    const unsigned char *data, size_t data_len,
                    unsigned char *out, unsigned int *out_len);

const EVP_CIPHER *EVP_aes_256_gcm(void);
EVP_CIPHER_CTX *EVP_CIPHER_CTX_new(void);
void EVP_CIPHER_CTX_free(EVP_CIPHER_CTX *ctx);
int EVP_CIPHER_CTX_ctrl(EVP_CIPHER_CTX *ctx, int type, int arg, void *ptr);
int EVP_EncryptInit_ex(EVP_CIPHER_CTX *ctx, const EVP_CIPHER *cipher, ENGINE *impl,
                       const unsigned char *key, const unsigned char *iv);
int EVP_EncryptUpdate(EVP_CIPHER_CTX *ctx, unsigned char *out, int *outl,
                      const unsigned char *in, int inl);
int EVP_EncryptFinal_ex(EVP_CIPHER_CTX *ctx, unsigned char *out, int *outl);
int EVP_DecryptInit_ex(EVP_CIPHER_CTX *ctx, const EVP_CIPHER *cipher, ENGINE *impl,
                       const unsigned char *key, const unsigned char *iv);
int EVP_DecryptUpdate(EVP_CIPHER_CTX *ctx, unsigned char *out, int *outl,
                      const unsigned char *in, int inl);
int EVP_DecryptFinal_ex(EVP_CIPHER_CTX *ctx, unsigned char *out, int *outl);

typedef struct hmac_ctx_st HMAC_CTX;
HMAC_CTX *HMAC_CTX_new(void);
int HMAC_Init_ex(HMAC_CTX *ctx, const void *key, int len, const EVP_MD *md, ENGINE *impl);
int HMAC_Update(HMAC_CTX *ctx, const unsigned char *data, size_t len);
int HMAC_Final(HMAC_CTX *ctx, unsigned char *md, unsigned int *len);

typedef struct ossl_lib_ctx_st OSSL_LIB_CTX;
const EVP_MD *EVP_MD_fetch(OSSL_LIB_CTX *ctx, const char *algorithm, const char *properties);
const EVP_CIPHER *EVP_CIPHER_fetch(OSSL_LIB_CTX *ctx, const char *algorithm,
                                   const char *properties);
]]

-- The versioned name first: the unversioned libcrypto.so only comes with the -dev package.
local ok, C = pcall(ffi.load, "libcrypto.so.3")
if not ok then
    C = ffi.load("crypto")
end

local EVP_CTRL_GCM_GET_TAG = 0x10
local EVP_CTRL_GCM_SET_TAG = 0x11
local NONCE_LEN, TAG_LEN, KEY_LEN = 12, 16, 32

-- OpenSSL 3 looks an algorithm up by name each time one of the EVP_sha256() kind is used
-- (an "implicit fetch"): most of an HMAC or a decryption of a session cookie. Fetched once
-- here, they are not looked up again. (OpenSSL 1.1 has no fetch: its own are used.)
local function fetch(fn, name, legacy)
    local got_ok, got = pcall(function()
        return C[fn](nil, name, nil)
    end)
    if got_ok and got ~= nil then
        return got
    end
    return legacy()
end
local sha256 = fetch("EVP_MD_fetch", "SHA256", C.EVP_sha256)
local sha1 = fetch("EVP_MD_fetch", "SHA1", C.EVP_sha1)
local md5 = fetch("EVP_MD_fetch", "MD5", C.EVP_md5)
local aes256gcm = fetch("EVP_CIPHER_fetch", "AES-256-GCM", C.EVP_aes_256_gcm)
-- HMAC() fetches its MAC at each call too: one context, keyed again at each call, instead.
local hmac_ctx = C.HMAC_CTX_new()
local outl = ffi_new("int[1]")           -- reused: nothing here yields between set and read
local mac_buf = ffi_new("unsigned char[32]")

local _M = { NONCE_LEN = NONCE_LEN, TAG_LEN = TAG_LEN }

local function check_string(x, what, level)
    if type(x) ~= "string" then
        error("bad " .. what .. " (string expected, got " .. type(x) .. ")", level + 1)
    end
end

--- n bytes from the system's CSPRNG, or nil and an error.
-- @usage local id = crypto.base64url_encode(assert(crypto.random(16)))
function _M.random(n)
    if type(n) ~= "number" or n < 0 or n % 1 ~= 0 then
        error("bad byte count (non-negative integer expected)", 2)
    end
    if n == 0 then
        return ""
    end
    local buf = ffi_new("unsigned char[?]", n)
    if C.RAND_bytes(buf, n) ~= 1 then
        return nil, "RAND_bytes failed: the random generator is not seeded"
    end
    return ffi_str(buf, n)
end

--- The 32-byte HMAC-SHA256 of `data` under `key`, as raw bytes.
function _M.hmac_sha256(key, data)
    check_string(key, "key", 2)
    check_string(data, "data", 2)
    -- (nothing here yields, so the one context is never shared by two calls)
    if hmac_ctx == nil or C.HMAC_Init_ex(hmac_ctx, key, #key, sha256, nil) ~= 1
        or C.HMAC_Update(hmac_ctx, data, #data) ~= 1
        or C.HMAC_Final(hmac_ctx, mac_buf, nil) ~= 1 then
        return nil, "HMAC failed"
    end
    return ffi_str(mac_buf, 32)
end

--- The 32-byte SHA-256 digest of `data`, as raw bytes.
function _M.sha256(data)
    check_string(data, "data", 2)
    if C.EVP_Digest(data, #data, mac_buf, nil, sha256, nil) ~= 1 then
        return nil, "SHA-256 failed"
    end
    return ffi_str(mac_buf, 32)
end

--- The 20-byte SHA-1 digest of `data`, as raw bytes. Only for names that protocols still
-- make with it (a Redis script's SHA for EVALSHA): SHA-1 is broken for anything new.
function _M.sha1(data)
    check_string(data, "data", 2)
    if C.EVP_Digest(data, #data, mac_buf, nil, sha1, nil) ~= 1 then
        return nil, "SHA-1 failed"
    end
    return ffi_str(mac_buf, 20)
end

--- The 16-byte MD5 digest of `data`, as raw bytes. Only for protocols that still ask for it
-- (PostgreSQL's md5 authentication): MD5 is broken for anything new.
function _M.md5(data)
    check_string(data, "data", 2)
    if C.EVP_Digest(data, #data, mac_buf, nil, md5, nil) ~= 1 then
        return nil, "MD5 failed"
    end
    return ffi_str(mac_buf, 16)
end

--- PBKDF2-HMAC-SHA256 (RFC 8018 5.2): `len` bytes (32 by default) derived from `password`
-- and `salt` in `iterations` rounds, as raw bytes. Its cost grows with `iterations`, and it
-- runs where it is called: the caller bounds the count.
function _M.pbkdf2_sha256(password, salt, iterations, len)
    check_string(password, "password", 2)
    check_string(salt, "salt", 2)
    len = len or 32
    if type(iterations) ~= "number" or iterations < 1 or iterations % 1 ~= 0
        or iterations > 0x7fffffff then
        error("bad iteration count (positive integer expected)", 2)
    end
    if type(len) ~= "number" or len < 1 or len % 1 ~= 0 or len > 1024 then
        error("bad key length (integer from 1 to 1024 expected)", 2)
    end
    local out = ffi_new("unsigned char[?]", len)
    if C.PKCS5_PBKDF2_HMAC(password, #password, salt, #salt, iterations, sha256, len, out) ~= 1
    then
        return nil, "PBKDF2 failed"
    end
    return ffi_str(out, len)
end

--- Whether two strings are equal, in a time that depends only on their length, so that an
-- attacker cannot learn a MAC byte by byte from how long the comparison takes.
function _M.equal(a, b)
    check_string(a, "first string", 2)
    check_string(b, "second string", 2)
    if #a ~= #b then
        return false
    end
    return C.CRYPTO_memcmp(a, b, #a) == 0
end

local function new_ctx()
    local ctx = C.EVP_CIPHER_CTX_new()
    if ctx == nil then
        return nil
    end
    return ffi_gc(ctx, C.EVP_CIPHER_CTX_free)
end

-- Frees the context now rather than at the next collection: each one holds key material.
local function free_ctx(ctx)
    C.EVP_CIPHER_CTX_free(ffi_gc(ctx, nil))
end

local function check_key(key, level)
    if type(key) ~= "string" or #key ~= KEY_LEN then
        error("bad key (32-byte string expected)", level + 1)
    end
end

--- Encrypts with a fresh random nonce. Returns nonce .. ciphertext .. tag (12 + #plaintext + 16
-- bytes), or nil and an error. `aad` is authenticated but not encrypted; it must be given
-- again, the same, to decrypt.
function _M.aes256gcm_encrypt(key, plaintext, aad)
    check_key(key, 2)
    check_string(plaintext, "plaintext", 2)
    aad = aad or ""
    check_string(aad, "aad", 2)
    local nonce, err = _M.random(NONCE_LEN)
    if not nonce then
        return nil, err
    end
    local ctx = new_ctx()
    if not ctx then
        return nil, "out of memory"
    end
    local n = #plaintext
    local out = ffi_new("unsigned char[?]", n + TAG_LEN)
    local ok_ = C.EVP_EncryptInit_ex(ctx, aes256gcm, nil, key, nonce) == 1
        and C.EVP_EncryptUpdate(ctx, nil, outl, aad, #aad) == 1
        and C.EVP_EncryptUpdate(ctx, out, outl, plaintext, n) == 1
        and C.EVP_EncryptFinal_ex(ctx, out + n, outl) == 1     -- GCM adds no bytes here
        and C.EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, TAG_LEN, out + n) == 1
    free_ctx(ctx)
    if not ok_ then
        return nil, "encryption failed"
    end
    return nonce .. ffi_str(out, n + TAG_LEN)
end

--- The plaintext of a blob from aes256gcm_encrypt, or nil, "authentication failed" when the
-- blob, the key or the aad is not the one it was made with.
function _M.aes256gcm_decrypt(key, blob, aad)
    check_key(key, 2)
    check_string(blob, "blob", 2)
    aad = aad or ""
    check_string(aad, "aad", 2)
    local n = #blob - NONCE_LEN - TAG_LEN
    if n < 0 then
        return nil, "authentication failed"
    end
    local ctx = new_ctx()
    if not ctx then
        return nil, "out of memory"
    end
    -- The tag is handed to OpenSSL from a copy: the ctrl call takes a non-const pointer.
    local tag = ffi_new("unsigned char[?]", TAG_LEN)
    ffi.copy(tag, sub(blob, -TAG_LEN), TAG_LEN)
    local out = ffi_new("unsigned char[?]", n + 1)   -- +1: never a zero-length array
    local p = ffi.cast("const unsigned char *", blob)
    local ok_ = C.EVP_DecryptInit_ex(ctx, aes256gcm, nil, key, p) == 1
        and C.EVP_DecryptUpdate(ctx, nil, outl, aad, #aad) == 1
        and C.EVP_DecryptUpdate(ctx, out, outl, p + NONCE_LEN, n) == 1
        and C.EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, TAG_LEN, tag) == 1
        and C.EVP_DecryptFinal_ex(ctx, out + n, outl) == 1     -- checks the tag
    free_ctx(ctx)
    if not ok_ then
        return nil, "authentication failed"
    end
    return ffi_str(out, n)
end

-- -- base64url (RFC 4648 5), without padding ---------------------------------------------

local ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
local enc, dec = {}, {}
for i = 1, 64 do
    local c = byte(ALPHABET, i)
    enc[i - 1] = c
    dec[c] = i - 1
end

-- Both directions write bytes into one buffer and make one string of it at the end: a
-- string per group (and the concat) was most of what decoding a session cookie cost. Up to
-- BUF_KEEP bytes the buffer stays for the next call (nothing here yields meanwhile).
local BUF_KEEP = 65536
local buf, buf_len = ffi_new("uint8_t[?]", 512), 512
local function out_buf(n)
    if n <= buf_len then
        return buf
    end
    local b = ffi_new("uint8_t[?]", n)
    if n <= BUF_KEEP then
        buf, buf_len = b, n
    end
    return b
end

-- Each byte's two lowercase hex digits, for gsub (a table: no function is made per call).
local HEX = {}
for i = 0, 255 do
    HEX[string.char(i)] = string.format("%02x", i)
end

--- `s` in lowercase hex, two digits a byte (a digest's usual text form).
-- @tparam string s
-- @treturn string
function _M.hex(s)
    check_string(s, "data", 2)
    return (string.gsub(s, ".", HEX))
end

--- `s` in base64url (RFC 4648 section 5), without padding.
function _M.base64url_encode(s)
    check_string(s, "data", 2)
    local len = #s
    local rest = len % 3
    local size = (len - rest) / 3 * 4 + (rest == 0 and 0 or rest + 1)
    local out, n = out_buf(size), 0
    for i = 1, len - 2, 3 do
        local a, b, c = byte(s, i, i + 2)
        local v = bor(lshift(a, 16), lshift(b, 8), c)
        out[n] = enc[rshift(v, 18)]
        out[n + 1] = enc[band(rshift(v, 12), 63)]
        out[n + 2] = enc[band(rshift(v, 6), 63)]
        out[n + 3] = enc[band(v, 63)]
        n = n + 4
    end
    if rest == 1 then
        local a = byte(s, len)
        out[n] = enc[rshift(a, 2)]
        out[n + 1] = enc[lshift(band(a, 3), 4)]
    elseif rest == 2 then
        local a, b = byte(s, len - 1, len)
        out[n] = enc[rshift(a, 2)]
        out[n + 1] = enc[bor(lshift(band(a, 3), 4), rshift(b, 4))]
        out[n + 2] = enc[lshift(band(b, 15), 2)]
    end
    return ffi_str(out, size)
end

--- Decodes base64url without padding, or returns nil and an error. Strict: padding, other
-- characters, an impossible length and unused bits that are not zero are all refused, so
-- each byte string has exactly one encoding (a signed token cannot be altered in a way that
-- still decodes to the same bytes).
function _M.base64url_decode(s)
    check_string(s, "text", 2)
    local len = #s
    local rest = len % 4
    if rest == 1 then
        return nil, "bad base64url length"
    end
    local full = len - rest
    local size = full / 4 * 3 + (rest == 0 and 0 or rest - 1)
    local out, n = out_buf(size + 1), 0   -- (+1: never a zero-length array)
    for i = 1, full, 4 do
        local a, b, c, d = byte(s, i, i + 3)
        a, b, c, d = dec[a], dec[b], dec[c], dec[d]
        if not (a and b and c and d) then
            return nil, "bad base64url character"
        end
        local v = bor(lshift(a, 18), lshift(b, 12), lshift(c, 6), d)
        out[n] = rshift(v, 16)
        out[n + 1] = band(rshift(v, 8), 255)
        out[n + 2] = band(v, 255)
        n = n + 3
    end
    -- A last group of 2 or 3 characters: 1 or 2 bytes, and the bits left over (4 or 2)
    -- must be zero.
    if rest == 2 then
        local a, b = dec[byte(s, full + 1)], dec[byte(s, full + 2)]
        if not (a and b) then
            return nil, "bad base64url character"
        end
        if band(b, 15) ~= 0 then
            return nil, "bad base64url padding bits"
        end
        out[n] = bor(lshift(a, 2), rshift(b, 4))
    elseif rest == 3 then
        local a, b, c = dec[byte(s, full + 1)], dec[byte(s, full + 2)], dec[byte(s, full + 3)]
        if not (a and b and c) then
            return nil, "bad base64url character"
        end
        if band(c, 3) ~= 0 then
            return nil, "bad base64url padding bits"
        end
        local v = bor(lshift(a, 18), lshift(b, 12), lshift(c, 6))
        out[n] = rshift(v, 16)
        out[n + 1] = band(rshift(v, 8), 255)
    end
    return ffi_str(out, size)
end

return _M
