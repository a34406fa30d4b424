--- moonserve/host/openresty/services.lua: moonserve's timers, light threads, semaphores, sockets,
-- worker and shared dictionaries inside nginx, on OpenResty's own (the modules behind
-- moonserve.timer, moonserve.spawn, moonserve.semaphore, moonserve.socket, moonserve.worker
-- and moonserve.shared; moonserve/host/init.lua: module).
-- @module moonserve.openresty.services

-- luacheck: globals ngx (nginx's Lua module gives it; this runs only inside nginx)
local buffer = require "string.buffer"
local bit = require "bit"

local ngx = ngx
local type, error, select, unpack = type, error, select, unpack
local band, bor = bit.band, bit.bor

local _M = {}

-- -- Timers: a handle to cancel, as moonserve.timer's ---------------------------------------

local Timer = {}
Timer.__index = Timer

-- Cancels a timer that has not run yet (or, for every, its next runs): true, or nil, why not.
function Timer:cancel()
    if not self.armed then
        return nil, "not pending"
    end
    self.armed = false
    return true
end

function Timer:pending()
    return self.armed
end

local function check_timer(what, delay, fn)
    if type(delay) ~= "number" or delay < 0 or delay ~= delay then
        error("bad argument #1 to '" .. what .. "' (a non-negative number of seconds expected)", 3)
    end
    if type(fn) ~= "function" then
        error("bad argument #2 to '" .. what .. "' (function expected)", 3)
    end
end

local timer = {}

function timer.at(delay, fn, ...)
    check_timer("at", delay, fn)
    local h = setmetatable({ armed = true }, Timer)
    local ok, err = ngx.timer.at(delay, function(premature, ...)
        if h.armed then
            h.armed = false
            return fn(premature, ...)
        end
    end, ...)
    if not ok then
        return nil, err
    end
    return h
end

-- Every `interval` seconds: each run arms the next before it starts, as moonserve's does, and
-- a cancelled timer arms no more.
function timer.every(interval, fn, ...)
    check_timer("every", interval, fn)
    if interval <= 0 then
        error("bad argument #1 to 'every' (a positive number of seconds expected)", 2)
    end
    local h = setmetatable({ armed = true }, Timer)
    local args = { n = select("#", ...), ... }
    local tick
    tick = function(premature)
        if not h.armed then
            return
        end
        if not premature then
            local ok, err = ngx.timer.at(interval, tick)
            if not ok then
                h.armed = false
                ngx.log(ngx.ERR, "moonserve.timer.every: the next run is not armed: ", err)
            end
        else
            h.armed = false
        end
        return fn(premature, unpack(args, 1, args.n))
    end
    local ok, err = ngx.timer.at(interval, tick)
    if not ok then
        return nil, err
    end
    return h
end

function timer.counts()
    return ngx.timer.pending_count(), ngx.timer.running_count()
end

-- -- Sockets: moonserve.socket verifies certificates unless told not to ---------------------

local function tcp()
    local sock, err = ngx.socket.tcp()
    if not sock then
        return nil, err
    end
    local handshake = sock.sslhandshake
    -- (a cosocket is a table: this shadows its class's method for this socket alone)
    sock.sslhandshake = function(self, reused, server_name, verify, status_req)
        return handshake(self, reused, server_name, verify ~= false, status_req)
    end
    return sock
end

-- -- Shared dictionaries: lua_shared_dict zones, tables encoded as moonserve's ----------------

-- A table is stored as its string.buffer encoding with this flag bit, which an app's own
-- flags may therefore not use (they are 31 bits here, 32 on the core).
local TABLE_FLAG = 0x80000000

local Dict = {}
Dict.__index = Dict

local function unwrap(v, flags, ...)
    if flags and band(flags, TABLE_FLAG) ~= 0 then
        v = buffer.decode(v)
        flags = band(flags, 0x7fffffff)
        if flags == 0 then
            flags = nil
        end
    end
    return v, flags, ...
end

local function wrap(value, flags)
    if flags ~= nil and (type(flags) ~= "number" or flags < 0 or flags >= TABLE_FLAG or
            flags % 1 ~= 0) then
        error("bad flags (an unsigned integer under 2^31 expected inside nginx)", 3)
    end
    if type(value) == "table" then
        -- (nginx's flags are a C int: the bit is its sign, as bor gives it)
        return buffer.encode(value), bor(flags or 0, TABLE_FLAG)
    end
    return value, flags
end

function Dict:get(key)
    return unwrap(self.z:get(key))
end

function Dict:get_stale(key)
    return unwrap(self.z:get_stale(key))
end

for _, name in ipairs({ "set", "safe_set", "add", "safe_add", "replace" }) do
    Dict[name] = function(self, key, value, exptime, flags)
        local v, f = wrap(value, flags)
        local z = self.z
        return z[name](z, key, v, exptime or 0, f or 0)
    end
end

-- The rest are nginx's as they are.
for _, name in ipairs({ "incr", "delete", "ttl", "expire", "flush_all", "flush_expired",
    "get_keys", "lpush", "rpush", "lpop", "rpop", "llen", "capacity", "free_space" }) do
    Dict[name] = function(self, ...)
        local z = self.z
        return z[name](z, ...)
    end
end

local dicts = {}

-- moonserve.shared.NAME: nginx's lua_shared_dict NAME, or nil when nginx.conf has none.
local function shared_dict(name)
    local d = dicts[name]
    if d == nil then
        local z = ngx.shared[name]
        if not z then
            return nil
        end
        d = setmetatable({ z = z, name = name }, Dict)
        dicts[name] = d
    end
    return d
end

require("moonserve.shared").provide(shared_dict)

local MODULES = {
    timer = timer,
    -- The configuration is read where the app is loaded: init_by_lua runs in nginx's master
    -- before it forks, so every worker has the master's settings and secrets (the
    -- development seed too); a reload (HUP) runs it again and reads them anew.
    config = { inherited = function() return nil end },
    dispatcher = {
        spawn = function(...) return ngx.thread.spawn(...) end,
        wait = function(...) return ngx.thread.wait(...) end,
        kill = function(...) return ngx.thread.kill(...) end,
        stopping = function() return ngx.worker.exiting() end,
    },
    semaphore = { new = function(n) return require("ngx.semaphore").new(n) end },
    socket = { tcp = tcp, udp = function() return ngx.socket.udp() end },
    -- Thread pools are nginx's (its thread_pool directive): app:thread_pool declares nothing
    -- here, and a job runs through OpenResty's own ngx.run_worker_thread.
    threads = {
        declare = function() end,
        run = function(...) return ngx.run_worker_thread(...) end,
    },
    worker = {
        id = function() return ngx.worker.id() end,
        count = function() return ngx.worker.count() end,
    },
}

--- The module behind moonserve.`name` inside nginx (moonserve/host/init.lua: module).
-- @tparam string name "timer", "dispatcher", "semaphore", "socket", "threads" or "worker"
function _M.module(name)
    local m = MODULES[name]
    if not m then
        error("moonserve." .. tostring(name) .. " is not available inside nginx", 2)
    end
    return m
end

return _M
