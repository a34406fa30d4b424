--- moonserve/app.lua: an application: routes, middleware, groups, sites and mounted apps,
-- and how a request goes through them.
-- It reaches whatever serves it only through moonserve/host/init.lua (and the request and reply
-- objects the host hands to app:handle), so that defining an app loads no part of the core.
--
-- `App`: An application (moonserve.app()) or a site (app:site(host)): its routes, middleware,
--   static mounts, error pages and settings.
-- `Group`: A group of routes under a prefix, with middleware of its own (app:group).
-- @module moonserve.app
local canon = require "moonserve.canon"
local the_host = require "moonserve.host" -- whatever serves the app: its log, its run
local router = require "moonserve.router"
local security = require "moonserve.security"

local find, format, lower, sub, type, select = string.find, string.format, string.lower,
    string.sub, type, select
local rawget, tostring, pcall = rawget, tostring, pcall
local concat = table.concat

local ESCAPES = { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;", ["'"] = "&#39;" }
local function html_escape(s)
    return (s:gsub("[&<>\"']", ESCAPES))
end

local App = {}
App.__index = App

local _M = { methods = App }

-- What app:ngx_content and the ngx hooks need of OpenResty's `ngx` API, which the framework
-- has not: the ngx layer (moonserve/ngx/init.lua, OpenResty's API over the core's host) fills
-- it when required, with phases(hooks, statics), what a request meets of the hooks. Inside
-- nginx its own ngx serves app:ngx_content, and the hooks belong to nginx.conf.
local ngx_layer

--- Installs the ngx layer's part of the framework (moonserve/ngx/init.lua calls it).
-- @local
function _M.use_ngx(layer)
    ngx_layer = layer
end

local NGX_MISSING = " runs OpenResty code, which needs the ngx layer: require \"moonserve.ngx\" "
    .. "before the app's routes"

local METHODS = { "get", "post", "put", "patch", "delete", "options", "head" }

-- -- Sites inherit ------------------------------------------------------------------------

-- What `app` has under `key` (with `sub_key`: app[key][sub_key]), else what its parent has,
-- and so on up: a site without its own security, error page, views, dev or path settings
-- has its app's. Requests read the settings through resolved (below), which asks once.
local function inherited(app, key, sub_key)
    local v = rawget(app, key)
    if v ~= nil and sub_key ~= nil then
        v = v[sub_key]
    end
    if v == nil then
        local parent = rawget(app, "parent")
        if parent then
            return inherited(parent, key, sub_key)
        end
    end
    return v
end
--- What a site has of its app: the value of `key` (and `sub_key`) on the app or the
-- nearest parent that sets it.
-- @local
_M.inherited = inherited

-- Drops what was worked out from `app`'s settings (resolved, and the middleware chain),
-- its own and its sites'.
local function forget(app)
    app.resolved, app.chain = nil, nil
    for _, site in pairs(app.sites or {}) do
        forget(site)
    end
end

-- The settings a site may have of its own (and else has its app's), from moonserve.app's or
-- app:site's options: "trailing", "canonical", "dev". An app has all three. Misuse raises
-- at `level`, counted from the caller of settings.
local function settings(app, opts, is_site, level)
    local trailing = opts.trailing_slash
    if trailing == nil and not is_site then
        trailing = "strip"
    end
    if trailing ~= nil and trailing ~= "strip" and trailing ~= "add" and trailing ~= "keep" then
        error("bad trailing_slash (strip, add or keep)", level + 1)
    end
    app.trailing = trailing
    if opts.canonical ~= nil or not is_site then
        app.canonical = opts.canonical ~= false
    end
    if opts.dev ~= nil or not is_site then
        app.dev = opts.dev and true or false
    end
    forget(app)
end

local function new(opts, parent, level)
    local app = setmetatable({ router = router.new(), middleware = {}, sites = nil,
        opts = opts, error_pages = {}, parent = parent }, App)
    settings(app, opts, parent ~= nil, level + 1)
    return app
end

--- moonserve.app(opts): opts.trailing_slash ("strip", the default: "/a/" redirects to
-- "/a"; "add"; "keep"), opts.canonical (default true: non-canonical paths redirect with 308),
-- opts.security (see app:security), opts.dev (error pages show the traceback).
-- @tparam[opt] table opts
-- @treturn App
-- @usage local app = require("moonserve").app{ trailing_slash = "add" }
function _M.new(opts)
    opts = opts or {}
    local app = new(opts, nil, 2)
    if opts.security ~= nil then
        app:security(opts.security)
    end
    return app
end

--- Security headers and the origin check for this app or site: false for no headers, or a
-- table of nosniff, referrer, frame ("DENY", "SAMEORIGIN" or false), csp, hsts ({ max_age,
-- include_subdomains, preload } or false; sent only to requests that came over TLS), and
-- csrf (the origin check of unsafe methods: false turns it off; { origins = { "https://
-- app.example.org" }, same_site = true } lets those in). A site without its own settings
-- has its app's.
function App:security(opts)
    self.secure = security.compile(opts)
    forget(self)
    return self
end

-- The defaults, made at first use: checking their lines needs the host.
local default_security
local split_host, same_origin, SAFE = security.split_host, security.same_origin, security.SAFE

local function defaults()
    default_security = security.compile(nil)
    return default_security
end

-- The ngx phases a request through `app` meets (moonserve/ngx/phases.lua): its hooks after
-- those of the app it is a site of, and the static mounts they guard; false for none.
local function phases_of(app)
    local chain, a = {}, app
    while a do
        table.insert(chain, 1, a)
        a = rawget(a, "parent")
    end
    local hooks, any = {}, false
    for _, x in ipairs(chain) do
        for phase, fns in pairs(rawget(x, "ngx_hooks") or {}) do
            local list = hooks[phase] or {}
            hooks[phase] = list
            for i = 1, #fns do
                list[#list + 1] = fns[i]
            end
            any = true
        end
    end
    local statics = rawget(app, "ngx_statics")
    if not any and not statics then
        return false
    end
    return ngx_layer.phases(hooks, statics)
end

-- What a request through `app` needs of the settings a site inherits, looked up once (at
-- its first request, and again after a setting changes: forget) instead of per request.
local function resolved(app)
    local r = app.resolved
    if r == nil then
        r = { secure = inherited(app, "secure") or default_security or defaults(),
            canonical = inherited(app, "canonical"), trailing = inherited(app, "trailing"),
            views = inherited(app, "views_engine") or false, phases = phases_of(app) }
        app.resolved = r
    end
    return r
end

local function security_of(app)
    return resolved(app).secure
end

--- Adds the security headers to a reply.
-- @local
function App:secure_reply(req, res)
    local sec = security_of(self)
    if sec.always ~= "" then
        res:_fields_checked(sec.always)
    end
    if sec.https ~= "" and req.scheme == "https" then
        res:_fields_checked(sec.https)
    end
end

--- Templates for res:render: opts as moonserve.template.new ({ root = "views", cache =
-- true, helpers = {...} }). A site without its own views uses its app's.
-- @tparam table opts
-- @return the template engine (its helpers table extends the templates' helpers)
function App:views(opts)
    self.views_engine = require("moonserve.template").new(opts)
    forget(self)
    return self.views_engine
end

--- An error page: fn(req, res, info) answers for `status` (info.status; for 5xx also
-- info.ref, the id in the log line). A site without its own page uses its app's.
-- @tparam integer status
-- @tparam function fn
-- @return the app
function App:error_page(status, fn)
    if type(status) ~= "number" or type(fn) ~= "function" then
        error("bad error page (status and function expected)", 2)
    end
    self.error_pages[status] = fn
    return self
end

--- Whether this app (or the app it belongs to) has an error page for `status`: middleware
-- that refuses (moonserve.csrf) answers through it then, in the app's shape.
-- @local
function App:has_error_page(status)
    return inherited(self, "error_pages", status) ~= nil
end

local REASONS = { [400] = "Bad Request", [401] = "Unauthorized", [403] = "Forbidden",
    [404] = "Not Found", [405] = "Method Not Allowed", [406] = "Not Acceptable",
    [408] = "Request Timeout", [409] = "Conflict", [410] = "Gone", [413] = "Content Too Large",
    [429] = "Too Many Requests", [500] = "Internal Server Error", [501] = "Not Implemented",
    [502] = "Bad Gateway", [503] = "Service Unavailable", [504] = "Gateway Timeout" }

-- The statuses the core refuses with by itself (and 403 for a cross-site request), the most a
-- body may hold, and the kinds of body by the names app:refusal_body takes.
local REFUSALS = { [400] = true, [403] = true, [408] = true, [413] = true, [414] = true,
    [431] = true, [503] = true }
local REFUSAL_BODY_MAX = 16384
local REFUSAL_KINDS = { "text", "json", "html" }

-- Whether `s` is whole UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
local function utf8_ok(s)
    local i, n = 1, #s
    while i <= n do
        local c = s:byte(i)
        local len, min
        if c < 0x80 then
            len = 1
        elseif c >= 0xC2 and c <= 0xDF then
            len, min = 2, 0x80
        elseif c >= 0xE0 and c <= 0xEF then
            len, min = 3, 0x800
        elseif c >= 0xF0 and c <= 0xF4 then
            len, min = 4, 0x10000
        else
            return false
        end
        if len > 1 then
            local cp = c % (2 ^ (7 - len))
            for j = i + 1, i + len - 1 do
                local b = s:byte(j)
                if not b or b < 0x80 or b > 0xBF then
                    return false
                end
                cp = cp * 64 + b % 64
            end
            if cp < min or cp > 0x10FFFF or (cp >= 0xD800 and cp <= 0xDFFF) then
                return false
            end
        end
        i = i + len
    end
    return true
end

--- The bodies of the core's own refusals (400, 403 cross-site, 408, 413, 414, 431, 503) in
-- place of its text ("413 Content Too Large"): the core answers them without entering Lua,
-- with the JSON body when the request's Accept names application/json or a +json type, the
-- HTML one when it names text/html (whichever first), else the text, else the first of JSON
-- and HTML given. Each body is at most 16 KiB and valid as given (JSON that parses, UTF-8);
-- anything else raises at start. Set before the app runs; a site or mounted app uses its
-- top app's (the core answers before any routing).
-- @tparam integer status
-- @tparam table bodies { json = string, html = string, text = string }, one at least
-- @return the app
function App:refusal_body(status, bodies)
    if not REFUSALS[status] then
        error("bad refusal body: the core refuses with 400, 403, 408, 413, 414, 431 or 503, not "
            .. tostring(status), 2)
    end
    if type(bodies) ~= "table" then
        error("bad refusal body for " .. status .. " ({ json =, html =, text = } expected)", 2)
    end
    local set, any = {}, false
    for k, v in pairs(bodies) do
        if k ~= "json" and k ~= "html" and k ~= "text" then
            error("bad refusal body for " .. status .. ": unknown kind " .. tostring(k)
                .. " (json, html or text)", 2)
        end
        if type(v) ~= "string" then
            error("bad refusal body for " .. status .. ": " .. k .. " must be a string", 2)
        end
        if #v > REFUSAL_BODY_MAX then
            error("bad refusal body for " .. status .. ": " .. k .. " is " .. #v
                .. " bytes, more than 16384", 2)
        end
        if not utf8_ok(v) then
            error("bad refusal body for " .. status .. ": " .. k .. " is not UTF-8", 2)
        end
        if k == "json" then
            if require("cjson.safe").decode(v) == nil then
                error("bad refusal body for " .. status .. ": json is not valid JSON", 2)
            end
        end
        set[k] = v
        any = true
    end
    if not any then
        error("bad refusal body for " .. status .. " (json, html or text expected)", 2)
    end
    self.refusal_bodies = self.refusal_bodies or {}
    self.refusal_bodies[status] = set
    return self
end

local REFUSAL_TYPES = { text = "text/plain; charset=utf-8", json = "application/json",
    html = "text/html; charset=utf-8" }
--- The app's refusal body in `set` (app:refusal_body's table for one status) as `accept`
-- asks for it, by the core's rule; for the refusals made in Lua (403 cross-site).
-- @local
-- @treturn ?string the body, or nil when `set` is nil
-- @treturn ?string its content type
function _M.refusal_pick(set, accept)
    if not set then
        return nil
    end
    accept = type(accept) == "string" and accept:lower() or nil
    local json = set.json and accept and accept:find("[/+]json")
    local html = set.html and accept and accept:find("text/html", 1, true)
    local kind
    if json or html then
        kind = (json and (not html or json < html)) and "json" or "html"
    else
        for _, k in ipairs(REFUSAL_KINDS) do
            if set[k] then
                kind = k
                break
            end
        end
    end
    return set[kind], REFUSAL_TYPES[kind]
end

--- The app's bodies for the core's refusals, by status (app:refusal_body), for the host to
-- hand to the core at start.
-- @local
function App:refusal_bodies_of()
    return rawget(self, "refusal_bodies") or {}
end

--- Answers with the error page for info.status.
function App:error(req, res, info)
    local page = inherited(self, "error_pages", info.status)
    if page then
        return page(req, res, info)
    end
    if info.refusal then -- one of the core's refusals made in Lua (403 cross-site)
        local body, ctype = _M.refusal_pick(inherited(self, "refusal_bodies", info.status),
            req:header("accept"))
        if body then
            return res:status(info.status):header("content-type", ctype):send(body)
        end
    end
    local reason = REASONS[info.status] or "Error"
    local trace = inherited(self, "dev") and info.trace or nil
    -- The client's kind of page (RFC 9110 12.5.1): a browser's Accept ranks HTML first, an API
    -- client's JSON, curl's */* takes the first offered, text.
    local kind = req.accepts and req:accepts("text", "json", "html") -- (a bare host: text)
    if kind == "json" and info.status >= 400 and info.status <= 599 then
        return res:error_json(info.status, reason, { ref = info.ref, trace = trace })
    elseif kind == "html" then
        local title = info.status .. " " .. reason
        local parts = { "<!doctype html>\n<title>", title, "</title>\n<h1>", title, "</h1>\n" }
        if info.ref then
            parts[#parts + 1] = "<p>reference: " .. html_escape(info.ref) .. "</p>\n"
        end
        if trace then
            parts[#parts + 1] = "<pre>" .. html_escape(trace) .. "</pre>\n"
        end
        return res:status(info.status):header("content-type", REFUSAL_TYPES.html)
            :send(concat(parts))
    end
    local text = info.status .. " " .. reason .. "\n"
    if info.ref then
        text = text .. "reference: " .. info.ref .. "\n"
    end
    if trace then
        text = text .. "\n" .. trace .. "\n"
    end
    return res:status(info.status):send(text)
end

-- -- Errors raised by handlers ------------------------------------------------------------

local seeded = false

-- A short id that ties an error page to its log line.
local function reference(req)
    if not seeded then
        seeded = true
        math.randomseed(os.time() + math.floor(os.clock() * 1e6))
    end
    local ok, id = pcall(function() return req.id end)
    if ok and type(id) == "string" and id ~= "" then
        return id -- the access log's request_id: one id ties the page, the error and the line
    end
    return format("%06x%04x", math.random(0, 0xffffff), (ok and tonumber(id) or 0) % 0x10000)
end

--- What a handler's error means: the host calls it on the app it serves when app:handle
-- raised `err` (the message with its traceback). This one logs the error with a reference
-- id, gives it to the on_error handlers (the site's, then its app's), and unless one of them
-- answered, answers with the 500 error page (app:error with { status = 500, ref, trace }:
-- the trace shows in dev mode). If part of the reply has left already, it only logs: the host
-- cuts the reply off. A site or mounted app with a handle_error of its own has its requests'
-- errors given to that. Override it to change any of this; an override that sends nothing
-- leaves a bare 500 to the host.
function App:handle_error(req, res, err)
    local site = rawget(req, "_app") or self
    local a = site
    while a and a ~= self do
        local own = rawget(a, "handle_error")
        if own then
            return own(a, req, res, err)
        end
        a = rawget(a, "parent")
    end
    local ref = reference(req)
    local ok, method, path = pcall(function() return req.method, req.path end)
    if not ok then
        method, path = "?", "?"
    end
    the_host.log("err", format("[%s] %s %s: %s", ref, method, path, tostring(err)))
    a = site
    while a and not res:sent() do
        local handlers = rawget(a, "error_handlers")
        for i = 1, handlers and #handlers or 0 do
            local hok, herr = pcall(handlers[i], req, res, err, ref)
            if not hok then
                the_host.log("err", format("[%s] error handler failed: %s", ref, tostring(herr)))
            end
            if res:sent() then
                break
            end
        end
        a = rawget(a, "parent")
    end
    if res:sent() then
        return
    end
    res:_reset()
    local shown = pcall(function()
        site:secure_reply(req, res)
        site:error(req, res, { status = 500, ref = ref, trace = tostring(err) })
    end)
    if not shown and not res:sent() then
        res:_reset()
        res:status(500):send("500 Internal Server Error\nreference: " .. ref .. "\n")
    end
end

-- A route's value: its handler alone, or { handler, before = { middleware }, group,
-- body_bytes, handler_cpu_ms, csrf } when it has any of those.
--
-- The arguments after the method: [name,] path, [middleware...,] handler[, opts].
local function add(self, method, group, ...)
    local n = select("#", ...)
    local args = { ... }
    local i, name = 1, nil
    if type(args[2]) == "string" then -- a name comes first: ("user", "/users/:id", ...)
        name, i = args[1], 2
    end
    local path = args[i]
    if type(path) ~= "string" then
        error("bad route path (string expected)", 3)
    end
    local opts
    if type(args[n]) == "table" then
        opts, n = args[n], n - 1
    end
    local handler = args[n]
    if type(handler) ~= "function" or n <= i then
        error("bad handler for " .. method .. " " .. path .. " (function expected)", 3)
    end
    local before = {}
    for k = i + 1, n - 1 do
        if type(args[k]) ~= "function" then
            error("bad middleware for " .. method .. " " .. path .. " (function expected)", 3)
        end
        before[#before + 1] = args[k]
    end
    local bytes = opts and opts.body_bytes
    if bytes ~= nil and (type(bytes) ~= "number" or bytes < 0) then
        error("bad body_bytes for " .. path .. " (bytes expected)", 3)
    end
    local cpu = opts and opts.handler_cpu_ms
    if cpu ~= nil and (type(cpu) ~= "number" or cpu < 0 or cpu % 1 ~= 0) then
        error("bad handler_cpu_ms for " .. path .. " (milliseconds expected)", 3)
    end
    local csrf = opts and opts.csrf
    if csrf ~= nil and csrf ~= false then
        error("bad csrf option for " .. path .. " (false or nothing expected)", 3)
    end
    local value = handler
    if #before > 0 or group or bytes or cpu or csrf == false then
        value = { handler = handler, before = before[1] and before, group = group,
            body_bytes = bytes, handler_cpu_ms = cpu, csrf = csrf }
    end
    if group then
        path = group.prefix .. (path == "/" and "" or path)
        if path == "" then
            path = "/"
        end
    end
    self.router:add(method, path, value, name)
    return self
end

--- app:route(method, [name,] path, [middleware...,] handler[, opts]);
-- opts.body_bytes: this route's body limit; opts.handler_cpu_ms: its CPU budget between two
-- waits (0: none); opts.csrf = false: no origin check (see app:security) for this route.
function App:route(method, ...)
    if type(method) ~= "string" then
        error("bad method (string expected)", 2)
    end
    add(self, method:upper(), nil, ...)
    return self
end

--- A GET route: `app:get([name,] path, [middleware...,] handler[, opts])`, as App:route with
-- the method named. A HEAD request is served by the GET route, without the body.
-- @function App:get
-- @usage app:get("user", "/users/:id", function(req, res) res:json{ id = req.params.id } end)

--- A POST route, as App:get.
-- @function App:post

--- A PUT route, as App:get.
-- @function App:put

--- A PATCH route, as App:get.
-- @function App:patch

--- A DELETE route, as App:get.
-- @function App:delete

--- A OPTIONS route, as App:get.
-- @function App:options

--- A HEAD route, as App:get.
-- @function App:head
for _, m in ipairs(METHODS) do
    local M = m:upper()
    App[m] = function(self, ...)
        add(self, M, nil, ...)
        return self
    end
end

--- A route whose handler is OpenResty code, as content_by_lua runs it: fn() takes no
-- arguments, answers with ngx.say, ngx.exit and the rest of the ngx API (moonserve/ngx/init.lua),
-- and what it returns is ignored. Like an nginx location, every method reaches it (HEAD
-- through GET). opts as a route's.
function App:ngx_content(path, fn, opts)
    if type(fn) ~= "function" then
        error("bad handler for ngx_content " .. tostring(path) .. " (function expected)", 2)
    end
    if not ngx_layer and not the_host.under_nginx() then
        error("app:ngx_content" .. NGX_MISSING, 2)
    end
    local function content(_, res)
        res:_ngx_begin() -- the reply is the ngx code's from here
        fn()
    end
    for _, m in ipairs(METHODS) do
        if m ~= "head" then
            if opts then
                add(self, m:upper(), nil, path, content, opts)
            else
                add(self, m:upper(), nil, path, content)
            end
        end
    end
    return self
end

-- OpenResty's other phases as hooks (moonserve/ngx/phases.lua), each fn() in the ngx API.
-- A site's run after its app's.
local function ngx_hook(self, phase, name, fn)
    if type(fn) ~= "function" then
        error("bad argument #1 to '" .. name .. "' (function expected, got " .. type(fn) .. ")", 3)
    end
    if the_host.under_nginx() then
        error(name .. ": inside nginx, give nginx.conf's " .. phase .. "_by_lua_block the hook",
            3)
    end
    if not ngx_layer then
        error(name .. NGX_MISSING, 3)
    end
    local hooks = rawget(self, "ngx_hooks") or {}
    self.ngx_hooks = hooks
    local list = hooks[phase] or {}
    hooks[phase] = list
    list[#list + 1] = fn
    forget(self)
    return self
end

--- OpenResty's access phase: fn() runs before the routes for every request through the app
-- (and its sites), the core's static mounts included, which then enter Lua first.
-- `ngx.exit(ngx.OK)` goes on to the content; 2xx or output ends the request; 300 or more
-- sends the error page.
-- @param fn the hook, in the ngx API
-- @return the app
function App:ngx_access(fn)
    return ngx_hook(self, "access", "ngx_access", fn)
end

--- OpenResty's header filter: fn() sees and changes the reply's fields (`ngx.header`,
-- `ngx.status`) just before the head of a reply made in Lua leaves.
-- @param fn the hook, in the ngx API
-- @return the app
function App:ngx_header_filter(fn)
    return ngx_hook(self, "header_filter", "ngx_header_filter", fn)
end

--- OpenResty's body filter: fn() changes each piece of a reply made in Lua as `ngx.arg[1]`,
-- `ngx.arg[2]` true on the last.
-- @param fn the hook, in the ngx API
-- @return the app
function App:ngx_body_filter(fn)
    return ngx_hook(self, "body_filter", "ngx_body_filter", fn)
end

--- OpenResty's log phase: fn() runs after the reply has left, with `ngx.var.status` and
-- `request_time`.
-- @param fn the hook, in the ngx API
-- @return the app
function App:ngx_log(fn)
    return ngx_hook(self, "log", "ngx_log", fn)
end

--- A WebSocket endpoint: fn(ws, req) runs on the socket once the upgrade is accepted
-- (HTTP/1.1 GET with Upgrade, or HTTP/2's extended CONNECT), after the app's middleware,
-- which may refuse it as it would any request. Instead of fn, a table of callbacks
-- { open = fn(ws, req), message = fn(ws, data, kind), close = fn(ws, code, reason) } (each
-- optional): such a socket parks no coroutine between messages. opts: see
-- moonserve/host/core/websocket.lua (compile) and docs/API.md. The handshake does its own origin
-- check, so the route's is off.
function App:websocket(path, fn, opts)
    if type(path) ~= "string" then
        error("bad websocket path (string expected)", 2)
    end
    if type(fn) == "table" then
        for k, v in pairs(fn) do
            if (k ~= "open" and k ~= "message" and k ~= "close") or type(v) ~= "function" then
                error("bad callback " .. tostring(k) .. " for websocket " .. path
                    .. " (open, message and close functions expected)", 2)
            end
        end
    elseif type(fn) ~= "function" then
        error("bad handler for websocket " .. path .. " (function or table of callbacks "
            .. "expected)", 2)
    end
    local websocket = the_host.module("websocket")
    local o = websocket.compile(opts, path, 2)
    local serve = websocket.serve
    local function handler(req, res)
        return serve(req, res, fn, o)
    end
    local route = { csrf = false }
    add(self, "GET", nil, path, handler, route)
    add(self, "CONNECT", nil, path, handler, route)
    return self
end

--- A channel that carries WebSocket messages to the subscribers of every worker
-- (moonserve/host/core/channel.lua): ch:subscribe(ws), ch:publish(data[, "binary"]). It keeps its ring
-- in a shared dictionary of its own, declared here. opts: history, size, poll, hole_wait,
-- max_message_bytes.
function App:channel(name, opts)
    return the_host.module("channel").declare(self, name, opts, 2)
end

--- Adds middleware: function(req, res, next). It answers, or calls next() to pass on (and
-- gets back what the rest returned).
-- @tparam function fn function(req, res, next)
-- @return the app
-- @usage app:use(function(req, res, next)
--     res:header("x-request-id", req.id)
--     return next()
-- end)
function App:use(fn)
    if type(fn) ~= "function" then
        error("bad middleware (function expected)", 2)
    end
    self.middleware[#self.middleware + 1] = fn
    forget(self)
    return self
end

-- -- Groups ---------------------------------------------------------------------------------

-- A path prefix ("/admin", "/admin/" -> "/admin") for groups, mounts and site bases; misuse
-- raises at the caller's caller. "/" becomes "" (no prefix) unless refused.
local function prefix_of(p, what, allow_root)
    if type(p) ~= "string" or sub(p, 1, 1) ~= "/" or (p == "/" and not allow_root) then
        error("bad " .. what .. " (a path" .. (allow_root and "" or " other than /")
            .. " expected)", 3)
    end
    return sub(p, -1) == "/" and sub(p, 1, -2) or p
end

local Group = {}
Group.__index = Group

--- A group of routes under a path prefix, with middleware of its own that runs after the
-- app's and before the route's. app:group("/admin", function(g) g:get(...) end), or use
-- the group it returns.
-- @tparam string prefix
-- @tparam function fn fn(group), which adds the routes
-- @treturn Group
function App:group(prefix, fn)
    prefix = prefix_of(prefix, "group prefix", true)
    local g = setmetatable({ app = self, prefix = prefix, middleware = {} }, Group)
    if fn then
        fn(g)
    end
    return g
end

--- Middleware for the group's routes (after the app's, before the route's own).
-- @tparam function fn function(req, res, next)
-- @return the group
function Group:use(fn)
    if type(fn) ~= "function" then
        error("bad middleware (function expected)", 2)
    end
    self.middleware[#self.middleware + 1] = fn
    return self
end

--- A route under the group's prefix: as App:route. `g:get(...)`, `g:post(...)` and the
-- other methods are the same with the method named.
-- @return the group
function Group:route(method, ...)
    add(self.app, method:upper(), self, ...)
    return self
end

--- A GET route: `g:get([name,] path, [middleware...,] handler[, opts])`, as Group:route with
-- the method named. A HEAD request is served by the GET route, without the body.
-- @function Group:get

--- A POST route, as Group:get.
-- @function Group:post

--- A PUT route, as Group:get.
-- @function Group:put

--- A PATCH route, as Group:get.
-- @function Group:patch

--- A DELETE route, as Group:get.
-- @function Group:delete

--- A OPTIONS route, as Group:get.
-- @function Group:options

--- A HEAD route, as Group:get.
-- @function Group:head
for _, m in ipairs(METHODS) do
    local M = m:upper()
    Group[m] = function(self, ...)
        add(self.app, M, self, ...)
        return self
    end
end

--- A group inside this one: its prefix appended, its middleware after this one's.
-- @return the new group
function Group:group(prefix, fn)
    local g = self.app:group(self.prefix .. prefix)
    for _, mw in ipairs(self.middleware) do
        g.middleware[#g.middleware + 1] = mw
    end
    if fn then
        fn(g)
    end
    return g
end

-- -- Sites and mounted apps -------------------------------------------------------------------

--- A site for one host ("example.org", "[::1]"; an IPv6 address may come without its
-- brackets): the same methods, its own routes and middleware (run after the app's). The
-- app's own routes serve hosts that have no site. opts.base: the site lives under that path
-- (req.base_path), and requests outside it are 404. What the site does not set it has from
-- its app: security (opts.security or site:security), error pages, views, dev,
-- trailing_slash and canonical (opts as moonserve.app's). opts.tls = { cert = FILE, key =
-- FILE }: the certificate a TLS listener answers this name with (SNI; lists of paths for an
-- RSA and an ECDSA one). A host "*.example.org" is the site of every name one label under
-- example.org that has no site of its own.
-- @tparam string host
-- @tparam[opt] table opts
-- @treturn App the site
function App:site(host, opts)
    if type(host) ~= "string" or host == "" then
        error("bad host (string expected)", 2)
    end
    self.sites = self.sites or {}
    self.site_of_host, self.sites_known = {}, 0
    host = lower(host)
    if find(host, ":", 1, true) and sub(host, 1, 1) ~= "[" then -- "::1": as Host writes it
        host = "[" .. host .. "]"
    end
    local s = self.sites[host]
    if not s then
        s = new(opts or {}, self, 2)
        s.host = host
        self.sites[host] = s
    elseif opts then
        settings(s, opts, true, 2)
    end
    if opts and opts.security ~= nil then
        s:security(opts.security)
    end
    local base = opts and opts.base
    if base ~= nil then
        s.base = prefix_of(base, "base", false)
    end
    if opts and opts.access_log ~= nil then
        s.access_log = _M.access_log_spec(opts.access_log, 2)
    end
    if opts and opts.tls ~= nil then
        local t = opts.tls
        if type(t) ~= "table" or t.cert == nil or t.key == nil then
            error("bad tls (a table with cert and key expected)", 2)
        end
        s.tls = t
    end
    return s
end

--- An access log setting as { path = FILE or "-", format = "combined" | "json" | template },
-- from that table, a path alone, or false (no access log).
-- @local
function _M.access_log_spec(v, level)
    if v == false then
        return false
    end
    if type(v) == "string" then
        v = { path = v }
    end
    if type(v) ~= "table" or type(v.path) ~= "string" or
            (v.format ~= nil and type(v.format) ~= "string") then
        error("bad access_log (a path, { path = ..., format = ... } or false expected)",
            (level or 1) + 1)
    end
    return { path = v.path, format = v.format or "combined" }
end

-- The site for a Host field as sent. Host fields seen before are one table lookup, with no
-- string made: the lower-cased, port-less form is worked out once per distinct field.
local function site_for(self, host)
    local known = self.site_of_host
    local site = known[host]
    if site == nil then
        local name = split_host(host)
        site = self.sites[name] or false
        local dot = not site and find(name, ".", 2, true)
        if dot then
            site = self.sites["*" .. sub(name, dot)] or false
        end
        if self.sites_known < 1024 then -- any Host a client makes up: keep the table small
            known[host] = site
            self.sites_known = self.sites_known + 1
        end
    end
    return site
end

--- A dictionary shared by every worker of the server, `moonserve.shared[name]`, of `size`
-- ("10m", "512k" or bytes). Declared before the server starts; it lives as long as the server
-- (a reload keeps it and its values), so its size can change only with a restart.
-- With a table instead of a size, `{ redis = URL or table, prefix = "NAME:", cache = { ttl =,
-- size = }, timeout = ...}`, the dictionary lives in Redis, shared by every instance
-- (moonserve/redis/dict.lua, docs/guide/redis.md): the same methods, each atomic across
-- instances. A bad URL or option raises at once, so `--check` and the start say what is
-- wrong.
-- @tparam string name
-- @tparam string|number|table size
-- @return the app
function App:shared_dict(name, size)
    local shared = require "moonserve.shared"
    local ok, err = shared.check_name(name)
    if not ok then
        error(err, 2)
    end
    local root = self
    while root.parent do
        root = root.parent
    end
    if type(size) == "table" then
        local d
        d, err = require("moonserve.redis.dict").new(name, size)
        if not d then
            error(err, 2)
        end
        if root.shared_decl and root.shared_decl[name] then
            error("shared dictionary '" .. name .. "' is declared twice, in memory and on Redis",
                2)
        end
        root.shared_redis = root.shared_redis or {}
        root.shared_redis[name] = d
        shared.register(name, d)
        return self
    end
    local bytes
    bytes, err = shared.parse_size(size)
    if not bytes then
        error(err, 2)
    end
    if root.shared_redis and root.shared_redis[name] then
        error("shared dictionary '" .. name .. "' is declared twice, in memory and on Redis", 2)
    end
    root.shared_decl = root.shared_decl or {}
    local had = root.shared_decl[name]
    if had and had ~= bytes then
        error("shared dictionary '" .. name .. "' is declared twice with two sizes", 2)
    end
    root.shared_decl[name] = bytes
    return self
end

--- Declares a thread pool for moonserve.run_worker_thread (moonserve/host/core/threads.lua):
-- opts.threads (4) threads at most, each with a LuaJIT state of its own, started as jobs come;
-- opts.max_queue (1024) jobs waiting for a thread, past which a run returns false, "queue
-- full". A pool named "default" always exists; declaring it again sets its sizes. Inside nginx
-- the pools are nginx.conf's thread_pool directives, and these sizes bound the jobs each
-- worker gives the pool of that name (docs/guide/threads.md, "Inside nginx").
-- @tparam string name
-- @tparam[opt] table opts
-- @return the app
function App:thread_pool(name, opts)
    the_host.module("threads").declare(name, opts, 2)
    return self
end

--- Handlers for errors raised by handlers, before the error page: fn(req, res, err, ref). One
-- that answers (res:sent()) ends it; a site's run before its app's.
-- @tparam function fn
-- @return the app
function App:on_error(fn)
    if type(fn) ~= "function" then
        error("bad error handler (function expected)", 2)
    end
    self.error_handlers = self.error_handlers or {}
    self.error_handlers[#self.error_handlers + 1] = fn
    return self
end

--- Serves another app under `prefix`: it sees paths without the prefix (req.path), and
-- req.base_path holds the prefix.
-- @tparam string prefix
-- @tparam App other
-- @return the app
function App:mount(prefix, other)
    -- (the mounted app's own canonical-path check sees a path that is canonical already)
    prefix = prefix_of(prefix, "mount prefix", false)
    if type(other) ~= "table" or type(other.handle) ~= "function" then
        error("bad app to mount (an app expected)", 2)
    end
    local function into(req, res)
        local path = req.path
        rawset(req, "base_path", (rawget(req, "base_path") or "") .. prefix)
        rawset(req, "path", sub(path, #prefix + 1) ~= "" and sub(path, #prefix + 1) or "/")
        rawset(req, "params", nil) -- the mount's own capture is not the inner route's
        return other:handle(req, res)
    end
    -- The mounted app checks origins by its own settings, so that its routes' own
    -- csrf = false holds: this app does not check them first.
    local route = { handler = into, csrf = false }
    -- (App:handle leaves the security fields under the prefix to the mounted app)
    self.mount_prefixes = self.mount_prefixes or {}
    self.mount_prefixes[#self.mount_prefixes + 1] = prefix
    for _, m in ipairs(METHODS) do
        self.router:add(m:upper(), prefix, route)
        self.router:add(m:upper(), prefix .. "/*", route)
    end
    -- HTTP/2's WebSocket opens with CONNECT (RFC 8441): the mounted app's app:websocket
    -- takes it, as it takes HTTP/1.1's GET, and answers any other CONNECT itself.
    self.router:add("CONNECT", prefix, route)
    self.router:add("CONNECT", prefix .. "/*", route)
    return self
end

-- Calls fn(app) for the app and each of its sites.
local function each_app(self, fn)
    fn(self)
    for _, site in pairs(self.sites or {}) do
        fn(site)
    end
end

-- -- Static files -------------------------------------------------------------------------

local STATIC_OPTS = { index = "string", listing = "boolean", spa = "boolean",
    dotfiles = "boolean", cache_control = "string", immutable = "boolean",
    precompressed = "boolean", compress = "boolean", compress_min = "number",
    compress_max = "number", memory_max = "number", live_reload = "boolean",
    hook = "function" }

--- Serves the files of `dir` under `prefix` from the core: a request there never enters Lua,
-- unless opts.hook(req, res) is given, which runs first like a handler (it may answer, or
-- set fields) before the core sends the file. A path with no file behind it goes on to the
-- app's routes. opts: index ("index.html", or false), listing, spa, dotfiles,
-- cache_control, immutable, precompressed, compress, compress_min, compress_max,
-- memory_max, live_reload (see the API page). A site's mounts serve its host alone.
-- @tparam string prefix
-- @tparam string dir
-- @tparam[opt] table opts index, listing, spa, dotfiles, cache_control, immutable,
--   precompressed, compress, memory_max, live_reload, hook
-- @return the app
-- @usage app:static("/assets", "./public")
function App:static(prefix, dir, opts)
    prefix = prefix_of(prefix, "static prefix", true)
    if type(dir) ~= "string" or dir == "" then
        error("bad static directory (a path expected)", 2)
    end
    opts = opts or {}
    for k, v in pairs(opts) do
        local want = STATIC_OPTS[k]
        if want == nil then
            error("unknown static option " .. tostring(k), 2)
        elseif type(v) ~= want and not (k == "index" and v == false) then
            error("bad static option " .. k .. " (" .. want .. " expected)", 2)
        end
    end
    local mount = { prefix = prefix, dir = dir, opts = opts, app = self }
    self.statics = self.statics or {}
    self.statics[#self.statics + 1] = mount
    if opts.hook then
        local hook = opts.hook
        local function serve(req, res)
            local a, b, c = hook(req, res)
            if res:sent() or a ~= nil then
                return a, b, c
            end
            if res:static_mount(mount.id) then
                return
            end
            return rawget(req, "_app"):error(req, res, { status = 404 })
        end
        local route = prefix == "" and "/*" or prefix .. "/*"
        self.router:add("GET", route, serve)
        if prefix ~= "" then
            self.router:add("GET", prefix, serve)
        end
    end
    if opts.live_reload and not self.live_route then
        self.live_route = true
        self:get("/.moonserve/live", the_host.module("live").stream)
    end
    return self
end

-- An access hook (app:ngx_access) of the app or of a mount's site guards the mount: its
-- requests enter Lua, and the file is served after the hook (moonserve/ngx/phases.lua).
-- A mount of the app serves every site, so a site's hook guards the app's mounts too.
local function guards(app)
    local h = rawget(app, "ngx_hooks")
    return h ~= nil and h.access ~= nil
end

--- Every static mount of the app and its sites, with what the core needs to serve it:
-- the full prefix (a site's base first), the host, and the security fields.
-- @local
function App:static_mounts()
    local all = {}
    local any_site = false
    for _, site in pairs(self.sites or {}) do
        any_site = any_site or guards(site)
    end
    local guarded_any = false
    local function visit(app)
        local guarded = guards(app) or guards(self) or (app == self and any_site)
        for _, m in ipairs(app.statics or {}) do
            local o = {}
            for k, v in pairs(m.opts) do
                if k ~= "hook" then
                    o[k] = v
                end
            end
            o.hooked = m.opts.hook ~= nil or guarded
            guarded_any = guarded_any or guarded
            o.host = app.host
            o.fields = security_of(app).always
            all[#all + 1] = { mount = m, prefix = (app.base or "") .. m.prefix, dir = m.dir,
                opts = o }
        end
    end
    each_app(self, visit)
    -- What a request through each app (the app, a site) may be served from in Lua: the
    -- mounts of its own and the app's, the longest prefix first, as the core chooses.
    each_app(self, function(app)
        app.ngx_statics = nil
        if guarded_any then
            local list = {}
            for _, e in ipairs(all) do
                local owner = e.mount.app
                if owner == app or owner == self then
                    list[#list + 1] = { prefix = e.prefix, mount = e.mount,
                        hooked = e.mount.opts.hook ~= nil }
                end
            end
            table.sort(list, function(x, y) return #x.prefix > #y.prefix end)
            app.ngx_statics = list[1] and list or nil
        end
    end)
    forget(self)
    return all
end

--- The path of the route called `name`, filled from `params`.
-- @tparam string name
-- @tparam[opt] table params
-- @treturn string the path
function App:url_for(name, params)
    return self.router:url_for(name, params)
end

-- -- Handling -------------------------------------------------------------------------------

local NOT_FOUND = { status = 404 }
local function not_found(req, res)
    return rawget(req, "_app"):error(req, res, NOT_FOUND)
end

local NOT_ALLOWED = { status = 405 }
local FORBIDDEN = { status = 403, refusal = true }
local function method_not_allowed(req, res)
    res:header("allow", rawget(req, "_allow"))
    return rawget(req, "_app"):error(req, res, NOT_ALLOWED)
end

-- OPTIONS on a path without its own OPTIONS route: what it allows.
local function options(req, res)
    return res:status(204):header("allow", rawget(req, "_allow")):send()
end

-- The rest of a request's middleware chain, what a middleware calls as next(): a table
-- called through its metatable rather than a closure, which LuaJIT would not compile (a
-- closure made per request left the whole request to the interpreter).
local Rest = {}

local function run_chain(mw, i, req, res, final)
    local fn = mw[i]
    if fn == nil then
        return final(req, res)
    end
    return fn(req, res, setmetatable({ mw = mw, i = i + 1, req = req, res = res, final = final },
        Rest))
end

Rest.__call = function(rest)
    return run_chain(rest.mw, rest.i, rest.req, rest.res, rest.final)
end

local function append(dst, src)
    for i = 1, #src do
        dst[#dst + 1] = src[i]
    end
end

-- The middleware of a route with its own or its group's: the app's chain `mw`, the group's,
-- the route's; made once and kept on the route while they stay as they are.
local function route_chain(spec, mw)
    local group = spec.group and spec.group.middleware
    local n = #mw + (group and #group or 0) + (spec.before and #spec.before or 0)
    local all = spec.chain
    if all == nil or spec.chain_of ~= mw or #all ~= n then
        all = {}
        append(all, mw)
        if group then
            append(all, group)
        end
        append(all, spec.before or {})
        spec.chain, spec.chain_of = all, mw
    end
    return all
end

-- The middleware a request goes through: the app's, then its site's.
local function chain(app)
    local c = app.chain
    if c == nil then
        c = {}
        local parent = rawget(app, "parent")
        if parent then
            append(c, chain(parent))
        end
        append(c, app.middleware)
        app.chain = c
    end
    return c
end

-- Whether `path` falls under one of the prefixes of an app's mounts.
local function under_mount(prefixes, path)
    for i = 1, #prefixes do
        local p = prefixes[i]
        if path == p or (sub(path, 1, #p) == p and sub(path, #p + 1, #p + 1) == "/") then
            return true
        end
    end
    return false
end

--- Runs the request through sites, middleware and routes; returns what the handler
-- returned (the `return status, body, headers` form). A request through no middleware
-- makes no closure on the way: the JIT compiles this path whole.
function App:handle(req, res)
    local app = self
    local tags = self.access_tags -- the core keeps an access log: tell it the site and route
    if self.sites then
        local host = req:header("host")
        app = host and site_for(self, host) or self
        local log = tags and rawget(app, "access_log_id")
        if log then
            req:_access(log, nil)
        end
    end
    local path = req.path
    local base = app.base
    if base then
        local outside = sub(path, 1, #base) ~= base or
            (#path > #base and sub(path, #base + 1, #base + 1) ~= "/")
        if outside then
            rawset(req, "_app", app)
            return not_found(req, res)
        end
        path = #path > #base and sub(path, #base + 1) or "/"
        rawset(req, "path", path)
        rawset(req, "base_path", base)
    end
    local settings_of = app.resolved or resolved(app)
    if settings_of.canonical and not req:_static_dir() then
        -- One URL per resource: a non-canonical path redirects to the canonical one.
        local c = canon.path(path, settings_of.trailing)
        if c ~= path then
            -- Under a site's base or a mount, the client's URL has the prefix in front.
            c = (rawget(req, "base_path") or "") .. c
            local q = req.query_string
            return res:redirect(q ~= "" and (c .. "?" .. q) or c, 308)
        end
    end
    local mounts = rawget(app, "mount_prefixes")
    if not (mounts and under_mount(mounts, path)) then -- a mounted app adds its own
        app:secure_reply(req, res)
    end
    rawset(req, "_app", app)
    local views = settings_of.views
    if views then
        res.views = views
    end
    local phases = settings_of.phases -- OpenResty's access phase, filters, log
    if phases and phases:enter(req, res, path) then
        return
    end
    local method = req.method
    local handler, params, allow, route = app.router:match(method, path)
    if route then
        rawset(req, "_route", route) -- (for middleware keyed by route: moonserve.ratelimit)
    end
    if tags and route then
        req:_access(nil, route.name or route.path)
    end
    if route and self.metrics_on then
        req:_metric(route.metrics_ix or 0)
    end
    if not SAFE[method] then
        local check = settings_of.secure.csrf
        if check and not (type(handler) == "table" and handler.csrf == false) then
            local ok, why = same_origin(req, check)
            if not ok then
                security.log_refusal(method, path, why)
                return app:error(req, res, FORBIDDEN)
            end
        end
    end
    local mw = chain(app)
    if handler then
        if params then
            req.params = params
        end
        if type(handler) == "table" then -- a route with middleware, a group or options
            local spec = handler
            if spec.body_bytes then
                req:body_limit(spec.body_bytes)
            end
            if spec.handler_cpu_ms then
                req:cpu_budget(spec.handler_cpu_ms)
            end
            handler = spec.handler
            if spec.group or spec.before then
                mw = route_chain(spec, mw)
            end
        end
    elseif allow or (method == "OPTIONS" and req.target == "*") then
        rawset(req, "_allow", allow or "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT")
        handler = method == "OPTIONS" and options or method_not_allowed
    else
        handler = not_found
    end
    if mw[1] == nil then
        return handler(req, res)
    end
    return run_chain(mw, 1, req, res, handler)
end

--- Whether a route of the app or its sites has a CPU budget of its own.
-- @local
function App:has_cpu_budgets()
    local found = false
    each_app(self, function(app)
        for _, route in app.router:routes() do
            if type(route) == "table" and route.handler_cpu_ms then
                found = true
            end
        end
    end)
    return found
end

--- The largest body any route of the app or its sites allows beyond `default`.
-- @local
function App:max_body_bytes(default)
    local max = default
    local function visit(app)
        for _, route in app.router:routes() do
            if type(route) == "table" and route.body_bytes and route.body_bytes > max then
                max = route.body_bytes
            end
        end
    end
    each_app(self, visit)
    return max
end

--- Applies the `return status, body, headers` form of a handler to `res` (the host calls it
-- with what app:handle returned, when not nil): a status and a body, or a text alone for 200,
-- and a table body is sent as JSON.
-- @local
function _M.reply_with(res, status, body, headers)
    if res:sent() then
        return
    end
    if type(status) == "number" then
        res:status(status)
    elseif body == nil then
        body = status -- return "text" means 200 "text"
    end
    if headers then
        for k, v in pairs(headers) do
            res:header(k, v)
        end
    end
    if type(body) == "table" then
        return res:json(body)
    end
    return res:send(body)
end

-- Serves the app (moonserve/host/core/runner.lua: run, for the core).
-- -- Worker hooks -----------------------------------------------------------------------
--- fn() runs in every worker once it starts (not in the master, where an app file's top level
-- runs too), in a coroutine with the whole non-blocking API; the worker is ready (and a
-- reload hands over to it) once every start hook has returned.
-- @tparam function fn
-- @return the app
function App:on_worker_start(fn)
    if type(fn) ~= "function" then
        error("bad argument #1 to 'on_worker_start' (function expected)", 2)
    end
    local hooks = rawget(self, "worker_start_hooks") or {}
    hooks[#hooks + 1] = fn
    self.worker_start_hooks = hooks
    return self
end

--- fn() runs in every TLS handshake of the app's TLS listeners, once the client's hello is
-- read, in a coroutine with the whole non-blocking API, while the handshake waits: it may
-- choose the certificate for this connection (the host's functions, as `ngx.ssl` of the ngx
-- layer: `server_name`, `clear_certs`, `set_der_cert` ...), from a shared dictionary or Redis,
-- without a reload. Returning lets the handshake go on with the certificates set then (the
-- listener's, if it set none); an error fails the handshake, with one log line. The
-- handshake's deadline (`handshake_timeout`) runs on while it waits.
-- @tparam function fn
-- @return the app
function App:ssl_certificate(fn)
    if type(fn) ~= "function" then
        error("bad argument #1 to 'ssl_certificate' (function expected)", 2)
    end
    self.ssl_certificate_hook = fn
    return self
end

--- fn() runs in every worker as it stops, after the requests in flight stop being accepted.
-- @tparam function fn
-- @return the app
function App:on_worker_stop(fn)
    if type(fn) ~= "function" then
        error("bad argument #1 to 'on_worker_stop' (function expected)", 2)
    end
    local hooks = rawget(self, "worker_stop_hooks") or {}
    hooks[#hooks + 1] = fn
    self.worker_stop_hooks = hooks
    return self
end

--- Serves the app: listens, starts the workers and runs until stopped. `opts` takes the
-- keys of the command line (listen, workers, limits, log, access_log, metrics, ...), which
-- the flags and the environment override; an unknown key or a bad value stops the start.
-- @tparam[opt] table opts
-- @usage app:run{ listen = "127.0.0.1:9000", workers = 4, limits = { body_bytes = 1e6 } }
function App:run(opts)
    return the_host.run(self, opts)
end

--- A client for this app's own specs, served in this process with no socket (moonserve.test):
-- `t:get(path[, opts])`, `post`, `put`, `patch`, `delete`, `head`, `options`,
-- `request(method, path[, opts])`, with a cookie jar kept across calls.
-- @tparam[opt] table opts host, timeout, limits, start_hooks
-- @usage local t = app:test(); local r = t:get("/"); assert.equal(200, r.status)
function App:test(opts)
    return require("moonserve.test").client(self, opts)
end

return _M
