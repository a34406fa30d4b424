--- moonserve/host/core/websocket.lua: WebSocket endpoints (RFC 6455 over HTTP/1.1, RFC 8441 over HTTP/2)
-- on the core's framing (core/tunnel/ws.c): the opening handshake, the socket a handler gets, and
-- broadcast. A socket's waits park the running code on its slot, as moonserve.socket's do.
--
-- `WebSocket`: The socket a WebSocket handler gets (app:websocket(path, function(ws, req) ...
--   end)).
-- @module moonserve.websocket
local ffi = require "ffi"
local base = require "moonserve.host.core.base"
local coro = require "moonserve.host.core.coroutine"
local dispatcher = require "moonserve.host.core.dispatcher"
local security = require "moonserve.security"

local C = base.C
local ffi_str = ffi.string
local anchors = base.anchors
local waiter, park, owner_now = dispatcher.waiter, dispatcher.park, dispatcher.owner
local find, gmatch, lower, format = string.find, string.gmatch, string.lower, string.format
local type, pairs, tostring, setmetatable = type, pairs, tostring, setmetatable
local min, max, floor = math.min, math.max, math.floor
local new_tab = base.new_tab

ffi.cdef [[
typedef struct ms_ws_s ms_ws_t;
typedef struct ms_ffi_ws_msg_s { const char *data; size_t len; int32_t op, code; } ms_ffi_ws_msg_t;
int ms_ffi_ws_accept_key(const char *key, size_t len, char *out);
ms_ws_t *ms_ffi_ws_accept(ms_req_view_t *r, double max_message, double max_frame,
    double send_queue, double ping, double pong, double idle, double close, int control,
    int deflate_bits, int deflate_keep, int inflate_bits, int *err);
void ms_ffi_ws_free(ms_ws_t *ws);
int ms_ffi_ws_outlives(ms_ws_t *ws);
void ms_ffi_ws_set_home(ms_ws_t *ws, int32_t slot);
int32_t ms_ffi_ws_home(ms_ws_t *ws);
int ms_ffi_ws_anchor_drain(ms_ws_t *ws, int32_t *out, int n);
int ms_ffi_ws_receive(ms_ws_t *ws, ms_ffi_ws_msg_t *m);
void ms_ffi_ws_wait(ms_ws_t *ws, int32_t slot);
int ms_ffi_ws_send(ms_ws_t *ws, int op, const char *p, size_t len);
int ms_ffi_ws_send_frame(ms_ws_t *ws, const char *frame, size_t len);
int ms_ffi_ws_frame_head(char *out, int op, double len);
int ms_ffi_ws_close(ms_ws_t *ws, int code, const char *reason, size_t len);
int ms_ffi_ws_closed(ms_ws_t *ws);
int ms_ffi_ws_utf8_ok(const char *p, size_t n);
int ms_ffi_ws_close_code_ok(int code);
]]

local TEXT, BINARY, CLOSE, PING, PONG = 1, 2, 8, 9, 10
local GOT, PENDING = 1, 0
local KIND = { [TEXT] = "text", [BINARY] = "binary", [CLOSE] = "close", [PING] = "ping",
    [PONG] = "pong" }

local msg = ffi.new("ms_ffi_ws_msg_t")   -- reused; never held across a yield
local err_out = ffi.new("int[1]")
local accept_buf = ffi.new("char[32]")
local head_buf = ffi.new("char[10]")
local released = ffi.new("int32_t[256]")

-- Lets go of the strings whose writes are done on the server of the socket `g`
-- (response.drain's, with no request).
local function drain(g)
    local n = C.ms_ffi_ws_anchor_drain(g, released, 256)
    while n > 0 do
        for i = 0, n - 1 do
            anchors[released[i]] = nil
        end
        if n < 256 then
            return
        end
        n = C.ms_ffi_ws_anchor_drain(g, released, 256)
    end
end

local _M = {}

-- -- Options ------------------------------------------------------------------------------

local DEFAULTS = {
    max_message_bytes = 1048576, -- 1 MiB
    max_frame_bytes = nil,       -- the message cap
    send_queue_bytes = 4194304,  -- 4 MiB
    ping_interval = 30,          -- seconds without a frame from the peer before a ping
    pong_timeout = 10,           -- seconds the peer has to answer it
    idle_timeout = 0,            -- seconds without a message: closed (1001); 0 never
    close_timeout = 5,           -- seconds the peer has to answer our close
}
local KNOWN = { protocols = true, origins = true, same_site = true, control_frames = true,
    deflate = true }
for k in pairs(DEFAULTS) do
    KNOWN[k] = true
end

-- opts.deflate: true (the default: without context takeover), false, or a table
-- { context_takeover = bool, window_bits = 9..15, mem_level = 1..9 }. Returns the endpoint's
-- permessage-deflate settings, or false.
local DEFLATE = { context_takeover = false, window_bits = 15, mem_level = 8 }
local DEFLATE_RANGE = { window_bits = { 9, 15 }, mem_level = { 1, 9 } }

local function deflate_opt(v, path, level)
    if v == nil or v == true then
        return DEFLATE
    elseif v == false then
        return false
    elseif type(v) ~= "table" then
        error("bad deflate for websocket " .. path .. " (boolean or table expected)", level)
    end
    local cfg = {}
    for k in pairs(v) do
        if DEFLATE[k] == nil then
            error(format("unknown deflate option %s for websocket %s", tostring(k), path), level)
        end
    end
    for k, default in pairs(DEFLATE) do
        local x = v[k]
        if x == nil then
            x = default
        elseif type(default) == "boolean" then
            if type(x) ~= "boolean" then
                error(format("bad deflate.%s for websocket %s (boolean expected)", k, path), level)
            end
        else
            local r = DEFLATE_RANGE[k]
            if type(x) ~= "number" or x ~= floor(x) or x < r[1] or x > r[2] then
                error(format("bad deflate.%s for websocket %s (integer from %d to %d expected)",
                    k, path, r[1], r[2]), level)
            end
        end
        cfg[k] = x
    end
    return cfg
end

local function number_opt(opts, k, path, level)
    local v = opts[k]
    if v == nil then
        v = DEFAULTS[k]
    end
    if v ~= nil and (type(v) ~= "number" or v < 0) then
        error(format("bad %s for websocket %s (non-negative number expected)", k, path), level)
    end
    return v
end

--- The endpoint's options, checked once, when the route is added. Misuse raises at the
-- caller of `level`.
-- @local
function _M.compile(opts, path, level)
    level = (level or 1) + 1
    opts = opts or {}
    if type(opts) ~= "table" then
        error("bad options for websocket " .. path .. " (table expected)", level)
    end
    for k in pairs(opts) do
        if not KNOWN[k] then
            error("unknown websocket option " .. tostring(k) .. " for " .. path, level)
        end
    end
    local o = {}
    for k in pairs(DEFAULTS) do
        o[k] = number_opt(opts, k, path, level + 1)
    end
    o.max_frame_bytes = o.max_frame_bytes or o.max_message_bytes
    local protocols = opts.protocols or {}
    if type(protocols) ~= "table" then
        error("bad protocols for websocket " .. path .. " (list of names expected)", level)
    end
    o.protocols = {}
    for i, p in ipairs(protocols) do
        if type(p) ~= "string" or not find(p, "^[!#$%%&'*+%-.^_`|~%w]+$") then
            error("bad protocol " .. tostring(p) .. " for websocket " .. path, level)
        end
        o.protocols[i] = p
    end
    local origins = opts.origins or {}
    if type(origins) ~= "table" then
        error("bad origins for websocket " .. path .. " (list of origins expected)", level)
    end
    -- Cross-site WebSocket hijacking: the origin rule of unsafe requests (moonserve.security),
    -- with the endpoint's own list of origins allowed besides the site's.
    o.origin_check = security.compile({ csrf = { origins = origins,
        same_site = opts.same_site == true } }).csrf
    o.control = opts.control_frames == true
    o.deflate = deflate_opt(opts.deflate, path, level + 1)
    return o
end

-- -- The socket ---------------------------------------------------------------------------

local WebSocket = { protocol = "", extensions = "" }
WebSocket.__index = WebSocket
local open, callback_loop -- (the callbacks' way, below)

-- The core's socket, or nil when it is closed for good.
local function handle(self)
    local g = self._g
    if not g then
        return nil
    end
    return g
end

--- The next message: data, kind ("text", "binary"; "ping" and "pong" when the endpoint asked
-- for them), or for the peer's close (or ours, after a protocol error) reason, "close",
-- code. nil, "closed" once nothing more can come; nil, "timeout" after `timeout` seconds
-- (nil: no limit) with the socket still open.
-- @usage local data, kind, code = ws:receive()
-- if not data or kind == "close" then return end
function WebSocket:receive(timeout)
    if timeout ~= nil and (type(timeout) ~= "number" or timeout < 0) then
        error("bad timeout (non-negative number expected)", 2)
    end
    local g = handle(self)
    if not g then
        return nil, "closed"
    end
    if C.ms_ffi_ws_home(g) >= 0 then
        error("ws:receive: this socket's messages go to its message callback", 2)
    end
    while true do
        local rc = C.ms_ffi_ws_receive(g, msg)
        if rc == GOT then
            local op = msg.op
            local data = ffi_str(msg.data, msg.len)
            if op == CLOSE then
                return data, "close", msg.code
            end
            return data, KIND[op]
        elseif rc ~= PENDING then
            return nil, "closed"
        end
        coro.check("ws:receive", "wait", 2)
        local w = waiter("ws:receive")
        C.ms_ffi_ws_wait(g, w.slot)
        local ok = park(w, timeout)
        g = handle(self)
        if not g then
            return nil, "closed"
        end
        C.ms_ffi_ws_wait(g, -1)
        if not ok then
            return nil, "timeout"
        end
    end
end

local function send(self, op, data)
    local g = handle(self)
    if not g then
        return nil, "closed"
    end
    local rc = C.ms_ffi_ws_send(g, op, data, #data)
    if rc > 0 then
        anchors[rc - 1] = data -- the core writes from this string: keep it alive until then
        drain(g)
        return true
    elseif rc < 0 then
        return nil, rc == base.ETOOBIG and "send queue full" or "closed"
    end
    return true
end

--- Sends a message: text (the default) or, with kind "binary", binary. true, or nil and
-- "closed" (closed or closing), "send queue full" (the peer does not read: it was closed
-- with 1008), "not UTF-8" (text must be).
function WebSocket:send(data, kind)
    if type(data) ~= "string" then
        error("bad data (string expected)", 2)
    end
    local op = TEXT
    if kind == "binary" then
        op = BINARY
    elseif kind ~= nil and kind ~= "text" then
        error("bad kind (\"text\" or \"binary\" expected)", 2)
    end
    if op == TEXT and C.ms_ffi_ws_utf8_ok(data, #data) == 0 then
        return nil, "not UTF-8"
    end
    return send(self, op, data)
end

--- Sends a ping (at most 125 bytes); the pong comes to receive() when the endpoint asked for
-- control frames, and counts as the peer's life either way.
function WebSocket:ping(data)
    data = data or ""
    if type(data) ~= "string" or #data > 125 then
        error("bad ping data (string of at most 125 bytes expected)", 2)
    end
    return send(self, PING, data)
end

--- Starts the close handshake: code (default 1000) and reason (at most 123 bytes, UTF-8).
-- The peer's answer comes to receive() as "close"; returning from the handler is enough.
function WebSocket:close(code, reason)
    code = code or 1000
    reason = reason or ""
    if type(code) ~= "number" or C.ms_ffi_ws_close_code_ok(code) == 0 then
        error("bad close code " .. tostring(code), 2)
    end
    if type(reason) ~= "string" or C.ms_ffi_ws_utf8_ok(reason, #reason) == 0 then
        error("bad close reason (UTF-8 string expected)", 2)
    end
    local g = handle(self)
    if not g then
        return nil, "closed"
    end
    if C.ms_ffi_ws_close(g, code, reason, #reason) < 0 then
        return nil, "closed"
    end
    return true
end

--- Whether a close was sent or received, or the connection went.
function WebSocket:closed()
    local g = handle(self)
    return not g or C.ms_ffi_ws_closed(g) ~= 0
end

-- The request is ending: the core's socket goes (a close 1000 goes first if none did).
function WebSocket:_release(code)
    local g = self._g
    if g then
        self._g = false
        if code and C.ms_ffi_ws_closed(g) == 0 then -- (1011: its handler was stopped)
            C.ms_ffi_ws_close(g, code, "", 0)
        end
        drain(g)
        C.ms_ffi_ws_free(g)
    end
end

-- -- Broadcast ----------------------------------------------------------------------------

--- Whether `s` is UTF-8 as a text message must be.
function _M.utf8_ok(s)
    return C.ms_ffi_ws_utf8_ok(s, #s) ~= 0
end

--- Sends `data` (text, or with kind "binary" binary) to every socket of `list`: the frame is
-- built once and every recipient's write references that one string. Returns how many
-- took it; sockets that are closed, or whose send queue is full (closed with 1008), are
-- skipped.
-- @usage moonserve.websocket.broadcast(room, "hello, all")
function _M.broadcast(list, data, kind)
    if type(list) ~= "table" then
        error("bad list (table of websockets expected)", 2)
    end
    if type(data) ~= "string" then
        error("bad data (string expected)", 2)
    end
    local op = kind == "binary" and BINARY or TEXT
    if op == TEXT and C.ms_ffi_ws_utf8_ok(data, #data) == 0 then
        return nil, "not UTF-8"
    end
    local frame = ffi_str(head_buf, C.ms_ffi_ws_frame_head(head_buf, op, #data)) .. data
    local n, last = 0, nil
    for _, ws in pairs(list) do
        local g = getmetatable(ws) == WebSocket and handle(ws)
        if g then
            local rc = C.ms_ffi_ws_send_frame(g, frame, #frame)
            if rc > 0 then
                anchors[rc - 1] = frame
                n, last = n + 1, g
            end
        end
    end
    if last then
        drain(last)
    end
    return n
end

-- -- The opening handshake ----------------------------------------------------------------

-- Whether the comma-separated list field `v` holds `token`, in any case.
local function has_token(v, token)
    if not v then
        return false
    end
    for item in gmatch(v, "[^,]+") do
        if lower((item:gsub("^%s+", ""):gsub("%s+$", ""))) == token then
            return true
        end
    end
    return false
end

-- The first of the endpoint's protocols the client offered, or nil.
local function choose_protocol(offered, mine)
    if not offered or #mine == 0 then
        return nil
    end
    local set = {}
    for item in gmatch(offered, "[^,%s]+") do
        set[item] = true
    end
    for _, p in ipairs(mine) do
        if set[p] then
            return p
        end
    end
    return nil
end

local function trim(s)
    return (s:gsub("^%s+", ""):gsub("%s+$", ""))
end

-- permessage-deflate (RFC 7692): one offer of Sec-WebSocket-Extensions, against the endpoint's
-- `cfg` (opts.deflate). Without context takeover (the default) we answer
-- server_no_context_takeover and client_no_context_takeover, so that no socket keeps zlib
-- state between messages; with it, each side keeps its context unless the client asked that
-- it not, and the client's window is held to cfg.window_bits when it lets us say so. Returns
-- the response's extension, our window bits, whether we keep our context, and the window of
-- the client's context we keep (0: none); or nil.
local function deflate_offer(offer, cfg)
    local params, name = {}, nil
    for item in gmatch(offer, "[^;]+") do
        item = trim(item)
        if not name then
            name = lower(item)
            if name ~= "permessage-deflate" then
                return nil
            end
        else
            local k, v = item:match("^([%w_]+)%s*=%s*\"?([^\"]*)\"?$")
            k = lower(k or item)
            if params[k] ~= nil then
                return nil -- a parameter twice: the offer is refused (RFC 7692 7)
            end
            params[k] = v or true
        end
    end
    local bits, client_bits = cfg.window_bits, nil
    for k, v in pairs(params) do
        if k == "server_max_window_bits" then
            local n = tonumber(v)
            -- zlib cannot deflate with a window of 256 bytes: an offer that asks for one
            -- is declined
            if not n or n < 9 or n > 15 or not find(v, "^%d+$") then
                return nil
            end
            bits = min(bits, n)
        elseif k == "client_max_window_bits" then
            if v == true then
                client_bits = 15
            elseif find(v, "^%d+$") and tonumber(v) >= 8 and tonumber(v) <= 15 then
                client_bits = tonumber(v)
            else
                return nil
            end
        elseif k ~= "server_no_context_takeover" and k ~= "client_no_context_takeover" then
            return nil
        end
    end
    local keep_ours = cfg.context_takeover and not params.server_no_context_takeover
    local keep_theirs = cfg.context_takeover and not params.client_no_context_takeover
    local answer = "permessage-deflate"
    if not keep_ours then
        answer = answer .. "; server_no_context_takeover"
    end
    if not keep_theirs then
        answer = answer .. "; client_no_context_takeover"
    end
    if params.server_max_window_bits then
        answer = answer .. "; server_max_window_bits=" .. bits
    end
    local inflate_bits = 0
    if keep_theirs then
        -- The client's window is 15 bits unless it offered to take a smaller one from us.
        inflate_bits = 15
        if client_bits then
            inflate_bits = min(client_bits, cfg.window_bits)
            if inflate_bits < 15 then
                answer = answer .. "; client_max_window_bits=" .. inflate_bits
            end
            inflate_bits = max(inflate_bits, 9) -- (a window of 2^9 inflates one of 2^8)
        end
    end
    return answer, bits, keep_ours, inflate_bits
end

local function negotiate_deflate(field, cfg)
    if not field then
        return nil
    end
    for offer in gmatch(field, "[^,]+") do
        local answer, bits, keep_ours, inflate_bits = deflate_offer(offer, cfg)
        if answer then
            return answer, bits, keep_ours, inflate_bits
        end
    end
    return nil
end

-- What a handler's `req` keeps of the request after an upgrade on HTTP/1.1 besides what it
-- read before it first waited.
local KEPT = { "method", "path", "target", "query_string", "http_version" }

-- The handler on its socket, which goes when the handler's owner ends (the request, or the
-- task the handler runs in). An error closes the socket with 1011.
local function run(ws, req, fn)
    dispatcher.adopt(owner_now("websocket"), ws)
    local ok, err = xpcall(fn, debug.traceback, ws, req)
    if not ok then
        base.log(base.LOG_ERR, "websocket handler for " .. req.path .. ": " .. tostring(err))
        local g = handle(ws)
        if g and C.ms_ffi_ws_closed(g) == 0 then
            C.ms_ffi_ws_close(g, 1011, "", 0)
        end
    end
end

-- -- Callbacks: a socket that parks no coroutine ------------------------------------------
-- app:websocket(path, { open = fn(ws, req), message = fn(ws, data, kind),
-- close = fn(ws, code, reason) }): between messages such a socket holds no coroutine, only
-- its `ws` table (two fields) and a slot (HTTP/1.1), which the core keeps (ms_ffi_ws_home).
-- Each wake runs the callbacks in a task of its own, which may wait; messages that come
-- meanwhile wait in the core, in order.

-- By a socket's slot: its endpoint's callbacks (an array: a few bytes a socket).
local callbacks_of = {}
-- The sockets whose callbacks run now (in a task): a wake then is theirs to take.
local busy = {}

-- Calls cb[name](ws, ...) under xpcall; false when it raised (logged, the socket closed 1011).
local function call(ws, cb, name, ...)
    local f = cb[name]
    if not f then
        return true
    end
    local ok, err = xpcall(f, debug.traceback, ws, ...)
    if not ok then
        base.log(base.LOG_ERR, "websocket " .. name .. " callback: " .. tostring(err))
        local g = handle(ws)
        if g and C.ms_ffi_ws_closed(g) == 0 then
            C.ms_ffi_ws_close(g, 1011, "", 0)
        end
    end
    return ok
end

-- The socket is over: close(ws, code, reason) once, then the core's socket and the slot go.
local function ended(ws, slot, code, reason)
    local cb = callbacks_of[slot]
    callbacks_of[slot] = nil
    C.ms_ffi_ws_set_home(ws._g, -1)
    dispatcher.slot_drop(slot)
    call(ws, cb, "close", code or 1006, reason or "")
    ws:_release()
end

-- Hands what the core has queued to message(), until nothing is; then waits on the slot.
local function pump(ws, slot)
    local cb = callbacks_of[slot]
    while true do
        local g = handle(ws)
        if not g then
            return
        end
        local rc = C.ms_ffi_ws_receive(g, msg)
        if rc == GOT then
            local op = msg.op
            local data = ffi_str(msg.data, msg.len)
            if op == CLOSE then
                return ended(ws, slot, msg.code, data)
            end
            call(ws, cb, "message", data, KIND[op])
        elseif rc == PENDING then
            C.ms_ffi_ws_wait(g, slot)
            return
        else
            return ended(ws, slot)
        end
    end
end

local function pump_task(ws, slot)
    pump(ws, slot)
    busy[ws] = nil
end

-- The core woke the socket's slot: a task takes the messages, unless one is at it already.
function WebSocket:_wake()
    local g = self._g
    if busy[self] or not g then
        return
    end
    busy[self] = true
    dispatcher.detach("websocket message", pump_task, self, C.ms_ffi_ws_home(g))
end

-- HTTP/1.1: open(ws, req) in the task the upgrade started, then the messages.
function open(ws, req, cb)
    local slot = dispatcher.slot_for(ws)
    callbacks_of[slot] = cb
    C.ms_ffi_ws_set_home(ws._g, slot)
    busy[ws] = true
    if call(ws, cb, "open", req) then
        pump(ws, slot)
    else
        ended(ws, slot)
    end
    busy[ws] = nil
end

-- HTTP/2: the same callbacks from the request's coroutine.
function callback_loop(ws, req, cb)
    if not call(ws, cb, "open", req) then
        return
    end
    while true do
        local data, kind, code = ws:receive()
        if not data then
            return call(ws, cb, "close", 1006, "")
        elseif kind == "close" then
            return call(ws, cb, "close", code, data)
        end
        call(ws, cb, "message", data, kind)
    end
end

local function refuse(res, status, text)
    return res:status(status):send(text)
end

--- Answers the upgrade and runs `fn(ws, req)` on the socket; or refuses the request.
-- @local
function _M.serve(req, res, fn, o)
    local r = req.r
    local h2 = req.method == "CONNECT"
    if h2 then
        if req:header(":protocol") ~= "websocket" then
            return refuse(res, 400, "Bad Request: not a WebSocket CONNECT\n")
        end
    elseif req.method ~= "GET" or not has_token(req:header("upgrade"), "websocket")
        or not has_token(req:header("connection"), "upgrade") then
        res:header("upgrade", "websocket")
        res:header("sec-websocket-version", "13")
        return refuse(res, 426, "Upgrade Required: this is a WebSocket endpoint\n")
    end
    if req:header("sec-websocket-version") ~= "13" then
        res:header("sec-websocket-version", "13")
        return refuse(res, 426, "Upgrade Required: WebSocket version 13\n")
    end
    local accept
    if not h2 then
        local key = req:header("sec-websocket-key") or ""
        local n = C.ms_ffi_ws_accept_key(key, #key, accept_buf)
        if n < 0 then
            return refuse(res, 400, "Bad Request: bad Sec-WebSocket-Key\n")
        end
        accept = ffi_str(accept_buf, n)
    end
    local ok, why = security.same_origin(req, o.origin_check)
    if not ok then
        security.log_refusal(req.method, req.path, why)
        return refuse(res, 403, "Forbidden: cross-origin WebSocket\n")
    end
    local protocol = choose_protocol(req:header("sec-websocket-protocol"), o.protocols)
    if not h2 then
        res:header("upgrade", "websocket")
        res:header("sec-websocket-accept", accept)
    end
    if protocol then
        res:header("sec-websocket-protocol", protocol)
    end
    local extensions, bits, keep_ours, inflate_bits
    if o.deflate then
        extensions, bits, keep_ours, inflate_bits =
            negotiate_deflate(req:header("sec-websocket-extensions"), o.deflate)
        if extensions then
            res:header("sec-websocket-extensions", extensions)
        end
    end
    local g = C.ms_ffi_ws_accept(r, o.max_message_bytes, o.max_frame_bytes, o.send_queue_bytes,
        o.ping_interval, o.pong_timeout, o.idle_timeout, o.close_timeout, o.control and 1 or 0,
        extensions and bits or 0, extensions and keep_ours and o.deflate.mem_level or 0,
        extensions and inflate_bits or 0, err_out)
    if g == nil then
        if err_out[0] == base.EBUSY then
            res:_reset()
            res:header("retry-after", "1")
            return refuse(res, 503, "Service Unavailable: too many WebSockets\n")
        end
        return nil
    end
    -- (protocol and extensions are the class's "" unless agreed: an idle socket's table is
    -- as small as it can be)
    local ws = new_tab(0, 2)
    ws._g = g
    if protocol then
        ws.protocol = protocol
    end
    if extensions then
        ws.extensions = extensions
    end
    setmetatable(ws, WebSocket)
    local callbacks = type(fn) == "table" and fn
    if C.ms_ffi_ws_outlives(g) ~= 0 then
        -- HTTP/1.1: the socket outlives its request. The handler runs in a task of its own
        -- and the request finishes once it first waits, when the socket takes the connection
        -- over and the request's head goes back to the core. What the handler read of `req`
        -- until then stays, and so do these (interned strings: they cost the socket nothing).
        for i = 1, #KEPT do
            local _ = req[KEPT[i]] -- (read into the request's table)
        end
        rawset(req, "_upgraded", true)
        if callbacks then
            dispatcher.detach("websocket open for " .. req.path, open, ws, req, callbacks)
        else
            dispatcher.detach("websocket handler for " .. req.path, run, ws, req, fn)
        end
        return nil
    end
    if callbacks then
        -- HTTP/2: the request lives as long as its stream, so its coroutine waits with it.
        return run(ws, req, function(s, q)
            return callback_loop(s, q, callbacks)
        end)
    end
    run(ws, req, fn)
    return nil
end

_M.WebSocket = WebSocket
return _M
