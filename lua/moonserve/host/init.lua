-- moonserve/host/init.lua: the one way the framework (app, router, middleware, security) reaches
-- whatever serves it. A host makes the request and reply objects, calls app:handle(req, res)
-- for each request and app:handle_error(req, res, err) when that raises, and gives the
-- framework the few functions below. moonserve's own core is the host unless another was
-- installed with use(); it is loaded the first time one of the functions is called, so that
-- requiring moonserve and defining an app loads no part of it.
--
-- The functions a host gives (ARCHITECTURE.md, "The host interface"):
--   path_plain(path)    true when every byte of a request path may stand as it is in a URL
--   fields_ok(lines)    true when "name: value\r\n"... are field lines the host will send
--   log(level, msg)     one log line; level "err", "warn", "info" or "debug"
--   now()               the time in seconds, as the host's clock has it
--   sleep(seconds)      parks the running handler (moonserve.sleep)
--   run(app, opts)      serves `app` (app:run)
--   module(name)        the host's "timer", "dispatcher" (spawn, wait, kill), "semaphore",
--                       "socket" or "worker" module, behind moonserve.timer, moonserve.spawn...,
--                       and on the core's host its "websocket", "channel", "live",
--                       "metrics" and "inprocess" (app:websocket, app:channel, live reload,
--                       moonserve.metrics, app:test)
--                       "config" (inherited(): a worker's configuration from its master)
-- Inside nginx (its Lua module's own `ngx`, not moonserve's ngx layer) the default host is
-- OpenResty's (moonserve/host/openresty/init.lua), so that the core's shared object is never loaded there.
local _M = {}

local NAMES = { "path_plain", "fields_ok", "log", "now", "sleep", "run", "module" }

-- Installs `host`, a table with every function above, in place of the one in use.
function _M.use(host)
    if type(host) ~= "table" then
        error("bad host (table expected)", 2)
    end
    for _, name in ipairs(NAMES) do
        if type(host[name]) ~= "function" then
            error("bad host: no function " .. name, 2)
        end
    end
    for _, name in ipairs(NAMES) do
        _M[name] = host[name]
    end
    _M.name = host.name or "?"
    return _M
end

-- The modules behind module(name) on the core's host (moonserve/host/core/NAME.lua).
-- Cached: a require per call (moonserve.socket.tcp(), spawn, timers) made a string and called
-- a C function, whose trace stitch left the rest of the handler to the interpreter, some
-- 6,000 instructions a request.
local core_modules = {}
local function core_module(name)
    local m = core_modules[name]
    if m == nil then
        m = require("moonserve.host.core." .. name)
        core_modules[name] = m
    end
    return m
end

-- The core's host before its first call: module(name) loads that module alone, as the
-- framework asks for the core's WebSocket, channels or live reload while an app is defined;
-- any other function installs the core's host (moonserve/host/core/init.lua: the FFI) and
-- calls it.
local function core_host_unloaded()
    local t = { name = "core", module = core_module }
    for _, name in ipairs(NAMES) do
        if name ~= "module" then
            t[name] = function(...)
                _M.use(require "moonserve.host.core")
                return _M[name](...)
            end
        end
    end
    return t
end

--- Whether this Lua runs inside nginx with its Lua module: a global `ngx` that is nginx's,
-- not the one moonserve's ngx layer (moonserve.ngx) installs, which says so in its config.
function _M.under_nginx()
    local n = rawget(_G, "ngx")
    local config = type(n) == "table" and rawget(n, "config")
    return type(config) == "table" and config.ngx_lua_version ~= nil and not config.moonserve
end

local function default_host()
    if _M.under_nginx() then
        return require("moonserve.host.openresty").host
    end
    return core_host_unloaded()
end

-- Until a host is installed, the first look-up of a function installs the core's.
setmetatable(_M, {
    __index = function(_, k)
        if k == "name" or k == "use" then
            return nil
        end
        for _, name in ipairs(NAMES) do
            if k == name then
                _M.use(default_host())
                return rawget(_M, k)
            end
        end
        return nil
    end,
})

--- Readies the process for handler code, before the app's modules load: on the core's host,
-- coroutine.resume, wrap and status that let waits through the handler's own coroutines
-- (moonserve/host/core/coroutine.lua). nginx's Lua module lets waits through coroutines
-- itself.
function _M.prepare()
    if not _M.under_nginx() then
        require "moonserve.host.core.coroutine"
    end
end

-- Whether a host is installed (or the core's was loaded by a first use): for tests.
function _M.loaded()
    return rawget(_M, "run") ~= nil
end

return _M
