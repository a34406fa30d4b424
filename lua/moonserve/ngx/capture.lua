-- moonserve/ngx/capture.lua: ngx.location.capture and capture_multi, subrequests through the
-- app's own router in this process: each is an HTTP/1.1 request fed to the engine over an
-- in-process connection (no socket), served as any request is (sites, middleware, routes,
-- static mounts), and its reply read back. The parent waits; the subrequests of one
-- capture_multi run side by side, so handlers that wait (on sockets, timers) overlap.
--
-- A subrequest knows its parent by the tag of its connection (ms_ffi_req_memtag): it gets
-- the parent's request fields, Host and connection (ngx.var.remote_addr...), the options'
-- ctx and variables; it skips the access and log phases, as nginx's do.
local ffi = require "ffi"
local context = require "moonserve.ngx.context"
local codec = require "moonserve.ngx.codec"
local req_api = require "moonserve.ngx.req"
local dispatcher = require "moonserve.host.core.dispatcher"
local base = require "moonserve.host.core.base"

local C = base.C
local add_value = require("moonserve.codec").add_value
local concat, find, sub, lower, gsub, format, tonumber, tostring, type, pairs, error,
    ipairs = table.concat, string.find, string.sub, string.lower, string.gsub, string.format,
    tonumber, tostring, type, pairs, error, ipairs

if not pcall(function() return C.ms_ffi_req_memtag end) then
    ffi.cdef [[ uint32_t ms_ffi_req_memtag(ms_req_view_t *r); ]]
end

local _M = {}

local MAX_DEPTH = 50 -- nginx's subrequest limit (NGX_HTTP_MAX_SUBREQUESTS)

-- ngx.HTTP_GET ... by number, as nginx's methods.
local METHODS = { [2] = "GET", [4] = "HEAD", [8] = "POST", [16] = "PUT", [32] = "DELETE",
    [64] = "MKCOL", [128] = "COPY", [256] = "MOVE", [512] = "OPTIONS", [1024] = "PROPFIND",
    [2048] = "PROPPATCH", [4096] = "LOCK", [8192] = "UNLOCK", [16384] = "PATCH",
    [32768] = "TRACE" }

-- The parent's fields a subrequest does not get: those that frame the parent's own message.
local NOT_INHERITED = { host = true, ["content-length"] = true, ["transfer-encoding"] = true,
    connection = true, ["keep-alive"] = true, te = true, upgrade = true, expect = true,
    trailer = true, ["http2-settings"] = true }

-- The fields of a subrequest's reply res.header leaves out: the connection's, which nginx's
-- subrequests never have.
local NOT_SHOWN = { date = true, server = true, connection = true, ["keep-alive"] = true,
    ["transfer-encoding"] = true }

local live = {}      -- the subrequests under way, by tag
local nlive = 0
local last_tag = 0

local function next_tag()
    repeat
        last_tag = last_tag % 0xfffffffe + 1
    until live[last_tag] == nil
    return last_tag
end

-- -- The subrequest's side ------------------------------------------------------------------

-- A request's ngx state is made: if it is a subrequest, it learns its parent and options.
context.on_request(function(st)
    if nlive == 0 then -- (no request asks the core for its tag while none can have one)
        return
    end
    local r = st.req.r
    local tag = r and C.ms_ffi_req_memtag(r) or 0
    if tag == 0 then
        return
    end
    local rec = live[tag]
    if not rec then
        return
    end
    local parent = rec.parent
    st.sub, st.parent = rec, parent
    if rec.ctx then
        st.ctx = rec.ctx
    end
    if rec.share then
        parent.vars = parent.vars or {}
        st.vars = parent.vars
    elseif rec.copy and parent.vars then
        local vars = {}
        for k, v in pairs(parent.vars) do
            vars[k] = v
        end
        st.vars = vars
    end
    if rec.vars then
        st.vars = st.vars or {}
        for k, v in pairs(rec.vars) do
            st.vars[lower(k)] = tostring(v)
        end
    end
end)

-- -- The reply, read back -------------------------------------------------------------------

-- res.header: a plain table, whose names are also found in any case and with "_" for "-".
local function header_table()
    local names = {}
    return setmetatable({}, {
        __index = function(t, k)
            if type(k) ~= "string" then
                return nil
            end
            local real = names[gsub(lower(k), "_", "-")]
            return real and rawget(t, real) or nil
        end,
        __newindex = function(t, k, v)
            if type(k) == "string" then
                names[gsub(lower(k), "_", "-")] = k
            end
            rawset(t, k, v)
        end,
    })
end

-- A chunked body: the data, and whether it ended (the last chunk came).
local function dechunk(s, pos)
    local parts = {}
    while true do
        local size, data = s:match("^(%x+)[^\r\n]*\r\n()", pos)
        size = tonumber(size, 16)
        if not size then
            return concat(parts), false
        elseif size == 0 then
            return concat(parts), true
        end
        if #s < data + size - 1 then
            parts[#parts + 1] = sub(s, data)
            return concat(parts), false
        end
        parts[#parts + 1] = sub(s, data, data + size - 1)
        pos = data + size + 2
    end
end

-- OpenResty's result from what the engine wrote: status, header, body, truncated.
local function result(raw, head_only)
    local res = { status = 500, header = header_table(), body = "", truncated = false }
    local hend = find(raw, "\r\n\r\n", 1, true)
    -- interim replies (100 Continue) come before the one that counts
    while hend and find(raw, "^HTTP/1%.%d 1%d%d") do
        raw = sub(raw, hend + 4)
        hend = find(raw, "\r\n\r\n", 1, true)
    end
    if not hend then
        res.truncated = true
        return res
    end
    res.status = tonumber(raw:match("^HTTP/1%.%d (%d%d%d)")) or 500
    local length, chunked
    for name, value in sub(raw, 1, hend + 1):gmatch("\r\n([^:\r\n]+):[ \t]*([^\r\n]*)") do
        local k = lower(name)
        if k == "content-length" then
            length = tonumber(value)
        elseif k == "transfer-encoding" then
            chunked = find(lower(value), "chunked", 1, true) ~= nil
        end
        if not NOT_SHOWN[k] then
            add_value(res.header, name, value)
        end
    end
    local status = res.status
    if head_only or status == 204 or status == 304 then
        return res
    end
    local body = sub(raw, hend + 4)
    if chunked then
        local whole
        res.body, whole = dechunk(body, 1)
        res.truncated = not whole
    elseif length then
        res.body = sub(body, 1, length)
        res.truncated = #body < length
    else
        res.body = body
    end
    return res
end

-- -- The parent's side ----------------------------------------------------------------------

-- A subrequest goes to the engine as HTTP/1.1 text, so what it carries must stay data there.
-- A control byte or DEL in its URI or string args raises, as nginx's unsafe URI check does: a
-- CR or LF would end the line, and the rest of the string would be fields, or a second
-- request, of the caller's choosing. A space and the bytes from 0x80, which nginx takes as
-- data, are sent percent-encoded, which the subrequest's parser decodes back.
local CONTROL = "[%z\1-\31\127]"
local TO_ENCODE = "[ \128-\255]"
local percent_encode = context.percent_encode
-- A field of the subrequest: a name that is a token (RFC 9110 5.6.2), a value without CR, LF
-- or NUL. The parent's fields are such (its parser's, or escaped by ngx.req.set_header);
-- this holds it where they become text.
local TOKEN = "^[%w!#$%%&'*+%-.^_`|~]+$"
local NOT_VALUE = "[%z\r\n]"

local function bad(i, what, fname)
    error("bad argument #" .. i .. " to '" .. fname .. "' (" .. what .. ")", 4)
end

-- The request a capture sends, as bytes, and what the subrequest learns of it.
local function prepare(st, uri, opts, fname, i)
    if type(uri) ~= "string" then
        bad(i, "string expected, got " .. type(uri), fname)
    elseif sub(uri, 1, 1) ~= "/" or find(uri, CONTROL) or find(uri, "#", 1, true) then
        bad(i, "a URI that starts with / and has no control characters expected", fname)
    end
    uri = percent_encode(uri, TO_ENCODE)
    if opts ~= nil and type(opts) ~= "table" then
        bad(i + 1, "table expected, got " .. type(opts), fname)
    end
    opts = opts or {}
    local method = "GET"
    if opts.method ~= nil then
        method = METHODS[opts.method]
        if not method then
            error("unsupported HTTP method: " .. tostring(opts.method), 3)
        end
    end
    local args = opts.args
    if type(args) == "table" then
        args = codec.encode_args(args)
    elseif args ~= nil and type(args) ~= "string" then
        error("Bad args option value", 3)
    elseif args then
        context.check_unsafe(args, "args: a request line cannot hold it (escape it with "
            .. "ngx.escape_uri, or give args as a table)", 3, CONTROL)
        args = percent_encode(args, TO_ENCODE)
    end
    if args and args ~= "" then
        uri = uri .. (find(uri, "?", 1, true) and "&" or "?") .. args
    end
    local body = opts.body
    if body ~= nil and type(body) ~= "string" then
        error("Bad http request body", 3)
    end
    if body == nil and (opts.always_forward_body or method == "POST" or method == "PUT") then
        body = rawget(st.req, "_body") -- the parent's, if it read it
    end
    if opts.ctx ~= nil and type(opts.ctx) ~= "table" then
        error("Bad ctx option value type " .. type(opts.ctx) .. ", expected a Lua table", 3)
    end
    if opts.vars ~= nil and type(opts.vars) ~= "table" then
        error("Bad vars option value", 3)
    end
    local host = req_api.field(st, "host") or "localhost"
    local lines = { method .. " " .. uri .. " HTTP/1.1", "Host: " .. host }
    local broken = find(host, NOT_VALUE) and "Host"
    req_api.each_field(st, function(name, value)
        if not NOT_INHERITED[lower(name)] then
            if not find(name, TOKEN) or find(value, NOT_VALUE) then
                broken = broken or name
            end
            lines[#lines + 1] = name .. ": " .. value
        end
    end)
    if broken then
        error(format("the request field %q cannot go to a subrequest: its name is not a token "
            .. "or its value holds CR, LF or NUL", broken), 3)
    end
    if body and body ~= "" then
        lines[#lines + 1] = "Content-Length: " .. #body
    end
    lines[#lines + 1] = "Connection: close"
    local depth = (st.sub and st.sub.depth or 0) + 1
    if depth > MAX_DEPTH then
        error(format("subrequests cycle while processing \"%s\"", uri), 3)
    end
    return { parent = st, raw = concat(lines, "\r\n") .. "\r\n\r\n" .. (body or ""),
        head_only = method == "HEAD", ctx = opts.ctx, vars = opts.vars,
        share = opts.share_all_vars and true or false,
        copy = opts.copy_all_vars and true or false, depth = depth }
end

-- What a capture waits for: its subrequests, and whether the parent is still there to hear
-- of them (the request's end lets go of it: _release).
local Batch = {}
Batch.__index = Batch

function Batch:_release()
    self.gone = true
end

-- A subrequest's connection ended: its reply is whole (or cut off).
local function done(rec, batch)
    local conn = rec.conn
    rec.out[#rec.out + 1] = (conn:take())
    conn:close()
    rec.conn = nil
    live[rec.tag] = nil
    nlive = nlive - 1
    rec.res = result(concat(rec.out), rec.head_only)
    batch.left = batch.left - 1
    if batch.left == 0 and not batch.gone then
        dispatcher.wake(batch.w)
    end
end

-- From the loop: each subrequest's connection, and its request fed to the engine.
local function start(batch)
    for _, rec in ipairs(batch.recs) do
        rec.tag = next_tag()
        live[rec.tag] = rec
        nlive = nlive + 1
        local slot = dispatcher.on_wake("ngx.location.capture", function()
            done(rec, batch)
        end)
        rec.conn = dispatcher.memconn(rec.tag, slot)
        rec.out = { (rec.conn:feed(rec.raw)) }
    end
end

local function run(recs, fname)
    local w = dispatcher.waiter(fname)
    local batch = setmetatable({ recs = recs, left = #recs, w = w }, Batch)
    dispatcher.adopt(dispatcher.owner(fname, 3), batch)
    dispatcher.soon(fname, function()
        start(batch)
    end)
    dispatcher.park(w)
    local out = {}
    for i, rec in ipairs(recs) do
        out[i] = rec.res
    end
    return out
end

local function parent_state()
    local st = context.request(3)
    if context.LATE[st.phase] then
        context.disabled(st, 3)
    end
    return st
end

-- ngx.location.capture_multi({ { uri, opts }, ... }): the results, in order.
function _M.capture_multi(list)
    local st = parent_state()
    if type(list) ~= "table" then
        error("only one argument is expected, but got " .. type(list), 2)
    end
    local recs = {}
    for i, item in ipairs(list) do
        if type(item) ~= "table" then
            error("the argument #" .. i .. " is not a table, but a " .. type(item), 2)
        end
        recs[i] = prepare(st, item[1], item[2], "capture_multi", 1)
    end
    if #recs == 0 then
        error("at least one subrequest should be specified", 2)
    end
    return unpack(run(recs, "ngx.location.capture_multi"))
end

-- ngx.location.capture(uri, opts): { status, header, body, truncated }.
function _M.capture(uri, opts)
    local st = parent_state()
    local rec = prepare(st, uri, opts, "capture", 1)
    return run({ rec }, "ngx.location.capture")[1]
end

return _M
