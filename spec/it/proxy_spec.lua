-- spec/it/proxy_spec.lua: the client's address behind proxies, on a real server.
local helper = require "helper"

describe("moonserve behind proxies", function()
    local srv, plain, proxied

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/app.lua",
            args = "--listen-proxy 127.0.0.1:0 --trusted-proxy 127.0.0.0/8 --limit per_source=3" }
        plain, proxied = srv.ports[1], srv.ports[2]
    end)

    teardown(function()
        srv:stop()
    end)

    local function ip(port, prefix, xff)
        local s = helper.connect(port)
        local head = "GET /ip HTTP/1.1\r\nHost: t\r\n"
        if xff then
            head = head .. "X-Forwarded-For: " .. xff .. "\r\n"
        end
        assert(s:send((prefix or "") .. head .. "\r\n"))
        local res = helper.read_response(s)
        s:close()
        return res and res.body
    end

    it("walks X-Forwarded-For from a trusted peer through trusted hops only", function()
        assert.equal("127.0.0.1", ip(plain))
        assert.equal("203.0.113.5", ip(plain, nil, "198.51.100.1, 203.0.113.5"))
        assert.equal("203.0.113.5", ip(plain, nil, "203.0.113.5, 127.0.0.9"))
    end)

    it("takes the client from a PROXY v1 header", function()
        assert.equal("192.0.2.44", ip(proxied, "PROXY TCP4 192.0.2.44 127.0.0.1 5555 80\r\n"))
        assert.equal("2001:db8::7", ip(proxied, "PROXY TCP6 2001:db8::7 ::1 5555 80\r\n"))
    end)

    it("takes the client from a PROXY v2 header", function()
        local v2 = "\r\n\r\n\0\r\nQUIT\n" .. "\33\17\0\12" .. "\198\51\100\9" .. "\127\0\0\1"
            .. "\21\179\0\80"
        assert.equal("198.51.100.9", ip(proxied, v2))
    end)

    it("closes a connection without a valid PROXY header, and logs it", function()
        local s = helper.connect(proxied)
        assert(s:send("GET /ip HTTP/1.1\r\nHost: t\r\n\r\n"))
        assert.is_true(helper.closed(s))
        assert.truthy(srv:log():find("no valid PROXY protocol header", 1, true))
    end)

    it("counts the client behind a PROXY header against per_source", function()
        local conns = {}
        for i = 1, 4 do
            local s = helper.connect(proxied)
            assert(s:send("PROXY TCP4 192.0.2.99 127.0.0.1 5555 80\r\n"))
            conns[i] = s
        end
        -- The fourth from that client is refused; another client behind the same proxy is not.
        assert.is_true(helper.closed(conns[4]))
        assert.equal("192.0.2.100", ip(proxied, "PROXY TCP4 192.0.2.100 127.0.0.1 5555 80\r\n"))
        for i = 1, 3 do
            conns[i]:close()
        end
    end)

    it("counts IPv6 clients by their /64 against per_source", function()
        local conns = {}
        for i = 1, 4 do
            local s = helper.connect(proxied)
            assert(s:send(("PROXY TCP6 2001:db8:5:6::%x ::1 5555 80\r\n"):format(i)))
            conns[i] = s
        end
        -- Four addresses of one /64 are one source; the next /64 is another.
        assert.is_true(helper.closed(conns[4]))
        assert.equal("2001:db8:5:7::1", ip(proxied, "PROXY TCP6 2001:db8:5:7::1 ::1 5555 80\r\n"))
        for i = 1, 3 do
            conns[i]:close()
        end
    end)

    it("refuses a PROXY v2 header longer than 512 bytes that comes in one piece", function()
        local len = 513
        local v2 = "\r\n\r\n\0\r\nQUIT\n" .. "\33\17" .. string.char(len / 256, len % 256)
            .. "\198\51\100\9" .. "\127\0\0\1" .. "\21\179\0\80" .. ("\0"):rep(len - 12)
        local s = helper.connect(proxied)
        assert(s:send(v2 .. "GET /ip HTTP/1.1\r\nHost: t\r\n\r\n"))
        assert.is_true(helper.closed(s))
    end)
end)
