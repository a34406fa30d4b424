--- moonserve/response_methods.lua: the reply's methods that need nothing of its host but
-- header(), status() and send(): JSON, redirects, cookies, hooks before the head leaves, and
-- templates. The core's reply (moonserve/host/core/response.lua) and nginx's
-- (moonserve/host/openresty/response.lua) take them.
-- @module moonserve.response_methods
local cookie = require "moonserve.cookie"
local json = require "moonserve.json"

local format, gsub, find, type, tostring, pairs = string.format, string.gsub, string.find,
    type, tostring, pairs

local Response = {}

-- The reasons error_json says when given no message (RFC 9110 15.5, 15.6).
local REASONS = {
    [400] = "Bad Request", [401] = "Unauthorized", [403] = "Forbidden", [404] = "Not Found",
    [405] = "Method Not Allowed", [406] = "Not Acceptable", [408] = "Request Timeout",
    [409] = "Conflict", [410] = "Gone", [413] = "Content Too Large", [415] =
    "Unsupported Media Type", [422] = "Unprocessable Content", [429] = "Too Many Requests",
    [500] = "Internal Server Error", [501] = "Not Implemented", [502] = "Bad Gateway",
    [503] = "Service Unavailable", [504] = "Gateway Timeout",
}

local _M = { methods = Response }

--- The before_send hooks, once, while the head can still change (both hosts' replies call it
-- before their head leaves). The first is held apart from the rest: the common reply of one
-- hook (a session's, the ngx layer's) makes no list, and meets no loop, which would keep the
-- request's trace from being compiled whole.
-- @local
function _M.fire(self)
    local first, more = rawget(self, "hook1"), rawget(self, "hooks")
    if first then
        self.hook1 = false
        first(self)
        if more then
            self.hooks = nil
            for i = 1, #more do
                more[i](self)
            end
        end
    end
end

--- A body or chunk as a string: strings as they are, numbers as text; anything else is
-- misuse and raises at the caller's caller (for both hosts' send and write).
-- @local
function _M.text(x, what)
    local t = type(x)
    if t == "string" then
        return x
    elseif t == "number" then
        return tostring(x)
    end
    error("bad " .. what .. " (string expected, got " .. t .. ")", 3)
end

--- Adds a field. `value` may be a list, which adds one field per item. Names are sent as
-- given; lowercase is the convention.
-- @tparam string name a lowercase field name
-- @tparam string value
-- @return the reply, to chain
function Response:header(name, value)
    if type(name) ~= "string" then
        error("bad header name (string expected)", 2)
    end
    local tv = type(value)
    if tv == "table" then
        for i = 1, #value do
            self:_add_header(name, tostring(value[i]))
        end
    elseif tv == "string" or tv == "number" then
        self:_add_header(name, tostring(value))
    else
        error("bad header value for " .. name .. " (string expected)", 2)
    end
    return self
end


--- Sends `value` as JSON (moonserve.json: json.array(t) encodes as an array, `[]` when
-- empty; json.null as null).
-- @param value a table (or any value lua-cjson encodes)
-- @return true, or nil and an error
function Response:json(value)
    local body = json.encode(value)
    if not self.has_type then
        self:header("content-type", "application/json")
    end
    return self:send(body)
end

--- Answers 422 with `{"errors": {field: message, ...}}`: what a validator of
-- moonserve.validate returned as its errors.
-- @tparam table errors
-- @return true, or nil and an error
-- @usage local data, errors = v(req:json()); if errors then return res:invalid(errors) end
function Response:invalid(errors)
    if type(errors) ~= "table" then
        error("bad errors (table expected, got " .. type(errors) .. ")", 2)
    end
    self:status(422)
    return self:json{ errors = errors }
end

--- Answers `status` with the JSON error envelope `{"error": {"status": 404, "message":
-- "..."}}`; the fields of `extra` (a code, details...) join status and message.
-- @tparam integer status
-- @tparam[opt] string message the status's reason when nil
-- @tparam[opt] table extra more fields of "error"
-- @return true, or nil and an error
-- @usage return res:error_json(404, "no such note", { id = id })
function Response:error_json(status, message, extra)
    if type(status) ~= "number" or status < 400 or status > 599 or status % 1 ~= 0 then
        error("bad error status " .. tostring(status) .. " (400 to 599 expected)", 2)
    end
    local body = {}
    if extra ~= nil then
        if type(extra) ~= "table" then
            error("bad extra (table expected, got " .. type(extra) .. ")", 2)
        end
        for k, v in pairs(extra) do
            body[k] = v
        end
    end
    body.status = status
    body.message = message ~= nil and tostring(message) or (REASONS[status] or "Error")
    self:status(status)
    return self:json{ error = body }
end

-- Printable bytes no URL may hold as they are (RFC 3986 2): escaped in a Location. Above
-- all the backslash, which browsers read as "/": "/\evil.test" would be "//evil.test".
local NOT_URL = '[ "<>\\^`{|}]'

local function escape_byte(c)
    return format("%%%02X", c:byte())
end

-- 1 if `url` may go out as it is, 0 if it holds bytes to percent-encode, -1 if it holds a
-- control byte (the core's reply checks in C, in one pass: a pattern search here stops the
-- JIT's trace).
function Response._url_check(_, url)
    if find(url, "%c") then
        return -1
    end
    return find(url, NOT_URL) and 0 or 1
end

--- Redirects to `url` (302 unless `code` says otherwise). Bytes no URL may hold are
-- percent-encoded; control characters raise.
-- @tparam string url
-- @tparam[opt=302] integer code 300 to 399
-- @return true, or nil and an error
function Response:redirect(url, code)
    if type(url) ~= "string" then
        error("bad redirect url (string expected)", 2)
    end
    code = code or 302
    if code < 300 or code > 399 then
        error("bad redirect status " .. tostring(code), 2)
    end
    local kind = self:_url_check(url)
    if kind < 0 then
        -- no CR or LF (a field of its own), and none a browser drops from a URL either (a tab
        -- in "java\tscript:"), nor terminal escapes
        error("bad redirect url (control characters)", 2)
    elseif kind == 0 then
        url = gsub(url, NOT_URL, escape_byte)
    end
    self:status(code)
    self:header("location", url)
    return self:send("Redirecting to " .. url .. "\n")
end

--- Sets a cookie: Set-Cookie built by moonserve.cookie (opts: path, domain, max_age,
-- expires, secure, http_only, same_site, partitioned). Misuse raises.
-- @tparam string name
-- @tparam string value
-- @tparam[opt] table opts
-- @return the reply
-- @usage res:cookie("theme", "dark", { path = "/", max_age = 3600, http_only = true })
function Response:cookie(name, value, opts)
    local ok, line = pcall(cookie.serialize, name, value, opts)
    if not ok then
        error(line, 2)
    end
    return self:header("set-cookie", line)
end

--- Runs fn(res) once, just before the reply's head leaves (sessions save themselves here).
-- fn may be a table with a __call metamethod: middleware that hooks every request uses one,
-- which LuaJIT compiles where it would not a function made per request.
-- @tparam function fn fn(res)
-- @return the reply
function Response:before_send(fn)
    if type(fn) ~= "function" then
        local mt = type(fn) == "table" and getmetatable(fn)
        if not (mt and mt.__call) then
            error("bad hook (function expected)", 2)
        end
    end
    if not rawget(self, "hook1") then
        self.hook1 = fn
        return self
    end
    local hooks = rawget(self, "hooks")
    if not hooks then
        hooks = {}
        self.hooks = hooks
    end
    hooks[#hooks + 1] = fn
    return self
end

--- Starts a server-sent event stream (text/event-stream) and returns it: ev:send{ id =,
-- event =, data =, retry = }, ev:comment(text), ev:follow() (a channel's messages, with
-- heartbeats, until the client leaves), ev:idle(seconds). See moonserve/events.lua.
-- @tparam[opt] table opts channel, replay, heartbeat, retry, event, last_event_id
-- @return the stream
-- @usage local ev = res:events{ channel = "notes", replay = true }; ev:follow()
function Response:events(opts)
    local stream = require("moonserve.events").start(self, opts)
    return stream -- (not a tail call: start's errors name the handler's line)
end

--- Renders a template of the app's views (app:views{ root = ... }) and sends it as HTML,
-- its pieces unjoined. A template error raises (a 500 with its reference id).
-- @tparam string name the template, under the views' root
-- @tparam[opt] table vars
-- @return true, or nil and an error
function Response:render(name, vars)
    local views = self.views
    if not views then
        error("no views: call app:views{ root = ... } first", 2)
    end
    vars = vars or {}
    if vars.csrf_token == nil and self.csrf_token then
        vars.csrf_token = self.csrf_token
    end
    local pieces, err = views:render(name, vars)
    if not pieces then
        error(err, 2)
    end
    if not self.has_type then
        self:header("content-type", "text/html; charset=utf-8")
    end
    return self:send(pieces)
end

return _M
