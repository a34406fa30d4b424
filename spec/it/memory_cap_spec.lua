-- spec/it/memory_cap_spec.lua: the memory cap (limits.lua_memory) on a real server of one
-- worker (spec/fixtures/runaway.lua): code that allocates without end, in each shape that
-- takes, gets 503 and one log line with its route and where it was; the worker collects and
-- goes on serving, the same process, while another client's requests keep their latency; a
-- timer and a WebSocket (close 1011) too; a worker whose heap stays near the cap after the
-- collection (a leak) is replaced by its master, and what it had in flight finishes.
local helper = require "helper"
local socket = require "socket"

local CAP = 64 * 1048576

local function get(srv, path)
    return helper.request(srv.port, "GET " .. path .. " HTTP/1.1\r\nHost: m\r\n"
        .. "Connection: close\r\n\r\n")
end

local function heap(srv)
    return tonumber(get(srv, "/memory/heap").body)
end

local function pid_of(srv)
    local res = get(srv, "/hello")
    assert.equal(200, res.status)
    return res.body:match("%d+$")
end

local function spawn(cap)
    return helper.spawn_server { app = "spec/fixtures/runaway.lua",
        args = "--workers 1 --limit lua_memory=" .. cap }
end

describe("the memory cap", function()
    local srv, pid

    setup(function()
        srv = spawn(CAP)
        pid = pid_of(srv)
    end)

    teardown(function()
        srv:stop()
    end)

    after_each(function()
        -- always the same worker: a stop never costs the process
        assert.equal(pid, pid_of(srv))
    end)

    local function stopped(path)
        local log_before = #srv:log()
        local before = heap(srv)
        local res = get(srv, path)
        assert.equal(503, res.status, res.body)
        assert.matches("reference: %x+", res.body)
        local log = srv:log():sub(log_before + 1)
        assert.matches("GET " .. path:gsub("%p", "%%%0") .. " %(route "
            .. path:gsub("%p", "%%%0") .. "%) ran out of memory %(the Lua heap reached "
            .. "limits.lua_memory, " .. CAP .. " bytes%)", log)
        assert.matches("runaway%.lua:%d+: in function 'handle'", log) -- where it was
        local _, lines = log:gsub("ran out of memory", "")
        assert.equal(1, lines, log)
        -- the collection after the stop gave the heap back
        assert.is_true(heap(srv) < before + 4 * 1048576, before .. " then " .. heap(srv))
        assert.is_nil(log:find("replace", 1, true), log)
    end

    it("stops a table that grows without end, in a compiled loop, with 503", function()
        stopped("/memory/hog")
    end)

    it("stops strings kept without end", function()
        stopped("/memory/strings")
    end)

    it("stops code whose pcall swallows the memory error", function()
        stopped("/memory/swallow")
    end)

    it("stops a timer that allocates without end; the worker goes on", function()
        local log_before = #srv:log()
        local res = helper.request(srv.port, "POST /memory/timer HTTP/1.1\r\nHost: m\r\n"
            .. "Content-Length: 0\r\nConnection: close\r\n\r\n")
        assert.equal(200, res.status)
        assert.is_true(helper.wait_for(function()
            return srv:log():find("timer ran out of memory", log_before + 1, true) ~= nil
        end, 5), srv:log():sub(log_before + 1))
    end)

    it("closes a WebSocket whose handler allocates without end with 1011", function()
        assert.equal(1011, helper.websocket_close_code(srv.port, "/ws", "hog"))
    end)

    it("leaves the JIT compiling after twenty stops", function()
        local before, after = helper.jit_rates(srv.port, 20, function()
            assert.equal(503, get(srv, "/memory/hog").status)
        end)
        assert.is_true(after > before / 2, before .. " then " .. after)
    end)

    it("keeps another client's latency while allocations are stopped", function()
        local function p99_max(n)
            local ts = {}
            for i = 1, n do
                local t0 = socket.gettime()
                assert.equal(200, get(srv, "/hello").status)
                ts[i] = socket.gettime() - t0
                socket.sleep(0.002)
            end
            table.sort(ts)
            return ts[math.ceil(n * 0.99)], ts[n]
        end
        local calm = p99_max(200)
        -- a second client asks for /hog back to back meanwhile
        local hogs = helper.background(string.format("%s -s 'http://127.0.0.1:%d/memory/hog?[1-40]'",
            helper.tool("curl"), srv.port))
        finally(function() helper.stop_pid(hogs) end)
        local log_before = #srv:log()
        local p99, max = p99_max(300)
        local _, stops = srv:log():sub(log_before + 1):gsub("ran out of memory", "")
        assert.is_true(stops >= 5, stops .. " stops")
        -- each of the hog's runs holds the loop for as long as it allocates up to the cap and
        -- a collection: a wait of that size, never a hang
        assert.is_true(max < 1, "max " .. max)
        assert.is_true(p99 < calm + 0.5, "p99 " .. p99 .. " against " .. calm)
    end)
end)

describe("the memory cap and a leak", function()
    it("has the master replace a worker whose heap stays near the cap; its requests finish",
        function()
        local srv = spawn(CAP)
        finally(function() srv:stop() end)
        local old = pid_of(srv)
        -- 52 MiB kept: past three quarters of the cap once a stop collects
        assert.equal(200, get(srv, "/memory/keep?mb=52").status)
        local c = assert(socket.connect("127.0.0.1", srv.port))
        c:settimeout(10)
        c:send("GET /slow?s=1 HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
        socket.sleep(0.1)
        assert.equal(503, get(srv, "/memory/hog").status)
        assert.is_true(helper.wait_for(function()
            return pid_of(srv) ~= old
        end, 10), srv:log())
        -- the old worker drained: its slow request finished
        local slow = helper.read_response(c)
        c:close()
        assert.equal(200, slow.status)
        assert.equal("slow " .. old, slow.body)
        local log = srv:log()
        assert.matches("its Lua heap stays at %d+ bytes after a collection, past three quarters "
            .. "of limits.lua_memory: it asks the master for a replacement", log)
        assert.matches("worker 0 %(pid " .. old .. "%) asks to be replaced", log)
        assert.is_true(helper.wait_for(function()
            return srv:log():find("worker 0 (pid " .. old .. ") finished draining", 1, true) ~= nil
        end, 5), log)
        -- the new worker's heap is its own
        assert.is_true(heap(srv) < 16 * 1048576)
    end)
end)

describe("the memory cap turned off", function()
    it("lets the heap grow past where the cap would stop it (lua_memory=0)", function()
        local srv = spawn(0)
        finally(function() srv:stop() end)
        assert.equal(200, get(srv, "/memory/keep?mb=80").status)
        assert.is_true(heap(srv) > 80 * 1048576)
        assert.is_nil(srv:log():find("memory", 1, true))
    end)
end)
