-- spec/it/hooks_spec.lua: worker hooks, readiness and the worker's id, with a master and
-- workers.
local helper = require "helper"
local socket = require "socket"

local function get(srv, path)
    local res = assert(helper.request(srv.port, "GET " .. path .. " HTTP/1.1\r\nHost: t\r\n\r\n"))
    return res.body
end

local function wait_for(fn, seconds)
    local deadline = socket.gettime() + seconds
    while socket.gettime() < deadline do
        local v = fn()
        if v then
            return v
        end
        socket.sleep(0.05)
    end
    return fn()
end

describe("worker hooks", function()
    local function spawn(seconds, args, dir)
        local file = os.tmpname()
        helper.write_file(file, tostring(seconds))
        local env = { HOOK_SLEEP_FILE = file, HOOK_STOP_DIR = dir }
        local srv = helper.spawn_server { app = "spec/fixtures/hooks.lua", args = args,
            env = env }
        return srv, file
    end

    it("run in every worker, with its id and the count, before it serves", function()
        local srv, file = spawn(0.3, "--workers 2")
        local ids = {}
        wait_for(function()
            local body = get(srv, "/worker")
            assert.matches("^id=%d count=2 pid=%d+$", body) -- never before the hook returned
            ids[body:match("id=(%d)")] = true
            return ids["0"] and ids["1"]
        end, 10)
        assert.is_true(ids["0"] and ids["1"])
        srv:stop()
        os.remove(file)
    end)

    it("run in a single process too, as worker 0 of 1", function()
        local srv, file = spawn(0.2, "")
        assert.truthy(wait_for(function()
            return get(srv, "/worker"):match("^id=0 count=1 pid=%d+$")
        end, 5))
        srv:stop()
        os.remove(file)
    end)

    it("hand a reload over only when the new workers' start hooks have returned", function()
        local srv, file = spawn(0, "--workers 1")
        local old = wait_for(function() return get(srv, "/worker"):match("pid=(%d+)") end, 10)
        helper.write_file(file, "1.2")
        local t0 = socket.gettime()
        os.execute("kill -HUP " .. srv.pid)
        local new
        while socket.gettime() - t0 < 10 do
            local pid = get(srv, "/worker"):match("pid=(%d+)")
            if pid ~= old then
                new = pid
                break
            end
            socket.sleep(0.05)
        end
        assert.truthy(new, "no new worker took over")
        assert.is_true(socket.gettime() - t0 >= 1.1, "took over before its hook returned")
        srv:stop()
        os.remove(file)
    end)

    it("fail a reload whose start hook passes the deadline, and keep the old worker", function()
        local srv, file = spawn(0, "--workers 1 --start-timeout 0.5")
        local old = wait_for(function() return get(srv, "/worker"):match("pid=(%d+)") end, 10)
        helper.write_file(file, "30")
        os.execute("kill -HUP " .. srv.pid)
        assert.truthy(wait_for(function()
            return srv:log():find("reload failed, the old worker keeps serving", 1, true)
        end, 5), srv:log())
        assert.matches("worker 0 %(pid %d+%) not ready after 0.5 s %(its on_worker_start hooks "
            .. "have not returned%): killing it", srv:log())
        assert.equal(old, get(srv, "/worker"):match("pid=(%d+)"))
        srv:stop()
        os.remove(file)
    end)

    it("fail a start whose hook passes the deadline, with a clear log line", function()
        local srv, file = spawn(30, "--workers 1 --start-timeout 0.5")
        assert.truthy(wait_for(function()
            return srv:log():find("not ready after 0.5 s (its on_worker_start hooks have not "
                .. "returned): killing it", 1, true)
        end, 5), srv:log())
        srv:stop()
        os.remove(file)
    end)

    it("run the stop hooks in every worker as it stops", function()
        local dir = os.tmpname()
        os.remove(dir)
        os.execute("mkdir " .. helper.sh_quote(dir))
        local srv, file = spawn(0, "--workers 2", dir)
        wait_for(function() return get(srv, "/worker"):match("pid") end, 10)
        assert.is_true(srv:stop())
        assert.equal("stopped", helper.read_file(dir .. "/stopped-0"))
        assert.equal("stopped", helper.read_file(dir .. "/stopped-1"))
        os.execute("rm -rf " .. helper.sh_quote(dir))
        os.remove(file)
    end)
end)
