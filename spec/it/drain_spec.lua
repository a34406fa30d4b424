-- The drain contract with load balancers: from TERM (or QUIT) readyz answers 503 at once, the
-- instance keeps accepting and serving for the drain delay, replies say close, HTTP/2 gets
-- GOAWAY, WebSockets close 1001, event streams end; then the listeners close and what is in
-- flight finishes. And the agent-check responder for HAProxy.
local helper = require "helper"
local socket = require "socket"
local fleet = require "fleet_helper"

local APP = "spec/fixtures/fleet.lua"
local BIN = os.getenv("MOONSERVE_BIN") or (helper.root .. "/lua/bin/moonserve")

local function ask(s, path)
    assert(s:send("GET " .. path .. " HTTP/1.1\r\nHost: t\r\n\r\n"))
    return helper.read_response(s)
end

-- The line the agent-check answers on `port`.
local function agent(port)
    local s = assert(socket.connect("127.0.0.1", port))
    s:settimeout(2)
    local line = s:receive("*l")
    s:close()
    return line
end

-- Runs fleet_client.py `case` against `port` in the background; returns a function that
-- waits for it to print `name=`, and one that waits for its end and returns its output.
local function client(case, port)
    local out = os.tmpname()
    local pid = fleet.background(string.format("%s %s/spec/it/fleet_client.py %s %d",
        helper.tool("h2"), helper.sh_quote(helper.root), case, port), out)
    local function saw(name)
        return helper.wait_for(function()
            return helper.read_file(out):find(name .. "=", 1, true) ~= nil
        end, 10)
    end
    local function finish()
        fleet.wait_exit(pid, 15)
        local text = helper.read_file(out)
        os.remove(out)
        return text
    end
    return saw, finish
end

describe("the drain", function()
    it("answers readyz 503 at once, serves through the delay, then refuses", function()
        local srv = helper.spawn_server { app = APP,
            args = "--workers 2 --readyz /readyz --drain-delay 2 --agent-check 127.0.0.1:"
                .. helper.free_port() }
        finally(function() srv:stop() end)
        assert.equal(200, fleet.get(srv.port, "/readyz"))
        local idle = helper.connect(srv.port)
        assert.equal(200, ask(idle, "/hello").status)
        local quiet = helper.connect(srv.port)
        assert.equal(200, ask(quiet, "/hello").status)
        local busy = helper.connect(srv.port)
        assert(busy:send("GET /slow?s=3 HTTP/1.1\r\nHost: t\r\n\r\n"))
        socket.sleep(0.2)
        local t0 = socket.gettime()
        os.execute("kill -TERM " .. srv.pid)
        socket.sleep(0.2)
        -- Not ready at once, but still accepting and serving: every reply says close.
        assert.equal(503, fleet.get(srv.port, "/readyz"))
        local fresh = helper.connect(srv.port)
        local res = ask(fresh, "/hello")
        assert.equal(200, res.status)
        assert.equal("close", res.headers.connection)
        fresh:close()
        -- A keep-alive connection idle past the stop's grace (1 s) is still open while
        -- the balancer may send on it: its request is served, with close.
        socket.sleep(1.3 - (socket.gettime() - t0))
        res = ask(idle, "/hello")
        assert.equal(200, res.status)
        assert.equal("close", res.headers.connection)
        assert.is_true(helper.closed(idle, 1))
        -- Made during the delay, its request not yet sent: it gets a grace after the delay.
        local late = helper.connect(srv.port)
        -- Past the delay: refused. A kept-alive connection idle all through the delay closes
        -- as the listeners do (a balancer trying the instance again after a failure timeout
        -- of about the grace would pick it as it closed).
        socket.sleep(2.3 - (socket.gettime() - t0))
        assert.is_nil(fleet.get(srv.port, "/hello"))
        assert.is_true(helper.closed(quiet, 0.3))
        res = ask(late, "/hello")
        assert.equal(200, res.status)
        assert.equal("close", res.headers.connection)
        late:close()
        -- The request in flight finishes after the listeners closed.
        res = helper.read_response(busy)
        assert.equal(200, res.status)
        assert.equal("close", res.headers.connection)
        busy:close()
        assert.is_true(fleet.wait_exit(srv.pid, 5))
        -- One line at each step.
        local log = srv:log()
        assert.matches("signal 15: draining 2 workers: not ready, accepting for 2 s more", log)
        assert.matches("drain: not ready; accepting for 2 s more, replies say close", log)
        assert.matches("drain: listeners closed; %d connections? finishing", log)
        assert.matches("drain: the listening sockets are closed; 2 workers finishing", log)
        -- One line a worker at the start (the drain's, not a "signal 15" one too).
        local _, drains = log:gsub("drain: not ready; accepting", "")
        assert.equal(2, drains, log)
        assert.is_nil(log:find("signal 15: stopping", 1, true), log)
    end)

    it("on QUIT as on TERM, and in a single process too (MOONSERVE_DRAIN_DELAY)", function()
        local srv = helper.spawn_server { app = APP, args = "--readyz /readyz",
            env = { MOONSERVE_DRAIN_DELAY = "1" } }
        finally(function() srv:stop() end)
        os.execute("kill -QUIT " .. srv.pid)
        socket.sleep(0.2)
        assert.equal(503, fleet.get(srv.port, "/readyz"))
        assert.equal(200, fleet.get(srv.port, "/hello"))
        assert.is_true(fleet.wait_exit(srv.pid, 5))
        assert.is_nil(fleet.get(srv.port, "/hello"))
    end)

    it("cuts a drain's delay short on INT, with workers and in a single process", function()
        for _, args in ipairs({ "--workers 2 --readyz /readyz", "--readyz /readyz" }) do
            local srv = helper.spawn_server { app = APP, args = args .. " --drain-delay 30" }
            finally(function() srv:stop() end)
            os.execute("kill -TERM " .. srv.pid)
            socket.sleep(0.3)
            assert.equal(503, fleet.get(srv.port, "/readyz"))
            local t0 = socket.gettime()
            os.execute("kill -INT " .. srv.pid)
            assert.is_true(fleet.wait_exit(srv.pid, 5), args)
            assert.is_true(socket.gettime() - t0 < 2, args)
            assert.matches("signal 2: the drain's delay is cut short: stopping", srv:log())
        end
    end)

    it("says nothing of a USR2 (a handover) that comes during a drain", function()
        local srv = helper.spawn_server { app = APP, args = "--readyz /readyz",
            env = { MOONSERVE_DRAIN_DELAY = "1" } }
        finally(function() srv:stop() end)
        os.execute("kill -TERM " .. srv.pid)
        socket.sleep(0.2)
        os.execute("kill -USR2 " .. srv.pid)
        assert.is_true(fleet.wait_exit(srv.pid, 5))
        assert.is_nil(srv:log():find("signal 12", 1, true), srv:log())
    end)

    it("stops at once on INT, and with no readiness probe has no delay by default", function()
        for _, case in ipairs({ { sig = "INT", args = "--readyz /readyz" }, { sig = "TERM" } }) do
            local srv = helper.spawn_server { app = APP, args = case.args }
            local t0 = socket.gettime()
            os.execute("kill -" .. case.sig .. " " .. srv.pid)
            assert.is_true(fleet.wait_exit(srv.pid, 5))
            assert.is_true(socket.gettime() - t0 < 0.9, case.sig)
        end
    end)

    it("sends HTTP/2 a GOAWAY, and the stream under way finishes", function()
        local srv = helper.spawn_server { app = APP, args = "--readyz /readyz --drain-delay 1" }
        finally(function() srv:stop() end)
        local saw, finish = client("goaway", srv.port)
        assert.is_true(saw("sent"))
        socket.sleep(0.3)
        os.execute("kill -TERM " .. srv.pid)
        local out = finish()
        -- RFC 9113 6.8: a notice with the largest id, then the last stream taken (1).
        assert.matches("goaway=2147483647\n", out, 1, true)
        assert.matches("goaway=1\n", out, 1, true)
        assert.matches("status=200\n", out, 1, true)
        assert.matches("eof=1\n", out, 1, true)
    end)

    it("sends a GOAWAY to an HTTP/2 connection made during the delay, after its stream", function()
        local srv = helper.spawn_server { app = APP, args = "--readyz /readyz --drain-delay 3" }
        finally(function() srv:stop() end)
        os.execute("kill -TERM " .. srv.pid)
        socket.sleep(0.2)
        local _, finish = client("goaway", srv.port)
        local out = finish()
        -- At once, before the reply of the stream it took (not when the listeners close).
        assert.matches("goaway=1\n", out, 1, true)
        assert.is_true(out:find("goaway=1\n", 1, true) < out:find("status=200\n", 1, true), out)
        assert.matches("eof=1\n", out, 1, true)
    end)

    it("closes WebSockets with 1001", function()
        local srv = helper.spawn_server { app = APP, args = "--readyz /readyz --drain-delay 1" }
        finally(function() srv:stop() end)
        local saw, finish = client("ws", srv.port)
        assert.is_true(saw("open"))
        os.execute("kill -TERM " .. srv.pid)
        local out = finish()
        assert.matches("open=1\n", out, 1, true)
        assert.matches("close=1001 server stopping\n", out, 1, true)
    end)

    it("ends event streams cleanly", function()
        local srv = helper.spawn_server { app = APP, args = "--readyz /readyz --drain-delay 1" }
        finally(function() srv:stop() end)
        local s = helper.connect(srv.port)
        assert(s:send("GET /events HTTP/1.1\r\nHost: t\r\n\r\n"))
        local res = helper.read_response(s, true)
        assert.equal(200, res.status)
        assert.equal("chunked", res.headers["transfer-encoding"])
        os.execute("kill -TERM " .. srv.pid)
        -- The chunks until the last (0), then the close: the client sees a whole reply.
        s:settimeout(3)
        local rest = s:receive("*a")
        assert.matches("\r\n0\r\n\r\n$", rest)
        s:close()
    end)
end)

describe("the agent-check", function()
    it("says ready, maint while the file exists, and drain from TERM", function()
        local dir = fleet.tempdir()
        local port = helper.free_port()
        local srv = helper.spawn_server { app = APP, args = string.format("--workers 1 "
            .. "--agent-check 127.0.0.1:%d --agent-maint %s/maint --drain-delay 1", port, dir) }
        finally(function()
            srv:stop()
            fleet.cleanup(dir)
        end)
        assert.equal("ready", agent(port))
        helper.write_file(dir .. "/maint", "")
        assert.equal("maint", agent(port))
        os.remove(dir .. "/maint")
        assert.equal("ready", agent(port))
        -- A reload is no drain: the master answers, and stays ready.
        os.execute("kill -HUP " .. srv.pid)
        assert.is_true(helper.wait_for(function()
            return srv:log():find("took over", 1, true) ~= nil
        end))
        assert.equal("ready", agent(port))
        os.execute("kill -TERM " .. srv.pid)
        socket.sleep(0.2)
        assert.equal("drain", agent(port))
        assert.is_true(fleet.wait_exit(srv.pid, 5))
        assert.is_nil(socket.connect("127.0.0.1", port))
    end)

    it("answers in a single process too", function()
        local port = helper.free_port()
        local srv = helper.spawn_server { app = APP,
            args = "--agent-check 127.0.0.1:" .. port .. " --drain-delay 1" }
        finally(function() srv:stop() end)
        assert.equal("ready", agent(port))
        os.execute("kill -TERM " .. srv.pid)
        socket.sleep(0.2)
        assert.equal("drain", agent(port))
    end)

    it("ends with a FIN, not a reset, when the checker sent a line of its own (agent-send)",
        function()
        local port = helper.free_port()
        local srv = helper.spawn_server { app = APP,
            args = "--workers 1 --agent-check 127.0.0.1:" .. port }
        finally(function() srv:stop() end)
        local _, finish = client("agent-send", port)
        local out = finish()
        assert.equal(string.rep("end=b'ready\\n' fin\n", 3), out)
    end)

    it("refuses a bad address", function()
        local out = helper.run(BIN .. " --check " .. helper.root .. "/"
            .. APP .. " --agent-check nowhere 2>&1")
        assert.matches("%-%-agent%-check needs ADDR:PORT", out)
        out = helper.run(BIN .. " --check " .. helper.root .. "/"
            .. APP .. " --drain-delay -1 2>&1")
        assert.matches("%-%-drain%-delay needs a number of seconds", out)
    end)
end)
