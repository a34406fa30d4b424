--- moonserve/host/openresty/services.lua: moonserve's timers, light threads, semaphores, sockets,
-- worker and shared dictionaries inside nginx, on OpenResty's own (the modules behind
-- moonserve.timer, moonserve.spawn, moonserve.semaphore, moonserve.socket, moonserve.worker
-- and moonserve.shared; moonserve/host/init.lua: module).
-- @module moonserve.openresty.services

-- luacheck: globals ngx (nginx's Lua module gives it; this runs only inside nginx)
local buffer = require "string.buffer"
local bit = require "bit"
local ffi = require "ffi"

local ngx = ngx
local type, error, select, unpack, pairs, tostring = type, error, select, unpack, pairs, tostring
local newproxy, getmetatable = newproxy, getmetatable
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

-- -- Thread pools: nginx's, through OpenResty's ngx.run_worker_thread ---------------------

-- The threads are those of nginx.conf's thread_pool directives (main context), one set per
-- worker process; a job runs through ngx.run_worker_thread. app:thread_pool's sizes (and
-- "default"'s: 4 threads, 1024 queued) bound the jobs this worker has given a pool at once
-- (threads.run below).
local pool_sizes = { default = { threads = 4, max_queue = 1024 } }
local pools = {} -- pool name -> the places of this worker's jobs in it (see run below)
local MAX_THREADS = 256

local function pool_count(v, what, min)
    if v ~= nil and (type(v) ~= "number" or v % 1 ~= 0 or v < min) then
        error("bad " .. what .. " (an integer >= " .. min .. " expected)", 4)
    end
    return v
end

local threads = {}

-- app:thread_pool(name, opts) inside nginx: the bound above (the pool itself is nginx.conf's).
function threads.declare(name, opts)
    if type(name) ~= "string" or name == "" then
        error("bad thread pool name (a non-empty string expected)", 3)
    end
    opts = opts or {}
    if type(opts) ~= "table" then
        error("bad thread pool options (a table expected)", 3)
    end
    for k in pairs(opts) do
        if k ~= "threads" and k ~= "max_queue" then
            error("unknown thread pool option '" .. tostring(k) .. "'", 3)
        end
    end
    local n = pool_count(opts.threads, "threads", 1)
    if n and n > MAX_THREADS then
        error("bad threads (at most " .. MAX_THREADS .. ")", 3)
    end
    pool_sizes[name] = { threads = n or 4, max_queue = pool_count(opts.max_queue, "max_queue", 0)
        or 1024 }
end

-- A pool's places, max_queue of them (one at least): a job holds one from the moment it is
-- given to nginx until it is over. Not threads + max_queue: nginx counts a job in its queue
-- until a thread takes it, and under load a thread takes it late, so that a job given while
-- all threads seemed busy could find the queue full (see threads.run). `over` is a byte a
-- place that the job's thread sets at its end (thread_job.lua), read here only for the places
-- of jobs whose caller went away: the request ended under it, and nginx will never resume it,
-- but the job still runs or waits in nginx's queue, and its place must not be given to another
-- before it is over.
local function places_of(pool, size)
    local p = pools[pool]
    if not p then
        local n = math.max(size.max_queue, 1)
        local over = ffi.new("uint8_t[?]", n)
        p = { over = over, at = tonumber(ffi.cast("uintptr_t", over)), free = {}, gone = {} }
        for i = n - 1, 0, -1 do
            p.free[#p.free + 1] = i
        end
        pools[pool] = p
    end
    return p
end

-- A free place, or nil: the places of jobs whose caller went away come back once they are over.
local function take_place(p)
    if #p.free == 0 then
        for i in pairs(p.gone) do
            if p.over[i] == 1 then
                p.gone[i] = nil
                p.free[#p.free + 1] = i
            end
        end
    end
    local i = table.remove(p.free)
    if i then
        p.over[i] = 0
    end
    return i
end

-- The job is back (its results, or its error), or its caller went away (the guard below was
-- collected): its place is free now, or once its thread says it is over.
local function job_done(job, back)
    if not job.done then
        job.done = true
        if back then
            job.places.free[#job.places.free + 1] = job.i
        else
            job.places.gone[job.i] = true
        end
    end
end

-- (_guard is only held: an argument, it stays on the caller's stack through the wait)
local function job_back(_guard, job, ok, ...)
    job_done(job, true)
    if not ok then
        local err = ...
        if type(err) == "string" and err:find("^thread[ _]pool.* not found$") then
            return false, "no thread pool named '" .. job.pool .. "' in nginx.conf (declare it "
                .. "in its main context: thread_pool " .. job.pool .. " threads=4 "
                .. "max_queue=1024;)"
        end
    end
    return ok, ...
end

-- Jobs are counted against app:thread_pool's max_queue (and "default"'s), so that past it the
-- answer is "queue full" here: lua-nginx-module 0.10.23 (Debian 12's) frees a job nginx refused
-- for a full queue wrongly, and the worker dies ("free(): invalid size"). nginx.conf must
-- declare each pool with at least these sizes.
function threads.run(pool, module, func, ...)
    local size = pool_sizes[pool]
    if not size then
        return job_back(nil, { pool = pool, done = true },
            ngx.run_worker_thread(pool, module, func, ...))
    end
    local p = places_of(pool, size)
    local i = take_place(p)
    if not i then
        return false, "queue full (thread pool '" .. pool .. "')"
    end
    local job = { pool = pool, places = p, i = i }
    local guard = newproxy(true)
    getmetatable(guard).__gc = function() job_done(job, false) end
    return job_back(guard, job, ngx.run_worker_thread(pool, "moonserve.host.openresty.thread_job",
        "run", p.at, i, module, func, ...))
end

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
    threads = threads,
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
