-- spec/it/pg_migrate_spec.lua: `moonserve migrate` (the real command) on a temporary app
-- directory against a throwaway PostgreSQL cluster (spec/postgres.lua).
local helper = require "helper"
local postgres = require "postgres"

local BIN = os.getenv("MOONSERVE_BIN") or (helper.root .. "/lua/bin/moonserve")
local q = helper.sh_quote

describe("moonserve migrate", function()
    local pg, dir, n = nil, nil, 0
    local app, url

    setup(function()
        pg = postgres.start()
        pg.psql("GRANT CREATE ON SCHEMA public TO PUBLIC")
    end)

    teardown(function()
        if pg then
            pg.stop()
        end
    end)

    -- A new app directory and database for each test.
    before_each(function()
        n = n + 1
        dir = helper.sh(helper.tool("mktemp") .. " -d"):gsub("%s+$", "")
        os.execute(helper.tool("mkdir") .. " " .. q(dir .. "/migrations"))
        app = dir .. "/app.lua"
        helper.write_file(app, "return require('moonserve').app()\n")
        local db = "m" .. n
        pg.psql("CREATE DATABASE " .. db .. " OWNER " .. postgres.users.scram.user)
        url = "postgres://" .. postgres.users.scram.user .. ":" .. postgres.users.scram.password
            .. "@127.0.0.1:" .. pg.port .. "/" .. db .. "?sslmode=disable"
    end)

    after_each(function()
        os.execute(helper.tool("rm") .. " -rf " .. q(dir))
    end)

    local function file(name, text)
        helper.write_file(dir .. "/migrations/" .. name, text)
    end

    local function migrate(args, env_url)
        return helper.run("DATABASE_URL=" .. q(env_url or url) .. " " .. BIN .. " migrate "
            .. q(app) .. " " .. (args or "") .. " 2>&1")
    end

    local function db(text)
        return (helper.run(helper.tool("psql") .. " -X -q -At -h 127.0.0.1 -p " .. pg.port
            .. " " .. q(url:gsub("%?.*$", "")) .. " -c " .. q(text) .. " 2>&1"):gsub("%s+$", ""))
    end

    it("applies a fresh database's migrations once, in order, and a second run does nothing",
        function()
        file("001_notes.sql", "CREATE TABLE notes (id serial PRIMARY KEY, body text);\n"
            .. "INSERT INTO notes (body) VALUES ('a;b'), ($$c;d$$);\n")
        file("002_authors.sql", "ALTER TABLE notes ADD COLUMN author int;\n")
        file("README.md", "not a migration\n")
        local out, status = migrate("--check")
        assert.equal(1, status, out)
        assert.matches("pending 001_notes.sql\n.*pending 002_authors.sql\n", out)
        assert.matches("2 pending, 0 applied", out)
        out, status = migrate()
        assert.equal(0, status, out)
        assert.matches("applied 001_notes.sql %(%d+ ms%)\n.*applied 002_authors.sql", out)
        assert.matches("2 applied\n$", out)
        assert.equal("a;b|\nc;d|", db("SELECT body, author FROM notes ORDER BY id"))
        assert.equal("1|001_notes.sql\n2|002_authors.sql",
            db("SELECT version, name FROM moonserve_migrations ORDER BY version"))
        out, status = migrate()
        assert.equal(0, status, out)
        assert.matches("nothing to migrate\n$", out)
        out, status = migrate("--check")
        assert.equal(0, status, out)
        assert.matches("0 pending, 2 applied\n$", out)
        assert.equal("2", db("SELECT count(*) FROM notes"))
    end)

    it("rolls a failing migration back, records nothing of it, and stops there", function()
        file("001_ok.sql", "CREATE TABLE ok (id int);\n")
        file("002_bad.sql", "CREATE TABLE half (id int);\nINSERT INTO nowhere VALUES (1);\n")
        file("003_after.sql", "CREATE TABLE after (id int);\n")
        local out, status = migrate()
        assert.equal(1, status, out)
        assert.matches("applied 001_ok.sql", out)
        assert.matches("migrate: [^\n]*/migrations/002_bad.sql failed, rolled back: ERROR 42P01: "
            .. "relation \"nowhere\" does not exist", out)
        assert.equal("", db("SELECT to_regclass('half')"))
        assert.equal("", db("SELECT to_regclass('after')"))
        assert.equal("1", db("SELECT string_agg(version::text, ',') FROM moonserve_migrations"))
        -- fixed, it runs, and the one after it
        file("002_bad.sql", "CREATE TABLE half (id int);\n")
        out, status = migrate()
        assert.equal(0, status, out)
        assert.matches("applied 002_bad.sql.*applied 003_after.sql", out)
    end)

    it("applies each migration once when two runs start together", function()
        file("001_slow.sql", "CREATE TABLE slow (id int);\nSELECT pg_sleep(1);\n")
        file("002_count.sql", "CREATE TABLE runs (n int);\nINSERT INTO runs VALUES (1);\n")
        local outs = {}
        for i = 1, 2 do
            outs[i] = os.tmpname()
        end
        -- (both started by one shell, at once, and waited for)
        local script = { "export DATABASE_URL=" .. q(url) }
        for i = 1, 2 do
            script[#script + 1] = "(" .. q(BIN) .. " migrate " .. q(app) .. " >" .. outs[i]
                .. " 2>&1; echo $? >>" .. outs[i] .. ") &"
        end
        script[#script + 1] = "wait\n"
        helper.write_file(dir .. "/both.sh", table.concat(script, "\n"))
        helper.run("sh " .. q(dir .. "/both.sh"))
        local both = {}
        for i = 1, 2 do
            both[i] = helper.read_file(outs[i])
            os.remove(outs[i])
            assert.matches("\n0\n$", both[i])
        end
        local text = both[1] .. both[2]
        local _, applied1 = text:gsub("applied 001_slow.sql", "")
        local _, applied2 = text:gsub("applied 002_count.sql", "")
        assert.equal(1, applied1, text)
        assert.equal(1, applied2, text)
        assert.matches("nothing to migrate", text)
        assert.matches("waiting for another migrate to finish", text)
        assert.equal("1", db("SELECT count(*) FROM runs"))
    end)

    it("reports an applied file whose text changed and never runs it again", function()
        file("001_a.sql", "CREATE TABLE a (id int);\n")
        local out, status = migrate()
        assert.equal(0, status, out)
        file("001_a.sql", "CREATE TABLE a (id int, more text);\n")
        out, status = migrate()
        assert.equal(0, status, out)
        assert.matches("warning: 001_a.sql changed since it was applied %(it is not run again%)",
            out)
        assert.matches("nothing to migrate", out)
        out = migrate("--check")
        assert.matches("warning: 001_a.sql changed since it was applied", out)
        assert.equal("", db("SELECT column_name FROM information_schema.columns WHERE "
            .. "table_name = 'a' AND column_name = 'more'"))
    end)

    it("runs a .lua migration with the transaction's db, and rolls it back when it raises",
        function()
        file("001_lua.lua", [[
return function(db)
    assert(db:exec("CREATE TABLE people (id serial, name text)"))
    for _, name in ipairs({ "ann", "o'brien" }) do
        assert(db:query("INSERT INTO people (name) VALUES ($1)", name))
    end
end
]])
        file("002_raises.lua", [[
return function(db)
    assert(db:exec("CREATE TABLE doomed (id int)"))
    error("no, thank you")
end
]])
        local out, status = migrate()
        assert.equal(1, status, out)
        assert.matches("applied 001_lua.lua", out)
        assert.matches("002_raises.lua failed, rolled back: [^\n]*002_raises.lua:3: no, thank you",
            out)
        assert.equal("ann\no'brien", db("SELECT name FROM people ORDER BY id"))
        assert.equal("", db("SELECT to_regclass('doomed')"))
    end)

    it("runs a migration marked no transaction outside one, statement by statement", function()
        file("001_t.sql", "CREATE TABLE t (id int, note text);\n")
        file("002_index.sql", "-- moonserve: no transaction\n"
            .. "CREATE INDEX CONCURRENTLY t_id ON t (id);\n"
            .. "/* a; comment */ CREATE INDEX CONCURRENTLY t_note ON t (note); -- the end;\n")
        local out, status = migrate()
        assert.equal(0, status, out)
        assert.matches("applied 002_index.sql", out)
        assert.equal("t_id\nt_note", db("SELECT indexname FROM pg_indexes WHERE tablename = 't' "
            .. "ORDER BY 1"))
        -- without the marker the server refuses it inside the transaction
        file("003_index.sql", "CREATE INDEX CONCURRENTLY t_both ON t (id, note);\n")
        out, status = migrate()
        assert.equal(1, status, out)
        assert.matches("ERROR 25001: CREATE INDEX CONCURRENTLY cannot run inside a transaction "
            .. "block", out)
    end)

    it("refuses bad and duplicate file names before anything runs", function()
        file("001_ok.sql", "CREATE TABLE ok (id int);\n")
        for _, case in ipairs({
            { "x_bad.sql", "bad migration file name x_bad.sql" },
            { "002.sql", "bad migration file name 002.sql" },
            { "003_two words.sql", "bad migration file name 003_two words.sql" },
            { "01_dup.lua", "two migrations numbered 1: 0*1_[%w]+%.[%w]+ and 0*1_[%w]+%.[%w]+" },
        }) do
            file(case[1], "CREATE TABLE never (id int);\n")
            for _, args in ipairs({ "", "--check" }) do
                local out, status = migrate(args)
                assert.equal(2, status, case[1] .. ": " .. out)
                assert.matches("^moonserve: migrate: " .. case[2], out)
            end
            os.remove(dir .. "/migrations/" .. case[1])
        end
        assert.equal("", db("SELECT to_regclass('moonserve_migrations')"))
        assert.equal("", db("SELECT to_regclass('ok')"))
    end)

    it("names a mistake on its command line, and says what migrate does in --help", function()
        for _, case in ipairs({
            { "migrate", "migrate needs the app's file: moonserve migrate app.lua" },
            { "migrate " .. q(app) .. " --bogus", "unknown option %-%-bogus for migrate" },
            { "migrate " .. q(app) .. " --env", "%-%-env needs a value" },
            { "migrate " .. q(app) .. " other.lua", "one app file at most" },
        }) do
            local out, status = helper.run(BIN .. " " .. case[1] .. " 2>&1")
            assert.equal(2, status, out)
            assert.matches("^moonserve: " .. case[2], out)
        end
        local out, status = helper.run(BIN .. " migrate --help")
        assert.equal(0, status)
        assert.matches("moonserve migrate APP.lua %[%-%-check%]", out)
        assert.matches("%-%-check +list the pending migrations", out)
        for line in out:gmatch("[^\n]+") do
            assert.is_true(#line <= 100, line)
        end
    end)

    it("takes the URL from the configuration's database_url, and says when there is none",
        function()
        file("001_c.sql", "CREATE TABLE c (id int);\n")
        helper.write_file(dir .. "/config.lua", "return { common = { database_url = "
            .. string.format("%q", url) .. " } }\n")
        local out, status = migrate("", "")
        assert.equal(0, status, out)
        assert.matches("applied 001_c.sql", out)
        os.remove(dir .. "/config.lua")
        out, status = migrate("", "")
        assert.equal(2, status, out)
        assert.matches("no database: set database_url in the configuration, or DATABASE_URL", out)
        out, status = migrate("", "postgres://nobody:x@127.0.0.1:1/none")
        assert.equal(2, status, out)
        assert.matches("08001", out)
    end)
end)
