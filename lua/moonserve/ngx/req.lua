-- moonserve/ngx/req.lua: ngx.req over the running request (moonserve/host/core/request.lua): its
-- method, fields, arguments, body, and the changes a handler makes to them (set_header,
-- set_uri, set_uri_args), which ngx.req and ngx.var then show.
local ffi = require "ffi"
local context = require "moonserve.ngx.context"
local codec = require "moonserve.ngx.codec"
local add_value = require("moonserve.codec").add_value
local ntime = require "moonserve.ngx.time"

local lower, gsub, concat, type, tostring, pairs, error = string.lower, string.gsub,
    table.concat, type, tostring, pairs, error
local ffi_str = ffi.string
local request_state = context.request

local _M = {}

local C, fields_buf
local function core()
    if not C then
        C = require("moonserve.host.core.base").C
        fields_buf = ffi.new("ms_header_t[64]")
    end
    return C
end

-- Each field of the request as received: fn(name, value) in order, the handler's own changes
-- (set_header, clear_header) in place of the fields they name.
local function each_field(st, fn)
    local saved = st.fields -- the log phase's copy (moonserve/ngx/phases.lua)
    if saved then
        for i = 1, #saved, 2 do
            fn(saved[i], saved[i + 1])
        end
        return
    end
    local r = st.req.r
    if not r then
        error("request is finished: its fields can no longer be read", 3)
    end
    local c = core()
    local n = c.ms_ffi_req_headers(r, fields_buf, 64)
    local buf = fields_buf
    if n > 64 then
        buf = ffi.new("ms_header_t[?]", n)
        c.ms_ffi_req_headers(r, buf, n)
    end
    local set = st.req_set
    for i = 0, n - 1 do
        local h = buf[i]
        local name = ffi_str(h.name.base, h.name.len)
        if not (set and set[lower(name)] ~= nil) then
            fn(name, ffi_str(h.value.base, h.value.len))
        end
    end
    if set then
        for _, v in pairs(set) do
            if v then
                local vals = v.value
                if type(vals) == "table" then
                    for i = 1, #vals do
                        fn(v.name, vals[i])
                    end
                else
                    fn(v.name, vals)
                end
            end
        end
    end
end
_M.each_field = each_field

-- The first value of field `name` (lowercase, "-"), the handler's change first; for
-- ngx.var.http_*. Repeated cookie fields are joined with "; ", as nginx does.
function _M.field(st, name)
    local set = st.req_set
    local v = set and set[name]
    if v ~= nil then
        if not v then
            return nil
        end
        return type(v.value) == "table" and concat(v.value, ", ") or v.value
    end
    if name == "cookie" then
        local all
        each_field(st, function(k, val)
            if lower(k) == "cookie" then
                all = all and all .. "; " .. val or val
            end
        end)
        return all
    end
    return st.req:header(name)
end

-- -- Fields ---------------------------------------------------------------------------------

-- Looked up as OpenResty's table does: any case, "_" for "-".
local fields_mt = {
    __index = function(t, k)
        if type(k) ~= "string" then
            return nil
        end
        local nk = gsub(lower(k), "_", "-")
        if nk ~= k then
            return rawget(t, nk)
        end
        return nil
    end,
}

local function checkmax(max, fname)
    if max == nil then
        return 100
    end
    if type(max) ~= "number" then
        error("bad argument #1 to '" .. fname .. "' (number expected, got " .. type(max) .. ")", 3)
    end
    return max
end

-- The request's fields: names lowercase (as sent with `raw`), a repeated field a list; at
-- most `max` of them (default 100, 0: all), and then "truncated" as a second value.
function _M.get_headers(max, raw)
    local st = request_state(2)
    max = checkmax(max, "get_headers")
    local t, n, cut = {}, 0, false
    each_field(st, function(name, value)
        if max > 0 and n >= max then
            cut = true
            return
        end
        n = n + 1
        add_value(t, raw and name or lower(name), value)
    end)
    if not raw then
        setmetatable(t, fields_mt)
    end
    if cut then
        return t, "truncated"
    end
    return t
end

local function check_name(name, fname)
    if type(name) ~= "string" then
        error("bad argument #1 to '" .. fname .. "' (string expected, got " .. type(name) .. ")", 3)
    end
    return context.field_name((gsub(name, "_", "-")))
end

-- Replaces field `name` for the rest of the request (ngx.req.get_headers, ngx.var.http_*,
-- subrequests); nil or {} removes it. The name and value are escaped as lua-nginx-module
-- escapes them (context.field_value): a CR or LF is %0D%0A, never a line end.
function _M.set_header(name, value)
    local st = request_state(2)
    name = check_name(name, "set_header")
    local v = context.field_value(value)
    st.req_set = st.req_set or {}
    st.req_set[lower(name)] = v ~= nil and { name = name, value = v } or false
end

function _M.clear_header(name)
    local st = request_state(2)
    name = check_name(name, "clear_header")
    st.req_set = st.req_set or {}
    st.req_set[lower(name)] = false
end

-- The request's head as text: the request line (unless `no_request_line`) and its fields,
-- rebuilt from what was parsed (the bytes OpenResty returns, up to the spaces around values).
function _M.raw_header(no_request_line)
    local st = request_state(2)
    local req = st.req
    local out = {}
    if not no_request_line then
        local v = req.http_version
        out[1] = req.method .. " " .. req.target .. " HTTP/" .. (v == 2 and "2.0" or
            v == 1 and "1.0" or "1.1") .. "\r\n"
    end
    each_field(st, function(name, value)
        out[#out + 1] = name .. ": " .. value .. "\r\n"
    end)
    out[#out + 1] = "\r\n"
    return concat(out)
end

-- -- The request line -----------------------------------------------------------------------

function _M.get_method()
    return request_state(2).req.method
end

function _M.http_version()
    return request_state(2).req.http_version
end

function _M.start_time()
    return request_state(2).start
end

function _M.is_internal()
    return request_state(2).sub ~= nil
end

-- The query string as the handler has it now (set_uri_args), or nil when there is none.
function _M.args(st)
    local a = st.args
    if a == nil then
        a = st.req.query_string
        st.args = a
    end
    return a ~= "" and a or nil
end

function _M.get_uri_args(max)
    local st = request_state(2)
    max = checkmax(max, "get_uri_args")
    local t, _, cut = codec.decode_args(_M.args(st) or "", max)
    if cut then
        return t, "truncated"
    end
    return t
end

function _M.set_uri_args(args)
    local st = request_state(2)
    if type(args) == "table" then
        args = codec.encode_args(args)
    elseif type(args) == "number" then
        args = tostring(args)
    elseif type(args) ~= "string" then
        error("bad argument #1 to 'set_uri_args' (string or table expected, got " .. type(args)
            .. ")", 2)
    end
    st.args = args
end

-- Changes the URI ngx.var.uri shows. A jump (rewrite's re-match of locations) is not done:
-- the route was chosen once. As nginx, a URI with a control byte raises unless `binary`.
function _M.set_uri(uri, jump, binary)
    local st = request_state(2)
    if type(uri) ~= "string" then
        error("bad argument #1 to 'set_uri' (string expected, got " .. type(uri) .. ")", 2)
    elseif uri == "" then
        error("attempt to use zero-length uri", 2)
    end
    if not binary then
        context.check_unsafe(uri, "uri \"%s\" (maybe you want to set the 'binary' argument?)", 2)
    end
    if jump then
        error("ngx.req.set_uri: jump is not supported (the route is chosen once)", 2)
    end
    st.uri = uri
end

-- -- The body -------------------------------------------------------------------------------

-- Reads the whole body into memory (moonserve never spills a body to a file).
function _M.read_body()
    local st = request_state(2)
    if context.LATE[st.phase] then
        context.disabled(st, 2)
    end
    if st.body_sock or st.raw ~= nil then
        return -- ngx.req.socket has the body, or the connection (as OpenResty: nothing read)
    end
    local body, err = st.req:body()
    if not body and err then
        error("ngx.req.read_body: " .. tostring(err), 2)
    end
    st.body_read = true
end

-- The body, once read (read_body, or req:body()); nil before, and nil for an empty one.
function _M.get_body_data()
    local st = request_state(2)
    local body = rawget(st.req, "_body")
    if body == nil or body == "" then
        return nil
    end
    return body
end

function _M.get_body_file()
    request_state(2)
    return nil
end

-- The body's urlencoded arguments; the body is read here if it was not yet.
function _M.get_post_args(max)
    local st = request_state(2)
    max = checkmax(max, "get_post_args")
    local body = rawget(st.req, "_body")
    if body == nil then
        local err
        body, err = st.req:body()
        if not body then
            return nil, tostring(err)
        end
    end
    local t, _, cut = codec.decode_args(body, max)
    if cut then
        return t, "truncated"
    end
    return t
end

-- ngx.req.socket([raw]): moonserve/ngx/reqsock.lua.
local reqsock
function _M.socket(raw, ...)
    if select("#", ...) > 0 then
        error("expecting zero arguments, but got " .. (select("#", ...) + 1), 2)
    end
    local st = request_state(2)
    reqsock = reqsock or require "moonserve.ngx.reqsock"
    return reqsock.socket(st, raw)
end

context.on_request(function(st)
    st.start = ntime.now()
end)

return _M
