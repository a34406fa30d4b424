--- moonserve/fanout.lua: fan-out across instances over Redis pub/sub, for channels declared
-- with `redis` and for moonserve.broadcast. Per worker and Redis server, one dedicated
-- subscriber connection carries every topic; a background task owns it and subscribes again,
-- with backoff, after Redis comes back. Publishes are queued and sent by a second task, in
-- pipelines, so that a publisher never waits for Redis. Each message carries its sender (the
-- instance's id, which its workers share, and one of the sending process's) and the sender's
-- sequence number on the topic, so that a worker sees what it missed as a gap (heartbeats
-- carry the last number when a sender falls quiet); a message from another instance enters
-- this instance's ring once, through the first of its workers to claim it in the shared
-- dictionary, and every worker then delivers it from the ring to its own subscribers, as it
-- does the instance's own messages (which never come back from Redis to the same instance).
--
-- `Broadcast`: what moonserve.broadcast(name, opts) returns; it is also the `ipc` option
-- lua-resty-mlcache takes (register_listeners, broadcast(channel, data), poll(timeout)).
-- @module moonserve.fanout
local host = require "moonserve.host"
local shared = require "moonserve.shared"

local type, tostring, tonumber, pairs, ipairs, next, pcall, setmetatable, error = type,
    tostring, tonumber, pairs, ipairs, next, pcall, setmetatable, error
local format, sub, find, match, byte = string.format, string.sub, string.find, string.match,
    string.byte
local unpack = unpack or table.unpack -- luacheck: ignore 143

local _M = {}

--- The shared dictionary of the instance's fan-out state: its id, the sequence numbers, the
-- claims of messages from other instances, the counters and the broadcasts' rings.
_M.DICT = "moonserve_fanout"
_M.DICT_SIZE = "8m"

-- Reconnection backoff, in seconds: the first wait, doubling up to the last.
local BACKOFF_MIN, BACKOFF_MAX = 0.1, 5
-- A subscriber's longest wait for a message: it then looks whether the worker stops and
-- whether topics were added.
local READ_WAIT = 0.5
-- Seconds a claim on a message (topic, instance, sequence) is kept: far longer than two
-- workers of one instance can be apart in reading the same stream.
local CLAIM_TTL = 30
-- Seconds before a gap is counted as missed: another worker of this instance may still
-- claim (and so deliver) what this one did not get. A gap longer than GAP_EACH is counted as
-- a whole, once, rather than message by message.
local GAP_WAIT, GAP_EACH = 1, 10000
-- Publishes in one pipeline. How many a worker keeps while Redis is slow or away is the
-- fanout_queue limit (past it the oldest fail, counted; 0: no cap).
local BATCH = 128

local function queue_max()
    local lims = host.module("dispatcher").limits
    return lims and lims.fanout_queue or 10000
end

local function dict()
    return shared.dicts[_M.DICT]
end

local function log(level, msg)
    host.log(level, msg)
end

local function stopping()
    local d = host.module("dispatcher")
    return d.stopping ~= nil and d.stopping()
end

local function count(name, n)
    local d = dict()
    if d and n ~= 0 then
        d:incr("c:" .. name, n, 0)
    end
end

-- -- The instance ---------------------------------------------------------------------------

local instance_id

--- The instance's id: 16 hex digits drawn by its first worker to ask, shared by the others
-- through the dictionary (so kept across a reload). nil, err outside a worker.
function _M.instance()
    if instance_id then
        return instance_id
    end
    local d = dict()
    if not d then
        return nil, "fanout: the dictionary " .. _M.DICT .. " is not open here (it opens in the "
            .. "workers)"
    end
    local id = d:get("instance")
    if not id then
        local bytes = assert(require("moonserve.crypto").random(8))
        d:add("instance", (bytes:gsub(".", function(c) return format("%02x", byte(c)) end)))
        id = d:get("instance")
    end
    instance_id = id
    return id
end

-- -- Buses: a subscriber connection and a publishing queue per Redis server and worker -------

local buses = {} -- by the `redis` option: a URL, or a client's table
local broadcasts = {} -- by name
local wanted = false -- whether anything declared needs the dictionary

local function new_bus(opt, level)
    local client = opt
    if type(opt) == "string" then
        local err
        client, err = require("moonserve.redis").new(opt)
        if not client then
            error("bad redis for fan-out: " .. tostring(err), level + 1)
        end
    elseif type(opt) ~= "table" or type(opt.subscriber) ~= "function"
            or type(opt.pipeline) ~= "function" then
        error("bad redis (a URL or a moonserve.redis client expected)", level + 1)
    end
    return { client = client, topics = {}, subscribed = {}, seen = {}, seq = {}, told = {},
        q = {}, qh = 1,
        qt = 0, reading = false, writing = false, sema = nil, waiting = false,
        down_since = nil, up = false }
end

local function bus_of(opt, level)
    local b = buses[opt]
    if not b then
        b = new_bus(opt, level + 1)
        buses[opt] = b
    end
    wanted = true
    return b
end

-- A message from another instance, claimed by this worker or not.
local function receive(b, channel, payload)
    local t = b.topics[channel]
    if not t or type(payload) ~= "string" then
        return
    end
    local inst, proc, seq, kind, at = match(payload, "^(%x+)%.(%x+) (%d+) ([tbh])()")
    if not inst then
        count("malformed", 1)
        return
    end
    if inst == instance_id then
        return -- (this instance's own: its workers had it from the ring)
    end
    inst = inst .. "." .. proc
    seq = tonumber(seq)
    local per = b.seen[channel]
    if not per then
        per = {}
        b.seen[channel] = per
    end
    local last = per[inst]
    if last then
        if seq <= last then
            return -- (old, or sent twice)
        end
        -- (a heartbeat's number was sent too; a message's is this one)
        local upto = kind == "h" and seq or seq - 1
        if upto > last then
            host.module("timer").at(GAP_WAIT, _M._count_gap, channel, inst, last + 1, upto)
        end
    end
    per[inst] = seq
    if kind == "h" then
        return -- (a heartbeat: the sender's last number, no message)
    end
    local d = dict()
    if d and d:add(format("r:%s:%s:%d", channel, inst, seq), 1, CLAIM_TTL) then
        count("received", 1)
        t.on_remote(sub(payload, at), kind == "b" and "binary" or "text")
    end
end

--- Counts as missed the messages first..last of `inst` on `topic` that no worker of this
-- instance claimed (a timer's function, run GAP_WAIT after the gap showed).
-- @local
function _M._count_gap(_, topic, inst, first, last)
    local d = dict()
    if not d then
        return
    end
    local missed = 0
    if last - first + 1 > GAP_EACH then
        if d:add(format("g:%s:%s:%d", topic, inst, first), 1, CLAIM_TTL) then
            missed = last - first + 1
        end
    else
        for s = first, last do
            if d:add(format("r:%s:%s:%d", topic, inst, s), 0, CLAIM_TTL) then
                missed = missed + 1
            end
        end
    end
    count("missed", missed)
end

-- The subscription is up again (or for the first time): every topic's reset runs, as
-- messages may have been missed while it was down.
local function went_up(b, ntopics)
    b.up = true
    count("up", 1)
    if not b.down_since then
        return
    end
    local d = dict()
    local down = host.now() - b.down_since
    b.down_since = nil
    count("resubscribed", 1)
    if d and d:incr("down_workers", -1, 1) == 0 then
        log("info", format("fanout: resubscribed to redis after %.1f s (%d topic%s); messages "
            .. "missed meanwhile are counted in moonserve_fanout_missed_total", down, ntopics,
            ntopics == 1 and "" or "s"))
    end
    for _, t in pairs(b.topics) do
        if t.on_reset then
            local ok, err = pcall(t.on_reset)
            if not ok then
                log("err", "fanout: a reset handler failed: " .. tostring(err))
            end
        end
    end
end

local function went_down(b, err)
    if b.up then
        b.up = false
        count("up", -1)
    end
    if b.down_since then
        return
    end
    b.down_since = host.now()
    local d = dict()
    if d and d:incr("down_workers", 1, 0) == 1 then
        -- (the instance's one line for this outage: its first worker to see it writes it)
        count("outages", 1)
        log("warn", "fanout: lost redis (" .. tostring(err) .. "); subscribing again with "
            .. "backoff; messages missed meanwhile are counted in moonserve_fanout_missed_total "
            .. "and moonserve_fanout_publish_failed_total")
    end
end

-- One subscriber session: subscribe to every topic, read until an error or the stop.
-- Returns nil at the stop, or the error.
local function session(b)
    local sub_conn, err = b.client:subscriber()
    if not sub_conn then
        return err or "no subscriber"
    end
    local names = {}
    for n in pairs(b.topics) do
        names[#names + 1] = n
    end
    table.sort(names)
    local ok
    ok, err = sub_conn:subscribe(unpack(names))
    if not ok then
        sub_conn:close()
        return err or "subscribe failed"
    end
    b.subscribed = {}
    for _, n in ipairs(names) do
        b.subscribed[n] = true
    end
    went_up(b, #names)
    while true do
        if stopping() then
            sub_conn:close()
            return nil
        end
        local msg
        msg, err = sub_conn:next(READ_WAIT)
        if msg then
            if msg.kind == "message" then
                receive(b, msg.channel, msg.data)
            end
        elseif err == "timeout" then
            for n in pairs(b.topics) do -- (declared since: a broadcast made in a handler)
                if not b.subscribed[n] then
                    ok, err = sub_conn:subscribe(n)
                    if not ok then
                        sub_conn:close()
                        return err or "subscribe failed"
                    end
                    b.subscribed[n] = true
                end
            end
        else
            sub_conn:close()
            return err or "closed"
        end
    end
end

-- The reader task: sessions one after another, with backoff between failures.
local function reader(premature, b)
    if premature then
        b.reading = false
        return
    end
    local backoff = BACKOFF_MIN
    while not stopping() do
        local t0 = host.now()
        local err = session(b)
        if err == nil or stopping() then
            break
        end
        if host.now() - t0 > 10 then
            backoff = BACKOFF_MIN -- (it had been up a while: a new outage)
        end
        went_down(b, err)
        host.sleep(backoff)
        backoff = backoff * 2 > BACKOFF_MAX and BACKOFF_MAX or backoff * 2
    end
    b.reading = false
    if b.up then
        b.up = false
        count("up", -1)
    end
    if b.down_since then -- (a worker that stops while down: the others keep the count)
        b.down_since = nil
        local d = dict()
        if d then
            d:incr("down_workers", -1, 1)
        end
    end
end

-- The sender of this process's publishes: the instance's id and one of the process's own.
-- Each worker numbers what it sends in the order its writer sends it (a number taken from
-- the instance would let two workers' messages reach Redis out of their order), and a
-- process of its own never takes up a number a worker it replaced (a reload) has used.
local sender

-- After a second with nothing to send, a worker tells each topic it published on how far
-- its numbers went (a heartbeat, kind "h", carrying its last number and no message), until
-- Redis has taken one: so a gap shows soon after an outage even when the sender publishes
-- nothing more.
local function heartbeats(b)
    if not sender then
        return
    end
    for topic, seq in pairs(b.seq) do
        if b.told[topic] ~= seq then
            b.told[topic] = seq
            b.qt = b.qt + 1
            b.q[b.qt] = { topic, format("%s %d h", sender, seq), true }
        end
    end
end

-- Sends up to BATCH queued publishes in one pipeline.
local function send(b)
    local redis = require "moonserve.redis"
    local cmds, beats, n = {}, {}, 0
    while b.qh <= b.qt and n < BATCH do
        local m = b.q[b.qh]
        b.q[b.qh] = nil
        b.qh = b.qh + 1
        n = n + 1
        cmds[n], beats[n] = { "PUBLISH", m[1], m[2] }, m[3] and m[1]
    end
    local ok, replies = pcall(b.client.pipeline, b.client, cmds)
    replies = ok and replies or nil
    local sent, failed = 0, 0
    for i = 1, n do
        local r = replies and replies[i]
        local done = r ~= nil and not redis.is_error(r)
        if beats[i] then
            if not done then
                b.told[beats[i]] = nil -- (told again at the next idle second)
            end
        elseif done then
            sent = sent + 1
        else
            failed = failed + 1
        end
    end
    count("published", sent)
    count("publish_failed", failed)
end

-- The writer task: sends what is queued, BATCH publishes to a pipeline. At the worker's
-- stop it sends what is left and ends (what requests still under way publish after that,
-- publish() sends itself).
local function writer(premature, b)
    if premature then
        b.writing = false
        return
    end
    while not stopping() do
        if b.qh > b.qt then
            b.waiting = true
            local woken = b.sema:wait(1) -- (a second at most: then it looks whether the
            b.waiting = false            -- worker stops)
            if not woken then
                heartbeats(b)
            end
        else
            send(b)
        end
    end
    while b.qh <= b.qt do
        send(b)
    end
    b.writing = false
end

local function start(b)
    local timer = host.module("timer")
    if not b.reading then
        b.reading = true
        if not timer.at(0, reader, b) then
            b.reading = false
        end
    end
    if not b.writing then
        b.sema = b.sema or host.module("semaphore").new(0)
        b.writing = true
        if not timer.at(0, writer, b) then
            b.writing = false
        end
    end
end

-- Queues `data` for the other instances on the Redis channel `topic`. Never waits.
local function publish(b, topic, kind, data)
    local id = _M.instance()
    if not id then
        return
    end
    if not sender then
        local bytes = assert(require("moonserve.crypto").random(4))
        sender = id .. "." .. bytes:gsub(".", function(c) return format("%02x", byte(c)) end)
    end
    local seq = (b.seq[topic] or 0) + 1
    b.seq[topic] = seq
    local max = queue_max()
    if max > 0 and b.qt - b.qh + 1 >= max then
        b.q[b.qh] = nil -- (the oldest fails: Redis has not taken `max` publishes)
        b.qh = b.qh + 1
        count("publish_failed", 1)
    end
    b.qt = b.qt + 1
    b.q[b.qt] = { topic, format("%s %d %s", sender, seq, kind == "binary" and "b" or "t") .. data }
    if stopping() and not b.writing then
        -- A stopping worker still answers the requests under way, but no task starts now:
        -- the publisher sends (and waits for Redis, this once), or the other instances would
        -- never get what it published.
        while b.qh <= b.qt do
            send(b)
        end
        return
    end
    start(b)
    if b.waiting then
        b.sema:post(1)
    end
end

--- Joins a channel of moonserve.channel to the fan-out over `redis` (a URL or a client):
-- what it publishes goes to every instance, and what other instances publish enters its
-- ring through `enter(data, kind)`. Returns the channel's fan-out, for publish().
-- @local
function _M.channel(name, redis, enter, level)
    local b = bus_of(redis, (level or 1) + 1)
    local topic = "moonserve:channel:" .. name
    b.topics[topic] = { on_remote = enter }
    return { bus = b, topic = topic }
end

--- Sends what a channel published here to the other instances (queued; never waits).
-- @local
function _M.publish(f, data, kind)
    publish(f.bus, f.topic, kind, data)
end

-- -- Broadcasts (moonserve.broadcast) -------------------------------------------------------

local Broadcast = {}
Broadcast.__index = Broadcast

local function ring_key(self, slot)
    return format("b:%s:%d", self.name, slot)
end

-- Writes `payload` into the instance's ring of the broadcast.
local function enter(self, payload)
    local d = dict()
    if not d then
        return nil, "fanout: the dictionary " .. _M.DICT .. " is not open here"
    end
    local seq, err = d:incr("b:" .. self.name, 1, 0)
    if not seq then
        return nil, err
    end
    local ok
    ok, err = d:set(ring_key(self, seq % self.history), seq .. " " .. payload)
    if not ok then
        return nil, err
    end
    return seq
end

local function reset(self)
    for _, fn in ipairs(self.resets) do
        local ok, err = pcall(fn)
        if not ok then
            log("err", "broadcast " .. self.name .. ": a reset handler failed: " .. tostring(err))
        end
    end
    -- lua-resty-mlcache's purge events: what it registered to empty its worker's cache
    for channel, fns in pairs(self.listeners) do
        if find(channel, "^mlcache:purge:") then
            for _, fn in ipairs(fns) do
                pcall(fn)
            end
        end
    end
end

local function deliver(self, payload)
    local n, at = match(payload, "^(%d+):()")
    if not n then
        return
    end
    local channel = sub(payload, at, at + n - 1)
    local data = sub(payload, at + n)
    for _, fn in ipairs(self.handlers) do
        local ok, err = pcall(fn, data, channel)
        if not ok then
            log("err", "broadcast " .. self.name .. ": a handler failed: " .. tostring(err))
        end
    end
    for _, fn in ipairs(self.listeners[channel] or {}) do
        local ok, err = pcall(fn, data)
        if not ok then
            log("err", "broadcast " .. self.name .. ": a listener of " .. channel
                .. " failed: " .. tostring(err))
        end
    end
end

-- Runs this worker's handlers for what is new in the ring. A slot not written yet (a
-- broadcast between its number and its write) is waited for up to `timeout` seconds.
local function poll(self, timeout)
    local d = dict()
    if not d then
        return nil, "fanout: the dictionary " .. _M.DICT .. " is not open here"
    end
    local last = d:get("b:" .. self.name) or 0
    if not self.next_seq or last < self.next_seq - 1 then
        self.next_seq = last + 1 -- (the first look, or the dictionary was emptied)
        return true
    end
    local oldest = last - self.history + 1
    if self.next_seq < oldest then
        self.next_seq = oldest -- (fell behind the ring: what was overwritten is lost)
        reset(self)
    end
    local waited = 0
    while self.next_seq <= last do
        local want = self.next_seq
        local v = d:get(ring_key(self, want % self.history))
        local p = v and find(v, " ", 1, true)
        local seq = p and tonumber(sub(v, 1, p - 1))
        if seq == want then
            self.next_seq = want + 1
            deliver(self, sub(v, p + 1))
        elseif seq and seq > want then
            self.next_seq = want + 1
            reset(self)
        elseif timeout and waited < timeout then
            host.sleep(0.001)
            waited = waited + 0.001
        else
            break
        end
    end
    return true
end

local function start_poller(self)
    if self.timer or not next(self.handlers) and not next(self.listeners) then
        return
    end
    local d = dict()
    if not d then
        return
    end
    if not self.next_seq then
        self.next_seq = (d:get("b:" .. self.name) or 0) + 1
    end
    local h = host.module("timer").every(self.interval, function(premature)
        if premature then
            self.timer = nil
            return
        end
        poll(self)
    end)
    self.timer = h
end

local function method_or_function(self, a, b)
    if a == self then
        return b
    end
    return a
end

local function check_name(name, level)
    if type(name) ~= "string" or not find(name, "^[%w_.:-]+$") or #name > 100 then
        error("bad broadcast name " .. tostring(name) .. " (1 to 100 letters, digits, '_', "
            .. "'.', ':' or '-')", level + 1)
    end
end

--- A broadcast for state that lives in each worker (caches): `b:broadcast(data)` reaches
-- every worker of this instance, and with `opts.redis` (a URL or a moonserve.redis client)
-- every worker of every instance. Declared before the server starts (its workers subscribe
-- as they start); declaring a name again returns the same broadcast. opts: redis, history
-- (messages a worker may fall behind, 1024), interval (seconds between a subscribed worker's
-- looks, 0.05).
function _M.broadcast(name, opts)
    check_name(name, 2)
    opts = opts or {}
    if type(opts) ~= "table" then
        error("bad options for broadcast " .. name .. " (table expected)", 2)
    end
    for k in pairs(opts) do
        if k ~= "redis" and k ~= "history" and k ~= "interval" then
            error("unknown broadcast option " .. tostring(k) .. " (accepted: redis, history, "
                .. "interval)", 2)
        end
    end
    for _, k in ipairs { "history", "interval" } do
        local v = opts[k]
        if v ~= nil and (type(v) ~= "number" or v <= 0 or v ~= v) then
            error("bad " .. k .. " for broadcast " .. name .. " (positive number expected)", 2)
        end
    end
    local self = broadcasts[name]
    if self then
        return self
    end
    self = setmetatable({ name = name, history = opts.history or 1024,
        interval = opts.interval or 0.05, handlers = {}, listeners = {}, resets = {} },
        Broadcast)
    wanted = true
    if opts.redis then
        local b = bus_of(opts.redis, 2)
        self.bus, self.topic = b, "moonserve:broadcast:" .. name
        b.topics[self.topic] = {
            on_remote = function(payload) enter(self, payload) end,
            on_reset = function() reset(self) end,
        }
    end
    -- As plain functions too, the shape lua-resty-mlcache calls: ipc.broadcast(channel,
    -- data), ipc.poll(timeout), ipc.register_listeners(events).
    self.broadcast = function(a, b, c)
        if a == self then
            return Broadcast.send(self, "", b)
        end
        return Broadcast.send(self, a, b, c)
    end
    self.poll = function(a, b)
        return poll(self, method_or_function(self, a, b))
    end
    self.register_listeners = function(a, b)
        return Broadcast.register_listeners(self, method_or_function(self, a, b))
    end
    broadcasts[name] = self
    return self
end

--- b:send(channel, data): `data` (a string) for the listeners of `channel` and the
-- subscribers, in every worker (and every instance with redis), this one included. Returns
-- true, or nil and an error (the dictionary's). Never waits for Redis: what Redis did not
-- take is counted (moonserve_fanout_publish_failed_total).
function Broadcast:send(channel, data)
    if type(channel) ~= "string" then
        error("bad channel (string expected)", 2)
    end
    if data == nil then
        data = ""
    elseif type(data) ~= "string" then
        error("bad data (string expected)", 2)
    end
    local payload = #channel .. ":" .. channel .. data
    local seq, err = enter(self, payload)
    if not seq then
        return nil, err
    end
    if self.bus then
        publish(self.bus, self.topic, "text", payload)
    end
    return true
end

--- b:subscribe(fn): fn(data, channel) runs in this worker for every message, polled every
-- `interval` seconds. b:on(fn) is the same.
function Broadcast:subscribe(fn)
    if type(fn) ~= "function" then
        error("bad handler (function expected)", 2)
    end
    self.handlers[#self.handlers + 1] = fn
    if dict() then
        start_poller(self)
    end
    return true
end
Broadcast.on = Broadcast.subscribe

--- b:on_reset(fn): fn() runs in this worker when messages may have been missed (its
-- subscription to Redis came back, or it fell behind the ring): purge what it caches.
function Broadcast:on_reset(fn)
    if type(fn) ~= "function" then
        error("bad handler (function expected)", 2)
    end
    self.resets[#self.resets + 1] = fn
    return true
end

--- b:register_listeners(events): lua-resty-mlcache's events, { name = { channel =,
-- handler = fn(data) } }; a channel named mlcache:purge:* is also told on a reset.
function Broadcast:register_listeners(events)
    if type(events) ~= "table" then
        error("bad events (table expected)", 2)
    end
    for _, ev in pairs(events) do
        if type(ev) == "table" and type(ev.channel) == "string"
                and type(ev.handler) == "function" then
            local list = self.listeners[ev.channel] or {}
            list[#list + 1] = ev.handler
            self.listeners[ev.channel] = list
        end
    end
    if dict() then
        start_poller(self) -- (mlcache polls too, in its update(): both are harmless)
    end
    return true
end

-- -- Starting ---------------------------------------------------------------------------------

--- Prepares `app` for what was declared (the runner calls it before the workers start): the
-- dictionary, and in each worker the subscriptions, as soon as it starts.
-- @local
function _M.prepare(app)
    if not wanted or rawget(app, "fanout_prepared") then
        return
    end
    rawset(app, "fanout_prepared", true)
    app:shared_dict(_M.DICT, _M.DICT_SIZE)
    app:on_worker_start(function()
        _M.instance()
        for _, b in pairs(buses) do
            start(b)
        end
        for _, bc in pairs(broadcasts) do
            start_poller(bc)
        end
    end)
    local metrics = host.module("metrics")
    if metrics.section then
        metrics.section(_M.metrics_text)
    end
end

local FAMILIES = {
    { "published", "counter", "Messages sent to Redis for the other instances." },
    { "publish_failed", "counter", "Messages of this instance that Redis did not take "
        .. "(away, slow, or over the queue of a worker)." },
    { "received", "counter", "Messages from other instances entered into this instance." },
    { "missed", "counter", "Messages of other instances this instance never received (gaps "
        .. "in their numbers), as during an outage." },
    { "outages", "counter", "Times the subscription to Redis was lost." },
    { "resubscribed", "counter", "Subscriptions made again by a worker after an outage." },
    { "up", "gauge", "Workers whose subscription to Redis is up." },
}

--- Writes the fan-out's families (moonserve_fanout_*) into `out`, with the metrics' own
-- `family` and `sample` writers.
-- @local
function _M.metrics_text(out, family, sample)
    local d = dict()
    if not d then
        return
    end
    for _, f in ipairs(FAMILIES) do
        local name = "moonserve_fanout_" .. f[1] .. (f[2] == "counter" and "_total" or "")
        family(out, name, f[2], f[3])
        sample(out, name, "", d:get("c:" .. f[1]) or 0)
    end
end

--- The counters, as a table (published, publish_failed, received, missed, outages,
-- resubscribed, up).
function _M.stats()
    local d = dict()
    local t = {}
    for _, f in ipairs(FAMILIES) do
        t[f[1]] = d and d:get("c:" .. f[1]) or 0
    end
    return t
end

return _M
