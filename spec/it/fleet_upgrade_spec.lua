-- spec/it/fleet_upgrade_spec.lua: the rolling upgrade under load: three instances of two workers
-- behind HAProxy (PROXY v2, checks on /readyz, the agent-check) and behind nginx (an upstream
-- with keep-alive), each in turn upgraded (USR2: a new master takes its sockets over; QUIT the
-- old one once the new one is ready) while clients hold keep-alive HTTP/1.1, HTTP/2 (HAProxy)
-- and WebSocket connections: not one request may fail. The instances keep their sessions in
-- one Redis and chat through it: users logged in before are still logged in on every instance
-- after, and chat clients connected through the balancer (reconnecting after a close 1001)
-- get every message posted while they were connected, on whichever instance (exactly what is
-- checked: the header of spec/it/fleet_client.py).
local helper = require "helper"
local fleet = require "fleet_helper"

local function pid_in(path)
    return helper.read_file(path):match("^(%d+)\n$")
end

-- Upgrades one instance in place: USR2, the new master's pid in the pid file once it is
-- ready, QUIT to the old one, which must exit by itself. Returns the new master's pid.
local function upgrade(inst)
    local old = inst.pid
    os.execute("kill -USR2 " .. old)
    assert.truthy(helper.wait_for(function()
        return inst:log():find("upgrade: the new master %(pid %d+%) is ready")
    end, 20), inst:log())
    local new = assert(pid_in(inst.pid_file), inst:log())
    assert.is_not.equal(old, new)
    os.execute("kill -QUIT " .. old)
    assert.is_true(fleet.wait_exit(old, 20), inst:log())
    inst.pid = new -- (what the instance's :stop() ends from now on)
    return new
end

describe("a rolling upgrade", function()
    local w

    before_each(function()
        w = fleet.world()
    end)

    after_each(function()
        w:finish()
    end)

    -- Three instances of two workers with pid files, all ready.
    local function three()
        w.instances = fleet.instances(3, { dir = w.dir, redis = w.redis, pid_file = true })
        return w.instances
    end

    -- Upgrades each instance in turn under the load; checks that its new master's workers
    -- answer, calls settle() and reports the load's counts.
    local function roll(name, settle)
        helper.wait_for(function() return false end, 1) -- (the load under way)
        for _, inst in ipairs(w.instances) do
            local new = upgrade(inst)
            local workers = {}
            for _, pid in ipairs(helper.children(new)) do
                workers[pid] = true
            end
            for _ = 1, 4 do
                local body = helper.request(inst.ports.plain, "GET /hello HTTP/1.1\r\nHost: f\r\n"
                    .. "Connection: close\r\n\r\n").body
                assert.truthy(workers[body:match("(%d+)$")], body)
            end
            if settle then
                settle()
            end
            helper.wait_for(function() return false end, 0.5)
        end
        helper.wait_for(function() return false end, 1)
        w:check_load(name .. ", rolling upgrade")
    end

    it("behind HAProxy refuses no connection and loses no request", function()
        local balancer = fleet.haproxy(three(), { dir = w.dir })
        w.balancer = balancer
        assert.is_true(balancer.all_up(), balancer.log())
        w:start_load { h1 = { balancer.port, 4 }, h2 = { balancer.port, 2 },
            ws = { balancer.port, 3 } }
        roll("haproxy", function()
            assert.is_true(balancer.all_up(), balancer.log())
        end)
    end)

    it("behind nginx refuses no connection and loses no request", function()
        w.balancer = fleet.nginx(three(), { dir = w.dir })
        w:start_load { h1 = { w.balancer.port, 4 }, ws = { w.balancer.port, 3 } }
        roll("nginx")
    end)
end)
