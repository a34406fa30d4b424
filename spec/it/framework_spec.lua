-- spec/it/framework_spec.lua: the framework through a real server, with curl as the client.
local helper = require "helper"

describe("the framework over a real server", function()
    local srv, url, jar

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/site.lua" }
        url = "http://127.0.0.1:" .. srv.port
        jar = os.tmpname()
    end)

    teardown(function()
        srv:stop()
        os.remove(jar)
    end)

    local function curl(args)
        return helper.curl("-c " .. jar .. " -b " .. jar .. " " .. args)
    end

    it("redirects non-canonical paths and sends security headers", function()
        local out = curl("-si '" .. url .. "/users//7/?x=1'")
        assert.truthy(out:find("HTTP/1.1 308", 1, true), out)
        assert.truthy(out:find("location: /users/7?x=1", 1, true), out)
        out = curl("-si " .. url .. "/users/7")
        assert.truthy(out:find('"id":"7"', 1, true), out)
        assert.truthy(out:find("x-content-type-options: nosniff", 1, true), out)
        assert.truthy(out:find("content-security-policy: frame-ancestors 'self'", 1, true), out)
        out = curl("-si -H 'Host: other.test' " .. url .. "/")
        assert.truthy(out:find("other site", 1, true), out)
        assert.falsy(out:find("nosniff", 1, true), out)
    end)

    it("keeps a session, renders a template with a CSRF token, and takes the signed form", function()
        local page = curl("-s " .. url .. "/form")
        assert.truthy(page:find("<title>Sign</title>", 1, true), page)
        assert.truthy(page:find("Signed by nobody", 1, true), page)
        local token = page:match('name="_csrf" value="([^"]+)"')
        assert.truthy(token)
        -- without the token: refused; from another origin: refused; with it: accepted
        local out = curl("-s -o /dev/null -w '%{http_code}' -d 'name=Ada' " .. url .. "/sign")
        assert.equal("403", out)
        out = curl("-s -o /dev/null -w '%{http_code}' -H 'Origin: http://evil.test' -d 'name=Ada&_csrf="
            .. token .. "' " .. url .. "/sign")
        assert.equal("403", out)
        out = curl("-s -L -d 'name=<Ada>&_csrf=" .. token .. "' " .. url .. "/sign")
        assert.truthy(out:find("Signed by &lt;Ada&gt;", 1, true), out)
    end)

    it("streams a multipart upload part by part (its CSRF token in a header)", function()
        local token = curl("-s " .. url .. "/form"):match('name="_csrf" value="([^"]+)"')
        local file = os.tmpname()
        assert(helper.run("head -c 3000000 /dev/urandom > " .. file))
        local out = curl("-s -H 'X-CSRF-Token: " .. token .. "' -F title=hello -F 'doc=@"
            .. file .. ";filename=big.bin' " .. url .. "/upload")
        assert.equal("title::5,doc:big.bin:3000000", out)
        os.remove(file)
    end)

    it("negotiates within a route group", function()
        assert.equal("json", curl("-s -H 'Accept: application/json' " .. url .. "/api/who"))
        assert.equal("html", curl("-s -H 'Accept: text/html' " .. url .. "/api/who"))
        assert.equal("none", curl("-s -H 'Accept: image/png' " .. url .. "/api/who"))
    end)
end)
