-- moonserve/ngx/reqsock.lua: ngx.req.socket() and ngx.req.socket(true), as lua-nginx-module
-- 0.10.23 has them. Without `true`, the request body as a read-only cosocket (HTTP/1.1, a
-- Content-Length body); with it, the connection's raw bytes both ways once the handler has
-- sent a 101 (core/tunnel/rawsock.c, on the request's tunnel), which is what resty.websocket.server
-- reads and writes its frames on. Both read through one buffer of their own here: receive
-- (a size, "*l", "*a"), receiveany, receiveuntil (with the core's pattern matcher,
-- core/base/match.c, the one outbound sockets use), with OpenResty's results and errors.
local ffi = require "ffi"
local strbuf = require "string.buffer"
local base = require "moonserve.host.core.base"
local coro = require "moonserve.host.core.coroutine"
local dispatcher = require "moonserve.host.core.dispatcher"
local response = require "moonserve.host.core.response"

local C = base.C
local ffi_gc = ffi.gc
local find = string.find
local type, tostring, tonumber, error, setmetatable, floor = type, tostring, tonumber, error,
    setmetatable, math.floor
local anchors, drain = base.anchors, response.drain
local waiter, park = dispatcher.waiter, dispatcher.park
local EAGAIN, ECLOSED, EBUSY = base.EAGAIN, base.ECLOSED, base.EBUSY

ffi.cdef [[
typedef struct ms_raw_s ms_raw_t;
ms_raw_t *ms_ffi_raw_accept(ms_req_view_t *r, double send_queue, int *err);
void ms_ffi_raw_free(ms_raw_t *t);
int64_t ms_ffi_raw_peek(ms_raw_t *t, const char **p);
void ms_ffi_raw_consume(ms_raw_t *t, double n);
void ms_ffi_raw_wait(ms_raw_t *t, int32_t slot);
int ms_ffi_raw_send(ms_raw_t *t, ms_server_t *s, const char *p, size_t len);
int ms_ffi_raw_congested(ms_raw_t *t, ms_req_view_t *r);
int ms_ffi_req_wait_body_for(ms_req_view_t *r, double seconds);
double ms_ffi_raw_default_timeout(ms_server_t *s, int send);
double ms_ffi_raw_buffer_cap(ms_server_t *s);
typedef struct ms_match_s ms_match_t;
ms_match_t *ms_ffi_match_new(const char *p, size_t len, int inclusive);
void ms_ffi_match_free(ms_match_t *m);
void ms_ffi_match_reset(ms_match_t *m);
int ms_ffi_match_feed(ms_match_t *m, const char *p, size_t n, size_t size, double *out);
double ms_ffi_match_line(char *p, size_t n, double scanned, double *used);
]]

local ptr = ffi.new("const char *[1]") -- reused; never held across a yield
local err_out = ffi.new("int[1]")
local match_out = ffi.new("double[2]") -- reused; never held across a yield
local MATCH_MORE, MATCH_END = 0, 3 -- core/base/match.h

-- Bytes queued to the peer past which a raw socket's send fails and the connection is cut
-- (websocket.lua's send_queue_bytes default): a peer that does not read is not buffered
-- for without bound.
local SEND_QUEUE = 4194304

local _M = {}

-- -- Reading, common to both ------------------------------------------------------------------

local Reader = {}

-- The unread bytes wait in a string.buffer (appends amortised, consumed from the front), and
-- each line or pattern search starts where the last one stopped: a read is linear in the
-- bytes it holds, however they come in. `self.matcher` is the receiveuntil matcher whose
-- search state describes the unread bytes; any other read that consumes forgets it.

-- The bytes not yet handed out.
local function avail(self)
    return #self.buf
end

local function take(self, n)
    return self.buf:get(n)
end

-- A failed read: everything buffered goes out as the partial result. Once "closed" was
-- told, later reads say it without a partial, as lua-nginx-module does.
local function fail(self, err)
    self.matcher = nil
    if err == "closed" then
        if self.told_closed then
            return nil, "closed"
        end
        self.told_closed = true
    end
    return nil, err, self.buf:get()
end

-- More bytes into the buffer: true, or nil and "closed" / "timeout" / an error. `capped`:
-- a read whose size is the peer's to choose (a line, a pattern, "*a"), held to the raw
-- socket's raw_socket_buffer_bytes.
local function more(self, capped)
    local ok, err = self:_fill()
    if not ok then
        return nil, err
    end
    if capped and self.cap and #self.buf > self.cap then
        return nil, "too much data buffered (raw_socket_buffer_bytes)"
    end
    return true
end

-- A failed read past the cap: one log line, and the connection goes.
local function over(self, err)
    if err == "too much data buffered (raw_socket_buffer_bytes)" then
        require("moonserve.log").error("ngx.req.socket(true): a read held more than "
            .. "raw_socket_buffer_bytes (" .. self.cap .. "); connection closed")
        self.buf:reset()
        self.matcher = nil
        self:_release()
        self.told_closed = true
        return nil, err
    end
    return fail(self, err)
end

-- "*l": the core's line reader (core/base/match.c) drops the line's CRs in the buffer itself.
local function receive_line(self)
    local scanned = 0
    while true do
        local p, n = self.buf:ref()
        local len = C.ms_ffi_match_line(p, n, scanned, match_out)
        if len >= 0 then
            local line = self.buf:get(len)
            self.buf:skip(match_out[0] - len)
            return line
        end
        scanned = match_out[0]
        local ok, err = more(self, true)
        if not ok then
            return over(self, err)
        end
    end
end

function Reader:receive(pattern)
    self:_check("receive")
    self.matcher = nil
    if self.told_closed then
        return nil, "closed"
    end
    if pattern == nil or pattern == "*l" then
        return receive_line(self)
    elseif pattern == "*a" then
        while true do
            local ok, err = more(self, true)
            if not ok then
                if err == "closed" then
                    return self.buf:get()
                end
                return over(self, err)
            end
        end
    end
    local n = tonumber(pattern)
    if not n then
        error("bad argument #1 to 'receive' (bad pattern argument: " .. tostring(pattern) .. ")",
            2)
    elseif n < 0 then
        error("bad argument #1 to 'receive' (bad pattern argument)", 2)
    end
    n = floor(n)
    while avail(self) < n do
        local ok, err = more(self)
        if not ok then
            return fail(self, err)
        end
    end
    return take(self, n)
end

function Reader:receiveany(max)
    self:_check("receiveany")
    self.matcher = nil
    max = tonumber(max)
    if not max or max < 1 then
        error("bad argument #1 to 'receiveany' (bad max argument)", 2)
    end
    if self.told_closed then
        return nil, "closed"
    end
    if avail(self) == 0 then
        local ok, err = more(self)
        if not ok then
            return fail(self, err)
        end
    end
    return take(self, floor(max) < avail(self) and floor(max) or avail(self))
end

-- An iterator reading up to `pattern`: each call returns the data before the next
-- occurrence (consumed with it); with a size, pieces of `size` bytes while that many come
-- before the pattern, then the rest before it ("" when the pattern comes next), then nil
-- on the call after it, as lua-nginx-module. opts.inclusive: the pattern ends the data.
-- The core's matcher (core/base/match.c) decides, handed the buffer's unread bytes in place.
function Reader:receiveuntil(pattern, opts)
    self:_check("receiveuntil")
    if type(pattern) ~= "string" or pattern == "" then
        error("bad argument #1 to 'receiveuntil' (pattern is empty)", 2)
    end
    local inclusive = type(opts) == "table" and opts.inclusive == true
    local m = ffi_gc(C.ms_ffi_match_new(pattern, #pattern, inclusive and 1 or 0),
        C.ms_ffi_match_free)
    return function(size)
        self:_check("receiveuntil")
        if size ~= nil then
            size = tonumber(size)
            if not size or size < 1 then
                error("bad argument #1 to the receiveuntil iterator (bad size)", 2)
            end
            size = floor(size)
        end
        if self.matcher ~= m then -- another read consumed since this one searched
            C.ms_ffi_match_reset(m)
            self.matcher = m
        end
        local buf = self.buf
        local p, n = buf:ref()
        local rc = C.ms_ffi_match_feed(m, p, n, size or 0, match_out)
        -- (The loop is entered only to wait: a caller's loop over pieces stays one trace.)
        while rc == MATCH_MORE do
            if self.told_closed then
                return nil, "closed"
            end
            local ok, err = more(self, not size)
            if not ok then
                return over(self, err)
            end
            p, n = buf:ref()
            rc = C.ms_ffi_match_feed(m, p, n, size or 0, match_out)
        end
        if rc == MATCH_END then
            return nil, nil, nil
        end
        local len, used = match_out[0], match_out[1]
        local data = buf:get(len)
        if used > len then
            buf:skip(used - len)
        end
        return data
    end
end

-- settimeout(ms): every later wait's limit (nil or 0: socket_read_timeout, as OpenResty's
-- lua_socket_read_timeout). settimeouts(connect, send, read) sets the send and read ones.
local function ms_arg(ms, i, fname)
    if ms == nil then
        return nil
    end
    ms = tonumber(ms)
    if not ms or ms < 0 then
        error("bad argument #" .. i .. " to '" .. fname .. "' (bad timeout value)", 3)
    end
    return ms > 0 and ms / 1000 or nil
end

function Reader:settimeout(ms)
    self:_check("settimeout")
    local s = ms_arg(ms, 1, "settimeout")
    self.read_timeout = s or self.default_read
    self.send_timeout = s or self.default_send
end

function Reader:settimeouts(connect, send, read)
    self:_check("settimeouts")
    ms_arg(connect, 1, "settimeouts")
    self.send_timeout = ms_arg(send, 2, "settimeouts") or self.default_send
    self.read_timeout = ms_arg(read, 3, "settimeouts") or self.default_read
end

local function new_class(name)
    local class = { __index = {}, __tostring = function() return name end }
    for k, v in pairs(Reader) do
        class.__index[k] = v
    end
    return class
end

-- -- The request body ---------------------------------------------------------------------

local Body = new_class("ngx.req.socket")

function Body.__index:_check(what)
    if getmetatable(self) ~= Body then
        error("bad argument #1 to '" .. what .. "' (the request socket expected)", 3)
    end
end

-- The next piece of the body, waiting for it up to the read timeout.
function Body.__index:_fill()
    local req = self.req
    local r = req.r
    if not r then
        return nil, "closed"
    end
    -- Pieces middleware read and handed back (req:_unread: moonserve.csrf looking for a
    -- multipart _csrf field) come first: the request's own _read gives them out.
    local handed = rawget(req, "_read")
    if handed then
        local piece = handed(req)
        if piece then
            self.buf:put(piece)
            return true
        end
    end
    local waited = false
    while true do
        local n = C.ms_ffi_req_body_take(r, ptr)
        if n > 0 then
            self.buf:putcdata(ptr[0], n)
            return true
        elseif n == 0 then
            return nil, "closed"
        elseif n ~= EAGAIN then
            if n == ECLOSED then
                return nil, "closed"
            end
            return nil, (base.fail(tonumber(n)))
        elseif waited then
            return nil, "timeout"
        end
        coro.check_request("sock:receive", "wait", 4)
        local rc = C.ms_ffi_req_wait_body_for(r, self.read_timeout or 0)
        if rc < 0 then
            return nil, rc == ECLOSED and "closed" or (base.fail(rc))
        end
        coro.park()
        waited = true
    end
end

-- -- The raw connection -----------------------------------------------------------------------

local Raw = new_class("ngx.req.socket(true)")

function Raw.__index:_check(what)
    if getmetatable(self) ~= Raw then
        error("bad argument #1 to '" .. what .. "' (the raw request socket expected)", 3)
    end
end

function Raw.__index:_fill()
    while true do
        local t = self._t
        if not t then
            return nil, "closed"
        end
        local n = C.ms_ffi_raw_peek(t, ptr)
        if n > 0 then
            self.buf:putcdata(ptr[0], n)
            C.ms_ffi_raw_consume(t, tonumber(n))
            return true
        elseif n < 0 then
            return nil, "closed"
        end
        coro.check("sock:receive", "wait", 4)
        local w = waiter("sock:receive")
        C.ms_ffi_raw_wait(t, w.slot)
        local ok = park(w, self.read_timeout)
        t = self._t
        if not t then
            return nil, "closed"
        end
        C.ms_ffi_raw_wait(t, -1)
        if not ok then
            return nil, "timeout"
        end
    end
end

-- Data as tcpsock:send takes it: a string, a number, or an array of them (nested).
local function flatten(data, out)
    local t = type(data)
    if t == "string" then
        out[#out + 1] = data
    elseif t == "number" then
        out[#out + 1] = tostring(data)
    elseif t == "table" then
        for i = 1, #data do
            flatten(data[i], out)
        end
    else
        error("bad argument #1 to 'send' (string, number, or array table expected, got "
            .. t .. ")", 4)
    end
end

-- After a send: OpenResty's returns once the kernel has the bytes, so the handler waits
-- here while the connection is congested (a light thread, which cannot wait for the request,
-- goes on; the queue's cap bounds it). Returns true, or false once the connection is gone.
local function drained(self, t)
    local rc = C.ms_ffi_raw_congested(t, self._r)
    if rc == 0 then
        return true
    elseif rc < 0 then
        return false
    end
    local ok, kind = pcall(coro.check, "sock:send", "wait", 3)
    if not ok or kind == "task" then
        return true
    end
    if C.ms_ffi_req_wait_drain(self._r, 0) == 0 then
        coro.park()
    end
    t = self._t
    return t and C.ms_ffi_raw_congested(t, self._r) >= 0
end

-- Sends bytes to the peer: their count, or nil and "closed" (the connection is gone, or was
-- cut because the peer did not read what was queued).
function Raw.__index:send(data)
    self:_check("send")
    local s = data
    if type(s) ~= "string" then
        local parts = {}
        flatten(data, parts)
        s = table.concat(parts)
    end
    local t = self._t
    if not t then
        return nil, "closed"
    end
    if s == "" then
        return 0
    end
    local rc = C.ms_ffi_raw_send(t, self._srv, s, #s)
    if rc > 0 then
        anchors[rc - 1] = s -- the core writes from this string: keep it alive until then
        drain(self._r)
    elseif rc < 0 then
        return nil, "closed"
    end
    if not drained(self, t) then
        return nil, "closed"
    end
    return #s
end

-- The request is ending: the core's socket goes (the connection closes once what was queued
-- has gone).
function Raw.__index:_release()
    local t = self._t
    if t then
        self._t = false
        C.ms_ffi_raw_free(t)
        drain(self._r)
    end
end

-- -- Making them ------------------------------------------------------------------------------

local function defaults(self, srv)
    self.default_read = C.ms_ffi_raw_default_timeout(srv, 0)
    self.default_send = C.ms_ffi_raw_default_timeout(srv, 1)
    self.read_timeout, self.send_timeout = self.default_read, self.default_send
    return self
end

-- Takes the connection over after a 101 (the head goes now with ngx.header's fields), for
-- ngx.req.socket(true). Returns true, or nil and an error (over the `websockets` cap, the
-- reply is a 503).
function _M.upgrade(st)
    local req, res = st.req, st.res
    local r = req.r
    local t = C.ms_ffi_raw_accept(r, SEND_QUEUE, err_out)
    if t == nil then
        if err_out[0] == EBUSY then
            res:_reset()
            res:header("retry-after", "1")
            res:status(503):send("Service Unavailable: too many WebSockets\n")
            st.raw = false
            return nil, "too many WebSockets (the websockets limit)"
        end
        st.raw = false
        return nil, (base.fail(err_out[0]))
    end
    local srv = C.ms_ffi_req_server(r)
    local sock = defaults(setmetatable({ _t = t, _r = r, _srv = srv, buf = strbuf.new(),
        cap = C.ms_ffi_raw_buffer_cap(srv) }, Raw), srv)
    dispatcher.adopt(dispatcher.owner("ngx.req.socket"), sock)
    st.raw = sock
    return true
end

local function chunked(req)
    local te = req:header("transfer-encoding")
    return te ~= nil and find(te:lower(), "chunked", 1, true) ~= nil
end

-- ngx.req.socket([raw]) of the request of `st`.
function _M.socket(st, raw)
    local req = st.req
    if req.http_version == 2 then
        error("http v2 not supported yet", 0) -- (lua-nginx-module raises it without a place)
    end
    if raw then
        if st.raw_taken then
            return nil, "duplicate call"
        end
        if st.raw == nil then
            local output = require "moonserve.ngx.output"
            if output.get_status(st) ~= 101 or output.headers_sent(st) then
                return nil, "no 101 sent (moonserve's raw request socket is the connection "
                    .. "after ngx.status = 101 and ngx.send_headers())"
            end
            local ok, err = output.upgrade(st)
            if not ok then
                return nil, err
            end
        end
        if not st.raw then
            return nil, "failed to switch protocols"
        end
        st.raw_taken = true
        return st.raw
    end
    if chunked(req) then
        return nil, "chunked request bodies not supported yet"
    end
    if st.raw ~= nil or st.body_sock or st.body_read or rawget(req, "_body") ~= nil then
        return nil, "request body already exists"
    end
    local len = tonumber(req:header("content-length") or "")
    if not len or len <= 0 then
        return nil, "no body"
    end
    local sock = defaults(setmetatable({ req = req, buf = strbuf.new() }, Body),
        C.ms_ffi_req_server(req.r))
    st.body_sock = sock
    return sock
end

return _M
