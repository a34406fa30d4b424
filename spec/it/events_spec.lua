-- spec/it/events_spec.lua: server-sent events through a real server with two workers
-- (spec/fixtures/events.lua): framing, retry, heartbeats, a channel followed across workers,
-- Last-Event-ID replay from the ring, and a client that leaves ending the handler.
local helper = require "helper"
local socket = require "socket"

-- A stream client over a raw socket: the head, then the chunked body as it comes.
local function open(port, path, headers)
    local s = helper.connect(port, 5)
    s:send("GET " .. path .. " HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
        .. (headers or "") .. "\r\n")
    local head = {}
    while true do
        local line = assert(s:receive("*l"))
        if line == "" then
            break
        end
        head[#head + 1] = line
    end
    local c = { s = s, head = table.concat(head, "\n"), buf = "" }
    -- Reads chunks until the body so far matches `pattern` or `seconds` pass; the body.
    function c:until_match(pattern, seconds)
        local deadline = socket.gettime() + (seconds or 5)
        while not self.buf:find(pattern) and socket.gettime() < deadline do
            self.s:settimeout(math.max(0.01, deadline - socket.gettime()))
            local line = self.s:receive("*l")
            if not line then
                break
            end
            local n = tonumber(line, 16)
            if n == 0 then
                self.ended = true
                break
            end
            if n then
                self.buf = self.buf .. assert(self.s:receive(n))
                self.s:receive("*l")
            end
        end
        return self.buf
    end
    function c:close()
        self.s:close()
    end
    return c
end

local function publish(port, text)
    return helper.curl("-H 'Origin: http://127.0.0.1:" .. port .. "' --data-binary '" .. text
        .. "' http://127.0.0.1:" .. port .. "/publish")
end

describe("server-sent events", function()
    local srv

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/events.lua", args = "--workers 2" }
    end)

    teardown(function()
        srv:stop()
    end)

    it("frames events: head fields, multi-line data, a refused id", function()
        local c = open(srv.port, "/hand")
        finally(function() c:close() end)
        assert.matches("content%-type: text/event%-stream", c.head:lower())
        assert.matches("cache%-control: no%-cache", c.head:lower())
        assert.matches("x%-accel%-buffering: no", c.head:lower())
        local body = c:until_match("event: refused\n.-\n\n")
        assert.equal(":\n\n"
            .. "id: 7\nevent: greeting\ndata: one\ndata: two\ndata: three\n\n"
            .. "data: \n\n"
            .. "event: refused\ndata: true bad id (no CR or LF allowed)\n\n", body)
    end)

    it("sends retry first, then heartbeats every `heartbeat` seconds", function()
        local c = open(srv.port, "/events?heartbeat=0.2")
        finally(function() c:close() end)
        local t0 = socket.gettime()
        local body = c:until_match("\n:\n\n:\n\n:\n\n", 3)
        assert.matches("^retry: 2500\n\n: worker %d pid %d+\n\n:\n\n:\n\n:\n\n$", body)
        assert.is_true(socket.gettime() - t0 < 2, body)
    end)

    it("delivers a message published in another request, on either worker", function()
        local clients = {}
        finally(function()
            for _, c in ipairs(clients) do c:close() end
        end)
        local workers = {}
        -- (the kernel spreads connections over the workers' sockets by a hash: open
        -- streams until both workers hold some)
        for i = 1, 40 do
            local c = open(srv.port, "/events")
            clients[i] = c
            workers[c:until_match("worker %d"):match("worker (%d)")] = true
            if i >= 4 and workers["0"] and workers["1"] then
                break
            end
        end
        assert.is_true(workers["0"] and workers["1"], "streams on both workers")
        local seq = tonumber(publish(srv.port, "hello\nworld"))
        assert.is_number(seq)
        for _, c in ipairs(clients) do
            local body = c:until_match("data: world\n\n")
            assert.matches("id: " .. seq .. "\nevent: note\ndata: hello\ndata: world\n\n$", body)
        end
    end)

    it("replays what the ring still holds after Last-Event-ID, then follows", function()
        local first = tonumber(publish(srv.port, "a"))
        publish(srv.port, "b")
        publish(srv.port, "c")
        local c = open(srv.port, "/events", "Last-Event-ID: " .. first .. "\r\n")
        finally(function() c:close() end)
        local body = c:until_match("data: c\n\n")
        assert.matches("^retry: 2500\n\n: worker %d pid %d+\n\nid: " .. first + 1
            .. "\nevent: note\ndata: b\n\nid: " .. first + 2 .. "\nevent: note\ndata: c\n\n$",
            body)
        publish(srv.port, "d")
        assert.matches("data: d\n\n$", c:until_match("data: d\n\n"))
    end)

    it("says `reset` when the id is older than the ring, then sends what it kept", function()
        local first = tonumber(publish(srv.port, "e1"))
        for i = 2, 6 do
            publish(srv.port, "e" .. i)
        end
        -- history = 4: e3 .. e6 are kept; e2 is lost to a client that saw e1
        local c = open(srv.port, "/events", "Last-Event-ID: " .. first .. "\r\n")
        finally(function() c:close() end)
        local body = c:until_match("data: e6\n\n")
        assert.matches("\n\nevent: reset\ndata: 1\n\nid: " .. first + 2
            .. "\nevent: note\ndata: e3\n\n.*data: e6\n\n$", body)
        assert.is_nil(body:find("data: e2", 1, true))
    end)

    it("replays the ring to a WebSocket subscriber since an id", function()
        local first = tonumber(publish(srv.port, "w1"))
        publish(srv.port, "w2")
        publish(srv.port, "w3")
        local s = helper.connect(srv.port, 5)
        finally(function() s:close() end)
        s:send("GET /ws?since=" .. first .. " HTTP/1.1\r\nHost: 127.0.0.1:" .. srv.port
            .. "\r\nOrigin: http://127.0.0.1:" .. srv.port .. "\r\nUpgrade: websocket\r\n"
            .. "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            .. "Sec-WebSocket-Version: 13\r\n\r\n")
        assert.matches("^HTTP/1.1 101", s:receive("*l"))
        repeat
            local line = s:receive("*l")
        until line == ""
        local function frame() -- (small unmasked text frames from the server)
            local h = assert(s:receive(2))
            return assert(s:receive(h:byte(2) % 128))
        end
        -- The replay goes out before the socket joins, the "lost" line after it; but what
        -- this worker's poller has not reached yet when the socket joins (w2 and w3 were
        -- published in either worker), the poller delivers, after that line. Either way the
        -- messages come once each, in order.
        local got, lost = {}, nil
        for _ = 1, 3 do
            local f = frame()
            if f:find("^lost ") then
                assert.is_nil(lost, "a second lost line")
                lost = f
            else
                got[#got + 1] = f
            end
        end
        assert.equal("lost 0", lost)
        assert.same({ "w2", "w3" }, got)
        publish(srv.port, "w4")
        assert.equal("w4", frame())
    end)

    it("ends the handler when the client leaves", function()
        local before = tonumber(helper.curl("http://127.0.0.1:" .. srv.port .. "/ends"))
        local c = open(srv.port, "/events")
        c:until_match("worker")
        c:close()
        assert.truthy(helper.wait_for(function()
            return tonumber(helper.curl("http://127.0.0.1:" .. srv.port .. "/ends")) > before
        end, 3))
    end)

    it("streams over HTTP/2 too, and ends the handler when that client leaves", function()
        local url = "http://127.0.0.1:" .. srv.port
        local before = tonumber(helper.curl(url .. "/ends"))
        local out = helper.run(helper.tool("curl") .. " -sN --http2-prior-knowledge --max-time 1 "
            .. url .. "/events 2>&1")
        assert.matches("^retry: 2500\n\n: worker %d pid %d+\n\n$", out)
        assert.truthy(helper.wait_for(function()
            return tonumber(helper.curl(url .. "/ends")) > before
        end, 3))
    end)
end)
