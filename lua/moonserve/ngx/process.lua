-- moonserve/ngx/process.lua: OpenResty's ngx.process module, and the process facts ngx.worker
-- and ngx.var need (pid, hostname).
local ffi = require "ffi"

if not pcall(ffi.typeof, "ms_ngx_pid_t") then
    ffi.cdef [[
typedef int ms_ngx_pid_t;
ms_ngx_pid_t getpid(void);
ms_ngx_pid_t getppid(void);
int gethostname(char *name, size_t len);
]]
end
local C = ffi.C

local _M = { version = "0.1.25" }

function _M.pid()
    return C.getpid()
end

local host
function _M.hostname()
    if not host then
        local buf = ffi.new("char[256]")
        host = C.gethostname(buf, 256) == 0 and ffi.string(buf) or "localhost"
    end
    return host
end

-- "worker" in a worker of a master, "single" in a server with no master, and "master" where
-- an app file's top level runs in the master.
function _M.type()
    if os.getenv("MOONSERVE_WORKER") then
        return "worker"
    end
    local d = package.loaded["moonserve.host.core.dispatcher"]
    if d and d.attached() then
        return "single"
    end
    return tonumber(os.getenv("MOONSERVE_WORKER_COUNT") or "0") ~= 0 and "master" or "single"
end

function _M.get_master_pid()
    if os.getenv("MOONSERVE_WORKER") then
        return C.getppid()
    end
    return C.getpid()
end

function _M.enable_privileged_agent()
    return nil, "not supported by moonserve"
end

function _M.signal_graceful_exit()
    return nil, "not supported by moonserve"
end

return _M
