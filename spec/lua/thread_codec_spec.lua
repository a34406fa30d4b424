-- spec/lua/thread_codec_spec.lua: the encoding of values that go to and from a thread pool's
-- threads (moonserve/host/core/thread_runner.lua).
local codec = require "moonserve.host.core.thread_runner"

describe("the thread codec", function()
    it("round-trips plain values, nil holes and odd numbers", function()
        local a, b, c, d, e, f, g = codec.decode(codec.encode(nil, true, false, 0.1, "x\0y",
            { 1, 2, nil, 4, k = { deep = "v" }, [true] = 3 }, 1 / 0))
        assert.is_nil(a)
        assert.equal(true, b)
        assert.equal(false, c)
        assert.equal(0.1, d)
        assert.equal("x\0y", e)
        assert.same({ 1, 2, nil, 4, k = { deep = "v" }, [true] = 3 }, f)
        assert.equal(1 / 0, g)
        local n = codec.decode(codec.encode(0 / 0))
        assert.is_true(n ~= n)
        assert.equal(0, select("#", codec.decode(codec.encode())))
        assert.equal(3, select("#", codec.decode(codec.encode(nil, nil, nil))))
    end)

    it("refuses functions, cdata, userdata, coroutines, table keys of those, and cycles", function()
        assert.has_error(function() codec.encode(print) end)
        assert.has_error(function() codec.encode(require("ffi").new("int[1]")) end)
        assert.has_error(function() codec.encode(io.stdout) end)
        assert.has_error(function() codec.encode(coroutine.create(print)) end)
        assert.has_error(function() codec.encode({ [print] = 1 }) end)
        local t = {}
        t.self = t
        assert.has_error(function() codec.encode(t) end,
            "table nested too deep (or a cycle)")
    end)

    it("runs a job and returns errors as values", function()
        local ok, s = codec.run(codec.encode(1000, "string", "rep", "ab", 3))
        assert.is_true(ok)
        assert.equal("ababab", codec.decode(s))
        assert.same({ false, "results too large (1008 bytes encoded; thread_job_bytes is 1000)" },
            { codec.run(codec.encode(1000, "string", "rep", "a", 1000)) })
        assert.same({ false, "module 'string' has no function 'nope'" },
            { codec.run(codec.encode(1000, "string", "nope")) })
        ok, s = codec.run(codec.encode(1000, "string", "rep"))
        assert.is_false(ok)
        assert.matches("bad argument", s)
    end)
end)
