-- spec/it/postgres_spec.lua: a real PostgreSQL server (a throwaway cluster, spec/postgres.lua)
-- spoken to with SCRAM-SHA-256 and md5.
local helper = require "helper"
local socket = require "socket"
local postgres = require "postgres"
local cjson = require "cjson"

describe("a throwaway PostgreSQL cluster", function()
    local pg

    setup(function()
        pg = postgres.start()
    end)

    teardown(function()
        if pg then
            pg.stop()
        end
    end)

    local function connect()
        local s = assert(socket.tcp())
        s:settimeout(10)
        assert(s:connect("127.0.0.1", pg.port))
        return s
    end

    for _, how in ipairs({ "scram", "md5" }) do
        it("takes a " .. how .. " login and answers a simple query", function()
            local u = postgres.users[how]
            local s = connect()
            assert(postgres.login(s, u.user, u.password))
            assert.same({ { "2", "text", false } },
                assert(postgres.query(s, "SELECT 1 + 1, 'text', NULL")))
            assert.same({ { u.user } }, assert(postgres.query(s, "SELECT current_user")))
            local rows, err = postgres.query(s, "SELECT * FROM no_such_table")
            assert.is_nil(rows)
            assert.matches("ERROR: relation \"no_such_table\" does not exist", err)
            postgres.terminate(s)
            s:close()
        end)

        it("refuses a " .. how .. " login with a wrong password", function()
            local u = postgres.users[how]
            local s = connect()
            local ok, err = postgres.login(s, u.user, "wrong")
            assert.is_nil(ok)
            assert.matches("password authentication failed", err)
            s:close()
        end)
    end

    it("is spoken to from handlers over moonserve.socket, through the worker's pool", function()
        local srv = helper.spawn_server { app = "spec/fixtures/pg.lua",
            env = { PG_PORT = pg.port } }
        finally(function() srv:stop() end)
        local url = "http://127.0.0.1:" .. srv.port
        for _, how in ipairs({ "scram", "md5" }) do
            local res = cjson.decode(helper.curl(url .. "/query?who=" .. how))
            assert.same({ { "2", postgres.users[how].user, "" } }, res.rows)
        end
        -- Under concurrent load the server sees at most the pool's 4 sessions of the user,
        -- and the handlers reuse them.
        local load = io.popen(helper.tool("wrk") .. " -t2 -c12 -d2s '" .. url
            .. "/query?who=scram' 2>&1")
        socket.sleep(1)
        local during = pg.connections(postgres.users.scram.user)
        local out = load:read("*a")
        load:close()
        assert.truthy(out:find("requests in", 1, true), out)
        assert.falsy(out:find("Non-2xx", 1, true), out)
        assert.is_true(during >= 1 and during <= 4, "sessions: " .. tostring(during))
        local res = cjson.decode(helper.curl(url .. "/query?who=scram"))
        assert.is_true(res.reused > 0)
    end)
end)
