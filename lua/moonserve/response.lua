-- moonserve/response.lua: the reply a handler builds, written by the core.
local ffi = require "ffi"
local bit = require "bit"
local base = require "moonserve.base"

local C = base.C
local co_yield = coroutine.yield
local band = bit.band
local lower, find, format, type, tostring = string.lower, string.find, string.format, type, tostring
local PARK, HEAD_SENT = base.PARK, base.REQ_HEAD_SENT

local anchors = base.anchors -- Lua strings the core still writes from, by slot

local Response = {}
Response.__index = Response

local _M = { methods = Response }

function _M.new(r)
    return setmetatable({ r = r, has_type = false }, Response)
end

local function view(self)
    local r = self.r
    if not r then
        error("request is finished: its reply can no longer change", 3)
    end
    return r
end

-- Whether the reply head has left (after send, or the first write).
function Response:sent()
    return band(view(self).flags, HEAD_SENT) ~= 0
end

function Response:status(code)
    if type(code) ~= "number" or code < 100 or code > 999 or code % 1 ~= 0 then
        error("bad status code (integer 100-999 expected, got " .. tostring(code) .. ")", 2)
    end
    view(self).status = code
    return self
end

function Response:get_status()
    return view(self).status
end

local CTYPE_LEN = #"content-type"

local function add_header(self, name, value, level)
    local rc = C.ms_ffi_res_header(view(self), name, #name, value, #value)
    if rc < 0 then
        local _, err = base.fail(rc)
        error(format("bad header %q: %s", name, err), level + 1)
    end
    if #name == CTYPE_LEN and lower(name) == "content-type" then
        self.has_type = true
    end
end

-- Adds field lines built and checked beforehand ("name: value\r\n"...): the framework's
-- fixed headers, one call for all of them.
function Response:fields(lines)
    local rc = C.ms_ffi_res_fields(view(self), lines, #lines)
    if rc < 0 then
        local _, err = base.fail(rc)
        error("cannot add fields: " .. err, 2)
    end
    return self
end

-- Adds a field. `value` may be a list, which adds one field per item. Names are sent as
-- given; lowercase is the convention.
function Response:header(name, value)
    if type(name) ~= "string" then
        error("bad header name (string expected)", 2)
    end
    local tv = type(value)
    if tv == "table" then
        for i = 1, #value do
            add_header(self, name, tostring(value[i]), 2)
        end
    elseif tv == "string" or tv == "number" then
        add_header(self, name, tostring(value), 2)
    else
        error("bad header value for " .. name .. " (string expected)", 2)
    end
    return self
end

local released = ffi.new("int32_t[256]")

local function drain_more(r, n)
    while true do
        for i = 0, n - 1 do
            anchors[released[i]] = nil
        end
        if n < 256 then
            return
        end
        n = C.ms_ffi_anchor_drain(r, released, 256)
    end
end

-- Lets go of the strings whose writes are done. Called per request and per anchored
-- write, so a long stream of large pieces does not pile them up. Usually there are none:
-- the loop lives apart, so the JIT compiles this call into the request's trace.
function _M.drain(r)
    local n = C.ms_ffi_anchor_drain(r, released, 256)
    if n > 0 then
        drain_more(r, n)
    end
end
local drain = _M.drain

local function anchor(rc, s, r)
    if rc > 0 then
        anchors[rc - 1] = s -- the core writes from this string: keep it alive until then
        drain(r)
        return true
    elseif rc < 0 then
        return base.fail(rc)
    end
    return true
end

-- A body or chunk as a string: strings as they are, numbers as text; anything else is
-- misuse and raises at the caller's caller.
local function text(x, what)
    local t = type(x)
    if t == "string" then
        return x
    elseif t == "number" then
        return tostring(x)
    end
    error("bad " .. what .. " (string expected, got " .. t .. ")", 3)
end

-- Sends the whole reply. Returns true, or nil and an error (the reply was already sent, or
-- the client has gone).
function Response:send(body)
    local r = view(self)
    body = body == nil and "" or text(body, "body")
    return anchor(C.ms_ffi_res_send(r, body, #body, self.has_type and 0 or 1), body, r)
end

local cjson
-- Sends `value` as JSON.
function Response:json(value)
    cjson = cjson or require "cjson"
    local body = cjson.encode(value)
    if not self.has_type then
        add_header(self, "content-type", "application/json", 1)
    end
    return self:send(body)
end

-- Redirects to `url` (302 unless `code` says otherwise).
function Response:redirect(url, code)
    if type(url) ~= "string" then
        error("bad redirect url (string expected)", 2)
    end
    code = code or 302
    if code < 300 or code > 399 then
        error("bad redirect status " .. tostring(code), 2)
    end
    self:status(code)
    add_header(self, "location", url, 1)
    return self:send("Redirecting to " .. url .. "\n")
end

-- Streams a piece of a reply whose length is not known (chunked on HTTP/1.1). Waits (parks
-- the handler) while the client reads slower than the handler writes.
function Response:write(chunk)
    local r = view(self)
    chunk = text(chunk, "chunk")
    local ok, err, name = anchor(C.ms_ffi_res_write(r, chunk, #chunk, self.has_type and 0 or 1),
        chunk, r)
    if not ok then
        return nil, err, name
    end
    if C.ms_ffi_res_congested(r) ~= 0 then
        local rc = C.ms_ffi_req_wait_drain(r)
        if rc == 0 then
            co_yield(PARK)
        elseif rc < 0 then
            return base.fail(rc)
        end
    end
    return true
end

local SAME_SITE = { strict = "Strict", lax = "Lax", none = "None" }

-- Sets a cookie. opts: path, domain, max_age (seconds), expires (a time, seconds since the
-- epoch), secure, http_only, same_site ("Strict", "Lax" or "None").
function Response:cookie(name, value, opts)
    if type(name) ~= "string" or not find(name, "^[%w!#$%%&'*+%-.^_`|~]+$") then
        error("bad cookie name", 2)
    end
    value = tostring(value or "")
    -- cookie-octet (RFC 6265 4.1.1): no controls, whitespace, DQUOTE, comma, semicolon or
    -- backslash.
    if find(value, "[%c%s\",;\\\127]") then
        error("bad cookie value for " .. name .. " (escape it first)", 2)
    end
    local parts = { name .. "=" .. value }
    opts = opts or {}
    if opts.path then
        parts[#parts + 1] = "Path=" .. opts.path
    end
    if opts.domain then
        parts[#parts + 1] = "Domain=" .. opts.domain
    end
    if opts.max_age then
        parts[#parts + 1] = format("Max-Age=%d", opts.max_age)
    end
    if opts.expires then
        parts[#parts + 1] = "Expires=" .. os.date("!%a, %d %b %Y %H:%M:%S GMT", opts.expires)
    end
    if opts.secure then
        parts[#parts + 1] = "Secure"
    end
    if opts.http_only then
        parts[#parts + 1] = "HttpOnly"
    end
    if opts.same_site then
        local ss = SAME_SITE[lower(opts.same_site)]
        if not ss then
            error("bad same_site (Strict, Lax or None expected)", 2)
        end
        parts[#parts + 1] = "SameSite=" .. ss
    end
    add_header(self, "set-cookie", table.concat(parts, "; "), 1)
    return self
end

return _M
