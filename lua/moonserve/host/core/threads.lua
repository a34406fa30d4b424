--- moonserve/host/core/threads.lua: thread pools for CPU work off the loop (modules/ms_thread_ffi.c):
-- run(pool, module, func, ...) parks the caller while a thread of the pool, with a LuaJIT state
-- of its own, runs require(module)[func](...), and returns true and its results, or false and
-- an error (as OpenResty's ngx.run_worker_thread). Arguments and results are plain values,
-- copied (moonserve/host/core/thread_runner.lua).
-- @module moonserve.host.core.threads
local ffi = require "ffi"
local base = require "moonserve.host.core.base"
local dispatcher = require "moonserve.host.core.dispatcher"
local coro = require "moonserve.host.core.coroutine"
local codec = require "moonserve.host.core.thread_runner"

local C = base.C
local type, tostring, pcall, error, pairs, setmetatable = type, tostring, pcall, error, pairs,
    setmetatable
local floor = math.floor

ffi.cdef [[
typedef struct ms_thread_pool_s ms_thread_pool_t;
typedef struct ms_thread_job_s ms_thread_job_t;
ms_thread_pool_t *ms_ffi_thread_pool_new(int threads, int max_queue, const char *path,
                                         const char *cpath, const char *runner);
ms_thread_job_t *ms_ffi_thread_submit(ms_thread_pool_t *p, ms_server_t *srv, int32_t slot,
                                      const char *in, size_t len, int *err);
int ms_ffi_thread_done(ms_thread_job_t *j);
int ms_ffi_thread_result(ms_thread_job_t *j, const char **out, size_t *len);
void ms_ffi_thread_free(ms_thread_job_t *j);
void ms_ffi_thread_pool_stop(ms_thread_pool_t *p);
void ms_ffi_thread_hub_close(ms_server_t *srv);
]]

local _M = {}

local DEFAULT = { threads = 4, max_queue = 1024 }
local MAX_THREADS = 256 -- a pool's cap (each thread holds a LuaJIT state)
local RUNNER = "moonserve.host.core.thread_runner"
local EAGAIN = -11 -- UV_EAGAIN on Linux: the queue is full

-- name -> { threads, max_queue, p (the C pool, made at the first job) }
local pools = { default = { threads = DEFAULT.threads, max_queue = DEFAULT.max_queue } }

local function count(v, what, min)
    if v == nil then
        return nil
    end
    if type(v) ~= "number" or v ~= floor(v) or v < min then
        return nil, "bad " .. what .. " (an integer >= " .. min .. " expected)"
    end
    return v
end

--- Declares a pool (app:thread_pool): opts.threads (4), opts.max_queue (1024: jobs waiting
-- for a thread; past it run() returns false, "queue full"). "default" may be declared again
-- to change its sizes.
function _M.declare(name, opts, level)
    level = (level or 1) + 1
    if type(name) ~= "string" or name == "" then
        error("bad thread pool name (a non-empty string expected)", level)
    end
    opts = opts or {}
    if type(opts) ~= "table" then
        error("bad thread pool options (a table expected)", level)
    end
    for k in pairs(opts) do
        if k ~= "threads" and k ~= "max_queue" then
            error("unknown thread pool option '" .. tostring(k) .. "'", level)
        end
    end
    local threads, err = count(opts.threads, "threads", 1)
    if err or (threads and threads > MAX_THREADS) then
        error(err or ("bad threads (at most " .. MAX_THREADS .. ")"), level)
    end
    local max_queue
    max_queue, err = count(opts.max_queue, "max_queue", 0)
    if err then
        error(err, level)
    end
    local had = pools[name]
    if had and had.p then
        error("thread pool '" .. name .. "' is already running", level)
    end
    pools[name] = { threads = threads or DEFAULT.threads, max_queue = max_queue or DEFAULT.max_queue }
end

local function pool_get(name)
    local pool = pools[name]
    if not pool then
        return nil, "no thread pool named '" .. tostring(name) .. "'"
    end
    if pool.stopped then
        return nil, "thread pool stopped"
    end
    if not pool.p then
        local p = C.ms_ffi_thread_pool_new(pool.threads, pool.max_queue, package.path,
            package.cpath, RUNNER)
        if p == nil then
            return nil, "out of memory"
        end
        pool.p = p
    end
    return pool
end

local errbox = ffi.new("int[1]")
local outp = ffi.new("const char *[1]")
local lenp = ffi.new("size_t[1]")

-- What an owner holds while a job is under way: freed (abandoned if still running) when the
-- caller's request or task ends before the job does.
local Job = {}
Job.__index = Job
function Job:_release()
    local j = self.j
    if j then
        self.j = nil
        C.ms_ffi_thread_free(j)
    end
end

local function finish(job)
    local j = job.j
    job.j = nil
    local ok = C.ms_ffi_thread_result(j, outp, lenp) ~= 0
    local s = ffi.string(outp[0], lenp[0])
    C.ms_ffi_thread_free(j)
    if not ok then
        return false, s
    end
    return true, codec.decode(s)
end

--- Runs require(module)[func](...) in a thread of `pool` and waits for it (parking the calling
-- handler or task; raises where one cannot wait). Returns true and the function's results, or
-- false and an error: a bad argument, an unknown pool, "queue full", a module that cannot be
-- loaded, a missing function, an error the function raised.
function _M.run(pool_name, mod, fname, ...)
    if type(pool_name) ~= "string" then
        return false, "bad thread pool name (a string expected)"
    end
    if type(mod) ~= "string" then
        return false, "bad module name (a string expected)"
    end
    if type(fname) ~= "string" then
        return false, "bad function name (a string expected)"
    end
    local limit = dispatcher.limits.thread_job_bytes
    local ok, s = pcall(codec.encode, limit, mod, fname, ...)
    if not ok then
        return false, "bad argument: " .. tostring(s)
    end
    if #s > limit then
        return false, "arguments too large (" .. #s .. " bytes encoded; thread_job_bytes is "
            .. limit .. ")"
    end
    local pool, err = pool_get(pool_name)
    if not pool then
        return false, err
    end
    local o = dispatcher.owner("run_worker_thread", 2)
    local w = dispatcher.waiter("run_worker_thread")
    local j = C.ms_ffi_thread_submit(pool.p, w.srv, w.slot, s, #s, errbox)
    if j == nil then
        local e = errbox[0]
        if e == EAGAIN then
            return false, "queue full (thread pool '" .. pool_name .. "')"
        end
        return false, "cannot queue the job (error " .. tostring(e) .. ")"
    end
    local job = setmetatable({ j = j }, Job)
    dispatcher.adopt(o, job)
    local t = w.task
    if t then
        t.cancel = function() job:_release() end
    end
    local status = coro.park()
    if t then
        t.cancel = nil
    end
    w.woken = true
    if type(status) ~= "number" or job.j == nil then
        job:_release()
        return false, "interrupted"
    end
    return finish(job)
end

--- The worker has stopped serving: each pool's running jobs are waited for, queued ones
-- dropped, the threads joined; then the server's hub is closed.
function _M.stop_all(srv)
    for _, pool in pairs(pools) do
        if pool.p then
            C.ms_ffi_thread_pool_stop(pool.p)
            pool.p = nil
            pool.stopped = true
        end
    end
    if srv ~= nil then
        C.ms_ffi_thread_hub_close(srv)
    end
end

--- A server goes while the process's pools go on (an in-process one, moonserve.test): a job of
-- its still in a thread wakes no one when it ends (its caller, if still there, finds it done).
function _M.server_gone(srv)
    C.ms_ffi_thread_hub_close(ffi.cast("ms_server_t *", srv))
end

return _M
