--- moonserve/redis/dict.lua: a shared dictionary that lives in Redis
-- (`app:shared_dict(name, { redis = URL })`), with the methods of a local one, each one round
-- trip (a command, or a script where one command is not enough) and atomic across every
-- worker of every instance; expiry is Redis' own.
--
-- A value is stored as one Redis string: a finite number as its decimal text ("%.17g", so
-- that INCRBY works on it and other clients read it), anything else behind a tag byte (s
-- string, b boolean, t table in LuaJIT's string.buffer encoding, as the local dictionaries
-- keep tables, n a number that is not finite), upper case with "<flags>:" after it when the
-- value has flags (a number with flags too: "N7:42"). List items are encoded the same way.
-- @module moonserve.redis.dict
local buffer = require "string.buffer"
local redis = require "moonserve.redis"

local byte, sub, find, format, gsub, upper = string.byte, string.sub, string.find,
    string.format, string.gsub, string.upper
local type, tonumber, tostring, error, setmetatable, pairs, next = type, tonumber, tostring,
    error, setmetatable, pairs, next
local floor = math.floor
local encode, decode = buffer.encode, buffer.decode
local null, is_error = redis.null, redis.is_error

local _M = {}

--- The limits each Redis dictionary holds its keys and values to (limits redis_key_bytes and
-- redis_value_bytes; the core's host sets them from the server's limits).
_M.limits = { redis_key_bytes = 65535, redis_value_bytes = 1048576 }

local Dict = {}
Dict.__index = Dict
_M.Dict = Dict

-- The options app:shared_dict takes beside `redis` (the client's, and these).
local OWN = { redis = true, prefix = true, cache = true }

-- -- The local cache ---------------------------------------------------------------------
-- With `cache = { ttl =, size = }`, each worker keeps what get read, as Redis stored it, for
-- at most ttl seconds and size entries; every write through any instance's dictionary
-- broadcasts its key (moonserve.broadcast over the same Redis), and each worker drops it;
-- after the broadcast's subscription comes back from an outage, each worker drops them all
-- (messages may have been missed).

local function cache_options(name, c)
    if type(c) ~= "table" then
        return nil, "shared dictionary '" .. name .. "': cache must be a table { ttl =, size = }"
    end
    for k, v in pairs(c) do
        if k ~= "ttl" and k ~= "size" then
            return nil, "shared dictionary '" .. name .. "': unknown cache option "
                .. format("%q", tostring(k))
        end
        if type(v) ~= "number" or v <= 0 or v ~= v or (k == "size" and v % 1 ~= 0) then
            return nil, "shared dictionary '" .. name .. "': cache " .. k .. " must be a "
                .. (k == "size" and "positive integer" or "number of seconds above 0")
        end
    end
    return { ttl = c.ttl or 1, size = c.size or 1000 }
end

local now = os.time -- (replaced by the host's clock at the first use)

local function clock()
    local host = require "moonserve.host"
    now = host.now
    return now()
end

-- `drops` counts invalidations: a GET that one crossed (its reply may hold the value from
-- before the write) is not cached.
local function cache_clear(self)
    self.cached, self.ncached = {}, 0
    self.drops = (self.drops or 0) + 1
end

local function cache_drop(self, data)
    self.drops = self.drops + 1
    if data == "*" then
        cache_clear(self)
    elseif sub(data, 1, 1) == "k" then
        local key = sub(data, 2)
        if self.cached[key] then
            self.cached[key] = nil
            self.ncached = self.ncached - 1
        end
    end
end

-- A write went through: this worker drops the key now, every other when the broadcast comes.
local function written(self, key)
    local b = self.broadcast
    if b then
        cache_drop(self, key and ("k" .. key) or "*")
        b:broadcast(key and ("k" .. key) or "*")
    end
end

local function cache_put(self, key, raw)
    local cached = self.cached
    if not cached[key] then
        if self.ncached >= self.cache.size then
            -- full: one entry goes (whichever next() gives: a bound, not an LRU)
            local victim = next(cached)
            cached[victim] = nil
        else
            self.ncached = self.ncached + 1
        end
    end
    cached[key] = { raw = raw, until_ = (now == os.time and clock() or now()) + self.cache.ttl }
end

--- A dictionary `name` on the Redis that `opts.redis` names (a URL or a table of
-- moonserve.redis options), its keys under `opts.prefix` (default "NAME:"; refused when it
-- starts, or starts with, another dictionary's, session store's or rate limit's prefix on
-- the same server and db); other keys of opts are the client's options (timeout,
-- pool_size, ...). Returns the dictionary, or nil and one line saying what is wrong.
function _M.new(name, opts)
    local spec = opts.redis
    if spec == nil then
        return nil, "shared dictionary '" .. name .. "': redis is nil (an unset environment "
            .. "variable?): a URL or a table expected"
    end
    local extra = {}
    for k, v in pairs(opts) do
        if not OWN[k] then
            extra[k] = v
        end
    end
    if opts.prefix ~= nil and type(opts.prefix) ~= "string" then
        return nil, "shared dictionary '" .. name .. "': prefix must be a string"
    end
    local client, err = redis.new(spec, extra)
    if not client then
        return nil, "shared dictionary '" .. name .. "': " .. err
    end
    local self = setmetatable({ name = name, redis = client,
        prefix = opts.prefix or (name .. ":") }, Dict)
    local ok
    ok, err = redis.claim_prefix(client, self.prefix, "shared dictionary '" .. name .. "'")
    if not ok then
        return nil, err
    end
    if opts.cache ~= nil then
        self.cache, err = cache_options(name, opts.cache)
        if not self.cache then
            return nil, err
        end
        cache_clear(self)
        local b = require("moonserve.fanout").broadcast("moonserve.dict." .. name,
            { redis = client })
        b:subscribe(function(data) cache_drop(self, data) end)
        b:on_reset(function() cache_clear(self) end)
        self.broadcast = b
    end
    return self
end

-- -- Values --------------------------------------------------------------------------------

local TAGS = { string = "s", number = "n", boolean = "b", table = "t" }

local function check_flags(flags)
    if flags ~= nil and (type(flags) ~= "number" or flags < 0 or flags % 1 ~= 0
        or flags > 4294967295) then
        error("bad flags (an unsigned integer expected)", 4)
    end
end

-- The stored text of a value with flags.
local function pack(value, flags)
    local t = type(value)
    local tag = TAGS[t]
    if not tag then
        error("bad value type (string, number, boolean, table or nil expected, got " .. t
            .. ")", 4)
    end
    local body
    if t == "string" then
        body = value
    elseif t == "number" then
        body = format("%.17g", value)
        if not (flags and flags ~= 0) and find(body, "^%-?%d") then
            return body -- a finite number, bare
        end
    elseif t == "boolean" then
        body = value and "1" or "0"
    else
        body = encode(value)
    end
    if flags and flags ~= 0 then
        return upper(tag) .. format("%d", flags) .. ":" .. body
    end
    return tag .. body
end

-- The value and flags of a stored text (nil for what moonserve did not write).
local function unpack(s)
    if type(s) ~= "string" or s == "" then
        return nil
    end
    local tag = byte(s)
    if (tag >= 48 and tag <= 57) or tag == 45 then -- a digit or '-': a bare number
        return tonumber(s), nil
    end
    local flags, at = nil, 2
    if tag >= 65 and tag <= 90 then -- upper case: flags follow
        local colon = find(s, ":", 2, true)
        if not colon then
            return nil
        end
        flags = tonumber(sub(s, 2, colon - 1))
        at = colon + 1
        tag = tag + 32
    end
    local body = sub(s, at)
    if tag == 115 then -- s
        return body, flags
    elseif tag == 110 then -- n
        return tonumber(body), flags
    elseif tag == 98 then -- b
        return body == "1", flags
    elseif tag == 116 then -- t
        local ok, v = pcall(decode, body)
        if ok then
            return v, flags
        end
    end
    return nil
end
_M.pack, _M.unpack = pack, unpack

local function check_key(self, key)
    if type(key) == "number" then
        key = tostring(key)
    elseif type(key) ~= "string" then
        error("bad key (string expected, got " .. type(key) .. ")", 3)
    end
    if key == "" then
        return nil, "empty key"
    end
    local max = _M.limits.redis_key_bytes
    if #key > max then
        return nil, format("key too long (%d bytes; redis_key_bytes is %d)", #key, max)
    end
    return self.prefix .. key
end

local function check_value(s)
    local max = _M.limits.redis_value_bytes
    if #s > max then
        return nil, format("value too large (%d bytes stored; redis_value_bytes is %d)", #s, max)
    end
    return s
end

local function check_time(t, what)
    if t == nil then
        return 0
    end
    if type(t) ~= "number" or t < 0 or t ~= t then
        error("bad " .. what .. " (a number of seconds, 0 or more, expected)", 4)
    end
    -- (milliseconds, at least 1 for a time above 0: PX takes an integer above 0)
    local ms = floor(t * 1000)
    if t > 0 and ms < 1 then
        ms = 1
    end
    return ms
end

-- An error reply, as the local dictionaries' errors read.
local function reply_error(text)
    if find(text, "^WRONGTYPE") then
        return "value is a list"
    elseif find(text, "^OOM") then
        return "no memory"
    end
    return text
end

-- -- Reads ---------------------------------------------------------------------------------

--- value, flags | nil | nil, err
function Dict:get(key)
    local k, err = check_key(self, key)
    if not k then
        return nil, err
    end
    local c = self.cache and self.cached[k]
    if c then
        if c.until_ > now() then
            return unpack(c.raw)
        end
        self.cached[k] = nil
        self.ncached = self.ncached - 1
    end
    local drops = self.drops
    local v, is_reply
    v, err, is_reply = self.redis:call("GET", k)
    if v == nil then
        return nil, is_reply and reply_error(err) or err
    end
    if v == null then
        return nil
    end
    if self.cache and self.drops == drops then
        cache_put(self, k, v)
    end
    return unpack(v)
end

--- value, flags, false: Redis frees a value the moment it expires, so none is ever stale.
function Dict:get_stale(key)
    local v, flags = self:get(key)
    if v == nil then
        return v, flags
    end
    return v, flags, false
end

-- -- Stores --------------------------------------------------------------------------------

-- SET with its condition (NX, XX or none) and expiry: ok, err, forcible (never: Redis'
-- eviction is its own policy, maxmemory-policy).
local function store(self, cond, key, value, exptime, flags)
    local k, err = check_key(self, key)
    local ms = check_time(exptime, "exptime")
    check_flags(flags)
    if value == nil then
        if not k then
            return false, err, false
        end
        if cond == "NX" then
            return false, "exists", false -- (as the local add of nil: nothing to add)
        end
        local v
        v, err = self.redis:call("DEL", k)
        if v == nil then
            return false, err, false
        end
        written(self, k)
        return true, nil, false
    end
    local s = pack(value, flags)
    if not k then
        return false, err, false
    end
    s, err = check_value(s)
    if not s then
        return false, err, false
    end
    local v, is_reply
    if ms > 0 then
        if cond then
            v, err, is_reply = self.redis:call("SET", k, s, "PX", ms, cond)
        else
            v, err, is_reply = self.redis:call("SET", k, s, "PX", ms)
        end
    elseif cond then
        v, err, is_reply = self.redis:call("SET", k, s, cond)
    else
        v, err, is_reply = self.redis:call("SET", k, s)
    end
    if v == nil then
        return false, is_reply and reply_error(err) or err, false
    end
    if v == null then
        return false, cond == "NX" and "exists" or "not found", false
    end
    written(self, k)
    return true, nil, false
end

--- Stores `value` (a string, number, boolean or table; nil deletes) for `exptime` seconds
-- (0 or nil: no expiry) with `flags`: ok, err, forcible. One SET.
function Dict:set(key, value, exptime, flags)
    return store(self, nil, key, value, exptime, flags)
end

--- As set: Redis evicts by its own maxmemory-policy, or refuses ("no memory").
Dict.safe_set = Dict.set

--- As set, only when `key` is not there (else false, "exists"). One SET NX.
function Dict:add(key, value, exptime, flags)
    return store(self, "NX", key, value, exptime, flags)
end

Dict.safe_add = Dict.add

--- As set, only when `key` is there (else false, "not found"). One SET XX.
function Dict:replace(key, value, exptime, flags)
    if value == nil then
        error("bad value type (string, number, boolean or table expected, got nil)", 2)
    end
    return store(self, "XX", key, value, exptime, flags)
end

-- incr, where INCRBY is not enough: one script, so that reading the number, adding and
-- writing it back (keeping its TTL and flags, or making it from init with init_ttl) is one
-- step for every instance. Returns { 1, text }, { 0 } (not found), { 3 } (not a number) or
-- { 2 } (a list).
local INCR = redis.script([[
local function text(x, head)
  local s = string.format('%.17g', x)
  if head == '' and not string.find(s, '^%-?%d') then head = 'n' end
  return head .. s, s
end
local ok, v = pcall(redis.call, 'GET', KEYS[1])
if not ok then return { 2 } end
if not v then
  if ARGV[2] == '0' then return { 0 } end
  local stored, s = text(tonumber(ARGV[3]) + tonumber(ARGV[1]), '')
  if ARGV[4] ~= '0' then
    redis.call('SET', KEYS[1], stored, 'PX', ARGV[4])
  else
    redis.call('SET', KEYS[1], stored)
  end
  return { 1, s }
end
local head, body
local t = string.sub(v, 1, 1)
if string.find(t, '[%d%-]') then
  head, body = '', v
elseif t == 'n' then
  head, body = '', string.sub(v, 2)
elseif t == 'N' then
  local c = string.find(v, ':', 2, true)
  if not c then return { 3 } end
  head, body = string.sub(v, 1, c), string.sub(v, c + 1)
else
  return { 3 }
end
local x = tonumber(body)
if not x then return { 3 } end
local stored, s = text(x + tonumber(ARGV[1]), head)
redis.call('SET', KEYS[1], stored, 'KEEPTTL')
return { 1, s }
]])

--- newval, err, forcible: `init` makes a missing key (with `init_ttl`), else "not found".
-- One INCRBY when that is all it takes (an integer step, init 0 and no init_ttl, a stored
-- integer without flags), else one script (EVALSHA); atomic across every instance either way.
function Dict:incr(key, n, init, init_ttl)
    if type(n) ~= "number" or n ~= n then
        error("bad increment (number expected)", 2)
    end
    if init ~= nil and (type(init) ~= "number" or init ~= init) then
        error("bad init (number expected)", 2)
    end
    local ms = check_time(init_ttl, "init_ttl")
    local k, err = check_key(self, key)
    if not k then
        return nil, err
    end
    local v, is_reply
    if init == 0 and ms == 0 and n % 1 == 0 and n > -2 ^ 53 and n < 2 ^ 53 then
        v, err, is_reply = self.redis:call("INCRBY", k, n)
        if v ~= nil then
            written(self, k)
            return v, nil, false
        elseif not is_reply then
            return nil, err
        elseif find(err, "^WRONGTYPE") then
            return nil, "not a number"
        end
        -- (not an integer: a fraction, a tagged value, flags; the script tells)
    end
    v, err, is_reply = self.redis:eval(INCR, { k }, { format("%.17g", n),
        init ~= nil and "1" or "0", format("%.17g", init or 0), ms })
    if v == nil then
        return nil, is_reply and reply_error(err) or err
    end
    local code = v[1]
    if code == 1 then
        written(self, k)
        return tonumber(v[2]), nil, false
    elseif code == 0 then
        return nil, "not found"
    end
    return nil, "not a number" -- (a list too, as the local dictionaries say)
end

--- Removes `key`: true, or nil and an error. One DEL.
function Dict:delete(key)
    local k, err = check_key(self, key)
    if not k then
        return nil, err
    end
    local v
    v, err = self.redis:call("DEL", k)
    if v == nil then
        return nil, err
    end
    written(self, k)
    return true
end

--- seconds left (0: never expires) | nil, "not found". One PTTL.
function Dict:ttl(key)
    local k, err = check_key(self, key)
    if not k then
        return nil, err
    end
    local v
    v, err = self.redis:call("PTTL", k)
    if v == nil then
        return nil, err
    end
    if v == -2 then
        return nil, "not found"
    elseif v < 0 then
        return 0
    end
    return v / 1000
end

local PERSIST = redis.script([[
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('PERSIST', KEYS[1])
return 1
]])

--- A new time to live, in seconds (0: none): true, or nil and "not found". One PEXPIRE (a
-- script for 0: PERSIST cannot tell a missing key from one without expiry).
function Dict:expire(key, exptime)
    local ms = check_time(exptime, "exptime")
    local k, err = check_key(self, key)
    if not k then
        return nil, err
    end
    local v
    if ms > 0 then
        v, err = self.redis:call("PEXPIRE", k, ms)
    else
        v, err = self.redis:eval(PERSIST, { k })
    end
    if v == nil then
        return nil, err
    end
    if v == 0 then
        return nil, "not found"
    end
    written(self, k)
    return true
end

-- -- Keys ----------------------------------------------------------------------------------

-- The prefix as a SCAN pattern: its glob characters escaped.
local function pattern(prefix)
    return (gsub(prefix, "[%*%?%[%]\\]", "\\%0")) .. "*"
end

-- Runs fn(keys) on each batch of SCAN under the prefix until it says stop or the scan ends:
-- true, or nil and an error.
local function scan(self, fn)
    local cursor, match = "0", pattern(self.prefix)
    repeat
        local v, err = self.redis:call("SCAN", cursor, "MATCH", match, "COUNT", 1000)
        if v == nil then
            return nil, err
        end
        cursor = v[1]
        if fn(v[2]) then
            return true
        end
    until cursor == "0"
    return true
end

--- Up to `max` keys (default 1024; 0: all), without the prefix: SCAN, a round trip for each
-- thousand keys looked at; keys written or removed meanwhile may or may not show.
function Dict:get_keys(max)
    max = max or 1024
    local keys, n, plen = {}, 0, #self.prefix
    local ok, err = scan(self, function(batch)
        for i = 1, #batch do
            if max > 0 and n >= max then
                return true
            end
            n = n + 1
            keys[n] = sub(batch[i], plen + 1)
        end
        return max > 0 and n >= max
    end)
    if not ok then
        return nil, err
    end
    return keys
end

--- Removes every key under the prefix: SCAN and UNLINK in batches, not one step (a key
-- written meanwhile may stay). Returns true, or nil and an error.
function Dict:flush_all()
    local failed
    local ok, err = scan(self, function(batch)
        if #batch > 0 then
            local cmd = { "UNLINK" }
            for i = 1, #batch do
                cmd[i + 1] = batch[i]
            end
            local out, e = self.redis:pipeline({ cmd })
            if out == nil or is_error(out[1]) then
                failed = e or out[1].error
                return true
            end
        end
        return false
    end)
    written(self, nil)
    if not ok or failed then
        return nil, err or failed
    end
    return true
end

--- 0: Redis frees expired keys itself.
function Dict.flush_expired()
    return 0
end

-- -- Lists ---------------------------------------------------------------------------------

local function list_error(err, is_reply)
    if is_reply then
        if find(err, "^WRONGTYPE") then
            return "value not a list"
        end
        return reply_error(err)
    end
    return err
end

local function push(self, verb, key, value)
    local k, err = check_key(self, key)
    local t = type(value)
    if t ~= "string" and t ~= "number" then
        return nil, "bad value type"
    end
    if not k then
        return nil, err
    end
    local s
    s, err = check_value(pack(value))
    if not s then
        return nil, err
    end
    local v, is_reply
    v, err, is_reply = self.redis:call(verb, k, s)
    if v == nil then
        return nil, list_error(err, is_reply)
    end
    return v
end

local function pop(self, verb, key)
    local k, err = check_key(self, key)
    if not k then
        return nil, err
    end
    local v, is_reply
    v, err, is_reply = self.redis:call(verb, k)
    if v == nil then
        return nil, list_error(err, is_reply)
    end
    if v == null then
        return nil
    end
    return (unpack(v))
end

--- Prepends `value` (a string or number) to the list at `key`: its length, or nil and an
-- error. One LPUSH.
function Dict:lpush(key, value)
    return push(self, "LPUSH", key, value)
end

--- Appends `value` to the list at `key`: its length, or nil and an error. One RPUSH.
function Dict:rpush(key, value)
    return push(self, "RPUSH", key, value)
end

--- Removes and returns the first value of the list at `key` (nil when empty). One LPOP.
function Dict:lpop(key)
    return pop(self, "LPOP", key)
end

--- Removes and returns the last value of the list at `key` (nil when empty). One RPOP.
function Dict:rpop(key)
    return pop(self, "RPOP", key)
end

--- The length of the list at `key` (0 when missing). One LLEN.
function Dict:llen(key)
    local k, err = check_key(self, key)
    if not k then
        return nil, err
    end
    local v, is_reply
    v, err, is_reply = self.redis:call("LLEN", k)
    if v == nil then
        return nil, list_error(err, is_reply)
    end
    return v
end

-- -- Size ----------------------------------------------------------------------------------

local function memory(self)
    local info, err = self.redis:call("INFO", "memory")
    if not info then
        return nil, err
    end
    return tonumber(info:match("\nmaxmemory:(%d+)")) or 0,
        tonumber(info:match("\nused_memory:(%d+)")) or 0
end

--- The Redis server's maxmemory in bytes (0: no limit set), shared by everything it holds.
function Dict:capacity()
    local max, err = memory(self)
    return max, err
end

--- maxmemory less the memory Redis uses (nil and "no maxmemory" when it has no limit).
function Dict:free_space()
    local max, used = memory(self)
    if not max then
        return nil, used
    end
    if max == 0 then
        return nil, "no maxmemory"
    end
    return max > used and max - used or 0
end

return _M
