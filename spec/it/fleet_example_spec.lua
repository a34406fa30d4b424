-- spec/it/fleet_example_spec.lua: examples/fleet/run, the demo as a fleet (Redis, two instances,
-- HAProxy): it starts, the demo's chat and counter reach the tabs of both instances, an
-- instance upgrades in place, and a TERM to the script stops everything it started.
local helper = require "helper"
local fleet = require "fleet_helper"

local function alive(pid)
    local stat = helper.read_file("/proc/" .. pid .. "/stat")
    return stat ~= "" and not stat:match("^%d+ %(.*%) Z")
end

describe("examples/fleet/run", function()
    it("runs the demo on two instances behind HAProxy with a Redis, and stops it all",
        function()
        local dir = fleet.tempdir()
        math.randomseed(os.time())
        -- (the script's ports run from base to base + 30, all below the kernel's ephemeral
        -- range, 32768 on: a spec running beside this one binds port 0, never one of these)
        local port, base = helper.free_port(), 20000 + math.random(0, 300) * 40
        local out = dir .. "/run.out"
        local pid = fleet.background(string.format("FLEET_PORT=%d FLEET_BASE=%d MOONSERVE=%s %s",
            port, base, helper.sh_quote(helper.bin),
            helper.sh_quote(helper.root .. "/examples/fleet/run")), out)
        local masters
        finally(function()
            fleet.stop_pid(pid, "TERM", 15)
            for _, m in ipairs(masters or {}) do
                fleet.stop_pid(m, "KILL", 1)
            end
            fleet.cleanup(dir)
        end)
        assert.truthy(helper.wait_for(function()
            return helper.read_file(out):find("moonserve fleet: http://127.0.0.1:" .. port .. "/",
                1, true)
        end, 20), helper.read_file(out))
        local text = helper.read_file(out)
        local work = text:match("logs in (%S+)")
        masters = { text:match("i1 %(master (%d+)%)"), text:match("i2 %(master (%d+)%)") }
        assert.equal(200, fleet.get(port, "/"))
        -- The chat and the counter across the instances (the client says why it spans both).
        local facts = helper.run(helper.sh_quote(helper.tool("websockets")) .. " "
            .. helper.sh_quote(helper.root .. "/spec/it/fleet_example_client.py") .. " " .. port)
        for i = 0, 2 do
            assert.truthy(facts:find("chat" .. i .. "=ok", 1, true), facts)
            assert.truthy(facts:find("count" .. i .. "=ok", 1, true), facts)
        end
        -- The upgrade the script prints, on i1.
        os.execute("kill -USR2 " .. masters[1])
        assert.truthy(helper.wait_for(function()
            return helper.read_file(work .. "/i1.log"):find("is ready; QUIT this master", 1, true)
        end, 20), helper.read_file(work .. "/i1.log"))
        local new = helper.read_file(work .. "/i1.pid"):match("%d+")
        os.execute("kill -QUIT " .. masters[1])
        assert.is_true(helper.wait_for(function() return not alive(masters[1]) end, 15))
        masters[3] = new
        assert.equal(200, fleet.get(port, "/"))
        -- TERM to the script: every process it started (the upgrade's master too) ends.
        local redis = helper.sh(helper.tool("pgrep") .. " -f " .. helper.sh_quote("redis-server 127.0.0.1:"
            .. (base + 21))):match("%d+")
        assert.truthy(redis)
        os.execute("kill -TERM " .. pid)
        assert.is_true(helper.wait_for(function() return not alive(pid) end, 20),
            helper.read_file(out))
        for _, p in ipairs({ masters[2], new, redis }) do
            assert.is_false(alive(p), p)
        end
        assert.is_nil(fleet.get(port, "/", 0.5))
        assert.truthy(helper.read_file(out):find("examples/fleet/run: stopped", 1, true))
        assert.is_nil(io.open(work .. "/i1.log"))
    end)
end)
