-- The rolling restart under load: three instances of two workers each behind HAProxy (PROXY
-- v2, checks on /readyz, the agent-check) and behind nginx (an upstream with keep-alive),
-- each instance in turn stopped (TERM), replaced and brought back once ready, while clients
-- hold keep-alive HTTP/1.1, HTTP/2 and WebSocket connections: not one request may fail.
-- The instances keep their sessions in one Redis (one secret for all) and chat through it:
-- users logged in before the roll are still logged in on every instance after it, and chat
-- clients connected through the balancer (reconnecting after a close 1001, perhaps to
-- another instance) get every message posted while they were connected, on whichever
-- instance the balancer sent the post (what "while connected" means exactly: the header of
-- spec/it/fleet_client.py; the channel's replay does not help across instances, whose
-- sequence numbers differ, so none is asked).
local helper = require "helper"
local fleet = require "fleet_helper"

-- Prints what the load saw (the spec's output is the report of the run) and checks it.
local USERS, CHATTERS = 30, 6

local function report(name, counts)
    print(string.format("%s: %d requests and echoes, %d failed (h1 %d/%d, h2 %d/%d, ws %d/%d, "
        .. "WebSockets closed 1001 and reopened %d)", name, counts.ok + counts.failed,
        counts.failed, counts.h1_ok or 0, counts.h1_failed or 0, counts.h2_ok or 0,
        counts.h2_failed or 0, counts.ws_ok or 0, counts.ws_failed or 0,
        counts.ws_going_away_ok or 0))
    for _, f in ipairs(counts.failures) do
        print("  failure: " .. f)
    end
    assert.is_true(counts.done, counts.text)
    assert.is_true(counts.ok > 300, "too little load to tell: " .. counts.ok)
    assert.equal(0, counts.failed)
    assert.same({}, fleet.sessions_and_chat(name, counts, USERS, 3))
end

-- The instances' plain ports, where the sessions are tried one by one after the roll.
local function plain_ports(instances)
    local ports = {}
    for i, inst in ipairs(instances) do
        ports[i] = inst.ports.plain
    end
    return ports
end

describe("a rolling restart", function()
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

    it("behind HAProxy loses no request", function()
        instances = fleet.instances(3, { dir = dir, redis = redis })
        -- No retries: the drain alone must keep every request (a balancer's retries would
        -- hide a connection refused or closed under a request).
        balancer = fleet.haproxy(instances, { dir = dir, retries = "    retries 0" })
        assert.is_true(balancer.all_up(), balancer.log())
        load = fleet.load({ h1 = { balancer.port, 6 }, h2 = { balancer.port, 3 },
            ws = { balancer.port, 3 }, users = { balancer.port, USERS },
            chat = { balancer.port, CHATTERS } }, { dir = dir,
            check_ports = plain_ports(instances) })
        helper.wait_for(function() return false end, 1) -- (the load under way)
        local unclean = fleet.roll(instances, function()
            assert.is_true(balancer.all_up(), balancer.log())
        end)
        helper.wait_for(function() return false end, 1)
        local counts = load.finish()
        load = nil
        report("haproxy", counts)
        assert.equal(0, unclean)
    end)

    -- A request under way when its instance stops may still publish (its listeners have
    -- closed, its connections are finishing): the message must reach the other instances.
    it("sends to the other instances what a stopping instance publishes", function()
        instances = fleet.instances(2, { dir = dir, redis = redis,
            args = "--readyz /readyz --drain-delay 0" })
        local out = dir .. "/listen.out"
        local listener = fleet.background(string.format("%s %s/spec/it/fleet_client.py chat "
            .. "%d 8", helper.tool("websockets"), helper.sh_quote(helper.root),
            instances[2].ports.plain), out)
        assert.truthy(helper.wait_for(function()
            return helper.read_file(out):find("joined=i2", 1, true)
        end, 10), helper.read_file(out))
        local s = require("socket").tcp()
        s:settimeout(10)
        assert(s:connect("127.0.0.1", instances[1].ports.plain))
        s:send("POST /chat?after=1 HTTP/1.1\r\nHost: f\r\nContent-Length: 4\r\n\r\nlate")
        helper.wait_for(function() return false end, 0.3) -- (the request under way)
        os.execute("kill -TERM " .. instances[1].pid)
        local line = s:receive("*l")
        s:close()
        assert.truthy(line and line:find(" 200 "), tostring(line))
        helper.wait_for(function()
            return helper.read_file(out):find("msg=late", 1, true)
        end, 5)
        fleet.stop_pid(listener, "TERM", 2)
        local got = helper.read_file(out)
        print("the listener on i2 got: " .. got:gsub("\n", " "))
        assert.truthy(got:find("msg=late\n", 1, true), got)
        assert.is_true(fleet.wait_exit(instances[1].pid, 10), instances[1]:log())
    end)

    it("behind nginx loses no request", function()
        instances = fleet.instances(3, { dir = dir, redis = redis })
        balancer = fleet.nginx(instances, { dir = dir })
        load = fleet.load({ h1 = { balancer.port, 6 }, ws = { balancer.port, 3 },
            users = { balancer.port, USERS }, chat = { balancer.port, CHATTERS } },
            { dir = dir, check_ports = plain_ports(instances) })
        helper.wait_for(function() return false end, 1)
        local unclean = fleet.roll(instances, nil, 1)
        helper.wait_for(function() return false end, 1)
        local counts = load.finish()
        load = nil
        report("nginx", counts)
        assert.equal(0, unclean)
    end)
end)
