--- moonserve/pg/listen.lua: LISTEN/NOTIFY for moonserve.pg: one dedicated connection per client
-- and worker for all its subscriptions, owned by a background task, never a pooled one.
-- @module moonserve.pg.listen
local bit = require "bit"
local host = require "moonserve.host"
local reconnect = require "moonserve.reconnect"
local conn = require "moonserve.pg.conn"

local band, bor, lshift, rshift = bit.band, bit.bor, bit.lshift, bit.rshift
local byte, char, sub, find, format = string.byte, string.char, string.sub, string.find,
    string.format
local type, tostring, tonumber, pairs, ipairs, next, setmetatable, error = type, tostring,
    tonumber, pairs, ipairs, next, setmetatable, error
local remove = table.remove

local _M = {}

-- How often the writer looks whether the worker stops (it then closes the connection, which
-- ends the reader's wait), in seconds; and the reader's longest wait, in ms: an idle read
-- that times out is not an error (a day: inside nginx each timeout is a line of its log).
local TICK = 1
local READ_MS = 86400000

local function get32(s, at)
    local a, b, c, d = byte(s, at, at + 3)
    return bor(lshift(a, 24), lshift(b, 16), lshift(c, 8), d)
end

local function int32(n)
    return char(band(rshift(n, 24), 255), band(rshift(n, 16), 255), band(rshift(n, 8), 255),
        band(n, 255))
end

--- A channel's name quoted as an identifier ("notes", "a""b"): LISTEN takes no parameter.
function _M.quote(channel)
    return '"' .. channel:gsub('"', '""') .. '"'
end

local function log(level, msg)
    host.log(level, msg)
end

local function stopping()
    local d = host.module("dispatcher")
    return d.stopping ~= nil and d.stopping()
end

-- -- Subscriptions -------------------------------------------------------------------------

local Sub = {}
Sub.__index = Sub

local WEAK = { __mode = "k" }

--- The next notification: payload, channel; or nil and "timeout" when none came within
-- `timeout` seconds (default: wait until one comes); nil, "lost", n once when messages were
-- lost before the ones still queued: n (a number) the oldest the bounded queue dropped, or
-- nil when the connection to the server was lost (and has been made again); nil and
-- "closed" after sub:close(), or once the worker stops.
function Sub:next(timeout)
    while true do
        if self.closed then
            return nil, "closed"
        end
        if self.lost then
            local n = self.lost
            self.lost = nil
            return nil, "lost", n ~= true and n or nil
        end
        local h = self.head
        if h <= self.tail then
            local m = self.q[h]
            self.q[h] = nil
            self.head = h + 1
            return m[1], m[2]
        end
        -- (no timeout: an hour at a time, as a semaphore's wait inside nginx takes a C int
        -- of ms)
        local ok = self.sema:wait(timeout or 3600)
        if not ok and timeout then
            return nil, "timeout"
        end
    end
end

-- Queues a notification, dropping the oldest past the bound; wakes a waiting reader.
local function push(s, payload, channel)
    if s.tail - s.head + 1 >= s.max then
        s.q[s.head] = nil
        s.head = s.head + 1
        if s.lost ~= true then
            s.lost = (s.lost or 0) + 1
        end
    end
    s.tail = s.tail + 1
    s.q[s.tail] = { payload, channel }
    if s.sema:count() < 0 then
        s.sema:post(1)
    end
end

local function wake(s)
    if s.sema:count() < 0 then
        s.sema:post(1)
    end
end

--- Ends the subscription: no more notifications are queued for it; the last one of its
-- channel in this worker sends UNLISTEN.
function Sub:close()
    if self.closed then
        return true
    end
    self.closed = true
    local L = self.listener
    local set = L.subs[self.channel]
    if set then
        set[self] = nil
        if next(set) == nil then
            L.subs[self.channel] = nil
            L.cmd:post(1)
        end
    end
    wake(self)
    return true
end

-- -- The listener: one connection and its task -------------------------------------------

-- Whether `channel` has a subscriber. (A channel's set holds its subscriptions weakly: one
-- that a handler dropped without closing it, as when the handler raised, is collected with
-- its queue, and its channel's UNLISTEN follows.)
local function wanted(L, channel)
    local set = L.subs[channel]
    return set ~= nil and next(set) ~= nil
end

local function any_wanted(L)
    for channel in pairs(L.subs) do
        if wanted(L, channel) then
            return true
        end
    end
    return false
end

-- What the server has been asked: LISTEN for each channel with subscribers, UNLISTEN for
-- each it listens to with none. Returns the commands sent (a list), or nil and an error.
local function sync(L, c)
    local cmds = {}
    for channel in pairs(L.subs) do
        if not wanted(L, channel) then
            L.subs[channel] = nil
        elseif not L.listening[channel] and not L.asked[channel] then
            cmds[#cmds + 1] = { "LISTEN", channel }
        end
    end
    for channel in pairs(L.listening) do
        if not wanted(L, channel) and not L.asked[channel] then
            cmds[#cmds + 1] = { "UNLISTEN", channel }
        end
    end
    for _, cmd in ipairs(cmds) do
        L.asked[cmd[2]] = true
        L.sent[#L.sent + 1] = cmd
        local sql = cmd[1] .. " " .. _M.quote(cmd[2])
        local ok, err = c:send("Q" .. int32(#sql + 5) .. sql .. "\0")
        if not ok then
            return nil, err
        end
    end
    return true
end

-- Tells the subscribers waiting for `channel`'s LISTEN that it is done (or failed).
local function acked(L, cmd, err)
    local channel = cmd[2]
    L.asked[channel] = nil
    if cmd[1] == "UNLISTEN" then
        if not err then
            L.listening[channel] = nil
        end
        if wanted(L, channel) then
            L.cmd:post(1) -- subscribed again meanwhile: LISTEN again
        end
        return
    end
    if not err then
        L.listening[channel] = true
    end
    for s in pairs(L.subs[channel] or {}) do
        if s.pending then
            s.pending = nil
            s.err = err
            s.ready:post(1)
        end
    end
end

-- Reads the server's messages until the connection fails or the worker stops.
local function read_loop(L, c)
    local sock = c.sock
    while true do
        local head, err, partial = sock:receive(5)
        if not head then
            if L.closing then
                return nil
            end
            if err ~= "timeout" or (partial and partial ~= "") then
                return err
            end
        else
            local len = get32(head, 2) - 4
            local body = ""
            if len > 0 then
                if len > 1048576 then
                    return "a message of " .. len .. " bytes"
                end
                body, err = sock:receive(len)
                if not body then
                    return not L.closing and err or nil
                end
            end
            local kind = sub(head, 1, 1)
            if kind == "A" then
                -- NotificationResponse: sender's pid, channel, payload
                local stop = find(body, "\0", 5, true) or #body
                local channel = sub(body, 5, stop - 1)
                local payload = sub(body, stop + 1, -2)
                for s in pairs(L.subs[channel] or {}) do
                    push(s, payload, channel)
                end
            elseif kind == "E" then
                local e = { message = "?" }
                for k, v in body:gmatch("(.)([^%z]*)%z") do
                    if k == "C" then
                        e.code = v
                    elseif k == "M" then
                        e.message = v
                    elseif k == "S" then
                        e.severity = v
                    end
                end
                e = setmetatable(e, conn.Error)
                if e.severity == "FATAL" or e.severity == "PANIC" then
                    return tostring(e)
                end
                L.failed = e
            elseif kind == "Z" then
                local cmd = remove(L.sent, 1)
                if cmd then
                    acked(L, cmd, L.failed)
                end
                L.failed = nil
            end
            -- (CommandComplete, ParameterStatus, NoticeResponse: nothing to do)
        end
    end
end

-- One connection's life: connect, LISTEN what is subscribed, deliver until it is lost.
-- Returns nil when the worker stops, or the error that ended it.
local function session(L)
    local o = {}
    for k, v in pairs(L.pg.opts) do
        o[k] = v
    end
    -- (a pool of its own that no query shares, and the connection never goes back to it)
    o.pool = o.pool .. "\0listen"
    o.on_notice = nil
    local c, err = conn.connect(o)
    if not c then
        return tostring(err)
    end
    c.sock:settimeouts(o.connect_ms, o.timeout, READ_MS)
    L.listening, L.asked, L.sent, L.failed = {}, {}, {}, nil
    local d = host.module("dispatcher")
    local result
    local reader = d.spawn(function()
        result = read_loop(L, c)
        L.dead = true
        L.cmd:post(1)
    end)
    L.dead = false
    L.up = true
    if L.down_since then
        local n = 0
        for channel in pairs(L.subs) do
            n = n + (wanted(L, channel) and 1 or 0)
        end
        log("warn", format("pg: notifications: connected again after %.1f s; LISTEN again on "
            .. "%d channel(s)", host.now() - L.down_since, n))
        L.down_since = nil
    end
    local failed
    while not L.dead do
        local ok
        ok, err = sync(L, c)
        if not ok then
            failed = err
            break
        end
        L.cmd:wait(TICK)
        if stopping() then
            L.closing = true
            break
        end
    end
    L.up = false
    -- (a close from this thread ends the reader's wait)
    c.sock:close()
    d.wait(reader)
    L.closing = false
    if stopping() then
        return nil
    end
    return failed or result or "closed"
end

-- The background task: sessions one after another, with backoff between failures, until
-- the worker stops.
local function run(premature, L)
    if premature then
        L.running = false
        return
    end
    reconnect.loop(function() return session(L) end, function(err)
        if not L.down_since then
            L.down_since = host.now()
            log("warn", "pg: notifications: the connection to the server was lost (" .. err
                .. "); reconnecting, and every subscriber is told that messages may be lost")
        end
        -- every subscriber: messages sent meanwhile are lost; subscribers still waiting for
        -- their LISTEN are answered with the error
        for _, set in pairs(L.subs) do
            for s in pairs(set) do
                if s.pending then
                    s.pending = nil
                    s.err = err
                    s.ready:post(1)
                else
                    s.lost = true
                    wake(s)
                end
            end
        end
        -- (no one to listen for: the loop ends, and the next listen starts the task again)
        return any_wanted(L)
    end, stopping)
    L.running = false
    if stopping() then
        -- The worker stops: its streams end now rather than at the stop timeout (their
        -- clients reconnect to the workers that serve on).
        for _, set in pairs(L.subs) do
            for s in pairs(set) do
                s.closed = true
                wake(s)
            end
        end
        L.subs = {}
    end
end

local function start(L)
    if L.running then
        return true
    end
    L.running = true
    L.closing = false
    local ok, err = host.module("timer").at(0, run, L)
    if not ok then
        L.running = false
        return nil, err
    end
    return true
end

-- The listener of a pg client in this worker.
local function listener(pg)
    local L = pg._listener
    if not L then
        L = { pg = pg, subs = {}, listening = {}, asked = {}, sent = {},
            cmd = host.module("semaphore").new(0), running = false }
        pg._listener = L
    end
    return L
end

--- pg:listen(channel, opts): a subscription to `channel` (LISTEN on the client's own
-- connection for notifications), once the server has taken the LISTEN. opts.queue: the
-- notifications kept for a slow reader (default the client's listen_queue, 1000); past it
-- the oldest are dropped and the reader told (sub:next returns nil, "lost", n). Returns the
-- subscription, or nil and an error.
function _M.listen(pg, channel, opts)
    if type(channel) ~= "string" or channel == "" or find(channel, "\0", 1, true) then
        error("bad argument #1 to 'listen' (a channel's name expected)", 3)
    end
    opts = opts or {}
    local max = opts.queue or tonumber(pg.opts.listen_queue) or 1000
    if type(max) ~= "number" or max < 1 then
        error("bad queue (a positive number expected)", 3)
    end
    local L = listener(pg)
    local sem = host.module("semaphore")
    local s = setmetatable({ listener = L, channel = channel, q = {}, head = 1, tail = 0,
        max = max, sema = sem.new(0), ready = sem.new(0) }, Sub)
    local set = L.subs[channel]
    if not set then
        set = setmetatable({}, WEAK)
        L.subs[channel] = set
    end
    set[s] = true
    if L.up and L.listening[channel] and not L.asked[channel] then
        return s
    end
    s.pending = true
    local ok, err = start(L)
    if not ok then
        s:close()
        return nil, conn.client_error("08001", "pg: listen: " .. tostring(err))
    end
    L.cmd:post(1)
    ok = s.ready:wait(pg.opts.connect_timeout + (pg.opts.timeout / 1000))
    if not ok or s.err then
        err = s.err or "no answer to LISTEN"
        s:close()
        if type(err) == "table" then
            return nil, err
        end
        return nil, conn.client_error("08001", "pg: listen: " .. tostring(err))
    end
    return s
end

--- pg:notify(channel, payload): NOTIFY through a pooled connection (pg_notify, so that the
-- channel and payload are parameters). Returns true, or nil and an error.
function _M.notify(pg, channel, payload)
    if type(channel) ~= "string" then
        error("bad argument #1 to 'notify' (a channel's name expected)", 3)
    end
    local r, err = pg:query("SELECT pg_notify($1, $2)", channel, payload or "")
    if not r then
        return nil, err
    end
    return true
end

return _M
