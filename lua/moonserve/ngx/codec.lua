-- moonserve/ngx/codec.lua: OpenResty's codecs: base64, md5, sha1, hmac_sha1, crc32, URI
-- escaping, query arguments and quote_sql_str, with its argument rules (nil is "" where
-- OpenResty takes it so) and its answers.
local ffi = require "ffi"
local bit = require "bit"
require "moonserve.crypto" -- declares the libcrypto types used below
local codec = require "moonserve.codec"
local percent_encode = require("moonserve.ngx.context").percent_encode

local byte, char, sub, gsub, find, concat, lower = string.byte, string.char, string.sub,
    string.gsub, string.find, table.concat, string.lower
local band, bor, lshift, rshift = bit.band, bit.bor, bit.lshift, bit.rshift
local type, tostring, tonumber, pairs, error = type, tostring, tonumber, pairs, error
local ffi_str = ffi.string

if not pcall(ffi.typeof, "ms_ngx_codec_t") then
    ffi.cdef [[
typedef struct { int unused; } ms_ngx_codec_t;
const EVP_MD *EVP_sha1(void);
unsigned char *MD5(const unsigned char *d, size_t n, unsigned char *md);
unsigned char *SHA1(const unsigned char *d, size_t n, unsigned char *md);
unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned int len);
]]
end

local ok, crypto = pcall(ffi.load, "libcrypto.so.3")
if not ok then
    crypto = ffi.load("crypto")
end
local zok, zlib = pcall(ffi.load, "libz.so.1")
if not zok then
    zlib = ffi.load("z")
end

local digest = ffi.new("unsigned char[64]")
local digest_len = ffi.new("unsigned int[1]")
local sha1 = crypto.EVP_sha1()

local _M = {}

-- nil as "", anything else as its text: how lua-resty-core takes these arguments.
local function str(s)
    if type(s) ~= "string" then
        return s == nil and "" or tostring(s)
    end
    return s
end

local function checkstr(s, i, fname)
    local t = type(s)
    if t == "string" then
        return s
    elseif t == "number" then
        return tostring(s)
    end
    error("bad argument #" .. i .. " to '" .. fname .. "' (string expected, got " .. t .. ")", 3)
end

-- -- Base64 ---------------------------------------------------------------------------------

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local enc, dec = {}, {}
for i = 1, 64 do
    enc[i - 1] = sub(B64, i, i)
    dec[byte(B64, i)] = i - 1
end

function _M.encode_base64(s, no_padding)
    s = str(s)
    if no_padding ~= nil and type(no_padding) ~= "boolean" then
        error("bad no_padding: boolean expected, got " .. type(no_padding), 2)
    end
    local out, n = {}, 0
    local len = #s
    for i = 1, len - 2, 3 do
        local a, b, c = byte(s, i, i + 2)
        local v = bor(lshift(a, 16), lshift(b, 8), c)
        n = n + 1
        out[n] = enc[rshift(v, 18)] .. enc[band(rshift(v, 12), 63)] .. enc[band(rshift(v, 6), 63)]
            .. enc[band(v, 63)]
    end
    local rest = len % 3
    if rest == 1 then
        local v = lshift(byte(s, len), 16)
        n = n + 1
        out[n] = enc[rshift(v, 18)] .. enc[band(rshift(v, 12), 63)] .. (no_padding and "" or "==")
    elseif rest == 2 then
        local a, b = byte(s, len - 1, len)
        local v = bor(lshift(a, 16), lshift(b, 8))
        n = n + 1
        out[n] = enc[rshift(v, 18)] .. enc[band(rshift(v, 12), 63)] .. enc[band(rshift(v, 6), 63)]
            .. (no_padding and "" or "=")
    end
    return concat(out, "", 1, n)
end

-- As nginx decodes: the text up to the first "=" must be base64 letters, and not 4n+1 of
-- them; what follows a "=" is ignored. nil for anything else.
function _M.decode_base64(s)
    if type(s) ~= "string" then
        error("string argument only", 2)
    end
    local len = #s
    local stop = find(s, "=", 1, true)
    if stop then
        len = stop - 1
    end
    if len % 4 == 1 then
        return nil
    end
    local out, n = {}, 0
    local acc, bits = 0, 0
    for i = 1, len do
        local v = dec[byte(s, i)]
        if not v then
            return nil
        end
        acc = bor(lshift(band(acc, 0xffff), 6), v)
        bits = bits + 6
        if bits >= 8 then
            bits = bits - 8
            n = n + 1
            out[n] = char(band(rshift(acc, bits), 255))
        end
    end
    return concat(out, "", 1, n)
end

-- -- Digests --------------------------------------------------------------------------------

local hex = require("moonserve.crypto").hex

function _M.md5_bin(s)
    s = str(s)
    crypto.MD5(s, #s, digest)
    return ffi_str(digest, 16)
end

function _M.md5(s)
    return hex(_M.md5_bin(s))
end

function _M.sha1_bin(s)
    s = str(s)
    crypto.SHA1(s, #s, digest)
    return ffi_str(digest, 20)
end

function _M.hmac_sha1(key, s)
    key = checkstr(key, 1, "hmac_sha1")
    s = checkstr(s, 2, "hmac_sha1")
    crypto.HMAC(sha1, key, #key, s, #s, digest, digest_len)
    return ffi_str(digest, digest_len[0])
end

-- crc32_short and crc32_long differ in nginx only in how they walk the bytes: one answer.
function _M.crc32(s)
    s = str(s)
    return tonumber(zlib.crc32(0, s, #s))
end

-- -- URIs and arguments ---------------------------------------------------------------------

-- type 2 (the default): a URI component, all but A-Z a-z 0-9 - . _ ~; type 0: a URI, only
-- space, "#", "%", "?", control characters and bytes from 0x7f up.
function _M.escape_uri(s, kind)
    s = str(s)
    if kind ~= nil and kind ~= 0 and kind ~= 2 then
        error("\"type\" " .. tostring(kind) .. " out of range", 2)
    end
    if kind == 0 then
        return percent_encode(s, "[%z\1-\32#%%?\127-\255]")
    end
    return codec.escape(s)
end
local escape = _M.escape_uri

-- %XX escapes decoded and "+" as a space; a "%" that starts no escape stays.
function _M.unescape_uri(s)
    return codec.unescape(str(s), true)
end
local unescape = _M.unescape_uri

-- { k = v } as a query string: true gives the bare key, false nothing, a list repeats the key.
-- Keys are sorted, so the answer is stable (OpenResty's follows the table's order).
function _M.encode_args(t)
    if type(t) ~= "table" then
        error("bad argument #1 to 'encode_args' (table expected, got " .. type(t) .. ")", 2)
    end
    local keys = {}
    for k in pairs(t) do
        local tk = type(k)
        if tk ~= "string" and tk ~= "number" then
            error("attempt to use " .. tk .. " as query arg key", 2)
        end
        keys[#keys + 1] = k
    end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    local out, n = {}, 0
    local function add(k, v)
        local tv = type(v)
        if tv == "boolean" then
            if v then
                n = n + 1
                out[n] = k
            end
        elseif tv == "string" or tv == "number" then
            n = n + 1
            out[n] = k .. "=" .. escape(tostring(v))
        else
            error("attempt to use " .. tv .. " as query arg value", 3)
        end
    end
    for _, k in ipairs(keys) do
        local v = t[k]
        local ek = escape(tostring(k))
        if type(v) == "table" then
            for i = 1, #v do
                add(ek, v[i])
            end
        else
            add(ek, v)
        end
    end
    return concat(out, "&", 1, n)
end

-- A query string as { k = v }: a bare key is true, a repeated key a list; at most `max`
-- pairs (default 100; 0: no limit). Also returns how many it read and whether it stopped.
function _M.decode_args(s, max)
    if type(s) ~= "string" then
        error("bad argument #1 to 'decode_args' (string expected, got " .. type(s) .. ")", 2)
    end
    max = max or 100
    local t = {}
    local pos, n, len = 1, 0, #s
    while pos <= len do
        local amp = find(s, "&", pos, true) or len + 1
        if amp > pos then
            if max > 0 and n >= max then
                return t, n, true
            end
            local eq = find(s, "=", pos, true)
            local k, v
            if eq and eq < amp then
                k, v = unescape(sub(s, pos, eq - 1)), unescape(sub(s, eq + 1, amp - 1))
            else
                k, v = unescape(sub(s, pos, amp - 1)), true
            end
            if k ~= "" then
                codec.add_value(t, k, v)
                n = n + 1
            end
        end
        pos = amp + 1
    end
    return t, n, false
end

-- The raw (still escaped) value of argument `name` in a query string, matched without case,
-- as nginx's $arg_NAME.
function _M.arg_raw(s, name)
    if not s then
        return nil
    end
    name = lower(name)
    local pos, len = 1, #s
    while pos <= len do
        local amp = find(s, "&", pos, true) or len + 1
        local eq = find(s, "=", pos, true)
        local k, v
        if eq and eq < amp then
            k, v = sub(s, pos, eq - 1), sub(s, eq + 1, amp - 1)
        else
            k, v = sub(s, pos, amp - 1), ""
        end
        if lower(k) == name then
            return v
        end
        pos = amp + 1
    end
    return nil
end

local SQL = { ["\0"] = "\\0", ["\b"] = "\\b", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t",
    ["\26"] = "\\Z", ["\\"] = "\\\\", ["'"] = "\\'", ['"'] = '\\"' }

-- A MySQL string literal.
function _M.quote_sql_str(s)
    s = checkstr(s, 1, "quote_sql_str")
    return "'" .. gsub(s, "[%z\b\n\r\t\26\\'\"]", SQL) .. "'"
end

return _M
