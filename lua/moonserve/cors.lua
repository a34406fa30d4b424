--- moonserve/cors.lua: cross-origin resource sharing (the Fetch standard's CORS protocol).
--
-- A policy says which other origins' pages may read this app's replies, and with which
-- methods and headers. Middleware (moonserve.cors) answers preflights itself and adds the
-- Access-Control-* fields to the replies of the requests it lets in; a request from an
-- origin it does not allow gets no CORS field at all, so the browser keeps the reply from
-- the page (the server still runs the request: CORS protects reading, not writing; the
-- origin check of app:security and moonserve.csrf protects writing).
-- @module moonserve.cors
local byte, concat, find, format, gsub, lower, match, sub = string.byte, table.concat,
    string.find, string.format, string.gsub, string.lower, string.match, string.sub
local ipairs, pairs, tostring, type = ipairs, pairs, tostring, type

local _M = {}

-- What a preflight's Access-Control-Allow-Methods lists unless `methods` says otherwise:
-- every method an API uses (GET, HEAD and POST need no preflight, but listing them costs
-- nothing).
local DEFAULT_METHODS = { "GET", "HEAD", "PUT", "PATCH", "POST", "DELETE" }

local DEFAULT_PORT = { http = "80", https = "443" }

-- A token (RFC 9110 5.6.2): what a method and a field name are made of.
local TOKEN = "^[%w!#$%%&'*+.^_`|~-]+$"

--- Whether `s` is an origin as browsers serialize it (Fetch, "ASCII serialization of an
-- origin"): scheme "://" host [":" port], lowercase, without a path, userinfo or anything
-- else. "null" (sandboxed frames, data: URLs, redirects across origins) is not one: no
-- policy but "*" lets it in. Every origin a pattern or a function sees has passed this, so
-- no pattern can be fooled by "https://evil.test/x.app.example" or a value with a CR/LF.
-- @tparam string s
-- @treturn boolean
function _M.valid_origin(s)
    if type(s) ~= "string" or #s > 256 then
        return false
    end
    local scheme, host, port = match(s, "^([a-z][a-z0-9+.%-]*)://([^:/]+)(.*)$")
    if not scheme then -- an IPv6 literal: its brackets hold colons
        scheme, port = match(s, "^([a-z][a-z0-9+.%-]*)://%[[0-9a-f:.]+%](.*)$")
        if not scheme then
            return false
        end
    elseif not find(host, "^[a-z0-9][a-z0-9.%-]*$") or find(host, "..", 1, true) then
        return false
    end
    if port ~= "" then
        local digits = match(port, "^:([1-9]%d*)$")
        if not digits or #digits > 5 or digits == DEFAULT_PORT[scheme] then
            return false -- browsers leave the default port out
        end
    end
    return true
end
local valid_origin = _M.valid_origin

-- An origin of the `origins` list as browsers send it: lowercase, without a trailing slash
-- or the default port; misuse raises at the caller of new().
local function normalize(o, i)
    local s = type(o) == "string" and lower((gsub(o, "/$", ""))) or nil
    if s then
        local scheme, rest = match(s, "^([a-z][a-z0-9+.%-]*)://(.*)$")
        local port = DEFAULT_PORT[scheme or ""]
        if port and sub(rest, -#port - 1) == ":" .. port then
            s = sub(s, 1, -#port - 2)
        end
    end
    if not valid_origin(s) then
        error(format("bad cors origin %d (%q: \"scheme://host[:port]\" expected)", i,
            tostring(o)), 4)
    end
    return s
end

-- Whether a Lua pattern ends with an anchoring "$" (one not escaped by a "%").
local function anchored_end(p)
    if byte(p, -1) ~= 36 then -- "$"
        return false
    end
    local n = #match(p, "(%%*)%$$")
    return n % 2 == 0
end

-- Whether a Lua pattern parses: Lua finds a malformed one only when a match reaches the
-- bad part, which may be at the first hostile request instead of at definition.
local function well_formed(p)
    local i, n = 1, #p
    while i <= n do
        local c = sub(p, i, i)
        if c == "%" then
            local k = sub(p, i + 1, i + 1)
            if k == "" then
                return false
            elseif k == "b" then
                if i + 3 > n then
                    return false
                end
                i = i + 4
            elseif k == "f" then
                if sub(p, i + 2, i + 2) ~= "[" then
                    return false
                end
                i = i + 2
            else
                i = i + 2
            end
        elseif c == "[" then
            local j = i + 1
            if sub(p, j, j) == "^" then
                j = j + 1
            end
            if sub(p, j, j) == "]" then -- a "]" first is one of the set
                j = j + 1
            end
            while true do
                local d = sub(p, j, j)
                if d == "" then
                    return false
                elseif d == "%" then
                    j = j + 2
                elseif d == "]" then
                    break
                else
                    j = j + 1
                end
            end
            i = j + 1
        else
            i = i + 1
        end
    end
    return pcall(find, "", p) -- what else Lua refuses at once ("(" without ")"...)
end

-- The `origins` option as a function(origin, req) -> boolean, or "*".
local function compile_origins(o)
    local t = type(o)
    if o == "*" then
        return "*"
    elseif t == "string" then
        -- A pattern always spans the whole origin: "https://.*%.app%.example" written
        -- without anchors must not let in "https://evil.test#.app.example.evil.test".
        local p = o
        if byte(p, 1) ~= 94 then -- "^"
            p = "^" .. p
        end
        if not anchored_end(p) then
            p = p .. "$"
        end
        if not well_formed(p) then
            error("bad cors origins pattern " .. format("%q", o), 3)
        end
        return function(origin)
            return find(origin, p) ~= nil
        end
    elseif t == "table" then
        local set = {}
        for i, v in ipairs(o) do
            set[normalize(v, i)] = true
        end
        for k in pairs(o) do
            if type(k) ~= "number" then
                error("bad cors origins (a list expected, got the key " .. tostring(k) .. ")", 3)
            end
        end
        return function(origin)
            return set[origin] == true
        end
    elseif t == "function" then
        return function(origin, req)
            return o(origin, req) == true
        end
    end
    error("bad cors origins (a list, a Lua pattern, a function or \"*\" expected)", 3)
end

-- A list option ({ "x-a", "x-b" }) as one field value, each item a token; nil stays nil.
local function list(name, v, upper)
    if v == nil then
        return nil
    end
    if type(v) == "string" then
        v = { v }
    end
    if type(v) ~= "table" then
        error("bad cors " .. name .. " (a list of names expected)", 3)
    end
    local out = {}
    for i, item in ipairs(v) do
        if type(item) ~= "string" or not find(item, TOKEN) then
            error(format("bad cors %s %d (%q)", name, i, tostring(item)), 3)
        end
        out[i] = upper and item:upper() or item
    end
    return concat(out, ", ")
end

local KNOWN = { origins = true, methods = true, headers = true, expose = true,
    credentials = true, max_age = true }

--- A policy from opts: origins (a list of "scheme://host[:port]", a Lua pattern matched
-- against the whole origin, a function(origin, req) returning true to allow, or "*"; a
-- pattern and a function see only well-formed origins, never "null"); methods (what a
-- preflight may ask for; default GET, HEAD, PUT, PATCH, POST, DELETE); headers (the request
-- headers a preflight may ask for; default: those it asks for, if they are well-formed
-- names); expose (the reply headers beyond the safelisted ones a page may read); credentials
-- (true: cookies and HTTP authentication go with the requests, and their replies may be
-- read; never with "*"); max_age (seconds a browser may cache a preflight). Misuse raises.
-- @tparam table opts
-- @return the policy, for check() and preflight(); moonserve.cors makes middleware of it
function _M.new(opts)
    if type(opts) ~= "table" then
        error("bad cors options (table expected)", 2)
    end
    for k in pairs(opts) do
        if not KNOWN[k] then
            error("unknown cors option " .. tostring(k), 2)
        end
    end
    if opts.origins == nil then
        error("bad cors options (origins expected)", 2)
    end
    local credentials = opts.credentials
    if credentials ~= nil and type(credentials) ~= "boolean" then
        error("bad cors credentials (boolean expected)", 2)
    end
    if opts.origins == "*" and credentials then
        -- Browsers refuse "*" on a credentialed reply (Fetch, CORS check); echoing any
        -- origin instead would hand every site on the web the user's session.
        error("cors origins \"*\" cannot go with credentials: list the origins", 2)
    end
    local max_age = opts.max_age
    if max_age ~= nil and (type(max_age) ~= "number" or max_age < 0 or max_age % 1 ~= 0) then
        error("bad cors max_age (seconds, a non-negative integer, expected)", 2)
    end
    return {
        allow = compile_origins(opts.origins),
        methods = list("methods", opts.methods or DEFAULT_METHODS, true),
        headers = list("headers", opts.headers),
        expose = list("expose", opts.expose),
        credentials = credentials == true,
        max_age = max_age and tostring(max_age) or nil,
    }
end

--- The origin a request may read replies as: the value for Access-Control-Allow-Origin
-- ("*" or the request's Origin), or nil when it gets no CORS fields.
-- @local
function _M.check(policy, req)
    local origin = req:header("origin")
    if not origin then
        return nil
    end
    local allow = policy.allow
    if allow == "*" then
        return "*"
    end
    if valid_origin(origin) and allow(origin, req) then
        return origin
    end
    return nil
end
local check = _M.check

-- Whether a preflight's Access-Control-Request-Headers is a list of field names.
local function header_list(v)
    for item in v:gmatch("[^,]+") do
        item = match(item, "^%s*(.-)%s*$")
        if item ~= "" and not find(item, TOKEN) then
            return false
        end
    end
    return true
end

-- The fields a reply through the middleware gets, put on just before its head leaves: a table
-- called through its metatable, not a function made per request, which LuaJIT would not
-- compile.
local Fields = {}
Fields.__call = function(hook, r)
    local policy, allowed = hook.policy, hook.allowed
    if policy.allow ~= "*" then
        r:header("vary", "Origin")
    end
    if allowed then
        r:header("access-control-allow-origin", allowed)
        if policy.credentials then
            r:header("access-control-allow-credentials", "true")
        end
        if policy.expose then
            r:header("access-control-expose-headers", policy.expose)
        end
    end
end

--- Middleware for a policy (see new): preflights (OPTIONS with Origin and
-- Access-Control-Request-Method) are answered here, 204 with the policy's fields for an
-- allowed origin and 403 for any other, without the route's handler (a path needs no
-- OPTIONS route, nor any route at all); every other request goes on, and its reply gets
-- the fields when its origin is allowed. Every reply through it has Vary: Origin unless
-- origins is "*" (whose fields do not depend on the origin).
-- @usage app:use(moonserve.cors{ origins = { "https://app.example" }, credentials = true })
function _M.middleware(opts)
    local policy = _M.new(opts)
    local any = policy.allow == "*"
    local methods, fixed_headers = policy.methods, policy.headers
    local credentials, max_age = policy.credentials, policy.max_age
    return function(req, res, next)
        local allowed = check(policy, req)
        local asked = req.method == "OPTIONS" and req:header("origin") ~= nil
            and req:header("access-control-request-method")
        if asked then
            -- A preflight: the route's own OPTIONS handler never sees it (Fetch, CORS-preflight
            -- request). The browser compares what it asked for with the lists it gets.
            if not any then
                res:header("vary", "Origin")
            end
            if not allowed then
                -- The browser fails a preflight without Access-Control-Allow-Origin whatever
                -- its status; 403 says why to a person reading the network panel or the log.
                return res:status(403):send("Forbidden: origin not allowed by CORS\n")
            end
            res:status(204):header("access-control-allow-origin", allowed)
            if credentials then
                res:header("access-control-allow-credentials", "true")
            end
            res:header("access-control-allow-methods", methods)
            local want = req:header("access-control-request-headers")
            if fixed_headers then
                res:header("access-control-allow-headers", fixed_headers)
            elseif want then
                -- The headers asked for, echoed: the reply depends on them too.
                res:header("vary", "Access-Control-Request-Headers")
                if header_list(want) then
                    res:header("access-control-allow-headers", want)
                end
            end
            if max_age then
                res:header("access-control-max-age", max_age)
            end
            return res:send()
        end
        -- The fields go on just before the head leaves, so an error page that replaced the
        -- handler's reply (and dropped its fields) still has them: the page can read it.
        res:before_send(setmetatable({ policy = policy, allowed = allowed }, Fields))
        return next()
    end
end

return _M
