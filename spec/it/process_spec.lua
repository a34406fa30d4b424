-- spec/it/process_spec.lua: the master and its workers, and signals, on a real server.
local helper = require "helper"
local socket = require "socket"

local children, wait_for = helper.children, helper.wait_for

local function get(port, path)
    return helper.request(port, "GET " .. path .. " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
end

describe("moonserve with workers", function()
    it("shows as 'moonserve: master APP' and 'moonserve: worker N' in ps", function()
        local srv = helper.spawn_server { app = "spec/fixtures/app.lua", args = "--workers 2" }
        finally(function() srv:stop() end)
        assert.is_true(wait_for(function() return #children(srv.pid) == 2 end))
        local function cmdline(pid)
            -- (the rest of the old command line's area reads as NULs)
            return (helper.read_file("/proc/" .. pid .. "/cmdline"):gsub("%z+$", ""))
        end
        local function comm(pid)
            return (helper.read_file("/proc/" .. pid .. "/comm"):gsub("\n$", ""))
        end
        assert.equal("moonserve: master " .. helper.root .. "/spec/fixtures/app.lua",
            cmdline(srv.pid))
        assert.equal("moonserve: mast", comm(srv.pid))
        -- (a worker sets its title as it starts: wait for both)
        local titles
        assert.truthy(wait_for(function()
            titles = {}
            for _, pid in ipairs(children(srv.pid)) do
                titles[#titles + 1] = cmdline(pid)
            end
            table.sort(titles)
            return titles[1] == "moonserve: worker 0" and titles[2] == "moonserve: worker 1"
        end), table.concat(titles, ", "))
        for _, pid in ipairs(children(srv.pid)) do
            assert.matches("^moonserve: work", comm(pid))
        end
        -- The workers' command is intact (the master copied argv before its title): a
        -- worker killed is replaced, runs the app, and takes the title too.
        local before = children(srv.pid)
        os.execute("kill -9 " .. before[1])
        assert.truthy(wait_for(function()
            local now = children(srv.pid)
            return #now == 2 and now[1] ~= before[1] and now[2] ~= before[1]
                and cmdline(now[1]):find("^moonserve: worker %d$")
                and cmdline(now[2]):find("^moonserve: worker %d$")
        end))
        -- (the master built its environment from `environ`, moved off argv's area)
        assert.equal(200, get(srv.port, "/hello").status)
    end)

    it("spreads connections over its workers", function()
        local srv = helper.spawn_server { app = "spec/fixtures/app.lua", args = "--workers 2" }
        assert.is_true(wait_for(function() return #children(srv.pid) == 2 end))
        local seen, n = {}, 0
        for _ = 1, 40 do
            local pid = get(srv.port, "/pid").body
            if not seen[pid] then
                seen[pid] = true
                n = n + 1
            end
        end
        assert.equal(2, n)
        assert.is_true(srv:stop())
    end)

    it("keeps each worker's channel to the master from what the worker runs", function()
        local srv = helper.spawn_server { app = "spec/fixtures/app.lua", args = "--workers 2" }
        finally(function() srv:stop() end)
        assert.is_true(wait_for(function() return #children(srv.pid) == 2 end))
        for _, pid in ipairs(children(srv.pid)) do
            -- fd 3 is a socket to the master, close-on-exec (O_CLOEXEC is octal 02000000).
            local target = helper.sh("readlink /proc/" .. pid .. "/fd/3")
            assert.matches("^socket:", target)
            local info = helper.read_file("/proc/" .. pid .. "/fdinfo/3")
            local flags = tonumber(info:match("flags:%s*(%d+)"), 8)
            assert.equal(1, math.floor(flags / 0x80000) % 2, "fd 3 is not close-on-exec")
        end
    end)

    it("replaces a worker killed under load, and keeps serving", function()
        local srv = helper.spawn_server { app = "spec/fixtures/app.lua", args = "--workers 2" }
        assert.is_true(wait_for(function() return #children(srv.pid) == 2 end))
        local before = children(srv.pid)
        local wrk = io.popen((helper.tool("wrk") .. " -t1 -c8 -d2s http://127.0.0.1:%d/hello 2>&1")
            :format(srv.port))
        socket.sleep(0.5)
        os.execute("kill -9 " .. before[1]) -- under load
        assert.is_true(wait_for(function()
            local now = children(srv.pid)
            return #now == 2 and now[1] ~= before[1] and now[2] ~= before[1]
        end))
        assert.truthy(wrk:read("*a"):find("requests in", 1, true))
        wrk:close()
        assert.truthy(srv:log():find("died (status 0, signal 9); replacing it", 1, true))
        for _ = 1, 20 do
            assert.equal(200, get(srv.port, "/hello").status)
        end
        assert.is_true(srv:stop())
    end)

    it("reloads on SIGHUP under load with no failed request, running the new code", function()
        local dir = os.tmpname()
        os.remove(dir)
        assert(os.execute("mkdir -p " .. dir) == 0)
        local app = dir .. "/app.lua"
        assert(helper.run(("cp %s/spec/fixtures/versioned.lua %s"):format(helper.root, app)))
        local srv = helper.spawn_server { app = app, args = "--workers 2" }
        assert.is_true(wait_for(function() return #children(srv.pid) == 2 end))
        assert.equal("v1", get(srv.port, "/").body)
        assert(helper.run(("sed -i 's/v1/v2/' %s"):format(app)))
        local wrk = io.popen((helper.tool("wrk") .. " -t1 -c16 -d3s http://127.0.0.1:%d/ 2>&1")
            :format(srv.port))
        socket.sleep(1)
        os.execute("kill -HUP " .. srv.pid)
        local out = wrk:read("*a")
        wrk:close()
        assert.truthy(out:find("requests in", 1, true), out)
        assert.falsy(out:find("Socket errors", 1, true), out)
        assert.falsy(out:find("Non-2xx", 1, true), out)
        local _, took = srv:log():gsub("took over", "")
        assert.equal(2, took)
        assert.equal("v2", get(srv.port, "/").body)
        assert.is_true(srv:stop())
        os.execute("rm -rf " .. dir)
    end)

    it("finishes requests in flight when stopped with SIGTERM", function()
        local srv = helper.spawn_server { app = "spec/fixtures/app.lua", args = "--workers 1" }
        assert.is_true(wait_for(function() return #children(srv.pid) == 1 end))
        local s = helper.connect(srv.port)
        assert(s:send("GET /slow?s=1 HTTP/1.1\r\nHost: t\r\n\r\n"))
        socket.sleep(0.2)
        os.execute("kill -TERM " .. srv.pid)
        local res = helper.read_response(s)
        assert.equal("slow done", res.body)
        assert.equal("close", res.headers["connection"])
        assert.is_true(wait_for(function() return not srv:alive() end))
        -- no longer listening
        local c = socket.tcp()
        c:settimeout(1)
        assert.is_nil(c:connect("127.0.0.1", srv.port))
    end)

    it("reopens its log file on SIGUSR1", function()
        local log = os.tmpname()
        local srv = helper.spawn_server { app = "spec/fixtures/app.lua",
            args = "--workers 1 --log " .. log, log = log }
        assert.is_true(wait_for(function() return #children(srv.pid) == 1 end))
        os.rename(log, log .. ".1")
        os.execute("kill -USR1 " .. srv.pid)
        -- the master reopens at once; the worker when its loop sees the signal
        assert.is_true(wait_for(function() return io.open(log) ~= nil end))
        socket.sleep(0.3)
        assert.equal(500, get(srv.port, "/error").status)
        assert.is_true(wait_for(function()
            return helper.read_file(log):find("boom in handler", 1, true) ~= nil
        end))
        assert.falsy(helper.read_file(log .. ".1"):find("boom in handler", 1, true))
        assert.is_true(srv:stop())
        os.remove(log .. ".1")
    end)
    it("fails a start whose workers refuse the configuration, with their sentence, instead of "
        .. "starting them again and again", function()
        local bin = os.getenv("MOONSERVE_BIN") or (helper.root .. "/lua/bin/moonserve")
        local t0 = socket.gettime()
        local out, status = helper.run(string.format("%s 20 %s %s --listen 127.0.0.1:0 "
            .. "--workers 2 --limit no_such_key=1 2>&1", helper.tool("timeout"),
            helper.sh_quote(bin), helper.sh_quote(helper.root .. "/spec/fixtures/app.lua")))
        assert.equal(2, status, out)
        assert.is_true(socket.gettime() - t0 < 10, "the master stopped late")
        assert.truthy(out:find("\nmoonserve: worker %d %(pid %d+%) could not start: unknown "
            .. "limit no_such_key"), out)
        assert.is_nil(out:find("replacing it", 1, true), out)
    end)

    it("fails a reload whose second worker fails after the first is ready: every old worker "
        .. "serves on, none of the new app's answers", function()
        local file = os.tmpname() .. ".lua"
        local app = [[
local moonserve = require("moonserve")
local app = moonserve.app()
app:get("/v", function() return 200, "VERSION" end)
if "VERSION" == "v2" and moonserve.worker.id() == 1 then
    os.execute("sleep 1") -- (worker 0 is ready by then)
    error("worker 1 refuses")
end
return app
]]
        helper.write_file(file, (app:gsub("VERSION", "v1")))
        local srv = helper.spawn_server { app = file, args = "--workers 2" }
        finally(function() srv:stop() os.remove(file) end)
        assert.is_true(wait_for(function() return #children(srv.pid) == 2 end))
        local before = children(srv.pid)
        assert.equal("v1", get(srv.port, "/v").body)
        helper.write_file(file, (app:gsub("VERSION", "v2")))
        os.execute("kill -HUP " .. srv.pid)
        local seen = {}
        assert.truthy(wait_for(function()
            seen[get(srv.port, "/v").body] = true -- (during the reload too)
            return srv:log():find("reload failed", 1, true)
        end), srv:log())
        socket.sleep(0.5)
        for _ = 1, 20 do
            seen[get(srv.port, "/v").body] = true
        end
        assert.same({ v1 = true }, seen)
        assert.same(before, children(srv.pid))
        local log = srv:log()
        assert.is_nil(log:find("took over", 1, true), log)
        assert.truthy(log:find("worker 1 %(pid %d+%) could not start: [^\n]*worker 1 refuses[^\n]*"
            .. "reload failed, the old workers keep serving"), log)
    end)

    it("holds the signals of a worker that is still starting until it serves: USR1 during a "
        .. "reload, QUIT or INT during a start or a reload neither kill it nor fail the reload",
        function()
        local file = os.tmpname() .. ".lua"
        local app = [[
local app = require("moonserve").app()
app:get("/v", function() return 200, "VERSION" end)
if "VERSION" ~= "v1" then
    local t = os.clock() -- (busy, not os.execute: system() ignores QUIT and INT meanwhile)
    while os.clock() - t < 1.5 do end
end
return app
]]
        helper.write_file(file, (app:gsub("VERSION", "v1")))
        local srv = helper.spawn_server { app = file, args = "--workers 1" }
        finally(function() srv:stop() os.remove(file) end)
        assert.truthy(wait_for(function()
            local res = get(srv.port, "/v")
            return res and res.body == "v1"
        end, 10))
        -- USR1 (logs reopened) reaches the new worker while its app loads: it serves after.
        helper.write_file(file, (app:gsub("VERSION", "v2")))
        os.execute("kill -HUP " .. srv.pid)
        socket.sleep(0.5)
        os.execute("kill -USR1 " .. srv.pid)
        assert.truthy(wait_for(function()
            return srv:log():find("took over", 1, true)
        end, 10), srv:log())
        assert.equal("v2", get(srv.port, "/v").body)
        -- QUIT while a reload's new worker loads: a stop, not a failed reload, and no core.
        for _, sig in ipairs({ "QUIT", "INT" }) do
            helper.write_file(file, (app:gsub("VERSION", "v3" .. sig)))
            local before = #srv:log()
            os.execute("kill -HUP " .. srv.pid)
            socket.sleep(0.5)
            os.execute("kill -" .. sig .. " " .. srv.pid)
            assert.truthy(wait_for(function()
                return not srv:alive()
            end, 10), sig)
            local log = srv:log():sub(before + 1)
            assert.is_nil(log:find("reload failed", 1, true), log)
            assert.is_nil(log:find("signal 3)", 1, true), log)
            assert.is_nil(log:find(" error: ", 1, true), log)
            if sig == "QUIT" then
                helper.write_file(file, (app:gsub("VERSION", "v1")))
                srv = helper.spawn_server { app = file, args = "--workers 1" }
                assert.truthy(wait_for(function()
                    local res = get(srv.port, "/v")
                    return res and res.body == "v1"
                end, 10))
            end
        end
    end)

    it("fails a reload whose workers refuse the new app: the old workers serve on, and one line "
        .. "says why", function()
        local file = os.tmpname() .. ".lua"
        local good = [[
local app = require("moonserve").app()
app:get("/pid", function() return 200, tostring(require("ffi").C.getpid()) end)
return app
]]
        helper.write_file(file, "require('ffi').cdef 'int getpid(void);'\n" .. good)
        local srv = helper.spawn_server { app = file, args = "--workers 2" }
        finally(function() srv:stop() os.remove(file) end)
        assert.is_true(wait_for(function() return #children(srv.pid) == 2 end))
        local before = children(srv.pid)
        helper.write_file(file, [[
local app = require("moonserve").app()
app:shared_dict("cache", "12q")
return app
]])
        os.execute("kill -HUP " .. srv.pid)
        assert.truthy(wait_for(function()
            return srv:log():find("reload failed", 1, true)
        end), srv:log())
        socket.sleep(0.5)
        local log = srv:log()
        local _, lines = log:gsub("worker %d %(pid %d+%) could not start: [^\n]*bad size[^\n]*: "
            .. "reload failed, the old workers keep serving\n", "")
        assert.equal(1, lines, log)
        assert.is_nil(log:find("\nmoonserve: ", 1, true), log) -- no line of the worker's own
        assert.same(before, children(srv.pid))
        for _ = 1, 10 do
            local pid = get(srv.port, "/pid").body
            assert.truthy(pid == before[1] or pid == before[2], pid)
        end
    end)
end)
