--- moonserve/redis/init.lua: `moonserve.redis`, a Redis client over the host's pooled sockets:
-- RESP2, one round trip a call (a command, a pipeline or a script), AUTH and SELECT once per
-- new connection, TLS, unix sockets, Sentinel, and pub/sub on a connection of its own.
-- @module moonserve.redis
local host = require "moonserve.host"
local resp = require "moonserve.redis.resp"
local url = require "moonserve.redis.url"
local crypto = require "moonserve.crypto"
local bit = require "bit"

local byte, format, find, sub = string.byte, string.format, string.find, string.sub
local type, tostring, tonumber, setmetatable, error, ipairs = type, tostring, tonumber,
    setmetatable, error, ipairs
local floor = math.floor
local bxor, tobit, tohex = bit.bxor, bit.tobit, bit.tohex
local encode, read, is_error, Err = resp.encode, resp.read, resp.is_error, resp.Err
-- A command's pieces go into a list made with room for them (a command of n words has
-- 1 + 3n): one grown from empty is rehashed at its 1st, 2nd, 3rd, 5th, 9th and 17th piece.
local ok_new, new_tab = pcall(require, "table.new")
if not ok_new then
    new_tab = function() return {} end
end

local _M = {}

--- A nil bulk or multi-bulk reply (the same value as moonserve.json.null).
_M.null = resp.null

--- Whether a pipeline's reply is an error reply (its text in .error).
_M.is_error = is_error

--- Parses and checks options without making a client: the options, or nil and the error line
-- (what `moonserve --check` and `app:shared_dict` use).
_M.options = url.options

local Client = {}
Client.__index = Client
_M.Client = Client

-- FNV-1a over a string, as hex: a pool's name tells credentials apart without holding them.
local function fnv(s)
    local h = tobit(2166136261)
    for i = 1, #s do
        h = tobit(bxor(h, byte(s, i)) * 16777619)
    end
    return tohex(h)
end

--- A client: its options checked at once, no I/O until the first call. spec: a URL
-- (redis://, rediss://, redis+unix://, redis+sentinel://) or a table; opts: options over it.
-- Returns the client, or nil and one line ("redis: ...").
function _M.new(spec, opts)
    local o, err = url.options(spec, opts)
    if not o then
        return nil, err
    end
    local ms = floor(o.timeout * 1000)
    local self = setmetatable({ o = o, ms = ms, idle_ms = floor(o.idle_timeout * 1000),
        primary = nil, sentinel_at = 1, recheck_at = 0 }, Client)
    -- What tells this client's connections from others' in a pool: the address comes first,
    -- then the database and whose credentials (hashed, never in a name).
    self.key_tail = format("/%d/%s/%s/%s", o.db, o.user or "", fnv((o.user or "") .. "\0"
        .. (o.password or "")), o.tls and ("tls:" .. (o.sni or "") .. (o.insecure and ":i" or ""))
        or "")
    if o.sentinels then
        self.sentinels = {}
        for i, s in ipairs(o.sentinels) do
            local h, p = url.host_port(s, url.DEFAULTS.sentinel_port)
            self.sentinels[i] = { host = h, port = p }
        end
    end
    return self
end

-- Key prefixes in use in this process, by where their keys live (server and db): a prefix
-- that starts another would let one user's SCAN, flush or count take the other's keys.
local claimed = {}

--- Claims `prefix` on the client's server and db for `owner` (a name for messages): nil and
-- one line when it starts, or starts with, a prefix another owner claimed there.
function _M.claim_prefix(client, prefix, owner)
    local o = type(client) == "table" and type(client.o) == "table" and client.o or {}
    local place = format("%s:%s/%s", tostring(o.path or o.master or o.host),
        tostring(o.port), tostring(o.db))
    local mine = claimed[place]
    if not mine then
        mine = {}
        claimed[place] = mine
    end
    for p, who in pairs(mine) do
        if who ~= owner and (sub(p, 1, #prefix) == prefix or sub(prefix, 1, #p) == p) then
            return nil, format("%s: key prefix %q overlaps %s's %q (one would see, count or "
                .. "delete the other's keys): give one of them another prefix", owner, prefix,
                who, p)
        end
    end
    mine[prefix] = owner
    return true
end

-- -- Connections ---------------------------------------------------------------------------

local sockets -- the host's socket module, once asked for

local function tcp(self)
    if not sockets then
        sockets = host.module("socket")
    end
    local sock, err = sockets.tcp()
    if not sock then
        return nil, err
    end
    sock:settimeouts(self.ms, self.ms, self.ms)
    return sock
end

-- Sends commands and reads as many replies on `sock`: a list, or nil and an error.
local function exchange(sock, cmds)
    local parts, n = new_tab(16, 0), 0
    for i = 1, #cmds do
        n = encode(cmds[i], parts, n)
    end
    local ok, err = sock:send(parts)
    if not ok then
        return nil, err
    end
    local out = {}
    for i = 1, #cmds do
        local v
        v, err = read(sock)
        if v == nil then
            return nil, err
        end
        out[i] = v
    end
    return out
end

-- Asks the sentinels, in turn from the last that answered, for the primary's address.
local function ask_sentinels(self)
    local o = self.o
    local list = self.sentinels
    local last = "no answer"
    for k = 0, #list - 1 do
        local i = (self.sentinel_at - 1 + k) % #list + 1
        local s = list[i]
        local sock, err = tcp(self)
        if sock then
            local ok
            ok, err = sock:connect(s.host, s.port, { pool = format("redis-sentinel %s:%d",
                s.host, s.port), pool_size = 4 })
            if ok then
                local cmds = {}
                if sock:getreusedtimes() == 0 and o.sentinel_password then
                    cmds[1] = o.sentinel_user
                        and { "AUTH", o.sentinel_user, o.sentinel_password }
                        or { "AUTH", o.sentinel_password }
                end
                cmds[#cmds + 1] = { "SENTINEL", "get-master-addr-by-name", o.master }
                local out
                out, err = exchange(sock, cmds)
                if out then
                    local addr = out[#out]
                    if #cmds == 2 and is_error(out[1]) then
                        err = "AUTH: " .. out[1].error
                        sock:close()
                    elseif is_error(addr) then
                        err = addr.error
                        sock:setkeepalive(self.idle_ms, 4)
                    elseif type(addr) == "table" and addr[1] and tonumber(addr[2]) then
                        sock:setkeepalive(self.idle_ms, 4)
                        self.sentinel_at = i
                        self.recheck_at = host.now() + o.sentinel_recheck
                        self.primary = { host = addr[1], port = tonumber(addr[2]) }
                        return self.primary
                    else
                        err = "it knows no master " .. format("%q", o.master)
                        sock:setkeepalive(self.idle_ms, 4)
                    end
                else
                    sock:close()
                end
            end
        end
        last = format("%s:%d: %s", s.host, s.port, tostring(err))
    end
    return nil, "redis: no sentinel gave the primary of " .. format("%q", o.master) .. " ("
        .. last .. ")"
end

-- Where the client's server is: host and port (a unix socket's host is "unix:PATH"), the
-- primary behind Sentinel as last asked; or nil and an error.
local function address(self)
    local o = self.o
    if o.path then
        return "unix:" .. o.path
    elseif self.sentinels then
        local primary = self.primary
        if not primary then
            local err
            primary, err = ask_sentinels(self)
            if not primary then
                return nil, err
            end
        end
        return primary.host, primary.port
    end
    return o.host, o.port
end

-- The TLS handshake on a new connection to `h`: true, or nil and an error (the socket closed,
-- the address to be found anew).
local function tls(self, sock, h)
    local o = self.o
    local ok, err = sock:sslhandshake(false, o.sni or (not o.path and h or nil), not o.insecure)
    if not ok then
        sock:close()
        self.primary, self.target = nil, nil
        return nil, "TLS: " .. tostring(err)
    end
    return true
end

-- A connection ready for commands: the socket, or nil and an error. A new one is set up
-- first (TLS, AUTH, SELECT, and ROLE behind a sentinel) in one round trip.
local function connect(self)
    local o = self.o
    for attempt = 1, 2 do
        local sock, err = tcp(self)
        if not sock then
            return nil, err
        end
        -- where to, and the connect's options: made once a target (a table and a string
        -- per call would be most of a call's garbage)
        local target = self.target
        if target and self.sentinels and o.sentinel_recheck > 0
            and host.now() >= self.recheck_at then
            -- A failover leaves the old primary up and taking writes until Sentinel turns it
            -- into a replica, which can take seconds: the sentinels are asked again, and a
            -- new address moves the calls to its own pool. (Sentinels that do not answer
            -- leave the primary as it is, asked again a period later.)
            self.recheck_at = host.now() + o.sentinel_recheck
            local primary = ask_sentinels(self)
            if primary and (primary.host ~= target.host or primary.port ~= target.port) then
                target, self.target = nil, nil
            end
        end
        if not target then
            local h, p = address(self)
            if not h then
                return nil, p
            end
            target = { host = h, port = p, opts = { pool = o.path and ("redis " .. h
                .. self.key_tail) or format("redis %s:%d%s", h, p, self.key_tail),
                pool_size = o.pool_size, backlog = o.backlog } }
            self.target = target
        end
        local h, p = target.host, target.port
        local ok
        ok, err = sock:connect(h, p, target.opts)
        if not ok then
            self.primary, self.target = nil, nil
            return nil, err
        end
        if sock:getreusedtimes() > 0 then
            return sock, nil, true
        end
        if o.tls then
            ok, err = tls(self, sock, h)
            if not ok then
                return nil, err
            end
        end
        local cmds = {}
        if o.password then
            cmds[1] = o.user and { "AUTH", o.user, o.password } or { "AUTH", o.password }
        end
        if o.db ~= 0 then
            cmds[#cmds + 1] = { "SELECT", o.db }
        end
        if self.sentinels then
            cmds[#cmds + 1] = { "ROLE" }
        end
        if #cmds == 0 then
            return sock, nil, false
        end
        local out
        out, err = exchange(sock, cmds)
        if not out then
            sock:close()
            self.primary, self.target = nil, nil
            return nil, err
        end
        for i = 1, #cmds do
            if is_error(out[i]) then
                sock:close()
                return nil, format("redis: %s: %s", cmds[i][1], out[i].error)
            end
        end
        local role = self.sentinels and out[#out]
        if not role or (type(role) == "table" and role[1] == "master") then
            return sock, nil, false
        end
        -- a sentinel's answer from before a failover: ask again, once
        sock:close()
        self.primary, self.target = nil, nil
        if attempt == 2 then
            return nil, format("redis: %s:%d is a %s, not the primary", h, p,
                type(role) == "table" and tostring(role[1]) or "?")
        end
    end
end

-- Whether an error from the stream means a pooled connection had died before this call
-- used it (the server restarted or dropped idle ones): the call may go again on another.
local function stale(err)
    return err == "closed" or err == "connection reset by peer" or err == "broken pipe"
end

-- Commands that change nothing: the only ones sent again after a stale connection. The pool
-- drops an idle connection as soon as its close arrives, so a call finds one closed only when
-- the close crossed it, and then Redis may have run a write before it closed (an INCR would
-- count twice).
local READ_ONLY = {}
for verb in ([[GET MGET GETRANGE STRLEN EXISTS TTL PTTL EXPIRETIME PEXPIRETIME TYPE SCAN
    KEYS DBSIZE PING ECHO TIME HGET HMGET HGETALL HKEYS HVALS HLEN HEXISTS HSTRLEN HSCAN
    LRANGE LLEN LINDEX LPOS SMEMBERS SISMEMBER SMISMEMBER SCARD SRANDMEMBER SSCAN ZRANGE
    ZRANGEBYSCORE ZREVRANGE ZREVRANGEBYSCORE ZRANGEBYLEX ZSCORE ZMSCORE ZCARD ZCOUNT ZRANK
    ZREVRANK ZSCAN ZLEXCOUNT PFCOUNT GETBIT BITCOUNT BITPOS XRANGE XREVRANGE XLEN
    EVALSHA_RO EVAL_RO]]):gmatch("%S+") do
    READ_ONLY[verb] = true
end

local function read_only(cmds, single)
    if single then
        return type(single[1]) == "string" and READ_ONLY[single[1]:upper()] == true
    end
    for i = 1, #cmds do
        local verb = cmds[i][1]
        if type(verb) ~= "string" or not READ_ONLY[verb:upper()] then
            return false
        end
    end
    return true
end

local function readonly(v)
    return is_error(v) and find(v.error, "READONLY", 1, true) ~= nil
end

-- One try of run(): the replies, or nil and an error; or, as a third result, why to try
-- again: "stale" (a pooled connection found dead before any byte of a reply came, for
-- read-only commands, while `tries` > 1) or "readonly" (a primary turned replica refused
-- the writes, and nothing happened: ask the sentinels anew, once).
local function try(self, cmds, single, count, tries, asked)
    local sock, err, reused = connect(self)
    if not sock then
        return nil, err
    end
    local parts = new_tab(single and 1 + 3 * #single or 16, 0)
    if single then
        encode(single, parts, 0)
    else
        local n = 0
        for i = 1, count do
            n = encode(cmds[i], parts, n)
        end
    end
    local ok, partial
    ok, err = sock:send(parts)
    local out
    if ok then
        if single then
            out, err, partial = read(sock)
        else
            out = {}
            for i = 1, count do
                local v
                v, err, partial = read(sock)
                if v == nil then
                    partial = partial or i > 1
                    break
                end
                out[i] = v
            end
        end
    end
    if err then
        sock:close()
        if reused and not partial and stale(err) and tries > 1 and read_only(cmds, single) then
            return nil, err, "stale"
        end
        self.primary, self.target = nil, nil
        return nil, err
    end
    if not sock:setkeepalive(self.idle_ms, self.o.pool_size) then
        sock:close()
    end
    if not self.sentinels or asked then
        return out
    end
    local ro = false
    if single then
        ro = readonly(out)
    else
        for i = 1, count do
            if readonly(out[i]) then
                ro = true
                break
            end
        end
    end
    if not ro then
        return out
    end
    self.primary, self.target = nil, nil
    return nil, nil, "readonly"
end

-- Runs `cmds` in one round trip on a pooled connection: the list of replies, or nil and an
-- error. A pooled connection found dead before any byte of a reply came is replaced for
-- read-only commands (up to pool_size times); a READONLY reply (a primary turned replica
-- under a sentinel) makes the client ask anew once. (The loop is entered only for a second
-- try: a loop on every call's way would keep LuaJIT from compiling the call with its caller.)
local function run(self, cmds, single)
    local count = single and 1 or #cmds
    local tries, asked = self.o.pool_size + 1, false
    local out, err, again = try(self, cmds, single, count, tries, asked)
    while again do
        if again == "stale" then
            tries = tries - 1
        else
            asked = true
        end
        out, err, again = try(self, cmds, single, count, tries, asked)
    end
    return out, err
end

-- -- Calls ---------------------------------------------------------------------------------

-- Commands that leave a connection in another state than the pool promises (its db and user,
-- in step with one reply per command): refused in call and pipeline, since the connection
-- goes back to the pool for the next borrower. Pub/sub has subscribe(); db and user are the
-- client's options; MULTI is allowed in a pipeline that also ends it (EXEC or DISCARD).
local STATEFUL = {
    SUBSCRIBE = "use subscribe()", PSUBSCRIBE = "use psubscribe()",
    SSUBSCRIBE = "use subscribe()", MONITOR = "it streams without end", SYNC = "replication",
    PSYNC = "replication", SELECT = "the db is the client's option", AUTH = "the user is "
    .. "the client's option", HELLO = "the client speaks RESP2", RESET = "the pool keeps "
    .. "AUTH and SELECT", WATCH = "it spans round trips", MULTI = "pipeline it with EXEC",
}

-- Raises for a command that would change the pooled connection's state (see STATEFUL).
local function check_stateless(cmds, level)
    local open = false
    for i = 1, #cmds do
        local verb = type(cmds[i]) == "table" and cmds[i][1]
        verb = type(verb) == "string" and verb:upper() or ""
        local why = STATEFUL[verb]
        if verb == "MULTI" and #cmds > 1 then
            why, open = nil, true
        elseif verb == "EXEC" or verb == "DISCARD" then
            open = false
        elseif verb == "CLIENT" and type(cmds[i][2]) == "string"
            and cmds[i][2]:upper() == "REPLY" then
            why = "replies must stay one per command"
        end
        if why then
            error(format("redis: %s is refused on a pooled connection (%s)", verb, why),
                level + 1)
        end
    end
    if open then
        error("redis: MULTI is refused on a pooled connection (end it with EXEC or DISCARD "
            .. "in the same pipeline)", level + 1)
    end
end

--- One command: its reply (a string, a number, a table, redis.null); nil, "ERR ...", true
-- for an error reply; nil and an error ("timeout", "closed", ...) for a failure. Commands
-- that change the connection's state (SUBSCRIBE, PSUBSCRIBE, MONITOR, SELECT, AUTH, HELLO,
-- RESET, WATCH, MULTI, CLIENT REPLY) raise an error: the connection goes back to the pool.
-- @usage local v, err = r:call("SET", "k", "v", "EX", 10)
function Client:call(...)
    local cmd = { ... }
    check_stateless({ cmd }, 2)
    local v, err = run(self, nil, cmd)
    if v == nil then
        return nil, err
    end
    if is_error(v) then
        return nil, v.error, true
    end
    return v
end

--- Several commands, one round trip: a list of replies (an error reply as a value for which
-- redis.is_error is true), or nil and an error. Refuses what call refuses, except MULTI
-- when the pipeline also ends it with EXEC or DISCARD (a transaction in one round trip).
function Client:pipeline(cmds)
    if type(cmds) ~= "table" then
        error("bad argument #1 to 'pipeline' (a list of commands expected)", 2)
    end
    if #cmds == 0 then
        return {}
    end
    check_stateless(cmds, 2)
    return run(self, cmds)
end

--- A server-side script: its source and SHA-1 for EVALSHA.
function _M.script(src)
    if type(src) ~= "string" then
        error("bad argument #1 to 'script' (string expected)", 2)
    end
    local sha = crypto.hex(crypto.sha1(src))
    return { src = src, sha = sha }
end

-- The arguments of EVALSHA or EVAL: what, numkeys, keys..., args...
local function eval_cmd(verb, body, keys, args)
    local nk, na = #keys, #args
    local cmd = new_tab(3 + nk + na, 0) -- (sized: appending past a constructor's rehashes)
    cmd[1], cmd[2], cmd[3] = verb, body, nk
    for i = 1, nk do
        cmd[3 + i] = keys[i]
    end
    for i = 1, na do
        cmd[3 + nk + i] = args[i]
    end
    return cmd
end

--- Runs a script (redis.script) with keys and args: EVALSHA, and EVAL once when the server
-- has not seen it (NOSCRIPT). Returns as call does.
function Client:eval(script, keys, args)
    if type(script) ~= "table" or not script.sha then
        error("bad argument #1 to 'eval' (a redis.script expected)", 2)
    end
    keys, args = keys or {}, args or {}
    local v, err = run(self, nil, eval_cmd("EVALSHA", script.sha, keys, args))
    if v == nil then
        return nil, err
    end
    if is_error(v) and sub(v.error, 1, 8) == "NOSCRIPT" then
        v, err = run(self, nil, eval_cmd("EVAL", script.src, keys, args))
        if v == nil then
            return nil, err
        end
    end
    if is_error(v) then
        return nil, v.error, true
    end
    return v
end

-- -- Pub/sub -------------------------------------------------------------------------------

local Sub = {}
_M.Sub = Sub
Sub.__index = Sub

-- A day: a wait with no timeout given (inside nginx each timeout is a line of its log).
local FOREVER_MS = 86400000

--- A subscriber on a connection of its own (never from the pool): nil and an error if the
-- connection cannot be made.
function Client:subscriber()
    local o = self.o
    local sock, err = tcp(self)
    if not sock then
        return nil, err
    end
    local h, p = address(self)
    if not h then
        return nil, p
    end
    local ok
    ok, err = sock:connect(h, p)
    if not ok then
        self.primary, self.target = nil, nil
        return nil, err
    end
    if o.tls then
        ok, err = tls(self, sock, h)
        if not ok then
            return nil, err
        end
    end
    if o.password then
        local out
        out, err = exchange(sock, { o.user and { "AUTH", o.user, o.password }
            or { "AUTH", o.password } })
        if not out or is_error(out[1]) then
            sock:close()
            return nil, out and ("redis: AUTH: " .. out[1].error) or err
        end
    end
    return setmetatable({ sock = sock, ms = self.ms, closed = false }, Sub)
end

local function sub_send(self, verb, ...)
    if self.closed then
        return nil, "closed"
    end
    local cmd = { verb, ... }
    local parts = {}
    encode(cmd, parts, 0)
    local ok, err = self.sock:send(parts)
    if not ok then
        self:close()
        return nil, err
    end
    return true
end

--- Subscribes to channels; their confirmations are read (and skipped) by next().
function Sub:subscribe(...)
    return sub_send(self, "SUBSCRIBE", ...)
end

function Sub:psubscribe(...)
    return sub_send(self, "PSUBSCRIBE", ...)
end

--- Unsubscribes from the channels given (from all without any).
function Sub:unsubscribe(...)
    return sub_send(self, "UNSUBSCRIBE", ...)
end

function Sub:punsubscribe(...)
    return sub_send(self, "PUNSUBSCRIBE", ...)
end

--- The next message within `timeout` seconds (default: until one comes): { kind =
-- "message" | "pmessage", channel =, pattern =, data = }; nil and "timeout"; nil and "closed"
-- when the connection is gone (or an error from it). With `sub.confirmations = true` the
-- confirmations come too: { kind = "subscribe" | "psubscribe", channel =, count = }.
function Sub:next(timeout)
    if self.closed then
        return nil, "closed"
    end
    local sock = self.sock
    local wait = timeout and floor(timeout * 1000) or FOREVER_MS
    while true do
        -- The wait for a message's first line may end in a timeout with the connection kept;
        -- the rest of a message then comes within the client's timeout, or the link is lost.
        sock:settimeouts(self.ms, self.ms, wait > 0 and wait or 1)
        local first, err, partial = sock:receive(1)
        if not first then
            if err == "timeout" and (partial == nil or partial == "") then
                return nil, "timeout"
            end
            self:close()
            return nil, err == "timeout" and "closed" or err
        end
        sock:settimeouts(self.ms, self.ms, self.ms)
        local line = sock:receive()
        local v = line and read(sock, first .. line)
        if type(v) ~= "table" or is_error(v) or v == resp.null then
            -- anything but an array here is an error reply or a broken stream
            self:close()
            if is_error(v) then
                return nil, v.error
            end
            return nil, "closed"
        end
        local kind = v[1]
        if kind == "message" then
            return { kind = "message", channel = v[2], data = v[3] }
        elseif kind == "pmessage" then
            return { kind = "pmessage", pattern = v[2], channel = v[3], data = v[4] }
        elseif self.confirmations and (kind == "subscribe" or kind == "psubscribe") then
            return { kind = kind, channel = v[2], count = v[3] }
        end
        -- subscribe, unsubscribe, pong...: confirmations, not messages
    end
end

--- Closes the subscriber's connection.
function Sub:close()
    if not self.closed then
        self.closed = true
        self.sock:close()
    end
    return true
end

_M.Err = Err

return _M
