-- spec/it/caps_spec.lua: limits and slow or greedy clients against a real server. In every
-- attack a well-behaved client must keep getting answers.
local helper = require "helper"
local socket = require "socket"

local function hello_ok(port, from)
    local s = assert(socket.tcp())
    s:settimeout(5)
    if from then
        assert(s:bind(from, 0))
    end
    assert(s:connect("127.0.0.1", port))
    assert(s:send("GET /hello HTTP/1.1\r\nHost: t\r\n\r\n"))
    local res = helper.read_response(s)
    s:close()
    return res and res.status == 200 and res.body == "hello world"
end

describe("moonserve's limits", function()
    local srv

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/app.lua", args = table.concat({
            "--limit head_timeout=1", "--limit body_timeout=1", "--limit send_timeout=1",
            "--limit in_flight=4", "--limit per_source=40" }, " ") }
    end)

    teardown(function()
        srv:stop()
    end)

    it("answers 408 to a head trickled in too slowly, however busy the trickle", function()
        local s = helper.connect(srv.port)
        assert(s:send("GET /hello HTTP/1.1\r\n"))
        local t0 = socket.gettime()
        for _ = 1, 8 do -- a byte every 0.25 s: each byte is progress, the deadline still holds
            socket.sleep(0.25)
            if not s:send("X") then
                break
            end
            assert.is_true(hello_ok(srv.port), "a second client must be served meanwhile")
        end
        local res = helper.read_response(s)
        assert.equal(408, res.status)
        assert.is_true(helper.closed(s))
        assert.is_true(socket.gettime() - t0 < 3)
        assert.truthy(srv:log():find("head not complete within head_timeout", 1, true))
    end)

    it("answers 408 to a body trickled in below body_min_rate, however busy the trickle", function()
        local s = helper.connect(srv.port)
        assert(s:send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n"))
        local t0 = socket.gettime()
        for _ = 1, 12 do -- a byte every 0.25 s: far below 4096 bytes a second
            socket.sleep(0.25)
            if not s:send("x") then
                break
            end
        end
        local res = helper.read_response(s)
        assert.equal(408, res.status)
        assert.is_true(socket.gettime() - t0 < 3.5)
        assert.is_true(hello_ok(srv.port))
    end)

    it("lets a body past body_timeout go on while it keeps body_min_rate", function()
        local s = helper.connect(srv.port)
        local n = 48 * 1024
        assert(s:send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: " .. n .. "\r\n\r\n"))
        for _ = 1, 24 do -- 2 KiB every 0.1 s: 20 KiB a second for 2.4 s, over body_timeout
            socket.sleep(0.1)
            assert(s:send(string.rep("y", 2048)))
        end
        local res = helper.read_response(s)
        assert.equal(200, res.status)
        assert.equal(n, #res.body)
    end)

    it("answers 408 to a body that stalls", function()
        local s = helper.connect(srv.port)
        assert(s:send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123456789"))
        assert.is_true(hello_ok(srv.port))
        local res = helper.read_response(s)
        assert.equal(408, res.status)
        assert.is_true(helper.closed(s))
    end)

    it("closes on a client that stops reading a reply", function()
        local s = helper.connect(srv.port)
        assert(s:send("GET /huge HTTP/1.1\r\nHost: t\r\n\r\n"))
        socket.sleep(2.5) -- read nothing: the reply stalls, then send_timeout passes
        assert.is_true(hello_ok(srv.port))
        s:settimeout(5)
        local got, _, partial = s:receive("*a")
        local n = #(got or partial or "")
        assert.is_true(n < 32 * 1024 * 1024, "the reply was cut off")
        assert.truthy(srv:log():find("send_timeout", 1, true))
        s:close()
    end)

    local heads = {
        { "a request line over line_bytes", "GET /" .. string.rep("a", 9000) .. " HTTP/1.1\r\n", 414 },
        { "a request line over line_bytes, in pieces", "GET /" .. string.rep("a", 40000), 414 },
        { "fields over head_bytes", "GET / HTTP/1.1\r\nHost: t\r\n"
            .. string.rep("X-Filler: " .. string.rep("b", 100) .. "\r\n", 400), 431 },
        { "more than header_count fields", "GET / HTTP/1.1\r\nHost: t\r\n"
            .. string.rep("X: y\r\n", 120) .. "\r\n", 431 },
        { "a chunk-size line with 5 KiB of extensions", "POST /echo HTTP/1.1\r\nHost: t\r\n"
            .. "Transfer-Encoding: chunked\r\n\r\n1;" .. string.rep("e", 5000) .. "\r\nx\r\n0\r\n\r\n", 400 },
    }
    for _, case in ipairs(heads) do
        it("answers " .. case[3] .. " to " .. case[1] .. " and closes", function()
            local s = helper.connect(srv.port)
            s:send(case[2])
            local res = helper.read_response(s)
            assert.equal(case[3], res.status)
            assert.equal("close", res.headers["connection"])
            assert.is_true(helper.closed(s))
            assert.is_true(hello_ok(srv.port))
        end)
    end

    it("answers 503 with Retry-After past in_flight, without running the handler", function()
        local conns = {}
        for i = 1, 10 do
            conns[i] = helper.connect(srv.port)
            assert(conns[i]:send("GET /slow?s=1 HTTP/1.1\r\nHost: t\r\n\r\n"))
        end
        local served, refused = 0, 0
        for i = 1, 10 do
            local res = helper.read_response(conns[i])
            if res.status == 200 then
                served = served + 1
            elseif res.status == 503 then
                refused = refused + 1
                assert.equal("1", res.headers["retry-after"])
            end
            conns[i]:close()
        end
        assert.equal(4, served)
        assert.equal(6, refused)
        assert.is_true(hello_ok(srv.port))
    end)
end)

describe("moonserve's body limits per route", function()
    local srv

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/app.lua", args = "--limit body_bytes=1000" }
    end)

    teardown(function()
        srv:stop()
    end)

    local function post(path, n, expect)
        local s = helper.connect(srv.port)
        assert(s:send(("POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n%s\r\n")
            :format(path, n, expect and "Expect: 100-continue\r\n" or "")))
        if not expect then
            s:send(string.rep("b", n))
        end
        local res = helper.read_response(s)
        s:close()
        return res
    end

    it("holds a route without its own limit to body_bytes", function()
        assert.equal(413, post("/echo", 2000).status)
        assert.equal(200, post("/echo", 900).status)
    end)

    it("lets a route allow more", function()
        local res = post("/upload", 100000)
        assert.equal(200, res.status)
        assert.equal("100000", res.body)
    end)

    it("refuses a body over the route's limit before 100 Continue", function()
        local res = post("/upload", 300000, true)
        assert.equal(413, res.status) -- over every route's limit: refused before any Lua
        res = post("/echo", 2000, true)
        assert.equal(413, res.status) -- over this route's: refused when the body is asked for
    end)
end)

describe("moonserve's per-source cap", function()
    it("refuses the 257th connection from one address while others are served", function()
        local srv = helper.spawn_server { app = "spec/fixtures/app.lua" }
        local conns, open = {}, 0
        for i = 1, 300 do
            local s = assert(socket.tcp())
            s:settimeout(5)
            assert(s:connect("127.0.0.1", srv.port))
            conns[i] = s
        end
        for i = 1, 300 do
            local s = conns[i]
            s:send("GET /hello HTTP/1.1\r\nHost: t\r\n\r\n")
            local res = helper.read_response(s)
            if res and res.status == 200 then
                open = open + 1
            end
        end
        assert.equal(256, open)
        -- another address is not affected
        assert.is_true(hello_ok(srv.port, "127.0.0.2"))
        for i = 1, 300 do
            conns[i]:close()
        end
        -- and once they are gone, the first address is served again
        socket.sleep(0.2)
        assert.is_true(hello_ok(srv.port))
        assert.truthy(srv:log():find("refused 44 connections", 1, true) or
            srv:log():find("refused %d+ connections"))
        srv:stop()
    end)
end)
