-- spec/it/pg_client_spec.lua: moonserve.pg in a served app (spec/fixtures/pg_client.lua)
-- against a throwaway PostgreSQL cluster (spec/postgres.lua) that speaks TLS too.
local helper = require "helper"
local socket = require "socket"
local postgres = require "postgres"
local cjson = require "cjson"

local function q(s)
    return "'" .. s:gsub("'", "'\\''") .. "'"
end

describe("moonserve.pg", function()
    local pg, srv, url, dir

    setup(function()
        dir = helper.sh(helper.tool("mktemp") .. " -d"):gsub("%s+$", "")
        -- the server's certificate is for 127.0.0.1 alone (not "localhost")
        helper.test_certs(dir, "pg-test-ca")
        pg = postgres.start { ssl = { cert = dir .. "/leaf.pem", key = dir .. "/leaf.key" } }
        -- (PostgreSQL 15 lets only the owner create in the public schema)
        pg.psql("GRANT CREATE ON SCHEMA public TO PUBLIC")
        srv = helper.spawn_server { app = "spec/fixtures/pg_client.lua",
            env = { PG_PORT = pg.port },
            args = "--ssl-trusted-certificate " .. q(dir .. "/ca.pem") }
        url = "http://127.0.0.1:" .. srv.port
    end)

    teardown(function()
        if srv then
            srv:stop()
        end
        if pg then
            pg.stop()
        end
        if dir then
            os.execute(helper.tool("rm") .. " -rf " .. q(dir))
        end
    end)

    local function get(path)
        local out = helper.curl("-w '\\n%{http_code}' " .. q(url .. path))
        local body, code = out:match("^(.*)\n(%d+)$")
        assert(body, out)
        return tonumber(code), cjson.decode(body), body
    end

    it("logs in with SCRAM-SHA-256 and md5, and passes a parameter", function()
        for _, who in ipairs({ "scram", "md5" }) do
            local code, rows = get("/q?who=" .. who)
            assert.equal(200, code)
            assert.same(42, rows[1].n)
            assert.equal(postgres.users[who].user, rows[1].u)
        end
        -- application_name from the URL, percent-decoded (and the password: "md5%2Dsecret")
        local _, rows = get("/q?who=md5")
        assert.equal("ms app", rows[1].app)
    end)

    it("answers a wrong password with one clear error", function()
        for _, who in ipairs({ "scram", "md5" }) do
            local code, body = get("/wrong?who=" .. who)
            assert.equal(502, code)
            assert.equal("28P01", body.code)
            assert.matches("FATAL 28P01: password authentication failed for user", body.error)
        end
        assert.is_true(srv:alive())
        assert.falsy(srv:log():find("traceback", 1, true))
    end)

    it("sends hostile text as a value, never as SQL, and refuses NUL clearly", function()
        local hostile = "'); DROP TABLE pg_class; -- \"quoted\" \\ ; $1 $$x$$ é"
        local out = helper.curl("--data-binary " .. q(hostile) .. " " .. q(url .. "/echo"))
        local r = cjson.decode(out)
        assert.equal(hostile, r.t)
        local code, body = get("/nul")
        assert.equal(400, code)
        assert.equal("22021", body.code)
        assert.matches("0x00", body.error)
        assert.matches("NUL", body.sql)
    end)

    it("decodes each type, NULL apart from a missing value", function()
        local code, r = get("/types")
        assert.equal(200, code, cjson.encode(r))
        assert.equal(1, r.i2)
        assert.equal(2, r.i4)
        assert.equal("9007199254740993", r.big) -- beyond 2^53: kept exact, as text
        assert.equal(42, r.small)
        assert.equal(1.5, r.num) -- numeric = "number"
        assert.equal(0.25, r.f8)
        assert.is_true(r.yes)
        assert.is_false(r.no)
        assert.same({ a = { 1, cjson.null }, b = {} }, r.j)
        assert.same({}, r.jb)
        assert.same({ 1, 2, cjson.null }, r.ints)
        assert.same({ "a,b", 'q"x', cjson.null }, r.texts)
        assert.equal("2026-01-02 03:04:05", r.ts)
        assert.same({ 0, 255 }, r.bin)
        assert.equal(cjson.null, r.nothing)
        assert.is_true(r.nothing_is_null)
        assert.equal(cjson.null, r.p_null)
        assert.same({ 1, 2 }, r.p_arr)
        assert.same({ k = "v" }, r.p_json)
        assert.same({ 1, 2 }, r.p_bin)
        assert.is_true(r.p_bool)
    end)

    it("returns errors with their SQLSTATE and fields, the connection usable after", function()
        local code, r = get("/error")
        assert.equal(200, code)
        assert.equal("22012", r.div_code)
        assert.equal("ERROR 22012: division by zero", r.div)
        assert.equal("23505", r.uniq_code)
        assert.equal("Key (k)=(x) already exists.", r.uniq_detail)
        assert.equal("uniq_pkey", r.uniq_constraint)
        assert.equal("42601", r.syntax_code)
        assert.equal(1, r.syntax_position)
        assert.equal("ERROR", r.severity)
        assert.equal(7, tonumber(r.after))
    end)

    it("commits a transaction, and rolls back on a raise, a failed query or nil, err", function()
        local _, r = get("/tx?how=commit")
        assert.equal("done", r.ok)
        assert.same({ "committed" }, r.bodies)
        _, r = get("/tx?how=raise")
        assert.equal(cjson.null, r.ok)
        assert.matches("boom", r.err)
        assert.same({}, r.bodies)
        _, r = get("/tx?how=fail")
        assert.matches("22P02", r.err)
        assert.same({}, r.bodies)
        _, r = get("/tx?how=return")
        assert.equal("changed my mind", r.err)
        assert.same({}, r.bodies)
        -- a nested transaction is a savepoint: its rollback leaves the outer one's work
        _, r = get("/tx?how=nested")
        assert.equal("outer kept", r.ok)
        assert.same({ "outer" }, r.bodies)
        -- no session left in a transaction: the pool took back only idle ones
        assert.equal("0", pg.psql("SELECT count(*) FROM pg_stat_activity WHERE state LIKE "
            .. "'idle in transaction%'"))
    end)

    it("keeps a statement prepared per connection, bounded, least recently used out", function()
        local _, r = get("/cache")
        assert.equal(r.pid, r.pid_after) -- one connection throughout
        -- three runs of one statement: parsed once
        local n = 0
        for _, sql in ipairs(r.before) do
            if sql == "SELECT 42 AS v" then
                n = n + 1
            end
        end
        assert.equal(1, n, cjson.encode(r.before))
        -- statement_cache = 3: the three newest are left (the last, the query that lists them)
        assert.same({ "SELECT 2 AS b", "SELECT 3 AS c",
            "SELECT statement FROM pg_prepared_statements ORDER BY name" }, r.after)
    end)

    it("parses a cached statement anew when its table changed", function()
        local code, r = get("/altered")
        assert.equal(200, code, cjson.encode(r))
        assert.same({ { a = 1 } }, r.first)
        assert.same({ { a = 1, b = "x" } }, r.second)
        assert.matches("0A000", r.tx_err)
        assert.same({ { a = 1, b = "x", c = 3 } }, r.third)
    end)

    it("reuses pooled connections across requests, and caps them at pool_size", function()
        for _ = 1, 5 do
            assert.equal(200, (get("/q?who=md5")))
        end
        assert.equal(1, pg.connections(postgres.users.md5.user))
        local load = io.popen(helper.tool("wrk") .. " -t2 -c16 -d2s '" .. url
            .. "/q?who=scram' 2>&1")
        local most = 0
        for _ = 1, 6 do
            socket.sleep(0.25)
            local n = pg.connections(postgres.users.scram.user)
            most = math.max(most, n)
        end
        local out = load:read("*a")
        load:close()
        assert.truthy(out:find("requests in", 1, true), out)
        assert.falsy(out:find("Non-2xx", 1, true), out)
        -- the app's clients of scram_user: pool_size 4 and 1 (the `single` client)
        assert.is_true(most >= 2 and most <= 5, "sessions: " .. most)
    end)

    it("waits for a connection in a bounded backlog, and drops idle ones after idle_timeout",
        function()
        local code, r = get("/backlog")
        assert.equal(200, code)
        table.sort(r)
        assert.same({ "ok", "ok" }, { r[2], r[3] }, cjson.encode(r))
        assert.matches("too many waiting connect operations", r[1])
        local function sessions(app)
            return pg.psql("SELECT count(*) FROM pg_stat_activity WHERE application_name = '"
                .. app .. "'")
        end
        assert.equal("1", sessions("narrow"))
        assert.equal(200, (get("/idle")))
        assert.equal("1", sessions("brief"))
        assert.truthy(helper.wait_for(function() return sessions("brief") == "0" end, 3))
    end)

    it("cancels a query that outlives its timeout (57014), the connection usable after", function()
        local code, r = get("/slow")
        assert.equal(200, code)
        assert.equal("57014", r.code)
        assert.matches("canceling statement due to user request", r.err)
        assert.is_true(r.took < 2, "took " .. r.took)
        assert.equal(5, r.five)
        assert.is_true(r.same) -- the same session, still pooled
    end)

    it("streams a large result without holding it", function()
        local code, r = get("/big?n=200000")
        assert.equal(200, code, cjson.encode(r))
        assert.equal(200000, r.count)
        assert.equal(200000 * 200001 / 2, r.sum)
        assert.equal(200000, r.affected)
        -- the rows, held, would be some 40 MB of Lua heap
        assert.is_true(r.peak_kb < 8 * 1024, "peak " .. r.peak_kb .. " KB")
    end)

    it("passes on an error raised for a row, the client usable after", function()
        local code, r = get("/raise")
        assert.equal(200, code, cjson.encode(r))
        assert.is_false(r.ok)
        assert.matches("stop here", r.err)
        assert.equal(1, r.one)
        assert.equal(cjson.null, r.tx_ok)
        assert.matches("in tx", r.tx_err)
        assert.is_false(r.table_made) -- the transaction's work did not stay
    end)

    it("runs several statements through the simple protocol", function()
        local code, r = get("/exec")
        assert.equal(200, code)
        assert.equal(3, tonumber(r.s))
        assert.equal(4, r.n)
        assert.equal(2, r.inserted)
    end)

    it("speaks TLS as sslmode says: require, verify-ca and verify-full", function()
        local code, r = get("/tls?host=127.0.0.1&mode=require")
        assert.equal(200, code, cjson.encode(r))
        assert.is_true(r.ssl)
        code, r = get("/tls?host=127.0.0.1&mode=verify-full")
        assert.equal(200, code, cjson.encode(r))
        assert.is_true(r.ssl)
        code, r = get("/tls?host=127.0.0.1&mode=disable")
        assert.equal(200, code)
        assert.is_false(r.ssl)
        -- "localhost" is not a name of the certificate: verify-full refuses, verify-ca takes it
        code, r = get("/tls?host=localhost&mode=verify-full")
        assert.equal(502, code)
        assert.equal("08001", r.code)
        assert.matches("certificate host mismatch", r.error)
        code, r = get("/tls?host=localhost&mode=verify-ca")
        assert.equal(200, code, cjson.encode(r))
        assert.is_true(r.ssl)
    end)

    it("survives a server restart mid-pool: dead pooled connections are dropped", function()
        for _ = 1, 3 do
            assert.equal(200, (get("/q?who=scram")))
        end
        assert.is_true(pg.connections(postgres.users.scram.user) >= 1)
        pg.restart()
        for _ = 1, 3 do
            local code, r = get("/q?who=scram")
            assert.equal(200, code, cjson.encode(r))
            assert.equal(42, r[1].n)
        end
        assert.is_true(srv:alive())
    end)

    it("retries once on a new connection when the pooled one's session ended unrun", function()
        local _, r = get("/lone")
        local pid = r.pid
        -- The server process of the pooled session is stopped and told to end: the query is
        -- sent to it, and when it goes on it ends (57P01) without running it.
        assert(os.execute("kill -STOP " .. pid) == 0)
        assert.equal("t", pg.psql("SELECT pg_terminate_backend(" .. pid .. ")"))
        local out = os.tmpname()
        local curl = helper.background(helper.tool("curl") .. " -sS -o " .. out .. " "
            .. q(url .. "/lone"))
        socket.sleep(0.3)
        assert(os.execute("kill -CONT " .. pid) == 0)
        assert.truthy(helper.wait_for(function() return helper.read_file(out) ~= "" end, 5))
        helper.stop_pid(curl)
        r = cjson.decode(helper.read_file(out))
        os.remove(out)
        assert.equal(1, r.retried, cjson.encode(r))
        assert.are_not.equal(pid, r.pid)
    end)

    it("never retries a query whose session ended while it ran", function()
        local _, r = get("/lone")
        local out = os.tmpname()
        local curl = helper.background(helper.tool("curl") .. " -sS -o " .. out .. " "
            .. q(url .. "/lone_sleep"))
        assert.truthy(helper.wait_for(function()
            return pg.psql("SELECT count(*) FROM pg_stat_activity WHERE pid = " .. r.pid
                .. " AND query LIKE '%pg_sleep(3)%'") == "1"
        end, 5))
        assert.equal("t", pg.psql("SELECT pg_terminate_backend(" .. r.pid .. ")"))
        assert.truthy(helper.wait_for(function() return helper.read_file(out) ~= "" end, 5))
        helper.stop_pid(curl)
        r = cjson.decode(helper.read_file(out))
        os.remove(out)
        assert.same({ ok = false, code = "57P01", retried = 0 }, r)
    end)

    it("costs little memory per idle pooled connection", function()
        local _, before = get("/mem")
        get("/fill?n=50")
        local _, after = get("/mem")
        local per_lua = (after.lua_kb - before.lua_kb) / 50
        local per_rss = (after.rss_kb - before.rss_kb) / 50
        print(string.format("# 50 idle pooled connections: Lua heap %+.1f KB (%.2f KB each), "
            .. "RSS %+d KB (%.1f KB each)", after.lua_kb - before.lua_kb, per_lua,
            after.rss_kb - before.rss_kb, per_rss))
        assert.is_true(per_lua < 16, per_lua)
    end)
end)

describe("moonserve.pg inside nginx (moonserve.openresty)", function()
    local pg, srv, url

    setup(function()
        pg = postgres.start()
        pg.psql("GRANT CREATE ON SCHEMA public TO PUBLIC")
        -- (read by the app file in nginx's master, from this process's environment)
        srv = helper.with_env({ PG_PORT = pg.port }, function()
            return helper.nginx_app { app = "spec/fixtures/pg_client.lua" }
        end)
        url = "http://127.0.0.1:" .. srv.port
    end)

    teardown(function()
        if srv then
            srv:stop()
        end
        if pg then
            pg.stop()
        end
    end)

    local function get(path)
        local out = helper.curl("-w '\\n%{http_code}' " .. q(url .. path))
        local body, code = out:match("^(.*)\n(%d+)$")
        assert(body, out)
        return tonumber(code), cjson.decode(body)
    end

    it("logs in, queries, decodes, commits and streams on the cosockets", function()
        for _, who in ipairs({ "scram", "md5" }) do
            local code, rows = get("/q?who=" .. who)
            assert.equal(200, code, cjson.encode(rows))
            assert.equal(42, rows[1].n)
        end
        local code, r = get("/types")
        assert.equal(200, code, cjson.encode(r))
        assert.equal("9007199254740993", r.big)
        assert.same({ 1, 2, cjson.null }, r.ints)
        code, r = get("/error")
        assert.equal(200, code)
        assert.equal("23505", r.uniq_code)
        code, r = get("/tx?how=raise")
        assert.equal(200, code)
        assert.same({}, r.bodies)
        code, r = get("/tx?how=commit")
        assert.equal(200, code)
        assert.same({ "committed" }, r.bodies)
        code, r = get("/big?n=50000")
        assert.equal(200, code, cjson.encode(r))
        assert.equal(50000, r.count)
        -- pooled across requests: the worker keeps one session of md5_user
        for _ = 1, 3 do
            get("/q?who=md5")
        end
        assert.equal(1, pg.connections(postgres.users.md5.user))
    end)
end)

