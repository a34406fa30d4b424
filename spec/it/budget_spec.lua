-- spec/it/budget_spec.lua: the CPU budget (limits.handler_cpu_ms) on a real server of one
-- worker (spec/fixtures/runaway.lua): a handler that never yields, in each shape a runaway
-- takes, gets 503 and one log line with its route and a traceback, within the budget and two
-- ticks of the clock; the worker goes on serving, the same process, and its JIT still
-- compiles; a request waiting behind the runaway is answered; work in slices that yield is
-- never stopped; a route's own budget, a timer and a WebSocket (close 1011) too.
local helper = require "helper"
local socket = require "socket"

local BUDGET = 300 -- ms

local function get(srv, path)
    return helper.request(srv.port, "GET " .. path .. " HTTP/1.1\r\nHost: b\r\n"
        .. "Connection: close\r\n\r\n")
end

-- GET `path`: the reply and the seconds it took.
local function timed(srv, path)
    local t0 = socket.gettime()
    local res = get(srv, path)
    return res, socket.gettime() - t0
end

describe("the CPU budget", function()
    local srv

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/runaway.lua",
            args = "--workers 1 --limit handler_cpu_ms=" .. BUDGET }
    end)

    teardown(function()
        srv:stop()
    end)

    local pid
    before_each(function()
        local res = get(srv, "/hello")
        assert.equal(200, res.status)
        pid = pid or res.body:match("%d+$")
        -- always the same worker: a stop never costs the process
        assert.equal(pid, res.body:match("%d+$"))
    end)

    local function stopped(path, route)
        local log_before = #srv:log()
        local res, took = timed(srv, path)
        assert.equal(503, res.status, res.body)
        assert.matches("reference: %x+", res.body)
        -- within the budget and two ticks of the clock (10 ms each), with room for a busy
        -- machine
        assert.is_true(took >= BUDGET / 1000 * 0.9 and took < BUDGET / 1000 + 1,
            path .. " took " .. took)
        local log = srv:log():sub(log_before + 1)
        assert.matches("GET " .. path:gsub("%p", "%%%0") .. " %(route "
            .. route:gsub("%p", "%%%0") .. "%) ran out of its CPU budget %(%d+ ms without "
            .. "yielding; limits.handler_cpu_ms%)", log)
        assert.matches("runaway%.lua:%d+", log) -- where it was
        local _, lines = log:gsub("ran out of its CPU budget", "")
        assert.equal(1, lines, log)
        assert.equal(200, get(srv, "/hello").status)
    end

    it("stops a compiled loop with 503", function()
        stopped("/spin", "/spin")
    end)

    it("stops interpreted work", function()
        stopped("/interpreted", "/interpreted")
    end)

    it("stops a loop whose pcall would swallow the stop", function()
        stopped("/swallow", "/swallow")
    end)

    it("stops a loop in a coroutine of the handler's own", function()
        stopped("/coroutine", "/coroutine")
    end)

    it("stops a sort's comparator", function()
        stopped("/sort", "/sort")
    end)

    it("keeps a route's own budget", function()
        local res, took = timed(srv, "/short")
        assert.equal(503, res.status)
        assert.is_true(took < 0.25, "took " .. took)
    end)

    it("cuts off a reply whose head has left", function()
        local c = assert(socket.connect("127.0.0.1", srv.port))
        c:settimeout(10)
        c:send("GET /streaming HTTP/1.1\r\nHost: b\r\n\r\n")
        local all, err, partial = c:receive("*a")
        c:close()
        all = all or partial
        assert.is_nil(all:find("\r\n0\r\n\r\n", 1, true), all) -- no last chunk
        assert.matches("^HTTP/1%.1 200 ", all)
        assert.matches("part one\n", all)
        assert.is_true(err == nil or err == "closed", tostring(err))
    end)

    it("never stops work that yields between slices under the budget", function()
        local res = get(srv, "/slices?ms=" .. BUDGET * 3 .. "&slice=" .. BUDGET / 3)
        assert.equal(200, res.status)
        assert.equal("done", res.body)
    end)

    it("answers a request that waited behind the runaway", function()
        local c = assert(socket.connect("127.0.0.1", srv.port))
        c:settimeout(10)
        c:send("GET /spin HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
        socket.sleep(0.05)
        local res, took = timed(srv, "/hello")
        assert.equal(200, res.status)
        assert.is_true(took < BUDGET / 1000 + 1, "took " .. took)
        assert.matches(" 503 ", c:receive("*l"))
        c:close()
    end)

    it("stops a timer that never yields; the worker goes on", function()
        local log_before = #srv:log()
        local res = helper.request(srv.port, "POST /timer HTTP/1.1\r\nHost: b\r\n"
            .. "Content-Length: 0\r\nConnection: close\r\n\r\n")
        assert.equal(200, res.status)
        assert.is_true(helper.wait_for(function()
            return srv:log():find("ran out of its CPU budget", log_before + 1, true) ~= nil
        end, 5), srv:log():sub(log_before + 1))
        assert.equal(200, get(srv, "/hello").status)
    end)

    it("closes a WebSocket whose handler never yields with 1011", function()
        assert.equal(1011, helper.websocket_close_code(srv.port, "/ws", "spin"))
        assert.equal(200, get(srv, "/hello").status)
    end)

    it("leaves the JIT compiling after fifty stops", function()
        local before, after = helper.jit_rates(srv.port, 50, function()
            assert.equal(503, get(srv, "/short").status)
        end)
        assert.is_true(after > before / 2, before .. " then " .. after)
    end)
end)

describe("the CPU budget turned off", function()
    it("lets a handler run past where the budget would stop it (handler_cpu_ms=0)", function()
        local srv = helper.spawn_server { app = "spec/fixtures/runaway.lua",
            args = "--workers 1 --limit handler_cpu_ms=0" }
        finally(function() srv:stop() end)
        -- 600 ms in one slice: past the default of the describe above, never stopped
        local res = get(srv, "/slices?ms=600&slice=600")
        assert.equal(200, res.status)
        assert.is_nil(srv:log():find("CPU budget", 1, true))
    end)
end)
