-- moonserve/canon.lua: the one canonical form of a request path, so that each resource has
-- one URL: no empty or dot segments, unreserved bytes unescaped, escapes in upper case, bytes
-- a URL may not hold escaped, and one trailing-slash policy.
local byte, char, find, format, gsub, sub = string.byte, string.char, string.find,
    string.format, string.gsub, string.sub

local host = require "moonserve.host"

local _M = {}

-- Unreserved (RFC 3986 2.3) escapes become the byte; other escapes get upper-case digits.
local function fix_escape(hex)
    local c = tonumber(hex, 16)
    if (c >= 0x30 and c <= 0x39) or (c >= 0x41 and c <= 0x5a) or (c >= 0x61 and c <= 0x7a)
        or c == 0x2d or c == 0x2e or c == 0x5f or c == 0x7e then
        return char(c)
    end
    return format("%%%02X", c)
end

-- Bytes a path may not hold as they are (RFC 3986 3.3: pchar, "/" and the "%" of escapes):
-- the core lets `\ " < > ^ ` { | }` through, and a redirect must not pass them on. A browser
-- reads "/\evil.test" in a Location as "//evil.test", another host.
local NOT_PATH = "[^%w%-%._~!$&'()*+,;=:@/%%]"

local function escape_byte(c)
    return format("%%%02X", byte(c))
end

-- RFC 3986 5.2.4, on a path of segments: "." goes, ".." takes the previous segment with it
-- (never above the root), empty segments (from "//") go; a trailing slash is kept apart.
local function resolve(path)
    local out, n = {}, 0
    local trailing = sub(path, -1) == "/" or sub(path, -2) == "/." or sub(path, -3) == "/.."
    for seg in path:gmatch("[^/]+") do
        if seg == ".." then
            if n > 0 then
                out[n] = nil
                n = n - 1
            end
        elseif seg ~= "." then
            n = n + 1
            out[n] = seg
        end
    end
    local p = "/" .. table.concat(out, "/")
    if trailing and n > 0 then
        p = p .. "/"
    end
    return p
end

-- The canonical form of `path` under `trailing` ("strip": "/a/" -> "/a", "add": "/a" ->
-- "/a/", "keep": as it comes). Returns the path itself when it is canonical already, so
-- callers compare with ==. Cheap on the common path: a look at each byte (by the host: in C,
-- for the core), three plain searches and a look at the last byte.
function _M.path(path, trailing)
    local canon = path
    if not host.path_plain(path) then
        canon = gsub(canon, NOT_PATH, escape_byte)
    end
    if find(canon, "%", 1, true) then
        canon = gsub(canon, "%%(%x%x)", fix_escape)
    end
    if find(canon, "//", 1, true) or find(canon, "/.", 1, true) then
        canon = resolve(canon)
    end
    local last = byte(canon, -1)
    if trailing == "strip" then
        if last == 47 and #canon > 1 then -- "/"
            canon = sub(canon, 1, -2)
        end
    elseif trailing == "add" then
        if last ~= 47 and not find(canon, "%.[^/]*$") then -- not for "file.ext"
            canon = canon .. "/"
        end
    end
    return canon
end

return _M
