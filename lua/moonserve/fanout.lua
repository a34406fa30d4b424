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
local reconnect = require "moonserve.reconnect"
local shared = require "moonserve.shared"

local type, tostring, tonumber, pairs, ipairs, next, pcall, setmetatable, error = type,
    tostring, tonumber, pairs, ipairs, next, pcall, setmetatable, error
local format, sub, find, match = string.format, string.sub, string.find, string.match
local unpack = unpack or table.unpack -- luacheck: ignore 143

local _M = {}

--- The shared dictionary of the claims of messages from other instances and of the
-- broadcasts' rings. A claim lives CLAIM_TTL seconds: at R messages a second from other
-- instances the claims take about R * CLAIM_TTL * 150 bytes (8m: some 1,800 a second). An app
-- that receives more declares it larger itself (app:shared_dict("moonserve_fanout", "64m")).
_M.DICT = "moonserve_fanout"
_M.DICT_SIZE = "8m"
--- The dictionary of the state that must never be evicted: the instance's id, the count of
-- workers whose subscription is down, the counters and the broadcasts' sequence numbers. A
-- few keys, apart from the claims, so that no claim ever pushes them out.
_M.STATE_DICT = "moonserve_fanout_state"
_M.STATE_DICT_SIZE = "256k"

-- A subscriber's longest wait for a message: it then looks whether the worker stops.
local READ_WAIT = 0.5
-- Seconds a claim on a message (topic, instance, sequence) is kept: far longer than two
-- workers of one instance can be apart in reading the same stream.
local CLAIM_TTL = 30
-- Seconds before a gap is counted as missed: another worker of this instance may still
-- claim (and so deliver) what this one did not get. A gap longer than GAP_EACH is counted as
-- a whole, once, rather than message by message.
local GAP_WAIT, GAP_EACH = 1, 10000
-- A sender heard from no more than this many seconds is forgotten (each reload in the fleet
-- brings new senders), looked at every PRUNE_EVERY seconds. A number more than GAP_EACH
-- below the last one heard is not a resend but a sender's fresh start (or the end of a
-- forged number): it is taken, so that no forged number silences a real sender for good.
local IDLE_SENDER, PRUNE_EVERY = 600, 60
-- Seconds between two lines about the same kind of bad input (a message refused, claims that
-- found the dictionary full), per instance.
local LOG_EVERY = 3600
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

local function state()
    return shared.dicts[_M.STATE_DICT]
end

local function log(level, msg)
    host.log(level, msg)
end

local function stopping()
    local d = host.module("dispatcher")
    return d.stopping ~= nil and d.stopping()
end

local function count(name, n)
    local d = state()
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
    local d = state()
    if not d then
        return nil, "fanout: the dictionary " .. _M.STATE_DICT .. " is not open here (it opens "
            .. "in the workers)"
    end
    local id = d:get("instance")
    if not id then
        local crypto = require "moonserve.crypto"
        d:safe_add("instance", crypto.hex(assert(crypto.random(8))))
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
    return { client = client, topics = {}, ntopics = 0, subscribed = {}, seen = {},
        heard = {}, pruned = 0, seq = {}, told = {}, q = {}, qh = 1, qt = 0, reading = false,
        writing = false, sema = nil, waiting = false, down_since = nil, up = false }
end

-- Adds a topic to a bus; its subscriber takes it up at its next turn.
local function add_topic(b, topic, t)
    if not b.topics[topic] then
        b.ntopics = b.ntopics + 1
    end
    b.topics[topic] = t
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

-- Forgets the senders of `b` not heard from for more than IDLE_SENDER seconds.
local function prune(b, now)
    b.pruned = now
    for channel, per in pairs(b.seen) do
        local heard = b.heard[channel]
        for inst in pairs(per) do
            if now - (heard[inst] or 0) > IDLE_SENDER then
                per[inst], heard[inst] = nil, nil
            end
        end
        if next(per) == nil then
            b.seen[channel], b.heard[channel] = nil, nil
        end
    end
end

-- Whether the instance has not said `what` for LOG_EVERY seconds: the first of its workers
-- to ask says it.
local function first_to_say(what)
    local d = state()
    return d ~= nil and d:safe_add("l:" .. what, 1, LOG_EVERY) == true
end

-- A message refused by its topic (too big, not UTF-8): counted, and logged once an hour per
-- instance, topic and reason.
local function rejected(channel, why)
    count("rejected", 1)
    if first_to_say("rejected " .. channel .. " " .. tostring(why)) then
        log("warn", "fanout: refused a message from another instance on " .. channel .. " ("
            .. tostring(why) .. "); such messages are counted in "
            .. "moonserve_fanout_rejected_total")
    end
end

-- A message from another instance, claimed by this worker or not.
local function receive(b, channel, payload)
    local t = b.topics[channel]
    if not t or type(payload) ~= "string" then
        return
    end
    local inst, proc, seq, kind, at = match(payload, "^(%x+)%.(%x+) (%d+) ([tbh])()")
    if not inst or #seq > 15 then -- (a number past 2^53 is no sender's)
        count("malformed", 1)
        return
    end
    if inst == instance_id then
        return -- (this instance's own: its workers had it from the ring)
    end
    inst = inst .. "." .. proc
    seq = tonumber(seq)
    local now = host.now()
    if now - b.pruned > PRUNE_EVERY then
        prune(b, now)
    end
    local per, heard = b.seen[channel], b.heard[channel]
    if not per then
        per, heard = {}, {}
        b.seen[channel], b.heard[channel] = per, heard
    end
    local last = per[inst]
    if last then
        if seq <= last and last - seq <= GAP_EACH then
            return -- (old, or sent twice)
        end
        -- (a heartbeat's number was sent too; a message's is this one)
        local upto = kind == "h" and seq or seq - 1
        if upto > last then
            host.module("timer").at(GAP_WAIT, _M._count_gap, channel, inst, last + 1, upto)
        end
    end
    per[inst], heard[inst] = seq, now
    if kind == "h" then
        return -- (a heartbeat: the sender's last number, no message)
    end
    local d = dict()
    -- (safe_add: a claim never evicts another, whose message would then enter twice, nor a ring)
    local won, err = false, nil
    if d then
        won, err = d:safe_add(format("r:%s:%s:%d", channel, inst, seq), 1, CLAIM_TTL)
    end
    if won then
        -- (on_remote returns false and why when it refuses the message)
        local ok, why = t.on_remote(sub(payload, at), kind == "b" and "binary" or "text")
        if ok == false then
            rejected(channel, why)
        else
            count("received", 1)
        end
    elseif err == "no memory" then
        count("missed", 1)
        if first_to_say("full") then
            log("warn", "fanout: the dictionary " .. _M.DICT .. " is full of claims: messages "
                .. "from other instances are dropped (counted in "
                .. "moonserve_fanout_missed_total); declare it larger")
        end
    end
end

--- The bus of the `redis` option `opt`, and a message received through it (for the specs).
-- @local
function _M._bus(opt)
    return buses[opt]
end

--- @local
function _M._receive(opt, channel, payload)
    return receive(buses[opt], channel, payload)
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
        if d:safe_add(format("g:%s:%s:%d", topic, inst, first), 1, CLAIM_TTL) then
            missed = last - first + 1
        end
    else
        for s = first, last do
            if d:safe_add(format("r:%s:%s:%d", topic, inst, s), 0, CLAIM_TTL) then
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

-- Subscribes `sub_conn` to the topics of `b` it does not have yet (all of them on a new
-- connection). Returns true, or nil and an error.
local function subscribe_new(b, sub_conn)
    local names = {}
    for n in pairs(b.topics) do
        if not b.subscribed[n] then
            names[#names + 1] = n
        end
    end
    b.subscribed_n = b.ntopics
    if #names == 0 then
        return true
    end
    table.sort(names)
    local ok, err = sub_conn:subscribe(unpack(names))
    if not ok then
        return nil, err or "subscribe failed"
    end
    for _, n in ipairs(names) do
        b.subscribed[n] = true
    end
    return true
end

-- One subscriber session: subscribe to every topic, read until an error or the stop. The
-- subscription counts as up at Redis's first confirmation, not when SUBSCRIBE is sent: a
-- refusal (an ACL's -NOPERM) or a proxy that accepts and then closes is no comeback.
-- Returns nil at the stop, or the error.
local function session(b)
    local sub_conn, err = b.client:subscriber()
    if not sub_conn then
        return err or "no subscriber"
    end
    sub_conn.confirmations = true
    b.subscribed = {}
    local ok
    ok, err = subscribe_new(b, sub_conn)
    if not ok then
        sub_conn:close()
        return err
    end
    while true do
        if stopping() then
            sub_conn:close()
            return nil
        end
        if b.subscribed_n ~= b.ntopics then -- (declared since: a broadcast made in a handler)
            ok, err = subscribe_new(b, sub_conn)
            if not ok then
                sub_conn:close()
                return err
            end
        end
        local msg
        msg, err = sub_conn:next(READ_WAIT)
        if msg then
            if msg.kind == "message" then
                receive(b, msg.channel, msg.data)
            elseif msg.kind == "subscribe" and not b.up then
                local n = 0
                for _ in pairs(b.subscribed) do
                    n = n + 1
                end
                went_up(b, n)
            end
        elseif err ~= "timeout" then
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
    reconnect.loop(function() return session(b) end, function(err) went_down(b, err) end,
        stopping)
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

-- Sends up to BATCH queued publishes in one pipeline; true when Redis took them.
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
    return replies ~= nil and (sent > 0 or failed == 0)
end

-- Counts as failed what is still queued when the writer stops (publishes made while the
-- worker stops: the requests of its last seconds), and empties the queue.
local function drop_queue(b)
    local failed = 0
    for i = b.qh, b.qt do
        local m = b.q[i]
        if m and not m[3] then
            failed = failed + 1
        end
        b.q[i] = nil
    end
    b.qh, b.qt = 1, 0
    count("publish_failed", failed)
end

-- The writer task: sends what is queued, BATCH publishes to a pipeline. After a pipeline
-- Redis took nothing of, it waits as the reader does (moonserve.reconnect's backoff)
-- rather than connect again at the rate of the publishes; the queue's cap still holds. At the
-- worker's stop it sends what is left while Redis takes it, and counts the rest as failed
-- (what requests still under way publish after that, publish() sends itself).
local function writer(premature, b)
    if premature then
        b.writing = false
        drop_queue(b)
        return
    end
    local backoff = reconnect.backoff()
    while not stopping() do
        if b.qh > b.qt then
            b.waiting = true
            local woken = b.sema:wait(1) -- (a second at most: then it looks whether the
            b.waiting = false            -- worker stops)
            if not woken then
                heartbeats(b)
            end
        else
            if send(b) then
                backoff:reset()
            else
                backoff:wait()
            end
        end
    end
    while b.qh <= b.qt and send(b) do
    end
    b.writing = false
    drop_queue(b)
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
        local crypto = require "moonserve.crypto"
        sender = id .. "." .. crypto.hex(assert(crypto.random(4)))
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
        -- never get what it published. What Redis does not take counts as failed.
        while b.qh <= b.qt and send(b) do
        end
        drop_queue(b)
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
    add_topic(b, topic, { on_remote = enter })
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
    local seq, err = state():incr("b:" .. self.name, 1, 0)
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
    local last = state():get("b:" .. self.name) or 0
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
        self.next_seq = (state():get("b:" .. self.name) or 0) + 1
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
        add_topic(b, self.topic, {
            on_remote = function(payload) enter(self, payload) end,
            on_reset = function() reset(self) end,
        })
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
    local root = app
    while root.parent do
        root = root.parent
    end
    if not (root.shared_decl and root.shared_decl[_M.DICT]) then -- (the app's own size wins)
        app:shared_dict(_M.DICT, _M.DICT_SIZE)
    end
    app:shared_dict(_M.STATE_DICT, _M.STATE_DICT_SIZE)
    app:on_worker_start(function()
        _M.instance()
        for _, b in pairs(buses) do
            start(b)
        end
        for _, bc in pairs(broadcasts) do
            start_poller(bc)
        end
    end)
    local has, metrics = pcall(host.module, "metrics") -- (nginx has no metrics of ours)
    if has and metrics.section then
        metrics.section(_M.metrics_text)
    end
end

local FAMILIES = {
    { "published", "counter", "Messages sent to Redis for the other instances." },
    { "publish_failed", "counter", "Messages of this instance that Redis did not take "
        .. "(away, slow, or over the queue of a worker)." },
    { "received", "counter", "Messages from other instances entered into this instance." },
    { "missed", "counter", "Messages of other instances this instance never received (gaps "
        .. "in their numbers), as during an outage; and those a worker found no room to claim "
        .. "for in a full moonserve_fanout dictionary (counted by each worker)." },
    { "outages", "counter", "Times the subscription to Redis was lost." },
    { "resubscribed", "counter", "Subscriptions made again by a worker after an outage." },
    { "rejected", "counter", "Messages from other instances refused: over the channel's "
        .. "max_message_bytes, or text that is not UTF-8." },
    { "up", "gauge", "Workers whose subscription to Redis is up." },
}

--- Writes the fan-out's families (moonserve_fanout_*) into `out`, with the metrics' own
-- `family` and `sample` writers.
-- @local
function _M.metrics_text(out, family, sample)
    local d = state()
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
-- resubscribed, rejected, up).
function _M.stats()
    local d = state()
    local t = {}
    for _, f in ipairs(FAMILIES) do
        t[f[1]] = d and d:get("c:" .. f[1]) or 0
    end
    return t
end

return _M
