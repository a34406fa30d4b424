--- moonserve/host/openresty/init.lua: a moonserve app inside nginx with its Lua module (OpenResty, or
-- Debian's nginx with libnginx-mod-http-lua), the same app file the moonserve server runs:
--
--     init_by_lua_block        { my_app = dofile("/srv/app.lua") }
--     init_worker_by_lua_block { require("moonserve.host.openresty").init_worker(my_app) }
--     location / { content_by_lua_block { require("moonserve.host.openresty").run(my_app) } }
--
-- The framework (routing, sites, middleware, sessions, CSRF, templates, error pages) runs as
-- it does on the core; its request and reply are backed by ngx.* (moonserve/host/openresty/), and
-- moonserve.socket, moonserve.timer, light threads, semaphores and moonserve.shared are
-- OpenResty's cosockets, timers, threads, semaphores and lua_shared_dict zones. Requiring
-- moonserve inside nginx never loads the core (moonserve/host/init.lua picks this host there).
-- What cannot be the same is in docs/guide/openresty.md.
-- @module moonserve.openresty

-- luacheck: globals ngx (nginx's Lua module gives it; this runs only inside nginx)
local host = require "moonserve.host"
if not host.under_nginx() then
    error("moonserve.openresty runs inside nginx with its Lua module (content_by_lua_block)", 2)
end
local app_mod = require "moonserve.app"
local request = require "moonserve.host.openresty.request"
local response = require "moonserve.host.openresty.response"
local services = require "moonserve.host.openresty.services"

local ngx = ngx
local traceback, xpcall, pcall, tostring, format = debug.traceback, xpcall, pcall, tostring,
    string.format
local reply_with = app_mod.reply_with

local _M = {}

local LEVELS = { err = ngx.ERR, warn = ngx.WARN, info = ngx.INFO, debug = ngx.DEBUG }

-- RFC 3986 3.3: the bytes a path may hold as they are (the core's ms_ffi_path_plain).
local PATH_NOT_PLAIN = "[^%w%-%._~!$&'()*+,;=:@/%%]"
-- RFC 9110 5.1 and 5.5: "name: value\r\n", a token for the name, no CR, LF or NUL in the value.
local FIELD_LINE = "^[%w!#$%%&'*+%-%.^_`|~]+:[^\r\n%z]*\r\n"

local function fields_ok(lines)
    local at, n = 1, #lines
    while at <= n do
        local _, e = lines:find(FIELD_LINE, at)
        if not e then
            return false
        end
        at = e + 1
    end
    return true
end

--- The host the framework reaches inside nginx (moonserve/host/init.lua).
-- @table host
_M.host = {
    name = "openresty",
    path_plain = function(path)
        return not path:find(PATH_NOT_PLAIN)
    end,
    fields_ok = fields_ok,
    log = function(level, msg)
        ngx.log(LEVELS[level] or ngx.ERR, msg)
    end,
    now = ngx.now,
    sleep = ngx.sleep,
    run = function()
        error("app:run: inside nginx, nginx serves the app: call "
            .. "require(\"moonserve.openresty\").run(app) from content_by_lua_block", 2)
    end,
    module = services.module,
}

-- The host is this one from the first require on, whatever looked the host up before.
host.use(_M.host)

-- The adapter's options per app (init_worker's opts).
local options = setmetatable({}, { __mode = "k" })

-- A handler raised `err`: the app's error policy answers (its log line and error page); a
-- reply whose head already left is cut off, one that nothing answered gets a bare 500.
local function fail(app, req, res, err)
    local ok, perr = pcall(app.handle_error, app, req, res, err)
    if not ok then
        ngx.log(ngx.ERR, "handle_error failed: ", tostring(perr), "; the handler's error: ",
            tostring(err))
    end
    if res:_streaming() then
        return ngx.exit(ngx.ERROR) -- part of the reply is out: cut it off
    elseif not res:sent() then
        res:_reset()
        res:status(500):send("500 Internal Server Error\n")
    end
end

-- The location (for ngx.exec) that serves the static mount `path` falls under, or nil; and
-- whether the mount has a hook, which runs first (its res:static_mount() goes there then).
local function static_exec(app, path)
    local to = options[app] and options[app].static
    for _, m in ipairs(rawget(app, "statics") or {}) do
        local p = m.prefix
        if p == "" or path == p or path:sub(1, #p + 1) == p .. "/" then
            local location = to and to[p == "" and "/" or p]
            if not location then
                error(format("app:static(%q): nginx serves files itself: give init_worker the "
                    .. "location that serves them, { static = { [%q] = \"@files\" } }, or drop "
                    .. "the mount", p, p == "" and "/" or p), 0)
            end
            return location, m.opts.hook ~= nil
        end
    end
    return nil
end

--- Serves the request nginx is handling with `app`: from content_by_lua_block (or
-- content_by_lua_file). The handler's return values, errors and error pages are as on the
-- core.
-- @param app the app (moonserve.app())
-- @usage location / { content_by_lua_block { require("moonserve.host.openresty").run(my_app) } }
function _M.run(app)
    local broken = options[app] and options[app].broken
    if broken then
        ngx.log(ngx.ERR, "the app is not served: ", broken)
        return ngx.exit(500)
    end
    local res = response.new()
    local req = request.new(res)
    if rawget(app, "statics") then
        local ok, location, hooked = pcall(static_exec, app, req.path)
        if not ok then
            return fail(app, req, res, location)
        elseif hooked then
            res._static_location = location
        elseif location then
            return ngx.exec(location)
        end
    end
    local ok, status, body, headers = xpcall(app.handle, traceback, app, req, res)
    if not ok then
        fail(app, req, res, status)
    elseif status ~= nil then
        ok, status = xpcall(reply_with, traceback, res, status, body, headers)
        if not ok then
            fail(app, req, res, status)
        end
    end
    res:_finish()
end

-- Runs `hooks` one after another in a timer (where cosockets work, unlike in init_worker
-- itself): an error is logged and the next runs.
local function run_hooks(what, hooks)
    if not hooks or #hooks == 0 then
        return
    end
    local ok, err = ngx.timer.at(0, function()
        for _, fn in ipairs(hooks) do
            local hok, herr = xpcall(fn, traceback)
            if not hok then
                ngx.log(ngx.ERR, what, " hook failed: ", herr)
            end
        end
    end)
    if not ok then
        ngx.log(ngx.ERR, what, " hooks not run: ", err)
    end
end

--- For init_worker_by_lua_block: checks the app's shared dictionaries against nginx's
-- lua_shared_dict zones and runs its on_worker_start hooks (in a timer, with cosockets);
-- their timers start there. `opts.static` maps each app:static prefix to the nginx location
-- (a named one: "@files") that serves its files.
-- @param app the app
-- @tparam[opt] table opts static = { [prefix] = location }
-- @usage init_worker_by_lua_block { require("moonserve.host.openresty").init_worker(my_app) }
function _M.init_worker(app, opts)
    opts = opts or {}
    options[app] = opts
    -- Fan-out (moonserve.broadcast, a Redis dictionary's cache): its dictionaries, and its
    -- subscriptions from the worker's start.
    local fanout = package.loaded["moonserve.fanout"]
    if fanout then
        fanout.prepare(app)
    end
    local problems = {}
    for name, bytes in pairs(rawget(app, "shared_decl") or {}) do
        if not ngx.shared[name] then
            problems[#problems + 1] = format("shared dictionary '%s': declare it in nginx.conf's "
                .. "http block: lua_shared_dict %s %dk;", name, name, math.ceil(bytes / 1024))
        end
    end
    for _, m in ipairs(rawget(app, "statics") or {}) do
        local key = m.prefix == "" and "/" or m.prefix
        if not (opts.static and opts.static[key]) then
            problems[#problems + 1] = format("app:static(%q): nginx serves files itself: give "
                .. "init_worker { static = { [%q] = \"@files\" } } (a location that serves them)",
                key, key)
        end
    end
    if #problems > 0 then
        -- every request gets a 500 and this line, until nginx.conf is mended
        opts.broken = table.concat(problems, "; ")
        error(opts.broken, 2)
    end
    run_hooks("on_worker_start", rawget(app, "worker_start_hooks"))
end

--- For exit_worker_by_lua_block: runs the app's on_worker_stop hooks (no cosockets there, as
-- nginx allows none as a worker exits).
-- @param app the app
function _M.exit_worker(app)
    for _, fn in ipairs(rawget(app, "worker_stop_hooks") or {}) do
        local ok, err = xpcall(fn, traceback)
        if not ok then
            ngx.log(ngx.ERR, "on_worker_stop hook failed: ", err)
        end
    end
end

return _M
