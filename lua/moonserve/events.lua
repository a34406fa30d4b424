--- moonserve/events.lua: server-sent events (the WHATWG HTML standard, "Server-sent events"):
-- res:events(opts) starts a text/event-stream reply and returns a stream that frames events,
-- comments and heartbeats, and follows a channel (app:channel) with replay from its ring
-- since the client's Last-Event-ID.
--
-- `EventStream`: what res:events returns.
-- @module moonserve.events
local host = require "moonserve.host"

local type, tostring, error, pairs, tonumber = type, tostring, error, pairs, tonumber
local find, gsub, format, concat = string.find, string.gsub, string.format, table.concat
local min = math.min

local _M = {}

local DEFAULTS = { heartbeat = 15 }
local OPTIONS = { channel = true, replay = true, heartbeat = true, retry = true,
    event = true, last_event_id = true }

-- -- Framing ----------------------------------------------------------------------------

-- The lines of `data`: the standard splits on CRLF, LF and CR alike, so each becomes its own
-- "data:" line and the client joins them with LF.
local function data_lines(out, data)
    data = gsub(gsub(data, "\r\n", "\n"), "\r", "\n")
    local pos = 1
    while true do
        local nl = find(data, "\n", pos, true)
        out[#out + 1] = "data: " .. data:sub(pos, nl and nl - 1 or -1) .. "\n"
        if not nl then
            return
        end
        pos = nl + 1
    end
end

local function field(name, v)
    v = tostring(v)
    if find(v, "[\r\n]") then
        return nil, "bad " .. name .. " (no CR or LF allowed)"
    end
    if name == "id" and find(v, "\0", 1, true) then
        return nil, "bad id (no NUL allowed)" -- a client ignores such an id (the standard)
    end
    return v
end

--- One event as the bytes on the wire: `id:`, `event:`, `retry:` and one `data:` line per line
-- of `data`, then the blank line that dispatches it. Returns the text, or nil and why (an id
-- or event name with CR or LF, a retry that is not a whole number of milliseconds).
-- @tparam table ev { id =, event =, data =, retry = }
function _M.frame(ev)
    if type(ev) ~= "table" then
        return nil, "bad event (table expected)"
    end
    local out = {}
    if ev.id ~= nil then
        local v, err = field("id", ev.id)
        if not v then
            return nil, err
        end
        out[#out + 1] = "id: " .. v .. "\n"
    end
    if ev.event ~= nil then
        local v, err = field("event", ev.event)
        if not v then
            return nil, err
        end
        out[#out + 1] = "event: " .. v .. "\n"
    end
    if ev.retry ~= nil then
        local r = ev.retry
        if type(r) ~= "number" or r < 0 or r % 1 ~= 0 then
            return nil, "bad retry (whole milliseconds expected)"
        end
        out[#out + 1] = format("retry: %d\n", r)
    end
    local data = ev.data
    if data ~= nil then
        if type(data) ~= "string" and type(data) ~= "number" then
            return nil, "bad data (string expected, got " .. type(data) .. ")"
        end
        data_lines(out, tostring(data))
    elseif #out == 0 then
        return nil, "bad event (nothing to send)"
    end
    out[#out + 1] = "\n"
    return concat(out)
end

--- A comment (lines starting with ':'), which clients ignore: keeps proxies from closing an
-- idle connection.
function _M.comment_frame(text)
    text = text == nil and "" or tostring(text)
    local out = {}
    for line in (gsub(gsub(text, "\r\n", "\n"), "\r", "\n") .. "\n"):gmatch("([^\n]*)\n") do
        out[#out + 1] = line == "" and ":\n" or ": " .. line .. "\n"
    end
    out[#out + 1] = "\n"
    return concat(out)
end

-- -- The stream -------------------------------------------------------------------------

local EventStream = {}
EventStream.__index = EventStream

local function write(self, bytes)
    if self.closed then
        return nil, "gone"
    end
    local ok, err = self.res:write(bytes)
    if not ok then
        self.closed = true
        return nil, err or "gone"
    end
    self.next_beat = host.now() + self.heartbeat
    return true
end

--- Sends one event: { id =, event =, data =, retry = } (data with newlines becomes several
-- `data:` lines). Raises on an id or event name with CR or LF; returns true, or nil and an
-- error when the client has gone.
function EventStream:send(ev)
    local bytes, err = _M.frame(ev)
    if not bytes then
        error(err, 2)
    end
    if ev.id ~= nil then
        self.last_id = tostring(ev.id)
    end
    return write(self, bytes)
end

--- Sends a comment, which the client ignores. Returns true, or nil and an error.
function EventStream:comment(text)
    return write(self, _M.comment_frame(text))
end

--- Whether the client has gone (a write failed, or the core saw the connection close).
function EventStream:gone()
    local res = self.res
    if self.closed or res:gone() or (res._peer_eof and res:_peer_eof()) then
        self.closed = true
        return true
    end
    -- The server drains (a host that can tell): the stream ends, its reply whole, and the
    -- client reconnects elsewhere (with Last-Event-ID, so nothing is missed).
    if res._server_stopping and res:_server_stopping() then
        self.closed = true
        return true
    end
    return false
end

-- Sends channel messages with sequence numbers over `self.sent` (the replay's end), in order.
local function deliver(self, seq, data)
    if seq <= self.sent then
        return true -- (already sent by the replay)
    end
    self.sent = seq
    return write(self, _M.frame { id = seq, event = self.event, data = data })
end

-- What a channel's poller hands this stream (moonserve/host/core/channel.lua): queued, and
-- the waiting follow() woken.
function EventStream:_push(seq, data)
    local q = self.queue
    if #q >= 2 * self.channel.history then
        -- A client slower than the channel (its writes parked): what waits here is bounded
        -- as the ring is, and what is dropped is told to it as a `reset` event.
        self.dropped = (self.dropped or 0) + #q / 2
        q = {}
        self.queue = q
    end
    q[#q + 1] = seq
    q[#q + 1] = data
    if #q == 2 then
        self.wakeup:post()
    end
end

-- The Last-Event-ID the client sent (a reconnect), as a channel sequence number, or nil.
local function last_seq(self)
    local n = tonumber(self.last_event_id)
    if n and n >= 0 and n % 1 == 0 then
        return n
    end
end

--- Streams the channel's messages (the stream's `channel` option) as events (`id` the
-- message's sequence number, `event` the stream's `event` option, `data` the message) with a
-- heartbeat comment every `heartbeat` seconds, until the client leaves or the server drains;
-- without a channel, only heartbeats. With `replay`, a client that reconnects with
-- Last-Event-ID first gets the messages after that id still in the channel's ring; if some
-- are no longer there, an event named `reset` (data: how many were lost, or "unknown") comes
-- first. Returns nil, "gone".
function EventStream:follow()
    local ch = self.channel
    local seq0
    if ch then
        local err
        seq0, err = ch:_add_stream(self)
        if not seq0 then
            error("cannot follow channel " .. ch.name .. ": " .. err, 2)
        end
        self.sent = seq0
        local since = self.replay and last_seq(self)
        if since then
            local items, lost = ch:since(since)
            if lost ~= 0 then
                write(self, _M.frame { event = "reset", data = lost < 0 and "unknown" or lost })
            end
            self.sent = lost < 0 and 0 or since
            for i = 1, #items, 3 do
                if items[i + 2] == "text" and not deliver(self, items[i], items[i + 1]) then
                    break
                end
            end
            if self.sent < seq0 then
                self.sent = seq0 -- (past the ring: what the stream now waits for is live)
            end
        end
    end
    local wakeup = self.wakeup
    while not self:gone() do
        local q = self.queue
        local n = #q
        local dropped = self.dropped
        if dropped then
            self.dropped = nil
            write(self, _M.frame { event = "reset", data = dropped })
        end
        if n > 0 then
            self.queue = {}
            for i = 1, n, 2 do
                if not deliver(self, q[i], q[i + 1]) then
                    break
                end
            end
        else
            local now = host.now()
            if now >= self.next_beat then
                self:comment("")
            else
                -- Wake at least every second to see whether the client left, as a write
                -- needs something to send to learn it.
                wakeup:wait(min(self.next_beat - now, 1))
            end
        end
    end
    if ch then
        ch:_remove_stream(self)
    end
    return nil, "gone"
end

--- Waits up to `seconds`, sending heartbeats, unless the client leaves first. Returns true,
-- or nil, "gone".
function EventStream:idle(seconds)
    local deadline = host.now() + seconds
    while not self:gone() do
        local now = host.now()
        if now >= deadline then
            return true
        end
        if now >= self.next_beat then
            self:comment("")
        else
            host.sleep(min(deadline, self.next_beat) - now)
        end
    end
    return nil, "gone"
end

-- -- Starting ---------------------------------------------------------------------------

-- The request's Last-Event-ID, through the host's dispatcher (res knows no request).
local function request_last_id(res)
    local ok, d = pcall(host.module, "dispatcher")
    local frame = ok and d and d.context and d.context()
    if type(frame) == "table" and frame.res == res and frame.req then
        return frame.req:header("last-event-id")
    end
end

--- Starts the event stream on `res` (res:events): the head with Content-Type
-- text/event-stream, Cache-Control no-cache and X-Accel-Buffering no (so nginx in front
-- passes each event at once), then `retry` if given. Options: channel (a name or a channel),
-- replay (honour Last-Event-ID), heartbeat (seconds, default 15), retry (milliseconds),
-- event (the event name for channel messages), last_event_id (instead of the header's).
function _M.start(res, opts)
    opts = opts or {}
    if type(opts) ~= "table" then
        error("bad options (table expected)", 3)
    end
    for k in pairs(opts) do
        if not OPTIONS[k] then
            error("unknown events option " .. tostring(k) .. " (accepted: channel, replay, "
                .. "heartbeat, retry, event, last_event_id)", 3)
        end
    end
    local hb = opts.heartbeat or DEFAULTS.heartbeat
    if type(hb) ~= "number" or hb <= 0 or hb ~= hb then
        error("bad heartbeat (positive number of seconds expected)", 3)
    end
    if opts.event ~= nil and not field("event", opts.event) then
        error("bad event (no CR or LF allowed)", 3)
    end
    local ch = opts.channel
    if type(ch) == "string" then
        local name = ch
        ch = host.module("channel").get(name)
        if not ch then
            error("no channel " .. name .. " (declare it with app:channel)", 3)
        end
    elseif ch ~= nil and type(ch) ~= "table" then
        error("bad channel (name or channel expected)", 3)
    end
    local last = opts.last_event_id
    if last == nil then
        last = request_last_id(res)
    end
    local self = setmetatable({ res = res, heartbeat = hb, channel = ch, replay = opts.replay,
        event = opts.event, last_event_id = last, last_id = last, queue = {},
        wakeup = host.module("semaphore").new(0), sent = 0, closed = false, next_beat = 0 }, EventStream)
    res:header("content-type", "text/event-stream")
    res:header("cache-control", "no-cache")
    -- nginx buffers a proxied reply unless told not to; moonserve often runs behind it.
    res:header("x-accel-buffering", "no")
    local first = opts.retry ~= nil and _M.frame { retry = opts.retry }
    if opts.retry ~= nil and not first then
        error("bad retry (whole milliseconds expected)", 3)
    end
    -- The head leaves now, with an empty comment (or the retry): the client sees the stream
    -- open before the first event.
    write(self, first or ":\n\n")
    if not self.closed then
        res:flush()
    end
    return self
end

_M.EventStream = EventStream
return _M
