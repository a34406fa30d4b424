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

local USERS, CHATTERS = 30, 6

describe("a rolling upgrade", function()
    local dir, instances, balancer, load, redis

    before_each(function()
        dir = fleet.tempdir()
        redis = fleet.redis { dir = dir }
    end)

    after_each(function()
        if load then
            load.finish()
        end
        if balancer then
            balancer.stop()
        end
        for _, inst in ipairs(instances or {}) do
            inst:stop("KILL", 1)
        end
        redis.stop()
        load, balancer, instances, redis = nil, nil, nil, nil
        fleet.cleanup(dir)
    end)

    -- Three instances of two workers with pid files, all ready.
    local function three()
        local list = {}
        for i = 1, 3 do
            local pid_file = dir .. "/i" .. i .. ".pid"
            local inst = fleet.instance { name = "i" .. i, dir = dir, ports = {},
                redis = redis, args = "--readyz /readyz --drain-delay 1 --pid-file " .. pid_file }
            inst.pid_file = pid_file
            list[i] = inst
        end
        for _, inst in ipairs(list) do
            inst:ready()
        end
        return list
    end

    -- Upgrades each instance in turn under the load; checks that its new master's workers
    -- answer, calls settle() and reports the load's counts.
    local function roll(name, settle)
        helper.wait_for(function() return false end, 1) -- (the load under way)
        for _, inst in ipairs(instances) do
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
        local counts = load.finish()
        load = nil
        print(string.format("%s, rolling upgrade: %d requests and echoes, %d failed (h1 "
            .. "%d/%d, h2 %d/%d, ws %d/%d, WebSockets closed 1001 and reopened %d)", name,
            counts.ok + counts.failed, counts.failed, counts.h1_ok or 0, counts.h1_failed or 0,
            counts.h2_ok or 0, counts.h2_failed or 0, counts.ws_ok or 0, counts.ws_failed or 0,
            counts.ws_going_away_ok or 0))
        for _, f in ipairs(counts.failures) do
            print("  failure: " .. f)
        end
        assert.is_true(counts.done, counts.text)
        assert.is_true(counts.ok > 300, "too little load to tell: " .. counts.ok)
        assert.equal(0, counts.failed)
        assert.same({}, fleet.sessions_and_chat(name, counts, USERS, 3))
    end

    -- What the load asks besides: users logged in through the balancer and checked on each
    -- instance's plain port after the roll, chat clients and a poster.
    local function with_sessions_and_chat(targets)
        local ports = {}
        for i, inst in ipairs(instances) do
            ports[i] = inst.ports.plain
        end
        targets.users = { balancer.port, USERS }
        targets.chat = { balancer.port, CHATTERS }
        return fleet.load(targets, { dir = dir, check_ports = ports })
    end

    it("behind HAProxy refuses no connection and loses no request", function()
        instances = three()
        balancer = fleet.haproxy(instances, { dir = dir })
        assert.is_true(balancer.all_up(), balancer.log())
        load = with_sessions_and_chat { h1 = { balancer.port, 4 }, h2 = { balancer.port, 2 },
            ws = { balancer.port, 3 } }
        roll("haproxy", function()
            assert.is_true(balancer.all_up(), balancer.log())
        end)
    end)

    it("behind nginx refuses no connection and loses no request", function()
        instances = three()
        balancer = fleet.nginx(instances, { dir = dir })
        load = with_sessions_and_chat { h1 = { balancer.port, 4 }, ws = { balancer.port, 3 } }
        roll("nginx")
    end)
end)
