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
end)
