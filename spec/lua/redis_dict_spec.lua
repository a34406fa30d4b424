-- moonserve.redis.dict without a server: how values are stored (the methods against a real
-- Redis are in spec/it/redis_dict_spec.lua), and the refusals made before anything is sent.
describe("moonserve.redis.dict", function()
    local dict = require "moonserve.redis.dict"
    local pack, unpack = dict.pack, dict.unpack

    it("stores finite numbers bare, so that INCRBY and other clients read them", function()
        assert.equal("42", pack(42))
        assert.equal("-1.5", pack(-1.5))
        assert.equal("0.10000000000000001", pack(0.1))
        assert.equal(0.1, unpack(pack(0.1)))
        assert.equal("ninf", pack(math.huge))
        assert.equal(math.huge, unpack("ninf"))
        assert.equal(-math.huge, unpack(pack(-math.huge)))
    end)

    it("tags strings, booleans and tables, and carries flags", function()
        assert.equal("s42", pack("42"))
        assert.equal("42", unpack("s42"))
        assert.equal("s", pack(""))
        assert.equal("", unpack("s"))
        assert.equal("b1", pack(true))
        assert.is_false(unpack(pack(false)))
        assert.same({ a = { 1, 2 }, b = "x" }, unpack(pack({ a = { 1, 2 }, b = "x" })))
        assert.equal("S7:hi", pack("hi", 7))
        assert.same({ "hi", 7 }, { unpack("S7:hi") })
        assert.equal("N3:42", pack(42, 3))
        assert.same({ 42, 3 }, { unpack("N3:42") })
        assert.same({ "x" }, { unpack(pack("x", 0)) })
    end)

    it("reads what moonserve did not write as no value", function()
        for _, raw in ipairs({ "", "value", "Sno-colon", "t\255garbage", "?" }) do
            assert.is_nil(unpack(raw), raw)
        end
    end)

    it("refuses bad values and flags as a local dictionary does", function()
        assert.has_error(function() pack(function() end) end)
        local d = assert(dict.new("x", { redis = "redis://127.0.0.1:1" }))
        assert.has_error(function() d:set("k", "v", -1) end)
        assert.has_error(function() d:set("k", "v", 0, 1.5) end)
        assert.has_error(function() d:incr("k", "1") end)
        assert.has_error(function() d:get({}) end)
    end)

    it("refuses keys and values beyond the limits without a connection", function()
        -- (nothing listens on port 1: a send would fail with another error)
        local d = assert(dict.new("x", { redis = "redis://127.0.0.1:1", prefix = "p:" }))
        local saved = dict.limits.redis_value_bytes
        dict.limits.redis_value_bytes = 10
        local ok, err = d:set("k", "0123456789")
        dict.limits.redis_value_bytes = saved
        assert.is_false(ok)
        assert.equal("value too large (11 bytes stored; redis_value_bytes is 10)", err)
        local v
        v, err = d:get(string.rep("k", 65536))
        assert.is_nil(v)
        assert.equal("key too long (65536 bytes; redis_key_bytes is 65535)", err)
        assert.same({ nil, "empty key" }, { d:get("") })
    end)

    it("says what is wrong with its options in one line", function()
        local d, err = dict.new("sessions", {})
        assert.is_nil(d)
        assert.matches("^shared dictionary 'sessions': redis is nil", err)
        d, err = dict.new("sessions", { redis = "redis://h", prefix = 3 })
        assert.is_nil(d)
        assert.equal("shared dictionary 'sessions': prefix must be a string", err)
        d, err = dict.new("sessions", { redis = "redis://h", colour = "blue" })
        assert.is_nil(d)
        assert.equal("shared dictionary 'sessions': redis: bad URL \"redis://h\": unknown "
            .. "option \"colour\"", err)
        assert.equal("sessions:", assert(dict.new("sessions", { redis = "redis://h" })).prefix)
        for _, c in ipairs({
            { 5, "cache must be a table { ttl =, size = }" },
            { { ttl = 0 }, "cache ttl must be a number of seconds above 0" },
            { { size = 1.5 }, "cache size must be a positive integer" },
            { { colour = 1 }, "unknown cache option \"colour\"" },
        }) do
            d, err = dict.new("sessions", { redis = "redis://h", cache = c[1] })
            assert.is_nil(d)
            assert.equal("shared dictionary 'sessions': " .. c[2], err)
        end
    end)

    it("refuses a prefix that overlaps another one's on the same server and db", function()
        local url = "redis://127.0.0.1:1/14"
        assert(dict.new("ov", { redis = url }))
        assert(dict.new("ov", { redis = url }), "the same dictionary declared again")
        local d, err = dict.new("ov:b", { redis = url })
        assert.is_nil(d)
        assert.matches("shared dictionary 'ov:b': key prefix \"ov:b:\" overlaps shared "
            .. "dictionary 'ov''s \"ov:\"", err)
        assert.is_nil(dict.new("o", { redis = url, prefix = "o" }))
        -- Another db, or a prefix that neither starts nor is started by one in use: fine.
        assert(dict.new("ov:b", { redis = "redis://127.0.0.1:1/15" }))
        assert(dict.new("ov2", { redis = url }))
        -- Session stores and fleet rate limits claim theirs in the same place.
        local session = require "moonserve.session"
        assert.has_error(function() session.redis_store(url, { prefix = "ov:s:" }) end)
        assert(session.redis_store(url, { prefix = "ovs:" }))
        local ratelimit = require "moonserve.ratelimit"
        assert.has_error(function()
            ratelimit.new { limit = 5, window = 60, fleet = url, prefix = "ov2:" }
        end)
    end)

    it("does not cache a value whose read an invalidation crossed", function()
        local d = assert(dict.new("racy", { redis = "redis://127.0.0.1:1/13",
            cache = { ttl = 30 } }))
        local invalidate = d.broadcast.handlers[1] -- (what a broadcast that comes runs)
        local gets = 0
        d.redis = { call = function(_, cmd, key)
            assert.equal("GET", cmd)
            gets = gets + 1
            if gets == 1 then -- another instance wrote the key while this GET was out
                invalidate("k" .. key)
            end
            return "s" .. gets
        end }
        assert.equal("1", d:get("k")) -- (read before the write landed)
        assert.equal("2", d:get("k")) -- not cached: asked again
        assert.equal("2", d:get("k")) -- cached now
        assert.equal(2, gets)
    end)
end)
