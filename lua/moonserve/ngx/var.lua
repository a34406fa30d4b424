-- moonserve/ngx/var.lua: ngx.var, nginx's variables of the running request, as strings (nil
-- for one that is not set), and the handler's own variables: without a config file to
-- declare them, any name that is not nginx's may be set (ngx.var.user = "ada").
local ffi = require "ffi"
local context = require "moonserve.ngx.context"
local codec = require "moonserve.ngx.codec"
local ntime = require "moonserve.ngx.time"
local req_api = require "moonserve.ngx.req"

local sub, find, lower, gsub, format, tostring, type, error = string.sub, string.find,
    string.lower, string.gsub, string.format, tostring, type, error
local ffi_str = ffi.string
local request_state = context.request

local _M = {}

local C, addr_buf
local function address(st, is_local)
    local saved = st.addrs -- the log phase's copy (moonserve/ngx/phases.lua)
    if saved then
        local a = saved[is_local and 2 or 1]
        return a[1], a[2]
    end
    if st.parent then -- a subrequest: the connection is its parent's, as in nginx
        return address(st.parent, is_local)
    end
    if not C then
        C = require("moonserve.host.core.base").C
        addr_buf = ffi.new("char[64]")
    end
    local r = st.req.r
    local port = r and C.ms_ffi_req_address(r, is_local and 1 or 0, addr_buf, 64) or -1
    if port < 0 then
        return nil, nil
    end
    return ffi_str(addr_buf), tostring(port)
end

-- The Host field without its port, lowercase, as nginx's $host.
local function host(st)
    local h = req_api.field(st, "host")
    if not h or h == "" then
        return (address(st, true)) or ""
    end
    h = lower(h)
    if sub(h, 1, 1) == "[" then
        return h:match("^(%[[^%]]*%])") or h
    end
    local colon = find(h, ":", 1, true)
    return colon and sub(h, 1, colon - 1) or h
end

_M.address = address

local VERSIONS = { [1] = "HTTP/1.0", [2] = "HTTP/2.0" }

local builtin = {
    uri = function(st)
        return st.uri or codec.unescape_uri((gsub(st.req.path, "+", "%%2B")))
    end,
    document_uri = function(st)
        return st.uri or codec.unescape_uri((gsub(st.req.path, "+", "%%2B")))
    end,
    request_uri = function(st) return st.req.target end,
    args = function(st) return req_api.args(st) end,
    query_string = function(st) return req_api.args(st) end,
    is_args = function(st) return req_api.args(st) and "?" or "" end,
    host = host,
    request_method = function(st) return st.req.method end,
    scheme = function(st) return (st.parent or st).req.scheme end,
    https = function(st) return st.req.scheme == "https" and "on" or "" end,
    server_protocol = function(st) return VERSIONS[st.req.http_version] or "HTTP/1.1" end,
    remote_addr = function(st) return (address(st, false)) end,
    remote_port = function(st) return select(2, address(st, false)) end,
    server_addr = function(st) return (address(st, true)) end,
    server_port = function(st) return select(2, address(st, true)) end,
    server_name = function(st) return host(st) end,
    request_time = function(st) return format("%.3f", ntime.now() - st.start) end,
    msec = function() return format("%.3f", ntime.now()) end,
    time_local = function() return os.date("%d/%b/%Y:%H:%M:%S %z") end,
    time_iso8601 = function() return (os.date("%Y-%m-%dT%H:%M:%S%z"):gsub("(%d%d)$", ":%1")) end,
    content_type = function(st) return req_api.field(st, "content-type") end,
    content_length = function(st) return req_api.field(st, "content-length") end,
    request_id = function(st) return st.req.id end,
    status = function(st)
        local r = st.status or st.res.r -- (the log phase's copy)
        return r and tostring(type(r) == "number" and r or r.status) or nil
    end,
    request_body = function(st) return rawget(st.req, "_body") end,
    pid = function() return tostring(require("moonserve.ngx.process").pid()) end,
    hostname = function() return require("moonserve.ngx.process").hostname() end,
    nginx_version = function() return "1.22.1" end,
}

local function lookup(st, name)
    local get = builtin[name]
    if get then
        return get(st)
    end
    local vars = st.vars
    local v = vars and vars[name]
    if v ~= nil then
        return v
    end
    if sub(name, 1, 5) == "http_" then
        return req_api.field(st, gsub(lower(sub(name, 6)), "_", "-"))
    elseif sub(name, 1, 4) == "arg_" then
        return codec.arg_raw(req_api.args(st), sub(name, 5))
    elseif sub(name, 1, 7) == "cookie_" then
        local all = req_api.field(st, "cookie")
        if not all then
            return nil
        end
        local want = sub(name, 8)
        for pair in all:gmatch("[^;]+") do
            local k, v2 = pair:match("^%s*([^=]-)%s*=%s*(.-)%s*$")
            if k == want then
                return v2
            end
        end
        return nil
    elseif sub(name, 1, 10) == "sent_http_" then
        local v2 = require("moonserve.ngx.output").header[sub(name, 11)]
        return type(v2) == "table" and table.concat(v2, ", ") or v2
    end
    return nil
end

local WRITABLE = { args = true, query_string = true }

local function assign(st, name, value)
    if value ~= nil and type(value) ~= "string" and type(value) ~= "number" then
        error("bad variable value (string, number or nil expected, got " .. type(value) .. ")", 3)
    end
    if WRITABLE[name] then
        st.args = value ~= nil and tostring(value) or ""
        return
    end
    if builtin[name] or find(name, "^http_") or find(name, "^arg_") or find(name, "^cookie_")
            or find(name, "^sent_http_") then
        error("variable \"" .. name .. "\" not changeable", 3)
    end
    st.vars = st.vars or {}
    st.vars[name] = value ~= nil and tostring(value) or nil
end

_M.var = setmetatable({}, {
    __index = function(_, name)
        if type(name) ~= "string" then
            error("bad variable name (string expected, got " .. type(name) .. ")", 2)
        end
        return lookup(request_state(2), lower(name))
    end,
    __newindex = function(_, name, value)
        if type(name) ~= "string" then
            error("bad variable name (string expected, got " .. type(name) .. ")", 2)
        end
        assign(request_state(2), lower(name), value)
    end,
    __tostring = function()
        return "ngx.var"
    end,
})

return _M
