-- moonserve.shared: the Lua side of the shared dictionaries, over zones made in this process
-- (two handles on one zone stand for two workers). The engine's own cases are in
-- spec/core/process/shdict_test.c; spec/it/shared_spec.lua runs them across real workers.
describe("moonserve.shared", function()
    local shared = require "moonserve.host.core.shared"
    local moonserve = require "moonserve"
    local n = 0

    -- Two handles on one new zone of `size` bytes.
    local function zone(size)
        n = n + 1
        local name = "spec" .. n
        local fd = assert(shared.create(name, size or 64 * 1024))
        local a = assert(shared.attach(fd, name, size or 64 * 1024))
        local b = assert(shared.attach(fd, name, size or 64 * 1024))
        return a, b, name
    end

    it("shares strings, numbers, booleans and tables between two mappings", function()
        local a, b = zone()
        assert.same({ true, nil, false }, { a:set("s", "text") })
        assert.is_true((a:set("n", 4.5)))
        assert.is_true((a:set("t", true)))
        assert.is_true((a:set("f", false)))
        assert.is_true((a:set("tab", { name = "ada", roles = { "admin" } }, 0, 7)))
        assert.equal("text", b:get("s"))
        assert.equal(4.5, b:get("n"))
        assert.is_true(b:get("t"))
        assert.is_false(b:get("f"))
        local v, flags = b:get("tab")
        assert.same({ name = "ada", roles = { "admin" } }, v)
        assert.equal(7, flags)
        assert.is_nil(b:get("missing"))
        assert.is_true((a:set("s", nil))) -- nil deletes
        assert.is_nil(b:get("s"))
    end)

    it("reads a value larger than its buffer", function()
        local a, b = zone(1024 * 1024)
        local big = ("x"):rep(100000)
        assert.is_true((a:set("big", big)))
        assert.equal(big, b:get("big"))
    end)

    it("has OpenResty's add, replace, safe_set and incr", function()
        local a, b = zone()
        assert.same({ true }, { (a:add("k", 1)) })
        assert.same({ false, "exists", false }, { b:add("k", 2) })
        assert.same({ false, "not found", false }, { b:replace("nope", 2) })
        assert.is_true((b:replace("k", 3)))
        assert.same({ nil, "not found" }, { a:incr("counter", 1) })
        assert.equal(10, (a:incr("counter", 5, 5)))
        assert.equal(9, (b:incr("counter", -1)))
        assert.is_true((a:set("s", "text")))
        assert.same({ nil, "not a number" }, { a:incr("s", 1) })
        assert.has_error(function() a:incr("counter", "1") end)
        assert.has_error(function() a:set({}, 1) end)
        assert.has_error(function() a:set("k", function() end) end)
    end)

    it("expires values, keeps them for get_stale, and tells their ttl", function()
        local a, b = zone()
        assert.is_true((a:set("short", "v", 0.05)))
        assert.is_true((a:set("forever", "v")))
        local ttl = b:ttl("short")
        assert.is_true(ttl > 0 and ttl <= 0.05)
        assert.equal(0, b:ttl("forever"))
        assert.same({ nil, "not found" }, { b:ttl("missing") })
        require("socket").sleep(0.08)
        assert.is_nil(b:get("short"))
        local v, _, stale = b:get_stale("short")
        assert.equal("v", v)
        assert.is_true(stale)
        assert.is_true(b:expire("forever", 0.01))
        require("socket").sleep(0.03)
        assert.is_nil(a:get("forever"))
        assert.equal(2, a:flush_expired())
    end)

    it("lists keys, flushes all, and keeps lists", function()
        local a, b = zone()
        a:set("x", 1)
        a:set("y", 2)
        local keys = b:get_keys()
        table.sort(keys)
        assert.same({ "x", "y" }, keys)
        assert.equal(1, #b:get_keys(1))
        assert.equal(1, a:lpush("q", "one"))
        assert.equal(2, a:rpush("q", 2))
        assert.equal(2, b:llen("q"))
        assert.equal("one", b:lpop("q"))
        assert.equal(2, b:rpop("q"))
        assert.is_nil(b:rpop("q"))
        assert.same({ nil, "value not a list" }, { b:lpush("x", "v") })
        assert.same({ nil, "bad value type" }, { b:lpush("q", {}) })
        b:flush_all()
        assert.is_nil(a:get("x"))
        assert.equal(64 * 1024, a:capacity())
        assert.is_true(a:free_space() > 0)
    end)

    it("is declared by the app, by name and size, and read-only as moonserve.shared", function()
        local app = moonserve.app()
        app:shared_dict("cache", "10m")
        app:shared_dict("cache", 10 * 1024 * 1024) -- the same again is fine
        assert.equal(10 * 1024 * 1024, app.shared_decl.cache)
        local site = app:site("example.test")
        site:shared_dict("sessions", "512k") -- a site's are its app's
        assert.equal(512 * 1024, app.shared_decl.sessions)
        assert.has_error(function() app:shared_dict("cache", "20m") end,
            "shared dictionary 'cache' is declared twice with two sizes")
        assert.has_error(function() app:shared_dict("bad name", "1m") end)
        assert.has_error(function() app:shared_dict("tiny", "1k") end)
        assert.has_error(function() app:shared_dict("weird", "10q") end)
        assert.has_error(function() moonserve.shared.x = 1 end)
        assert.is_nil(moonserve.shared.undeclared)
    end)

    it("refuses a zone of another size, as a reload that changes one must fail", function()
        local fd = assert(shared.create("sized", 64 * 1024))
        local d, err = shared.attach(fd, "sized", 128 * 1024)
        assert.is_nil(d)
        assert.matches("was made with another size", err)
    end)

    it("keeps a sliding log: window_take admits limit in a window, for both mappings", function()
        local a, b = zone()
        assert.same({ true, 1, 60 }, { a:window_take("k", 2, 60) })
        local ok, left, wait = b:window_take("k", 2, 60)
        assert.is_true(ok)
        assert.equal(0, left)
        assert.is_true(wait > 59 and wait <= 60)
        assert.is_false((a:window_take("k", 2, 60)))
        assert.is_true((a:window_take("other", 2, 60)))
        assert.has_error(function() a:window_take("k", 0, 60) end,
            "bad limit (a whole number from 1 to 65536 expected)")
        assert.has_error(function() a:window_take("k", 2, 0) end,
            "bad window (seconds, at least 0.001, expected)")
        -- A log larger than the zone can hold: "no memory", not an error raised.
        local got, err = a:window_take("big", 65536, 1)
        assert.is_nil(got)
        assert.equal("no memory", err)
    end)

    it("keeps window_take on trace", function()
        local helper = require "helper"
        local a = zone(1024 * 1024)
        local log = helper.jit_log(function()
            for _ = 1, 300 do
                a:window_take("hot", 65536, 60)
            end
        end)
        assert.matches("TRACE +%d+ ", log)
        assert.not_matches("NYI", log)
    end)
end)
