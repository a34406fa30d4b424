--- moonserve/argon2.lua: argon2id through Debian's libargon2 (libargon2-1), for
-- moonserve.password; it runs inside a thread pool's states (moonserve.run_worker_thread), never
-- on the loop: a hash is memory-hard and takes tens of milliseconds by design.
-- @module moonserve.argon2
local ffi = require "ffi"

ffi.cdef [[
int argon2id_hash_encoded(uint32_t t_cost, uint32_t m_cost, uint32_t parallelism,
                          const void *pwd, size_t pwdlen, const void *salt, size_t saltlen,
                          size_t hashlen, char *encoded, size_t encodedlen);
int argon2id_verify(const char *encoded, const void *pwd, size_t pwdlen);
const char *argon2_error_message(int error_code);
long getrandom(void *buf, size_t buflen, unsigned int flags);
]]

-- The unversioned name comes with libargon2-dev only; the run-time package has the .so.1.
local ok, lib = pcall(ffi.load, "argon2")
if not ok then
    lib = ffi.load("libargon2.so.1")
end

local _M = {}

local SALT_BYTES, HASH_BYTES = 16, 32
local VERIFY_MISMATCH = -35 -- ARGON2_VERIFY_MISMATCH

local function fail(rc)
    error("argon2: " .. ffi.string(lib.argon2_error_message(rc)), 0)
end

--- The encoded argon2id hash of `pw` ("$argon2id$v=19$m=...,t=...,p=...$salt$hash") with `t`
-- passes, `m` KiB of memory and `p` lanes, over a fresh salt from the system's random source
-- (getrandom(2)).
function _M.hash(pw, t, m, p)
    local salt = ffi.new("uint8_t[?]", SALT_BYTES)
    if ffi.C.getrandom(salt, SALT_BYTES, 0) ~= SALT_BYTES then
        error("argon2: no random salt (getrandom failed)", 0)
    end
    local out = ffi.new("char[?]", 256)
    local rc = lib.argon2id_hash_encoded(t, m, p, pw, #pw, salt, SALT_BYTES, HASH_BYTES, out, 256)
    if rc ~= 0 then
        fail(rc)
    end
    return ffi.string(out)
end

--- Whether `pw` matches the encoded hash (argon2's comparison takes the same time for every
-- mismatch). Raises for a hash that is not argon2id.
function _M.verify(pw, encoded)
    local rc = lib.argon2id_verify(encoded, pw, #pw)
    if rc == 0 then
        return true
    elseif rc == VERIFY_MISMATCH then
        return false
    end
    fail(rc)
end

return _M
