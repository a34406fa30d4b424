-- spec/it/channel_spec.lua: app:channel carries WebSocket messages to the subscribers of
-- every worker (spec/fixtures/channel.lua, with spec/it/channel_client.py on Debian's
-- python3-websockets as the browsers' side).
local helper = require "helper"

local function q(s)
    return "'" .. s:gsub("'", "'\\''") .. "'"
end

describe("a channel across two workers", function()
    local srv, facts

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/channel.lua", args = "--workers 2" }
        local out = helper.run(q(helper.tool("websockets")) .. " "
            .. q(helper.root .. "/spec/it/channel_client.py") .. " " .. srv.port .. " 2>&1")
        facts = { _out = out }
        for k, v in out:gmatch("([%w_]+)=([^\n]*)") do
            facts[k] = v
        end
    end)

    teardown(function()
        srv:stop()
    end)

    it("has clients on two workers, which are the master's two processes", function()
        assert.equal("0,1", facts.workers, facts._out)
        local children = helper.children(srv.pid)
        table.sort(children)
        assert.equal(table.concat(children, ","), facts.pids)
    end)

    it("delivers what one worker's client publishes to the other's, both ways", function()
        assert.equal("hello from a", facts.a_got_a, facts._out)
        assert.equal("hello from a", facts.b_got_a)
        assert.equal("hello from b", facts.a_got_b)
        assert.equal("hello from b", facts.b_got_b)
    end)

    it("delivers messages published on both workers at once in one order everywhere", function()
        assert.equal("True", facts.same_order, facts._out)
        assert.equal("True", facts.all_six)
    end)

    it("keeps its ring bounded: a worker lapped by a burst skips ahead and counts the loss",
        function()
            assert.equal("x13,x14,x15,x16,x17,x18,x19,x20", facts.burst_a, facts._out)
            assert.equal("x13,x14,x15,x16,x17,x18,x19,x20", facts.burst_b_tail)
            assert.equal("True", facts.burst_b_increasing)
            assert.equal("12", facts.worker_lost_a)
        end)

    it("skips a sequence number never written after hole_wait, counting it lost", function()
        assert.equal("after-hole", facts.b_after_hole, facts._out)
        assert.equal("after-hole", facts.a_after_hole)
        assert.equal("30", facts.published)
        -- 12 and the hole in the publishing worker; the hole and at least 4 of the burst in
        -- the other (it may have looked at the ring once during the burst)
        assert.is_true(tonumber(facts.lost_total) >= 18, facts._out)
        assert.equal("1", facts.subscribers_b)
    end)

    it("takes about a poll interval (10 ms here) from one worker to the other", function()
        -- (loose: a busy machine may delay a timer; the median stays far under hole_wait)
        assert.is_true(tonumber(facts.latency_ms_median) < 100, facts._out)
    end)

    it("refuses a message over max_message_bytes and text that is not UTF-8", function()
        local url = "http://127.0.0.1:" .. srv.port .. "/publish"
        local origin = "-H 'Origin: http://127.0.0.1:" .. srv.port .. "' "
        assert.equal("71\n", helper.curl(origin .. "--data-binary ok " .. url))
        local bad, big = os.tmpname(), os.tmpname()
        finally(function()
            os.remove(bad)
            os.remove(big)
        end)
        helper.write_file(bad, "\xff")
        helper.write_file(big, ("a"):rep(70000))
        assert.equal("not UTF-8\n", helper.curl(origin .. "--data-binary @" .. bad .. " " .. url))
        assert.equal("too big\n", helper.curl(origin .. "--data-binary @" .. big .. " " .. url))
    end)
end)

describe("app:channel", function()
    local moonserve = require "moonserve"

    it("names a bad option, size or name", function()
        local app = moonserve.app()
        assert.has_error(function() app:channel("a b") end,
            "bad channel name a b (1 to 45 letters, digits, '_' or '-')")
        assert.has_error(function() app:channel("c", { ring = 3 }) end,
            "unknown channel option ring for c (accepted: history, size, poll, hole_wait, "
            .. "max_message_bytes, redis)")
        assert.has_error(function() app:channel("c", { redis = 5 }) end,
            "bad redis for channel c (a URL or a moonserve.redis client expected)")
        -- (a URL moonserve.redis refuses: its one line, at the declaration)
        local ok, err = pcall(app.channel, app, "c", { redis = "http://127.0.0.1:6379" })
        assert.is_false(ok)
        assert.matches("^.-bad redis for fan%-out: redis: ", err)
        assert.has_error(function() app:channel("c", { poll = 0 }) end,
            "bad poll for channel c (positive number expected)")
        assert.has_error(function() app:channel("c", { size = "1x" }) end)
    end)

    it("declares a dictionary of its own, and is the same channel when declared again", function()
        local app = moonserve.app()
        local ch = app:channel("news", { size = "64k" })
        assert.equal(65536, app.shared_decl.moonserve_channel_news)
        assert.equal(ch, app:channel("news", { size = "64k" }))
        assert.equal(ch, moonserve.websocket.channel("news"))
        assert.same({ nil, "channel news is not open here (it opens in the workers)" },
            { ch:publish("x") })
    end)
end)
