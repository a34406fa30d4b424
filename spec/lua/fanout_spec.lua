-- spec/lua/fanout_spec.lua: moonserve.fanout's tasks on a simulated clock, with a scripted
-- Redis and dictionaries that evict as a full one does (the fan-out against a real Redis and
-- three instances is spec/it/fanout_spec.lua). Each load of the module is one worker.
describe("moonserve.fanout", function()
    local saved = {}
    local T, tasks, logs, stopping, dicts

    -- A dictionary of at most `cap` entries: set/add/incr evict the oldest, safe_add fails.
    local function new_dict(cap)
        local d = { v = {}, order = {}, cap = cap }
        local function count()
            local n = 0
            for _ in pairs(d.v) do
                n = n + 1
            end
            return n
        end
        local function put(key, value, safe)
            if d.v[key] == nil and count() >= d.cap then
                if safe then
                    return false, "no memory"
                end
                while count() >= d.cap do
                    d.v[table.remove(d.order, 1)] = nil
                end
            end
            if d.v[key] == nil then
                d.order[#d.order + 1] = key
            end
            d.v[key] = value
            return true
        end
        function d.get(_, key)
            return d.v[key]
        end
        function d.set(_, key, value)
            return put(key, value)
        end
        function d.add(_, key, value)
            if d.v[key] ~= nil then
                return false, "exists"
            end
            return put(key, value)
        end
        function d.safe_add(_, key, value)
            if d.v[key] ~= nil then
                return false, "exists"
            end
            return put(key, value, true)
        end
        function d.incr(_, key, n, init)
            local v = d.v[key]
            if v == nil then
                if init == nil then
                    return nil, "not found"
                end
                put(key, init + n)
                return init + n
            end
            d.v[key] = v + n
            return v + n
        end
        return d
    end

    -- Tasks: coroutines that yield { wake = time } or { sema = s, wake = time }.
    local function spawn(delay, fn, ...)
        local args = { n = select("#", ...), ... }
        tasks[#tasks + 1] = { wake = T + delay, co = coroutine.create(function()
            fn(false, unpack(args, 1, args.n))
        end) }
        return true
    end

    local function run(upto)
        while true do
            local best
            for _, t in ipairs(tasks) do
                local ready = t.sema and t.sema.count > 0 and T or t.wake
                if not best or ready < best.ready then
                    best = { t = t, ready = ready }
                end
            end
            if not best or best.ready > upto then
                T = upto
                return
            end
            T = math.max(T, best.ready)
            local t = best.t
            local posted = t.sema and t.sema.count > 0
            if posted then
                t.sema.count = t.sema.count - 1
            end
            t.sema = nil
            local ok, req = coroutine.resume(t.co, posted)
            assert(ok, req)
            if coroutine.status(t.co) == "dead" then
                for i, x in ipairs(tasks) do
                    if x == t then
                        table.remove(tasks, i)
                        break
                    end
                end
            else
                t.wake, t.sema = T + req.wake, req.sema
            end
        end
    end

    local host = {
        now = function() return T end,
        sleep = function(s) coroutine.yield { wake = s } end,
        log = function(level, msg) logs[#logs + 1] = level .. " " .. msg end,
        module = function(name)
            if name == "timer" then
                return { at = spawn }
            elseif name == "semaphore" then
                return { new = function(n)
                    local s = { count = n }
                    function s.wait(self, timeout)
                        return coroutine.yield { wake = timeout, sema = self }
                    end
                    function s.post(self, k)
                        self.count = self.count + (k or 1)
                    end
                    return s
                end }
            elseif name == "dispatcher" then
                return { limits = { fanout_queue = 10000 }, stopping = function() return stopping end }
            end
            return {}
        end,
    }

    -- One worker: a fresh load of the module over the same dictionaries.
    local function worker()
        package.loaded["moonserve.fanout"] = nil
        return require "moonserve.fanout"
    end

    local function count(level)
        local n = 0
        for _, l in ipairs(logs) do
            if l:find("^" .. level) then
                n = n + 1
            end
        end
        return n
    end

    -- A scripted Redis: subscriber() gives a connection whose next() pops `script` (a
    -- message, { err = }) or, with nothing left, waits its timeout; pipeline(cmds) answers
    -- with `pipeline_reply`.
    local function fake_redis(opts)
        local r = { subscribed = {}, pipelines = 0, script = {} }
        function r.subscriber()
            local c = {}
            function c.subscribe(_, ...)
                for _, n in ipairs { ... } do
                    r.subscribed[n] = true
                    if opts.confirm and c.confirmations then
                        table.insert(r.script, 1, { kind = "subscribe", channel = n, count = 1 })
                    end
                end
                return true
            end
            function c.next(_, timeout)
                local m = table.remove(r.script, 1)
                if m == nil and opts.feed then
                    coroutine.yield { wake = 0.1 } -- (a busy topic: a message every 0.1 s)
                    return opts.feed()
                end
                if m == nil then
                    coroutine.yield { wake = timeout }
                    return nil, "timeout"
                end
                if m.err then
                    return nil, m.err
                end
                return m
            end
            function c.close() end
            if opts.refuse then
                table.insert(r.script, { err = "NOPERM this user has no permissions to access "
                    .. "one of the channels used as arguments" })
            end
            return c
        end
        function r.pipeline(_, cmds)
            r.pipelines = r.pipelines + 1
            if opts.down then
                return nil, "connection refused"
            end
            local out = {}
            for i = 1, #cmds do
                out[i] = 1
            end
            return out
        end
        return r
    end

    local function prepare(f)
        f.prepare(setmetatable({}, { __index = {
            shared_dict = function() end,
            on_worker_start = function(_, fn) fn() end,
        } }))
    end

    local real_hex = require("moonserve.crypto").hex

    before_each(function()
        for _, m in ipairs { "moonserve.host", "moonserve.shared", "moonserve.crypto",
                "moonserve.redis", "moonserve.fanout" } do
            saved[m] = package.loaded[m]
        end
        T, tasks, logs, stopping = 0, {}, {}, false
        dicts = { moonserve_fanout = new_dict(50), moonserve_fanout_state = new_dict(1000) }
        local n = 0
        package.loaded["moonserve.host"] = host
        package.loaded["moonserve.shared"] = { dicts = dicts }
        package.loaded["moonserve.crypto"] = { hex = real_hex, random = function(k)
            n = n + 1
            return string.rep(string.char(n), k)
        end }
        package.loaded["moonserve.redis"] = { is_error = function(v)
            return type(v) == "table" and v.error ~= nil
        end }
    end)

    after_each(function()
        for m, v in pairs(saved) do
            package.loaded[m] = v
        end
    end)

    it("counts a subscription as up at Redis's confirmation, not when it is sent", function()
        local f = worker()
        local r = fake_redis { refuse = true }
        local resets = 0
        f.channel("room", r, function() end)
        f.broadcast("b1", { redis = r }):on_reset(function() resets = resets + 1 end)
        prepare(f)
        run(30)
        local s = f.stats()
        assert.equal(0, s.up)
        assert.equal(0, s.resubscribed)
        assert.equal(1, s.outages)
        assert.equal(0, resets)
        assert.equal(1, count("warn"), table.concat(logs, "\n"))
        assert.equal(0, count("info"), table.concat(logs, "\n"))
        -- and with a confirmation it is up
        local f2 = worker()
        f2.channel("room", fake_redis { confirm = true }, function() end)
        prepare(f2)
        run(31)
        assert.equal(1, f2.stats().up)
    end)

    it("backs off from a Redis that is down rather than connect at the rate of publishes",
            function()
        local f = worker()
        local r = fake_redis { down = true, confirm = true }
        local ch = f.channel("room", r, function() end)
        spawn(0, function()
            for i = 1, 60 do
                f.publish(ch, "m" .. i, "text")
                host.sleep(0.05)
            end
        end)
        run(3.2)
        assert.is_true(r.pipelines <= 8, "pipelines: " .. r.pipelines)
        run(20)
        assert.equal(60, f.stats().publish_failed)
    end)

    it("subscribes a topic declared later although messages never let a read time out",
            function()
        local f = worker()
        local r
        r = fake_redis { confirm = true, feed = function()
            return { kind = "message", channel = "moonserve:channel:room", data = "x" }
        end }
        f.channel("room", r, function() end)
        prepare(f)
        run(1)
        assert.is_true(r.subscribed["moonserve:channel:room"])
        f.broadcast("later", { redis = r })
        run(1.5)
        assert.is_true(r.subscribed["moonserve:broadcast:later"])
    end)

    it("keeps its state apart from the claims, and never lets a claim evict another",
            function()
        local entered = {}
        local function on_remote(data)
            entered[data] = (entered[data] or 0) + 1
        end
        local a, b = worker(), worker()
        local ra, rb = fake_redis {}, fake_redis {}
        local ia = assert(a.instance())
        -- the first worker gets 60 messages from another instance (the claims' dictionary
        -- holds 50), then the second the same 60, as it reads the same stream
        for _, w in ipairs { { a, ra }, { b, rb } } do
            local f, r = w[1], w[2]
            f.channel("room", r, on_remote)
            for i = 1, 60 do
                f._receive(r, "moonserve:channel:room",
                    string.format("00000000000000aa.01 %d tm%d", i, i))
            end
        end
        assert.equal(ia, b.instance())
        for data, n in pairs(entered) do
            assert.equal(1, n, data)
        end
        -- (each worker counts the 10 it found no room to claim: the claims tell no more)
        assert.equal(20, a.stats().missed)
        assert.equal(1, count("warn"), table.concat(logs, "\n"))
    end)

    it("refuses what a channel refuses, counted and logged once", function()
        local f = worker()
        local r = fake_redis {}
        f.instance()
        f.channel("room", r, function() return false, "not UTF-8" end)
        for i = 1, 3 do
            f._receive(r, "moonserve:channel:room", "00000000000000aa.01 " .. i .. " t\255")
        end
        assert.equal(3, f.stats().rejected)
        assert.equal(0, f.stats().received)
        assert.equal(1, count("warn"), table.concat(logs, "\n"))
    end)

    it("forgets idle senders, and lets no forged number silence a sender", function()
        local f = worker()
        local r = fake_redis {}
        local got = {}
        f.instance()
        f.channel("room", r, function(data) got[#got + 1] = data end)
        local topic = "moonserve:channel:room"
        f._receive(r, topic, "00000000000000aa.01 99999999999999 tforged")
        f._receive(r, topic, "00000000000000aa.01 1 treal")
        assert.same({ "forged", "real" }, got)
        f._receive(r, topic, "00000000000000aa.01 1 treal") -- (sent twice: dropped)
        assert.equal(2, #got)
        f._receive(r, topic, "00000000000000aa.01 1234567890123456 thuge")
        assert.equal(2, #got)
        for i = 1, 100 do
            f._receive(r, topic, string.format("00000000000000bb.%02x 1 t", i))
        end
        T = 700
        f._receive(r, topic, "00000000000000cc.01 1 tnew")
        local n = 0
        for _ in pairs(f._bus(r).seen[topic]) do
            n = n + 1
        end
        assert.equal(1, n)
    end)

    it("leaves the claims' dictionary at the size the app declared, if it did", function()
        local f = worker()
        f.channel("room", fake_redis {}, function() end)
        local declared = {}
        f.prepare(setmetatable({ shared_decl = { moonserve_fanout = 64 * 1024 * 1024 } },
            { __index = {
                shared_dict = function(_, name, size) declared[name] = size end,
                on_worker_start = function() end,
            } }))
        assert.is_nil(declared.moonserve_fanout)
        assert.equal("256k", declared.moonserve_fanout_state)
        local g = worker()
        g.channel("room", fake_redis {}, function() end)
        local fresh = {}
        g.prepare(setmetatable({}, { __index = {
            shared_dict = function(_, name, size) fresh[name] = size end,
            on_worker_start = function() end,
        } }))
        assert.equal("8m", fresh.moonserve_fanout)
    end)

    for _, down in ipairs { false, true } do
        it("sends what is still queued when the worker stops, and counts what Redis refuses ("
                .. (down and "Redis down)" or "Redis up)"), function()
            local f = worker()
            local ch = f.channel("room", fake_redis { down = down }, function() end)
            f.instance()
            for i = 1, 3 do
                f.publish(ch, "m" .. i, "text")
            end
            stopping = true
            run(5)
            f.publish(ch, "late", "text") -- (after the writer ended: it sends itself)
            assert.equal(down and 4 or 0, f.stats().publish_failed)
            assert.equal(down and 0 or 4, f.stats().published)
        end)
    end
end)
