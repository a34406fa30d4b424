-- spec/it/faults_spec.lua: faults injected under load, each with its outcome counted (the
-- figures are in PERFORMANCE.md, "Faults under load"): a worker killed with SIGKILL loses
-- only what it had in flight and is replaced; descriptors exhausted refuse new connections
-- with one log line and no busy loop, and service comes back; Redis and PostgreSQL killed
-- and started again give clean errors within their timeouts, and the handlers recover
-- without a restart. (A full disk under the access log is in accesslog_spec, a worker killed
-- holding a shared dictionary's lock in shared_spec.)
local helper = require "helper"
local socket = require "socket"

local FIXTURE = "spec/fixtures/faults.lua"

local function get(port, path)
    return helper.request(port, "GET " .. path .. " HTTP/1.1\r\nHost: f\r\nConnection: close\r\n\r\n")
end

local function children(pid)
    return helper.children(pid)
end

local function note(fmt, ...)
    io.stdout:write("# measured: ", string.format(fmt, ...), "\n")
end

-- GET `path` every 20 ms for `seconds`, calling `at(t)` once per request (t: seconds since
-- the start) before it; returns { t, status, took } for each.
local function load(port, path, seconds, at)
    local out = {}
    local t0 = socket.gettime()
    while socket.gettime() - t0 < seconds do
        local t = socket.gettime() - t0
        at(t)
        local s = socket.gettime()
        local res = get(port, path)
        out[#out + 1] = { t = t, status = res and res.status or 0, took = socket.gettime() - s }
        socket.sleep(0.02)
    end
    return out
end

describe("faults under load", function()
    it("a worker killed with SIGKILL loses only its requests in flight; another replaces it",
        function()
        local srv = helper.spawn_server { app = FIXTURE, args = "--workers 2" }
        finally(function() srv:stop() end)
        assert.is_true(helper.wait_for(function() return #children(srv.pid) == 2 end))
        local before = children(srv.pid)
        -- 16 keep-alive connections and 4 new ones a request (spec/it/load_client.py), each
        -- with one request at a time: at most 20 in flight
        local p = io.popen(string.format("%s %s/spec/it/load_client.py %d 3 16 4 /hello 2>&1",
            helper.tool("http.client"), helper.root, srv.port))
        socket.sleep(1)
        os.execute("kill -9 " .. before[1])
        local out = p:read("*a")
        p:close()
        local counts = assert(require("cjson").decode(out:match("{.*}")), out)
        note("SIGKILL under load: %d requests, %d lost (%d refused) of 20 connections",
            counts.requests, counts.failed, counts.refused)
        assert.is_true(counts.failed <= 20, out)
        assert.is_true(counts.requests > 1000, out)
        assert.is_true(helper.wait_for(function()
            local now = children(srv.pid)
            return #now == 2 and now[1] ~= before[1] and now[2] ~= before[1]
        end))
        assert.truthy(srv:log():find("died (status 0, signal 9); replacing it", 1, true))
        for _ = 1, 10 do
            assert.equal(200, get(srv.port, "/hello").status)
        end
    end)

    it("descriptors exhausted: new connections are refused with one log line, no busy loop, "
        .. "and service comes back", function()
        local srv = helper.spawn_server { app = FIXTURE, args = "--workers 1", limits = "-n 64" }
        finally(function() srv:stop() end)
        local worker = children(srv.pid)[1]
        local function cpu_ticks()
            local stat = helper.read_file("/proc/" .. worker .. "/stat")
            local fields = {}
            for f in stat:match("%) (.*)"):gmatch("%S+") do
                fields[#fields + 1] = f
            end
            return tonumber(fields[12]) + tonumber(fields[13]) -- utime, stime
        end
        local held, refused = {}, 0
        for _ = 1, 80 do
            local c = assert(socket.connect("127.0.0.1", srv.port))
            held[#held + 1] = c
        end
        socket.sleep(0.3)
        -- those the worker kept answer; the others were closed unanswered
        for _, c in ipairs(held) do
            c:settimeout(2)
            c:send("GET /hello HTTP/1.1\r\nHost: f\r\n\r\n")
            local line = c:receive("*l")
            if not (line and line:find(" 200 ", 1, true)) then
                refused = refused + 1
            end
        end
        note("descriptors exhausted (ulimit -n 64): %d of 80 connections refused", refused)
        assert.is_true(refused >= 30 and refused < 80, tostring(refused))
        -- no busy loop while the kept ones are open and more knock
        local ticks = cpu_ticks()
        for _ = 1, 20 do
            local c = socket.connect("127.0.0.1", srv.port)
            if c then
                c:close()
            end
            socket.sleep(0.05)
        end
        local spent = cpu_ticks() - ticks
        note("descriptors exhausted: %d CPU ticks (10 ms) spent in 1 s of refusals", spent)
        assert.is_true(spent < 20, tostring(spent))
        local _, lines = srv:log():gsub("descriptors nearly exhausted", "")
        assert.is_true(lines >= 1 and lines <= 2, srv:log())
        for _, c in ipairs(held) do
            c:close()
        end
        socket.sleep(0.3)
        for _ = 1, 10 do
            assert.equal(200, get(srv.port, "/hello").status)
        end
        assert.equal(worker, children(srv.pid)[1])
    end)

    -- Kills the server behind /PATH at 1 s and starts it again at 2.5 s, under a request
    -- every 20 ms; checks the errors were clean and quick, and that service came back.
    local function outage(srv, path, kill, start)
        local killed, started
        local rows = load(srv.port, path, 4.5, function(t)
            if t >= 1 and not killed then
                killed = true
                kill()
            elseif t >= 2.5 and not started then
                started = true
                start()
            end
        end)
        local ok_before, failed, slowest, back = 0, 0, 0, nil
        for _, r in ipairs(rows) do
            if r.t < 1 then
                assert.equal(200, r.status)
                ok_before = ok_before + 1
            elseif r.status ~= 200 then
                assert.equal(503, r.status) -- the handler's own answer: the error reached it
                failed = failed + 1
                slowest = math.max(slowest, r.took)
            elseif r.t >= 2.5 and not back then
                back = r.t - 2.5
            end
        end
        assert.is_true(failed > 0, "the outage was not seen")
        -- each error within the client's timeouts (1 s), with room for a busy machine
        assert.is_true(slowest < 2.5, "an error took " .. slowest .. " s")
        assert.truthy(back, "never recovered")
        assert.is_true(back < 2, "recovered " .. back .. " s after the restart")
        assert.equal(200, rows[#rows].status)
        return failed, slowest, back
    end

    it("Redis killed and started again: clean errors within the timeout, then recovery",
        function()
        local rpid, rport = helper.redis_server()
        local srv
        finally(function() -- (one finally a case: a second would replace the first)
            if srv then srv:stop() end
            helper.stop_pid(rpid)
        end)
        srv = helper.spawn_server { app = FIXTURE, args = "--workers 1",
            env = { REDIS_PORT = tostring(rport) } }
        local worker = children(srv.pid)[1]
        local failed, slowest, back = outage(srv, "/redis", function()
            os.execute("kill -9 " .. rpid)
        end, function()
            rpid = helper.redis_server(rport)
        end)
        note("Redis killed for 1.5 s: %d requests answered 503 (the slowest in %.3f s), service "
            .. "back %.3f s after the restart", failed, slowest, back)
        assert.equal(worker, children(srv.pid)[1])
    end)

    it("Redis frozen (SIGSTOP) and thawed: errors at the timeout, then recovery", function()
        local rpid, rport = helper.redis_server()
        local srv
        finally(function()
            if srv then srv:stop() end
            os.execute("kill -CONT " .. rpid)
            helper.stop_pid(rpid)
        end)
        srv = helper.spawn_server { app = FIXTURE, args = "--workers 1",
            env = { REDIS_PORT = tostring(rport) } }
        local failed, slowest, back = outage(srv, "/redis", function()
            os.execute("kill -STOP " .. rpid)
        end, function()
            os.execute("kill -CONT " .. rpid)
        end)
        note("Redis frozen for 1.5 s: %d requests answered 503 (the slowest in %.3f s; the "
            .. "timeout is 1 s), service back %.3f s after it thawed", failed, slowest, back)
        assert.is_true(slowest >= 0.9, "an error before the timeout: " .. slowest)
    end)

    it("PostgreSQL killed and started again: clean errors within the timeout, then recovery",
        function()
        local postgres = require "postgres"
        local pg = postgres.start()
        local user = postgres.users.scram
        local srv
        finally(function()
            if srv then srv:stop() end
            pg.stop()
        end)
        srv = helper.spawn_server { app = FIXTURE, args = "--workers 1",
            env = { PG_PORT = tostring(pg.port), PG_USER = user.user,
                PG_PASSWORD = user.password } }
        local worker = children(srv.pid)[1]
        local failed, slowest, back = outage(srv, "/pg", function()
            os.execute("kill -QUIT " .. pg.pid) -- an immediate shutdown, as a crash
        end, function()
            pg.restart()
        end)
        note("PostgreSQL killed for 1.5 s: %d requests answered 503 (the slowest in %.3f s), "
            .. "service back %.3f s after the restart", failed, slowest, back)
        assert.equal(worker, children(srv.pid)[1])
    end)

    it("the wall clock stepped back and forward: timeouts, timers and TTLs keep their length",
        function()
        local file = os.tmpname()
        helper.write_file(file, "+0\n")
        local srv = helper.spawn_server { app = FIXTURE,
            args = "--workers 1 --limit idle_timeout=1", env = {
                LD_PRELOAD = helper.tool("libfaketime"), FAKETIME_TIMESTAMP_FILE = file,
                FAKETIME_NO_CACHE = "1", FAKETIME_DONT_FAKE_MONOTONIC = "1" } }
        finally(function()
            srv:stop()
            os.remove(file)
        end)
        local function date_of(res)
            return res.headers.date
        end
        for _, step in ipairs({ -3600, 3600 }) do
            local before = get(srv.port, "/hello")
            -- a key of 3 s set before the step, a connection idle across it
            assert.equal(200, helper.request(srv.port, "POST /dict/set?ttl=3 HTTP/1.1\r\n"
                .. "Host: f\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").status)
            local t0 = socket.gettime()
            local idle = helper.connect(srv.port)
            idle:send("GET /hello HTTP/1.1\r\nHost: f\r\n\r\n")
            assert.equal(200, helper.read_response(idle).status)
            helper.write_file(file, string.format("%+d\n", step))
            -- the idle connection closes after idle_timeout (1 s), by the clock that does not step
            assert.is_true(helper.closed(idle, 3))
            local idle_for = socket.gettime() - t0
            -- the step took: the Date header (made once a second) moved by it
            socket.sleep(math.max(0, t0 + 1.2 - socket.gettime()))
            assert.are_not.equal(date_of(before), date_of(get(srv.port, "/hello")))
            -- a step forward does not expire the key at once, nor a step back keep it an hour
            assert.equal("v", get(srv.port, "/dict/get").body)
            socket.sleep(math.max(0, t0 + 3.3 - socket.gettime()))
            assert.equal("nil", get(srv.port, "/dict/get").body)
            -- a timer of 0.5 s
            local s = socket.gettime()
            assert.equal("slept", get(srv.port, "/sleep?s=0.5").body)
            local slept = socket.gettime() - s
            note("the wall clock stepped by %+d s: an idle connection closed after %.2f s "
                .. "(idle_timeout 1 s), a 0.5 s sleep took %.3f s, a 3 s key lived 3 s",
                step, idle_for, slept)
            assert.is_true(idle_for > 0.8 and idle_for < 2.5, tostring(idle_for))
            assert.is_true(slept > 0.45 and slept < 1, tostring(slept))
        end
    end)
end)
