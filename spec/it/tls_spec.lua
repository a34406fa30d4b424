-- spec/it/tls_spec.lua: TLS listeners on a real server, against real clients (curl, nghttp,
-- h2load, openssl s_client). A test CA and its certificates (RSA and ECDSA P-256 for
-- localhost, ECDSA for a site and for a wildcard) are made here, in a temporary directory.
local helper = require "helper"
local socket = require "socket"

local q = helper.sh_quote

describe("TLS listeners", function()
    local dir, srv, strict, tls_port, plain_port, strict_port, redirect_port
    local blob -- a static file, byte for byte

    local function openssl(args)
        return helper.sh(helper.tool("openssl") .. " " .. args .. " 2>&1")
    end

    -- A certificate signed by the test CA: name.pem and name.key in `dir`.
    local function leaf(name, cn, sans, rsa)
        local key = rsa and "-newkey rsa:2048" or "-newkey ec -pkeyopt ec_paramgen_curve:P-256"
        openssl(string.format("req -new %s -nodes -keyout %s -out %s -subj %s", key,
            q(dir .. "/" .. name .. ".key"), q(dir .. "/" .. name .. ".csr"), q("/CN=" .. cn)))
        helper.write_file(dir .. "/" .. name .. ".ext", "subjectAltName=" .. sans .. "\n")
        openssl(string.format("x509 -req -in %s -CA %s -CAkey %s -CAcreateserial -days 2 "
            .. "-extfile %s -out %s", q(dir .. "/" .. name .. ".csr"), q(dir .. "/ca.pem"),
            q(dir .. "/ca.key"), q(dir .. "/" .. name .. ".ext"), q(dir .. "/" .. name .. ".pem")))
    end

    setup(function()
        dir = os.tmpname()
        os.remove(dir)
        helper.sh("mkdir -p " .. q(dir .. "/files"))
        openssl(string.format("req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
            .. "-keyout %s -out %s -days 2 -subj '/CN=moonserve test CA' "
            .. "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign",
            q(dir .. "/ca.key"), q(dir .. "/ca.pem")))
        leaf("rsa", "localhost RSA", "DNS:localhost", true)
        leaf("ec", "localhost ECDSA", "DNS:localhost", false)
        leaf("site", "example.com", "DNS:example.com", false)
        leaf("wild", "*.wild.test", "DNS:*.wild.test", false)
        local parts = {}
        for i = 1, 70000 do
            parts[i] = string.char(i % 251, (i * 7) % 256, 10 + i % 13)
        end
        blob = table.concat(parts) .. "tail" -- 210,004 bytes, several records
        helper.write_file(dir .. "/files/blob.bin", blob)
        helper.write_file(dir .. "/files/big.bin", string.rep(blob, 30)) -- 6 MiB
        local certs = string.format("--tls-cert %s --tls-key %s --tls-cert %s --tls-key %s",
            q(dir .. "/rsa.pem"), q(dir .. "/rsa.key"), q(dir .. "/ec.pem"), q(dir .. "/ec.key"))
        local env = { MOONSERVE_TLS_DIR = dir }
        srv = helper.spawn_server { app = "spec/fixtures/tls.lua", env = env,
            args = "--listen 127.0.0.1:0 " .. certs .. " --listen 127.0.0.1:0 --redirect-https 8443" }
        plain_port, tls_port, redirect_port = srv.ports[1], srv.ports[2], srv.ports[3]
        -- The strict one: unknown names refused, a short handshake deadline, few per source.
        strict = helper.spawn_server { app = "spec/fixtures/tls.lua", env = env,
            args = "--listen 127.0.0.1:0 " .. certs .. " --tls-unknown-name refuse "
                .. "--limit handshake_timeout=1 --limit per_source=4" }
        strict_port = strict.ports[2]
    end)

    teardown(function()
        if srv then
            srv:stop()
        end
        if strict then
            strict:stop()
        end
        if dir then
            helper.sh("rm -rf " .. q(dir))
        end
    end)

    local function curl(args, port)
        return helper.curl(string.format("--cacert %s --resolve localhost:%d:127.0.0.1 %s",
            q(dir .. "/ca.pem"), port or tls_port, args))
    end

    local function url(path, port)
        return q(string.format("https://localhost:%d%s", port or tls_port, path))
    end

    -- openssl s_client's report of a handshake with `args`.
    local function s_client(args, port)
        local out = helper.run(string.format("%s s_client -connect 127.0.0.1:%d %s </dev/null 2>&1",
            helper.tool("openssl"), port or tls_port, args))
        return out
    end

    it("serves HTTP/1.1 over TLS 1.2 and TLS 1.3, verified against the test CA", function()
        local out = curl("-v --http1.1 --tlsv1.2 --tls-max 1.2 " .. url("/hello"))
        assert.matches("SSL connection using TLSv1.2", out, 1, true)
        assert.matches("hello over https", out, 1, true)
        out = curl("-v --http1.1 --tlsv1.3 " .. url("/hello"))
        assert.matches("SSL connection using TLSv1.3", out, 1, true)
        assert.matches("hello over https", out, 1, true)
    end)

    it("negotiates h2 by ALPN with curl and nghttp, http/1.1 for a client that asks", function()
        assert.equal("https TLSv1.3 2 2",
            curl("--http2 -w ' %{http_version}' " .. url("/scheme")))
        assert.equal("https TLSv1.3 1.1", curl("--http1.1 " .. url("/scheme")))
        local out = helper.run(string.format("%s -v https://127.0.0.1:%d/scheme 2>&1",
            helper.tool("nghttp"), tls_port))
        assert.matches("The negotiated protocol: h2", out, 1, true)
        assert.matches("https TLSv1.3 2", out, 1, true)
    end)

    it("runs h2load over TLS with no failed request", function()
        local out = helper.run(string.format("%s -n 3000 -c 8 -m 16 https://127.0.0.1:%d/hello 2>&1",
            helper.tool("h2load"), tls_port))
        assert.matches("Protocol: TLSv1.3", out, 1, true)
        assert.matches("3000 succeeded, 0 failed, 0 errored, 0 timeout", out, 1, true)
        out = helper.run(string.format("%s --h1 -n 2000 -c 4 https://127.0.0.1:%d/hello 2>&1",
            helper.tool("h2load"), tls_port))
        assert.matches("2000 succeeded, 0 failed, 0 errored, 0 timeout", out, 1, true)
    end)

    it("serves a static file byte for byte over TLS on HTTP/1.1 and h2", function()
        for _, v in ipairs({ "--http1.1", "--http2" }) do
            local file = dir .. "/got" .. v
            curl(v .. " -o " .. q(file) .. " " .. url("/files/blob.bin"))
            assert.equal(#blob, #helper.read_file(file))
            assert.is_true(helper.read_file(file) == blob, v)
        end
        -- A client slower than the server: the socket fills, and parts wait for it. (HTTP/1.1
        -- only: curl 7.88 with --limit-rate on HTTP/2 stops reading now and then, and the
        -- server rightly closes at send_timeout; plain h2 does the same.)
        local file = dir .. "/got-big"
        curl("--http1.1 --limit-rate 20M -o " .. q(file) .. " " .. url("/files/big.bin"))
        local got = helper.read_file(file)
        assert.equal(#blob * 30, #got)
        assert.is_true(got == string.rep(blob, 30))
    end)

    it("says https and sends HSTS over TLS only, and sets a Secure session cookie", function()
        local out = curl("-i --http1.1 " .. url("/login"))
        assert.matches("strict%-transport%-security: max%-age=31536000", out)
        assert.matches("set%-cookie: session=[^\r\n]*; Secure", out)
        out = helper.curl(string.format("-i http://127.0.0.1:%d/login", plain_port))
        assert.not_matches("strict%-transport%-security", out)
        assert.matches("set%-cookie: session=", out)
        assert.not_matches("Secure", out)
        assert.equal("http false 1.1",
            helper.curl(string.format("http://127.0.0.1:%d/scheme", plain_port)))
    end)

    it("sends every request on a redirecting listener to https, with no handler run", function()
        local out = helper.curl(string.format("-i -H 'Host: example.com:80' "
            .. "'http://127.0.0.1:%d/login?next=%%2Fa'", redirect_port))
        assert.matches("^HTTP/1.1 308 Permanent Redirect\r\n", out)
        assert.matches("\r\nlocation: https://example.com:8443/login%?next=%%2Fa\r\n", out)
        assert.not_matches("set%-cookie", out) -- (/login sets one: it did not run)
        out = helper.curl(string.format("-i --http2-prior-knowledge -H 'Host: [::1]:80' "
            .. "http://127.0.0.1:%d/x", redirect_port))
        assert.matches("^HTTP/2 308", out)
        assert.matches("\r\nlocation: https://%[::1%]:8443/x\r\n", out)
    end)

    it("chooses the certificate by SNI: a site's, a wildcard's, the default", function()
        assert.matches("subject=CN = example.com", s_client("-servername example.com"), 1, true)
        assert.matches("subject=CN = *.wild.test", s_client("-servername a.wild.test"), 1, true)
        assert.matches("subject=CN = localhost", s_client("-servername localhost"), 1, true)
        assert.matches("subject=CN = localhost", s_client("-servername other.test"), 1, true)
        assert.matches("subject=CN = localhost", s_client("-noservername"), 1, true)
        -- The name chooses the site as well as the certificate.
        assert.equal("site example.com", helper.curl(string.format("--cacert %s --resolve "
            .. "example.com:%d:127.0.0.1 https://example.com:%d/hello", q(dir .. "/ca.pem"),
            tls_port, tls_port)))
        assert.equal("site b.wild.test:" .. tls_port, helper.curl(string.format("--cacert %s --resolve "
            .. "b.wild.test:%d:127.0.0.1 https://b.wild.test:%d/hello", q(dir .. "/ca.pem"),
            tls_port, tls_port)))
    end)

    it("refuses an unknown name under unknown_name = refuse, and logs it", function()
        local out = s_client("-servername other.test", strict_port)
        assert.matches("unrecognized name", out, 1, true)
        assert.not_matches("subject=", out)
        assert.matches("subject=CN = example.com",
            s_client("-servername example.com", strict_port), 1, true)
        -- The default certificate's own names are known names.
        assert.matches("subject=CN = localhost", s_client("-servername localhost", strict_port),
            1, true)
        assert.truthy(helper.wait_for(function()
            return strict:log():find("TLS handshake failed: unknown server name", 1, true)
        end))
    end)

    it("gives the ECDSA certificate to a client that can take only ECDSA, RSA to one that "
        .. "can take only RSA", function()
        local out = s_client("-tls1_2 -cipher ECDHE-ECDSA-AES128-GCM-SHA256 -servername localhost")
        assert.matches("subject=CN = localhost ECDSA", out, 1, true)
        out = s_client("-tls1_2 -cipher ECDHE-RSA-AES128-GCM-SHA256 -servername localhost")
        assert.matches("subject=CN = localhost RSA", out, 1, true)
        out = s_client("-tls1_3 -sigalgs ECDSA+SHA256 -servername localhost")
        assert.matches("subject=CN = localhost ECDSA", out, 1, true)
        out = s_client("-tls1_3 -sigalgs rsa_pss_rsae_sha256 -servername localhost")
        assert.matches("subject=CN = localhost RSA", out, 1, true)
    end)

    it("refuses TLS 1.0, TLS 1.1 and weak ciphers that the client offers, logging one line "
        .. "for each kind", function()
        -- Debian's client refuses these itself at its default security level: the offers are
        -- made at level 0, so that the refusal is the server's.
        for _, v in ipairs({ "-tls1", "-tls1_1", "-tls1", "-tls1_1" }) do
            local out = s_client(v .. " -cipher 'DEFAULT:@SECLEVEL=0'", strict_port)
            assert.matches("alert protocol version", out, 1, true)
            assert.not_matches("subject=", out)
        end
        for _, c in ipairs({ "AES128-SHA", "ECDHE-RSA-AES128-SHA", "DHE-RSA-AES256-SHA256",
            "ECDHE-ECDSA-AES256-SHA384" }) do
            local out = s_client("-tls1_2 -cipher '" .. c .. ":@SECLEVEL=0'", strict_port)
            assert.matches("handshake failure", out, 1, true)
            assert.not_matches("subject=", out)
        end
        local log = strict:log()
        local function count(text)
            local n = 0
            for _ in log:gmatch(text) do
                n = n + 1
            end
            return n
        end
        assert.equal(1, count("TLS handshake failed: no protocol version in common"))
        assert.equal(1, count("TLS handshake failed: no cipher in common"))
    end)

    it("does not ask for a client certificate", function()
        local out = s_client("-msg -servername localhost")
        assert.matches("Verify return code: 0", s_client("-CAfile " .. q(dir .. "/ca.pem")
            .. " -servername localhost"), 1, true)
        assert.matches("ServerHello", out, 1, true)
        assert.not_matches("CertificateRequest", out)
    end)

    it("closes a stalled handshake at handshake_timeout: nothing sent, or half a ClientHello",
        function()
        local hello = "\22\3\1\2\0\1\0\1\252\3\3" .. string.rep("\7", 40) -- cut short
        for _, first in ipairs({ "", hello }) do
            local s = helper.connect(strict_port)
            if first ~= "" then
                assert(s:send(first))
            end
            local t0 = socket.gettime()
            assert.is_true(helper.closed(s, 5))
            local took = socket.gettime() - t0
            assert.is_true(took > 0.7 and took < 3, "closed after " .. took .. " s")
            s:close()
        end
        assert.truthy(strict:log():find("not done within handshake_timeout", 1, true))
    end)

    it("counts connections in their handshake against per_source", function()
        local held = {}
        for i = 1, 4 do
            held[i] = helper.connect(strict_port)
        end
        -- The fifth is closed at once, long before the handshake deadline of the others.
        local s = helper.connect(strict_port)
        local t0 = socket.gettime()
        assert.is_true(helper.closed(s, 5))
        assert.is_true(socket.gettime() - t0 < 0.5)
        s:close()
        for _, h in ipairs(held) do
            h:close()
        end
        assert.truthy(helper.wait_for(function()
            return s_client("-servername localhost", strict_port):find("subject=", 1, true)
        end))
    end)

    it("passes testssl.sh at the defaults: protocols, ciphers, vulnerabilities", function()
        -- Debian's testssl.sh against the listener with an RSA and an ECDSA certificate. Its
        -- certificate lines about the test CA (not trusted: "Chain of trust NOT ok"; no CRL
        -- or OCSP URI in a test certificate) say nothing of the server and are not counted.
        local out = helper.run(string.format("timeout 300 %s --quiet --color 0 --warnings off "
            .. "-p -s -f -U -S 127.0.0.1:%d 2>&1", helper.tool("testssl"), tls_port))
        assert.matches("TLS 1      not offered", out, 1, true)
        assert.matches("TLS 1.1    not offered", out, 1, true)
        assert.matches("TLS 1.2    offered (OK)", out, 1, true)
        assert.matches("TLS 1.3    offered (OK)", out, 1, true)
        assert.matches("Heartbleed (CVE-2014-0160)                not vulnerable (OK)", out, 1,
            true)
        local bad = {}
        for line in out:gmatch("[^\n]+") do
            if (line:find("NOT ok", 1, true) or line:find("VULNERABLE", 1, true)) and
                not line:find("Chain of trust", 1, true) and
                not line:find("neither CRL nor OCSP URI provided", 1, true) then
                bad[#bad + 1] = line
            end
        end
        assert.same({}, bad)
    end)

    it("serves TLS from workers under a master", function()
        local m = helper.spawn_server { app = "spec/fixtures/tls.lua",
            env = { MOONSERVE_TLS_DIR = dir }, args = string.format(
                "--listen 127.0.0.1:0 --tls-cert %s --tls-key %s --workers 2",
                q(dir .. "/ec.pem"), q(dir .. "/ec.key")) }
        local ok, err = pcall(function()
            assert.matches("listening on https://", m:log(), 1, true)
            for _ = 1, 4 do
                assert.equal("https TLSv1.3 2", curl("--http2 " .. url("/scheme", m.ports[2]),
                    m.ports[2]))
            end
        end)
        m:stop()
        assert(ok, err)
    end)

    it("resumes a session openssl s_client kept (-sess_out, -sess_in), over TLS 1.2 and 1.3",
        function()
        local sess = dir .. "/session"
        for _, v in ipairs({ "-tls1_2", "-tls1_3" }) do
            os.remove(sess)
            -- (Reading to the end: a TLS 1.3 ticket comes after the handshake.)
            local out = helper.run(string.format("printf 'GET /hello HTTP/1.1\\r\\nHost: "
                .. "localhost\\r\\nConnection: close\\r\\n\\r\\n' | %s s_client %s "
                .. "-connect 127.0.0.1:%d -sess_out %s -ign_eof 2>&1", helper.tool("openssl"), v,
                tls_port, q(sess)))
            assert.matches("\nNew, TLSv1%.%d", out)
            assert.matches("hello over https", out, 1, true)
            out = s_client(v .. " -sess_in " .. q(sess))
            assert.matches("\nReused, TLSv1%.%d", out)
        end
    end)

    -- An OCSP response of the test CA for certificate `name`, saying `status` ("V" good, "R"
    -- revoked), valid for `days`: dir/NAME.ocsp.
    local function ocsp_response(name, status, days)
        local serial = openssl("x509 -noout -serial -in " .. q(dir .. "/" .. name .. ".pem"))
            :match("serial=(%x+)")
        helper.write_file(dir .. "/index.txt", string.format("%s\t301231000000Z\t%s\t%s\t"
            .. "unknown\t/CN=%s\n", status, status == "R" and "260101000000Z" or "", serial, name))
        openssl(string.format("ocsp -issuer %s -cert %s -reqout %s -no_nonce", q(dir .. "/ca.pem"),
            q(dir .. "/" .. name .. ".pem"), q(dir .. "/req.der")))
        openssl(string.format("ocsp -index %s -rsigner %s -rkey %s -CA %s -reqin %s -respout %s "
            .. "-ndays %d", q(dir .. "/index.txt"), q(dir .. "/ca.pem"), q(dir .. "/ca.key"),
            q(dir .. "/ca.pem"), q(dir .. "/req.der"), q(dir .. "/" .. name .. ".ocsp"), days))
        return dir .. "/" .. name .. ".ocsp"
    end

    -- A server of the ECDSA certificate with its chain (the CA after it), stapling `ocsp`.
    local function stapling_server(ocsp, workers)
        helper.sh(string.format("cat %s %s >%s", q(dir .. "/ec.pem"), q(dir .. "/ca.pem"),
            q(dir .. "/ec-chain.pem")))
        return helper.spawn_server { app = "spec/fixtures/tls.lua",
            env = { MOONSERVE_TLS_DIR = dir }, args = string.format(
                "--listen 127.0.0.1:0 --tls-cert %s --tls-key %s --tls-ocsp %s --workers %d",
                q(dir .. "/ec-chain.pem"), q(dir .. "/ec.key"), q(ocsp), workers or 0) }
    end

    it("staples an OCSP response over TLS 1.2 and 1.3; a listener without one staples none",
        function()
        local m = stapling_server(ocsp_response("ec", "V", 1))
        local ok, err = pcall(function()
            for _, v in ipairs({ "-tls1_2", "-tls1_3" }) do
                local out = s_client(v .. " -status -CAfile " .. q(dir .. "/ca.pem"), m.ports[2])
                assert.matches("OCSP Response Status: successful", out, 1, true)
                assert.matches("Cert Status: good", out, 1, true)
                assert.matches("Verify return code: 0 (ok)", out, 1, true)
                assert.matches("OCSP response: no response sent",
                    s_client(v .. " -status"), 1, true)
            end
        end)
        m:stop()
        assert(ok, err)
    end)

    it("refuses an OCSP response for another certificate, or one that says revoked", function()
        local cases = {
            { ocsp_response("site", "V", 1), "the OCSP response is not for this certificate" },
            { ocsp_response("ec", "R", 1), "the OCSP response says the certificate is revoked" },
            { dir .. "/ec.pem", "not an OCSP response" },
        }
        for _, case in ipairs(cases) do
            local ok, err = pcall(stapling_server, case[1])
            if ok then
                err:stop()
            end
            assert.is_false(ok)
            assert.matches("cannot staple the OCSP response " .. case[1], err, 1, true)
            assert.matches(case[2], err, 1, true)
        end
    end)

    it("staples the refreshed OCSP response after a reload (HUP)", function()
        local file = ocsp_response("ec", "V", 1)
        local m = stapling_server(file, 1)
        local function next_update()
            return s_client("-status", m.ports[2]):match("Next Update: ([^\n]+)")
        end
        local ok, err = pcall(function()
            local first = next_update()
            assert.truthy(first)
            ocsp_response("ec", "V", 2)
            os.execute("kill -HUP " .. m.pid)
            assert.truthy(helper.wait_for(function()
                local now = next_update()
                return now and now ~= first
            end))
        end)
        m:stop()
        assert(ok, err)
    end)

    -- spec/fixtures/tls_sessions.py's lines for `commands` against `port`.
    local function sessions(port, version, commands)
        return helper.run(string.format("%s %s %d %s %s %s 2>&1", helper.tool("ssl"),
            q(helper.root .. "/spec/fixtures/tls_sessions.py"), port, q(dir .. "/ca.pem"),
            version, commands))
    end

    it("resumes a session on every worker and after a reload: the master's ticket keys",
        function()
        local m = helper.spawn_server { app = "spec/fixtures/tls.lua",
            env = { MOONSERVE_TLS_DIR = dir }, args = string.format(
                "--listen 127.0.0.1:0 --tls-cert %s --tls-key %s --workers 2",
                q(dir .. "/ec.pem"), q(dir .. "/ec.key")) }
        local ok, err = pcall(function()
            for _, v in ipairs({ "1.2", "1.3" }) do
                local out = sessions(m.ports[2], v, "new resume:24 hup:" .. m.pid .. " resume:8")
                assert.matches("new %d+\nresumed 24 of 24, 2 workers\nreloaded\n"
                    .. "resumed 8 of 8, %d workers\n", out)
            end
        end)
        m:stop()
        assert(ok, err)
    end)

    it("makes a new ticket key every tls_ticket_rotate seconds; the two before still resume",
        function()
        local m = helper.spawn_server { app = "spec/fixtures/tls.lua",
            env = { MOONSERVE_TLS_DIR = dir }, args = string.format(
                "--listen 127.0.0.1:0 --tls-cert %s --tls-key %s --workers 1 "
                .. "--tls-ticket-rotate 1", q(dir .. "/ec.pem"), q(dir .. "/ec.key")) }
        local ok, err = pcall(function()
            -- At most two keys are made in 1.3 s, at least four in 4.3 s.
            local out = sessions(m.ports[2], "1.3", "new resume:2 sleep:1.3 resume:2 sleep:3 "
                .. "resume:2 new resume:2")
            assert.matches("new %d+\nresumed 2 of 2, 1 workers\nslept\nresumed 2 of 2, 1 "
                .. "workers\nslept\nresumed 0 of 2, 1 workers\nnew %d+\nresumed 2 of 2", out)
        end)
        m:stop()
        assert(ok, err)
    end)

    it("loses no request of h2load over TLS to a reload (HUP); h2 only streams refused", function()
        -- No close after requests_per_connection: h2load 1.52 over HTTP/1.1 reconnects after
        -- one, and a client that reconnects as its -D duration ends goes on sending forever.
        local m = helper.spawn_server { app = "spec/fixtures/tls.lua",
            env = { MOONSERVE_TLS_DIR = dir }, args = string.format(
                "--listen 127.0.0.1:0 --tls-cert %s --tls-key %s --workers 2 "
                .. "--limit requests_per_connection=100000000",
                q(dir .. "/ec.pem"), q(dir .. "/ec.key")) }
        local ok, err = pcall(function()
            for i, proto in ipairs({ "", "--h1" }) do
                local out = helper.run(string.format("(sleep 0.7; kill -HUP %d) & %s %s -D 2 -c 8 "
                    .. "-m 4 https://127.0.0.1:%d/hello 2>&1; wait", m.pid, helper.tool("h2load"),
                    proto, m.ports[2]))
                local total = tonumber(out:match("requests: (%d+) total"))
                assert.is_true(total and total > 1000, out)
                if proto == "--h1" then
                    assert.matches(total .. " succeeded, 0 failed, 0 errored, 0 timeout", out, 1,
                        true)
                else
                    -- A stream the client sent before it saw the GOAWAY notice is served; one
                    -- its nghttp2 had queued when the notice came is failed by nghttp2 itself,
                    -- unsent, and h2load does not retry it (a browser does): at most the 4
                    -- in flight on each of the 8 connections.
                    local ok_n, failed =
                        out:match("(%d+) succeeded, (%d+) failed, %d+ errored, 0 timeout")
                    assert.equal(total, tonumber(ok_n) + tonumber(failed), out)
                    assert.is_true(tonumber(failed) <= 32, out)
                end
                assert.truthy(helper.wait_for(function()
                    local _, n = m:log():gsub("took over", "")
                    return n == 2 * i
                end))
            end
        end)
        m:stop()
        assert(ok, err)
    end)

    it("refuses, in a worker, a key that is not a regular file", function()
        -- (A worker reads what its user may; the master opens for it the rest, which
        -- spec/it/user_spec.lua covers.)
        local m = helper.spawn_server { app = "spec/fixtures/tls.lua",
            env = { MOONSERVE_TLS_DIR = dir }, args = string.format(
                "--listen 127.0.0.1:0 --tls-cert %s --tls-key %s --workers 1",
                q(dir .. "/ec.pem"), q(dir)) }
        local ok, err = pcall(function()
            assert.is_true(helper.wait_for(function()
                return m:log():find("cannot read the TLS key: cannot open " .. dir ..
                    ": not a regular file", 1, true) ~= nil
            end))
        end)
        m:stop()
        assert(ok, err)
    end)

    it("takes new certificates on a reload (HUP), and keeps the old when the new fail",
        function()
        helper.sh(string.format("cp %s %s && cp %s %s", q(dir .. "/ec.pem"), q(dir .. "/hup.pem"),
            q(dir .. "/ec.key"), q(dir .. "/hup.key")))
        local m = helper.spawn_server { app = "spec/fixtures/tls.lua",
            env = { MOONSERVE_TLS_DIR = dir }, args = string.format(
                "--listen 127.0.0.1:0 --tls-cert %s --tls-key %s --workers 1",
                q(dir .. "/hup.pem"), q(dir .. "/hup.key")) }
        local port = m.ports[2]
        local function subject()
            return s_client("-servername localhost", port):match("subject=CN = ([^\n]*)")
        end
        local ok, err = pcall(function()
            assert.equal("localhost ECDSA", subject())
            helper.sh(string.format("cp %s %s && cp %s %s", q(dir .. "/rsa.pem"),
                q(dir .. "/hup.pem"), q(dir .. "/rsa.key"), q(dir .. "/hup.key")))
            os.execute("kill -HUP " .. m.pid)
            assert.truthy(helper.wait_for(function() return subject() == "localhost RSA" end))
            helper.write_file(dir .. "/hup.pem", "not a certificate\n")
            os.execute("kill -HUP " .. m.pid)
            assert.truthy(helper.wait_for(function()
                return m:log():find("cannot use the TLS certificate", 1, true)
            end))
            assert.equal("localhost RSA", subject())
        end)
        m:stop()
        assert(ok, err)
    end)

    it("serves a TLS listener given in Lua (listen = { { addr, tls = ... } })", function()
        local log = os.tmpname()
        local p = io.popen(string.format("env MOONSERVE_TLS_DIR=%s MOONSERVE_TLS_RUN=1 %s %s "
            .. ">%s 2>&1 & echo $!", q(dir), helper.tool("luajit"),
            q(helper.root .. "/spec/fixtures/tls.lua"), q(log)))
        local pid = p:read("*l")
        p:close()
        local port
        helper.wait_for(function()
            port = helper.read_file(log):match("listening on https://[^ ]+:(%d+)/")
            return port
        end)
        local ok, err = pcall(function()
            assert.truthy(port, helper.read_file(log))
            port = tonumber(port)
            assert.equal("https TLSv1.3 1.1", curl("--http1.1 " .. url("/scheme", port), port))
            assert.matches("unrecognized name", s_client("-servername nope.test", port), 1, true)
        end)
        os.execute("kill " .. pid)
        os.remove(log)
        assert(ok, err)
    end)

    -- Kernel TLS: where the kernel has its tls module, the kernel encrypts once a handshake is
    -- done (spec/vm/ktls runs that in a machine of its own); elsewhere, as here, the records
    -- are moonserve's, which every other case of this file runs.
    it("says at start whether the kernel encrypts, as the kernel's tls ULP decides", function()
        -- The start tried TCP_ULP "tls" on a loopback connection (which loads the module for
        -- a process that may): the kernel lists the ULP now exactly when it has it.
        local ulps = helper.read_file("/proc/sys/net/ipv4/tcp_available_ulp") or ""
        local has = ulps:match("%f[%w]tls%f[%W]") ~= nil
        local want = has and "kernel TLS: on: the kernel encrypts TLS records once a "
            .. "handshake is done, and static files go out with sendfile"
            or "kernel TLS: not offered by the kernel (no tls ULP); TLS records are written "
            .. "by moonserve"
        assert.matches("info: " .. want, srv:log(), 1, true)
        local out, status = helper.run(string.format("%s --static %s --listen 127.0.0.1:1 "
            .. "--tls-cert %s --tls-key %s --check 2>&1", q(helper.root .. "/lua/bin/moonserve"),
            q(dir .. "/files"), q(dir .. "/ec.pem"), q(dir .. "/ec.key")))
        assert.equal(0, status, out)
        assert.matches("moonserve: " .. want .. "\n", out, 1, true)
        -- No TLS listener: nothing said.
        out = helper.run(string.format("%s --static %s --listen 127.0.0.1:1 --check 2>&1",
            q(helper.root .. "/lua/bin/moonserve"), q(dir .. "/files")))
        assert.not_matches("kernel TLS", out, 1, true)
    end)

    it("turns kernel TLS off with --tls-no-ktls (tls = { ktls = false }), and says so",
        function()
        local bin = q(helper.root .. "/lua/bin/moonserve")
        local certs = string.format("--tls-cert %s --tls-key %s", q(dir .. "/ec.pem"),
            q(dir .. "/ec.key"))
        local out, status = helper.run(string.format("%s --static %s --listen 127.0.0.1:1 %s "
            .. "--tls-no-ktls --check 2>&1", bin, q(dir .. "/files"), certs))
        assert.equal(0, status, out)
        assert.matches("moonserve: kernel TLS: off (tls.ktls = false); TLS records are "
            .. "written by moonserve\n", out, 1, true)
        out, status = helper.run(string.format("%s --tls-no-ktls --check 2>&1", bin))
        assert.equal(2, status, out)
        assert.matches("--tls-no-ktls goes after the --listen it is for", out, 1, true)
        -- The listener serves as ever, a static file byte for byte on HTTP/1.1 and h2.
        local m = helper.spawn_server { app = "spec/fixtures/tls.lua",
            env = { MOONSERVE_TLS_DIR = dir },
            args = "--listen 127.0.0.1:0 " .. certs .. " --tls-no-ktls" }
        local ok, err = pcall(function()
            assert.matches("info: kernel TLS: off (tls.ktls = false)", m:log(), 1, true)
            for _, v in ipairs({ "--http1.1", "--http2" }) do
                local file = dir .. "/got-noktls" .. v
                curl(v .. " -o " .. q(file) .. " " .. url("/files/blob.bin", m.ports[2]),
                    m.ports[2])
                assert.is_true(helper.read_file(file) == blob, v)
            end
        end)
        m:stop()
        assert(ok, err)
    end)
end)
