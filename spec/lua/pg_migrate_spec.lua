-- spec/lua/pg_migrate_spec.lua: moonserve.pg.migrate's files and statements, without a server.
describe("moonserve.pg.migrate", function()
    local migrate = require "moonserve.pg.migrate"
    local helper = require "helper"

    it("splits SQL at the semicolons outside quotes, dollar quotes and comments", function()
        local sql = "CREATE INDEX CONCURRENTLY a ON t (x);\n"
            .. "INSERT INTO t VALUES ('a;''b', E'c\\';d', \"q;\", $$e;f$$, $tag$ g;$$ $tag$);\n"
            .. "-- a comment; with a semicolon\n"
            .. "/* a /* nested; */ comment; */ SELECT $1;   \n"
            .. "  -- only a comment at the end;\n"
        local parts = migrate.statements(sql)
        assert.equal(3, #parts, table.concat(parts, "|"))
        assert.equal("CREATE INDEX CONCURRENTLY a ON t (x);", parts[1])
        assert.matches("^\nINSERT INTO t VALUES %('a;''b', E'c\\';d', \"q;\", %$%$e;f%$%$, "
            .. "%$tag%$ g;%$%$ %$tag%$%);$", parts[2])
        assert.matches("SELECT %$1;$", parts[3])
        assert.same({ "SELECT 1" }, migrate.statements("SELECT 1"))
    end)

    it("lists a directory's migrations in order of their numbers, with their checksums",
        function()
        local dir = helper.sh(helper.tool("mktemp") .. " -d"):gsub("%s+$", "")
        helper.write_file(dir .. "/10_later.lua", "return function(db) end\n")
        helper.write_file(dir .. "/002_first.sql", "-- moonserve: no transaction\nSELECT 1;\n")
        helper.write_file(dir .. "/README.md", "notes\n")
        local list = assert(migrate.scan(dir))
        assert.equal(2, #list)
        assert.equal(2, list[1].version)
        assert.equal("002_first.sql", list[1].file)
        assert.is_false(list[1].transaction)
        assert.equal(10, list[2].version)
        assert.equal("lua", list[2].kind)
        assert.is_true(list[2].transaction)
        assert.matches("^%x+$", list[2].checksum)
        assert.equal(64, #list[2].checksum)
        helper.write_file(dir .. "/0010_again.sql", "SELECT 1;\n")
        local ok, err = migrate.scan(dir)
        assert.is_nil(ok)
        assert.matches("two migrations numbered 10", err)
        os.remove(dir .. "/0010_again.sql")
        helper.write_file(dir .. "/3-three.sql", "SELECT 1;\n")
        ok, err = migrate.scan(dir)
        assert.is_nil(ok)
        assert.matches("bad migration file name 3%-three.sql", err)
        os.execute(helper.tool("rm") .. " -rf " .. helper.sh_quote(dir))
        assert.same({}, migrate.scan(dir)) -- no directory: no migrations
    end)
end)
