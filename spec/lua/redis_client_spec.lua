-- moonserve.redis without a server: URLs, options and their refusals, RESP encoding and
-- reading (the protocol against a real server is spec/it/redis_client_spec.lua).
describe("moonserve.redis", function()
    local redis = require "moonserve.redis"
    local resp = require "moonserve.redis.resp"

    it("reads redis:// URLs: user and password percent-decoded, port, database", function()
        local o = assert(redis.options("redis://ada:p%40ss%3Aw%2Frd@cache.example:6380/3"))
        assert.equal("ada", o.user)
        assert.equal("p@ss:w/rd", o.password)
        assert.equal("cache.example", o.host)
        assert.equal(6380, o.port)
        assert.equal(3, o.db)
        assert.is_false(o.tls)
        o = assert(redis.options("redis://127.0.0.1"))
        assert.equal(6379, o.port)
        assert.equal(0, o.db)
        assert.is_nil(o.password)
        assert.equal(1, o.timeout)
        o = assert(redis.options("redis://[::1]:7000"))
        assert.equal("::1", o.host)
        assert.equal(7000, o.port)
    end)

    it("takes a lone userinfo as the password and :password as no user, as redis-cli",
        function()
        local o = assert(redis.options("redis://s3cret@h"))
        assert.is_nil(o.user)
        assert.equal("s3cret", o.password)
        o = assert(redis.options("redis://:s3cret@h/1"))
        assert.is_nil(o.user)
        assert.equal("s3cret", o.password)
        assert.equal(1, o.db)
    end)

    it("hides a lone userinfo, the password, where the URL is shown", function()
        local _, err = redis.options("redis://s3cret@h/x")
        assert.is_nil(err:find("s3cret", 1, true), err)
        assert.matches("redis://%*%*%*@h/x", err)
        _, err = redis.options("redis://:s3cret@h/x")
        assert.is_nil(err:find("s3cret", 1, true), err)
    end)

    it("reads rediss://, redis+unix:// and redis+sentinel:// URLs", function()
        local o = assert(redis.options("rediss://h:6390?sni=cache.test&insecure=1"))
        assert.is_true(o.tls)
        assert.equal("cache.test", o.sni)
        assert.is_true(o.insecure)
        o = assert(redis.options("redis+unix:///run/redis/redis.sock?db=2&timeout=0.25"))
        assert.equal("/run/redis/redis.sock", o.path)
        assert.equal(2, o.db)
        assert.equal(0.25, o.timeout)
        assert.is_nil(o.host)
        o = assert(redis.options("redis+sentinel://u:pw@10.0.0.1:26379,10.0.0.2/mymaster/4"
            .. "?sentinel_password=sp"))
        assert.same({ "10.0.0.1:26379", "10.0.0.2" }, o.sentinels)
        assert.equal("mymaster", o.master)
        assert.equal(4, o.db)
        assert.equal("u", o.user)
        assert.equal("pw", o.password)
        assert.equal("sp", o.sentinel_password)
    end)

    it("takes a table, and options beside a URL over the URL's", function()
        local o = assert(redis.options({ host = "127.0.0.1", port = 7001, db = 2,
            user = "app", password = "pw", timeout = 0.5, pool_size = 8, backlog = 16 }))
        assert.equal(7001, o.port)
        assert.equal(8, o.pool_size)
        assert.equal(16, o.backlog)
        o = assert(redis.options("redis://h/1?timeout=3", { timeout = 0.5, pool_size = 64 }))
        assert.equal(0.5, o.timeout)
        assert.equal(64, o.pool_size)
        o = assert(redis.options({ url = "redis://h", db = 5 }))
        assert.equal(5, o.db)
        assert.equal("h", o.host)
        o = assert(redis.options({ sentinels = { "127.0.0.1:26379" }, master = "m" }))
        assert.equal("m", o.master)
    end)

    it("refuses a bad URL or option with one line naming it, the password hidden", function()
        local cases = {
            { "http://h/", "unknown scheme \"http\"" },
            { "redis//h", "not redis://" },
            { "mysql://h", "unknown scheme \"mysql\"" },
            { "redis://u:hunter2@h:99999", "bad host or port" },
            { "redis://u:hunter2@h/x", "db must be a non%-negative integer" },
            { "redis://h/-1", "db must be" },
            { "redis://h?timeout=soon", "timeout must be a number" },
            { "redis://h?timeout=0", "timeout must be more than 0" },
            { "redis://h?pool_size=0", "pool_size must be a positive integer" },
            { "redis://h?colour=blue", "unknown query key \"colour\"" },
            { "redis://h?insecure=maybe", "insecure must be 1 or 0" },
            { "redis+unix://run/redis.sock", "absolute path" },
            { "redis+sentinel://h1,h2", "MASTER expected" },
            { "redis+sentinel://h1:x/m", "bad sentinel address" },
            { "redis://", "bad host or port" },
            { "redis://u:hunter2@h#frag", "fragment" },
        }
        for _, c in ipairs(cases) do
            local o, err = redis.new(c[1])
            assert.is_nil(o, c[1])
            assert.matches("^redis: ", err)
            assert.matches(c[2], err, 1, false)
            assert.not_matches("hunter2", err, 1, true)
            assert.not_matches("\n", err, 1, true)
        end
        local table_cases = {
            { {}, "no host, path or sentinels" },
            { { host = "h", port = "6379" }, "port must be a number" },
            { { host = "h", colour = "blue" }, "unknown option \"colour\"" },
            { { host = "h", user = "u" }, "a user without a password" },
            { { host = "h", tls = "yes" }, "tls must be true or false" },
            { { sentinels = { "h:1" } }, "without the master's name" },
            { { sentinels = {}, master = "m" }, "sentinels must be a list" },
            { { host = "h", master = "m" }, "master given without sentinels" },
            { { path = "/s", tls = true }, "TLS over a unix socket" },
            { { host = "h", timeout = -1 }, "timeout must be more than 0" },
            { { host = "h", idle_timeout = 1e9 }, "a day at most" },
        }
        for _, c in ipairs(table_cases) do
            local o, err = redis.new(c[1])
            assert.is_nil(o)
            assert.matches(c[2], err)
        end
        assert.matches("no URL or options given", select(2, redis.new(nil)))
        assert.matches("got number", select(2, redis.new(42)))
        assert.matches("options must be a table", select(2, redis.new("redis://h", 3)))
    end)

    it("encodes commands as arrays of bulk strings, numbers as Redis reads them", function()
        local parts = {}
        local n = resp.encode({ "SET", "k", "v\r\nx", "EX", 10 }, parts, 0)
        assert.equal("*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\nv\r\nx\r\n$2\r\nEX\r\n$2\r\n10\r\n",
            table.concat(parts, "", 1, n))
        parts = {}
        n = resp.encode({ "INCRBYFLOAT", "k", 0.5 }, parts, 0)
        assert.matches("%$3\r\n0.5\r\n$", table.concat(parts, "", 1, n))
        assert.has_error(function() resp.encode({ "SET", "k", true }, {}, 0) end)
        assert.has_error(function() resp.encode({ "SET", "k", 0 / 0 }, {}, 0) end)
        assert.has_error(function() resp.encode({}, {}, 0) end)
    end)

    -- A socket that hands out `data` as the host's sockets do (lines without CRLF, counts).
    local function fake(data)
        local at = 1
        return {
            receive = function(_, pat)
                if at > #data then return nil, "closed", "" end
                if pat == nil then
                    local e = data:find("\r\n", at, true)
                    if not e then return nil, "closed", data:sub(at) end
                    local line = data:sub(at, e - 1)
                    at = e + 2
                    return line
                end
                if at + pat - 1 > #data then return nil, "closed", data:sub(at) end
                local s = data:sub(at, at + pat - 1)
                at = at + pat
                return s
            end,
        }
    end

    it("reads each kind of reply, nil bulks as redis.null and errors as values", function()
        local s = fake("+OK\r\n:42\r\n$5\r\nhe\r\no\r\n$-1\r\n*-1\r\n*3\r\n:1\r\n$0\r\n\r\n"
            .. "-ERR inner\r\n-WRONGTYPE no\r\n")
        assert.equal("OK", resp.read(s))
        assert.equal(42, resp.read(s))
        assert.equal("he\r\no", resp.read(s))
        assert.equal(redis.null, resp.read(s))
        assert.equal(redis.null, resp.read(s))
        local t = resp.read(s)
        assert.equal(1, t[1])
        assert.equal("", t[2])
        assert.is_true(redis.is_error(t[3]))
        assert.equal("ERR inner", t[3].error)
        local e = resp.read(s)
        assert.is_true(redis.is_error(e))
        assert.equal("WRONGTYPE no", tostring(e))
        local v, err, partial = resp.read(s)
        assert.is_nil(v)
        assert.equal("closed", err)
        assert.is_false(partial)
    end)

    it("calls a broken stream a bad reply, and a cut one a partial one", function()
        for _, bad in ipairs({ "?what\r\n", "$abc\r\n", "*x\r\n", ":zz\r\n",
            "$999999999999\r\n", string.rep("*1\r\n", 20) .. ":1\r\n", "$-2\r\n",
            "*-5\r\n" }) do
            local v, err = resp.read(fake(bad))
            assert.is_nil(v)
            assert.equal("bad reply", err, bad)
        end
        local v, err, partial = resp.read(fake("*2\r\n:1\r\n"))
        assert.is_nil(v)
        assert.equal("closed", err)
        assert.is_true(partial)
    end)

    it("reads a subscriber's messages with a reply's checks; anything else ends it", function()
        local function sub(data)
            local s = fake(data)
            s.settimeouts = function() end
            s.close = function() s.closed = true end
            return setmetatable({ sock = s, ms = 1000, closed = false }, redis.Sub), s
        end
        local sb, s = sub("*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n"
            .. "*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nhi\r\n"
            .. "*4\r\n$8\r\npmessage\r\n$2\r\nc*\r\n$2\r\ncd\r\n$0\r\n\r\n")
        assert.same({ kind = "message", channel = "c", data = "hi" }, sb:next())
        assert.same({ kind = "pmessage", pattern = "c*", channel = "cd", data = "" }, sb:next())
        assert.same({ nil, "closed" }, { sb:next() })
        assert.is_true(s.closed)
        for bad, why in pairs({ ["-NOPERM no\r\n"] = "NOPERM no", ["*99999999999\r\n"] = "closed",
            ["*-1\r\n"] = "closed", ["+OK\r\n"] = "closed", ["*x\r\n"] = "closed",
            [string.rep("*1\r\n", 20) .. ":1\r\n"] = "closed" }) do
            sb, s = sub(bad)
            assert.same({ nil, why }, { sb:next() }, bad)
            assert.is_true(s.closed, bad)
            assert.same({ nil, "closed" }, { sb:next() })
        end
    end)

    it("names a script by its SHA-1, as EVALSHA wants", function()
        local s = redis.script("return 1")
        assert.equal("e0e1f9fabfc9d4800c877a703b823ac0578ff8db", s.sha)
        assert.equal("return 1", s.src)
        assert.has_error(function() redis.script(1) end)
    end)

    it("refuses commands that would change a pooled connection's state", function()
        local r = assert(redis.new("redis://127.0.0.1:1"))
        local function refused(f)
            local ok, err = pcall(f)
            assert.is_false(ok)
            assert.matches("refused on a pooled connection", err)
        end
        for _, verb in ipairs { "SUBSCRIBE", "psubscribe", "MONITOR", "SELECT", "AUTH", "HELLO",
            "RESET", "WATCH", "MULTI" } do
            refused(function() r:call(verb, "x") end)
            refused(function() r:pipeline { { "GET", "k" }, { verb, "x" } } end)
        end
        refused(function() r:call("CLIENT", "REPLY", "OFF") end)
        refused(function() r:pipeline { { "MULTI" }, { "INCR", "k" } } end)
        refused(function() r:pipeline { { "MULTI" }, { "EXEC" }, { "MULTI" } } end)
        -- A transaction ended in the same pipeline passes the check (and reaches the socket).
        local ok, err = pcall(r.pipeline, r, { { "MULTI" }, { "INCR", "k" }, { "EXEC" } })
        assert.is_falsy(not ok and tostring(err):find("refused"))
        ok, err = pcall(r.call, r, "CLIENT", "ID")
        assert.is_falsy(not ok and tostring(err):find("refused"))
    end)
end)
