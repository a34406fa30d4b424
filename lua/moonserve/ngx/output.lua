-- moonserve/ngx/output.lua: the reply as OpenResty writes it: ngx.say, print, flush, eof,
-- exit, redirect, send_headers, ngx.header, ngx.status and ngx.headers_sent, on the request's
-- own reply (res), so that ngx.say after res:write appends to the same stream.
--
-- The head is the ngx layer's until the first output: ngx.header keeps the fields, readable
-- and replaceable, and applies them to the reply when the head is sent (the first ngx.say,
-- ngx.print, ngx.send_headers or ngx.flush, or a res:send/res:write of the handler's own);
-- after that a change is refused with OpenResty's log line. What is printed is held and sent
-- as one body with its length when the handler returns, unless it grows past BUF_MAX or the
-- handler flushes: then the reply streams (chunked on HTTP/1.1) from there on.
local context = require "moonserve.ngx.context"
local log = require "moonserve.log"

local concat, lower, gsub = table.concat, string.lower, string.gsub
local type, tostring, pairs, error, select, floor = type, tostring, pairs, error, select,
    math.floor
local request_state, output_state = context.request, context.output

local _M = {}

local BUF_MAX = 65536 -- printed bytes held before the reply starts streaming
local null                 -- ngx.null (cjson.null, a NULL light userdata)

local C -- the core's FFI namespace, once a reply needs it
local function core()
    C = C or require("moonserve.host.core.base").C
    return C
end

-- -- ngx.header ---------------------------------------------------------------------------

-- Field names as OpenResty matches them: case-insensitive, "_" for "-".
local keys, nkeys = {}, 0
local function key_of(name)
    local k = keys[name]
    if k == nil then
        k = gsub(lower(name), "_", "-")
        if nkeys < 1024 then -- names in code are few; names from data are not kept
            nkeys = nkeys + 1
            keys[name] = k
        end
    end
    return k
end

-- Framing fields are the core's to write: kept for reading, never applied.
local FRAMING = { ["content-length"] = true, ["transfer-encoding"] = true,
    ["connection"] = true, ["keep-alive"] = true }

-- Applies ngx.header's fields to the reply: the head is sent (or about to be).
local function freeze(st)
    if st.head then
        return
    end
    st.head = true
    local hkeys = st.hkeys
    if hkeys then
        local res, vals, names = st.res, st.hvals, st.hnames
        for i = 1, #hkeys do
            local k = hkeys[i]
            local v = vals[k]
            if v ~= nil and not FRAMING[k] then
                res:header(names[k], v)
            end
        end
    end
end

local function set_header(st, name, value)
    if type(name) ~= "string" then
        error("bad argument #2 to 'ngx.header' (string expected, got " .. type(name) .. ")", 3)
    end
    if st.head or st.res:sent() then
        log.error("attempt to set ngx.header.", name, " after sending out response headers")
        return
    end
    local k = key_of(name)
    local v = context.field_value(value) -- (a CR or LF escaped, as lua-nginx-module does)
    local vals = st.hvals
    if not vals then
        vals = {}
        st.hvals, st.hnames, st.hkeys = vals, {}, {}
    end
    if vals[k] == nil and v ~= nil and not st.hnames[k] then
        st.hkeys[#st.hkeys + 1] = k
        st.hnames[k] = context.field_name((gsub(name, "_", "-")))
    end
    vals[k] = v
end

local function get_header(st, name)
    if type(name) ~= "string" then
        return nil
    end
    local vals = st.hvals
    local v = vals and vals[key_of(name)]
    if type(v) == "table" then
        local copy = {}
        for i = 1, #v do
            copy[i] = v[i]
        end
        return copy
    end
    return v
end

-- ngx.header: one object whose fields are the running request's.
_M.header = setmetatable({}, {
    __index = function(_, name)
        return get_header(request_state(2), name)
    end,
    __newindex = function(_, name, value)
        set_header(request_state(2), name, value)
    end,
    __tostring = function()
        return "ngx.header"
    end,
})

-- The fields ngx.header holds, as { name = value } (ngx.resp.get_headers).
function _M.get_headers(st)
    local t = {}
    for _, k in ipairs(st.hkeys or {}) do
        local v = st.hvals[k]
        if v ~= nil then
            t[k] = v
        end
    end
    return t
end

-- For the header filter (moonserve/ngx/phases.lua): ngx.header becomes the reply's fields as
-- they stand (`list`: name, value, name, value... in order), open to change again ...
function _M.reopen(st, list)
    local vals, names, hkeys = {}, {}, {}
    for i = 1, #list, 2 do
        local name, v = list[i], list[i + 1]
        local k = key_of(name)
        local old = vals[k]
        if old == nil then
            hkeys[#hkeys + 1] = k
            names[k] = name
            vals[k] = v
        elseif type(old) == "table" then
            old[#old + 1] = v
        else
            vals[k] = { old, v }
        end
    end
    st.hvals, st.hnames, st.hkeys = vals, names, hkeys
    st.head = false
end

-- ... and the field lines it holds once the filter is done (framing fields left out).
function _M.lines(st)
    local out, n = {}, 0
    local vals, names = st.hvals, st.hnames
    for _, k in ipairs(st.hkeys or {}) do
        local v = vals[k]
        if v ~= nil and not FRAMING[k] then
            if type(v) ~= "table" then
                v = { v }
            end
            for i = 1, #v do
                n = n + 1
                out[n] = names[k] .. ": " .. v[i] .. "\r\n"
            end
        end
    end
    return concat(out, "", 1, n)
end

-- -- Status and whether the head is out -----------------------------------------------------

function _M.get_status(st)
    if st.status then -- the log phase's copy (moonserve/ngx/phases.lua)
        return st.status
    end
    local r = st.res.r
    return r and r.status or 0
end

function _M.set_status(st, code)
    if st.head or st.res:sent() then
        log.error("attempt to set ngx.status after sending out response headers")
        return
    end
    local n = tonumber(code)
    if not n then
        error("bad argument to 'ngx.status' (number expected, got " .. type(code) .. ")", 3)
    end
    st.res:status(n)
end

function _M.headers_sent(st)
    return st.head == true or st.res:sent()
end

-- -- A 101: the connection switches protocols -----------------------------------------------

-- With ngx.status 101 on HTTP/1.x, sending the head (ngx.send_headers, ngx.flush, the first
-- output) takes the connection over as resty.websocket.server expects: the 101 goes with
-- ngx.header's fields, and the bytes both ways are ngx.req.socket(true)'s from then on.
-- Returns true when the connection was taken (now or before), nil and an error when it
-- could not be, false when this is no 101.
local function upgrade(st)
    if st.raw ~= nil then
        return st.raw and true or nil, "failed to switch protocols"
    end
    local res = st.res
    if not res.r or res.r.status ~= 101 or st.req.http_version == 2 or res:sent()
            or st.nb > 0 then
        return false
    end
    freeze(st)
    st.eof = true -- nothing more goes as a reply: the handler's return ends the connection
    return require("moonserve.ngx.reqsock").upgrade(st)
end
_M.upgrade = upgrade

-- -- What is printed ------------------------------------------------------------------------


local put

-- Appends an array table's items to out (OpenResty: nil, booleans and ngx.null print as
-- words; a key that is not 1..n raises).
local function put_table(out, n, t, i, fname)
    local max = 0
    for k in pairs(t) do
        if type(k) ~= "number" or k < 1 or k ~= floor(k) then
            error("bad argument #" .. i .. " to '" .. fname .. "' (non-array table found)", 4)
        end
        if k > max then
            max = k
        end
    end
    for j = 1, max do
        local v = t[j]
        local tv = type(v)
        if tv == "table" then
            n = put_table(out, n, v, i, fname)
        elseif tv == "function" or tv == "thread" or tv == "cdata"
                or (tv == "userdata" and v ~= null) then
            error("bad argument #" .. i .. " to '" .. fname .. "' (bad data type " .. tv
                .. " found)", 4)
        else
            n = put(out, n, v, i, fname)
        end
    end
    return n
end

function put(out, n, v, i, fname)
    local tv = type(v)
    n = n + 1
    if tv == "string" then
        out[n] = v
    elseif tv == "number" then
        out[n] = tostring(v) -- as lua-nginx-module 0.10.23: 1e15 prints as 1e+15
    elseif tv == "nil" then
        out[n] = "nil"
    elseif tv == "boolean" then
        out[n] = v and "true" or "false"
    elseif tv == "table" then
        return put_table(out, n - 1, v, i, fname)
    elseif v == null then
        out[n] = "null"
    else
        error("bad argument #" .. i .. " to '" .. fname .. "' (string, number, boolean, nil, "
            .. "ngx.null, or array table expected, but got " .. tv .. ")", 4)
    end
    return n
end

-- The text of print's arguments (with a newline for say).
local function text(fname, newline, ...)
    local nargs = select("#", ...)
    if nargs == 1 and type((...)) == "string" then
        return newline and (...) .. "\n" or (...)
    end
    local out, n = {}, 0
    for i = 1, nargs do
        n = put(out, n, (select(i, ...)), i, fname)
    end
    if newline then
        n = n + 1
        out[n] = "\n"
    end
    return concat(out, "", 1, n)
end
_M.text = text

local OUTPUT_ERROR = "nginx output filter error"

-- What is printed and held, as one string. st.buf is the one piece itself while there is one
-- (the common handler prints once: no list, no join), a list of st.nb pieces after that.
local function held(st)
    local nb = st.nb
    if nb == 0 then
        return ""
    elseif nb == 1 then
        return st.buf
    end
    return concat(st.buf, "", 1, nb)
end

-- Sends what is held and switches the reply to streaming.
local function push(st)
    local s = held(st)
    st.nb, st.size, st.buf = 0, 0, nil -- taken before the write: the head hook sees it empty
    st.out = true
    local ok = st.res:write(s)
    if not ok then
        return nil, OUTPUT_ERROR
    end
    return 1
end

local function emit(st, s)
    if st.raw == nil and not st.eof then
        local up, err = upgrade(st)
        if up == nil then
            return nil, err
        end
    end
    if st.raw then
        -- After a 101, what is printed goes to the connection as it is, until the handler
        -- takes the raw socket.
        if st.raw_taken then
            return nil, "raw request socket acquired"
        end
        local ok, err = st.raw:send(s)
        if not ok then
            return nil, err
        end
        return 1
    end
    if st.eof then
        return nil, "seen eof"
    end
    freeze(st)
    if s == "" then
        return 1
    end
    if st.out or st.res:sent() then
        st.out = true
        if not st.res:write(s) then
            return nil, OUTPUT_ERROR
        end
        return 1
    end
    local nb = st.nb + 1
    if nb == 1 then
        st.buf = s
    else
        local buf = st.buf
        if nb == 2 then
            buf = { buf }
            st.buf = buf
        end
        buf[nb] = s
    end
    st.nb = nb
    st.size = st.size + #s
    if st.size >= BUF_MAX then
        return push(st)
    end
    return 1
end

-- (The text is made first: a trace that starts inside output_state and returns here must
-- not meet the vararg, which LuaJIT cannot compile there, "NYI: bytecode 71".)
function _M.print(...)
    local s = text("print", false, ...)
    return emit(output_state(2), s)
end

function _M.say(...)
    local s = text("say", true, ...)
    return emit(output_state(2), s)
end

function _M.send_headers()
    local st = output_state(2)
    local up, err = upgrade(st)
    if up == nil then
        return nil, err
    end
    freeze(st)
    return 1
end

function _M.flush(wait)
    local st = output_state(2)
    if wait ~= nil and type(wait) ~= "boolean" then
        error("bad argument #1 to 'flush' (boolean expected, got " .. type(wait) .. ")", 2)
    end
    if st.raw == nil and not st.eof then
        local up, err = upgrade(st)
        if up == nil then
            return nil, err
        end
    end
    if st.raw then
        return 1 -- the 101 went when it was sent; the raw socket's bytes go as it sends them
    end
    if st.eof then
        return nil, "seen eof"
    end
    if not st.head or (st.nb == 0 and not st.out and not wait) then
        return nil, "nothing to flush"
    end
    if st.nb > 0 or not st.out then
        local ok, err = push(st)
        if not ok then
            return nil, err
        end
    end
    if wait then
        local ok = st.res:flush()
        if not ok then
            return nil, "client aborted"
        end
    end
    return 1
end

-- Ends the reply: what is held goes out (as one body with its length, if nothing streamed).
local function finish(st)
    if st.eof then
        return
    end
    st.eof = true
    freeze(st)
    local res = st.res
    if not res.r then
        return
    end
    if st.out then
        if st.nb > 0 then
            push(st)
        end
        res:_close()
    elseif not res:sent() then
        local s = held(st)
        st.nb, st.buf = 0, nil
        res:send(s)
    end
end
_M.finish = finish

function _M.eof(...)
    if select("#", ...) ~= 0 then
        error("no argument is expected", 2)
    end
    local st = output_state(2)
    if st.eof then
        return nil, "seen eof"
    end
    finish(st)
    return 1
end

-- -- Ending the handler ---------------------------------------------------------------------

local OK, ERROR, AGAIN, DONE = 0, -1, -2, -4
local dispatcher

local function leave()
    dispatcher = dispatcher or require "moonserve.host.core.dispatcher"
    dispatcher.exit()
end

-- The app's error page for `status` (app:error_page, else its default), with ngx.header's
-- fields; what was printed and held is dropped, as nginx drops it for a special response.
local function error_page(st, status)
    st.nb, st.size, st.buf = 0, 0, nil
    freeze(st)
    st.eof = true
    local req, res = st.req, st.res
    local app = rawget(req, "_app")
    if st.sub then
        res:status(status):send("") -- nginx makes no error page for a subrequest
    elseif app then
        app:error(req, res, { status = status })
    else
        res:status(status):send(status .. " Error\n")
    end
end

function _M.exit(status)
    local code = tonumber(status)
    if type(status) ~= "number" or not code or code ~= floor(code) then
        error("bad argument #1 to 'exit' (number expected, got " .. type(status) .. ")", 2)
    end
    if code == AGAIN or code == DONE then
        error("bad argument to 'ngx.exit': does not accept NGX_AGAIN or NGX_DONE", 2)
    end
    local st = context.state()
    if st.kind ~= "request" then
        error("ngx.exit: not supported in a " .. (st.kind == "main" and "module's top level"
            or st.kind) .. " (return from the function instead)", 2)
    end
    local phase = st.phase
    if phase == "body_filter" or phase == "log" then
        context.disabled(st, 2)
    elseif phase == "header_filter" then
        -- ends the filter; a status of 300 or more replaces the reply (moonserve/ngx/phases)
        st.filter_exit = code
        leave()
    elseif phase == "access" and code == OK then
        leave() -- ends the access phase: the request goes on (unless it printed)
    end
    local sent = st.head or st.res:sent()
    if code == ERROR or code == 444 then
        st.eof = true
        core().ms_ffi_req_fail(st.res.r) -- nginx closes the connection: so do we
    elseif code >= 300 and not sent then
        error_page(st, code)
    else
        if code >= 200 and not sent then
            st.res:status(code)
        end
        finish(st)
    end
    leave()
end

local REDIRECTS = { [301] = true, [302] = true, [303] = true, [307] = true, [308] = true }

function _M.redirect(uri, status)
    if type(uri) ~= "string" then
        error("bad argument #1 to 'redirect' (string expected, got " .. type(uri) .. ")", 2)
    end
    status = status or 302
    if not REDIRECTS[status] then
        error("only ngx.HTTP_MOVED_TEMPORARILY, ngx.HTTP_MOVED_PERMANENTLY, "
            .. "ngx.HTTP_PERMANENT_REDIRECT, ngx.HTTP_SEE_OTHER, and "
            .. "ngx.HTTP_TEMPORARY_REDIRECT are allowed", 2)
    end
    local st = output_state(2)
    if st.head or st.res:sent() then
        error("attempt to call ngx.redirect after sending out the headers", 2)
    end
    context.check_unsafe(uri, "redirect uri \"%s\"", 2)
    st.nb, st.buf = 0, nil
    freeze(st)
    st.eof = true
    st.res:redirect(uri, status)
    leave()
end

-- -- The request's reply, set up when the request's state is made ----------------------------

-- res:send or res:write of the handler's own: ngx.header's fields go first, then what was
-- printed and held, so the stream stays in order.
local function before_send(res)
    local st = rawget(res, "_ngx")
    if not st.head then
        freeze(st)
    end
    if st.nb > 0 then
        push(st)
    end
end

-- The handler returned: returned (it gave `return status, body` values), threads (light
-- threads still run, and may print).
local function returned(frame, values, threads)
    local st = frame.ngx
    if st.eof or not st.res.r then
        return
    end
    if values then
        if st.nb > 0 or st.out then
            error("the handler returned values after printing with ngx.say or ngx.print: "
                .. "return nothing, or answer with one of the two", 0)
        end
        freeze(st)
        return
    end
    if threads then
        if st.nb > 0 or st.head then
            push(st) -- the threads may print more: stream, and the core ends the reply
        end
        return
    end
    if st.head or st.nb > 0 or st.hkeys then
        finish(st)
    end
end

context.on_request(function(st)
    rawset(st.res, "_ngx", st)
    st.res:before_send(before_send)
    st.frame.returned = returned
end)

function _M.init(ngx_null)
    null = ngx_null
end

_M.OK, _M.ERROR, _M.AGAIN, _M.DONE = OK, ERROR, AGAIN, DONE

return _M
