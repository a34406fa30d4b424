--- moonserve/host/core/channel.lua: named channels that carry WebSocket messages to the subscribers of
-- every worker. A channel is a ring of `history` slots in a shared dictionary of its own: a
-- publisher takes the next sequence number with one atomic incr and writes the message into
-- slot seq % history; each worker that has subscribers polls the ring every `poll` seconds
-- and hands what is new, in sequence order, to its subscribers with one framed broadcast per
-- message. The ring never grows: a worker that falls more than `history` messages behind
-- skips what was overwritten, and a slot still empty after `hole_wait` seconds (a publisher
-- that died between its incr and its write, or an entry the dictionary evicted) is skipped;
-- both are counted as lost. With `redis` (a URL or a moonserve.redis client) a channel reaches
-- every instance: moonserve/fanout.lua sends what is published here through Redis pub/sub and
-- enters what other instances publish into this instance's ring.
--
-- `Channel`: what app:channel(name, opts) returns.
-- @module moonserve.channel
local shared = require "moonserve.shared"

local type, tostring, pairs, next, error = type, tostring, pairs, next, error
local find, sub, tonumber, format, ceil = string.find, string.sub, tonumber, string.format,
    math.ceil

local _M = {}

local DEFAULTS = {
    history = 1024,                -- slots in the ring: how far a worker may fall behind
    size = "2m",                   -- the dictionary's size
    poll = 0.02,                   -- seconds between a subscribed worker's looks at the ring
    hole_wait = 1,                 -- seconds a slot may stay unwritten before it is skipped
    max_message_bytes = 65536,     -- a larger publish is refused
}
local PREFIX = "moonserve_channel_"

local channels = {} -- by name, in this process

local Channel = {}
Channel.__index = Channel

local function dict(self)
    local d = shared.dicts[self.dict_name]
    if not d then
        return nil, "channel " .. self.name .. " is not open here (it opens in the workers)"
    end
    return d
end

-- -- Publishing ---------------------------------------------------------------------------

--- Publishes `data` (text, or with kind "binary" binary) to every subscriber of every worker.
-- Returns its sequence number, or nil and "not UTF-8", "too big" (over max_message_bytes),
-- or the dictionary's error.
function Channel:publish(data, kind)
    if type(data) ~= "string" then
        error("bad data (string expected)", 2)
    end
    local k = "t"
    if kind == "binary" then
        k = "b"
    elseif kind ~= nil and kind ~= "text" then
        error("bad kind (\"text\" or \"binary\" expected)", 2)
    end
    local bad = self:_refuses(data, k)
    if bad then
        return nil, bad
    end
    local seq, err = self:_enter(data, k)
    if seq and self.fanout then
        require("moonserve.fanout").publish(self.fanout, data, kind)
    end
    return seq, err
end

-- Why a message cannot enter the channel ("too big", "not UTF-8"), or nil: what publish
-- checks, and what another instance published is checked the same way (moonserve/fanout.lua),
-- so no instance's larger limit or foreign publisher puts bad text frames into sockets here.
function Channel:_refuses(data, k)
    if #data > self.max_message_bytes then
        return "too big"
    end
    if k == "t" and not require("moonserve.host.core.websocket").utf8_ok(data) then
        return "not UTF-8"
    end
end

-- Writes a message into the ring: `k` is "t" (text) or "b" (binary). Returns its sequence
-- number, or nil, err. What another instance published enters here too (moonserve/fanout.lua).
function Channel:_enter(data, k)
    local d, err = dict(self)
    if not d then
        return nil, err
    end
    local seq
    seq, err = d:incr("seq", 1, 0)
    if not seq then
        return nil, err
    end
    -- "SEQ KIND DATA": the sequence number tells a reader whether the slot holds the message
    -- it expects, an older one (not written yet) or a newer one (it fell behind).
    local ok
    ok, err = d:set(format("m%d", seq % self.history), format("%d%s", seq, k) .. data)
    if not ok then
        return nil, err
    end
    return seq
end

-- -- Subscribing and the poller -----------------------------------------------------------

local function add_lost(self, d, n)
    if n > 0 then
        self.lost = self.lost + n
        d:incr("lost", n, 0)
    end
end

-- One look at the ring: delivers what is new, in order, to this worker's subscribers.
local function poll(self)
    local d = dict(self)
    if not d then
        return
    end
    local ws = require "moonserve.host.core.websocket"
    local subs = self.subs
    for s in pairs(subs) do
        if s:closed() then
            subs[s] = nil
        end
    end
    local streams = self.streams
    if next(subs) == nil and next(streams) == nil then
        -- Nobody listens in this worker any more: stop looking until someone subscribes.
        self.timer:cancel()
        self.timer = nil
        return
    end
    local last = d:get("seq") or 0
    local want = self.next_seq
    if last < want - 1 then -- (the ring was flushed)
        want = last + 1
    end
    local oldest = last - self.history + 1
    if want < oldest then
        add_lost(self, d, oldest - want)
        want, self.hole_ticks = oldest, 0
    end
    local history = self.history
    while want <= last do
        local v = d:get(format("m%d", want % history))
        local p = v and find(v, "[tb]")
        local seq = p and tonumber(sub(v, 1, p - 1))
        if seq == want then
            local data = sub(v, p + 1)
            local binary = sub(v, p, p) == "b"
            if next(subs) ~= nil then
                ws.broadcast(subs, data, binary and "binary" or "text")
            end
            if not binary then -- (an event stream carries text only)
                for s in pairs(streams) do
                    s:_push(want, data)
                end
            end
            self.delivered = self.delivered + 1
            want, self.hole_ticks = want + 1, 0
        elseif seq and seq > want then
            -- Overwritten by a later lap: the publishers got `history` ahead of this worker.
            add_lost(self, d, 1)
            want, self.hole_ticks = want + 1, 0
        else
            -- Not written yet, or evicted: wait a little, in order, then give it up.
            self.hole_ticks = self.hole_ticks + 1
            if self.hole_ticks <= self.hole_limit then
                break
            end
            add_lost(self, d, 1)
            want, self.hole_ticks = want + 1, 0
        end
    end
    self.next_seq = want
end

--- Adds `ws` to the channel's subscribers in this worker: from now on it gets every message
-- published to the channel, in the order of their sequence numbers (the same order in every
-- worker). A socket that closes leaves by itself. Returns true, or nil, err (no timer left).
-- Starts this worker's poller if it is not running: it delivers from the channel's next
-- sequence number on. Returns the channel's last sequence number now, or nil, err.
local function listen(self)
    local d, err = dict(self)
    if not d then
        return nil, err
    end
    local last = d:get("seq") or 0
    if not self.timer then
        local timer = require "moonserve.host.core.timer"
        local h
        h, err = timer.every(self.poll, function(premature)
            if premature then
                -- The loop that ran it stops (a worker, or a test client that closes): the
                -- next subscriber, on another loop of this process, must start a poller anew.
                if self.timer == h then
                    self.timer = nil
                end
                return
            end
            poll(self)
        end)
        if not h then
            return nil, err
        end
        self.timer = h
        self.next_seq = last + 1
        self.hole_ticks = 0
    end
    return last
end

--- The messages still in the ring after sequence number `id`, oldest first, as a flat list
-- { seq, data, kind, ... } (kind "text" or "binary"), and how many after `id` are no longer
-- there: 0 when none is missing, n when the ring has moved past n of them, -1 when `id` is
-- ahead of the channel (its dictionary was emptied, as by a restart: every kept message is
-- then given). A slot not written yet ends the list. Misses in the dictionary: nil, err.
function Channel:since(id)
    if type(id) ~= "number" or id < 0 or id % 1 ~= 0 then
        error("bad id (whole number expected)", 2)
    end
    local d, err = dict(self)
    if not d then
        return nil, err
    end
    local last = d:get("seq") or 0
    local oldest = last - self.history + 1
    if oldest < 1 then
        oldest = 1
    end
    local lost, from = 0, id + 1
    if id > last then
        lost, from = -1, oldest
    elseif from < oldest then
        lost, from = oldest - from, oldest
    end
    local out, n, history = {}, 0, self.history
    for want = from, last do
        local v = d:get(format("m%d", want % history))
        local p = v and find(v, "[tb]")
        if not p or tonumber(sub(v, 1, p - 1)) ~= want then
            break
        end
        out[n + 1], out[n + 2] = want, sub(v, p + 1)
        out[n + 3] = sub(v, p, p) == "b" and "binary" or "text"
        n = n + 3
    end
    return out, lost
end

--- Adds `ws` to the channel's subscribers in this worker: from now on it gets every message
-- published to the channel, in the order of their sequence numbers (the same order in every
-- worker). With `opts.since` (a sequence number the client last saw), the messages after it
-- still in the ring are sent first. A socket that closes leaves by itself. Returns true
-- and how many messages after `since` the ring no longer held (see since), or nil, err.
function Channel:subscribe(ws, opts)
    local websocket = require "moonserve.host.core.websocket"
    if getmetatable(ws) ~= websocket.WebSocket then
        error("bad socket (websocket expected)", 2)
    end
    local since = opts and opts.since
    if since ~= nil and (type(since) ~= "number" or since < 0 or since % 1 ~= 0) then
        error("bad since (whole number expected)", 2)
    end
    local last, err = listen(self)
    if not last then
        return nil, err
    end
    local lost = 0
    if since then
        -- Sent before the socket joins, up to where this worker's poller stands: from its
        -- next sequence number on, the poller delivers to the socket itself.
        local items
        items, lost = self:since(since)
        for i = 1, items and #items or 0, 3 do
            if items[i] < self.next_seq then
                websocket.broadcast({ ws }, items[i + 1], items[i + 2])
            end
        end
    end
    self.subs[ws] = ws -- (a list for broadcast, which takes the values)
    return true, lost
end

-- An event stream (moonserve/events.lua) that follows the channel: the poller hands it each
-- text message with stream:_push(seq, data). Returns the last sequence number, or nil, err.
function Channel:_add_stream(s)
    local last, err = listen(self)
    if not last then
        return nil, err
    end
    self.streams[s] = true
    return last
end

function Channel:_remove_stream(s)
    self.streams[s] = nil
end

--- Takes `ws` out of the channel's subscribers in this worker.
function Channel:unsubscribe(ws)
    self.subs[ws] = nil
end

--- Counts: published (the channel's last sequence number, every worker's), lost (every
-- worker's), and this worker's subscribers, delivered and lost.
function Channel:stats()
    local d = dict(self)
    local n = 0
    for s in pairs(self.subs) do
        if not s:closed() then
            n = n + 1
        end
    end
    return {
        published = d and d:get("seq") or 0,
        lost = d and d:get("lost") or 0,
        subscribers = n,
        worker_delivered = self.delivered,
        worker_lost = self.lost,
    }
end

-- -- Declaring ----------------------------------------------------------------------------

-- A channel's options, checked: the table to build it from. Misuse raises at `level`.
local function check(name, opts, level)
    if type(name) ~= "string" or not find(name, "^[%w_-]+$") or #name > 63 - #PREFIX then
        error("bad channel name " .. tostring(name) .. " (1 to " .. (63 - #PREFIX)
            .. " letters, digits, '_' or '-')", level)
    end
    opts = opts or {}
    if type(opts) ~= "table" then
        error("bad options for channel " .. name .. " (table expected)", level)
    end
    local o = {}
    for k, v in pairs(opts) do
        if DEFAULTS[k] == nil and k ~= "redis" then
            error("unknown channel option " .. tostring(k) .. " for " .. name
                .. " (accepted: history, size, poll, hole_wait, max_message_bytes, redis)",
                level)
        end
        o[k] = v
    end
    if o.redis ~= nil and type(o.redis) ~= "string" and type(o.redis) ~= "table" then
        error("bad redis for channel " .. name .. " (a URL or a moonserve.redis client "
            .. "expected)", level)
    end
    for k, v in pairs(DEFAULTS) do
        if o[k] == nil then
            o[k] = v
        end
    end
    for _, k in ipairs { "history", "poll", "hole_wait", "max_message_bytes" } do
        if type(o[k]) ~= "number" or o[k] <= 0 or o[k] ~= o[k] then
            error("bad " .. k .. " for channel " .. name .. " (positive number expected)", level)
        end
    end
    if o.history % 1 ~= 0 then
        error("bad history for channel " .. name .. " (a whole number expected)", level)
    end
    local bytes, err = shared.parse_size(o.size)
    if not bytes then
        error(err:gsub("^bad size", "bad size for channel " .. name), level)
    end
    o.bytes = bytes
    return o
end

--- Declares the channel `name` for `app` (app:channel): its dictionary is the app's
-- "moonserve_channel_NAME". Returns the channel; declaring it again returns the same one.
function _M.declare(app, name, opts, level)
    level = (level or 1) + 1
    local o = check(name, opts, level + 1)
    local ch = channels[name]
    if not ch then
        ch = setmetatable({ name = name, dict_name = PREFIX .. name,
            subs = {}, streams = {}, delivered = 0, lost = 0 }, Channel)
        channels[name] = ch
    end
    ch.history, ch.poll, ch.max_message_bytes = o.history, o.poll, o.max_message_bytes
    ch.hole_limit = ceil(o.hole_wait / o.poll)
    app:shared_dict(ch.dict_name, o.bytes)
    if o.redis then
        -- Across instances: published here, also sent through Redis; published elsewhere,
        -- entered into this instance's ring by the first of its workers to get it.
        ch.fanout = require("moonserve.fanout").channel(name, o.redis, function(data, kind)
            local k = kind == "binary" and "b" or "t"
            local bad = ch:_refuses(data, k)
            if bad then
                return false, bad
            end
            ch:_enter(data, k)
        end, level)
    end
    return ch
end

--- The channel `name` declared in this process, or nil.
function _M.get(name)
    return channels[name]
end

_M.Channel = Channel
return _M
