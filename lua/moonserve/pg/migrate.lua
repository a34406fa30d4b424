--- moonserve/pg/migrate.lua: an app's numbered migrations (migrations/NNN_name.sql or .lua),
-- applied once each under an advisory lock, each in its own transaction with its record.
-- @module moonserve.pg.migrate
local ffi = require "ffi"
local conn = require "moonserve.pg.conn"
local crypto = require "moonserve.crypto"

local find, sub, match = string.find, string.sub, string.match
local type, tostring, tonumber, pcall, ipairs, pairs, select, setmetatable, getmetatable = type,
    tostring, tonumber, pcall, ipairs, pairs, select, setmetatable, getmetatable
local sort = table.sort

local _M = {}

--- The table of applied migrations (in the connection's search_path).
_M.TABLE = "moonserve_migrations"
--- The key of the session-level advisory lock a run holds: the bytes "moonserv" as an int8.
_M.LOCK_KEY = "7885643992722141814"
--- The first line that makes a migration run outside a transaction (CREATE INDEX
-- CONCURRENTLY, ALTER TYPE ... ADD VALUE before PostgreSQL 12, VACUUM).
_M.NO_TRANSACTION = "-- moonserve: no transaction"

-- -- The files ------------------------------------------------------------------------------

pcall(ffi.cdef, [[
typedef struct ms_migrate_dirent_s {   /* glibc's struct dirent on 64-bit Linux */
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[256];
} ms_migrate_dirent_t;
void *opendir(const char *name);
ms_migrate_dirent_t *readdir(void *dir);
int closedir(void *dir);
]])

-- The names in directory `dir`, or nil and why.
local function list_dir(dir)
    local d = ffi.C.opendir(dir)
    if d == nil then
        return nil, "cannot read the directory " .. dir .. ": " .. ffi.string(ffi.C.strerror(
            ffi.errno()))
    end
    local names = {}
    while true do
        local e = ffi.C.readdir(d)
        if e == nil then
            break
        end
        names[#names + 1] = ffi.string(e.d_name)
    end
    ffi.C.closedir(d)
    return names
end
pcall(ffi.cdef, "char *strerror(int errnum);")

local function read_file(path)
    local f, err = io.open(path, "rb")
    if not f then
        return nil, err
    end
    local text = f:read("*a")
    f:close()
    return text
end

local hex = crypto.hex

--- The migrations in `dir`, in order: a list of { version = number, file = "002_users.sql",
-- path =, kind = "sql" | "lua", text =, checksum = sha256 hex of the text, transaction =
-- false when its first line is NO_TRANSACTION }; or nil and why, for a file ending in .sql
-- or .lua whose name is not NNN_name.ext (digits, an underscore, letters, digits, _ or -)
-- or two files with the same number. Other files (a README) are not migrations. A missing
-- directory holds none.
function _M.scan(dir)
    local names, err = list_dir(dir)
    if not names then
        local f = io.open(dir, "rb")
        if not f then
            return {} -- no migrations directory: nothing to run
        end
        f:close()
        return nil, err
    end
    local list, by_version = {}, {}
    for _, name in ipairs(names) do
        local ext = match(name, "%.(%w+)$")
        if sub(name, 1, 1) ~= "." and (ext == "sql" or ext == "lua") then
            local digits, label = match(name, "^(%d+)_([%w_%-]+)%.%w+$")
            if not digits or #digits > 15 then
                return nil, "bad migration file name " .. name .. " (NNN_name.sql or NNN_name.lua "
                    .. "expected: a number of at most 15 digits, _, then letters, digits, _ or -)"
            end
            local version = tonumber(digits)
            if by_version[version] then
                return nil, "two migrations numbered " .. version .. ": " .. by_version[version]
                    .. " and " .. name
            end
            by_version[version] = name
            local path = dir .. "/" .. name
            local text
            text, err = read_file(path)
            if not text then
                return nil, "cannot read " .. path .. ": " .. tostring(err)
            end
            list[#list + 1] = { version = version, file = name, name = label, path = path,
                kind = ext, text = text, checksum = hex(crypto.sha256(text)),
                transaction = sub(text, 1, #_M.NO_TRANSACTION) ~= _M.NO_TRANSACTION }
        end
    end
    sort(list, function(a, b) return a.version < b.version end)
    return list
end

--- Splits SQL text at its top-level semicolons (not in quotes, dollar quotes or comments), for
-- a migration run outside a transaction: PostgreSQL runs the statements of one simple Query
-- message as one transaction, which CREATE INDEX CONCURRENTLY refuses.
function _M.statements(sql)
    local out, start, i, n = {}, 1, 1, #sql
    local code = false -- (a piece of comments alone is no statement)
    local function add(stop)
        if code then
            out[#out + 1] = sub(sql, start, stop)
        end
        code = false
    end
    while i <= n do
        local ch = sub(sql, i, i)
        local prev = i > 1 and sub(sql, i - 1, i - 1) or ""
        local comment = (ch == "-" and sub(sql, i + 1, i + 1) == "-")
            or (ch == "/" and sub(sql, i + 1, i + 1) == "*")
        if not comment and ch ~= ";" and find(ch, "%S") then
            code = true
        end
        if ch == "'" then
            -- E'...' takes backslash escapes; '' is a quote in any string
            local escapes = (prev == "E" or prev == "e")
                and not find(i > 2 and sub(sql, i - 2, i - 2) or "", "[%w_]")
            i = i + 1
            while i <= n do
                local d = sub(sql, i, i)
                if escapes and d == "\\" then
                    i = i + 2
                elseif d == "'" then
                    if sub(sql, i + 1, i + 1) ~= "'" then
                        break
                    end
                    i = i + 2
                else
                    i = i + 1
                end
            end
            i = i + 1
        elseif ch == '"' then
            i = (find(sql, '"', i + 1, true) or n) + 1
        elseif ch == "-" and sub(sql, i + 1, i + 1) == "-" then
            i = (find(sql, "\n", i, true) or n) + 1
        elseif ch == "/" and sub(sql, i + 1, i + 1) == "*" then
            local depth = 1 -- (PostgreSQL's block comments nest)
            i = i + 2
            while i <= n and depth > 0 do
                local two = sub(sql, i, i + 1)
                if two == "/*" then
                    depth, i = depth + 1, i + 2
                elseif two == "*/" then
                    depth, i = depth - 1, i + 2
                else
                    i = i + 1
                end
            end
        elseif ch == "$" and not find(prev, "[%w_]") then
            local tag = match(sql, "^%$[%a_][%w_]*%$", i) or match(sql, "^%$%$", i)
            if tag then
                local stop = find(sql, tag, i + #tag, true)
                i = stop and stop + #tag or n + 1
            else
                i = i + 1
            end
        elseif ch == ";" then
            add(i)
            start = i + 1
            i = i + 1
        else
            i = i + 1
        end
    end
    add(n)
    return out
end

-- -- The database ---------------------------------------------------------------------------

-- What a .lua migration's function gets: query, exec and each on the run's connection (in
-- the migration's transaction, unless it runs outside one).
local Db = {}
Db.__index = Db

local function last(results)
    return results[#results] or {}
end

function Db:query(sql, ...)
    if type(sql) ~= "string" then
        error("bad argument #1 to 'query' (string expected)", 2)
    end
    local results, err = self.c:extended(sql, select("#", ...), { ... })
    if not results then
        self.failed = self.failed or err
        return nil, err
    end
    return last(results)
end

function Db:exec(sql)
    if type(sql) ~= "string" then
        error("bad argument #1 to 'exec' (string expected)", 2)
    end
    local results, err = self.c:simple(sql)
    if not results then
        self.failed = self.failed or err
    end
    return results, err
end

function Db:each(sql, ...)
    local n = select("#", ...)
    local fn = select(n, ...)
    if type(fn) ~= "function" then
        error("bad last argument to 'each' (a function for each row expected)", 2)
    end
    local results, err = self.c:extended(sql, n - 1, { ... }, fn)
    if not results then
        self.failed = self.failed or err
        return nil, err
    end
    return last(results).affected or 0
end

-- An error of the server or the client, as text: "ERROR 42P01: relation ... does not exist".
local function say(err)
    if type(err) == "table" then
        return tostring(setmetatable(err, getmetatable(err) or conn.Error))
    end
    return tostring(err)
end

-- Runs one statement on `c`; the results, or nil and the error.
local function run(c, sql, ...)
    if select("#", ...) > 0 then
        return c:extended(sql, select("#", ...), { ... })
    end
    return c:simple(sql)
end

-- A connection of its own for the run (never one a worker's pool lends): the client's
-- options with `timeout` long enough for a migration and a wait for the lock.
local function connect(pg)
    local o = {}
    for k, v in pairs(pg.opts) do
        o[k] = v
    end
    o.pool = o.pool .. "\0migrate"
    return conn.connect(o)
end

-- The applied migrations by version ({ version, name, checksum, applied_at }), or an empty
-- table when the table is not there yet; or nil and an error.
local function applied(c)
    local r, err = run(c, "SELECT to_regclass($1) IS NOT NULL AS there", _M.TABLE)
    if not r then
        return nil, err
    end
    local by = {}
    if not r[1][1].there then
        return by
    end
    r, err = run(c, "SELECT version::text AS version, name, checksum, applied_at::text AS at FROM "
        .. _M.TABLE .. " ORDER BY version")
    if not r then
        return nil, err
    end
    for _, row in ipairs(r[1]) do
        by[tonumber(row.version)] = row
    end
    return by
end

-- Compares the files with the records: pending (files not applied), changed (applied files
-- whose text differs now), missing (records without a file).
local function compare(list, by)
    local pending, changed, missing, seen = {}, {}, {}, {}
    for _, m in ipairs(list) do
        local rec = by[m.version]
        seen[m.version] = true
        if not rec then
            pending[#pending + 1] = m
        elseif rec.checksum ~= m.checksum then
            changed[#changed + 1] = m
        end
    end
    for v, rec in pairs(by) do
        if not seen[v] then
            missing[#missing + 1] = rec
        end
    end
    sort(missing, function(a, b) return tonumber(a.version) < tonumber(b.version) end)
    return { pending = pending, changed = changed, missing = missing }
end

--- What the database holds against the files of `list` (from scan), without the lock and
-- without changing anything: { pending = {m...}, changed = {m...}, missing = {record...} },
-- or nil and an error. pg: a moonserve.pg client.
function _M.status(pg, list)
    local c, err = connect(pg)
    if not c then
        return nil, err
    end
    local by
    by, err = applied(c)
    c.sock:close()
    if not by then
        return nil, err
    end
    return compare(list, by)
end

-- Runs migration `m` on `c`, in a transaction with its record unless m.transaction is false.
-- Returns true, or nil and the error (the transaction rolled back).
local function apply_one(c, m)
    local fn
    if m.kind == "lua" then
        local chunk, err = load(m.text, "@" .. m.path)
        if not chunk then
            return nil, err
        end
        local ok
        ok, fn = pcall(chunk)
        if not ok then
            return nil, fn
        end
        if type(fn) ~= "function" then
            return nil, m.path .. " must return function(db) ... end"
        end
    end
    local record = "INSERT INTO " .. _M.TABLE .. " (version, name, checksum) VALUES ($1, $2, $3)"
    local ok, err
    if m.transaction then
        ok, err = c:simple("BEGIN")
        if not ok then
            return nil, err
        end
    end
    if fn then
        local db = setmetatable({ c = c }, Db)
        local done, a, b = pcall(fn, db)
        if not done then
            err = a
        elseif a == nil and b ~= nil then
            err = b
        elseif db.failed then
            err = db.failed
        end
    elseif m.transaction then
        err = select(2, c:simple(m.text))
    else
        for _, stmt in ipairs(_M.statements(m.text)) do
            ok, err = c:simple(stmt)
            if not ok then
                break
            end
            err = nil
        end
    end
    if err == nil then
        ok, err = run(c, record, m.version, m.file, m.checksum)
        if ok then
            err = nil
        end
    end
    if not m.transaction then
        if err ~= nil then
            return nil, err
        end
        return true
    end
    if err ~= nil then
        if not c.broken then
            c:simple("ROLLBACK")
        end
        return nil, err
    end
    ok, err = c:simple("COMMIT")
    if not ok then
        return nil, err
    end
    return true
end

--- Applies the pending migrations of `list` (from scan) in order, once: under the advisory
-- lock LOCK_KEY (a second run at the same time waits for it, then finds them applied), each
-- in a transaction with its record in TABLE (made when missing). opts.report(event, m, info)
-- is called with "applied" (info: ms taken), "changed" (an applied file whose text differs
-- now: reported, never run again), "missing" (a record with no file; m is the record),
-- "waiting" (another run holds the lock). Returns the count applied, or nil, the error (a
-- table for the server's, with .code the SQLSTATE) and the migration that failed (rolled
-- back; the ones before it stay applied).
function _M.apply(pg, list, opts)
    opts = opts or {}
    local report = opts.report or function() end
    local c, err = connect(pg)
    if not c then
        return nil, err
    end
    local function fail(e, m)
        c.sock:close() -- (the server ends the session, and with it the lock)
        return nil, e, m
    end
    local r
    r, err = run(c, "SELECT pg_try_advisory_lock(" .. _M.LOCK_KEY .. ") AS got")
    if not r then
        return fail(err)
    end
    if not r[1][1].got then
        report("waiting")
        r, err = run(c, "SELECT pg_advisory_lock(" .. _M.LOCK_KEY .. ")")
        if not r then
            return fail(err)
        end
    end
    r, err = run(c, "CREATE TABLE IF NOT EXISTS " .. _M.TABLE .. " (version bigint PRIMARY KEY, "
        .. "name text NOT NULL, checksum text NOT NULL, applied_at timestamptz NOT NULL "
        .. "DEFAULT now())")
    if not r then
        return fail(err)
    end
    local by
    by, err = applied(c)
    if not by then
        return fail(err)
    end
    local st = compare(list, by)
    for _, m in ipairs(st.changed) do
        report("changed", m)
    end
    for _, rec in ipairs(st.missing) do
        report("missing", rec)
    end
    local now = require("moonserve.host").now
    local count = 0
    for _, m in ipairs(st.pending) do
        local t0 = now()
        local ok
        ok, err = apply_one(c, m)
        if not ok then
            return fail(err, m)
        end
        count = count + 1
        report("applied", m, (now() - t0) * 1000)
    end
    run(c, "SELECT pg_advisory_unlock(" .. _M.LOCK_KEY .. ")")
    c.sock:close()
    return count
end

_M.say = say

return _M
