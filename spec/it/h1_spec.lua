-- spec/it/h1_spec.lua: a real moonserve over loopback, with raw sockets and curl.
local helper = require "helper"
local socket = require "socket"

describe("moonserve over HTTP/1.1", function()
    local srv

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/app.lua",
            args = "--limit body_bytes=20000000" }
    end)

    teardown(function()
        assert.is_true(srv:stop(), "the server must stop on SIGTERM")
    end)

    local twice = helper.twice(it)

    twice("answers a GET", function()
        local res = helper.request(srv.port, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n")
        assert.equal(200, res.status)
        assert.equal("hello world", res.body)
        assert.equal("11", res.headers["content-length"])
        assert.equal("text/plain; charset=utf-8", res.headers["content-type"])
        assert.truthy(res.headers["date"]:match("GMT$"))
    end)

    twice("keeps a connection alive across requests", function()
        local s = helper.connect(srv.port)
        for i = 1, 3 do
            assert(s:send("GET /n/" .. i .. " HTTP/1.1\r\nHost: t\r\n\r\n"))
            local res = helper.read_response(s)
            assert.equal(200, res.status)
            assert.equal("n=" .. i, res.body)
            assert.is_nil(res.headers["connection"])
        end
        s:close()
    end)

    it("stops parsing pipelined requests while their replies are not read", function()
        local status = function()
            return tonumber(helper.read_file("/proc/" .. srv.pid .. "/status"):match("VmRSS:%s*(%d+)"))
        end
        local s = helper.connect(srv.port)
        local reqs, n = {}, 0
        while #table.concat(reqs) < 64 * 1024 do
            n = n + 1
            reqs[n] = "GET /blob/" .. n .. " HTTP/1.1\r\nHost: t\r\nUser-Agent: "
                .. ("p"):rep(100) .. "\r\n\r\n" -- fewer than requests_per_connection
        end
        local before = status()
        assert(s:send(table.concat(reqs)))
        require("socket").sleep(0.5) -- the replies pile up, or do not
        local grew = status() - before
        -- 20 KB each: all of them queued would be over 8 MB
        assert.is_true(grew < 4 * 1024, ("VmRSS grew by %d KiB"):format(grew))
        for i = 1, n do
            local res = helper.read_response(s)
            assert.equal(200, res.status)
            assert.equal(i .. ".", res.body:sub(1, #tostring(i) + 1))
        end
        s:close()
    end)

    twice("answers 100 pipelined requests in order", function()
        local s = helper.connect(srv.port)
        local batch = {}
        for i = 1, 100 do
            batch[i] = "GET /n/" .. i .. " HTTP/1.1\r\nHost: t\r\n\r\n"
        end
        assert(s:send(table.concat(batch)))
        for i = 1, 100 do
            local res = assert(helper.read_response(s))
            assert.equal("n=" .. i, res.body)
        end
        s:close()
    end)

    twice("keeps pipelined replies in order behind a parked handler", function()
        local s = helper.connect(srv.port)
        assert(s:send("GET /slow?s=0.2 HTTP/1.1\r\nHost: t\r\n\r\nGET /n/2 HTTP/1.1\r\nHost: t\r\n\r\n"))
        assert.equal("slow done", helper.read_response(s).body)
        assert.equal("n=2", helper.read_response(s).body)
        s:close()
    end)

    it("serves a fast request while a slow handler waits on another connection", function()
        local slow = helper.connect(srv.port)
        assert(slow:send("GET /slow?s=2 HTTP/1.1\r\nHost: t\r\n\r\n"))
        local res = helper.request(srv.port, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n")
        assert.equal("hello world", res.body)
        -- The slow one is still waiting: nothing has arrived on its connection.
        slow:settimeout(0)
        local data, err = slow:receive(1)
        assert.is_nil(data)
        assert.equal("timeout", err)
        slow:settimeout(10)
        assert.equal("slow done", helper.read_response(slow).body)
        slow:close()
    end)

    twice("turns a handler error into a 500 with a reference id that is in the log", function()
        local res = helper.request(srv.port, "GET /error HTTP/1.1\r\nHost: t\r\n\r\n")
        assert.equal(500, res.status)
        local ref = res.body:match("reference: (%x+)")
        assert.truthy(ref, res.body)
        local log = srv:log()
        assert.truthy(log:find("[" .. ref .. "] GET /error", 1, true), log)
        assert.truthy(log:find("boom in handler", 1, true))
        assert.truthy(log:find("stack traceback", 1, true))
        -- and the worker goes on
        assert.equal(200, helper.request(srv.port, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n").status)
    end)

    twice("streams a 10 MiB request body through", function()
        local file = os.tmpname()
        assert(helper.run("head -c 10485760 /dev/urandom > " .. file))
        local out = helper.curl(("-o %s.out -w '%%{http_code}' --data-binary @%s "
            .. "-H 'content-type: application/octet-stream' http://127.0.0.1:%d/stream")
            :format(file, file, srv.port))
        assert.equal("200", out)
        local a = helper.run("md5sum < " .. file)
        local b = helper.run("md5sum < " .. file .. ".out")
        assert.equal(a, b)
        os.remove(file)
        os.remove(file .. ".out")
    end)

    twice("echoes a chunked upload whole", function()
        local s = helper.connect(srv.port)
        assert(s:send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            .. "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"))
        local res = helper.read_response(s)
        assert.equal("hello world", res.body)
        s:close()
    end)

    twice("sends 100 Continue when the handler reads the body", function()
        local s = helper.connect(srv.port)
        assert(s:send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n"
            .. "Expect: 100-continue\r\n\r\n"))
        assert.equal("HTTP/1.1 100 Continue", s:receive("*l"))
        assert.equal("", s:receive("*l"))
        assert(s:send("ping"))
        assert.equal("ping", helper.read_response(s).body)
        s:close()
    end)

    twice("answers HEAD with the length and no body", function()
        local s = helper.connect(srv.port)
        assert(s:send("HEAD /hello HTTP/1.1\r\nHost: t\r\n\r\nGET /n/7 HTTP/1.1\r\nHost: t\r\n\r\n"))
        local res = helper.read_response(s, true)
        assert.equal("11", res.headers["content-length"])
        assert.equal("n=7", helper.read_response(s).body) -- nothing of the HEAD body in between
        s:close()
    end)

    twice("streams a reply in chunks", function()
        local res = helper.request(srv.port, "GET /chunks HTTP/1.1\r\nHost: t\r\n\r\n")
        assert.equal("chunked", res.headers["transfer-encoding"])
        assert.equal("chunk 1\nchunk 2\nchunk 3\nchunk 4\nchunk 5\n", res.body)
    end)

    twice("sends a 4 MiB reply whole", function()
        local out = helper.curl(("-o /dev/null -w '%%{http_code} %%{size_download}' "
            .. "http://127.0.0.1:%d/big"):format(srv.port))
        assert.equal("200 4194304", out)
    end)

    twice("answers a handler that sends nothing with an empty 200", function()
        local res = helper.request(srv.port, "GET /silent HTTP/1.1\r\nHost: t\r\n\r\n")
        assert.equal(200, res.status)
        assert.equal("0", res.headers["content-length"])
    end)

    twice("closes after Connection: close and after HTTP/1.0", function()
        local s = helper.connect(srv.port)
        assert(s:send("GET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"))
        assert.equal("close", helper.read_response(s).headers["connection"])
        assert.is_true(helper.closed(s))
        s = helper.connect(srv.port)
        assert(s:send("GET /hello HTTP/1.0\r\n\r\n"))
        assert.equal("hello world", helper.read_response(s).body)
        assert.is_true(helper.closed(s))
    end)

    local malformed = {
        { "no Host", "GET / HTTP/1.1\r\n\r\n", 400 },
        { "bare LF", "GET / HTTP/1.1\nHost: t\r\n\r\n", 400 },
        { "obs-fold", "GET / HTTP/1.1\r\nHost: t\r\nX: a\r\n b\r\n\r\n", 400 },
        { "CL with TE", "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n"
            .. "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400 },
        { "HTTP/2.0 on the HTTP/1 parser", "GET / HTTP/2.0\r\nHost: t\r\n\r\n", 505 },
        { "body over body_bytes", "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 30000000\r\n\r\n", 413 },
    }
    for _, case in ipairs(malformed) do
        twice("refuses a request with " .. case[1] .. " and closes", function()
            local s = helper.connect(srv.port)
            assert(s:send(case[2]))
            local res = helper.read_response(s)
            assert.equal(case[3], res.status)
            assert.equal("close", res.headers["connection"])
            assert.is_true(helper.closed(s))
        end)
    end

    it("logs one line per refused request, up to 10 a second", function()
        socket.sleep(1.1) -- the refusals above used this second's lines
        local before = select(2, srv:log():gsub("400 Bad Request", ""))
        helper.request(srv.port, "GET / HTTP/1.1\r\n\r\n")
        local after = select(2, srv:log():gsub("400 Bad Request", ""))
        assert.equal(before + 1, after)
    end)

    twice("works with curl: keep-alive reuse, JSON and headers", function()
        local out = helper.curl(("-v http://127.0.0.1:%d/hello http://127.0.0.1:%d/n/2")
            :format(srv.port, srv.port))
        assert.truthy(out:find("Re-using existing connection", 1, true)
            or out:find("Reusing existing connection", 1, true), out)
        assert.truthy(out:find("hello world", 1, true), out)
        assert.truthy(out:find("\nn=2", 1, true), out)
        local json = helper.curl(("-H 'X-Test: yes' http://127.0.0.1:%d/headers"):format(srv.port))
        local t = require("cjson").decode(json)
        assert.equal("yes", t["x-test"])
    end)
end)
