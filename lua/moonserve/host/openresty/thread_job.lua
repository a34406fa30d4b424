-- moonserve/host/openresty/thread_job.lua: what runs in one of nginx's worker threads for a
-- job of moonserve.run_worker_thread inside nginx (services.lua's thread pools). It calls the
-- job's function as ngx.run_worker_thread would, with nginx's words for a bad module or
-- function, and when the job is over, returned or failed, it sets the job's byte in its
-- worker's table of places: so the worker learns of the end of a job whose caller had gone,
-- and gives its place back only then. Only LuaJIT's FFI here: the thread's Lua has no more.
local ffi = require "ffi"

local _M = {}

local function over(places, i, ok, ...)
    ffi.cast("uint8_t *", places)[i] = 1
    if not ok then
        error((...), 0)
    end
    return ...
end

local function call(module, func, ...)
    local ok, m = pcall(require, module)
    if not ok then
        error(m, 0)
    end
    local f = type(m) == "table" and m[func]
    if type(f) ~= "function" then
        error("invalid function", 0)
    end
    return f(...)
end

-- places: the address of the worker's bytes (a number); i: this job's byte.
function _M.run(places, i, module, func, ...)
    return over(places, i, pcall(call, module, func, ...))
end

return _M
