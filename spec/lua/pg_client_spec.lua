-- moonserve.pg without a server: connection URLs, options and their refusals (the protocol
-- is in spec/it/pg_client_spec.lua, against a real server).
describe("moonserve.pg", function()
    local pg = require "moonserve.pg"
    local json = require "moonserve.json"

    it("parses postgres:// and postgresql:// URLs, percent-decoded", function()
        assert.same({ user = "ada", password = "p@ss:w/rd", host = "db.example", port = 6543,
            database = "my db" },
            pg.parse_url("postgres://ada:p%40ss%3Aw%2Frd@db.example:6543/my%20db"))
        assert.same({ user = "ada", host = "127.0.0.1" },
            pg.parse_url("postgresql://ada@127.0.0.1"))
        assert.same({ user = "u", host = "::1", port = 5433, database = "d" },
            pg.parse_url("postgres://u@[::1]:5433/d"))
        -- a password may hold '@' encoded or not: the last '@' ends it
        assert.equal("a@b", pg.parse_url("postgres://u:a@b@h/d").password)
    end)

    it("takes sslmode, connect_timeout, application_name and the options as query keys",
        function()
        local o = pg.parse_url("postgres://u@h/d?sslmode=verify-full&connect_timeout=3"
            .. "&application_name=my%20app&pool_size=32&statement_cache=0")
        assert.equal("verify-full", o.sslmode)
        assert.equal(3, o.connect_timeout)
        assert.equal("my app", o.application_name)
        assert.equal(32, o.pool_size)
        assert.equal(0, o.statement_cache)
        local _, err = pg.parse_url("postgres://u@h/d?connect_timeout=soon")
        assert.matches("bad connect_timeout", err)
    end)

    it("refuses what is not a PostgreSQL URL", function()
        for _, bad in ipairs({ "mysql://u@h/d", "u@h/d", "http://h/" }) do
            local o, err = pg.parse_url(bad)
            assert.is_nil(o)
            assert.matches("postgres://", err)
        end
    end)

    it("makes a client without I/O; options win over the URL's, bad ones raise", function()
        local db = pg.new{ url = "postgres://u:pw@h:1/d?sslmode=require&pool_size=3",
            pool_size = 5 }
        assert.equal(5, db.opts.pool_size)
        assert.equal("require", db.opts.sslmode)
        assert.equal(1, db.opts.port)
        assert.equal(5432, pg.new{ user = "u" }.opts.port)
        assert.equal("u", pg.new{ user = "u" }.opts.database) -- libpq's default
        assert.has_error(function() pg.new{ url = "mysql://x" } end)
        assert.has_error(function() pg.new{ host = "h" } end, "pg.new: no user (in the URL or as the user option)")
        assert.has_error(function() pg.new{ user = "u", sslmode = "maybe" } end)
        assert.has_error(function() pg.new{ user = "u", pool_size = 0 } end)
        assert.has_error(function() pg.new{ user = "u", backlog = 0 } end)
        assert.has_error(function() pg.new{ user = "u", numeric = "float" } end)
        assert.has_error(function() pg.new{ user = "u", timeout = -1 } end)
    end)

    it("keeps sessions of other passwords, sizes or caches in other pools", function()
        local a = pg.new{ url = "postgres://u:one@h/d" }
        assert.equal(a.opts.pool, pg.new{ url = "postgres://u:one@h/d" }.opts.pool)
        assert.are_not.equal(a.opts.pool, pg.new{ url = "postgres://u:two@h/d" }.opts.pool)
        assert.are_not.equal(a.opts.pool, pg.new{ url = "postgres://u:one@h/d",
            pool_size = 2 }.opts.pool)
        assert.are_not.equal(a.opts.pool, pg.new{ url = "postgres://u:one@h/d",
            sslmode = "require" }.opts.pool)
        assert.falsy(a.opts.pool:find("one", 1, true)) -- the password itself is not in it
    end)

    it("has NULL as moonserve.json.null, and errors that print as the server's", function()
        assert.equal(json.null, pg.null)
        local e = setmetatable({ severity = "ERROR", code = "23505", message = "duplicate key" },
            pg.Error)
        assert.equal("ERROR 23505: duplicate key", tostring(e))
    end)

    -- A server's replies, as the session reads them from a socket that hands out `data`.
    local function replies(data)
        local conn = require "moonserve.pg.conn"
        local at = 1
        local sock = { receive = function(_, n)
            if at + n - 1 > #data then
                return nil, "closed"
            end
            at = at + n
            return data:sub(at - n, at - 1)
        end }
        return setmetatable({ sock = sock, opts = {}, max_message = 1048576, params = {},
            notifications = {} }, conn.Conn)
    end
    local function msg(kind, body)
        local n = #body + 4
        return kind .. string.char(0, 0, math.floor(n / 256), n % 256) .. body
    end

    it("calls a malformed reply a protocol violation (08P01), and raises nothing", function()
        local col = "x\0" .. ("\0"):rep(6) .. "\0\0\0\23" .. ("\0"):rep(8)
        local cases = {
            -- a row description cut short, a row with no description, a row whose value
            -- runs past its end, a row of another width than its description
            { msg("T", "\0\5x"), "RowDescription" },
            { msg("D", "\0\1\0\0\0\1" .. "1"), "DataRow" },
            { msg("T", "\0\1" .. col) .. msg("D", "\0\1\0\0\0\9" .. "1"), "DataRow" },
            { msg("T", "\0\1" .. col) .. msg("D", "\0\2\0\0\0\1" .. "1"), "DataRow" },
        }
        for _, case in ipairs(cases) do
            local c = replies(case[1] .. msg("Z", "I"))
            local res, err = c:collect()
            assert.is_nil(res)
            assert.equal("08P01", err.code)
            assert.equal("pg: a malformed " .. case[2] .. " message", err.message)
            assert.is_true(c.broken)
        end
        -- and the well-formed row of the same description reads
        local c = replies(msg("T", "\0\1" .. col) .. msg("D", "\0\1\0\0\0\2" .. "42")
            .. msg("C", "SELECT 1\0") .. msg("Z", "I"))
        assert.same({ { x = 42 } }, c:collect()[1])
    end)
end)
