-- spec/lua/threads_spec.lua: declaring thread pools (moonserve/host/core/threads.lua), and the
-- errors run() returns before any thread is asked.
local threads = require "moonserve.host.core.threads"

describe("thread pools", function()
    it("refuses bad declarations", function()
        assert.has_error(function() threads.declare("", {}) end,
            "bad thread pool name (a non-empty string expected)")
        assert.has_error(function() threads.declare("p", { threads = 0 }) end,
            "bad threads (an integer >= 1 expected)")
        assert.has_error(function() threads.declare("p", { threads = 257 }) end,
            "bad threads (at most 256)")
        assert.has_error(function() threads.declare("p", { max_queue = -1 }) end,
            "bad max_queue (an integer >= 0 expected)")
        assert.has_error(function() threads.declare("p", { size = 1 }) end,
            "unknown thread pool option 'size'")
        threads.declare("p", { threads = 2, max_queue = 8 })
    end)

    it("returns errors for bad names and values without waiting", function()
        assert.same({ false, "bad module name (a string expected)" },
            { threads.run("default", nil, "f") })
        assert.same({ false, "no thread pool named 'nope'" }, { threads.run("nope", "m", "f") })
        local ok, err = threads.run("default", "m", "f", print)
        assert.is_false(ok)
        assert.matches("^bad argument: function value", err)
    end)
end)
