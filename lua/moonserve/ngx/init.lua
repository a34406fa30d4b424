-- moonserve/ngx/init.lua: OpenResty's `ngx` API over moonserve, so that code written for
-- content_by_lua and the lua-resty drivers run unchanged. `require "moonserve.ngx"` installs
-- one global `ngx` in the process (an app file's top level runs in the master and again in
-- each worker); its per-request fields (ngx.ctx, ngx.status, ngx.headers_sent, ngx.arg) and
-- the objects ngx.header and ngx.var resolve, at each use, to the context the running code
-- is in: a request's handler, its own coroutines and light threads, a timer, a hook
-- (moonserve/ngx/context.lua). Functions taken at load (local tcp = ngx.socket.tcp) work.
-- The parts: context, output, req, var, time, codec, errlog, process, loader (require).
-- Inside nginx, ngx is nginx's own: the layer has nothing to add (an app file with
-- app:ngx_content routes runs there through moonserve.openresty).
if require("moonserve.host").under_nginx() then
    return rawget(_G, "ngx")
end

-- OpenResty libraries call libcrypto, libssl and a few of nginx's own C functions through
-- ffi.C, some as they load (resty.aes: EVP_md5()); loading the core's module makes them the
-- process's global symbols (luaopen_moonserve_core), so it loads here, before the app's code
-- requires them.
require "moonserve.host.core.base"

local context = require "moonserve.ngx.context"
local output = require "moonserve.ngx.output"
local req = require "moonserve.ngx.req"
local var = require "moonserve.ngx.var"
local ntime = require "moonserve.ngx.time"
local codec = require "moonserve.ngx.codec"
local errlog = require "moonserve.ngx.errlog"
local process = require "moonserve.ngx.process"
local loader = require "moonserve.ngx.loader"
require "moonserve.host.core.coroutine" -- waits through the user's coroutines: installed before the app's

local type, error, rawset = type, error, rawset
local state, request_state = context.state, context.request

-- ngx.null is cjson.null, as in OpenResty: the same NULL light userdata.
local null = require("cjson").null
output.init(null)
errlog.init(null)

-- mod's fn, loaded at the first call (an app file's top level needs no core).
local function lazy(mod, fn)
    local f
    return function(...)
        if not f then
            f = require(mod)[fn]
        end
        return f(...)
    end
end

-- The same, for what waits or makes what waits: disabled in the filter and log phases.
local check_yield = context.check_yield
local function waits(mod, fn)
    local f
    return function(...)
        check_yield(2)
        if not f then
            f = require(mod)[fn]
        end
        return f(...)
    end
end

-- The same for a function of no arguments, called once a request by the drivers
-- (ngx.socket.tcp): a vararg call made where a trace starts is not compiled.
local function waits0(mod, fn)
    local f
    return function()
        check_yield(2)
        if not f then
            f = require(mod)[fn]
        end
        return f()
    end
end

local ngx = {
    null = null,
    -- nginx's return codes
    OK = 0, ERROR = -1, AGAIN = -2, DONE = -4, DECLINED = -5,
    -- output
    say = output.say, print = output.print, flush = output.flush, eof = output.eof,
    exit = output.exit, redirect = output.redirect, send_headers = output.send_headers,
    header = output.header,
    -- request
    req = {
        get_method = req.get_method, get_headers = req.get_headers,
        get_uri_args = req.get_uri_args, get_post_args = req.get_post_args,
        read_body = req.read_body, get_body_data = req.get_body_data,
        get_body_file = req.get_body_file, discard_body = function() end,
        set_header = req.set_header, clear_header = req.clear_header,
        http_version = req.http_version, start_time = req.start_time,
        raw_header = req.raw_header, set_uri = req.set_uri, set_uri_args = req.set_uri_args,
        is_internal = req.is_internal, socket = req.socket,
    },
    var = var.var,
    -- time
    now = ntime.now, time = ntime.time, today = ntime.today, localtime = ntime.localtime,
    utctime = ntime.utctime, update_time = ntime.update_time, http_time = ntime.http_time,
    cookie_time = ntime.cookie_time, parse_http_time = ntime.parse_http_time,
    -- codecs
    encode_base64 = codec.encode_base64, decode_base64 = codec.decode_base64,
    md5 = codec.md5, md5_bin = codec.md5_bin, sha1_bin = codec.sha1_bin,
    hmac_sha1 = codec.hmac_sha1, crc32_short = codec.crc32, crc32_long = codec.crc32,
    escape_uri = codec.escape_uri, unescape_uri = codec.unescape_uri,
    encode_args = codec.encode_args,
    decode_args = function(s, max) return (codec.decode_args(s, max)) end,
    quote_sql_str = codec.quote_sql_str,
    -- log
    log = errlog.log,
    -- sockets, shared dictionaries, timers, threads
    socket = {
        tcp = waits0("moonserve.host.core.socket", "ngx_tcp"),
        udp = waits0("moonserve.host.core.socket", "ngx_udp"),
        stream = waits0("moonserve.host.core.socket", "ngx_tcp"),
    },
    shared = require("moonserve.shared").dicts,
    timer = {
        at = lazy("moonserve.host.core.timer", "at"),
        every = lazy("moonserve.host.core.timer", "every"),
        running_count = function()
            local _, running = require("moonserve.host.core.timer").counts()
            return running
        end,
        pending_count = function()
            return (require("moonserve.host.core.timer").counts())
        end,
    },
    thread = {
        spawn = waits("moonserve.host.core.dispatcher", "spawn"),
        wait = lazy("moonserve.host.core.dispatcher", "wait"),
        kill = lazy("moonserve.host.core.dispatcher", "kill"),
    },
    sleep = waits("moonserve.host.core.dispatcher", "sleep"),
    -- a thread pool's thread with a LuaJIT state of its own (moonserve/host/core/threads.lua)
    run_worker_thread = waits("moonserve.host.core.threads", "run"),
    worker = {
        id = lazy("moonserve.host.core.worker", "id"),
        count = lazy("moonserve.host.core.worker", "count"),
        pid = process.pid,
        exiting = function()
            local d = package.loaded["moonserve.host.core.dispatcher"]
            return d ~= nil and d.stopping()
        end,
    },
    config = {
        subsystem = "http",
        ngx_lua_version = 10023,
        nginx_version = 1022001,
        debug = false,
        is_console = false,
        prefix = function() return "" end,
        nginx_configure = function() return "" end,
        moonserve = true, -- (not OpenResty's: tells this layer from nginx's own ngx)
    },
    location = {
        capture = lazy("moonserve.ngx.capture", "capture"),
        capture_multi = lazy("moonserve.ngx.capture", "capture_multi"),
    },
}

-- ngx.socket.connect(host, port[, opts]): a connected socket, or nil and the error.
function ngx.socket.connect(host, port, opts)
    local sock = ngx.socket.tcp()
    local ok, err = sock:connect(host, port, opts)
    if not ok then
        return nil, err
    end
    return sock
end

-- nginx's log levels and HTTP constants.
for name, level in pairs(errlog.LEVELS) do
    ngx[name] = level
end
local STATUSES = {
    CONTINUE = 100, SWITCHING_PROTOCOLS = 101, OK = 200, CREATED = 201, ACCEPTED = 202,
    NO_CONTENT = 204, PARTIAL_CONTENT = 206, SPECIAL_RESPONSE = 300, MOVED_PERMANENTLY = 301,
    MOVED_TEMPORARILY = 302, SEE_OTHER = 303, NOT_MODIFIED = 304, TEMPORARY_REDIRECT = 307,
    PERMANENT_REDIRECT = 308, BAD_REQUEST = 400, UNAUTHORIZED = 401, PAYMENT_REQUIRED = 402,
    FORBIDDEN = 403, NOT_FOUND = 404, NOT_ALLOWED = 405, NOT_ACCEPTABLE = 406,
    REQUEST_TIMEOUT = 408, CONFLICT = 409, GONE = 410, UPGRADE_REQUIRED = 426,
    TOO_MANY_REQUESTS = 429, CLOSE = 444, ILLEGAL = 451, INTERNAL_SERVER_ERROR = 500,
    METHOD_NOT_IMPLEMENTED = 501, BAD_GATEWAY = 502, SERVICE_UNAVAILABLE = 503,
    GATEWAY_TIMEOUT = 504, VERSION_NOT_SUPPORTED = 505, INSUFFICIENT_STORAGE = 507,
}
for name, code in pairs(STATUSES) do
    ngx["HTTP_" .. name] = code
end
local METHODS = { GET = 2, HEAD = 4, POST = 8, PUT = 16, DELETE = 32, MKCOL = 64, COPY = 128,
    MOVE = 256, OPTIONS = 512, PROPFIND = 1024, PROPPATCH = 2048, LOCK = 4096, UNLOCK = 8192,
    PATCH = 16384, TRACE = 32768 }
for name, code in pairs(METHODS) do
    ngx["HTTP_" .. name] = code
end

function ngx.get_phase()
    return state().phase
end

-- lua_check_client_abort is off in OpenResty unless configured: so it is here.
function ngx.on_abort(fn)
    if type(fn) ~= "function" then
        error("bad argument #1 to 'on_abort' (function expected, got " .. type(fn) .. ")", 2)
    end
    request_state(2)
    return nil, "lua_check_client_abort is off"
end

-- -- The fields that resolve per context ---------------------------------------------------

local getters = {
    ctx = function()
        local st = state()
        local ctx = st.ctx
        if ctx == nil then
            ctx = {}
            st.ctx = ctx
        end
        return ctx
    end,
    status = function()
        return output.get_status(request_state(3))
    end,
    headers_sent = function()
        return output.headers_sent(request_state(3))
    end,
    arg = function() -- the body filter's chunk and eof flag (moonserve/ngx/phases.lua)
        local arg = state().arg
        if arg == nil then
            error("API disabled in the current context", 3)
        end
        return arg
    end,
    re = function()
        local ok, re = pcall(require, "moonserve.ngx.re")
        if not ok then
            error("ngx.re: not yet available in this moonserve (moonserve.ngx.re: "
                .. tostring(re):match("^[^\n]*") .. ")", 3)
        end
        rawset(ngx, "re", re)
        return re
    end,
}

local setters = {
    ctx = function(v)
        if type(v) ~= "table" then
            error("ctx should be a table while setting field 'ctx'", 3)
        end
        state().ctx = v
    end,
    status = function(v)
        output.set_status(request_state(3), v)
    end,
}

setmetatable(ngx, {
    __index = function(_, k)
        local get = getters[k]
        if get then
            return get()
        end
        return nil
    end,
    __newindex = function(t, k, v)
        local set = setters[k]
        if set then
            return set(v)
        end
        if getters[k] then
            error("attempt to set ngx." .. k, 2)
        end
        rawset(t, k, v)
    end,
})

-- The framework's app:ngx_content and ngx hooks run on this layer: it installs itself there
-- (moonserve/app.lua: use_ngx), with the phases a request meets (moonserve/ngx/phases.lua,
-- loaded with the first app that has hooks).
require("moonserve.app").use_ngx {
    phases = function(hooks, statics)
        return require("moonserve.ngx.phases").new(hooks, statics)
    end,
}
-- An app:ngx_content route's reply is the ngx code's (moonserve/ngx/output.lua writes it
-- through the core's reply object). Its ngx state is made as the route starts, before its code
-- runs: made at its first ngx call instead, deep in a driver's code, the state's making is a
-- branch that one call per request takes and the others do not, and the side trace it grows
-- returns through the driver's frames, which LuaJIT often cannot compile (a tail call of
-- setmetatable there).
require("moonserve.host.core.response").methods._ngx_begin = function()
    state()
end

loader.install()
rawset(_G, "ngx", ngx)

return ngx
