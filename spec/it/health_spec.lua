-- spec/it/health_spec.lua: the health paths the core answers: live while the worker
-- serves, ready until the server stops, and ready through a reload's handover.
local helper = require "helper"
local socket = require "socket"

local function ask(s, method, path)
    assert(s:send(method .. " " .. path .. " HTTP/1.1\r\nHost: t\r\n\r\n"))
    return helper.read_response(s, method == "HEAD")
end

-- A keep-alive connection that has made one request already, and one with /slow in flight
-- (which keeps a stopping worker alive for `secs`).
local function connections(port, secs)
    local idle = helper.connect(port)
    assert.equal(200, ask(idle, "GET", "/hello").status)
    local busy = helper.connect(port)
    assert(busy:send("GET /slow?s=" .. secs .. " HTTP/1.1\r\nHost: t\r\n\r\n"))
    socket.sleep(0.2)
    return idle, busy
end

describe("health paths", function()
    it("are off by default, and answered by the core when asked for", function()
        local plain = helper.spawn_server { app = "spec/fixtures/app.lua" }
        local srv
        finally(function() -- (one finally a test: a second would replace the first)
            plain:stop()
            if srv then srv:stop() end
        end)
        local s = helper.connect(plain.port)
        assert.equal(404, ask(s, "GET", "/livez").status)
        s:close()

        srv = helper.spawn_server { app = "spec/fixtures/app.lua",
            args = "--livez /livez --readyz /health/ready" }
        s = helper.connect(srv.port)
        local res = ask(s, "GET", "/livez")
        assert.equal(200, res.status)
        assert.equal("ok\n", res.body)
        assert.equal("no-store", res.headers["cache-control"])
        res = ask(s, "HEAD", "/health/ready")
        assert.equal(200, res.status)
        assert.equal("3", res.headers["content-length"])
        -- Another method, or a path beside it, is the app's.
        assert.equal(404, ask(s, "POST", "/livez").status)
        assert.equal(404, ask(s, "GET", "/livez/x").status)
        assert.equal(404, ask(s, "GET", "/readyz").status)
        s:close()
    end)

    it("say not ready from TERM on, while the requests in flight finish", function()
        local srv = helper.spawn_server { app = "spec/fixtures/app.lua",
            args = "--livez /livez --readyz /readyz" }
        finally(function() srv:stop() end)
        local idle, busy = connections(srv.port, 1.5)
        os.execute("kill -TERM " .. srv.pid)
        socket.sleep(0.2)
        local res = ask(idle, "GET", "/readyz")
        assert.equal(503, res.status)
        assert.equal("stopping\n", res.body)
        assert.equal("close", res.headers.connection)
        assert.equal(200, helper.read_response(busy).status) -- the request in flight finished
        busy:close()
        idle:close()
    end)

    it("stays ready through a reload's handover", function()
        local srv = helper.spawn_server { app = "spec/fixtures/app.lua",
            args = "--workers 1 --readyz /readyz" }
        finally(function() srv:stop() end)
        assert.is_true(helper.wait_for(function() return #helper.children(srv.pid) == 1 end))
        local idle, busy = connections(srv.port, 1.5)
        os.execute("kill -HUP " .. srv.pid)
        assert.is_true(helper.wait_for(function()
            return srv:log():find("took over", 1, true) ~= nil
        end))
        socket.sleep(0.1)
        -- The old worker drains (its reply says close), and says the service is ready.
        local res = ask(idle, "GET", "/readyz")
        assert.equal(200, res.status)
        assert.equal("close", res.headers.connection)
        assert.equal(200, helper.read_response(busy).status)
        -- The new worker is ready too.
        local s = helper.connect(srv.port)
        assert.equal(200, ask(s, "GET", "/readyz").status)
        s:close()
        busy:close()
        idle:close()
    end)
end)
