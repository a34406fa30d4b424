-- spec/it/threads_spec.lua: thread pools (moonserve.run_worker_thread, ngx.run_worker_thread)
-- and moonserve.password over a real server.
local helper = require "helper"
local socket = require "socket"

local function esc(hash)
    return (hash:gsub("[^%w]", function(c) return string.format("%%%02X", c:byte()) end))
end

local function get(srv, path, method)
    local res = assert(helper.request(srv.port, (method or "GET") .. " " .. path
        .. " HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n"))
    return res.body, res.status
end

-- The p90 latency of `n` requests for /fast, in seconds, while `busy` runs in the background
-- (started first; nil: nothing else runs).
local function fast_latency(srv, n)
    local ts = {}
    for i = 1, n do
        local t0 = socket.gettime()
        assert.equal("fast", (get(srv, "/fast")))
        ts[i] = socket.gettime() - t0
        socket.sleep(0.005)
    end
    table.sort(ts)
    return ts[math.ceil(n * 0.9)]
end

describe("thread pools and passwords over a real server", function()
    local srv

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/threads.lua",
            args = "--limit thread_job_bytes=1000000" }
    end)

    teardown(function()
        srv:stop()
    end)

    it("runs a function in a thread and returns its results", function()
        assert.equal("true 5", get(srv, "/add"))
        assert.equal("true s true nil {1,one,y}", get(srv, "/echo"))
    end)

    it("has ngx.run_worker_thread with OpenResty's results", function()
        assert.equal("true 42", get(srv, "/ngx"))
    end)

    it("returns errors for values that are not plain, both ways", function()
        assert.matches("^false bad argument: function value cannot go", (get(srv, "/bad/function")))
        assert.matches("^false bad argument: cdata value cannot go", (get(srv, "/bad/cdata")))
        assert.matches("^false bad result: function value cannot go", (get(srv, "/bad/result")))
    end)

    it("returns errors for an unknown module, function or pool, and a raised error", function()
        assert.matches("^false module 'no_such_module_here' cannot be loaded",
            (get(srv, "/bad/module")))
        assert.equal("false module 'threadwork' has no function 'nope'", get(srv, "/bad/func"))
        assert.equal("false no thread pool named 'nope'", get(srv, "/bad/pool"))
        assert.equal("false boom in a thread", get(srv, "/boom"))
        assert.is_true(srv:alive())
    end)

    it("bounds arguments and results by thread_job_bytes", function()
        assert.equal("true " .. string.rep("x", 1000), get(srv, "/big?n=1000"))
        assert.matches("^false results too large %(%d+ bytes encoded; thread_job_bytes is 1000000%)",
            (get(srv, "/big?n=2000000")))
        assert.equal("false arguments too large (2000041 bytes encoded; thread_job_bytes is 1000000)",
            get(srv, "/bigarg?n=2000000"))
    end)

    it("answers queue full past max_queue, and runs the rest", function()
        assert.equal("false queue full (thread pool 'small')|true true|true true", get(srv, "/full"))
    end)

    it("keeps a cheap route quick while jobs compute in the pool, unlike on the loop", function()
        local idle = fast_latency(srv, 20)
        -- Background clients: 200 ms of computation each, on the pool, then on the loop.
        local function busy(path)
            local pids = {}
            for i = 1, 1 do
                pids[i] = helper.background(string.format("for i in 1 2 3 4 5 6; do %s -s "
                    .. "'http://127.0.0.1:%d%s' >/dev/null; done", helper.tool("curl"), srv.port,
                    path))
            end
            socket.sleep(0.1)
            return pids
        end
        local pids = busy("/spin?ms=200")
        local pooled = fast_latency(srv, 20)
        for _, pid in ipairs(pids) do helper.stop_pid(pid) end
        pids = busy("/spin_loop?ms=200")
        local looped = fast_latency(srv, 20)
        for _, pid in ipairs(pids) do helper.stop_pid(pid) end
        print(string.format("p90 of a cheap route: idle %.1f ms, jobs in the pool %.1f ms, "
            .. "the same work on the loop %.1f ms", idle * 1e3, pooled * 1e3, looped * 1e3))
        assert.is_true(pooled < 0.05, "pooled p90 " .. pooled)
        assert.is_true(looped > 0.05, "looped p90 " .. looped)
    end)

    it("keeps a cheap route quick while passwords are hashed", function()
        local twenty = string.rep("x ", 20)
        local pid = helper.background(string.format("for i in %s; do %s -s -X POST "
            .. "'http://127.0.0.1:%d/password/hash?pw=x' >/dev/null; done", twenty,
            helper.tool("curl"), srv.port))
        socket.sleep(0.1)
        local hashing = fast_latency(srv, 20)
        helper.stop_pid(pid)
        print(string.format("p90 of a cheap route while hashing: %.1f ms", hashing * 1e3))
        assert.is_true(hashing < 0.02, "p90 " .. hashing)
    end)

    it("drops the result of a job whose client went away, and goes on", function()
        local s = helper.connect(srv.port)
        s:send("GET /spin?ms=300 HTTP/1.1\r\nHost: t\r\n\r\n")
        socket.sleep(0.05)
        s:close()
        socket.sleep(0.4)
        assert.equal("true 5", get(srv, "/add"))
        assert.is_true(srv:alive())
        assert.not_matches("resume of request", srv:log())
    end)

    it("hashes and verifies passwords with argon2id off the loop", function()
        local hash, status = get(srv, "/password/hash?pw=s3cret", "POST")
        assert.equal(200, status)
        assert.matches("^%$argon2id%$v=19%$m=%d+,t=%d+,p=%d+%$[%w+/]+%$[%w+/]+$", hash)
        local again = get(srv, "/password/hash?pw=s3cret", "POST")
        assert.not_equal(hash, again) -- a fresh salt each time
        assert.equal("true false", get(srv, "/password/verify?pw=s3cret&hash=" .. esc(hash), "POST"))
        assert.equal("false", get(srv, "/password/verify?pw=wrong&hash=" .. esc(hash), "POST"))
    end)

    it("says a hash with weaker parameters needs a rehash", function()
        local weak = get(srv, "/password/weak?pw=s3cret", "POST")
        assert.matches("m=8192,t=1,p=1", weak)
        assert.equal("true true", get(srv, "/password/verify?pw=s3cret&hash=" .. esc(weak), "POST"))
    end)

    it("refuses bad arguments and malformed hashes", function()
        assert.matches("^false .*string expected", (get(srv, "/password/bad")))
        assert.matches("^nil ", (get(srv, "/password/verify?pw=x&hash=nonsense", "POST")))
    end)
end)
