-- spec/it/tls_hook_spec.lua: the certificate hook (app:ssl_certificate) through the ngx
-- layer's ngx.ssl, on a real TLS listener with curl and openssl s_client as clients: a
-- certificate chosen by the name the client sent (one parsed at load, one from a shared
-- dictionary as DER), one chosen after the hook sleeps, the client leaving or
-- handshake_timeout firing while it sleeps, an error that fails the handshake with one log
-- line; and the conversions, which work outside a hook.
local helper = require "helper"

local q = helper.sh_quote

describe("the certificate hook", function()
    local dir, srv, port

    local function openssl(args)
        return helper.sh(helper.tool("openssl") .. " " .. args .. " 2>&1")
    end

    -- A certificate for `cn` signed by the test CA: name.pem and name.key in `dir`.
    local function leaf(name, cn)
        openssl(string.format("req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
            .. "-keyout %s -out %s -subj %s", q(dir .. "/" .. name .. ".key"),
            q(dir .. "/" .. name .. ".csr"), q("/CN=" .. cn)))
        helper.write_file(dir .. "/" .. name .. ".ext", "subjectAltName=DNS:" .. cn .. "\n")
        openssl(string.format("x509 -req -in %s -CA %s -CAkey %s -CAcreateserial -days 2 "
            .. "-extfile %s -out %s", q(dir .. "/" .. name .. ".csr"), q(dir .. "/ca.pem"),
            q(dir .. "/ca.key"), q(dir .. "/" .. name .. ".ext"), q(dir .. "/" .. name .. ".pem")))
    end

    setup(function()
        dir = helper.sh(helper.tool("mktemp") .. " -d"):gsub("%s+$", "")
        openssl(string.format("req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
            .. "-keyout %s -out %s -days 2 -subj '/CN=moonserve hook CA' "
            .. "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign",
            q(dir .. "/ca.key"), q(dir .. "/ca.pem")))
        for _, n in ipairs { "localhost", "a.test", "b.test", "slow.test" } do
            leaf(n:match("^[^.]+"), n)
        end
        srv = helper.spawn_server { app = "spec/fixtures/tls_hook.lua",
            env = { MOONSERVE_TLS_DIR = dir },
            args = string.format("--workers 1 --listen 127.0.0.1:0 --tls-cert %s --tls-key %s",
                q(dir .. "/localhost.pem"), q(dir .. "/localhost.key")) }
        port = srv.ports[2]
    end)

    teardown(function()
        if srv then srv:stop() end
        if dir then os.execute("rm -rf " .. q(dir)) end
    end)

    -- curl to https://NAME:port/path, verifying against the test CA.
    local function get(name, path, extra)
        return helper.run(string.format("%s -sS --max-time 20 %s --cacert %s --resolve "
            .. "%s:%d:127.0.0.1 https://%s:%d%s 2>&1", helper.tool("curl"), extra or "",
            q(dir .. "/ca.pem"), name, port, name, port, path))
    end

    it("chooses a parsed chain and key for one name, DER from a shared dictionary for "
        .. "another", function()
        local out, status = get("a.test", "/seen")
        assert.equal(0, status, out .. srv:log())
        assert.equal("a.test TLSv1.3 4 inet", out)
        out, status = get("b.test", "/seen", "--tlsv1.2 --tls-max 1.2")
        assert.equal(0, status, out .. srv:log())
        assert.equal("b.test TLSv1.2 4 inet", out)
        -- A name the hook leaves alone: the listener's certificate.
        out, status = get("localhost", "/seen")
        assert.equal(0, status, out .. srv:log())
        assert.equal("localhost TLSv1.3 4 inet", out)
        -- The certificate sent is the one chosen, not only one the client accepts.
        local shown = openssl(string.format("s_client -connect 127.0.0.1:%d -servername b.test "
            .. "</dev/null", port))
        assert.matches("subject=CN = b.test", shown, 1, true)
    end)

    it("waits while the hook sleeps, then goes on with what it chose", function()
        local t0 = require("socket").gettime()
        local out, status = get("slow.test", "/seen")
        assert.equal(0, status, out .. srv:log())
        assert.equal("slow.test TLSv1.3 4 inet", out)
        assert.is_true(require("socket").gettime() - t0 >= 0.3)
        -- Handshakes side by side, each with its own hook.
        local urls = {}
        for i = 1, 4 do
            local name = i % 2 == 0 and "slow.test" or "a.test"
            urls[i] = string.format("-o /dev/null https://%s:%d/seen", name, port)
        end
        -- curl's parallel transfers, over HTTP/1.1: a connection and a handshake each
        out = helper.sh(string.format("%s -sS -Z --parallel-immediate --no-progress-meter "
            .. "--http1.1 -w '%%{http_code}\\n' --max-time 20 --cacert %s "
            .. "--resolve a.test:%d:127.0.0.1 "
            .. "--resolve slow.test:%d:127.0.0.1 %s 2>&1", helper.tool("curl"),
            q(dir .. "/ca.pem"), port, port, table.concat(urls, " ")))
        assert.equal("200\n200\n200\n200\n", out)
    end)

    -- An openssl s_client to slow.test, in the background; its PID.
    local function slow_client(at)
        return helper.background(string.format("%s s_client -connect 127.0.0.1:%d "
            .. "-servername slow.test </dev/null", helper.tool("openssl"), at))
    end

    it("lets a client leave while the hook sleeps: the hook is told, the worker goes on",
        function()
        local before = #srv:log()
        local pid = slow_client(port)
        require("socket").sleep(0.1)
        helper.stop_pid(pid) -- (by its PID; the hook still sleeps)
        -- The hook wakes to a connection that is gone: ngx.ssl says so, and its error is
        -- the one line.
        assert.truthy(helper.wait_for(function()
            return srv:log():find("the connection is gone", before + 1, true)
        end), srv:log())
        local out, status = get("a.test", "/seen")
        assert.equal(0, status, out .. srv:log())
        assert.equal("a.test TLSv1.3 4 inet", out)
        assert.is_true(srv:alive())
        local log = srv:log():sub(before + 1)
        local _, lines = log:gsub("\n", "")
        assert.equal(1, lines, log)
        assert.matches("ssl_certificate hook failed: .*the connection is gone", log)
    end)

    it("closes a handshake whose hook sleeps past handshake_timeout; the hook is told",
        function()
        local quick = helper.spawn_server { app = "spec/fixtures/tls_hook.lua",
            env = { MOONSERVE_TLS_DIR = dir },
            args = string.format("--workers 1 --listen 127.0.0.1:0 --tls-cert %s --tls-key %s "
                .. "--limit handshake_timeout=0.1", q(dir .. "/localhost.pem"),
                q(dir .. "/localhost.key")) }
        local at = quick.ports[2]
        -- (its start-up lines first, which a loaded machine may write late)
        assert.truthy(helper.wait_for(function()
            return quick:log():find("shared dictionary 'certs' made", 1, true)
        end), quick:log())
        local before = #quick:log()
        local t0 = require("socket").gettime()
        local shown, status = helper.run(string.format("%s s_client -connect 127.0.0.1:%d "
            .. "-servername slow.test </dev/null 2>&1", helper.tool("openssl"), at))
        local took = require("socket").gettime() - t0
        assert.is_not.equal(0, status, shown)
        assert.matches("unexpected eof", shown, 1, true) -- closed, no certificate sent
        assert.is_true(took < 0.3, tostring(took)) -- closed at 0.1 s, not when the hook woke
        assert.truthy(helper.wait_for(function()
            return quick:log():find("the connection is gone", before + 1, true)
        end), quick:log())
        local log = quick:log():sub(before + 1)
        assert.matches("not done within handshake_timeout", log, 1, true)
        local _, lines = log:gsub("\n", "")
        assert.equal(2, lines, log) -- the deadline's line, and the hook's
        -- The worker goes on: a handshake whose hook does not sleep.
        local out, rc = helper.run(string.format("%s -sS --max-time 20 --cacert %s "
            .. "--resolve a.test:%d:127.0.0.1 https://a.test:%d/seen 2>&1", helper.tool("curl"),
            q(dir .. "/ca.pem"), at, at))
        assert.equal(0, rc, out .. quick:log())
        assert.is_true(quick:alive())
        quick:stop()
    end)

    it("fails the handshake on an error in the hook, with one log line", function()
        local before = #srv:log()
        local out, status = get("boom.test", "/seen", "-k")
        assert.is_not.equal(0, status, out)
        assert.truthy(helper.wait_for(function()
            return srv:log():find("no certificate for boom.test", 1, true)
        end), srv:log())
        local log = srv:log():sub(before + 1)
        local _, lines = log:gsub("ssl_certificate hook failed", "")
        assert.equal(1, lines, log)
        assert.is_nil(log:find("TLS handshake failed", 1, true), log)
        -- The worker goes on.
        out, status = get("a.test", "/seen")
        assert.equal(0, status, out)
    end)
end)

describe("ngx.ssl's conversions", function()
    local dir
    setup(function()
        dir = helper.sh(helper.tool("mktemp") .. " -d"):gsub("%s+$", "")
        helper.sh(string.format("%s req -x509 -newkey rsa:2048 -nodes -keyout %s -out %s -days 2 "
            .. "-subj /CN=conv.test 2>&1", helper.tool("openssl"), q(dir .. "/c.key"),
            q(dir .. "/c.pem")))
    end)
    teardown(function()
        os.execute("rm -rf " .. q(dir))
    end)

    it("converts PEM to DER as openssl does, parses, and refuses what is not PEM", function()
        require "moonserve.ngx"
        local ssl = require "ngx.ssl"
        local pem = helper.read_file(dir .. "/c.pem")
        local der = assert(ssl.cert_pem_to_der(pem))
        assert.equal(helper.sh(string.format("%s x509 -in %s -outform DER | %s -An -tx1 | %s -d "
            .. "' \\n'", helper.tool("openssl"), q(dir .. "/c.pem"), helper.tool("od"),
            helper.tool("tr"))), (der:gsub(".", function(c)
                return string.format("%02x", c:byte())
            end)))
        -- A chain: each certificate's DER, one after another.
        assert.equal(der .. der, ssl.cert_pem_to_der(pem .. pem))
        local key = assert(ssl.priv_key_pem_to_der(helper.read_file(dir .. "/c.key")))
        assert.is_true(#key > 1000)
        assert.equal("cdata", type(assert(ssl.parse_pem_cert(pem))))
        assert.equal("cdata", type(assert(ssl.parse_pem_priv_key(
            helper.read_file(dir .. "/c.key")))))
        local none, err = ssl.cert_pem_to_der("not a certificate")
        assert.is_nil(none)
        assert.is_string(err)
        assert.is_nil((ssl.parse_pem_priv_key(pem)))
        -- Outside a hook, the handshake's functions say so.
        local name, why = ssl.server_name()
        assert.is_nil(name)
        assert.matches("not in a certificate hook", why, 1, true)
        assert.is_nil((ssl.set_der_cert(der)))
        assert.equal(0x0304, ssl.TLS1_3_VERSION)
    end)
end)
