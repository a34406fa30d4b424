--- moonserve/pg/init.lua: moonserve.pg, a PostgreSQL client that never blocks the worker: a pool
-- per worker (the host socket's), queries with parameters, transactions, streaming.
-- @module moonserve.pg
local conn = require "moonserve.pg.conn"
local types = require "moonserve.pg.types"

local type, tostring, tonumber, select, error, pcall, setmetatable = type, tostring, tonumber,
    select, error, pcall, setmetatable
local char, concat = string.char, table.concat
local unpack, maxn = unpack, table.maxn

local _M = {}

--- The SQL NULL in results and parameters (it is moonserve.json.null).
_M.null = types.NULL
--- A parameter sent as JSON text (jsonb): pg.json{ a = 1 }.
_M.json = types.json
--- A parameter sent as binary data (bytea): pg.bytea(s).
_M.bytea = types.bytea
--- The error tables' metatable (tostring: "ERROR 23505: duplicate key ...").
_M.Error = conn.Error

local SSLMODES = { disable = true, allow = true, prefer = true, require = true,
    ["verify-ca"] = true, ["verify-full"] = true }

local function unescape(s)
    return (s:gsub("%%(%x%x)", function(h) return char(tonumber(h, 16)) end))
end

--- Parses a connection URL, postgres:// or postgresql://user:password@host:port/database?k=v
-- (percent-encoded parts; query keys sslmode, connect_timeout, application_name and the
-- options below). Returns a table of options, or nil and an error.
function _M.parse_url(url)
    local scheme, rest = url:match("^(%a+)://(.*)$")
    if scheme ~= "postgres" and scheme ~= "postgresql" then
        return nil, "pg: a URL postgres://user:password@host:port/database expected"
    end
    local o = {}
    local query = rest:match("%?(.*)$")
    rest = rest:gsub("%?.*$", "")
    local auth, hostpart = rest:match("^(.*)@([^@]*)$")
    if not auth then
        hostpart = rest
    end
    if auth then
        local user, password = auth:match("^([^:]*):(.*)$")
        o.user = unescape(user or auth)
        if password then
            o.password = unescape(password)
        end
    end
    local hp, db = hostpart:match("^([^/]*)/?(.*)$")
    if db ~= "" then
        o.database = unescape(db)
    end
    local h, port = hp:match("^%[(.-)%]:?(%d*)$") -- [::1]:5432
    if not h then
        h, port = hp:match("^([^:]*):?(%d*)$")
    end
    if not h then
        return nil, "pg: bad host in the URL"
    end
    if h ~= "" then
        o.host = unescape(h)
    end
    if port ~= "" then
        o.port = tonumber(port)
    end
    if query then
        for pair in query:gmatch("[^&]+") do
            local k, v = pair:match("^([^=]*)=?(.*)$")
            k, v = unescape(k), unescape(v)
            if k == "connect_timeout" or k == "port" or k == "pool_size" or k == "timeout"
                or k == "backlog" or k == "idle_timeout" or k == "statement_cache" then
                v = tonumber(v)
                if not v then
                    return nil, "pg: bad " .. k .. " in the URL"
                end
            end
            o[k] = v
        end
    end
    return o
end

local Pg = {}
Pg.__index = Pg

local DEFAULTS = { host = "127.0.0.1", port = 5432, sslmode = "prefer", connect_timeout = 10,
    timeout = 60000, pool_size = 10, backlog = 256, idle_timeout = 60000, statement_cache = 100,
    numeric = "string" }

--- A client: no I/O until the first query. opts: url and/or its fields (host, port, user,
-- password, database, sslmode, connect_timeout in seconds, application_name), pool_size
-- (connections of the worker at most), backlog (queries waiting for one), idle_timeout
-- (ms an idle pooled connection is kept), timeout (ms: the longest wait for the server's
-- next reply; a query that outlives it is cancelled), statement_cache (named statements a
-- connection keeps, 0: none), numeric ("string" or "number"), on_notice(notice).
function _M.new(opts)
    if type(opts) == "string" then
        opts = { url = opts }
    end
    if type(opts) ~= "table" then
        error("bad argument #1 to 'pg.new' (a table of options or a URL expected)", 2)
    end
    local o = {}
    if opts.url then
        local u, err = _M.parse_url(opts.url)
        if not u then
            error(err, 2)
        end
        for k, v in pairs(u) do
            o[k] = v
        end
    end
    for k, v in pairs(opts) do
        if k ~= "url" then
            o[k] = v
        end
    end
    for k, v in pairs(DEFAULTS) do
        if o[k] == nil then
            o[k] = v
        end
    end
    if not o.user then
        error("pg.new: no user (in the URL or as the user option)", 2)
    end
    o.database = o.database or o.user
    if not SSLMODES[o.sslmode] then
        error("pg.new: bad sslmode " .. tostring(o.sslmode), 2)
    end
    if o.numeric ~= "string" and o.numeric ~= "number" then
        error("pg.new: numeric must be \"string\" or \"number\"", 2)
    end
    for _, k in ipairs({ "port", "connect_timeout", "timeout", "pool_size", "backlog",
        "idle_timeout", "statement_cache" }) do
        if type(o[k]) ~= "number" or o[k] < 0 then
            error("pg.new: bad " .. k .. " (a non-negative number expected)", 2)
        end
    end
    if o.pool_size < 1 or o.backlog < 1 then
        -- (a backlog is what makes the host's pool cap its busy connections too)
        error("pg.new: pool_size and backlog must be at least 1", 2)
    end
    o.connect_ms = o.connect_timeout * 1000
    -- The host socket's pool by what makes a session: the same URL's clients share it (with
    -- the same pool_size, statement_cache and numeric, which the pool's sessions and their
    -- statements follow). (The
    -- password is in it too, hashed, so that a client with another one never gets a session
    -- that it could not have opened.)
    local crypto = require "moonserve.crypto"
    local pw = crypto.base64url_encode(crypto.hmac_sha256("moonserve.pg", o.password or ""))
    o.pool = concat({ "pg", o.user, pw:sub(1, 12), o.host, o.port, o.database, o.sslmode,
        o.application_name or "", o.pool_size, o.statement_cache, o.numeric }, "\0")
    return setmetatable({ opts = o }, Pg)
end

-- -- Connections -------------------------------------------------------------------------

local function checkout(self)
    return conn.connect(self.opts)
end

local function checkin(self, c)
    local o = self.opts
    c:release(o.idle_timeout, o.pool_size)
end

-- Runs one exchange (`how` is "simple" or "extended") on a pooled connection; a pooled
-- connection found dead before the server could have run anything is dropped and the
-- exchange tried once more on a new one.
local function run(self, how, sql, n, args, on_row)
    for attempt = 1, 2 do
        local c, err = checkout(self)
        if not c then
            return nil, err
        end
        local results, unrun
        results, err, unrun = c[how](c, sql, n, args, on_row)
        checkin(self, c)
        if results or not (unrun and c.reused > 0 and attempt == 1) then
            return results, err
        end
        self.retried = (self.retried or 0) + 1
    end
end

local function last(results)
    return results[#results] or {}
end

--- Runs `sql` with parameters $1, $2... (the rest of the arguments; nil and pg.null are NULL)
-- through the extended protocol. Returns the rows (each a table by column name;
-- rows.affected for INSERT, UPDATE, DELETE), or nil and an error table.
function Pg:query(sql, ...)
    if type(sql) ~= "string" then
        error("bad argument #1 to 'query' (string expected)", 2)
    end
    local results, err = run(self, "extended", sql, select("#", ...), { ... })
    if not results then
        return nil, err
    end
    return last(results)
end

--- Runs `sql` through the simple protocol: several statements, no parameters (a migration's
-- text). Returns the list of the statements' results (each as query's), or nil and an
-- error table.
function Pg:exec(sql)
    if type(sql) ~= "string" then
        error("bad argument #1 to 'exec' (string expected)", 2)
    end
    return run(self, "simple", sql, 0, nil)
end

-- The arguments of each(sql, ..., fn): the parameters and the function.
local function split_fn(what, ...)
    local n = select("#", ...)
    local fn = select(n, ...)
    if type(fn) ~= "function" then
        error("bad last argument to '" .. what .. "' (a function for each row expected)", 3)
    end
    return n - 1, { ... }, fn
end

--- Streams a large result: fn(row) for each row as it arrives, none kept (fn returns false to
-- skip the rest). Returns the count of rows the statement gave (or changed), or nil and an
-- error.
-- @usage pg:each("select * from big where kind = $1", kind, function(row) ... end)
function Pg:each(sql, ...)
    local n, args, fn = split_fn("each", ...)
    local results, err = run(self, "extended", sql, n, args, fn)
    if not results then
        return nil, err
    end
    return last(results).affected or 0
end

-- -- Transactions ------------------------------------------------------------------------

local Tx = {}
Tx.__index = Tx

local function tx_run(tx, how, sql, n, args, on_row)
    if tx.done then
        error("pg: the transaction has ended", 3)
    end
    local results, err = tx.c[how](tx.c, sql, n, args, on_row)
    if not results then
        if tx.c.broken then
            tx.lost = err
        end
        tx.failed = tx.failed or err
        return nil, err
    end
    return last(results)
end

--- tx:query(sql, ...): as pg:query, on the transaction's connection.
function Tx:query(sql, ...)
    return tx_run(self, "extended", sql, select("#", ...), { ... })
end

--- tx:exec(sql): as pg:exec, on the transaction's connection.
function Tx:exec(sql)
    if self.done then
        error("pg: the transaction has ended", 2)
    end
    local results, err = self.c:simple(sql)
    if not results then
        self.failed = self.failed or err
        if self.c.broken then
            self.lost = err
        end
    end
    return results, err
end

--- tx:each(sql, ..., fn): as pg:each, on the transaction's connection.
function Tx:each(sql, ...)
    local n, args, fn = split_fn("each", ...)
    local r, err = tx_run(self, "extended", sql, n, args, fn)
    if not r then
        return nil, err
    end
    return r.affected or 0
end

-- fn(tx) between `begin` and `commit`, or `rollback` when fn raised, returned nil and an
-- error, or a query of it failed.
local function enclose(tx, fn, begin, commit, rollback)
    local c = tx.c
    local results, err = c:simple(begin)
    if not results then
        return nil, err
    end
    local outer_failed = tx.failed
    tx.failed = nil
    local res = { pcall(fn, tx) }
    local ok = res[1]
    if c.broken then
        -- the connection is gone (or out of step): nothing to roll back on; the server
        -- rolls the transaction back as the session ends
        tx.lost = tx.lost or (not ok and res[2]) or conn.client_error("08006",
            "pg: connection lost in the transaction")
    end
    local why
    if not ok then
        why = res[2]
    elseif res[2] == nil and res[3] ~= nil then
        why = res[3]
    elseif tx.failed then
        why = tx.failed
    end
    if tx.lost then
        tx.failed = outer_failed or tx.lost
        return nil, tx.lost
    end
    if why ~= nil then
        results, err = c:simple(rollback)
        tx.failed = outer_failed
        if not results then
            tx.lost = err
            return nil, err
        end
        return nil, why
    end
    results, err = c:simple(commit)
    tx.failed = outer_failed
    if not results then
        return nil, err
    end
    if res[2] == nil and #res <= 2 then
        return true
    end
    return unpack(res, 2, maxn(res))
end

--- A savepoint inside the transaction: fn(tx) rolled back to it alone on an error.
function Tx:transaction(fn)
    if type(fn) ~= "function" then
        error("bad argument #1 to 'transaction' (function expected)", 2)
    end
    self.depth = self.depth + 1
    local sp = "moonserve_sp" .. self.depth
    local r = { enclose(self, fn, "SAVEPOINT " .. sp, "RELEASE SAVEPOINT " .. sp,
        "ROLLBACK TO SAVEPOINT " .. sp) }
    self.depth = self.depth - 1
    return unpack(r, 1, maxn(r))
end

--- Runs fn(tx) in a transaction on one connection held for the whole of it: COMMIT when fn
-- returns, ROLLBACK when it raises, returns nil and an error, or one of its queries failed.
-- Returns what fn returned (true when nothing), or nil and the error (the raised value).
-- tx:transaction(fn) inside it is a savepoint.
function Pg:transaction(fn)
    if type(fn) ~= "function" then
        error("bad argument #1 to 'transaction' (function expected)", 2)
    end
    local c, err = checkout(self)
    if not c then
        return nil, err
    end
    local tx = setmetatable({ c = c, depth = 0 }, Tx)
    local r = { enclose(tx, fn, "BEGIN", "COMMIT", "ROLLBACK") }
    tx.done = true
    checkin(self, c)
    return unpack(r, 1, maxn(r))
end

-- -- Notifications (moonserve/pg/listen.lua) ---------------------------------------------

--- A subscription to LISTEN/NOTIFY's `channel`: sub:next(timeout) -> payload, channel (or
-- nil, "timeout"; nil, "lost", n), sub:close(). One connection of its own per client and
-- worker carries every subscription; no pooled connection is held. opts.queue: how many
-- notifications a slow reader may fall behind (default listen_queue, 1000).
function Pg:listen(channel, opts)
    return require("moonserve.pg.listen").listen(self, channel, opts)
end

--- NOTIFY `channel` with `payload` (a string, default ""): true, or nil and an error.
function Pg:notify(channel, payload)
    return require("moonserve.pg.listen").notify(self, channel, payload)
end

return _M
