--- moonserve/redis/url.lua: a Redis client's options from a URL (redis://, rediss://,
-- redis+unix://, redis+sentinel://) and/or a table, checked at once: one error line for
-- anything wrong, with no password in it.
-- @module moonserve.redis.url
local char, format, find, sub = string.char, string.format, string.find, string.sub
local type, tonumber, tostring, pairs, ipairs = type, tonumber, tostring, pairs, ipairs
local floor = math.floor

local _M = {}

--- The defaults: a second for each wait (connect, send, a reply), 32 idle connections a
-- worker kept a minute.
_M.DEFAULTS = { timeout = 1, pool_size = 32, idle_timeout = 60, port = 6379,
    sentinel_port = 26379, db = 0, sentinel_recheck = 1 }

-- The keys a table (or a URL's query) may hold, and what each must be.
local KINDS = {
    url = "string", host = "string", port = "port", db = "db", user = "string",
    password = "string", tls = "boolean", insecure = "boolean", sni = "string",
    path = "string", sentinels = "list", master = "string", sentinel_user = "string",
    sentinel_password = "string", sentinel_recheck = "seconds0", timeout = "seconds",
    pool_size = "count",
    backlog = "count0", idle_timeout = "seconds0",
}
_M.KINDS = KINDS

local function unescape(s)
    return (s:gsub("%%(%x%x)", function(h) return char(tonumber(h, 16)) end))
end

-- The URL as it may be shown: its password replaced (a lone userinfo is the password).
local function shown(url)
    local out, n = url:gsub("^([%w+]+://[^:@/]*:)[^@/]*@", "%1***@")
    if n == 0 then
        out = url:gsub("^([%w+]+://)[^:@/]+@", "%1***@")
    end
    return out
end
_M.shown = shown

local function fail(url, why)
    if url then
        return nil, format("redis: bad URL %q: %s", shown(url), why)
    end
    return nil, "redis: " .. why
end

-- A "host[:port]" or "[v6]:port": host, port (default_port when absent), or nil.
local function host_port(s, default_port)
    local h, p = s:match("^%[([^%]]+)%]:?(%d*)$")
    if not h then
        h, p = s:match("^([^:%[%]]+):?(%d*)$")
    end
    if not h or h == "" then
        return nil
    end
    if p == "" then
        return unescape(h), default_port
    end
    p = tonumber(p)
    if p < 1 or p > 65535 then
        return nil
    end
    return unescape(h), p
end
_M.host_port = host_port

-- userinfo as redis-cli reads it: "user:password", or ":password", or "password" alone.
local function userinfo(o, auth)
    local user, password = auth:match("^([^:]*):(.*)$")
    if user then
        if user ~= "" then
            o.user = unescape(user)
        end
        o.password = unescape(password)
    elseif auth ~= "" then
        o.password = unescape(auth)
    end
end

local BOOLS = { ["1"] = true, ["true"] = true, yes = true, ["0"] = false, ["false"] = false,
    no = false }

--- Parses a URL into a table of options (the keys of KINDS), or nil and an error line.
function _M.parse(url)
    if type(url) ~= "string" then
        return nil, "redis: a URL (string) expected, got " .. type(url)
    end
    local scheme, rest = url:match("^([%a+]+)://(.*)$")
    if not scheme then
        return fail(url, "not redis://, rediss://, redis+unix:// or redis+sentinel://")
    end
    scheme = scheme:lower()
    local o = {}
    local query
    local q = find(rest, "?", 1, true)
    if q then
        rest, query = sub(rest, 1, q - 1), sub(rest, q + 1)
    end
    if find(rest, "#", 1, true) then
        return fail(url, "a fragment (#) has no meaning here")
    end
    local auth, hostpart = rest:match("^(.*)@([^@]*)$")
    if auth then
        userinfo(o, auth)
    else
        hostpart = rest
    end
    if scheme == "redis" or scheme == "rediss" then
        o.tls = scheme == "rediss"
        local hp, db = hostpart:match("^([^/]*)/?(.*)$")
        local h, p = host_port(hp, _M.DEFAULTS.port)
        if not h then
            return fail(url, "bad host or port " .. format("%q", hp))
        end
        o.host, o.port = h, p
        if db ~= "" then
            o.db = db
        end
    elseif scheme == "redis+unix" or scheme == "unix" then
        if sub(hostpart, 1, 1) ~= "/" then
            return fail(url, "a socket's absolute path expected: redis+unix:///run/redis.sock")
        end
        o.path = unescape(hostpart)
    elseif scheme == "redis+sentinel" or scheme == "rediss+sentinel" then
        o.tls = scheme == "rediss+sentinel"
        local list, master, db = hostpart:match("^([^/]*)/([^/]+)/?(.*)$")
        if not list or list == "" then
            return fail(url, "redis+sentinel://host:port,host:port/MASTER expected")
        end
        o.sentinels = {}
        for item in list:gmatch("[^,]+") do
            if not host_port(item, _M.DEFAULTS.sentinel_port) then
                return fail(url, "bad sentinel address " .. format("%q", item))
            end
            o.sentinels[#o.sentinels + 1] = item
        end
        o.master = unescape(master)
        if db ~= "" then
            o.db = db
        end
    else
        return fail(url, "unknown scheme " .. format("%q", scheme)
            .. " (redis, rediss, redis+unix or redis+sentinel)")
    end
    if query and query ~= "" then
        for pair in query:gmatch("[^&]+") do
            local k, v = pair:match("^([^=]*)=?(.*)$")
            k, v = unescape(k), unescape(v)
            local kind = KINDS[k]
            if not kind or k == "url" or k == "sentinels" or k == "host" or k == "port"
                or k == "path" or k == "master" then
                return fail(url, "unknown query key " .. format("%q", k))
            end
            if kind == "boolean" then
                if BOOLS[v] == nil then
                    return fail(url, k .. " must be 1 or 0")
                end
                v = BOOLS[v]
            elseif kind ~= "string" then
                local n = tonumber(v)
                if not n then
                    return fail(url, k .. " must be a number")
                end
                v = n
            end
            o[k] = v
        end
    end
    return o
end

-- Checks one option; nil when good, else why not.
local function check(k, v)
    local kind = KINDS[k]
    if not kind then
        return "unknown option " .. format("%q", tostring(k))
    end
    local t = type(v)
    if kind == "string" then
        if t ~= "string" then
            return k .. " must be a string"
        end
    elseif kind == "boolean" then
        if t ~= "boolean" then
            return k .. " must be true or false"
        end
    elseif kind == "list" then
        if t ~= "table" or #v == 0 then
            return k .. " must be a list of \"host:port\""
        end
        for _, s in ipairs(v) do
            if type(s) ~= "string" or not host_port(s, 1) then
                return "bad sentinel address " .. format("%q", tostring(s))
            end
        end
    elseif kind == "db" then
        v = tonumber(v)
        if not v or v < 0 or v % 1 ~= 0 or v > 2147483647 then
            return "db must be a non-negative integer"
        end
    else
        if t ~= "number" or v ~= v then
            return k .. " must be a number"
        end
        if kind == "port" and (v < 1 or v > 65535 or v % 1 ~= 0) then
            return "port must be 1-65535"
        elseif kind == "seconds" and (v <= 0 or v > 86400) then
            return k .. " must be more than 0 seconds (a day at most)"
        elseif kind == "seconds0" and (v < 0 or v > 86400) then
            return k .. " must be 0 or more seconds (a day at most)"
        elseif kind == "count" and (v < 1 or v % 1 ~= 0) then
            return k .. " must be a positive integer"
        elseif kind == "count0" and (v < 0 or v % 1 ~= 0) then
            return k .. " must be a non-negative integer"
        end
    end
    return nil
end

--- The options of a client from a URL or a table (which may hold url), and optional extra
-- options over them; checked, with the defaults: a table, or nil and one error line.
function _M.options(spec, extra)
    local o, url = {}
    if type(spec) == "string" then
        url = spec
    elseif type(spec) == "table" then
        url = spec.url
    elseif spec == nil then
        return nil, "redis: no URL or options given (nil)"
    else
        return nil, "redis: a URL or a table of options expected, got " .. type(spec)
    end
    if url ~= nil then
        local parsed, err = _M.parse(url)
        if not parsed then
            return nil, err
        end
        for k, v in pairs(parsed) do
            o[k] = v
        end
    end
    for _, t in ipairs { type(spec) == "table" and spec or {}, extra or {} } do
        if type(t) ~= "table" then
            return nil, "redis: options must be a table"
        end
        for k, v in pairs(t) do
            if k ~= "url" then
                o[k] = v
            end
        end
    end
    for k, v in pairs(o) do
        local why = check(k, v)
        if why then
            return fail(url, why)
        end
    end
    o.db = floor(tonumber(o.db or 0))
    if o.sentinels then
        if not o.master then
            return fail(url, "sentinels given without the master's name (master)")
        end
        if o.path then
            return fail(url, "a unix socket and sentinels cannot go together")
        end
    elseif o.master then
        return fail(url, "master given without sentinels")
    elseif o.path then
        if o.tls then
            return fail(url, "TLS over a unix socket is not spoken here")
        end
    elseif not o.host then
        return fail(url, "no host, path or sentinels")
    end
    if o.user and not o.password then
        return fail(url, "a user without a password")
    end
    if o.sentinel_user and not o.sentinel_password then
        return fail(url, "a sentinel_user without a sentinel_password")
    end
    for k, v in pairs(_M.DEFAULTS) do
        if o[k] == nil and k ~= "sentinel_port" and (k ~= "port" or o.host) then
            o[k] = v
        end
    end
    o.url = url and shown(url)
    return o
end

return _M
