--- moonserve/ratelimit.lua: rate limits: at most `limit` requests in any `window` seconds per
-- key (client address, user, route or the app's own), counted by the workers of an instance
-- (a shared dictionary) or by a whole fleet (one Redis script).
--
-- Both modes keep a sliding log: the times of the admissions still inside the window. A
-- request passes when fewer than `limit` admissions happened in the last `window` seconds,
-- and only a passing request is recorded, so no span of `window` seconds ever holds more than
-- `limit` admissions for a key: no burst at a window's edge, as fixed windows allow (twice the
-- limit), and no extra request after a burst, as GCRA with a burst of `limit` allows. Local
-- mode checks and records under the dictionary's lock (to the millisecond); fleet mode in one
-- Lua script on Redis, timed by Redis's own clock (TIME, to the microsecond), so the instances'
-- clocks do not matter and the fleet admits exactly `limit`.
--
-- Replies carry the fields of draft-ietf-httpapi-ratelimit-headers-11: `RateLimit-Policy:
-- "name";q=limit;w=window` and `RateLimit: "name";r=remaining;t=seconds`; a refusal is 429
-- with Retry-After, through the app's error page for 429 (Accept-aware).
-- @module moonserve.ratelimit
local log = require "moonserve.log"
local shared = require "moonserve.shared"

local type, tostring, tonumber, pairs, error = type, tostring, tonumber, pairs, error
local ceil, floor, format = math.ceil, math.floor, string.format
local find, match, gmatch = string.find, string.match, string.gmatch
local rawget, setmetatable = rawget, setmetatable

local _M = {}

local DICT, DICT_BYTES = "ratelimit", 1024 * 1024  -- the dictionary local limiters share
local LOCAL_MAX = 65536   -- admissions a local log holds (8 bytes each): shdict's bound
-- Admissions a fleet limit keeps per key: a sorted set of about 100 bytes an admission in
-- Redis, so some 10 MB for a key at its limit (and there is a key per client address).
local FLEET_MAX = 100000
local KEY_MAX = 256       -- a longer key (the app's own) is kept as its SHA-256
local KINDS = { client_ip = true, user = true, route = true }
local OPTIONS = { key = true, limit = true, window = true, fleet = true, on_error = true,
    dict = true, name = true, prefix = true, headers = true }

-- -- The fleet's script ----------------------------------------------------------------------
-- KEYS[1]: the key's sorted set of admission times (microseconds on Redis's clock, as scores).
-- ARGV: limit, window in microseconds. Returns { admitted (1|0), remaining, microseconds until
-- the oldest admission counted leaves the window }. Redis runs a script alone, so check and
-- record are one step for every instance; TIME is Redis's clock (allowed in scripts since
-- Redis 5, whose effect replication writes the ZADD, not the script).
local SCRIPT = [[
local key, limit, window = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local n = redis.call('ZCARD', key)
local ok = 0
if n < limit then
  redis.call('ZADD', key, now, string.format('%d-%d', now, n)) -- (now .. would round it)
  redis.call('PEXPIRE', key, math.ceil(window / 1000))
  n, ok = n + 1, 1
end
local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
return { ok, limit - n, tonumber(oldest[2]) + window - now }
]]

-- -- Options ---------------------------------------------------------------------------------

local function bad(msg)
    error("ratelimit: " .. msg, 3)
end

local function is_client(v)
    return type(v) == "table" and type(v.eval) == "function"
end

-- The options checked, with their defaults: every mistake raises here, when the app loads
-- (at start and under --check), never at the first request.
local function check(opts)
    if type(opts) ~= "table" then
        bad("options expected ({ key =, limit =, window = })")
    end
    for k in pairs(opts) do
        if not OPTIONS[k] then
            bad("unknown option " .. tostring(k) .. " (accepted: key, limit, window, fleet, "
                .. "on_error, dict, name, prefix, headers)")
        end
    end
    local key = opts.key or "client_ip"
    if not (KINDS[key] or type(key) == "function") then
        bad("bad key " .. tostring(key) .. " (\"client_ip\", \"user\", \"route\" or "
            .. "function(req) expected)")
    end
    local limit, window = opts.limit, opts.window
    if type(limit) ~= "number" or limit < 1 or limit % 1 ~= 0 then
        bad("bad limit " .. tostring(limit) .. " (a whole number of requests, 1 or more)")
    end
    if type(window) ~= "number" or window ~= window or window < 0.001 or window > 86400 * 366 then
        bad("bad window " .. tostring(window) .. " (seconds, 0.001 to a year)")
    end
    local on_error = opts.on_error or "open"
    if on_error ~= "open" and on_error ~= "closed" then
        bad("bad on_error " .. tostring(on_error) .. " (\"open\" or \"closed\")")
    end
    local fleet = opts.fleet
    if fleet ~= nil and type(fleet) ~= "string" and not is_client(fleet) then
        bad("bad fleet (a redis:// URL or a moonserve.redis client expected)")
    end
    if fleet == nil and limit > LOCAL_MAX then
        bad("limit " .. limit .. " is more than a local limit keeps (" .. LOCAL_MAX
            .. "): use fleet = REDIS_URL, or a shorter window and a smaller limit")
    end
    if fleet ~= nil and limit > FLEET_MAX then
        bad("limit " .. limit .. " is more than a fleet limit keeps (" .. FLEET_MAX
            .. " a key, some 100 bytes each in Redis): use a shorter window and a smaller limit")
    end
    if opts.dict ~= nil and fleet ~= nil then
        bad("dict is for the local mode; fleet counts in Redis")
    end
    local dict = opts.dict or DICT
    local ok, err = shared.check_name(dict)
    if not ok then
        bad(err)
    end
    local kind = type(key) == "string" and key or "key"
    local name = opts.name or format("%s-%d-%s", kind, limit, tostring(window))
    if type(name) ~= "string" or name == "" or name:find("[%c\"\\]") then
        bad("bad name (a string without quotes, backslashes or control characters)")
    end
    local prefix = opts.prefix or "moonserve:ratelimit:"
    if type(prefix) ~= "string" then
        bad("bad prefix (string expected)")
    end
    return { key = key, limit = limit, window = window, on_error = on_error, fleet = fleet,
        dict = dict, name = name, prefix = prefix, headers = opts.headers ~= false }
end

-- -- Limiters --------------------------------------------------------------------------------

local Limiter = {}
Limiter.__index = Limiter

--- A limiter for use in handlers: `opts` as the middleware's (key is not needed: take() is
-- given the key). Raises on a bad option.
-- @usage local limiter = moonserve.ratelimit.new{ limit = 5, window = 60, fleet = url }
-- local ok, info = limiter:take("login:" .. form.email)
-- if not ok then return res:status(429):send("try again in " .. info.retry_after .. " s") end
function _M.new(opts)
    local o = check(opts)
    local self = setmetatable(o, Limiter)
    if type(o.fleet) == "string" then
        local client, err = require("moonserve.redis").new(o.fleet)
        if not client then
            bad("bad fleet: " .. tostring(err))
        end
        self.redis = client
    elseif o.fleet then
        self.redis = o.fleet
    else
        -- The host declares the dictionary when the app did not: 1 MiB (some 8,000 keys at
        -- a limit of 10), or room for four logs of this limit (a log takes a block of the
        -- next power of two above 8 bytes an admission); a size of the app's own wins.
        local block = 128
        while block < 8 * o.limit + 128 do
            block = block * 2
        end
        shared.want(o.dict, block * 4 > DICT_BYTES and block * 4 or DICT_BYTES)
    end
    if self.redis then
        self.script = require("moonserve.redis").script(SCRIPT)
        local ok, err = require("moonserve.redis").claim_prefix(self.redis,
            o.prefix .. o.name .. ":", "rate limit '" .. o.name .. "'")
        if not ok then
            error("ratelimit: " .. err, 2)
        end
    end
    self.down = false -- Redis failed last time: logged once until it answers again
    self.policy = format("\"%s\";q=%d;w=%d", o.name, o.limit, ceil(o.window))
    self.field_head = format("\"%s\";r=", o.name)
    self.key_prefix = o.prefix .. o.name .. ":"
    self.args = { o.limit, floor(o.window * 1e6) } -- the script's, the same every call
    return self
end

-- (No function is made in here: LuaJIT does not compile the return of a function that makes
-- one, and every limited request comes through.)
local function stored_key(self, key)
    if #key > KEY_MAX then
        local crypto = require "moonserve.crypto"
        -- ("#" marks it: no key of 64 hex digits the app gives can meet a hashed one)
        key = "#" .. crypto.hex(crypto.sha256(key))
    end
    return self.key_prefix .. key
end

-- Redis failed: logged once an outage (per worker).
local function redis_failed(self, err)
    if not self.down then
        self.down = true
        log.error("ratelimit ", self.name, ": redis failed (", tostring(err), "); ",
            self.on_error == "open" and "admitting requests" or "refusing requests with 503",
            " until it answers (on_error = \"", self.on_error, "\")")
    end
end

-- The count of one request under `key`, without a table (the middleware's path): admitted,
-- remaining, whole seconds until one more is open; or nil and Redis's error.
local function count(self, key)
    local k = stored_key(self, key)
    local ok, remaining, wait
    if self.redis then
        local r, err = self.redis:eval(self.script, { k }, self.args)
        if type(r) ~= "table" then
            err = tostring(err or "bad reply")
            redis_failed(self, err)
            return nil, err
        end
        if self.down then
            self.down = false
            log.info("ratelimit ", self.name, ": redis answers again")
        end
        ok, remaining, wait = r[1] == 1, tonumber(r[2]), tonumber(r[3]) / 1e6
    else
        local dict = self.dict_obj or shared.dicts[self.dict]
        if not dict or not dict.window_take then
            -- (inside nginx, lua_shared_dict zones have no sliding log: count in Redis there)
            error("ratelimit " .. self.name .. ": the local mode needs moonserve's shared "
                .. "dictionary " .. self.dict .. " (inside nginx, give fleet = REDIS_URL)", 3)
        end
        self.dict_obj = dict
        ok, remaining, wait = dict:window_take(k, self.limit, self.window)
        if ok == nil then
            -- (no memory: the dictionary is full of live logs; a bigger one is the cure)
            error("ratelimit " .. self.name .. ": " .. tostring(remaining) .. " in shared "
                .. "dictionary " .. self.dict .. " (declare it larger: app:shared_dict)", 3)
        end
    end
    local secs = ceil(wait)
    if secs < 1 and not ok then
        secs = 1 -- Retry-After is whole seconds (RFC 9110 10.2.3); 0 would invite a storm
    end
    return ok, remaining, secs
end

--- Counts a request under `key` (a string). Returns true when it may pass, or false; and a
-- table: limit, remaining (requests still open now), reset (whole seconds until the oldest
-- admission counted leaves the window), retry_after (on a refusal: whole seconds to wait),
-- and, when Redis failed, error (then the first result is what on_error says: true for
-- "open", false for "closed"). In fleet mode the call waits for Redis (one round trip),
-- at most the client's timeout.
function Limiter:take(key)
    if type(key) ~= "string" then
        error("bad rate limit key (string expected, got " .. type(key) .. ")", 2)
    end
    local ok, remaining, secs = count(self, key)
    if ok == nil then
        return self.on_error == "open", { limit = self.limit, remaining = self.limit,
            reset = ceil(self.window), error = remaining }
    end
    return ok, { limit = self.limit, remaining = remaining, reset = secs,
        retry_after = (not ok) and secs or nil }
end

local function add_fields(self, res, remaining, reset)
    res:header("ratelimit-policy", self.policy)
    res:header("ratelimit", self.field_head .. remaining .. ";t=" .. reset)
end

--- Adds the draft's fields to `res` for what take() returned: RateLimit-Policy and
-- RateLimit.
function Limiter:fields(res, info)
    add_fields(self, res, info.remaining, info.reset)
end

-- -- The middleware ----------------------------------------------------------------------------

-- The user a request is for: req.user (a table's id), else the session's "user" (the same), or
-- nil.
local function user_of(req)
    local u = rawget(req, "user")
    if u == nil then
        local s = rawget(req, "session")
        u = s and s:get("user")
    end
    if type(u) == "table" then
        u = u.id
    end
    if u == nil then
        return nil
    end
    return tostring(u)
end

-- An IPv6 client counts by its /64: one host is commonly given a whole /64, so one address
-- each would let it pick a fresh key for every request (and fill the store).
local function net_of(ip)
    if not find(ip, ":", 1, true) then
        return ip
    end
    local v4 = match(ip, "^::[fF][fF][fF][fF]:(%d+%.%d+%.%d+%.%d+)$")
    if v4 then
        return v4
    end
    local head, tail = match(ip, "^(.-)::(.*)$")
    local groups = {}
    for g in gmatch(head or ip, "[^:]+") do
        groups[#groups + 1] = g
    end
    if head then
        local n = 0
        for _ in gmatch(tail, "[^:]+") do
            n = n + 1
        end
        for _ = 1, 8 - #groups - n do
            groups[#groups + 1] = "0"
        end
        for g in gmatch(tail, "[^:]+") do
            groups[#groups + 1] = g
        end
    end
    return format("%x:%x:%x:%x::/64", tonumber(groups[1] or "0", 16) or 0,
        tonumber(groups[2] or "0", 16) or 0, tonumber(groups[3] or "0", 16) or 0,
        tonumber(groups[4] or "0", 16) or 0)
end

local function key_of(self, req)
    local kind = self.key
    if kind == "client_ip" then
        return "ip:" .. net_of(req.client_ip or "")
    elseif kind == "user" then
        local u = user_of(req)
        -- A request with no user is counted by its address: anonymous traffic is limited too.
        return u and ("user:" .. u) or ("ip:" .. net_of(req.client_ip or ""))
    elseif kind == "route" then
        local route = rawget(req, "_route")
        if route == nil then
            return "route:" .. req.method .. " (none)"
        end
        return "route:" .. req.method .. " " .. (route.name or route.path)
    end
    local k = kind(req)
    if k ~= nil and type(k) ~= "string" then
        k = tostring(k)
    end
    return k
end

-- A refusal in the app's shape: its error page for the status when it has one, else its
-- default page (text, JSON or HTML by the Accept field).
local function refuse(req, res, status)
    local app = rawget(req, "_app")
    if type(app) == "table" and app.error then
        return app:error(req, res, { status = status })
    end
    return res:status(status):send(status == 429 and "429 Too Many Requests\n"
        or "503 Service Unavailable\n")
end

--- Middleware (moonserve.ratelimit{...}): at most opts.limit requests in any opts.window
-- seconds per key. opts.key: "client_ip" (default), "user" (req.user, else the session's
-- "user", a table's id; no user: the client's address), "route" (the route matched, with the
-- method) or function(req) returning a string (nil: the request is not limited). opts.fleet:
-- a redis:// URL or a moonserve.redis client: the count is the fleet's; without, the
-- instance's (opts.dict, a shared dictionary, "ratelimit" by default, declared for the app if
-- it did not). opts.on_error ("open"): what a request gets when Redis fails, "open" passes it,
-- "closed" answers 503 with Retry-After: 1. opts.name: the policy's name in the fields, and
-- what separates the counts of limiters with the same key, limit and window (default
-- "KIND-LIMIT-WINDOW"). opts.headers = false: no RateLimit fields on admitted replies.
function _M.middleware(opts)
    local self = _M.new(opts)
    return function(req, res, next)
        local key = key_of(self, req)
        if key == nil then
            return next()
        end
        local ok, remaining, secs = count(self, key)
        if ok then
            if self.headers then
                add_fields(self, res, remaining, secs)
            end
            return next()
        elseif ok == nil then -- Redis failed
            if self.on_error == "open" then
                return next()
            end
            res:header("retry-after", "1")
            return refuse(req, res, 503)
        end
        add_fields(self, res, remaining, secs)
        res:header("retry-after", tostring(secs))
        return refuse(req, res, 429)
    end
end

return setmetatable(_M, { __call = function(_, opts) return _M.middleware(opts) end })
