--- moonserve/password.lua: password hashing with argon2id (moonserve/argon2.lua, Debian's
-- libargon2), run on the "default" thread pool so that the loop goes on serving while a hash
-- computes. The parameters are in the hash string, so they can rise later: verify says when
-- a stored hash was made with less than today's and should be made again.
-- @module moonserve.password
local host = require "moonserve.host"

local type, tonumber, tostring, error, pairs = type, tonumber, tostring, error, pairs

local _M = {}

--- The parameters new hashes get: t passes, m KiB of memory, p lanes (RFC 9106 4 and OWASP's
-- minimum for argon2id: 19 MiB, 2 passes, 1 lane; tens of milliseconds a hash).
_M.defaults = { t = 2, m = 19456, p = 1 }

local LIMITS = { t = { 1, 64 }, m = { 8, 4194304 }, p = { 1, 16 } }

local function run(fn, ...)
    return host.module("threads").run("default", "moonserve.argon2", fn, ...)
end

--- The argon2id hash of `pw` ("$argon2id$v=19$m=...,t=...,p=...$salt$hash"). opts may set t, m
-- and p (the defaults: moonserve.password.defaults). Returns the hash, or nil and an error.
function _M.hash(pw, opts)
    if type(pw) ~= "string" then
        error("bad argument #1 to 'hash' (string expected)", 2)
    end
    local o = { t = _M.defaults.t, m = _M.defaults.m, p = _M.defaults.p }
    if opts ~= nil then
        if type(opts) ~= "table" then
            error("bad argument #2 to 'hash' (table expected)", 2)
        end
        for k, v in pairs(opts) do
            local lim = LIMITS[k]
            if not lim then
                error("bad argument #2 to 'hash' (unknown option '" .. tostring(k) .. "')", 2)
            end
            if type(v) ~= "number" or v % 1 ~= 0 or v < lim[1] or v > lim[2] then
                error("bad argument #2 to 'hash' (" .. k .. " must be an integer from " .. lim[1]
                    .. " to " .. lim[2] .. ")", 2)
            end
            o[k] = v
        end
    end
    local ok, res = run("hash", pw, o.t, o.m, o.p)
    if not ok then
        return nil, res
    end
    return res
end

--- Whether the hash's parameters are below today's defaults (or its version older).
function _M.needs_rehash(encoded)
    local v, m, t, p = encoded:match("^%$argon2id%$v=(%d+)%$m=(%d+),t=(%d+),p=(%d+)%$")
    if not v then
        return true
    end
    local d = _M.defaults
    return tonumber(v) < 19 or tonumber(m) < d.m or tonumber(t) < d.t or tonumber(p) < d.p
end

--- Whether `pw` matches `encoded` (a hash of moonserve.password.hash), compared in constant
-- time by libargon2. Returns true and whether the hash should be made again with today's
-- parameters (see needs_rehash), false for a wrong password, or nil and an error for a hash
-- that is not argon2id.
function _M.verify(pw, encoded)
    if type(pw) ~= "string" then
        error("bad argument #1 to 'verify' (string expected)", 2)
    end
    if type(encoded) ~= "string" then
        error("bad argument #2 to 'verify' (string expected)", 2)
    end
    local ok, res = run("verify", pw, encoded)
    if not ok then
        return nil, res
    end
    if not res then
        return false
    end
    return true, _M.needs_rehash(encoded)
end

return _M
