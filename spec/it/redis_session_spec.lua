-- spec/it/redis_session_spec.lua: moonserve.session's Redis store with a real redis-server
-- and two instances: a session made on one is read on the other, Redis keeps its expiry, a
-- login rotates the id (the old one dead at once), revoke_user ends every session of a user on
-- both, and with Redis down a request with a session gets 503 at once, then all is well again.
local helper = require "spec.helper"
local socket = require "socket"
local cjson = require "cjson"

describe("sessions on Redis", function()
    local a, b, redis_pid, port

    local function start_redis()
        redis_pid = helper.redis_server(port)
    end

    setup(function()
        port = helper.free_port()
        start_redis()
        local env = { REDIS_URL = "redis://127.0.0.1:" .. port .. "/3", SESSION_TTL = "3" }
        a = helper.spawn_server { app = "spec/fixtures/redis_session.lua", env = env,
            args = "--workers 2" }
        b = helper.spawn_server { app = "spec/fixtures/redis_session.lua", env = env,
            args = "--workers 2" }
    end)

    teardown(function()
        if a then a:stop() end
        if b then b:stop() end
        helper.stop_pid(redis_pid)
    end)

    local function req(srv, method, path, cookie)
        local r = assert(helper.request(srv.port, method .. " " .. path
            .. " HTTP/1.1\r\nHost: s.test\r\nContent-Length: 0\r\n"
            .. (cookie and ("Cookie: " .. cookie .. "\r\n") or "") .. "\r\n"))
        r.cookie = (r.headers["set-cookie"] or ""):match("^(session=[^;]*)")
        return r
    end

    local function login(srv, id, name, cookie)
        local r = req(srv, "POST", "/login?id=" .. id .. "&name=" .. name, cookie)
        assert.equal(200, r.status, srv:log():sub(-600))
        return r.cookie, cjson.decode(r.body).id
    end

    it("reads a session made on one instance on the other, and Redis keeps its expiry",
        function()
            local c, id = login(a, 7, "ada")
            assert.equal("ada\n", req(b, "GET", "/me", c).body)
            assert.equal("ada\n", req(a, "GET", "/me", c).body)
            -- The record is Redis's, with the session's max_age as its TTL.
            local c2 = assert(socket.connect("127.0.0.1", port))
            c2:settimeout(2)
            c2:send("SELECT 3\r\nTTL t:session:" .. id .. "\r\n")
            assert.equal("+OK", c2:receive())
            local ttl = tonumber(c2:receive():match("^:(%-?%d+)"))
            c2:close()
            assert.is_true(ttl >= 1 and ttl <= 3, "TTL " .. tostring(ttl))
            socket.sleep(3.2)
            local r = req(b, "GET", "/me", c)
            assert.equal(401, r.status)
        end)

    it("rotates the id at login: the old id is dead at once, on every instance", function()
        local c1, id1 = login(a, 8, "bob")
        local c2, id2 = login(b, 8, "bob", c1)
        assert.not_equal(id1, id2)
        assert.equal(401, req(a, "GET", "/me", c1).status)
        assert.equal(401, req(b, "GET", "/me", c1).status)
        assert.equal("bob\n", req(a, "GET", "/me", c2).body)
    end)

    it("revokes every session of a user at once, on both instances", function()
        local p1 = login(a, 9, "cy")
        local p2 = login(b, 9, "cy")
        local other = login(a, 10, "di")
        assert.equal("cy\n", req(b, "GET", "/me", p1).body)
        local r = req(b, "POST", "/logout_all", p2)
        assert.equal("ended 2\n", r.body)
        assert.equal(401, req(a, "GET", "/me", p1).status)
        assert.equal(401, req(b, "GET", "/me", p1).status)
        assert.equal(401, req(a, "GET", "/me", p2).status)
        assert.equal("di\n", req(a, "GET", "/me", other).body)
        -- Destroying a session (log out) ends it for the other instance too.
        assert.equal("bye\n", req(a, "POST", "/logout", other).body)
        assert.equal(401, req(b, "GET", "/me", other).status)
    end)

    it("keeps a user signed out when a request regenerates after revoke_user", function()
        local c, id = login(a, 12, "fay")
        local r = req(b, "POST", "/regenerate_late", c)
        assert.equal("late\n", r.body)
        -- Nothing stored: the browser is told to drop the cookie, no new id is given.
        assert.matches("^session=;", r.headers["set-cookie"] or "")
        assert.equal(401, req(a, "GET", "/me", c).status)
        local c2 = assert(socket.connect("127.0.0.1", port))
        c2:settimeout(2)
        c2:send("SELECT 3\r\nEXISTS t:session:user:12\r\nHEXISTS t:session:" .. id
            .. " d\r\n")
        assert.equal("+OK", c2:receive())
        assert.equal(":0", c2:receive(), "the user's set stays empty")
        assert.equal(":0", c2:receive())
        c2:close()
        -- A new login still works (a new session has no stored id to end).
        local c3 = login(a, 12, "fay")
        assert.equal("fay\n", req(b, "GET", "/me", c3).body)
    end)

    it("costs a login the same however many sessions its user has", function()
        -- 20,000 ended sessions in the user's set, as many logins over max_age leave
        local n = 20000
        local parts = { "*" .. (n + 2) .. "\r\n$4\r\nSADD\r\n$17\r\nt:session:user:13\r\n" }
        for i = 1, n do
            local m = "gone" .. i
            parts[#parts + 1] = "$" .. #m .. "\r\n" .. m .. "\r\n"
        end
        local c2 = assert(socket.connect("127.0.0.1", port))
        c2:settimeout(2)
        c2:send("SELECT 3\r\n" .. table.concat(parts))
        assert.equal("+OK", c2:receive())
        assert.equal(":" .. n, c2:receive())
        local c = login(a, 13, "gus")
        assert.equal("gus\n", req(b, "GET", "/me", c).body)
        -- the login looked at a sample only (it used to walk, and empty, the whole set), and
        -- what it looked at and found ended is gone
        c2:send("SCARD t:session:user:13\r\n")
        local left = tonumber(c2:receive():match("^:(%d+)"))
        c2:close()
        assert.is_true(left > n - 100 and left <= n, "left " .. left)
    end)

    it("answers 503 while Redis is down, and serves again when it is back", function()
        local c = login(a, 11, "ed")
        helper.stop_pid(redis_pid)
        local t0 = socket.gettime()
        local r = req(a, "GET", "/me", c)
        assert.equal(503, r.status)
        assert.equal("1", r.headers["retry-after"])
        assert.is_true(socket.gettime() - t0 < 1.5, "within the client's timeout")
        -- A request without a session passes: there is nothing to read.
        assert.equal(401, req(b, "GET", "/me").status)
        for _ = 1, 6 do
            assert.equal(503, req(a, "GET", "/me", c).status)
        end
        -- one line per worker when the outage starts, not one per request
        local _, lines = a:log():gsub("session store failed: ", "")
        assert.is_true(lines >= 1 and lines <= 2, a:log())
        start_redis()
        -- Redis came back empty: the session is gone, a new login works, nothing restarted.
        assert.equal(401, req(a, "GET", "/me", c).status)
        -- (each worker that refused says so at its next request)
        assert.is_true(helper.wait_for(function()
            req(a, "GET", "/me", c)
            return a:log():find("session store answers again %(%d+ requests refused%)") ~= nil
        end, 5), a:log())
        local c2 = login(b, 11, "ed")
        assert.equal("ed\n", req(a, "GET", "/me", c2).body)
        assert.is_true(a:alive() and b:alive())
    end)
end)
