-- spec/it/upgrade_spec.lua: USR2 upgrades under load: a new master takes the sockets over.
local helper = require "helper"

local BIN = os.getenv("MOONSERVE_BIN") or (helper.root .. "/lua/bin/moonserve")
local socket = require "socket"

local children, wait_for, read_file = helper.children, helper.wait_for, helper.read_file

local function get(port, path)
    return helper.request(port, "GET " .. path .. " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
end

local function alive(pid)
    return pid ~= nil and os.execute("kill -0 " .. pid .. " 2>/dev/null") == 0
end

local function pid_in(path)
    return read_file(path):match("^(%d+)\n$")
end

-- A directory with the app in it (spec/fixtures/upgrade_app.lua), and a master of `workers`
-- on it, with a pid file; returns the server, the app's path and the pid file's.
local function start(workers, args)
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir) == 0)
    local app = dir .. "/app.lua"
    assert(helper.run(("cp %s/spec/fixtures/upgrade_app.lua %s"):format(helper.root, app)))
    local pid_file = dir .. "/moonserve.pid"
    local srv = helper.spawn_server { app = app, args = ("--workers %d --pid-file %s %s")
        :format(workers, pid_file, args or "") }
    assert.truthy(wait_for(function() return pid_in(pid_file) == srv.pid end), srv:log())
    srv.dir = dir
    return srv, app, pid_file
end

-- Ends the old master and any new one (by the pids seen), and the directory.
local function cleanup(srv, pid_file)
    local new = pid_in(pid_file)
    for _, pid in ipairs({ srv.pid, new }) do
        if alive(pid) then
            os.execute("kill -TERM " .. pid)
            wait_for(function() return not alive(pid) end, 5)
            os.execute("kill -9 " .. pid .. " 2>/dev/null")
        end
    end
    os.execute("rm -rf " .. srv.dir)
end

local function edit(app, from, to)
    assert(helper.run(("sed -i 's/%s/%s/' %s"):format(from, to, app)))
end

-- Steady load for `seconds` (spec/it/load_client.py): 6 threads on a keep-alive connection
-- each, 3 on a new connection per request, every request with 2 s to be answered. Returns a
-- function that waits for it and returns its counts: requests, failed, refused, bodies.
local function load(port, seconds)
    local p = io.popen(("%s %s/spec/it/load_client.py %d %d 6 3 2>&1"):format(
        helper.tool("http.client"), helper.root, port, seconds))
    return function()
        local out = p:read("*a")
        p:close()
        local counts = assert(require("cjson").decode(out:match("{.*}")), out)
        counts.out = out
        return counts
    end
end

-- USR2 to the instance's master; waits until the new master is ready.
local function upgrade(srv)
    os.execute("kill -USR2 " .. srv.pid)
    assert.truthy(wait_for(function()
        return srv:log():find("is ready; QUIT this master", 1, true)
    end), srv:log())
end

-- QUIT to the old master; waits until it has exited.
local function quit_old(srv)
    os.execute("kill -QUIT " .. srv.pid)
    assert.truthy(wait_for(function() return not alive(srv.pid) end), srv:log())
end

-- Prints what the load saw during `what`, and checks that it was more than `at_least`
-- requests and that none failed.
local function lost_none(what, counts, at_least)
    print(("# %s under load: %d requests, %d failed, %d refused"):format(what, counts.requests,
        counts.failed, counts.refused))
    assert.is_true(counts.requests > at_least, counts.out)
    assert.equal(0, counts.failed, counts.out)
end

describe("moonserve upgrades (USR2)", function()
    it("writes --pid-file once every worker is ready, removes it at the stop, and needs a "
        .. "master for it", function()
        local srv, _, pid_file = start(2) -- (waits for the pid file)
        finally(function() cleanup(srv, pid_file) end)
        assert.equal(2, #children(srv.pid))
        assert.is_true(srv:stop())
        assert.is_nil(io.open(pid_file))
        local out, status = helper.run(BIN .. " " .. helper.sh_quote(helper.root
            .. "/spec/fixtures/upgrade_app.lua") .. " --listen 127.0.0.1:0 --workers 0 --pid-file "
            .. pid_file .. " 2>&1")
        assert.is_not.equal(0, status)
        assert.truthy(out:find("pid_file needs workers under a master", 1, true), out)
        assert.is_nil(io.open(pid_file))
    end)

    it("USR2 then QUIT under load: no refused connection, no failed request, the new code "
        .. "serves, the pid file moves", function()
        local srv, app, pid_file = start(2)
        finally(function() cleanup(srv, pid_file) end)
        assert.equal("v1", get(srv.port, "/").body)
        edit(app, "v1", "v2")
        local done = load(srv.port, 6) -- (ends 2 s or more after the old master's QUIT)
        socket.sleep(1)
        os.execute("kill -USR2 " .. srv.pid)
        assert.truthy(wait_for(function()
            return srv:log():find("upgrade: the new master %(pid %d+%) is ready")
        end), srv:log())
        local new = srv:log():match("the new master %(pid (%d+)%) is ready")
        -- The new master's pid in the pid file once it is ready, the old one's beside it.
        assert.equal(new, pid_in(pid_file))
        assert.equal(srv.pid, pid_in(pid_file .. ".oldbin"))
        assert.equal(2, #children(new))
        -- A second USR2 while this one is under way is refused, as is one to the new master
        -- while the old one runs, with a line each.
        os.execute("kill -USR2 " .. srv.pid)
        os.execute("kill -USR2 " .. new)
        assert.truthy(wait_for(function()
            local log = srv:log()
            return log:find("SIGUSR2: an upgrade is under way (the new master is pid " .. new
                .. ")", 1, true) and log:find("SIGUSR2: the old master (pid " .. srv.pid
                .. ") still runs", 1, true)
        end), srv:log())
        socket.sleep(0.5)
        quit_old(srv)
        local counts = done()
        lost_none("upgrade", counts, 100)
        print(("# %d answered v1, %d v2"):format(counts.bodies.v1 or 0, counts.bodies.v2 or 0))
        assert.is_true((counts.bodies.v2 or 0) > 0, counts.out)
        for _ = 1, 10 do
            assert.equal("v2", get(srv.port, "/").body)
        end
        assert.equal(new, pid_in(pid_file))
        assert.is_nil(io.open(pid_file .. ".oldbin"))
        assert.equal(2, #children(new))
    end)

    it("finishes the old master's requests in flight when it is told QUIT", function()
        local srv, app, pid_file = start(1)
        finally(function() cleanup(srv, pid_file) end)
        edit(app, "v1", "v2")
        local s = helper.connect(srv.port)
        assert(s:send("GET /slow?s=2 HTTP/1.1\r\nHost: t\r\n\r\n"))
        socket.sleep(0.2)
        upgrade(srv)
        os.execute("kill -QUIT " .. srv.pid)
        local res = helper.read_response(s)
        s:close()
        assert.equal(200, res.status)
        assert.equal("slow v1", res.body)
        assert.truthy(wait_for(function() return not alive(srv.pid) end), srv:log())
        assert.equal("slow v2", get(srv.port, "/slow?s=0").body)
    end)

    it("a new version that does not load leaves the old master serving, with no failed "
        .. "request", function()
        local srv, app, pid_file = start(2)
        finally(function() cleanup(srv, pid_file) end)
        edit(app, "HANG, BOOM = false, false", "HANG, BOOM = false, true")
        local done = load(srv.port, 3)
        socket.sleep(0.5)
        os.execute("kill -USR2 " .. srv.pid)
        assert.truthy(wait_for(function()
            return srv:log():find("upgrade failed: the new master %(pid %d+%) exited %(status "
                .. "%d+, signal 0%) before it was ready; this master %(pid " .. srv.pid
                .. "%) serves on")
        end), srv:log())
        local counts = done()
        lost_none("failed upgrade (load error)", counts, 50)
        assert.truthy(srv:log():find("this version does not load", 1, true))
        assert.equal("v1", get(srv.port, "/").body)
        assert.equal(srv.pid, pid_in(pid_file))
        assert.is_nil(io.open(pid_file .. ".oldbin"))
        -- It can be upgraded again once the app is fixed.
        edit(app, "HANG, BOOM = false, true", "HANG, BOOM = false, false")
        edit(app, "v1", "v3")
        upgrade(srv)
        quit_old(srv)
        assert.equal("v3", get(srv.port, "/").body)
    end)

    it("a new version whose workers are never ready leaves the old master serving, with no "
        .. "failed request", function()
        local srv, app, pid_file = start(2, "--start-timeout 2 --stop-timeout 1")
        finally(function() cleanup(srv, pid_file) end)
        edit(app, "HANG, BOOM = false, false", "HANG, BOOM = true, false")
        local done = load(srv.port, 4)
        socket.sleep(0.5)
        os.execute("kill -USR2 " .. srv.pid)
        assert.truthy(wait_for(function()
            return srv:log():find("before it was ready; this master (pid " .. srv.pid
                .. ") serves on", 1, true)
        end), srv:log())
        local counts = done()
        lost_none("failed upgrade (start timeout)", counts, 50)
        assert.truthy(srv:log():find("not ready after 2 s", 1, true), srv:log())
        assert.equal("v1", get(srv.port, "/").body)
        assert.equal(srv.pid, pid_in(pid_file))
        assert.equal(2, #children(srv.pid))
    end)

    it("TERM to the new master undoes the upgrade: the old one serves on, its pid file back",
        function()
        local srv, app, pid_file = start(2)
        finally(function() cleanup(srv, pid_file) end)
        edit(app, "v1", "v2")
        upgrade(srv)
        local new = pid_in(pid_file)
        assert.is_not.equal(srv.pid, new)
        local done = load(srv.port, 2)
        socket.sleep(0.5)
        os.execute("kill -TERM " .. new)
        assert.truthy(wait_for(function()
            return srv:log():find("the upgrade is undone, this master (pid " .. srv.pid
                .. ") serves on", 1, true)
        end), srv:log())
        local counts = done()
        lost_none("upgrade undone", counts, 0)
        assert.equal(srv.pid, pid_in(pid_file))
        assert.is_nil(io.open(pid_file .. ".oldbin"))
        assert.equal("v1", get(srv.port, "/").body)
    end)

    -- Samples /readyz and the agent-check for `seconds`: the statuses and lines seen.
    local function sample(port, agent_port, seconds)
        local seen = {}
        local t0 = socket.gettime()
        while socket.gettime() - t0 < seconds do
            local res = get(port, "/readyz")
            seen[res and res.status or "none"] = true
            local s = socket.connect("127.0.0.1", agent_port)
            if s then
                s:settimeout(1)
                seen[s:receive("*l") or "no line"] = true
                s:close()
            end
            socket.sleep(0.02)
        end
        return seen
    end

    it("TERM to the new master stops it as a handover: readyz and the agent-check stay ready, "
        .. "no drain delay", function()
        local agent = helper.free_port()
        local srv, app, pid_file = start(2, "--readyz /readyz --drain-delay 3 --agent-check "
            .. "127.0.0.1:" .. agent)
        finally(function() cleanup(srv, pid_file) end)
        edit(app, "v1", "v2")
        upgrade(srv)
        local new = pid_in(pid_file)
        local t0 = socket.gettime()
        os.execute("kill -TERM " .. new)
        local seen = sample(srv.port, agent, 1.5)
        assert.same({ [200] = true, ready = true }, seen)
        assert.truthy(wait_for(function() return not alive(new) end, 5))
        assert.is_true(socket.gettime() - t0 < 3)
        assert.truthy(srv:log():find("signal 15: the old master (pid " .. srv.pid .. ") serves: "
            .. "stopping 2 workers", 1, true), srv:log())
        assert.equal("v1", get(srv.port, "/").body)
    end)

    it("QUIT to the old master before the new one is ready waits for it, then hands over: "
        .. "readyz and the agent-check stay ready", function()
        local agent = helper.free_port()
        local srv, app, pid_file = start(2, "--readyz /readyz --drain-delay 3 --agent-check "
            .. "127.0.0.1:" .. agent)
        finally(function() cleanup(srv, pid_file) end)
        edit(app, "v1", "v2")
        edit(app, "HANG, BOOM = false, false", "HANG, BOOM = true, false")
        edit(app, "moonserve.sleep(3600)", "moonserve.sleep(1.5)")
        os.execute("kill -USR2 " .. srv.pid)
        socket.sleep(0.3)
        os.execute("kill -QUIT " .. srv.pid)
        local seen = sample(srv.port, agent, 2.5)
        assert.same({ [200] = true, ready = true }, seen)
        assert.truthy(wait_for(function() return not alive(srv.pid) end, 5), srv:log())
        local log = srv:log()
        assert.truthy(log:find("SIGQUIT: the new master %(pid %d+%) is not ready yet: stopping "
            .. "once it is"), log)
        assert.truthy(log:find("signal 3: the new master %(pid %d+%) serves: stopping 2 workers"),
            log)
        assert.equal("v2", get(srv.port, "/").body)
    end)
end)
