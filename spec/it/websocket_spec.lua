-- spec/it/websocket_spec.lua: a real moonserve serving WebSocket endpoints over loopback: the
-- conformance client (spec/it/ws_client.py, on Debian's python3-websockets and python3-h2)
-- for what clients do, and raw frames written here for what no client library sends.
local helper = require "helper"
local bit = require "bit"

local q = helper.sh_quote
local band, bxor, rshift = bit.band, bit.bxor, bit.rshift
local char, byte, concat, rep = string.char, string.byte, table.concat, string.rep

-- The conformance client run against `port` with a case (and a path; `ca`: the certificate
-- that makes it speak TLS): its k=v lines as a table, its output and status as _out and
-- _status.
local function run_client(port, case, path, ca)
    local out, status = helper.run(string.format("WS_TLS_CA=%s %s %s %d %s%s 2>&1",
        q(ca or ""), q(helper.tool("websockets")), q(helper.root .. "/spec/it/ws_client.py"),
        port, case, path and " " .. q(path) or ""))
    local t = {}
    for k, v in out:gmatch("([%w_]+)=([^\n]*)") do
        t[k] = v
    end
    t._out, t._status = out, status
    return t
end

-- fn(port, ca) with `app` served over TLS on a certificate for localhost made for it: port
-- is the TLS listener's, ca the certificate the client is to trust. The server stops and
-- the certificate goes before fn's error is raised or its result returned.
local function over_tls(app, fn)
    local dir = os.tmpname()
    os.remove(dir)
    helper.sh("mkdir -p " .. q(dir))
    helper.sh(string.format("%s req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
        .. "-nodes -keyout %s -out %s -days 2 -subj /CN=localhost "
        .. "-addext subjectAltName=DNS:localhost 2>&1", helper.tool("openssl"),
        q(dir .. "/ws.key"), q(dir .. "/ws.pem")))
    local tls = helper.spawn_server { app = app,
        args = string.format("--listen 127.0.0.1:0 --tls-cert %s --tls-key %s",
            q(dir .. "/ws.pem"), q(dir .. "/ws.key")) }
    local ok, res = pcall(fn, tls.ports[2], dir .. "/ws.pem")
    tls:stop()
    helper.sh("rm -rf " .. q(dir))
    assert(ok, res)
    return res
end

-- -- Raw frames -----------------------------------------------------------------------------

local KEY = "dGhlIHNhbXBsZSBub25jZQ==" -- RFC 6455 1.3's example, and its answer:
local ACCEPT = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
local MASK = { 0x12, 0x34, 0x56, 0x78 }

-- A client frame: first byte b0 (FIN, RSV, opcode), the payload masked unless `unmasked`.
local function frame(b0, payload, unmasked)
    local n = #payload
    local head
    local m = unmasked and 0 or 0x80
    if n < 126 then
        head = char(b0, m + n)
    elseif n < 65536 then
        head = char(b0, m + 126, rshift(n, 8), band(n, 255))
    else
        head = char(b0, m + 127, 0, 0, 0, 0, band(rshift(n, 24), 255), band(rshift(n, 16), 255),
            band(rshift(n, 8), 255), band(n, 255))
    end
    if unmasked then
        return head .. payload
    end
    local out = {}
    for i = 1, n do
        out[i] = char(bxor(byte(payload, i), MASK[(i - 1) % 4 + 1]))
    end
    return head .. char(MASK[1], MASK[2], MASK[3], MASK[4]) .. concat(out)
end

local function close_payload(code, reason)
    return char(rshift(code, 8), band(code, 255)) .. (reason or "")
end

local function upgrade_request(path, extra)
    return "GET " .. path .. " HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        .. "Connection: Upgrade\r\nSec-WebSocket-Key: " .. KEY .. "\r\n"
        .. "Sec-WebSocket-Version: 13\r\n" .. (extra or "") .. "\r\n"
end

-- Reads one server frame: opcode, payload, fin; or nil and the error.
local function read_frame(s)
    local h, err = s:receive(2)
    if not h then
        return nil, err
    end
    local b0, b1 = byte(h, 1, 2)
    assert(band(b1, 0x80) == 0, "the server masked a frame")
    local n = band(b1, 0x7F)
    if n == 126 then
        local e = assert(s:receive(2))
        n = byte(e, 1) * 256 + byte(e, 2)
    elseif n == 127 then
        local e = assert(s:receive(8))
        n = 0
        for i = 1, 8 do
            n = n * 256 + byte(e, i)
        end
    end
    local payload = n > 0 and assert(s:receive(n)) or ""
    return band(b0, 0x0F), payload, band(b0, 0x80) ~= 0
end

local function close_code(payload)
    if #payload < 2 then
        return nil
    end
    return byte(payload, 1) * 256 + byte(payload, 2), payload:sub(3)
end

describe("WebSocket", function()
    local srv

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/websocket.lua" }
    end)

    teardown(function()
        if srv then
            srv:stop()
        end
    end)

    -- A raw connection upgraded on `path`; returns it and the 101 response.
    local function open(path, extra)
        local s = helper.connect(srv.port)
        assert(s:send(upgrade_request(path, extra)))
        local res = assert(helper.read_response(s, true))
        return s, res
    end

    local function client(case, path)
        return run_client(srv.port, case, path)
    end

    describe("the opening handshake", function()
        it("answers a key with 101 and its Sec-WebSocket-Accept", function()
            local s, res = open("/ws/echo")
            assert.equal(101, res.status)
            assert.equal(ACCEPT, res.headers["sec-websocket-accept"])
            assert.equal("websocket", res.headers.upgrade:lower())
            assert.matches("upgrade", res.headers.connection:lower())
            assert.is_nil(res.headers["sec-websocket-protocol"])
            s:close()
        end)

        it("refuses another version with 426 naming version 13", function()
            local s = helper.connect(srv.port)
            assert(s:send((upgrade_request("/ws/echo"):gsub("Version: 13", "Version: 8"))))
            local res = assert(helper.read_response(s))
            assert.equal(426, res.status)
            assert.equal("13", res.headers["sec-websocket-version"])
            s:close()
        end)

        it("answers a plain GET of an endpoint with 426", function()
            local res = helper.request(srv.port, "GET /ws/echo HTTP/1.1\r\nHost: h\r\n\r\n")
            assert.equal(426, res.status)
            assert.equal("websocket", res.headers.upgrade)
        end)

        it("refuses a key that is not 16 bytes in base64 with 400", function()
            local s = helper.connect(srv.port)
            assert(s:send((upgrade_request("/ws/echo"):gsub(KEY, "c2hvcnQ="))))
            assert.equal(400, assert(helper.read_response(s)).status)
            s:close()
        end)

        it("refuses a cross-site upgrade with 403 unless the endpoint allows its origin", function()
            local s, res = open("/ws/echo", "Origin: https://evil.example\r\n")
            assert.equal(403, res.status)
            s:close()
            s, res = open("/ws/cross", "Origin: https://friend.example\r\n")
            assert.equal(101, res.status)
            s:close()
            s, res = open("/ws/cross", "Origin: https://evil.example\r\n")
            assert.equal(403, res.status)
            s:close()
            -- the server's own origin is let through
            s, res = open("/ws/echo", "Origin: http://127.0.0.1\r\n")
            assert.equal(101, res.status)
            s:close()
        end)

        it("runs the app's middleware before the upgrade", function()
            local t = client("private")
            assert.equal("401", t.status, t._out)
            assert.equal("in", t.echo, t._out)
        end)

        it("takes the first of its own subprotocols that the client offers", function()
            local s, res = open("/ws/echo", "Sec-WebSocket-Protocol: chat.v1, chat.v2\r\n")
            assert.equal("chat.v2", res.headers["sec-websocket-protocol"])
            s:close()
            local t = client("no_protocol")
            assert.equal("None", t.protocol, t._out)
        end)
    end)

    describe("with the websockets library", function()
        it("echoes text, binary, large and fragmented messages and answers pings", function()
            local t = client("echo")
            assert.equal("chat.v2", t.protocol, t._out)
            assert.equal("True", t.text, t._out)
            assert.equal("True", t.binary, t._out)
            assert.equal("True", t.big, t._out)
            assert.equal("fragmented", t.fragmented, t._out)
            assert.equal("yes", t.pong, t._out)
            assert.equal("1000", t.close_code, t._out)
        end)

        it("answers the client's close with its code", function()
            local t = client("client_close")
            assert.equal("4000", t.close_code, t._out)
        end)

        it("echoes the code of a raw close (RFC 6455 5.5.1) and shows code and reason to the handler", function()
            local t = client("raw_close")
            assert.equal("101", t.coded_status, t._out)
            assert.equal("8", t.coded_op, t._out)
            assert.equal("4001", t.coded_code, t._out)
            assert.equal("True", t.coded_eof, t._out)
            -- a close without a code is answered by one without a code; the handler sees 1005
            assert.equal("8", t.empty_op, t._out)
            assert.equal("none", t.empty_code, t._out)
            assert.equal("True", t.empty_eof, t._out)
            assert.truthy(helper.wait_for(function()
                return srv:log():find("closing: the handler saw close 4001 [raw bye \xc3\xa9]", 1, true)
                    and srv:log():find("closing: the handler saw close 1005 []", 1, true)
            end, 5), srv:log())
        end)

        it("closes with the handler's code and reason", function()
            local t = client("server_close")
            assert.equal("3001", t.close_code, t._out)
            assert.equal("going away now", t.close_reason, t._out)
            assert.truthy(helper.wait_for(function()
                return srv:log():find("closer: the peer answered close 3001", 1, true)
            end, 5))
        end)

        it("closes a message over max_message_bytes with 1009", function()
            local t = client("too_big")
            assert.equal("1009", t.close_code, t._out)
        end)

        it("runs callbacks in order, one that waits included, with no coroutine between", function()
            local s, res = open("/ws/cb?x=1", "X-Who: alice\r\n")
            assert.equal(101, res.status)
            local op, payload = read_frame(s)
            assert.equal(1, op)
            assert.equal("welcome", payload)
            assert(s:send(frame(0x81, "sleep") .. frame(0x81, "one") .. frame(0x82, "\0\1")))
            op, payload = read_frame(s)
            assert.equal("sleep", payload)
            assert.equal(1, op)
            op, payload = read_frame(s)
            assert.equal("one", payload)
            assert.equal(1, op)
            op, payload = read_frame(s)
            assert.equal(2, op)
            assert.equal("\0\1", payload)
            assert(s:send(frame(0x88, close_payload(4002, "bye"))))
            op, payload = read_frame(s)
            assert.equal(8, op)
            assert.equal(4002, (close_code(payload)))
            s:close()
            assert.truthy(helper.wait_for(function()
                return srv:log():find("cb open /ws/cb alice", 1, true)
                    and srv:log():find("cb close 4002 [bye]", 1, true)
            end, 5), srv:log())
        end)

        it("keeps what the handler read of req, and refuses the rest once it waited", function()
            local s = open("/ws/late?q=1", "X-Who: bob\r\n")
            assert(s:send(frame(0x81, "go")))
            local _, payload = read_frame(s)
            assert.equal("bob GET /ws/late q=1 false upgraded to a WebSocket", payload)
            s:close()
        end)

        it("gives receive a timeout", function()
            assert.equal("nil timeout", client("timeout").said)
        end)

        it("broadcasts one frame to every socket of a list", function()
            local t = client("room")
            assert.equal("to everyone", t.a_got, t._out)
            assert.equal("to everyone", t.b_got, t._out)
            assert.equal("True", t.a_big, t._out)
            assert.equal("True", t.b_big, t._out)
        end)
    end)

    describe("with raw frames", function()
        -- Sends `bytes` on a fresh socket of `path`; returns the close code the server sent.
        local function close_after(bytes, path)
            local s, res = open(path or "/ws/echo")
            assert.equal(101, res.status)
            assert(s:send(bytes))
            while true do
                local op, payload = read_frame(s)
                if not op then
                    s:close()
                    return nil
                end
                if op == 8 then
                    assert.truthy(helper.closed(s, 5)) -- and the connection ends
                    s:close()
                    return (close_code(payload))
                end
            end
        end

        local protocol_errors = {
            { "an unmasked frame", frame(0x81, "hi", true) },
            { "RSV1 set", frame(0xC1, "hi") },
            { "RSV2 set", frame(0xA1, "hi") },
            { "RSV3 set", frame(0x91, "hi") },
            { "opcode 3", frame(0x83, "hi") },
            { "opcode 11", frame(0x8B, "hi") },
            { "a fragmented ping", frame(0x09, "hi") .. frame(0x80, "hi") },
            { "a ping of 126 bytes", frame(0x89, rep("p", 126)) },
            { "a continuation with no message", frame(0x80, "hi") },
            { "a new message inside a fragmented one", frame(0x01, "a") .. frame(0x81, "b") },
            { "a close of one byte", frame(0x88, "\3") },
        }
        for _, c in ipairs(protocol_errors) do
            it("closes " .. c[1] .. " with 1002", function()
                assert.equal(1002, close_after(c[2]))
            end)
        end

        for _, code in ipairs({ 0, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000 }) do
            it("refuses close code " .. code .. " with 1002", function()
                assert.equal(1002, close_after(frame(0x88, close_payload(code))))
            end)
        end

        it("answers allowed close codes with the same code", function()
            for _, code in ipairs({ 1000, 1001, 1003, 1007, 1011, 3000, 4999 }) do
                assert.equal(code, close_after(frame(0x88, close_payload(code, "ok"))))
            end
        end)

        it("closes a close reason that is not UTF-8 with 1007", function()
            assert.equal(1007, close_after(frame(0x88, close_payload(1000, "\xff\xfe"))))
        end)

        it("closes invalid UTF-8 with 1007 before the message ends", function()
            -- the first fragment already holds a surrogate: no final fragment is needed
            assert.equal(1007, close_after(frame(0x01, "ok \xed\xa0\x80")))
            assert.equal(1007, close_after(frame(0x81, "\xc0\xaf")))
        end)

        it("closes a frame over the cap with 1009 from its head alone", function()
            local head = char(0x82, 0x80 + 127, 0, 0, 0, 1, 0, 0, 0, 0) .. "\1\2\3\4"
            assert.equal(1009, close_after(head))
        end)

        it("reassembles a code point split across fragments, with a ping between", function()
            local s = open("/ws/echo")
            assert(s:send(frame(0x01, "caf\xc3") .. frame(0x89, "mid") .. frame(0x00, "\xa9 \xf0\x9f")
                .. frame(0x80, "\x98\x80")))
            local op, payload = read_frame(s)
            assert.equal(10, op) -- the pong, answered in C between the fragments
            assert.equal("mid", payload)
            op, payload = read_frame(s)
            assert.equal(1, op)
            assert.equal("caf\xc3\xa9 \xf0\x9f\x98\x80", payload)
            s:close()
        end)

        it("reads frames split at every byte", function()
            local s = open("/ws/echo")
            local bytes = frame(0x81, "one byte at a time")
            for i = 1, #bytes do
                assert(s:send(bytes:sub(i, i)))
            end
            local op, payload = read_frame(s)
            assert.equal(1, op)
            assert.equal("one byte at a time", payload)
            s:close()
        end)

        it("shows pings and pongs only to an endpoint that asks for them", function()
            local s = open("/ws/control")
            assert(s:send(frame(0x89, "knock")))
            local op, payload = read_frame(s)
            assert.equal(10, op)
            assert.equal("knock", payload)
            op, payload = read_frame(s)
            assert.equal(1, op)
            assert.equal("ping:knock", payload)
            assert(s:send(frame(0x8A, "unasked")))
            op, payload = read_frame(s)
            assert.equal(1, op)
            assert.equal("pong:unasked", payload)
            s:close()
        end)

        it("closes a reader that does not keep up at send_queue_bytes", function()
            local s = open("/ws/flood")
            -- read nothing: the server's queue fills and it gives up
            assert.truthy(helper.wait_for(function()
                return srv:log():find("flood: stopped after %d+ sends: send queue full")
            end, 20))
            assert.matches("WebSocket closed with 1008", srv:log())
            s:close()
        end)
    end)

    describe("permessage-deflate", function()
        local OFFER = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"

        it("is agreed without context takeover either way, and shown as ws.extensions", function()
            local s, res = open("/ws/ext", OFFER)
            local want = "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
            assert.equal(want, res.headers["sec-websocket-extensions"])
            local h = assert(s:receive(2))
            assert.equal(0xC1, byte(h, 1)) -- what it says is compressed: the library reads it
            s:close()
            local t = client("deflate")
            assert.equal("extensions=" .. want .. " protocol=", t.agreed, t._out)
        end)

        it("compresses what the server sends, with RSV1 on the frame", function()
            local s = open("/ws/ext", OFFER)
            read_frame(s)
            assert(s:send(frame(0x81, rep("compress me ", 100))))
            local h = assert(s:receive(2))
            assert.equal(0xC1, byte(h, 1)) -- FIN, RSV1, text
            local n = byte(h, 2)
            assert.truthy(n < 100, "1200 bytes of repeats went as " .. n)
            assert(s:receive(n))
            -- a short message goes as it is
            assert(s:send(frame(0x81, "hi")))
            h = assert(s:receive(4))
            assert.equal("\x81\x02hi", h)
            s:close()
        end)

        it("is not agreed with an endpoint that turns it off, or for a window it cannot use", function()
            local s, res = open("/ws/plain", OFFER)
            assert.equal(101, res.status)
            assert.is_nil(res.headers["sec-websocket-extensions"])
            assert.equal("extensions= protocol=", select(2, read_frame(s)))
            s:close()
            s, res = open("/ws/ext", "Sec-WebSocket-Extensions: permessage-deflate; "
                .. "server_max_window_bits=8, permessage-deflate; server_max_window_bits=10\r\n")
            assert.equal("permessage-deflate; server_no_context_takeover; "
                .. "client_no_context_takeover; server_max_window_bits=10",
                res.headers["sec-websocket-extensions"])
            s:close()
            s, res = open("/ws/ext", "Sec-WebSocket-Extensions: permessage-deflate; bogus\r\n")
            assert.is_nil(res.headers["sec-websocket-extensions"])
            s:close()
        end)

        it("refuses RSV1 when it was not agreed", function()
            assert.equal(1002, (function()
                local s = open("/ws/plain", OFFER)
                read_frame(s)
                assert(s:send(frame(0xC1, "x")))
                local op, payload = read_frame(s)
                s:close()
                return op == 8 and close_code(payload)
            end)())
        end)

        it("echoes compressed messages with the websockets library", function()
            local t = client("deflate")
            assert.matches("^permessage%-deflate", t.extensions, t._out)
            for i = 0, 2 do
                assert.equal("True", t["echo" .. i], t._out)
            end
            assert.equal("True", t.binary, t._out)
        end)

        describe("with context takeover (deflate = { context_takeover = true })", function()
            it("keeps each side's context across messages, so a repeat goes in a few bytes",
                function()
                    local t = client("kept_raw")
                    assert.equal("permessage-deflate", t.extensions, t._out)
                    assert.equal("True", t.echoes, t._out)
                    for i = 0, 2 do
                        assert.equal("True", t["rsv1_" .. i], t._out)
                    end
                    -- ours: the second echo refers to the first
                    assert.truthy(tonumber(t.got1) * 3 < tonumber(t.got0), t._out)
                    assert.truthy(tonumber(t.got2) <= tonumber(t.got1), t._out)
                    -- theirs: inflated with the context of the messages before
                    assert.truthy(tonumber(t.sent1) * 3 < tonumber(t.sent0), t._out)
                end)

            it("echoes the websockets library's messages, kept and in a window of 1 KiB",
                function()
                    local t = client("kept")
                    assert.equal("permessage-deflate", t.extensions, t._out)
                    assert.equal("True", t.echoes, t._out)
                    assert.equal("True", t.binary, t._out)
                    t = client("kept", "kept-small")
                    assert.equal("permessage-deflate; client_max_window_bits=10", t.extensions,
                        t._out)
                    assert.equal("True", t.echoes, t._out)
                    assert.equal("True", t.binary, t._out)
                end)

            it("leaves a side's context out when the client asks, and holds windows to the endpoint's",
                function()
                    local cases = {
                        { "/ws/kept", "permessage-deflate; server_no_context_takeover",
                            "permessage-deflate; server_no_context_takeover" },
                        { "/ws/kept", "permessage-deflate; client_no_context_takeover",
                            "permessage-deflate; client_no_context_takeover" },
                        { "/ws/kept", "permessage-deflate", "permessage-deflate" },
                        { "/ws/kept-small", "permessage-deflate",
                            "permessage-deflate" }, -- (no client_max_window_bits offered)
                        { "/ws/kept-small", "permessage-deflate; client_max_window_bits=12; "
                            .. "server_max_window_bits=14",
                            "permessage-deflate; server_max_window_bits=10; "
                            .. "client_max_window_bits=10" },
                        { "/ws/kept-small", "permessage-deflate; client_max_window_bits=8",
                            "permessage-deflate; client_max_window_bits=8" },
                        { "/ws/ext", "permessage-deflate; client_max_window_bits=9",
                            "permessage-deflate; server_no_context_takeover; "
                            .. "client_no_context_takeover" },
                    }
                    for _, c in ipairs(cases) do
                        local s, res = open(c[1], "Sec-WebSocket-Extensions: " .. c[2] .. "\r\n")
                        assert.equal(101, res.status)
                        assert.equal(c[3], res.headers["sec-websocket-extensions"], c[2])
                        assert.equal(1, (read_frame(s))) -- the endpoint's text (compressed or not)
                        s:close()
                    end
                end)

            it("refuses an endpoint's bad deflate options when the app is made", function()
                local moonserve = require "moonserve"
                local app = moonserve.app()
                local function endpoint(deflate)
                    return function() app:websocket("/x", function() end, { deflate = deflate }) end
                end
                assert.has_error(endpoint("yes"),
                    "bad deflate for websocket /x (boolean or table expected)")
                assert.has_error(endpoint({ context_takeover = 1 }),
                    "bad deflate.context_takeover for websocket /x (boolean expected)")
                assert.has_error(endpoint({ window_bits = 8 }),
                    "bad deflate.window_bits for websocket /x (integer from 9 to 15 expected)")
                assert.has_error(endpoint({ mem_level = 10 }),
                    "bad deflate.mem_level for websocket /x (integer from 1 to 9 expected)")
                assert.has_error(endpoint({ takeover = true }),
                    "unknown deflate option takeover for websocket /x")
            end)
        end)

        it("takes a message of max_message_bytes whose compressed frame is larger", function()
            local t = client("big_deflated")
            assert.matches("permessage%-deflate", t.extensions, nil, t._out)
            assert.equal(t.want, t.echo, t._out) -- 1 MiB of noise, in a frame a little over it
            assert.equal("1009", t.close_code, t._out) -- one byte more, inflated, is over
            assert.matches("WebSocket closed with 1009: message over the size cap as it inflates",
                srv:log())
        end)

        it("stops a decompression bomb at max_message_bytes as it inflates (1009)", function()
            local t = client("deflate_bomb")
            assert.equal("True", t.extension, t._out)
            assert.truthy(tonumber(t.compressed_bytes) < 65536, t._out)
            assert.equal("1009", t.close, t._out)
            assert.matches("WebSocket closed with 1009: message over the size cap as it inflates",
                srv:log())
        end)
    end)

    describe("floods of frames that carry nothing", function()
        it("closes a message of more fragments than websocket_fragments with 1008", function()
            local t = client("flood", "fragments")
            assert.equal("101", t.status, t._out)
            assert.equal("1008", t.close, t._out)
            assert.equal("too many fragments in one message", t.reason, t._out)
            assert.matches("WebSocket closed with 1008: too many fragments in one message",
                srv:log())
        end)

        it("closes a peer over websocket_control_rate pings a second with 1008", function()
            local t = client("flood", "pings")
            assert.equal("1008", t.close, t._out)
            assert.equal("too many control frames a second", t.reason, t._out)
            assert.truthy(tonumber(t.pongs) <= 100, t._out) -- the default: 100 a second
        end)
    end)

    describe("keep-alive", function()
        it("pings a quiet peer and closes one that does not answer with 1011", function()
            local s = open("/ws/pinger")
            local op = read_frame(s)
            assert.equal(9, op) -- the ping, after ping_interval
            local payload
            op, payload = read_frame(s)
            assert.equal(8, op)
            assert.equal(1011, (close_code(payload)))
            s:close()
        end)

        it("keeps a peer that answers its pings", function()
            local s = open("/ws/pinger")
            for _ = 1, 3 do
                local op, payload = read_frame(s)
                assert.equal(9, op)
                assert(s:send(frame(0x8A, payload)))
            end
            assert(s:send(frame(0x81, "still here")))
            local op, payload = read_frame(s)
            assert.equal(1, op)
            assert.equal("still here", payload)
            s:close()
        end)

        it("closes a socket with no message for idle_timeout with 1001", function()
            local s = open("/ws/idle")
            local op, payload = read_frame(s)
            assert.equal(8, op)
            assert.equal(1001, (close_code(payload)))
            s:close()
        end)
    end)

    describe("over HTTP/2", function()
        it("takes extended CONNECT on a stream, beside other streams", function()
            local t = client("h2")
            assert.equal("1", t.enable_connect_protocol, t._out)
            assert.equal("200", t.status, t._out)
            assert.equal("chat.v1", t.protocol, t._out)
            assert.equal("über h2", t.echo, t._out)
            assert.equal("1002", t.other_close, t._out)
            assert.equal("hi", t.pong, t._out)
            assert.equal("1000", t.close, t._out)
            assert.equal("200", t.own_origin_status, t._out)
            assert.equal("403", t.cross_status, t._out)
            assert.equal("welcome cb over h2", t.cb, t._out)
        end)

        it("takes it over TLS with h2 chosen by ALPN, as a browser opens one", function()
            local t = over_tls("spec/fixtures/websocket.lua", function(port, ca)
                return run_client(port, "h2", nil, ca)
            end)
            local out = t._out
            assert.equal("h2", t.alpn, out)
            assert.equal("1", t.enable_connect_protocol, out)
            assert.equal("200", t.status, out)
            assert.equal("über h2", t.echo, out)
            assert.equal("1002", t.other_close, out)
            assert.equal("1000", t.close, out)
            assert.equal("200", t.own_origin_status, out)
            assert.equal("403", t.cross_status, out)
        end)
    end)

    describe("behind sessions and moonserve.csrf with form tokens", function()
        -- A browser over TLS opens its WebSocket with HTTP/2's extended CONNECT, not GET.
        local function h2_csrf(port, ca)
            local t = run_client(port, "h2_csrf", nil, ca)
            local out = t._out
            assert.equal("200", t.app_status, out)
            assert.equal("hello app", t.app_echo, out)
            assert.equal("200", t.mounted_status, out) -- a mounted app's socket too
            assert.equal("hello mounted", t.mounted_echo, out)
            assert.equal("403", t.cross_status, out) -- the handshake's origin check
            return t
        end

        it("takes an HTTP/2 WebSocket (extended CONNECT) over h2c", function()
            local srv2 = helper.spawn_server { app = "spec/fixtures/ws_csrf.lua" }
            local ok, err = pcall(h2_csrf, srv2.port)
            srv2:stop()
            assert(ok, err)
        end)

        it("takes it over TLS, where browsers use it", function()
            local t = over_tls("spec/fixtures/ws_csrf.lua", h2_csrf)
            assert.equal("h2", t.alpn)
        end)
    end)

    describe("under the websockets limit", function()
        it("refuses an upgrade past it with 503 and does not count sockets in in_flight", function()
            local small = helper.spawn_server { app = "spec/fixtures/websocket.lua",
                args = "--limit websockets=1 --limit in_flight=1" }
            local a = helper.connect(small.port)
            assert(a:send(upgrade_request("/ws/echo")))
            assert.equal(101, assert(helper.read_response(a, true)).status)
            local b = helper.connect(small.port)
            assert(b:send(upgrade_request("/ws/echo")))
            local res = assert(helper.read_response(b))
            assert.equal(503, res.status)
            assert.equal("1", res.headers["retry-after"])
            b:close()
            -- the open WebSocket holds no request slot: a plain request is served
            res = helper.request(small.port, "GET /ws/count HTTP/1.1\r\nHost: h\r\n\r\n")
            assert.equal(200, res.status)
            assert(a:send(frame(0x81, "still")))
            local _, payload = read_frame(a)
            assert.equal("still", payload)
            a:close()
            -- once it is gone, another may open
            assert.truthy(helper.wait_for(function()
                local c = helper.connect(small.port)
                c:send(upgrade_request("/ws/echo"))
                local r = helper.read_response(c, true)
                c:close()
                return r and r.status == 101
            end, 5))
            small:stop()
        end)
    end)

    describe("when the server stops", function()
        it("closes every WebSocket with 1001 on HUP, and the new worker takes new ones", function()
            local m = helper.spawn_server { app = "spec/fixtures/websocket.lua",
                args = "--workers 1" }
            assert.truthy(helper.wait_for(function() return #helper.children(m.pid) == 1 end))
            local s = helper.connect(m.port)
            assert(s:send(upgrade_request("/ws/wait")))
            assert.equal(101, assert(helper.read_response(s, true)).status)
            assert.equal("waiting", select(2, read_frame(s)))
            os.execute("kill -HUP " .. m.pid)
            local op, payload = read_frame(s)
            assert.equal(8, op)
            assert.equal(1001, (close_code(payload)))
            assert(s:send(frame(0x88, close_payload(1001))))
            assert.truthy(helper.closed(s, 5))
            s:close()
            assert.truthy(helper.wait_for(function()
                return m:log():find("wait: close 1001", 1, true)
            end, 5))
            local s2, res = nil, nil
            assert.truthy(helper.wait_for(function()
                s2 = helper.connect(m.port)
                s2:send(upgrade_request("/ws/echo"))
                res = helper.read_response(s2, true)
                if res and res.status == 101 then
                    return true
                end
                s2:close()
            end, 5))
            assert(s2:send(frame(0x81, "new worker")))
            assert.equal("new worker", select(2, read_frame(s2)))
            s2:close()
            assert.is_true(m:stop())
        end)

        it("closes every WebSocket with 1001", function()
            local out = os.tmpname()
            local pid = helper.background("sh -c " .. q("exec " .. q(helper.tool("websockets"))
                .. " " .. q(helper.root .. "/spec/it/ws_client.py") .. " " .. srv.port
                .. " wait_stop >" .. q(out) .. " 2>&1"))
            assert.truthy(helper.wait_for(function()
                return helper.read_file(out):find("said=waiting", 1, true)
            end, 10))
            assert.truthy(srv:stop())
            assert.truthy(helper.wait_for(function()
                return helper.read_file(out):find("close_code=1001", 1, true)
            end, 10), helper.read_file(out))
            helper.stop_pid(pid)
            os.remove(out)
            srv = nil
        end)
    end)
end)
