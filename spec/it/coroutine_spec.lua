-- spec/it/coroutine_spec.lua: waits inside handlers' own coroutines, over a real server.
local helper = require "helper"
local socket = require "socket"

describe("waits in the handler's own coroutines over a real server", function()
    local srv

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/coroutines.lua" }
    end)

    teardown(function()
        srv:stop()
    end)

    local twice = helper.twice(it)

    twice("serves others while coroutine.wrap iterators sleep", function()
        local conns = {}
        local t0 = socket.gettime()
        for i = 1, 4 do
            conns[i] = helper.connect(srv.port)
            assert(conns[i]:send("GET /count?n=3&s=0.3 HTTP/1.1\r\nHost: t\r\n\r\n"))
        end
        for i = 1, 4 do
            local res = assert(helper.read_response(conns[i]))
            conns[i]:close()
            assert.equal(200, res.status)
            assert.equal("1,2,3", res.body)
        end
        local took = socket.gettime() - t0
        assert.is_true(took >= 0.85, "took " .. took)
        assert.is_true(took < 2.5, "took " .. took .. " s: the sleeps ran one after another")
    end)

    twice("reads a body that arrives in two pieces inside nested coroutines", function()
        local s = helper.connect(srv.port)
        local half = string.rep("x", 50000)
        assert(s:send("POST /body HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n" .. half))
        socket.sleep(0.2)
        assert(s:send(half))
        local res = assert(helper.read_response(s))
        s:close()
        assert.equal(200, res.status)
        assert.equal("100000 bytes", res.body)
    end)

    twice("streams to a slow reader with the writes inside a coroutine", function()
        local s = helper.connect(srv.port)
        assert(s:send("GET /stream?n=200 HTTP/1.1\r\nHost: t\r\n\r\n"))
        socket.sleep(0.5) -- the socket fills and the writer parks, inside its coroutine
        local res = assert(helper.read_response(s))
        s:close()
        assert.equal(200, res.status)
        assert.equal(200 * 65536, #res.body)
        assert.falsy(srv:log():find("error", 1, true), srv:log())
    end)

    twice("ends a handler early through pcall and a coroutine", function()
        local res = assert(helper.request(srv.port, "GET /end HTTP/1.1\r\nHost: t\r\n\r\n"))
        assert.equal(202, res.status)
        assert.equal("ended early", res.body)
        assert.falsy(srv:log():find("ran after", 1, true), srv:log())
    end)

    twice("answers 500 with a clear error for a wait inside a gsub callback", function()
        local res = assert(helper.request(srv.port, "GET /gsub HTTP/1.1\r\nHost: t\r\n\r\n"))
        assert.equal(500, res.status)
        assert.truthy(srv:log():find("moonserve.sleep: cannot wait here: inside a C call "
            .. "(string.gsub callback, table.sort comparator, FFI callback or require)", 1, true),
            srv:log())
        assert.is_true(srv:alive())
    end)
end)
