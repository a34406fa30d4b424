-- spec/it/tls_client_spec.lua: sock:sslhandshake from handlers of a real server, against
-- openssl s_server peers and a moonserve TLS listener on loopback. A test CA, a second CA
-- nobody trusts, and their certificates are made here, in a temporary directory; the server
-- trusts the test CA through ssl_trusted_certificate.
local helper = require "helper"

local q = helper.sh_quote
local free_port, start, stop, wait_port = helper.free_port, helper.background, helper.stop_pid,
    helper.wait_port

-- A peer that accepts and never says a word.
local SILENT = [[
local socket = require "socket"
local s = assert(socket.bind("127.0.0.1", tonumber(arg[1])))
local held = {}
while true do held[#held + 1] = s:accept() end
]]

describe("TLS on client sockets (sock:sslhandshake)", function()
    local dir, srv, pids = nil, nil, {}
    local ports = {}

    local function openssl(args)
        return helper.sh(helper.tool("openssl") .. " " .. args .. " 2>&1")
    end

    local function ca(name, cn)
        openssl(string.format("req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
            .. "-keyout %s -out %s -days 2 -subj %s -addext basicConstraints=critical,CA:TRUE "
            .. "-addext keyUsage=critical,keyCertSign", q(dir .. "/" .. name .. ".key"),
            q(dir .. "/" .. name .. ".pem"), q("/CN=" .. cn)))
    end

    -- A certificate for `cn` signed by the CA `by` (nil: self-signed): name.pem, name.key.
    local function leaf(name, cn, sans, by)
        local f = dir .. "/" .. name
        if not by then
            openssl(string.format("req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
                .. "-keyout %s -out %s -days 2 -subj %s -addext subjectAltName=%s", q(f .. ".key"),
                q(f .. ".pem"), q("/CN=" .. cn), sans))
            return
        end
        openssl(string.format("req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
            .. "-keyout %s -out %s -subj %s", q(f .. ".key"), q(f .. ".csr"), q("/CN=" .. cn)))
        helper.write_file(f .. ".ext", "subjectAltName=" .. sans .. "\n")
        openssl(string.format("x509 -req -in %s -CA %s -CAkey %s -CAcreateserial -days 2 "
            .. "-extfile %s -out %s", q(f .. ".csr"), q(dir .. "/" .. by .. ".pem"),
            q(dir .. "/" .. by .. ".key"), q(f .. ".ext"), q(f .. ".pem")))
    end

    local function s_server(name, args)
        local port = free_port()
        pids[#pids + 1] = start(string.format("%s s_server -accept 127.0.0.1:%d -www %s </dev/null",
            helper.tool("openssl"), port, args))
        wait_port(port)
        ports[name] = port
    end

    setup(function()
        dir = os.tmpname()
        os.remove(dir)
        helper.sh("mkdir -p " .. q(dir))
        ca("ca", "moonserve test CA")
        ca("other", "a CA nobody trusts")
        leaf("leaf", "localhost", "DNS:localhost", "ca")
        leaf("client", "moonserve client", "DNS:client", "ca")
        leaf("foreign", "localhost", "DNS:localhost", "other")
        leaf("rogue", "localhost", "DNS:localhost", nil)
        local cert = string.format("-cert %s -key %s", q(dir .. "/leaf.pem"), q(dir .. "/leaf.key"))
        s_server("good", cert)
        s_server("rogue", string.format("-cert %s -key %s", q(dir .. "/rogue.pem"),
            q(dir .. "/rogue.key")))
        s_server("foreign", string.format("-cert %s -key %s", q(dir .. "/foreign.pem"),
            q(dir .. "/foreign.key")))
        -- Refuses (fatally) every name but sni.test: a handshake that names it proves the SNI.
        s_server("sni", cert .. " -servername sni.test -servername_fatal " .. string.format(
            "-cert2 %s -key2 %s", q(dir .. "/leaf.pem"), q(dir .. "/leaf.key")))
        -- Wants a client certificate of the test CA.
        s_server("mutual", cert .. " -Verify 1 -CAfile " .. q(dir .. "/ca.pem"))
        -- Peers that echo lines (reversed) on connections they keep, many at once, for the
        -- pool: the self-signed one, and one that wants a client certificate of the test CA.
        local function keeper(name, args)
            local port = free_port()
            pids[#pids + 1] = start(string.format("%s %s %d %s", helper.tool("ssl"),
                q(helper.root .. "/spec/fixtures/tls_echo.py"), port, args))
            wait_port(port)
            ports[name] = port
        end
        keeper("rogue_keep", q(dir .. "/rogue.pem") .. " " .. q(dir .. "/rogue.key"))
        keeper("mutual_keep", q(dir .. "/leaf.pem") .. " " .. q(dir .. "/leaf.key") .. " "
            .. q(dir .. "/ca.pem"))
        ports.redis = free_port()
        pids[#pids + 1] = start(string.format("%s --port 0 --tls-port %d --bind 127.0.0.1 "
            .. "--tls-cert-file %s --tls-key-file %s --tls-ca-cert-file %s --tls-auth-clients no "
            .. "--save '' --appendonly no --daemonize no", helper.tool("redis-server"), ports.redis,
            q(dir .. "/leaf.pem"), q(dir .. "/leaf.key"), q(dir .. "/ca.pem")))
        wait_port(ports.redis)
        local script = dir .. "/silent.lua"
        helper.write_file(script, SILENT)
        ports.silent = free_port()
        pids[#pids + 1] = start(string.format("%s %s %d", helper.tool("luajit"), q(script),
            ports.silent))
        wait_port(ports.silent)
        srv = helper.spawn_server { app = "spec/fixtures/tls_client.lua",
            env = { MOONSERVE_TLS_DIR = dir },
            args = string.format("--listen 127.0.0.1:0 --tls-cert %s --tls-key %s "
                .. "--ssl-trusted-certificate %s", q(dir .. "/leaf.pem"), q(dir .. "/leaf.key"),
                q(dir .. "/ca.pem")) }
        ports.listener = srv.ports[2]
    end)

    teardown(function()
        if srv then
            srv:stop()
        end
        for _, pid in ipairs(pids) do
            stop(pid)
        end
        if dir then
            helper.sh("rm -rf " .. q(dir))
        end
    end)

    local function get(path)
        local res = assert(helper.request(srv.port, "GET " .. path .. " HTTP/1.1\r\nHost: t\r\n\r\n"))
        assert.equal(200, res.status, res.body)
        return res.body
    end

    local twice = helper.twice(it)

    twice("accepts a certificate of the CA named by ssl_trusted_certificate, and reads over it",
        function()
            assert.matches("^ok cdata TLSv1%.3 New, TLSv1%.3, Cipher is ",
                get("/get?port=" .. ports.good .. "&name=localhost"))
            assert.matches("^ok cdata TLSv1%.3 HTTP/1%.1 200 OK",
                get("/get?port=" .. ports.listener .. "&name=localhost"))
        end)

    twice("refuses a self-signed certificate and one of an untrusted CA, as OpenResty words it",
        function()
            assert.equal("fail handshake: 18: self-signed certificate",
                get("/get?port=" .. ports.rogue .. "&name=localhost"))
            assert.equal("fail handshake: 20: unable to get local issuer certificate",
                get("/get?port=" .. ports.foreign .. "&name=localhost"))
        end)

    twice("refuses a trusted certificate for another name: certificate host mismatch", function()
        assert.equal("fail handshake: certificate host mismatch",
            get("/get?port=" .. ports.good .. "&name=other.test"))
        assert.equal("fail handshake: certificate host mismatch",
            get("/get?port=" .. ports.listener .. "&name=127.0.0.1"))
    end)

    twice("verify = false accepts an untrusted certificate and a wrong name", function()
        assert.matches("^ok cdata TLSv1%.3 New, ",
            get("/get?port=" .. ports.rogue .. "&name=other.test&verify=0"))
    end)

    twice("sends the server name as SNI (the peer refuses every other name)", function()
        assert.matches("^ok cdata TLSv1%.3 New, ", get("/get?port=" .. ports.sni .. "&name=sni.test&verify=0"))
        assert.equal("fail handshake: handshake failed",
            get("/get?port=" .. ports.sni .. "&name=other.test&verify=0"))
    end)

    twice("resumes the session the first handshake returned (both sides say so)", function()
        assert.equal("false New, true Reused", get("/resume?port=" .. ports.good))
        assert.equal("false hello over https, true hello over https",
            get("/resume?port=" .. ports.listener))
    end)

    it("keeps a pooled connection's TLS: reused, it needs no new handshake", function()
        -- Three rounds a request, on one connection: the second request's come from the pool
        -- the first left it in.
        local first
        for run = 1, 2 do
            local body = get("/pool?port=" .. ports.listener)
            local a, b, c = body:match("^(%d+) hello over https, (%d+) hello over https, "
                .. "(%d+) hello over https$")
            assert.is_truthy(a, body)
            a, b, c = tonumber(a), tonumber(b), tonumber(c)
            assert.same({ a + 1, a + 2 }, { b, c })
            if run == 1 then
                first = a
            else
                assert.equal(first + 3, a)
            end
        end
    end)

    describe("a pooled TLS connection goes only to a handshake of the same wishes", function()
        local round = 0
        local function mix(port, a, b, ngx)
            round = round + 1
            local function wish(i, w)
                return string.format("&name%d=%s&verify%d=%s%s", i, w.name, i, w.verify,
                    w.cert and string.format("&cert%d=%s", i, w.cert) or "")
            end
            return get("/mix?round=" .. round .. "&port=" .. port .. wish(1, a) .. wish(2, b)
                .. (ngx and "&ngx=1" or ""))
        end
        local unverified = { name = "localhost", verify = "0" }
        local bank = { name = "bank.example", verify = "1" }

        twice("a connection made with verify off is not handed, \"verified\", to a handshake "
            .. "that verifies another name: that one gets a new connection, and fails as a new "
            .. "one does", function()
            assert.equal("0 0 ok olleh, 1 fail 18: self-signed certificate",
                mix(ports.rogue_keep, unverified, bank))
            -- the same on the ngx layer's sockets (OpenResty's hand it over: docs/ngx.md)
            assert.equal("0 0 ok olleh, 1 fail 18: self-signed certificate",
                mix(ports.rogue_keep, unverified, bank, true))
            -- another name, verification off both times: another connection too
            assert.equal("0 0 ok olleh, 1 0 ok olleh",
                mix(ports.rogue_keep, unverified, { name = "other.test", verify = "0" }))
        end)

        twice("the same wishes reuse it, with no new handshake", function()
            assert.equal("0 0 ok olleh, 1 1 ok olleh",
                mix(ports.rogue_keep, unverified, unverified))
            local mutual = { name = "localhost", verify = "1", cert = "client" }
            assert.equal("0 0 ok olleh, 1 1 ok olleh", mix(ports.mutual_keep, mutual, mutual))
        end)

        twice("a connection that presented a client certificate is not handed to a socket "
            .. "without one, nor with another", function()
            local mutual = { name = "localhost", verify = "1", cert = "client" }
            -- (TLS 1.3: the peer's refusal of a client without a certificate ends the first
            -- read)
            assert.matches("^0 0 ok olleh, 1 0 ok fail read ",
                mix(ports.mutual_keep, mutual, { name = "localhost", verify = "1" }))
            assert.equal("0 0 ok olleh, 1 0 ok olleh", mix(ports.mutual_keep, mutual,
                { name = "localhost", verify = "1", cert = "leaf" }))
        end)
    end)

    it("speaks RESP to Redis over TLS, verified, on a pooled connection", function()
        local body = get("/redis?port=" .. ports.redis .. "&key=tls")
        assert.equal("0 :1, 1 :2", body)
        body = get("/redis?port=" .. ports.redis .. "&key=tls")
        assert.equal("2 :3, 3 :4", body)
    end)

    it("presents a client certificate given to setclientcert; without one the peer refuses",
        function()
            assert.matches("^ok cdata TLSv1%.3 New, ",
                get("/get?port=" .. ports.mutual .. "&name=localhost&cert=client"))
            -- TLS 1.3 asks for it after the client's Finished: the refusal ends the first read.
            assert.matches("^fail ", get("/get?port=" .. ports.mutual .. "&name=localhost"))
        end)

    it("ends a handshake with a peer that never answers at the connect timeout", function()
        local body = get("/stall?port=" .. ports.silent .. "&timeout=500")
        local secs = tonumber(body:match("^handshake: timeout ([%d.]+)$"))
        assert.is_truthy(secs, body)
        assert.is_true(secs >= 0.45 and secs < 2, body)
    end)

    it("raises on misuse, and answers closed on a socket that is not connected", function()
        local body = get("/args")
        assert.matches("bad argument #1 to 'sslhandshake' (a session from sslhandshake, nil or "
            .. "false expected)|", body, 1, true)
        assert.matches("bad argument #2 to 'sslhandshake' (string expected)|", body, 1, true)
        assert.matches("bad argument #3 to 'sslhandshake' (boolean expected)|", body, 1, true)
        assert.matches("bad argument #2 to 'setclientcert' (PEM text expected)|nil|closed",
            body, 1, true)
    end)

    twice("the ngx layer's ngx.socket.tcp() verifies only when asked, as OpenResty", function()
        assert.equal("ok cdata", get("/ngx?port=" .. ports.rogue .. "&name=localhost"))
        assert.equal("fail handshake: 18: self-signed certificate",
            get("/ngx?port=" .. ports.rogue .. "&name=localhost&verify=1"))
    end)
end)
