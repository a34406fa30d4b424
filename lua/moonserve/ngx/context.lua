-- moonserve/ngx/context.lua: which request, timer or hook the running code belongs to, and
-- the ngx layer's state for it. The dispatcher knows what runs (a handler and the coroutines
-- it resumes, a light thread, a timer's run, a hook) and hands out one table per context
-- (dispatcher.context); the state lives there, so a coroutine made by user code inside a
-- handler, and the handler's light threads, see the handler's request.
local byte, find, format, gsub, tostring, type = string.byte, string.find, string.format,
    string.gsub, tostring, type

local _M = {}

local dispatcher -- loaded at the first look-up: an app file's top level needs no core
local context

-- The top level: no request, timer or hook runs (an app file's top level, in the master and
-- again in each worker). OpenResty's init phase.
local main = { kind = "main", phase = "init" }
_M.main = main

-- The phase a hook runs in, by its name.
local HOOK_PHASE = { on_worker_start = "init_worker", on_worker_stop = "exit_worker" }

-- Called with a request's new state, to set it up (its reply: moonserve.ngx.output). One
-- function that calls each in turn, not a loop: a loop where a request's trace runs through
-- is not compiled into it.
local function on_request() end

function _M.on_request(fn)
    local before = on_request
    on_request = function(st)
        before(st)
        fn(st)
    end
end

-- The running context's state: a table with `kind` ("request", "timer", "hook" or "main")
-- and `phase` (OpenResty's name for it); a request's also has `req` and `res`.
function _M.state()
    if not context then
        dispatcher = require "moonserve.host.core.dispatcher"
        context = dispatcher.context
    end
    local frame, kind, what = context()
    if frame == nil then
        if kind == "request" then
            error("the request of this light thread has ended", 3)
        end
        return main
    end
    local st = frame.ngx
    if st then
        return st
    end
    if kind == "request" then
        -- Made with the keys every request's state takes (false until set; a key made nil in
        -- a constructor is not kept): a key added later costs a search for a free slot, and
        -- past the table's size a rehash.
        st = { kind = kind, phase = "content", req = frame.req, res = frame.res, frame = frame,
            nb = 0, size = 0, start = 0, head = false, eof = false, out = false, buf = false }
        frame.ngx = st
        on_request(st)
    else
        st = { kind = kind, phase = kind == "timer" and "timer" or HOOK_PHASE[what] or "init_worker" }
        frame.ngx = st
    end
    return st
end

-- The running request's state; raises as OpenResty does where no request runs.
function _M.request(level)
    local st = _M.state()
    if st.kind ~= "request" then
        local where = st.kind == "timer" and "ngx.timer" or st.phase .. "_by_lua*"
        error("API disabled in the context of " .. where, (level or 2) + 1)
    end
    return st
end

-- The phases after the reply's head is made (moonserve/ngx/phases.lua): there, as in
-- OpenResty, what writes the reply or waits is disabled.
local LATE = { header_filter = true, body_filter = true, log = true }
_M.LATE = LATE

-- Raises OpenResty's error for an API the phase of `st` disables.
function _M.disabled(st, level)
    error("API disabled in the context of " .. st.phase .. "_by_lua*", (level or 2) + 1)
end

-- The running request's state for an API that writes the reply (ngx.say, print, flush, eof,
-- send_headers, redirect): raises where the phase disables it.
function _M.output(level)
    local st = _M.request((level or 2) + 1)
    if LATE[st.phase] then
        _M.disabled(st, (level or 2) + 1)
    end
    return st
end

-- For an API that waits or makes what waits (ngx.sleep, sockets, light threads, captures):
-- raises where the running phase disables it; elsewhere nothing (its own checks follow).
function _M.check_yield(level)
    local st = _M.state()
    if LATE[st.phase] then
        _M.disabled(st, (level or 2) + 1)
    end
end

-- -- Strings that become protocol text --------------------------------------------------

-- lua-nginx-module's escapes for the fields ngx.header and ngx.req.set_header set (its
-- ngx_http_lua_copy_escaped_header): in a value, the control bytes but the tab, and DEL, as
-- %XX; in a name, also the space, the separators (RFC 9110 5.6.2) and the bytes from 0x80.
-- What a handler set is then one field with a token for a name wherever it is written as
-- text: the reply's head, a subrequest, ngx.req.raw_header.
local VALUE_ESC = "[%z\1-\8\10-\31\127]"
local NAME_ESC = "[%z\1-\32\"(),/:;<=>?@%[\\%]{}\127-\255]"

local function pct(c)
    return format("%%%02X", byte(c))
end

-- `s` with each byte of `set` (a pattern's character class) as %XX: the one percent-encoder
-- of the ngx layer (fields, subrequests, ngx.escape_uri). `s` itself when it has none.
local function escaped(s, set)
    if find(s, set) then
        return (gsub(s, set, pct))
    end
    return s
end
_M.percent_encode = escaped

function _M.field_name(name)
    return escaped(name, NAME_ESC)
end

-- A field's value as ngx.header and ngx.req.set_header take it: a string, a list of strings
-- (a table; its items made strings), or nil for nil or an empty table (the field goes);
-- escaped as above.
function _M.field_value(value)
    if type(value) == "table" then
        if #value == 0 then
            return nil
        end
        local v = {}
        for i = 1, #value do
            v[i] = escaped(tostring(value[i]), VALUE_ESC)
        end
        return v
    elseif value ~= nil then
        return escaped(tostring(value), VALUE_ESC)
    end
end

-- The bytes nginx calls unsafe in a URI that ngx.req.set_uri or ngx.redirect takes (its
-- ngx_http_lua_check_unsafe_uri_bytes): the control bytes but the tab, and DEL, as a field
-- value's escapes.
local UNSAFE_URI = VALUE_ESC
-- How nginx shows such a string in the error (ngx_http_lua_escape_log): controls, '"', '\',
-- DEL and the bytes from 0x80 as \xHH.
local LOG_ESC = "[%z\1-\31\"\\\127-\255]"

local function log_byte(c)
    return format("\\x%02X", byte(c))
end

-- Raises nginx's error for the first byte of `s` in `set` (UNSAFE_URI when nil), if any:
-- `unsafe byte "0x0d" in ` .. `what`, where a %s in `what` stands for `s` as nginx's error
-- shows it. `level` as error()'s, seen from the caller.
function _M.check_unsafe(s, what, level, set)
    local at = find(s, set or UNSAFE_URI)
    if at then
        local shown = gsub(s, LOG_ESC, log_byte)
        error(format("unsafe byte \"0x%02x\" in " .. what, byte(s, at), shown), level + 1)
    end
end

return _M
