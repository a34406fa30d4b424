-- spec/it/fanout_spec.lua: channels and broadcasts across three instances of two workers each
-- over a real redis-server this spec starts (spec/fixtures/fanout.lua), with
-- spec/it/fanout_client.py on Debian's python3-websockets as the browsers' side.
local helper = require "helper"
local socket = require "socket"
local cjson = require "cjson"

local function q(s)
    return "'" .. s:gsub("'", "'\\''") .. "'"
end

local function facts_of(out)
    local facts = { _out = out }
    for k, v in out:gmatch("([%w_]+)=([^\n]*)") do
        facts[k] = v
    end
    return facts
end

local function client(case, ports)
    return facts_of(helper.run(q(helper.tool("websockets")) .. " "
        .. q(helper.root .. "/spec/it/fanout_client.py") .. " " .. case .. " "
        .. table.concat(ports, " ") .. " 2>&1"))
end

local function get(port, path)
    local r = assert(helper.request(port, "GET " .. path .. " HTTP/1.1\r\nHost: x\r\n"
        .. "Connection: close\r\n\r\n"))
    return r.body, r.status
end

local function post(port, path, body)
    local r = assert(helper.request(port, "POST " .. path .. " HTTP/1.1\r\nHost: x\r\n"
        .. "Connection: close\r\nContent-Length: " .. #body .. "\r\n\r\n" .. body))
    assert.equal(200, r.status, r.body)
end

local function stats(port)
    return cjson.decode((get(port, "/fanout")))
end

local function seen(port)
    return cjson.decode((get(port, "/seen")))
end

-- A sample of the scrape: the value of `name` (no labels) on the instance at `port`.
local function metric(port, name)
    local text = get(port, "/metrics")
    return tonumber(text:match("\n" .. name .. " (%S+)"))
end

local start_redis = helper.redis_server

-- A Redis on a free port, then `n` instances of opts.app (nil: the demo) of opts.workers
-- workers (default 2), each given the Redis's URL in opts.var (default FANOUT_REDIS; with
-- opts.auth, "user:pw@" in it) and opts.args; opts.prepare(rport) runs in between. Returns
-- { rport =, redis_pid =, servers = { ... }, stop = function }.
local function start_fleet(n, opts)
    local f = { servers = {} }
    f.redis_pid, f.rport = start_redis()
    if opts.prepare then
        opts.prepare(f.rport)
    end
    for i = 1, n do
        f.servers[i] = helper.spawn_server { app = opts.app, bare = true,
            env = { [opts.var or "FANOUT_REDIS"] = "redis://" .. (opts.auth or "") .. "127.0.0.1:"
                .. f.rport },
            args = "--listen 127.0.0.1:" .. helper.free_port() .. " --workers "
                .. (opts.workers or 2) .. " " .. (opts.args or "") }
    end
    function f.stop()
        for _, srv in ipairs(f.servers) do
            srv:stop()
        end
        helper.stop_pid(f.redis_pid)
    end
    return f
end

describe("fan-out across three instances over Redis", function()
    local rport, redis_pid
    local servers, ports = {}, {}

    setup(function()
        local f = start_fleet(3, { app = "spec/fixtures/fanout.lua" })
        rport, redis_pid, servers = f.rport, f.redis_pid, f.servers
        for i = 1, 3 do
            ports[i] = servers[i].port
        end
        for i = 1, 3 do
            assert(helper.wait_for(function() return stats(ports[i]).up == 2 end),
                "instance " .. i .. " did not subscribe")
        end
    end)

    teardown(function()
        for _, s in ipairs(servers) do
            s:stop()
        end
        helper.stop_pid(redis_pid)
    end)

    it("delivers what a client of any instance publishes to every client of every instance, "
        .. "exactly once", function()
        local f = client("exact", ports)
        for _, p in ipairs(ports) do
            assert.equal("0,1", f["workers_" .. p], f._out)
        end
        local n, m = tonumber(f.sockets), tonumber(f.messages)
        assert.is_true(n >= 6, f._out)
        assert.equal("0", f.wrong, f._out)
        assert.equal(n * m, tonumber(f.deliveries), f._out)
        -- each instance counted what it took from the others, and Redis took every publish
        local received = 0
        for _, p in ipairs(ports) do
            received = received + stats(p).received
            assert.equal(0, stats(p).publish_failed)
        end
        assert.equal(2 * m, received) -- (each message entered the two other instances once)
        -- and every instance's ring holds every message once, for replay there
        for _, p in ipairs(ports) do
            local held = cjson.decode((get(p, "/since?id=0")))
            assert.equal(m, #held, get(p, "/since?id=0"))
            local once = {}
            for _, data in ipairs(held) do
                assert.is_nil(once[data])
                once[data] = true
                assert.matches("^m%d+%-%d+$", data)
            end
        end
    end)

    it("broadcasts to every worker of every instance, as b:broadcast(data) and as "
        .. "lua-resty-mlcache's broadcast(channel, data)", function()
        post(ports[1], "/invalidate", "k1")
        post(ports[2], "/invalidate?mlcache=1", "key9")
        for _, p in ipairs(ports) do
            assert(helper.wait_for(function()
                local s = seen(p)
                return s["0"].got:find("k1", 1, true) and s["1"].got:find("k1", 1, true)
                    and s["0"].ml == "key9" and s["1"].ml == "key9"
            end, 5), "port " .. p .. ": " .. get(p, "/seen"))
        end
    end)

    it("checks a message from another instance as publish does: too big or bad UTF-8 never "
        .. "enters", function()
        -- (a foreign publisher, or an instance whose max_message_bytes is larger)
        local function forge(seq, data)
            local ch = "moonserve:channel:room"
            local body = "00000000000000ff.01 " .. seq .. " t" .. data
            return helper.redis_cmd(rport, "*3\r\n$7\r\nPUBLISH\r\n$" .. #ch .. "\r\n" .. ch
                .. "\r\n$" .. #body .. "\r\n" .. body)
        end
        local before = cjson.decode((get(ports[1], "/since?id=0")))
        forge(1, "bad \255\254 text")
        forge(2, string.rep("y", 65537)) -- (the room's max_message_bytes is the default, 65536)
        for i, p in ipairs(ports) do
            assert(helper.wait_for(function() return stats(p).rejected == 2 end, 5),
                get(p, "/fanout"))
            local held = cjson.decode((get(p, "/since?id=0")))
            if i == 1 then
                assert.equal(#before, #held)
            end
            for _, data in ipairs(held) do
                assert.is_nil(data:find("bad", 1, true))
                assert.is_true(#data < 65536)
            end
            local log = servers[i]:log()
            local _, lines = log:gsub("refused a message from another instance", "")
            assert.equal(2, lines, log) -- (one per reason)
        end
    end)

    it("never lets a socket that does not read hold up the others or the worker", function()
        local f = client("slow", ports)
        assert.equal(f.readers, f.readers_complete, f._out)
        assert.is_true(tonumber(f.hello_ms) < 500, f._out)
    end)

    it("subscribes again after Redis comes back, counts what it missed, logs the outage once "
        .. "and tells every worker to purge", function()
        local before = {}
        for i, p in ipairs(ports) do
            before[i] = seen(p)
        end
        local out = os.tmpname()
        local cpid = helper.background(q(helper.tool("websockets")) .. " "
            .. q(helper.root .. "/spec/it/fanout_client.py") .. " listen 10 "
            .. table.concat(ports, " ") .. " >" .. out .. " 2>&1; true")
        local function output()
            local fh = io.open(out)
            local s = fh and fh:read("*a") or ""
            if fh then fh:close() end
            return s
        end
        assert(helper.wait_for(function() return output():find("ready=1") end), output())
        socket.sleep(0.3)

        os.execute("kill -9 " .. redis_pid)
        for i = 1, 3 do
            assert(helper.wait_for(function() return stats(ports[i]).up == 0 end, 5))
        end
        -- (one keep-alive connection for both publishes: one worker, one sender, whose
        -- next message after the outage shows the gap)
        local keep = helper.connect(ports[1])
        local function keep_post(path, body)
            assert(keep:send("POST " .. path .. " HTTP/1.1\r\nHost: x\r\nContent-Length: "
                .. #body .. "\r\n\r\n" .. body))
            local r = helper.read_response(keep)
            assert.equal(200, r.status)
        end
        keep_post("/publish?n=3", "during")
        -- and two from the second instance, which publishes nothing after the outage: its
        -- heartbeat shows the gap
        post(ports[2], "/publish?n=2", "quiet")
        assert(helper.wait_for(function()
            return metric(ports[1], "moonserve_fanout_publish_failed_total") == 3
                and metric(ports[2], "moonserve_fanout_publish_failed_total") == 2
        end, 5), get(ports[1], "/metrics"))

        redis_pid = start_redis(rport)
        for i = 1, 3 do
            assert(helper.wait_for(function() return stats(ports[i]).up == 2 end, 10),
                "instance " .. i .. " did not subscribe again")
        end
        keep_post("/publish", "after")
        keep:close()

        -- the client's sockets: the publishing instance's got everything; the others got
        -- what was published once Redis was back
        assert(helper.wait_for(function() return output():find("got_" .. ports[3]) end, 15))
        local f = facts_of(output())
        os.remove(out)
        helper.stop_pid(cpid)
        for each in f["got_" .. ports[1]]:gmatch("[^|]+") do
            assert.equal("after,during-1,during-2,during-3", each, f._out)
        end
        for each in f["got_" .. ports[2]]:gmatch("[^|]+") do
            assert.equal("after,quiet-1,quiet-2", each, f._out)
        end
        for each in f["got_" .. ports[3]]:gmatch("[^|]+") do
            assert.equal("after", each, f._out)
        end
        -- the lost messages, seen as gaps in the senders' numbers: the first instance's three
        -- at its next message, the second's two at its heartbeat
        for i, missed in ipairs { 2, 3, 5 } do
            assert(helper.wait_for(function()
                return metric(ports[i], "moonserve_fanout_missed_total") == missed
            end, 5), "instance " .. i .. ":\n" .. get(ports[i], "/metrics"))
            assert.equal(1, metric(ports[i], "moonserve_fanout_outages_total"))
        end
        for i = 1, 3 do
            local log = servers[i]:log()
            local _, lines = log:gsub("fanout: lost redis", "")
            assert.equal(1, lines, log)
            -- every worker was told to purge, its mlcache purge event too
            local s = seen(ports[i])
            for w = 0, 1 do
                local k = tostring(w)
                assert.is_true(s[k].resets > before[i][k].resets, get(ports[i], "/seen"))
                assert.is_true(s[k].mlpurge > before[i][k].mlpurge)
            end
        end
    end)
end)

describe("a broadcast with no Redis", function()
    local srv

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/fanout.lua", bare = true,
            args = "--listen 127.0.0.1:" .. helper.free_port() .. " --workers 2" }
    end)

    teardown(function()
        srv:stop()
    end)

    it("reaches every worker of the instance", function()
        socket.sleep(0.2)
        post(srv.port, "/invalidate", "local1")
        post(srv.port, "/invalidate?mlcache=1", "local2")
        assert(helper.wait_for(function()
            local s = seen(srv.port)
            return s["0"].got == "local1,local2" and s["1"].got == "local1,local2"
                and s["0"].ml == "local2"
                and s["1"].ml == "local2"
        end, 5), get(srv.port, "/seen"))
        assert.is_nil(get(srv.port, "/metrics"):find("moonserve_fanout_up 1"))
    end)
end)

describe("the demo site on two instances and a Redis", function()
    local demo, rport, servers

    setup(function()
        demo = start_fleet(2, { var = "REDIS_URL" })
        rport, servers = demo.rport, demo.servers
    end)

    teardown(function()
        demo.stop()
    end)

    it("shares its counter and its chat between the instances", function()
        local f = client("demo", { servers[1].port, servers[2].port })
        assert.equal("0,0", f.hello_counts, f._out)
        assert.equal("1", f.a_count, f._out)
        assert.equal("1", f.b_count, f._out)
        assert.equal("hello fleet", f.a_say, f._out)
        assert.equal("hello fleet", f.b_say, f._out)
        assert.equal("1", helper.redis_cmd(rport, "GET moonserve:demo:count"):gsub("\r\n$", ""))
    end)
end)

describe("a Redis that refuses the subscription (an ACL without the channels)", function()
    local f, srv

    setup(function()
        f = start_fleet(1, { app = "spec/fixtures/fanout.lua", workers = 1, auth = "app:pw@",
            prepare = function(rport)
                assert.equal("+OK", helper.redis_cmd(rport,
                    "ACL SETUSER app on >pw ~* +@all resetchannels"))
            end })
        srv = f.servers[1]
    end)

    teardown(function()
        f.stop()
    end)

    it("is one outage that lasts, logged once: never up, never resubscribed, no purges",
            function()
        assert(helper.wait_for(function() return stats(srv.port).outages == 1 end, 5))
        socket.sleep(3) -- (the backoff's first rounds: 0.1 + 0.2 + 0.4 + 0.8 + 1.6 s)
        local s = stats(srv.port)
        assert.equal(0, s.up)
        assert.equal(0, s.resubscribed)
        assert.equal(1, s.outages)
        assert.equal(0, seen(srv.port)["0"].resets)
        local log = srv:log()
        local _, lost = log:gsub("fanout: lost redis", "")
        assert.equal(1, lost, log)
        assert.matches("NOPERM", log)
        assert.is_nil(log:find("resubscribed to redis", 1, true), log)
    end)
end)

describe("the fanout_queue limit", function()
    local f, srv

    setup(function()
        f = start_fleet(1, { app = "spec/fixtures/fanout.lua", workers = 1,
            args = "--limit fanout_queue=5" })
        srv = f.servers[1]
        assert(helper.wait_for(function() return stats(srv.port).up == 1 end))
    end)

    teardown(function()
        f.stop()
    end)

    it("fails the oldest publishes past it, counted, and sends the rest", function()
        -- (twenty publishes in one handler, which never waits: the writer runs after it)
        post(srv.port, "/publish?n=20", "q")
        assert(helper.wait_for(function()
            local s = stats(srv.port)
            return s.published == 5 and s.publish_failed == 15
        end, 5), get(srv.port, "/fanout"))
    end)
end)
