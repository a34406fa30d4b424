-- spec/it/deployment_spec.lua: the guide's nginx configuration (docs/guide/deployment.md, its
-- nginx block as written, with a test certificate and loopback ports put in) in front of a
-- moonserve that trusts it: the client's address from X-Forwarded-For, https from
-- X-Forwarded-Proto, nginx's $request_id as req.id, the cross-site check on the browser's
-- Host, and a WebSocket through the upgrade location.
local helper = require "helper"
local cjson = require "cjson"

local q = helper.sh_quote

describe("behind nginx as the guide configures it", function()
    local srv, nginx, work

    setup(function()
        work = helper.sh(helper.tool("mktemp") .. " -d"):gsub("%s+$", "")
        helper.sh(string.format("%s req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
            .. "-nodes -keyout %s/key.pem -out %s/cert.pem -days 2 -subj /CN=example.org 2>&1",
            helper.tool("openssl"), work, work))
        srv = helper.spawn_server { app = "spec/fixtures/deployment.lua",
            args = "--trusted-proxy 127.0.0.1/32" }
        local guide = helper.read_file(helper.root .. "/docs/guide/deployment.md")
        local conf = assert(guide:match("## Behind nginx.-```nginx\n(.-)```"), "no nginx block")
        local function put(from, to)
            local n
            conf, n = conf:gsub(from:gsub("%p", "%%%0"), (to:gsub("%%", "%%%%")))
            assert(n == 1, "the guide's nginx block has no " .. from)
        end
        put("server 127.0.0.1:8080;", "server 127.0.0.1:" .. srv.port .. ";")
        put("listen 443 ssl http2;", "listen 127.0.0.1:%d ssl http2;")
        put("# ssl_certificate ...;", string.format("ssl_certificate %s/cert.pem; "
            .. "ssl_certificate_key %s/key.pem;", work, work))
        nginx = helper.nginx_lua(conf)
    end)

    teardown(function()
        if srv then srv:stop() end
        if nginx then nginx.stop() end
        if work then
            os.execute("rm -rf " .. q(work))
        end
    end)

    local function curl(args)
        return helper.curl(string.format("-sk --resolve example.org:%d:127.0.0.1 %s",
            nginx.port, args))
    end

    local function url(path)
        return q(string.format("https://example.org:%d%s", nginx.port, path))
    end

    it("sees the client, https and nginx's request id through the trusted proxy", function()
        local out = curl("-H 'X-Forwarded-For: 203.0.113.9' -D - " .. url("/who"))
        local body = assert(out:match("\r\n\r\n(.*)$"), out)
        local who = cjson.decode(body)
        assert.equal("203.0.113.9", who.ip)
        assert.equal("https", who.scheme)
        assert.matches("^%x+$", who.id)
        assert.equal(32, #who.id) -- nginx's $request_id, not moonserve's own 24 digits
        assert.equal("example.org:" .. nginx.port, who.host)
        -- keep-alive to the upstream: a second request on nginx's pooled connection
        assert.equal("https", cjson.decode(curl(url("/who"))).scheme)
    end)

    it("takes a same-origin form and refuses a cross-site one, on the browser's Host", function()
        local origin = string.format("https://example.org:%d", nginx.port)
        assert.equal("posted 200", curl("-w ' %{http_code}' -H " .. q("Origin: " .. origin)
            .. " -d a=1 " .. url("/form")))
        assert.matches(" 403$", curl("-w ' %{http_code}' -H 'Origin: https://evil.example' "
            .. "-d a=1 " .. url("/form")))
    end)

    it("carries a WebSocket through the upgrade location", function()
        local script = work .. "/ws.py"
        helper.write_file(script, [[
import asyncio, ssl, sys
import websockets
async def main():
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    port = int(sys.argv[1])
    async with websockets.connect("wss://example.org:%d/live" % port, host="127.0.0.1",
                                  port=port, ssl=ctx, server_hostname="example.org",
                                  origin="https://example.org:%d" % port) as ws:
        await ws.send("through nginx")
        print(await ws.recv())
asyncio.run(main())
]])
        local out = helper.run(string.format("%s %s %d 2>&1", q(helper.tool("websockets")),
            q(script), nginx.port))
        assert.equal("through nginx\n", out)
    end)
end)
