--- moonserve/pg/conn.lua: one PostgreSQL session over the host's sockets: the v3 protocol's
-- startup (TLS, authentication), simple and extended queries, a statement cache, cancel.
-- @module moonserve.pg.conn
local bit = require "bit"
local host = require "moonserve.host"
local types = require "moonserve.pg.types"
local json_array = require("moonserve.json").array

local band, bor, rshift, lshift = bit.band, bit.bor, bit.rshift, bit.lshift
local byte, char, sub, find = string.byte, string.char, string.sub, string.find
local concat = table.concat
local tonumber, tostring, type, setmetatable = tonumber, tostring, type, setmetatable
local NULL = types.NULL

local _M = {}

local Conn = {}
Conn.__index = Conn

-- -- Errors --------------------------------------------------------------------------------

-- ErrorResponse and NoticeResponse field codes (protocol-error-fields.html).
local FIELDS = {
    S = "severity", V = "severity_nonlocalized", C = "code", M = "message", D = "detail",
    H = "hint", P = "position", p = "internal_position", q = "internal_query", W = "where",
    s = "schema", t = "table", c = "column", d = "data_type", n = "constraint", F = "file",
    L = "line", R = "routine",
}

local Err = {}
Err.__index = Err
Err.__tostring = function(e)
    return (e.severity or "ERROR") .. " " .. (e.code or "?????") .. ": " .. (e.message or "?")
end
_M.Error = Err

-- A client-side error, in the server's shape: SQLSTATE class 08 for the connection's failures.
local function client_error(code, message)
    return setmetatable({ severity = "ERROR", code = code, message = message, client = true }, Err)
end
_M.client_error = client_error

local function server_error(body)
    local e = {}
    local at, len = 1, #body
    while at <= len do
        local k = sub(body, at, at)
        if k == "\0" then
            break
        end
        local stop = find(body, "\0", at + 1, true) or len + 1
        e[FIELDS[k] or k] = sub(body, at + 1, stop - 1)
        at = stop + 1
    end
    if e.position then
        e.position = tonumber(e.position)
    end
    return setmetatable(e, Err)
end

-- -- Messages ------------------------------------------------------------------------------

local function int32(n)
    return char(band(rshift(n, 24), 255), band(rshift(n, 16), 255), band(rshift(n, 8), 255),
        band(n, 255))
end

local function int16(n)
    return char(band(rshift(n, 8), 255), band(n, 255))
end

local function get32(s, at) -- signed, as the protocol's Int32
    local a, b, c, d = byte(s, at, at + 3)
    return bor(lshift(a, 24), lshift(b, 16), lshift(c, 8), d)
end

local function get16(s, at)
    local a, b = byte(s, at, at + 1)
    return a * 256 + b
end

local function msg(kind, body)
    return kind .. int32(#body + 4) .. body
end

local SYNC = "S\0\0\0\4"

-- One message from the server: its type byte and body, or nil and the socket's error.
function Conn:read()
    local sock = self.sock
    local head, err = sock:receive(5)
    if not head then
        return nil, err
    end
    self.got = true
    local len = get32(head, 2) - 4
    if len < 0 or len > self.max_message then
        self.broken = true
        return nil, "a message of " .. len .. " bytes"
    end
    local body = ""
    if len > 0 then
        body, err = sock:receive(len)
        if not body then
            return nil, err
        end
    end
    return sub(head, 1, 1), body
end

function Conn:send(data)
    local ok, err = self.sock:send(data)
    if not ok then
        self.broken = true
        return nil, err
    end
    self.sent = true
    return true
end

-- Messages that may arrive at any time (protocol-flow.html, "Asynchronous Operations"):
-- ParameterStatus, NoticeResponse (to opts.on_notice), NotificationResponse (queued in
-- self.notifications, for a listener that loops on read() and async()). true when `kind`
-- was one of them.
function Conn:async(kind, body)
    if kind == "S" then
        local stop = find(body, "\0", 1, true)
        if stop then
            self.params[sub(body, 1, stop - 1)] = sub(body, stop + 1, -2)
        end
        return true
    elseif kind == "N" then
        local notice = server_error(body)
        if self.on_notice then
            self.on_notice(notice)
        end
        return true
    elseif kind == "A" and #body >= 4 then
        -- NotificationResponse: pid, channel, payload; kept for a listener
        local stop = find(body, "\0", 5, true) or #body
        local q = self.notifications
        q[#q + 1] = { pid = get32(body, 1), channel = sub(body, 5, stop - 1),
            payload = sub(body, stop + 1, -2) }
        return true
    end
    return false
end

-- -- Startup -------------------------------------------------------------------------------

-- What this worker knows of each session, by its socket's descriptor: a pooled connection
-- keeps its descriptor while it lives, and a new session on a descriptor replaces the entry.
local sessions = {}

local function fd_of(sock)
    local getfd = sock.getfd
    if getfd then
        local fd = getfd(sock)
        if fd then
            return fd
        end
    end
    return nil
end

-- SSLRequest (protocol-flow.html 55.2.10) and the handshake as `sslmode` asks.
local function negotiate_tls(c, o)
    local mode = o.sslmode
    if mode == "disable" then
        return true
    end
    local ok, err = c:send(int32(8) .. int32(80877103))
    if not ok then
        return nil, err
    end
    local answer
    answer, err = c.sock:receive(1)
    if not answer then
        return nil, err
    end
    if answer == "N" then
        if mode == "prefer" or mode == "allow" then
            return true
        end
        return nil, "the server does not accept TLS (sslmode=" .. mode .. ")"
    elseif answer ~= "S" then
        return nil, "bad answer to SSLRequest"
    end
    local verify = mode == "verify-ca" or mode == "verify-full"
    local name = mode == "verify-full" and o.host or nil
    ok, err = c.sock:sslhandshake(false, name, verify)
    if not ok then
        return nil, "TLS: " .. tostring(err)
    end
    c.tls = true
    return true
end

local function sasl(c, o, body)
    local auth = require "moonserve.pg.auth"
    local mechanisms = sub(body, 5)
    if not find(mechanisms, "SCRAM-SHA-256\0", 1, true) then
        return nil, "no SASL mechanism spoken here in " .. mechanisms:gsub("%z", " ")
    end
    local sc = auth.scram(o.password or "")
    local first = sc:first()
    local ok, err = c:send(msg("p", "SCRAM-SHA-256\0" .. int32(#first) .. first))
    if not ok then
        return nil, err
    end
    return sc
end

-- Startup and authentication (protocol-flow.html 55.2.1) on a new connection.
local function startup(c, o)
    local ok, err = negotiate_tls(c, o)
    if not ok then
        return nil, err
    end
    local parts = { int32(196608), "user\0", o.user, "\0database\0", o.database, "\0" }
    if o.application_name and o.application_name ~= "" then
        parts[#parts + 1] = "application_name\0" .. o.application_name .. "\0"
    end
    parts[#parts + 1] = "client_encoding\0UTF8\0\0"
    local body = concat(parts)
    ok, err = c:send(int32(#body + 4) .. body)
    if not ok then
        return nil, err
    end
    local sc, verified
    while true do
        local kind, b = c:read()
        if not kind then
            return nil, b
        end
        if (kind == "R" and (#b < 4 or (get32(b, 1) == 5 and #b < 8))) or (kind == "K" and #b < 8)
        then
            return nil, "a malformed message " .. kind .. " during startup"
        elseif kind == "R" then
            local code = get32(b, 1)
            if code == 0 then
                if sc and not verified then
                    return nil, "the server did not prove it knows the password (SCRAM)"
                end
            elseif code == 3 then
                ok, err = c:send(msg("p", (o.password or "") .. "\0"))
            elseif code == 5 then
                local auth = require "moonserve.pg.auth"
                ok, err = c:send(msg("p", auth.md5(o.user, o.password or "", sub(b, 5, 8)) .. "\0"))
            elseif code == 10 then
                sc, err = sasl(c, o, b)
                ok = sc
            elseif sc and (code == 11 and sc.state ~= "first" or code == 12 and sc.state ~= "final")
            then
                return nil, "SCRAM: the server's messages came out of order"
            elseif code == 11 and sc then
                local final
                final, err = sc:final(sub(b, 5))
                if final then
                    ok, err = c:send(msg("p", final))
                else
                    ok = nil
                end
            elseif code == 12 and sc then
                ok, err = sc:verify(sub(b, 5))
                verified = ok
            else
                return nil, "authentication method " .. code .. " is not spoken here"
            end
            if not ok then
                return nil, err
            end
        elseif kind == "K" then
            c.pid, c.secret = get32(b, 1), get32(b, 5)
        elseif kind == "E" then
            return nil, server_error(b)
        elseif kind == "Z" then
            c.status = sub(b, 1, 1)
            return true
        elseif not c:async(kind, b) then
            return nil, "unexpected message " .. kind .. " during startup"
        end
    end
end

--- Opens a session (from the host socket's pool when it holds one): a Conn, or nil and an error
-- table. o: host, port, user, password, database, sslmode, connect_timeout (s),
-- application_name, timeout (ms), pool, pool_size, backlog, statement_cache, numeric.
function _M.connect(o)
    local sock, err = host.module("socket").tcp()
    if not sock then
        return nil, client_error("08001", "pg: " .. tostring(err))
    end
    sock:settimeouts(o.connect_ms, o.timeout, o.timeout)
    local ok
    ok, err = sock:connect(o.host, o.port, { pool = o.pool, pool_size = o.pool_size,
        backlog = o.backlog })
    if not ok then
        return nil, client_error("08001", "pg: cannot connect to " .. o.host .. ":" .. o.port
            .. ": " .. tostring(err))
    end
    local c = setmetatable({ sock = sock, opts = o, status = "I", sent = false, got = false,
        broken = false, max_message = o.max_message or 1073741824, on_notice = o.on_notice,
        notifications = {} }, Conn)
    local reused = sock:getreusedtimes() or 0
    local fd = fd_of(sock)
    if reused > 0 then
        -- a session from the pool: what this worker knows of it, by its descriptor; on a
        -- host that gives none, no statement cache and no cancel key (a timeout closes it)
        local s = fd and sessions[fd]
        c.reused = reused
        if s then
            c.pid, c.secret, c.params, c.stmts, c.tls = s.pid, s.secret, s.params, s.stmts, s.tls
        else
            c.params = {}
        end
        return c
    end
    c.reused = 0
    c.params = {}
    if fd then
        c.stmts = { n = 0, tick = 0, by_sql = {}, next_name = 0 }
    end
    ok, err = startup(c, o)
    if not ok then
        sock:close()
        if type(err) == "table" then
            return nil, err
        end
        return nil, client_error("08001", "pg: " .. tostring(err))
    end
    c.sent, c.got = false, false
    fd = fd_of(sock) -- (the same one: TLS is set up on the connection it was made on)
    if fd then
        sessions[fd] = { pid = c.pid, secret = c.secret, params = c.params, stmts = c.stmts,
            tls = c.tls }
    end
    return c
end

--- Puts the connection back in the pool when its session is idle ('I') and sound; closes it
-- otherwise (in a transaction, failed or not, or after a broken exchange).
function Conn:release(idle_ms, pool_size)
    if self.released then
        return
    end
    self.released = true
    if self.status == "I" and not self.broken then
        local ok = self.sock:setkeepalive(idle_ms, pool_size)
        if ok then
            return
        end
    end
    self.sock:close()
end

-- -- Cancel --------------------------------------------------------------------------------

-- CancelRequest (protocol-flow.html 55.2.8) on a new connection of its own.
function Conn:cancel()
    if not self.pid then
        return nil, "no key to cancel with"
    end
    local o = self.opts
    local sock = host.module("socket").tcp()
    sock:settimeouts(o.connect_ms, 5000, 5000)
    local ok, err = sock:connect(o.host, o.port)
    if not ok then
        return nil, err
    end
    ok, err = sock:send(int32(16) .. int32(80877102) .. int32(self.pid) .. int32(self.secret))
    -- the server closes it without an answer
    sock:receive(1)
    sock:close()
    return ok, err
end

-- -- Results -------------------------------------------------------------------------------

-- RowDescription: the columns' names and decoders; nil for a malformed one.
local function describe(body, numeric)
    local size = #body
    if size < 2 then
        return nil
    end
    local n = get16(body, 1)
    local names, decoders = {}, {}
    local at = 3
    local dopts = { numeric = numeric }
    for i = 1, n do
        local stop = find(body, "\0", at, true)
        if not stop or stop + 18 > size then
            return nil
        end
        names[i] = sub(body, at, stop - 1)
        local oid = get32(body, stop + 7)
        decoders[i] = types.decoder(oid, dopts)
        at = stop + 19
    end
    return { n = n, names = names, decoders = decoders }
end

-- DataRow, by the columns of `desc`; nil for a malformed one, or one with no description.
local function decode_row(body, desc)
    local size = #body
    if not desc or size < 2 or get16(body, 1) ~= desc.n then
        return nil
    end
    local row = {}
    local names, decoders = desc.names, desc.decoders
    local at = 3
    for i = 1, desc.n do
        if at + 3 > size then
            return nil
        end
        local len = get32(body, at)
        if len < 0 then
            row[names[i]] = NULL
            at = at + 4
        elseif at + 3 + len > size then
            return nil
        else
            row[names[i]] = decoders[i](sub(body, at + 4, at + 3 + len))
            at = at + 4 + len
        end
    end
    return row
end

-- CommandComplete: a SELECT's rows are a plain list (marked as a JSON array, so that
-- res:json(rows) writes one, [] when empty); other commands' results have .affected.
local function complete(result, body)
    local tag = sub(body, 1, -2)
    local n = tag:match("(%d+)$")
    if tag:match("^SELECT ") then
        result.affected = nil
        return json_array(result), tonumber(n)
    end
    result.affected = tonumber(n)
    return result, tonumber(n)
end

-- Reads replies until ReadyForQuery. For each result: on_row(row) when given (the rows are
-- not kept), else the rows gathered. desc: the RowDescription known in advance (a cached
-- statement's). Returns the list of results, or nil and the first error.
function Conn:collect(desc, on_row)
    local results, result, first_err = {}, nil, nil
    local numeric = self.opts.numeric
    local stopped = false
    local timed_out = false
    while true do
        local kind, body = self:read()
        if not kind then
            if body == "timeout" and timed_out then
                self.broken = true
                return nil, client_error("57014", "pg: timeout, and the cancel went unanswered")
            elseif body == "timeout" and not self.pid then
                self.broken = true
                return nil, client_error("57014", "pg: timeout (the session was closed: no key "
                    .. "to cancel its query with)")
            elseif body == "timeout" and not timed_out and not self.broken then
                -- the query outlived its timeout: cancel it, then read on for its end
                timed_out = true
                self:cancel()
                local wait = self.opts.cancel_wait or 5000
                self.sock:settimeouts(self.opts.connect_ms, wait, wait)
            else
                self.broken = true
                if self.got then
                    return nil, client_error("08006", "pg: connection lost: " .. tostring(body))
                end
                -- nothing came back: say so (the caller decides whether it may retry)
                return nil, client_error("08006", "pg: connection lost: " .. tostring(body)), true
            end
        elseif kind == "D" then
            if not result then
                result = {}
            end
            if not stopped then
                local row = decode_row(body, result.desc or desc)
                if not row then
                    self.broken = true
                    return nil, client_error("08P01", "pg: a malformed DataRow message")
                end
                if on_row then
                    local ok, more = pcall(on_row, row)
                    if not ok then
                        -- the rest of the reply is unread: this session cannot go on
                        self.broken = true
                        self.sock:close()
                        error(more, 0)
                    end
                    if more == false then
                        stopped = true
                    end
                else
                    result[#result + 1] = row
                end
            end
        elseif kind == "T" then
            local d = describe(body, numeric)
            if not d then
                self.broken = true
                return nil, client_error("08P01", "pg: a malformed RowDescription message")
            end
            local parsing = self.parsing
            if parsing and parsing.desc == nil then
                parsing.desc = d -- (the statement's: later runs send no Describe)
            end
            result = { desc = d }
        elseif kind == "C" then
            local d = result and result.desc or desc
            if on_row then
                result = { affected = tonumber(sub(body, 1, -2):match("(%d+)$")) }
            else
                result = result or {}
                result.desc = nil
                result = complete(result, body)
            end
            self.columns = d and d.names or nil
            results[#results + 1] = result
            result = nil
        elseif kind == "I" then
            results[#results + 1] = {}
            result = nil
        elseif kind == "E" then
            local e = server_error(body)
            if e.severity == "FATAL" or e.severity == "PANIC" then
                self.broken = true
                -- The server ended the session (57P01 shutdown, 57P02 crash, 57P03 not yet
                -- ready). Before any ParseComplete or BindComplete (which it would have
                -- flushed ahead of this) of an extended query, it ended before it had
                -- bound, let alone run, the statement: the caller may send it elsewhere. Not
                -- so in the simple protocol, whose query has no such preamble.
                return nil, e, self.in_extended and not self.got_reply
                    and sub(e.code or "", 1, 3) == "57P"
            end
            first_err = first_err or e
            result = nil
        elseif kind == "Z" then
            self.status = sub(body, 1, 1)
            if timed_out then
                self.sock:settimeouts(self.opts.connect_ms, self.opts.timeout, self.opts.timeout)
            end
            if timed_out and not first_err then
                -- it ended on its own: the cancel may still come, so this session goes
                self.broken = true
            end
            if first_err then
                return nil, first_err
            end
            return results
        elseif kind == "1" or kind == "2" or kind == "3" or kind == "n" or kind == "t"
            or kind == "s" then
            -- ParseComplete, BindComplete, CloseComplete, NoData, ParameterDescription,
            -- PortalSuspended
            if kind == "1" and self.parsing then
                self:cached(self.parsing)
            elseif kind == "n" and self.parsing and self.parsing.desc == nil then
                self.parsing.desc = false -- a statement without rows
            end
        elseif not self:async(kind, body) then
            self.broken = true
            return nil, client_error("08P01", "pg: unexpected message " .. kind)
        end
        self.got_reply = true
    end
end

-- -- Simple query --------------------------------------------------------------------------

--- The simple protocol: `sql` may hold several statements (no parameters). Returns the list
-- of results, or nil and an error (and true when nothing was sent or read).
function Conn:simple(sql, _, _, on_row)
    if find(sql, "\0", 1, true) then
        return nil, client_error("22021", "pg: the SQL text holds a NUL byte")
    end
    self.sent, self.got, self.got_reply, self.in_extended = false, false, false, false
    local ok, err = self:send(msg("Q", sql .. "\0"))
    if not ok then
        return nil, client_error("08006", "pg: " .. tostring(err)), true
    end
    return self:collect(nil, on_row)
end

-- -- Extended query and the statement cache ------------------------------------------------

function Conn:cached(entry)
    local st = self.stmts
    st.by_sql[entry.key] = entry
    st.n = st.n + 1
end

-- The least recently used statement, to close.
local function oldest(st)
    local min, victim = nil, nil
    for _, e in pairs(st.by_sql) do
        if not min or e.used < min then
            min, victim = e.used, e
        end
    end
    return victim
end

--- The extended protocol: Parse and Describe (of the statement, unless cached: its columns are
-- kept with it), Bind, Execute, Sync; or for an unnamed statement Parse, Bind, Describe (of
-- the portal), Execute, Sync. args: the
-- parameters, n of them. Returns the list of results (one), or nil and an error (and true
-- when the server cannot have run it).
function Conn:extended(sql, n, args, on_row, again)
    if find(sql, "\0", 1, true) then
        return nil, client_error("22021", "pg: the SQL text holds a NUL byte")
    end
    local parts, np = {}, 0
    local st = self.stmts
    local cap = st and self.opts.statement_cache or 0
    local name = ""
    local values = {}
    local oids = {}
    local typed = false
    for i = 1, n do
        local text, oid = types.encode(args[i])
        values[i], oids[i] = text, oid or 0
        typed = typed or (oid or 0) ~= 0
    end
    -- (a statement is parsed for its parameters' types too)
    local key = typed and sql .. "\0" .. concat(oids, ",") or sql
    local entry = cap > 0 and st.by_sql[key] or nil
    local desc
    if cap > 0 and st.closing then
        -- statements the cache let go of after an error, closed now
        for i = 1, #st.closing do
            np = np + 1
            parts[np] = msg("C", "S" .. st.closing[i] .. "\0")
        end
        st.closing = nil
    end
    if entry then
        st.tick = st.tick + 1
        entry.used = st.tick
        name = entry.name
        desc = entry.desc or nil
        self.parsing = nil
    else
        if cap > 0 then
            if st.n >= cap then
                local victim = oldest(st)
                st.by_sql[victim.key] = nil
                st.n = st.n - 1
                np = np + 1
                parts[np] = msg("C", "S" .. victim.name .. "\0")
            end
            st.next_name = st.next_name + 1
            st.tick = st.tick + 1
            name = "ms" .. st.next_name
            entry = { key = key, name = name, used = st.tick }
            self.parsing = entry
        end
        local p = { name, "\0", sql, "\0", int16(n) }
        for i = 1, n do
            p[#p + 1] = int32(oids[i])
        end
        np = np + 1
        parts[np] = msg("P", concat(p))
        if name ~= "" then
            np = np + 1
            parts[np] = msg("D", "S" .. name .. "\0")
        end
    end
    local b = { "\0", name, "\0", int16(0), int16(n) }
    for i = 1, n do
        local v = values[i]
        if v == nil then
            b[#b + 1] = int32(-1)
        else
            b[#b + 1] = int32(#v)
            b[#b + 1] = v
        end
    end
    b[#b + 1] = int16(0)
    np = np + 1
    parts[np] = msg("B", concat(b))
    if name == "" then
        np = np + 1
        parts[np] = msg("D", "P\0") -- the portal's RowDescription (its columns' types)
    end
    np = np + 1
    parts[np] = msg("E", "\0" .. int32(0))
    np = np + 1
    parts[np] = SYNC
    self.sent, self.got, self.got_reply, self.in_extended = false, false, false, true
    local ok, err = self:send(parts)
    if not ok then
        self.parsing = nil
        return nil, client_error("08006", "pg: " .. tostring(err)), true
    end
    local results
    results, err, ok = self:collect(desc, on_row)
    self.parsing = nil
    if not results and entry and entry.name == name and st.by_sql[key] == entry and err
        and (err.code == "0A000" or err.code == "26000") then
        -- "cached plan must not change result type" (its table changed), or a statement
        -- gone (DEALLOCATE ALL): parsed anew next time
        st.by_sql[key] = nil
        st.n = st.n - 1
        if err.code == "0A000" then
            st.closing = st.closing or {}
            st.closing[#st.closing + 1] = name
        end
        if not again and self.status == "I" and not self.broken then
            -- it failed before it ran, outside a transaction: once more, parsed anew
            return self:extended(sql, n, args, on_row, true)
        end
    end
    return results, err, ok
end

_M.sessions = sessions
-- (spec/fuzz/lua/pg.lua reads replies through a session made over a socket of its own)
_M.Conn, _M.startup = Conn, startup

return _M
