--- moonserve/host/openresty/request.lua: the request a handler gets inside nginx, over ngx.req
-- and ngx.var: the fields and methods of moonserve's own (moonserve/host/core/request.lua).
--
-- Its path is the target as the client sent it (ngx.var.request_uri up to "?"), as on the
-- core, not nginx's decoded and merged $uri. The body streams from ngx.req.socket() when it
-- has a length on HTTP/1.x; a chunked or HTTP/2 body is read whole by nginx first
-- (ngx.req.read_body, in memory or its temporary file) and handed over in pieces.
-- @module moonserve.openresty.request

-- luacheck: globals ngx (nginx's Lua module gives it; this runs only inside nginx)
local shared = require "moonserve.request_methods"

local ngx = ngx
local ngx_var, ngx_req = ngx.var, ngx.req
local lower, gsub, find, sub, concat = string.lower, string.gsub, string.find, string.sub,
    table.concat
local type, tonumber, error, rawget, rawset = type, tonumber, error, rawget, rawset
local min = math.min

local PIECE = 65536 -- the most one req:read() returns

local Request = {}
local getters = {}

function getters.method()
    return ngx_req.get_method()
end

function getters.target()
    return ngx_var.request_uri
end

function getters.path(self)
    local t = self.target
    local q = find(t, "?", 1, true)
    return q and sub(t, 1, q - 1) or t
end

function getters.query_string(self)
    local t = self.target
    local q = find(t, "?", 1, true)
    return q and sub(t, q + 1) or ""
end

-- nginx's $request_id (32 hex digits): the reference of an error page.
function getters.id()
    return ngx_var.request_id
end

function getters.http_version()
    local v = ngx_req.http_version()
    return v == 2 and 2.0 or v == 1 and 1.0 or 1.1
end

-- Whether the peer is a trusted proxy, whose X-Forwarded-* fields may be believed: nginx.conf
-- says so with a geo block that sets $moonserve_trusted_proxy to 1 for their addresses
-- (docs/guide/openresty.md). nginx's realip module, where used, rewrites $remote_addr.
function getters.trusted_proxy()
    return ngx_var.moonserve_trusted_proxy == "1"
end

function getters.tls()
    local p = ngx_var.ssl_protocol
    return p ~= nil and p ~= "" and p
end

-- "https" when nginx took the request over TLS, or a trusted proxy says the client did.
function getters.scheme(self)
    -- (trusted_proxy asked, not read through self: one more key in the request's table)
    return (ngx_var.https == "on" or shared.proxied_https(self, getters.trusted_proxy(self)))
        and "https" or "http"
end

function getters.client_ip()
    return ngx_var.remote_addr
end

-- (form, parts, accepts, json and the fields query, params, ctx, cookies are shared)
local mt = shared.metatable(getters, Request)

local _M = { getters = getters, methods = Request }

-- nil, as a variable: a table constructor keeps a key whose value is a variable (here nil)
-- but may drop one written `nil`.
local NONE = nil

--- The request nginx is handling now, as the framework's request, with `res` its reply.
-- @local
function _M.new(res)
    -- Made with the keys the framework caches on a request, eight, as the core host's (a key
    -- added to a full table rehashes it, on every request that adds it).
    local t = setmetatable({ _res = res, method = NONE, path = NONE, _app = NONE,
        scheme = NONE, params = NONE, _route = NONE, client_ip = NONE }, mt)
    return t
end

-- The core's access log and metrics hooks: nginx keeps its own (access_log, log_by_lua).
function Request._access() end
function Request._metric() end
function Request._static_dir()
    return false
end

-- "user-agent" -> "http_user_agent", the variable nginx keeps each field in.
local VAR = setmetatable({}, {
    __index = function(t, name)
        local v = "http_" .. gsub(lower(name), "-", "_")
        t[name] = v
        return v
    end,
})

--- The first value of a header field, by name in any case, or nil.
-- @tparam string name
-- @treturn ?string
function Request.header(_, name)
    if type(name) ~= "string" then
        error("bad header name (string expected)", 2)
    end
    return ngx_var[VAR[name]]
end

--- All header fields as a table with lowercase names, repeats joined with ", " ("; " for
-- cookie).
-- @treturn table
function Request.headers()
    local t = {}
    for k, v in pairs(ngx_req.get_headers(0)) do
        if type(v) == "table" then
            v = concat(v, k == "cookie" and "; " or ", ")
        end
        t[k] = v
    end
    return t
end

--- nginx's Lua module does not hand request trailers over: always empty.
-- @treturn table
function Request.trailers()
    return {}
end

--- A route's CPU budget: nginx has no way to stop a handler, so it is not kept (the
-- moonserve server's req:cpu_budget).
-- @tparam number ms
-- @return the request
function Request:cpu_budget(ms)
    if type(ms) ~= "number" or ms < 0 then
        error("bad CPU budget (milliseconds expected)", 2)
    end
    return self
end

--- Sets how large this request's body may be (the route's own limit), before reading it.
-- Past it the client gets 413. nginx's client_max_body_size must allow as much.
-- @tparam number bytes
-- @return the request
function Request:body_limit(bytes)
    if type(bytes) ~= "number" or bytes < 0 then
        error("bad body limit (bytes expected)", 2)
    end
    rawset(self, "_limit", bytes)
    return self
end

-- 413 in place of the handler's reply, and the end of the handler, as the core answers a
-- body past its route's limit.
local TOO_LARGE = "413 Content Too Large\n"
local function too_large(self)
    ngx.log(ngx.INFO, "request body over the route's body_bytes: 413")
    local res = rawget(self, "_res")
    if res then
        res:_refused()
    end
    if rawget(self, "_left") == nil then
        -- Not read yet. Over HTTP/2 nginx answers a stream whose body it has not taken in with
        -- a reset, or loses the reply's DATA, now and then: it reads the body first there
        -- (client_max_body_size bounds it); over HTTP/1.x it discards the rest as it comes.
        if ngx_req.http_version() >= 2 then
            ngx_req.read_body()
        else
            ngx_req.discard_body()
        end
    end
    ngx.status = 413
    ngx.header["content-type"] = "text/plain; charset=utf-8"
    ngx.header["content-length"] = #TOO_LARGE
    ngx.print(TOO_LARGE)
    ngx.eof()
    return ngx.exit(ngx.HTTP_OK)
end

-- How the body arrives: "socket" (streamed, with its length), "whole" (nginx reads it all
-- first), or "none".
local function body_kind(self)
    local te = self:header("transfer-encoding")
    local len = tonumber(self:header("content-length"))
    if te == nil and (len == nil or len == 0) then
        return "none", 0
    end
    if te == nil and ngx_req.http_version() < 2 then
        return "socket", len
    end
    return "whole", len
end

-- The next piece of a body nginx has read whole: from memory, or its temporary file.
local function whole_piece(self)
    local st = rawget(self, "_whole")
    if not st then
        ngx_req.read_body()
        local data = ngx_req.get_body_data()
        st = { data = data }
        if not data then
            local path = ngx_req.get_body_file()
            st.file = path and assert(io.open(path, "rb"))
        end
        rawset(self, "_whole", st)
    end
    local piece
    if st.data then
        piece, st.data = st.data, nil
    elseif st.file then
        piece = st.file:read(PIECE)
        if not piece then
            st.file:close()
            st.file = nil
        end
    end
    if piece then
        st.seen = (st.seen or 0) + #piece
        local limit = rawget(self, "_limit")
        if limit and st.seen > limit then
            return too_large(self)
        end
    end
    return piece
end

--- The next piece of the body: a string, or nil at its end, or nil and an error. Waits (the
-- handler yields to nginx) while the client has not sent more.
-- @treturn ?string
function Request:read()
    local left = rawget(self, "_left")
    if left == nil then
        local kind, len = body_kind(self)
        local limit = rawget(self, "_limit")
        if limit and len and len > limit then
            return too_large(self)
        end
        if kind == "none" then
            left = 0
        elseif kind == "whole" then
            left = -1
        else
            local sock, err = ngx_req.socket()
            if not sock then
                return nil, err
            end
            rawset(self, "_sock", sock)
            left = len
        end
        rawset(self, "_left", left)
    end
    if left < 0 then
        return whole_piece(self)
    elseif left == 0 then
        return nil
    end
    local piece, err = self._sock:receive(min(left, PIECE))
    if not piece then
        rawset(self, "_left", 0)
        return nil, err
    end
    rawset(self, "_left", left - #piece)
    return piece
end
Request._read = Request.read -- (for request_methods' body(); `what` is not needed here)


return _M
