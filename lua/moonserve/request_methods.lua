--- moonserve/request_methods.lua: what a request does that needs nothing of its host but
-- header(), _read() (the next piece of the body) and its own fields: the whole body, forms,
-- multipart parts, content negotiation, JSON, and the lazy fields query, params, ctx and
-- cookies. The core's request
-- (moonserve/host/core/request.lua) and nginx's (moonserve/host/openresty/request.lua) take them.
-- @module moonserve.request_methods
local codec = require "moonserve.codec"

local lower, sub, find, concat = string.lower, string.sub, string.find, table.concat

local Request = {}

-- The fields read at their first use, as both hosts' requests have them.
local getters = {}

function getters.query(self)
    return codec.parse_form(self.query_string)
end

function getters.params()
    return {}
end

function getters.ctx()
    return {}
end

-- The Cookie field as { name = value } (moonserve.cookie.parse).
function getters.cookies(self)
    return require("moonserve.cookie").parse(self:header("cookie"))
end

local _M = { methods = Request }

--- Whether a trusted proxy says the client came over https (X-Forwarded-Proto's last item).
-- `trusted`: whether the peer is one (default: req.trusted_proxy).
-- @local
function _M.proxied_https(self, trusted)
    if trusted == nil then
        trusted = self.trusted_proxy
    end
    if trusted then
        local proto = self:header("x-forwarded-proto")
        return proto ~= nil and lower(proto:match("([^,%s]+)%s*$") or "") == "https"
    end
    return false
end

--- A request's metatable: `own_getters` (the host's, then these) make a field at its first
-- read, `methods` (the host's, then these) are the rest.
-- @local
function _M.metatable(own_getters, methods)
    for k, get in pairs(getters) do
        own_getters[k] = own_getters[k] or get
    end
    for k, fn in pairs(Request) do
        methods[k] = methods[k] or fn
    end
    return {
        __index = function(self, k)
            local get = own_getters[k]
            if get then
                local v = get(self)
                rawset(self, k, v)
                return v
            end
            return methods[k]
        end,
    }
end

local function media_type(self)
    local ct = self:header("content-type")
    if not ct then
        return nil
    end
    local semi = find(ct, ";", 1, true)
    return lower(semi and sub(ct, 1, semi - 1):match("^%s*(.-)%s*$") or ct:match("^%s*(.-)%s*$"))
end

--- Every value of query parameter `name`, as a list: {} when absent, one item when it came
-- once, all of them in order when repeated ("?tag=a&tag=b"). req.query[name] gives a string
-- for a parameter that came once and a list for a repeated one.
-- @tparam string name
-- @treturn table a new list of strings
-- @usage for _, tag in ipairs(req:query_all("tag")) do ... end
function Request:query_all(name)
    local v = self.query[name]
    if v == nil then
        return {}
    elseif type(v) == "table" then
        local list = {}
        for i = 1, #v do
            list[i] = v[i]
        end
        return list
    end
    return { v }
end

--- The parts of a multipart/form-data body as they arrive: for part in req:parts() do ...
-- (moonserve.multipart: part.name, part.filename, part:read(), part:body(), part:save(path)).
-- Returns nil, err when the body is not multipart/form-data.
-- @tparam[opt] table opts the parser's limits (moonserve.multipart)
-- @return an iterator of Part, or nil and an error
function Request:parts(opts)
    return require("moonserve.multipart").parts(self, opts)
end

--- Hands back pieces of the body that were read (middleware that looked into it: the
-- multipart _csrf field of moonserve.csrf): read(), and so body(), parts() and form(),
-- return them first, in order, then what is still to come. The list is the request's now.
-- @local
function Request:_unread(pieces)
    local n = #pieces
    if n == 0 then
        return
    end
    -- The request's own read() and _read() stand in front of its class's until the last
    -- piece is handed out; then what was there before (the class's) is back.
    local read, read_ = rawget(self, "read"), rawget(self, "_read")
    local i = 0
    local function give()
        i = i + 1
        local piece = pieces[i]
        pieces[i] = nil
        if i == n then
            rawset(self, "read", read)
            rawset(self, "_read", read_)
        end
        return piece
    end
    rawset(self, "read", give)
    rawset(self, "_read", give)
end

--- The whole body (what read() has not taken yet) as one string, or nil and an error.
-- @treturn ?string the body, or nil and an error
-- @usage local body, err = req:body()
-- if not body then return res:status(400):send(err) end
function Request:body()
    local cached = rawget(self, "_body")
    if cached then
        return cached
    end
    local parts, n = {}, 0
    while true do
        local piece, err, name = self:_read("req:body")
        if piece == nil then
            if err then
                return nil, err, name
            end
            break
        end
        n = n + 1
        parts[n] = piece
    end
    local body = n == 1 and parts[1] or concat(parts)
    rawset(self, "_body", body)
    return body
end

--- The body as an urlencoded form ({ name = value }), or nil and an error.
-- @treturn ?table the form, or nil and an error
function Request:form()
    local mt_ = media_type(self)
    if mt_ ~= "application/x-www-form-urlencoded" then
        return nil, "not an urlencoded form (content-type is " .. tostring(mt_) .. ")"
    end
    local body, err = self:body()
    if not body then
        return nil, err
    end
    return codec.parse_form(body)
end

-- Short names for the media types handlers usually offer.
local MEDIA = { json = "application/json", html = "text/html", text = "text/plain",
    xml = "application/xml", css = "text/css", js = "text/javascript",
    form = "application/x-www-form-urlencoded" }

--- Which of the offered types (short names or full types) the client prefers, by its
-- Accept header (RFC 9110 12.5.1: q-values, then specificity, then the order offered).
-- No Accept header accepts anything: the first offered. Returns nil when none is acceptable.
-- @param ... offered types: "json", "html", "text", ... or full media types
-- @treturn ?string the offer preferred
-- @usage if req:accepts("json", "html") == "json" then return res:json(data) end
function Request:accepts(...)
    local accept = self:header("accept")
    -- (curl's, and most tools' and crawlers': every offer at q=1, so the first; and no loop,
    -- which would end the caller's trace)
    if not accept or accept == "" or accept == "*/*" then
        return (...)
    end
    local ranges = {}
    for item in accept:gmatch("[^,]+") do
        local mtype = item:match("^%s*([^;%s]+)")
        if mtype then
            local q = tonumber(item:match(";%s*[qQ]%s*=%s*([%d.]+)")) or 1
            ranges[#ranges + 1] = { lower(mtype), q }
        end
    end
    local best, best_q = nil, 0
    for i = 1, select("#", ...) do
        local offer = select(i, ...)
        local full = lower(MEDIA[offer] or offer)
        local major = full:match("^([^/]+)/") or full
        -- the most specific range that covers this offer decides its q
        local q, spec = 0, -1
        for _, r in ipairs(ranges) do
            local s = r[1] == full and 2 or (r[1] == major .. "/*" and 1) or
                (r[1] == "*/*" and 0) or -1
            if s > spec then
                q, spec = r[2], s
            end
        end
        if q > best_q then
            best, best_q = offer, q
        end
    end
    return best
end

--- The body decoded as JSON (moonserve.json.decode: null is json.null, an empty array is
-- marked to encode as `[]` again), or nil and an error.
-- @return the decoded value, or nil and an error
function Request:json()
    local body, err = self:body()
    if not body then
        return nil, err
    end
    local v, jerr = require("moonserve.json").decode(body)
    if v == nil and jerr then
        return nil, "invalid JSON: " .. jerr
    end
    return v
end

return _M
