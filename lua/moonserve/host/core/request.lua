--- moonserve/host/core/request.lua: the request a handler gets: lazy fields over the core's FFI view.
--
-- `Request`: The request a handler gets. Fields, read lazily from the core: `method`, `path`,
--   `target`, `query_string`, `query` (a table), `params` (the route's captures), `ctx` (a
--   table for middleware), `cookies`, `id`, `http_version`, `client_ip`, `scheme`, `tls`,
--   `trusted_proxy`; `session` and `base_path` when middleware or a mount set them.
-- @module moonserve.request
local ffi = require "ffi"
local bit = require "bit"
local base = require "moonserve.host.core.base"
local coro = require "moonserve.host.core.coroutine"
local shared = require "moonserve.request_methods"

local C = base.C
local ffi_str = ffi.string
local lower = string.lower
local EAGAIN, STATIC_DIR = base.EAGAIN, base.REQ_STATIC_DIR
local band = bit.band
local check, park = coro.check_request, coro.park

local vlen = ffi.new("size_t[1]")          -- reused; never held across a yield
local body_ptr = ffi.new("const char *[1]")
local peer_buf = ffi.new("char[64]")
local header_buf = ffi.new("ms_header_t[64]")

local Request = {}
local getters = {}

local function view(self)
    local r = self.r
    if not r then
        if rawget(self, "_upgraded") then
            error("the request was upgraded to a WebSocket and its head given back when the "
                .. "handler first waited: read what the handler needs of it before", 3)
        end
        error("request is finished: its fields can no longer be read", 3)
    end
    return r
end

function getters.method(self)
    local r = view(self)
    local s = ffi_str(r.method.base, r.method.len)
    return s -- (no tail call: a trace cannot return from one to a built-in)
end

function getters.path(self)
    local r = view(self)
    local s = ffi_str(r.path.base, r.path.len)
    return s
end

function getters.target(self)
    local r = view(self)
    return ffi_str(r.target.base, r.target.len)
end

function getters.query_string(self)
    local r = view(self)
    return r.query.len > 0 and ffi_str(r.query.base, r.query.len) or ""
end

-- The request's id (24 hex digits, or a trusted proxy's X-Request-Id): the access log's
-- request_id, and the reference of an error page.
local id_buf = ffi.new("char[80]")
function getters.id(self)
    local n = C.ms_ffi_req_id(view(self), id_buf, 80)
    return ffi_str(id_buf, n)
end

function getters.http_version(self)
    local v = view(self).version
    return v == 20 and 2.0 or v == 10 and 1.0 or 1.1
end

-- Whether the peer is a trusted proxy, whose X-Forwarded-* fields may be believed.
function getters.trusted_proxy(self)
    return C.ms_ffi_req_peer_trusted(view(self)) ~= 0
end

-- The TLS version the request came over ("TLSv1.3"), or false over plain TCP.
function getters.tls(self)
    local n = C.ms_ffi_req_tls(view(self), peer_buf, 64)
    return n > 0 and ffi_str(peer_buf, n)
end

-- "https" when the request came over TLS, or a trusted proxy says the client did; else
-- "http".
function getters.scheme(self)
    -- (asked of the core, not through self.tls and self.trusted_proxy: each would be one
    -- more key in the request's table, made on every request under the default security
    -- fields)
    local r = view(self)
    if C.ms_ffi_req_tls(r, peer_buf, 64) > 0 then
        return "https"
    end
    return shared.proxied_https(self, C.ms_ffi_req_peer_trusted(r) ~= 0) and "https" or "http"
end

function getters.client_ip(self)
    local n = C.ms_ffi_req_client_ip(view(self), peer_buf, 64)
    return ffi_str(peer_buf, n)
end

-- (form, parts, accepts, json and the fields query, params, ctx, cookies are shared)
local mt = shared.metatable(getters, Request)

local _M = { getters = getters, methods = Request }

-- nil, as a variable: a table constructor keeps a key whose value is a variable (here nil)
-- but may drop one written `nil`.
local NONE = nil

--- The request object over the core's request `r` (the dispatcher makes one per request).
-- @local
function _M.new(r)
    -- Made with the keys the framework caches on a request (client_ip for a rate limit's
    -- key), eight, the size of the table: a key added later costs a search for a free slot,
    -- and past the table's size a rehash, on every request that adds it.
    local t = setmetatable({ r = r, method = NONE, path = NONE, _app = NONE, scheme = NONE,
        params = NONE, _route = NONE, client_ip = NONE }, mt)
    return t -- (not `return setmetatable(...)`: a trace cannot return from that tail call)
end

-- Whether a static mount found a directory here that it leaves to the routes (for the app's
-- canonical redirect, which must not move such a path).
-- The access log this request goes to (the core's id, -1 for none, nil to leave it) and
-- the name of the route that took it: the framework's, when it has picked them.
function Request:_access(log, route)
    C.ms_ffi_req_access(view(self), log or -2, route, route and #route or 0)
end

-- The route's index in the metrics (moonserve/host/core/metrics.lua numbers the app's routes).
function Request:_metric(ix)
    C.ms_ffi_req_metric(view(self), ix)
end

function Request:_static_dir()
    return band(view(self).flags, STATIC_DIR) ~= 0
end

--- The first value of a header field, by name in any case, or nil.
-- @tparam string name a field name, in any case
-- @treturn ?string the first value
-- @usage local ua = req:header("user-agent")
function Request:header(name)
    if type(name) ~= "string" then
        error("bad header name (string expected)", 2)
    end
    local p = C.ms_ffi_req_header(view(self), name, #name, vlen)
    if p == nil then
        return nil
    end
    return ffi_str(p, vlen[0])
end

-- The fields `list` (ms_ffi_req_headers or ms_ffi_req_trailers) gives, as a table with
-- lowercase names. Repeated fields are joined with ", " (with "; " for cookie, RFC 9113 8.2.3).
local function field_table(r, list)
    local n = list(r, header_buf, 64)
    local buf = header_buf
    if n > 64 then -- rare: more fields than the scratch array holds
        buf = ffi.new("ms_header_t[?]", n)
        list(r, buf, n)
    end
    local t = base.new_tab(0, n)
    for i = 0, n - 1 do
        local h = buf[i]
        local k = lower(ffi_str(h.name.base, h.name.len))
        local v = ffi_str(h.value.base, h.value.len)
        local old = t[k]
        if old == nil then
            t[k] = v
        else
            t[k] = old .. (k == "cookie" and "; " or ", ") .. v
        end
    end
    return t
end

--- All header fields as a table with lowercase names.
-- @treturn table { name = value }, lowercase names, repeats joined with ", "
function Request:headers()
    return field_table(view(self), C.ms_ffi_req_headers)
end

--- The trailer fields that ended a chunked (HTTP/1.1) or HTTP/2 body, as a table with lowercase
-- names; empty until the body has been read whole. Trailers are never headers.
-- @treturn table { name = value }
function Request:trailers()
    return field_table(view(self), C.ms_ffi_req_trailers)
end

-- The next piece of the body (see Request:read); `what` names the caller in errors.
local function read(self, what)
    local r = view(self)
    while true do
        local n = C.ms_ffi_req_body_take(r, body_ptr)
        if n > 0 then
            return ffi_str(body_ptr[0], n)
        elseif n == 0 then
            return nil
        elseif n ~= EAGAIN then
            return base.fail(tonumber(n))
        end
        check(what, "wait", 3) -- before the core arms the wait
        local rc = C.ms_ffi_req_wait_body(r)
        if rc < 0 then
            return base.fail(rc)
        end
        park()
    end
end

--- The next piece of the body: a string, or nil at its end, or nil and an error. Yields
-- (parks the handler) while the client has not sent more, in the handler's own coroutines
-- too; raises where it cannot wait (a C call: a string.gsub callback, a table.sort
-- comparator, an FFI callback, require).
-- @treturn ?string the next piece; nil at the end, or nil and an error
function Request:read()
    local piece, err, name = read(self, "req:read")
    return piece, err, name
end
Request._read = read -- (for request_methods' body(), whose errors name req:body)

--- The status the core answered with in the handler's place (413, 408, ...), or nil; then
-- req:read(), req:body(), req:json() and req:parts() return nil and an error.
-- @treturn ?integer
function Request:refused()
    local status = C.ms_ffi_req_refused(view(self))
    return status ~= 0 and status or nil
end

--- Sets the CPU its handler may use between two waits from now on, in milliseconds (the
-- route's own limits.handler_cpu_ms; 0: none). Past it the handler is stopped: 503.
-- @tparam number ms
-- @return the request
function Request:cpu_budget(ms)
    if type(ms) ~= "number" or ms < 0 then
        error("bad CPU budget (milliseconds expected)", 2)
    end
    require("moonserve.host.core.dispatcher").cpu_budget(ms)
    return self
end

--- Sets how large this request's body may be (the route's own limit), before reading it.
-- Past it the client gets 413. Raises when over the server's body_bytes_max.
-- @tparam number bytes
-- @return the request
function Request:body_limit(bytes)
    if type(bytes) ~= "number" or bytes < 0 then
        error("bad body limit (bytes expected)", 2)
    end
    local rc = C.ms_ffi_req_body_limit(view(self), bytes)
    if rc < 0 then
        error("body limit " .. bytes .. " is over the server's body_bytes_max", 2)
    end
    return self
end


return _M
