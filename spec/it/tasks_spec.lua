-- spec/it/tasks_spec.lua: timers, light threads and semaphores over a real server.
local helper = require "helper"
local socket = require "socket"

local function get(srv, path)
    local res = assert(helper.request(srv.port, "GET " .. path .. " HTTP/1.1\r\nHost: t\r\n\r\n"))
    return res.body, res.status
end

describe("timers, light threads and semaphores over a real server", function()
    local srv

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/tasks.lua",
            args = "--limit timers_pending=4" }
    end)

    teardown(function()
        srv:stop()
    end)

    local twice = helper.twice(it)

    twice("fires a timer, in its own coroutine, where moonserve.sleep works", function()
        assert.equal("true", get(srv, "/timer"))
        socket.sleep(0.3)
        assert.equal("false a b", get(srv, "/seen/timer"))
    end)

    twice("cancels a timer before it runs", function()
        assert.equal("true nil not pending", get(srv, "/cancel"))
        socket.sleep(0.25)
        assert.equal("not run", get(srv, "/seen/cancel"))
    end)

    twice("refuses timers past timers_pending with OpenResty's error", function()
        assert.equal("ok,ok,ok,ok,too many pending timers,too many pending timers",
            get(srv, "/cap?n=6"))
    end)

    twice("runs an every timer until it is cancelled", function()
        local at_cancel, after = get(srv, "/every"):match("^(%d+) (%d+)$")
        assert.is_true(tonumber(at_cancel) >= 4, at_cancel)
        assert.equal(at_cancel, after)
    end)

    twice("logs a timer's error with a reference, and the worker goes on", function()
        assert.equal("ok", get(srv, "/timer_error"))
        socket.sleep(0.1)
        assert.matches("%[%x+%] timer: [^\n]*boom in a timer", srv:log())
        assert.equal("true", get(srv, "/timer"))
        assert.is_true(srv:alive())
    end)

    twice("waits for the first light thread, and kills the other", function()
        assert.equal("true fast 2 true false killed false thread failed", get(srv, "/threads"))
    end)

    twice("keeps a request open until its light thread has answered", function()
        local t0 = socket.gettime()
        assert.equal("from the thread", get(srv, "/join"))
        assert.is_true(socket.gettime() - t0 >= 0.18)
    end)

    twice("waits on a semaphore with a timeout, posted by threads and timers", function()
        assert.equal("true,nil timeout,true,1,true", get(srv, "/semaphore"))
    end)

    for _, where in ipairs({ "handler", "thread", "timer" }) do
        twice("waits inside pcall, xpcall, coroutine.wrap and an iterator in a " .. where,
            function()
                local body = get(srv, "/matrix?in_=" .. where)
                local n = 0
                for name, v in body:gmatch("(%w+/%w+)=(%w+)") do
                    assert.equal("true", v, name .. " in " .. body)
                    n = n + 1
                end
                assert.equal(12, n, body)
            end)
    end

    twice("raises a clear error for a request's wait in a light thread", function()
        local s = helper.connect(srv.port)
        assert(s:send("POST /misuse HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc"))
        local res = assert(helper.read_response(s))
        s:close()
        assert.matches("^false [^\n]*req:body: cannot wait here: only the request's handler "
            .. "waits for its request", res.body)
    end)

    it("skips a timer's run past timers_running, and says so", function()
        local own = helper.spawn_server { app = "spec/fixtures/tasks.lua",
            args = "--limit timers_running=2" }
        assert.equal("2", get(own, "/running?n=4"))
        assert.matches("2 timers_running are not enough", own:log())
        own:stop()
    end)

    it("runs a pending timer early, with premature = true, when the worker stops", function()
        local own = helper.spawn_server { app = "spec/fixtures/tasks.lua" }
        local file = os.tmpname()
        os.remove(file)
        assert.equal("armed", get(own, "/premature?file=" .. file))
        assert.is_true(own:stop())
        assert.equal("premature=true", helper.read_file(file))
        os.remove(file)
    end)
end)
