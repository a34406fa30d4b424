--- moonserve: a Lua-scriptable HTTP server on a C core. Requiring it loads no part of the
-- core: that waits for the host's first use (moonserve/host/init.lua).
-- @module moonserve
local host = require "moonserve.host"

local _M = { _VERSION = "0.2.0" }

-- Handler code sees coroutine.resume, wrap and status that let waits through the
-- handler's own coroutines: installed by the host before the app's modules load.
host.prepare()

--- A new application; see app.lua.
function _M.app(opts)
    return require("moonserve.app").new(opts)
end

--- Middleware: a session per request in req.session (moonserve/session.lua, middleware).
function _M.sessions(opts)
    return require("moonserve.session").middleware(opts)
end

--- Middleware against cross-site requests, by origin and, with opts.secret, by form token
-- (moonserve/csrf.lua, middleware).
function _M.csrf(opts)
    return require("moonserve.csrf").middleware(opts)
end

--- A validator for a schema of params, queries or JSON bodies: v(input) -> data, errors
-- (moonserve/validate.lua).
-- @usage local v = moonserve.validate{ title = { "string", required = true } }
function _M.validate(schema, opts)
    return require("moonserve.validate").new(schema, opts)
end

--- JSON that keeps its shapes: json.array(t) (an empty one is `[]`), json.null, encode,
-- decode (moonserve/json.lua).
-- @table json
_M.json = require "moonserve.json"

--- Middleware for cross-origin requests: which other origins' pages may read the replies,
-- with which methods and headers; preflights answered without the route (moonserve/cors.lua,
-- middleware).
function _M.cors(opts)
    return require("moonserve.cors").middleware(opts)
end

--- Parks the running handler for `seconds` while the worker serves others; works inside
-- pcall and the handler's own coroutines, raises inside a C call (a string.gsub callback...).
function _M.sleep(seconds)
    return host.sleep(seconds)
end

--- Timers (moonserve/host/core/timer.lua), light threads and semaphores (moonserve/host/core/dispatcher.lua,
-- moonserve/host/core/semaphore.lua), which worker this is (moonserve/host/core/worker.lua), as OpenResty's
-- ngx.timer, ngx.thread, ngx.semaphore and ngx.worker. Loaded at the first call.
-- @table timer
_M.timer = {
    at = function(...) return host.module("timer").at(...) end,
    every = function(...) return host.module("timer").every(...) end,
}
--- Starts a light thread running fn(...) at once, until it waits (as ngx.thread.spawn).
-- @tparam function fn
-- @param ... its arguments
-- @return the thread, for moonserve.wait and moonserve.kill
function _M.spawn(...) return host.module("dispatcher").spawn(...) end
--- Waits for the first of the threads given to finish (as ngx.thread.wait). A thread's
-- results go to one wait: one already waited for is passed over, or, as the last argument,
-- gives nil and "already waited or killed".
-- @return true and what it returned, or false and its error ("killed")
function _M.wait(...) return host.module("dispatcher").wait(...) end
--- Kills a light thread this coroutine started (as ngx.thread.kill).
-- @return true, or nil and an error
function _M.kill(...) return host.module("dispatcher").kill(...) end
--- Runs require(module)[func](...) in a thread of the pool named `pool` (app:thread_pool;
-- "default" always exists), each thread with a LuaJIT state of its own, while the caller
-- waits without holding the loop up (as ngx.run_worker_thread). Arguments and results are
-- plain values (nil, booleans, numbers, strings, tables of those), copied.
-- @return true and the function's results, or false and an error
function _M.run_worker_thread(...) return host.module("threads").run(...) end
--- Password hashing with argon2id, off the loop (moonserve/password.lua).
-- @table password
_M.password = setmetatable({}, { __index = function(t, k)
    local m = require "moonserve.password"
    setmetatable(t, { __index = m })
    return m[k]
end })
--- The PostgreSQL client (moonserve/pg/init.lua), loaded when first used.
-- @table pg
_M.pg = setmetatable({}, { __index = function(t, k)
    local m = require "moonserve.pg"
    setmetatable(t, { __index = m })
    return m[k]
end })
--- A semaphore with `n` resources (as ngx.semaphore.new): see moonserve.semaphore.
-- @tparam[opt=0] number n
-- @treturn Semaphore
function _M.semaphore(n) return host.module("semaphore").new(n) end
--- Sockets, as OpenResty's ngx.socket.tcp and ngx.socket.udp (moonserve/host/core/socket.lua).
-- @table socket
_M.socket = {
    tcp = function() return host.module("socket").tcp() end,
    udp = function() return host.module("socket").udp() end,
}
--- WebSocket (moonserve/host/core/websocket.lua): broadcast(list, data[, "binary"]) frames a message
-- once for many sockets; endpoints are app:websocket(path, fn, opts).
-- @table websocket
_M.websocket = {
    broadcast = function(...) return host.module("websocket").broadcast(...) end,
    -- The channel app:channel(name) declared (moonserve/host/core/channel.lua), or nil.
    channel = function(name) return host.module("channel").get(name) end,
}
--- A broadcast to every worker (and with opts.redis every instance) for state each worker
-- keeps, as caches (moonserve/fanout.lua): b:broadcast(data), b:subscribe(fn), b:poll(t),
-- b:on_reset(fn); the shape lua-resty-mlcache takes as its ipc.
function _M.broadcast(name, opts) return require("moonserve.fanout").broadcast(name, opts) end
--- Which worker this is: id() and count() (moonserve/host/core/worker.lua).
-- @table worker
_M.worker = {
    id = function() return host.module("worker").id() end,
    count = function() return host.module("worker").count() end,
}

--- The dictionaries shared by the workers of the server, by name: moonserve.shared.cache
-- once the app declared app:shared_dict("cache", "10m") (moonserve/host/core/shared.lua).
-- @table shared
_M.shared = require("moonserve.shared").dicts

--- The error log for apps: moonserve.log.info(...), .warn, .error, .debug (moonserve/log.lua).
-- @table log
_M.log = require "moonserve.log"
--- Metrics: the app's own counters, gauges and histograms, and the scrape
-- (moonserve/host/core/metrics.lua), the host's: each name is looked up at its first use, so
-- requiring moonserve asks nothing of the host.
-- @table metrics
_M.metrics = setmetatable({}, {
    __index = function(_, name)
        return host.module("metrics")[name]
    end,
})

--- The secret `name`'s bytes, from a file, the environment, or in development one drawn at
-- random for the whole server (moonserve/config.lua: secret).
-- @tparam string name
-- @tparam[opt] table opts min_bytes (default 32)
-- @usage app:use(moonserve.sessions{ secret = moonserve.secret("session") })
function _M.secret(name, opts)
    local ok, bytes = pcall(require("moonserve.config").secret, name, opts)
    if not ok then
        error(bytes, 2)
    end
    return bytes
end

--- moonserve.config: the environment's settings (moonserve/config.lua), read at the first
-- look; moonserve.env: the environment's name.
-- @table config
setmetatable(_M, {
    __index = function(_, k)
        if k == "config" then
            return require("moonserve.config").get()
        elseif k == "env" then
            return require("moonserve.config").env()
        end
        return nil
    end,
})

return _M
