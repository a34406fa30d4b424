-- spec/it/ratelimit_fleet_spec.lua: moonserve.ratelimit's fleet mode with a real redis-server
-- and three instances of two workers: the fleet admits exactly its limit where the local mode
-- admits it per instance; with Redis killed, on_error "open" admits (one log line an outage)
-- and "closed" answers 503, both at once, and within the client's timeout when Redis hangs;
-- Redis back, limits are counted again without a restart.
local helper = require "spec.helper"
local socket = require "socket"

describe("moonserve.ratelimit, fleet", function()
    local servers, redis_pid, port = {}, nil, nil
    local LIMIT = 10

    local function start_redis()
        redis_pid = helper.redis_server(port)
    end

    setup(function()
        port = helper.free_port()
        start_redis()
        for i, on_error in ipairs { "open", "open", "closed" } do
            servers[i] = helper.spawn_server { app = "spec/fixtures/ratelimit.lua",
                args = "--workers 2", env = { REDIS_URL = "redis://127.0.0.1:" .. port,
                    LIMIT = tostring(LIMIT), WINDOW = "60", ON_ERROR = on_error } }
        end
    end)

    teardown(function()
        for _, srv in ipairs(servers) do
            srv:stop()
        end
        helper.stop_pid(redis_pid)
    end)

    local function get(srv, path)
        return assert(helper.request(srv.port, "GET " .. path
            .. " HTTP/1.1\r\nHost: rl.test\r\n\r\n"))
    end

    -- Sends `n` requests for `path`, taking the instances in turn; returns how many passed.
    local function admitted(path, n)
        local ok = 0
        for i = 1, n do
            local r = get(servers[(i - 1) % 3 + 1], path)
            if r.status == 200 then
                ok = ok + 1
            else
                assert.equal(429, r.status)
            end
        end
        return ok
    end

    it("admits the limit across the fleet, against the limit per instance in local mode",
        function()
            assert.equal(LIMIT, admitted("/fleet", 4 * LIMIT))
            assert.equal(3 * LIMIT, admitted("/ip", 4 * LIMIT))
            local r = get(servers[2], "/fleet")
            assert.equal(429, r.status)
            assert.equal('"fleet";q=10;w=60', r.headers["ratelimit-policy"])
            assert.matches('^"fleet";r=0;t=%d+$', r.headers["ratelimit"])
            local wait = tonumber(r.headers["retry-after"])
            assert.is_true(wait >= 59 and wait <= 60, "Retry-After " .. tostring(wait))
        end)

    it("with Redis killed, admits (open) or answers 503 (closed) at once; recovers after",
        function()
            helper.stop_pid(redis_pid)
            for _ = 1, 6 do
                local t0 = socket.gettime()
                local open = get(servers[1], "/fleet")
                assert.equal(200, open.status)
                assert.is_nil(open.headers["ratelimit"])
                local closed = get(servers[3], "/fleet")
                assert.equal(503, closed.status)
                assert.equal("1", closed.headers["retry-after"])
                assert.is_true(socket.gettime() - t0 < 1.5, "within the client's timeout")
            end
            -- One line an outage (a worker's), not one a request.
            local _, lines = servers[1]:log():gsub("ratelimit fleet: redis failed", "")
            assert.is_true(lines >= 1 and lines <= 2, lines .. " lines")
            assert.matches("admitting requests until it answers", servers[1]:log())
            assert.matches("refusing requests with 503", servers[3]:log())
            -- The local limits do not need Redis.
            assert.equal(200, get(servers[1], "/free").status)

            start_redis()
            assert.equal(LIMIT, admitted("/fleet", 2 * LIMIT))
            assert.matches("ratelimit fleet: redis answers again", servers[1]:log())

            -- A Redis that takes the connection and never answers (stopped): the answer comes
            -- when the client's timeout (one second) runs out, not later.
            os.execute("kill -STOP " .. redis_pid)
            local ok, err = pcall(function()
                for _, i in ipairs { 1, 3 } do
                    local t0 = socket.gettime()
                    local r = get(servers[i], "/fleet")
                    local took = socket.gettime() - t0
                    assert.equal(i == 1 and 200 or 503, r.status)
                    assert.is_true(took >= 0.9 and took < 2, "answered after " .. took .. " s")
                end
            end)
            os.execute("kill -CONT " .. redis_pid)
            assert(ok, err)
            assert.matches("ratelimit fleet: redis answers again", servers[1]:log())
            for _, srv in ipairs(servers) do
                assert.is_true(srv:alive())
            end
        end)
end)
