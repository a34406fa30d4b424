-- spec/it/cors_spec.lua: moonserve.cors and flash messages through a real server, with curl
-- as the client (a browser's CORS requests are plain requests with Origin; curl sends the
-- same fields, and hostile ones no browser would).
local helper = require "helper"

-- The moonserve server, and nginx with its Lua module through moonserve.openresty: the same
-- app file and the same answers from both.
local function start(server)
    if server == "nginx" then
        return helper.nginx_app { app = "spec/fixtures/cors_app.lua" }
    end
    return helper.spawn_server { app = "spec/fixtures/cors_app.lua" }
end

for _, server in ipairs { "moonserve", "nginx" } do
describe("CORS over a real server (" .. server .. ")", function()
    local srv, url

    setup(function()
        srv = start(server)
        url = "http://127.0.0.1:" .. srv.port
    end)

    teardown(function()
        srv:stop()
    end)

    -- The status line and the header fields (lowercase names) of a reply, by curl.
    local function head(args)
        local out = helper.curl("-si -o /dev/stdout " .. args)
        local status = tonumber(out:match("^HTTP/[%d.]+ (%d+)"))
        local fields = {}
        for name, value in out:gmatch("\n([%w-]+): ([^\r\n]*)") do
            name = name:lower()
            fields[name] = fields[name] and (fields[name] .. ", " .. value) or value
        end
        return status, fields, out
    end

    local APP = "https://app.example"
    local PREFLIGHT = "-X OPTIONS -H 'Access-Control-Request-Method: POST' "
        .. "-H 'Access-Control-Request-Headers: content-type, x-csrf-token' "

    it("answers a preflight without the route, for a path with no route too", function()
        for _, path in ipairs { "/notes", "/no/such/path" } do
            local status, f, out = head(PREFLIGHT .. "-H 'Host: api.test' -H 'Origin: " .. APP
                .. "' " .. url .. path)
            assert.equal(204, status, out)
            assert.equal(APP, f["access-control-allow-origin"], out)
            assert.equal("true", f["access-control-allow-credentials"], out)
            assert.equal("GET, HEAD, PUT, PATCH, POST, DELETE",
                f["access-control-allow-methods"], out)
            assert.equal("content-type, x-csrf-token", f["access-control-allow-headers"], out)
            assert.equal("600", f["access-control-max-age"], out)
            assert.equal("Origin, Access-Control-Request-Headers", f.vary, out)
            assert.falsy(out:find("the route's own OPTIONS", 1, true), out)
        end
        -- a plain OPTIONS is the route's
        local _, _, out = head("-X OPTIONS -H 'Host: api.test' " .. url .. "/notes")
        assert.truthy(out:find("the route's own OPTIONS", 1, true), out)
    end)

    it("lets an allowed origin read a credentialed reply, and write through the origin check",
        function()
        local jar = os.tmpname()
        local c = "-c " .. jar .. " -b " .. jar .. " -H 'Host: api.test' -H 'Origin: " .. APP .. "' "
        local status, f, out = head(c .. "-X POST -H 'Content-Type: application/json' -d '{}' "
            .. url .. "/notes")
        assert.equal(201, status, out)
        assert.equal(APP, f["access-control-allow-origin"], out)
        assert.equal("true", f["access-control-allow-credentials"], out)
        assert.equal("Origin", f.vary, out)
        status, f, out = head(c .. url .. "/notes")
        assert.equal(200, status, out)
        assert.truthy(out:find('"user":"ada"', 1, true), out)
        assert.equal("x-total", f["access-control-expose-headers"], out)
        assert.equal("Accept-Encoding, Origin", f.vary, out)
        os.remove(jar)
    end)

    it("keeps the fields on an error page, so the page can read the 500", function()
        local status, f, out = head("-H 'Host: api.test' -H 'Origin: " .. APP .. "' "
            .. url .. "/boom")
        assert.equal(500, status, out)
        assert.equal(APP, f["access-control-allow-origin"], out)
        assert.equal("Origin", f.vary, out)
    end)

    for _, hostile in ipairs {
        "null",
        "https://app.example.evil.test",   -- an allowed origin as a prefix
        "https://evil.test",
        "http://app.example",
        "https://app.example:8443",
        "https://app.example/",
        "https://app.example%0d%0aSet-Cookie: x=1",
    } do
        it("gives Origin " .. hostile .. " no CORS fields, and its preflight 403", function()
            local origin = hostile:gsub("%%0d%%0a", "\r\n")
            -- (curl sends what -H holds up to a CR or LF: the rest never reaches the server)
            local o = "-H 'Host: api.test' -H " .. ("%q"):format("Origin: " .. origin) .. " "
            local status, f, out = head(o .. url .. "/notes")
            assert.equal(200, status, out)
            assert.is_nil(f["access-control-allow-origin"], out)
            assert.is_nil(f["access-control-allow-credentials"], out)
            assert.is_nil(f["set-cookie"], out)
            assert.equal("Accept-Encoding, Origin", f.vary, out)
            status, f, out = head(PREFLIGHT .. o .. url .. "/notes")
            assert.equal(403, status, out)
            assert.is_nil(f["access-control-allow-origin"], out)
            assert.is_nil(f["access-control-allow-methods"], out)
            assert.equal("Origin", f.vary, out)
            -- and the origin check refuses its writes
            status = head(o .. "-X POST -d '{}' " .. url .. "/notes")
            assert.equal(403, status)
        end)
    end

    it("refuses a raw Origin with bytes no origin has, or two origins", function()
        for _, origin in ipairs { "https://app.example\tx",
            "https://app.example, https://evil.test" } do
            local res = helper.request(srv.port, "GET /notes HTTP/1.1\r\nHost: api.test\r\n"
                .. "Origin: " .. origin .. "\r\nConnection: close\r\n\r\n")
            assert.truthy(res, origin)
            assert.is_nil(res.headers["access-control-allow-origin"], origin)
        end
        -- the same request with a well-formed Origin gets the fields
        local res = helper.request(srv.port, "GET /notes HTTP/1.1\r\nHost: api.test\r\n"
            .. "Origin: https://app.example\r\nConnection: close\r\n\r\n")
        assert.equal("https://app.example", res.headers["access-control-allow-origin"])
    end)

    it("leaves cross-origin writes to the origin check when it does not know the origin",
        function()
        local status, f, out = head("-H 'Host: strict.test' -H 'Origin: " .. APP
            .. "' -X POST -d '{}' " .. url .. "/notes")
        assert.equal(403, status, out)
        assert.is_nil(f["access-control-allow-origin"], out)
    end)

    it("matches a pattern against the whole origin", function()
        local function allowed(origin)
            local _, f = head("-H 'Host: pattern.test' -H 'Origin: " .. origin .. "' "
                .. url .. "/x")
            return f["access-control-allow-origin"]
        end
        assert.equal("https://a.app.example", allowed("https://a.app.example"))
        assert.is_nil(allowed("https://a.app.example.evil.test"))
        assert.is_nil(allowed("https://evil.test/https://a.app.example"))
        assert.is_nil(allowed("https://x.evil.test?a.app.example"))
    end)
end)

end

describe("flash messages over a real server", function()
    it("shows the messages on the page after the redirect, once", function()
        local srv = helper.spawn_server { app = "spec/fixtures/cors_app.lua" }
        local url = "http://127.0.0.1:" .. srv.port
        local jar = os.tmpname()
        local c = "-s -c " .. jar .. " -b " .. jar .. " "
        local out = helper.curl(c .. "-L -d x=1 " .. url .. "/save")
        local ok, err = pcall(function()
            assert.equal("notice: Saved\nerror: Title too long", out)
            out = helper.curl(c .. url .. "/show")
            assert.equal("", out)
        end)
        srv:stop()
        os.remove(jar)
        assert(ok, err)
    end)
end)
