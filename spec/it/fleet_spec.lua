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

describe("a rolling restart", function()
    local w

    before_each(function()
        w = fleet.world()
    end)

    after_each(function()
        w:finish()
    end)

    it("behind HAProxy loses no request", function()
        w.instances = fleet.instances(3, { dir = w.dir, redis = w.redis })
        -- No retries: the drain alone must keep every request (a balancer's retries would
        -- hide a connection refused or closed under a request).
        local balancer = fleet.haproxy(w.instances, { dir = w.dir, retries = "    retries 0" })
        w.balancer = balancer
        assert.is_true(balancer.all_up(), balancer.log())
        w:start_load { h1 = { balancer.port, 6 }, h2 = { balancer.port, 3 },
            ws = { balancer.port, 3 } }
        helper.wait_for(function() return false end, 1) -- (the load under way)
        local unclean = fleet.roll(w.instances, function()
            assert.is_true(balancer.all_up(), balancer.log())
        end)
        helper.wait_for(function() return false end, 1)
        w:check_load("haproxy")
        assert.equal(0, unclean)
    end)

    -- A request under way when its instance stops may still publish (its listeners have
    -- closed, its connections are finishing): the message must reach the other instances.
    it("sends to the other instances what a stopping instance publishes", function()
        local instances = fleet.instances(2, { dir = w.dir, redis = w.redis,
            args = "--readyz /readyz --drain-delay 0" })
        w.instances = instances
        local out = w.dir .. "/listen.out"
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
        w.instances = fleet.instances(3, { dir = w.dir, redis = w.redis })
        w.balancer = fleet.nginx(w.instances, { dir = w.dir })
        w:start_load { h1 = { w.balancer.port, 6 }, ws = { w.balancer.port, 3 } }
        helper.wait_for(function() return false end, 1)
        local unclean = fleet.roll(w.instances, nil, 1)
        helper.wait_for(function() return false end, 1)
        w:check_load("nginx")
        assert.equal(0, unclean)
    end)
end)
