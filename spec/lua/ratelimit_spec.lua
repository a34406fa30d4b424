describe("moonserve.ratelimit", function()
    local lines = {}
    local saved_log
    local ratelimit

    setup(function()
        saved_log = package.loaded["moonserve.log"]
        local function keep(...)
            lines[#lines + 1] = table.concat({ ... })
        end
        package.loaded["moonserve.log"] = { error = keep, warn = keep, info = keep }
        package.loaded["moonserve.ratelimit"] = nil
        ratelimit = require "moonserve.ratelimit"
    end)

    teardown(function()
        package.loaded["moonserve.log"] = saved_log
        package.loaded["moonserve.ratelimit"] = nil
    end)

    -- A Redis client that fails while `down`, and else runs the script's rule in Lua (one
    -- clock, `now`, in microseconds): what the fleet's script answers.
    local function fake_redis()
        local r = { down = false, now = 0, sets = {}, calls = 0 }
        function r:eval(_, keys, args)
            self.calls = self.calls + 1
            if self.down then
                return nil, "connection refused"
            end
            local limit, window = tonumber(args[1]), tonumber(args[2])
            local set = self.sets[keys[1]] or {}
            self.sets[keys[1]] = set
            while set[1] and set[1] <= self.now - window do
                table.remove(set, 1)
            end
            local ok = 0
            if #set < limit then
                set[#set + 1] = self.now
                ok = 1
            end
            return { ok, limit - #set, set[1] + window - self.now }
        end
        return r
    end

    local function exchange(fields, extra)
        local req = { method = "GET", client_ip = "192.0.2.1",
            header = function(_, name) return fields[name] end }
        for k, v in pairs(extra or {}) do
            req[k] = v
        end
        local res = { code = 200, fields = {} }
        function res:status(code) self.code = code; return self end
        function res:header(name, value)
            self.fields[name] = self.fields[name] and (self.fields[name] .. ", " .. value) or value
            return self
        end
        function res:send(body) self.body = body; return true end
        return req, res
    end

    local function run(mw, fields, extra)
        local req, res = exchange(fields or {}, extra)
        local passed = false
        mw(req, res, function() passed = true end)
        return passed, res
    end

    it("admits limit requests by the fleet's count, then refuses with the fields", function()
        local r = fake_redis()
        local mw = ratelimit { limit = 2, window = 10, fleet = r, name = "t1" }
        local ok, res = run(mw)
        assert.is_true(ok)
        assert.equal('"t1";q=2;w=10', res.fields["ratelimit-policy"])
        assert.equal('"t1";r=1;t=10', res.fields["ratelimit"])
        r.now = 1e6
        assert.is_true((run(mw)))
        r.now = 4e6
        ok, res = run(mw)
        assert.is_false(ok)
        assert.equal(429, res.code)
        assert.equal("6", res.fields["retry-after"])
        assert.equal('"t1";r=0;t=6', res.fields["ratelimit"])
        r.now = 10e6 -- the first left the window
        assert.is_true((run(mw)))
        assert.is_false((run(mw)))
    end)

    it("with Redis failing, admits (open) with one log line an outage, and says when it is back",
        function()
            local r = fake_redis()
            local mw = ratelimit { limit = 1, window = 10, fleet = r, name = "t2" }
            lines = {}
            r.down = true
            for _ = 1, 5 do
                local ok, res = run(mw)
                assert.is_true(ok)
                assert.is_nil(res.fields["ratelimit"])
            end
            assert.equal(1, #lines)
            assert.matches("ratelimit t2: redis failed %(connection refused%); admitting", lines[1])
            r.down = false
            assert.is_true((run(mw)))
            assert.is_false((run(mw)))
            assert.equal(2, #lines)
            assert.matches("ratelimit t2: redis answers again", lines[2])
        end)

    it("with Redis failing and on_error closed, answers 503 with Retry-After: 1", function()
        local r = fake_redis()
        r.down = true
        local mw = ratelimit { limit = 1, window = 10, fleet = r, on_error = "closed",
            name = "t3" }
        local ok, res = run(mw)
        assert.is_false(ok)
        assert.equal(503, res.code)
        assert.equal("1", res.fields["retry-after"])
        local limiter = ratelimit.new { limit = 1, window = 10, fleet = r, on_error = "closed" }
        local passed, info = limiter:take("k")
        assert.is_false(passed)
        assert.equal("connection refused", info.error)
    end)

    it("keys by user: req.user, else the session's user's id, else the address", function()
        local r = fake_redis()
        local mw = ratelimit { key = "user", limit = 1, window = 10, fleet = r, name = "u" }
        run(mw, {}, { user = "ada" })
        run(mw, {}, { session = { get = function() return { id = 7 } end } })
        run(mw)
        local keys = {}
        for k in pairs(r.sets) do
            keys[#keys + 1] = k
        end
        table.sort(keys)
        assert.same({ "moonserve:ratelimit:u:ip:192.0.2.1", "moonserve:ratelimit:u:user:7",
            "moonserve:ratelimit:u:user:ada" }, keys)
    end)

    it("keeps a long key as its SHA-256", function()
        local r = fake_redis()
        local limiter = ratelimit.new { limit = 1, window = 10, fleet = r, name = "h" }
        limiter:take(string.rep("x", 1000))
        local k = next(r.sets)
        assert.matches("^moonserve:ratelimit:h:#%x+$", k)
        assert.equal(#"moonserve:ratelimit:h:" + 65, #k)
    end)

    it("refuses bad options when made, naming them", function()
        local bad = {
            { { limit = 1.5, window = 1 }, "ratelimit: bad limit 1.5" },
            { { limit = 1, window = 0 }, "ratelimit: bad window 0" },
            { { limit = 1, window = 0 / 0 }, "ratelimit: bad window" },
            { { limit = 1, window = 1, key = 3 }, "ratelimit: bad key 3" },
            { { limit = 1, window = 1, name = 'a"b' }, "ratelimit: bad name" },
            { { limit = 1, window = 1, dict = "a b" }, "bad shared dictionary name" },
            { { limit = 1, window = 1, dict = "d", fleet = fake_redis() },
                "dict is for the local mode" },
            { { limit = 1, window = 1, fleet = "http://x" }, "ratelimit: bad fleet: redis" },
        }
        for _, c in ipairs(bad) do
            local ok, err = pcall(ratelimit.new, c[1])
            assert.is_false(ok)
            assert.matches(c[2], err, 1, true)
        end
        assert.has_no_error(function() ratelimit.new { limit = 1, window = 1 } end)
    end)

    it("counts locally in an app served in-process (app:test), its dictionary declared", function()
        local moonserve = require "moonserve"
        local app = moonserve.app()
        app:get("/", moonserve.ratelimit { limit = 2, window = 60, name = "inproc" },
            function() return "ok" end)
        local t = require("moonserve.test").client(app, { start_hooks = false })
        local function get()
            return t:request("GET", "/", { host = "test", headers = { accept = "application/json" } })
        end
        assert.equal(200, get().status)
        local r = get()
        assert.equal(200, r.status)
        assert.equal('"inproc";r=0;t=60', r.headers["ratelimit"])
        r = get()
        assert.equal(429, r.status)
        assert.equal("60", r.headers["retry-after"])
        assert.matches('"status":429', r.body)
    end)

    it("counts an IPv6 client by its /64, and caps a fleet limit's admissions", function()
        local r = fake_redis()
        local mw = ratelimit { limit = 1, window = 10, fleet = r, name = "v6" }
        assert.is_true((run(mw, {}, { client_ip = "2001:db8:1:2::1" })))
        -- another address of the same /64, written in full: the same key, refused
        assert.is_false((run(mw, {}, { client_ip = "2001:0db8:0001:0002:aaaa:bbbb:cccc:dddd" })))
        assert.is_true((run(mw, {}, { client_ip = "2001:db8:1:3::1" })))
        assert.is_true((run(mw, {}, { client_ip = "::ffff:192.0.2.9" })))
        assert.is_false((run(mw, {}, { client_ip = "192.0.2.9" })))
        assert.is_true((run(mw, {}, { client_ip = "::1" })))
        local keys = {}
        for k in pairs(r.sets) do
            keys[#keys + 1] = k
        end
        table.sort(keys)
        assert.same({ "moonserve:ratelimit:v6:ip:0:0:0:0::/64",
            "moonserve:ratelimit:v6:ip:192.0.2.9", "moonserve:ratelimit:v6:ip:2001:db8:1:2::/64",
            "moonserve:ratelimit:v6:ip:2001:db8:1:3::/64" }, keys)
        assert.has_error(function()
            ratelimit { limit = 100001, window = 10, fleet = r, name = "big" }
        end, "ratelimit: limit 100001 is more than a fleet limit keeps (100000 a key, some 100 "
            .. "bytes each in Redis): use a shorter window and a smaller limit")
        assert(ratelimit { limit = 100000, window = 10, fleet = r, name = "big" })
    end)

    it("keeps hashed long keys apart from the app's own keys", function()
        local r = fake_redis()
        local lim = ratelimit.new { limit = 1, window = 10, fleet = r, name = "h" }
        local long = string.rep("k", 300)
        assert.is_true((lim:take(long)))
        local hex = require("moonserve.crypto").sha256(long):gsub(".",
            function(c) return string.format("%02x", c:byte()) end)
        -- the app's own key that spells the hash is another key
        assert.is_true((lim:take(hex)))
        assert.is_false((lim:take(long)))
        assert.truthy(r.sets["moonserve:ratelimit:h:#" .. hex])
    end)
end)
