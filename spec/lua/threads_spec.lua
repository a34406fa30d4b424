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

    -- The pools are the process's; an in-process server (moonserve.test) may end while a
    -- job of its still runs in one: that job must not wake the server, which is gone (this
    -- crashed the process).
    it("lets an in-process server go while one of its jobs still runs", function()
        local moonserve = require "moonserve"
        local app = moonserve.app()
        local finished = false
        app:get("/later", function()
            moonserve.timer.at(0, function()
                moonserve.run_worker_thread("default", "os", "execute", "sleep 0.2")
                finished = true -- never: the server is gone by then
            end)
            return "started"
        end)
        app:get("/rep", function()
            local ok, s = moonserve.run_worker_thread("default", "string", "rep", "x", 3)
            return tostring(ok) .. " " .. tostring(s)
        end)
        local t = app:test()
        assert.equal("started", t:get("/later").body)
        t:run(0.05) -- the timer's job is in a thread now
        t:close()
        local again = app:test()
        assert.equal("true xxx", again:get("/rep").body)
        again:run(0.4) -- the first job ends meanwhile
        assert.equal("true xxx", again:get("/rep").body)
        again:close()
        assert.is_false(finished)
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
