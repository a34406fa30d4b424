-- spec/it/ngx_socket_spec.lua: ngx.req.socket on a real server (spec/fixtures/ngx_socket.lua):
-- the request body as a cosocket, the raw connection after a 101, and Debian's
-- lua-nginx-websocket unchanged on it, with its own client, Debian's python3-websockets, and
-- against moonserve's own WebSocket. (spec/it/ngx_diff_spec.lua runs the same handlers on
-- nginx and compares.)
local helper = require "helper"
local raw_client = require "ngx_raw_client"

local q = helper.sh_quote

describe("ngx.req.socket", function()
    local srv

    setup(function()
        helper.tool("nginx.websocket.server") -- fails naming lua-nginx-websocket if missing
        srv = helper.spawn_server { app = "spec/fixtures/ngx_socket.lua" }
    end)

    teardown(function()
        if srv then srv:stop() end
    end)

    local twice = helper.twice(it)

    local function post(path, body, head)
        local raw = "POST " .. path .. " HTTP/1.1\r\nHost: sock.test\r\n" .. (head or "")
        if body then
            raw = raw .. "Content-Length: " .. #body .. "\r\n\r\n" .. body
        else
            raw = raw .. "\r\n"
        end
        return assert(helper.request(srv.port, raw))
    end

    describe("without true: the request body", function()
        twice("reads sizes, lines and the rest, then says closed (with the partial once, then "
            .. "without); a second socket is refused; it has no send or close", function()
            local res = post("/sock_body", "hello world\nline2\r\nrest")
            assert.equal(200, res.status)
            assert.equal("r5 (1): hello\nline (1):  world\nall (1): line2\r\nrest\n"
                .. "end (3): nil | closed | \nagain (2): nil | closed\n"
                .. "second (2): nil | request body already exists\nmethods (2): true | true\n",
                res.body)
        end)

        twice("reads up to a pattern whole and by size, nil once the pattern is reached, and "
            .. "the rest as the partial result at the end", function()
            local res = post("/sock_until", "abc--defgh--tail")
            assert.equal("u (1): abc\nu2 (1): de\nu2 (1): fg\nu2 (1): h\n"
                .. "u2 (3): nil | nil | nil\nu (3): nil | closed | tail\nu (2): nil | closed\n"
                .. "settimeout (0): \nafter (2): nil | closed\n", res.body)
        end)

        twice("returns \"\" from a sized receiveuntil read that meets the pattern at once, and "
            .. "nil, nil, nil only from the call after it, as lua-nginx-module does", function()
            local res = post("/sock_until_sized", "ab--c--\r\nxy==rest")
            assert.equal("u2 (1): ab\nu2 (1): \nu2 (3): nil | nil | nil\nu2 (1): c\n"
                .. "u2 (3): nil | nil | nil\nline512 (1): \nline1 (3): nil | nil | nil\n"
                .. "inc2 (1): xy\ninc2 (1): ==\ninc2 (3): nil | nil | nil\nrest (1): rest\n",
                res.body)
        end)

        it("streams a 5 MB multipart upload in 8 KiB pieces through lua-resty-upload's calls, "
            .. "on the request body and on a TCP socket", function()
            local mp = dofile((os.getenv("MOONSERVE_SRC") or ".")
                .. "/spec/fixtures/multipart_body.lua")
            local n = 5000000
            local body, file = mp.body("up-b0undary", n)
            local tmp = os.tmpname()
            helper.write_file(tmp, file)
            local md5 = helper.sh(helper.tool("md5sum") .. " " .. q(tmp)):match("^(%x+)")
            os.remove(tmp)
            local want = 'Content-Disposition: form-data; name="title" | 7 bytes | 1 pieces | '
                .. "max 7 | ec96ebbf50206107799d38a53543f494\n"
                .. 'Content-Disposition: form-data; name="file"; filename="f.bin"; '
                .. "Content-Type: application/octet-stream | " .. n .. " bytes | "
                .. math.ceil(n / 8192) .. " pieces | max 8192 | " .. md5 .. "\n"
            local res = post("/upload?stats=1", body,
                "Content-Type: multipart/form-data; boundary=up-b0undary\r\n")
            assert.equal(200, res.status)
            assert.equal(want, res.body)
            res = assert(helper.request(srv.port, "GET /upload_tcp?stats=1&n=" .. n
                .. " HTTP/1.1\r\n"
                .. "Host: sock.test\r\n\r\n"))
            assert.equal(want, res.body)
        end)

        it("times a read out after settimeout's milliseconds, with what came as the partial "
            .. "result, and stays usable", function()
            local s = helper.connect(srv.port)
            local t0 = require("socket").gettime()
            assert(s:send("POST /sock_slow HTTP/1.1\r\nHost: sock.test\r\nContent-Length: 6\r\n"
                .. "\r\nx"))
            local res = assert(helper.read_response(s))
            s:close()
            local took = require("socket").gettime() - t0
            assert.equal("r10 (3): nil | timeout | x\nr3 (3): nil | timeout | \n", res.body)
            assert.is_true(took >= 0.35 and took < 3, "took " .. took)
        end)

        twice("is refused for a chunked body, a request without one, and a body read "
            .. "already, with OpenResty's errors", function()
            local res = post("/sock_body", nil, "Transfer-Encoding: chunked\r\n\r\n5\r\nhello"
                .. "\r\n0\r\n")
            assert.equal("no socket: chunked request bodies not supported yet\n", res.body)
            res = post("/sock_body")
            assert.equal("no socket: no body\n", res.body)
            res = post("/sock_read_first", "x")
            assert.equal("socket (2): nil | request body already exists\n", res.body)
        end)

        it("raises \"http v2 not supported yet\" on HTTP/2, as lua-nginx-module 0.10.23 does",
            function()
                -- (A GET: a body still on its way when the 500 has gone is reset with
                -- NO_ERROR, RFC 9113 8.1, which curl may report as a framing error.)
                local out = helper.curl("--http2-prior-knowledge -o /dev/null -w '%{http_code} "
                    .. "%{http_version}' http://127.0.0.1:" .. srv.port .. "/sock_body")
                assert.equal("500 2", out)
                assert.matches("GET /sock_body: http v2 not supported yet", srv:log(), 1, true)
            end)
    end)

    describe("with true: the connection after a 101", function()
        twice("sends the 101 with ngx.header's fields, then reads and writes the raw bytes: "
            .. "timeouts with the partial result, a half-close read as closed while sends "
            .. "still go", function()
            local got, head = raw_client.exchange(srv.port)
            assert.equal(101, head.status)
            assert.equal("x-echo", head.headers.upgrade)
            assert.equal("upgrade", head.headers.connection)
            assert.is_nil(head.headers["content-type"])
            assert.is_nil(head.headers["transfer-encoding"])
            assert.equal(table.concat({
                "methods: true | true | true",
                "again: nil | duplicate call",
                "body: nil | request body already exists",
                "say: nil | raw request socket acquired",
                "got: abcd",
                "got: nil | timeout | ef",
                "line: a line",
                "ab1",
                "table: 3",
                "rest: nil | closed | rest",
                "after: nil | closed",
                "",
            }, "\n"), got)
        end)

        it("waits in send while the connection is congested, as OpenResty's send does: a "
            .. "tight loop of sends reaches a client that reads", function()
            local s = helper.connect(srv.port)
            assert(s:send("GET /raw_flood?mib=16 HTTP/1.1\r\nHost: sock.test\r\n\r\n"))
            assert.equal(101, assert(helper.read_response(s, true)).status)
            local got = 0
            while true do
                local data, err, partial = s:receive(65536)
                data = data or partial
                got = got + #data
                if err then
                    break
                end
            end
            s:close()
            assert.equal(16 * 1048576, got)
            assert(helper.wait_for(function()
                return srv:log():find("raw_flood: sent 16777216", 1, true) ~= nil
            end), srv:log())
        end)

        it("hands out a sized receiveuntil piece once that many bytes cannot begin the "
            .. "pattern, without waiting for the pattern's length more, as lua-nginx-module",
            function()
                local s = helper.connect(srv.port)
                assert(s:send("GET /raw_until HTTP/1.1\r\nHost: sock.test\r\n\r\n"))
                assert.equal(101, assert(helper.read_response(s, true)).status)
                s:settimeout(2)
                -- 4 bytes, none of which may begin "\r\n--boundary": a piece at once.
                assert(s:send("abcd"))
                assert.equal("[abcd]", s:receive("*l"))
                -- "\r\n-" may: the 2 bytes before it wait for what follows.
                assert(s:send("ef\r\n-"))
                assert(s:send("-boundarywxyz\r"))
                assert.equal("[ef]", s:receive("*l"))
                assert.equal("[nil]", s:receive("*l"))
                assert.equal("[wxyz]", s:receive("*l"))
                s:close()
                assert(helper.wait_for(function() -- (the log writes the CR as \r)
                    return srv:log():find("raw_until: closed [\\r]", 1, true) ~= nil
                end), srv:log())
            end)

        it("hears the client hang up as closed, and the connection ends with the handler",
            function()
                local s = helper.connect(srv.port)
                assert(s:send("GET /raw_hold HTTP/1.1\r\nHost: sock.test\r\n\r\n"))
                assert.equal(101, assert(helper.read_response(s, true)).status)
                assert(s:send("one\r\n"))
                assert.equal("one", s:receive("*l"))
                s:close()
                assert(helper.wait_for(function()
                    return srv:log():find("raw_hold: closed", 1, true) ~= nil
                end), srv:log())
            end)
    end)

    describe("resty.websocket.server (Debian's lua-nginx-websocket, unchanged)", function()
        local function drive(path, extra)
            local res = assert(helper.request(srv.port, "GET /drive?path=" .. path
                .. (extra or "") .. " HTTP/1.1\r\nHost: sock.test\r\n\r\n"))
            assert.equal(200, res.status)
            return res.body
        end

        twice("echoes text, binary, a 64000-byte frame, fragments as fragments, answers a ping, "
            .. "and a close with its code and reason, to resty.websocket.client", function()
            assert.equal(table.concat({
                "text: text nil 5 hello",
                "binary: binary same",
                "big: binary same",
                "ping: pong nil 13 are you there",
                "fragmented: text:frag:again continuation:ment:again continuation:ed:nil",
                "close: close 4001 9 done here",
                "",
            }, "\n"), drive("/resty_echo"))
        end)

        it("ends the connection on a frame over max_payload_len (resty's recv_frame fails, and "
            .. "the library sends nothing after a fatal error)", function()
            assert.matches("over: nil failed to receive the first 2 bytes: closed nil",
                drive("/resty_echo", "&close=big"), 1, true)
        end)

        it("talks to Debian's python3-websockets: text, binary, a 64000-byte message, a "
            .. "fragmented one, ping and pong, close code and reason", function()
            local out = helper.run(q(helper.tool("websockets")) .. " "
                .. q(helper.root .. "/spec/it/ws_client.py") .. " " .. srv.port
                .. " resty_echo 2>&1")
            assert.equal("text=hello \u{e9}\nbinary=0001ff\nbig=True\nfragmented=fragmented\n"
                .. "pong=yes\nclose_code=4000\nclose_reason=done\n", out)
        end)

        twice("resty.websocket.client talks to moonserve's own WebSocket: fragments come "
            .. "reassembled, the close is answered with its code, an oversized frame with 1009",
            function()
                local body = drive("/ws/echo")
                assert.equal(table.concat({
                    "text: text nil 5 hello",
                    "binary: binary same",
                    "big: binary same",
                    "ping: pong nil 13 are you there",
                    "fragmented: text:fragmented:nil",
                    "close: close 4001 0 ",
                    "",
                }, "\n"), body)
                assert.matches("over: close 1009 23 frame over the size cap",
                    drive("/ws/echo", "&close=big"), 1, true)
            end)
    end)
end)

describe("ngx.req.socket behind moonserve.csrf", function()
    local srv, jar

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/ngx_csrf.lua" }
        jar = os.tmpname()
    end)

    teardown(function()
        srv:stop()
        os.remove(jar)
    end)

    it("reads the whole multipart body the middleware looked into for its _csrf field",
        function()
            local url = "http://127.0.0.1:" .. srv.port
            local token = helper.curl("-s -c " .. jar .. " " .. url .. "/token")
            local file = os.tmpname()
            assert(helper.run("head -c 300000 /dev/urandom > " .. file))
            -- the field after the file: the middleware reads every piece before it
            for _, order in ipairs({ "before", "after" }) do
                local field = "-F _csrf=" .. token .. " "
                local doc = "-F 'doc=@" .. file .. "' "
                local out = helper.curl("-s -w ' %{size_upload}' -b " .. jar .. " -F title=hi "
                    .. (order == "before" and field .. doc or doc .. field) .. url .. "/upload")
                local n, how, sent = out:match("^(%d+) %-%- (%a+)\n (%d+)$")
                assert.equal("end", how, out)
                assert.equal(sent, n, out)
            end
            os.remove(file)
        end)
end)

describe("ngx.req.socket(true) and the caps", function()
    local srv

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/ngx_socket.lua",
            args = "--limit websockets=1 --limit in_flight=1 --limit send_timeout=1 "
                .. "--limit raw_socket_buffer_bytes=65536" }
    end)

    teardown(function()
        if srv then srv:stop() end
    end)

    local function hold()
        local s = helper.connect(srv.port)
        assert(s:send("GET /raw_hold HTTP/1.1\r\nHost: sock.test\r\n\r\n"))
        return s, assert(helper.read_response(s, true))
    end

    it("closes a raw connection whose line outgrows raw_socket_buffer_bytes, with one log "
        .. "line; a line under it still comes back", function()
        local s, head = hold()
        assert.equal(101, head.status)
        assert(s:send(("x"):rep(1000) .. "\n"))
        assert.equal(("x"):rep(1000), s:receive("*l"))
        local big = ("y"):rep(200000) -- no LF: the handler's receive() holds it all
        s:send(big)
        s:settimeout(5)
        local line, err = s:receive("*l")
        s:close()
        assert.is_nil(line)
        assert.equal("closed", err)
        local n = 0
        for _ in srv:log():gmatch("held more than raw_socket_buffer_bytes") do n = n + 1 end
        assert.equal(1, n)
    end)

    it("counts an open raw connection against websockets, not in_flight: past the cap a 101 "
        .. "is a 503, requests still go", function()
        local a, head = hold()
        assert.equal(101, head.status)
        assert(a:send("ping\n"))
        assert.equal("ping", a:receive("*l"))
        -- in_flight is 1, and the raw connection is not in flight
        local res = assert(helper.request(srv.port, "POST /sock_read_first HTTP/1.1\r\n"
            .. "Host: sock.test\r\nContent-Length: 1\r\n\r\nx"))
        assert.equal(200, res.status)
        -- websockets is 1: another raw connection, or a WebSocket, is refused
        local b, head2 = hold()
        assert.equal(503, head2.status)
        assert.equal("1", head2.headers["retry-after"])
        b:close()
        local c = helper.connect(srv.port)
        assert(c:send("GET /ws/echo HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            .. "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            .. "Sec-WebSocket-Version: 13\r\n\r\n"))
        assert.equal(503, assert(helper.read_response(c, true)).status)
        c:close()
        -- once the first goes, the next is taken
        a:close()
        assert(helper.wait_for(function()
            return srv:log():find("raw_hold: closed", 1, true) ~= nil
        end))
        local d, head3 = hold()
        assert.equal(101, head3.status)
        d:close()
    end)

    it("cuts a raw connection whose client does not read after send_timeout: the waiting "
        .. "send returns closed", function()
        assert(helper.wait_for(function()
            return srv:log():find("raw_hold: closed\n.*raw_hold: closed") ~= nil
        end)) -- (the last test's raw connection is gone: the cap has room)
        local s = helper.connect(srv.port)
        assert(s:send("GET /raw_flood?mib=64 HTTP/1.1\r\nHost: sock.test\r\n\r\n"))
        assert.equal(101, assert(helper.read_response(s, true)).status)
        local line
        assert(helper.wait_for(function()
            line = srv:log():match("raw_flood: closed after (%d+)")
            return line ~= nil
        end, 10), srv:log())
        assert.is_true(tonumber(line) < 64 * 1048576, line)
        s:close()
    end)
end)
