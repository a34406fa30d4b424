-- moonserve/app.lua: an application: routes, middleware and sites, and how a request goes
-- through them.
local router = require "moonserve.router"

local lower, match, type = string.lower, string.match, type

local App = {}
App.__index = App

-- A route is its handler, or { handler = fn, body_bytes = n } when it has options.
local function add(self, method, path, handler, opts)
    if type(path) ~= "string" then
        error("bad route path (string expected)", 3)
    end
    if type(handler) ~= "function" then
        error("bad handler for " .. method .. " " .. path .. " (function expected)", 3)
    end
    local route = handler
    if opts ~= nil then
        if type(opts) ~= "table" then
            error("bad route options for " .. path .. " (table expected)", 3)
        end
        local bytes = opts.body_bytes
        if bytes ~= nil and (type(bytes) ~= "number" or bytes < 0) then
            error("bad body_bytes for " .. path .. " (bytes expected)", 3)
        end
        route = { handler = handler, body_bytes = bytes }
    end
    self.router:add(method, path, route)
    return self
end

local _M = { methods = App }

function _M.new(opts)
    return setmetatable({ router = router.new(), middleware = {}, sites = nil,
        opts = opts or {} }, App)
end

-- app:route(method, path, handler[, opts]); opts.body_bytes: this route's body limit.
function App:route(method, path, handler, opts)
    if type(method) ~= "string" then
        error("bad method (string expected)", 2)
    end
    return add(self, method:upper(), path, handler, opts)
end

for _, m in ipairs { "get", "post", "put", "patch", "delete", "options", "head" } do
    local M = m:upper()
    App[m] = function(self, path, handler, opts)
        return add(self, M, path, handler, opts)
    end
end

-- Adds middleware: function(req, res, next). It answers, or calls next() to pass on (and
-- gets back what the rest returned).
function App:use(fn)
    if type(fn) ~= "function" then
        error("bad middleware (function expected)", 2)
    end
    self.middleware[#self.middleware + 1] = fn
    self.chain = nil
    for _, site in pairs(self.sites or {}) do
        site.chain = nil
    end
    return self
end

-- A site for one host: the same methods, its own routes and middleware. The app's own
-- routes serve hosts that have no site.
function App:site(host)
    if type(host) ~= "string" or host == "" then
        error("bad host (string expected)", 2)
    end
    self.sites = self.sites or {}
    host = lower(host)
    local s = self.sites[host]
    if not s then
        s = _M.new()
        s.parent = self
        self.sites[host] = s
    end
    return s
end

local function not_found(req, res)
    return res:status(404):send("Not Found\n")
end

local function method_not_allowed(req, res)
    return res:status(405):header("allow", rawget(req, "_allow")):send("Method Not Allowed\n")
end

-- Middleware closures are made per request only for apps that have middleware.
local function run_chain(mw, i, req, res, final)
    local fn = mw[i]
    if fn == nil then
        return final(req, res)
    end
    return fn(req, res, function()
        return run_chain(mw, i + 1, req, res, final)
    end)
end

-- The middleware a request goes through: the app's, then its site's.
local function chain(app)
    local c = app.chain
    if c == nil then
        c = {}
        local parent = app.parent
        if parent then
            for i = 1, #parent.middleware do
                c[#c + 1] = parent.middleware[i]
            end
        end
        for i = 1, #app.middleware do
            c[#c + 1] = app.middleware[i]
        end
        app.chain = c
    end
    return c
end

-- Runs the request through sites, middleware and routes; returns what the handler
-- returned (the `return status, body, headers` form). Makes no closure on the way: the JIT
-- compiles this path whole.
function App:handle(req, res)
    local app = self
    local sites = self.sites
    if sites then
        local host = req:header("host")
        if host then
            host = lower(match(host, "^%[?([^%]]-)%]?:%d+$") or host)
            app = sites[host] or self
        end
    end
    local handler, params, allow = app.router:match(req.method, req.path)
    if handler then
        if params then
            req.params = params
        end
        if type(handler) == "table" then -- a route with options
            if handler.body_bytes then
                req:body_limit(handler.body_bytes)
            end
            handler = handler.handler
        end
    elseif allow then
        rawset(req, "_allow", allow)
        handler = method_not_allowed
    else
        handler = not_found
    end
    local mw = chain(app)
    if mw[1] == nil then
        return handler(req, res)
    end
    return run_chain(mw, 1, req, res, handler)
end

-- The largest body any route of the app or its sites allows beyond `default`.
function App:max_body_bytes(default)
    local max = default
    local function visit(app)
        for _, route in app.router:routes() do
            if type(route) == "table" and route.body_bytes and route.body_bytes > max then
                max = route.body_bytes
            end
        end
    end
    visit(self)
    for _, site in pairs(self.sites or {}) do
        visit(site)
    end
    return max
end

function App:run(opts)
    return require("moonserve.server").run(self, opts)
end

return _M
