-- spec/it/framework_spec.lua: the framework through a real server, with curl as the client:
-- the moonserve server, and nginx with its Lua module through moonserve.openresty, the same
-- app files and the same answers from both.
local helper = require "helper"

-- Starts `app` on `server`; `trust` names 127.0.0.1 a trusted proxy.
local function start(server, app, trust)
    if server == "nginx" then
        return helper.nginx_app { app = app, http = trust and
            "geo $moonserve_trusted_proxy { default 0; 127.0.0.1 1; }\n" or nil }
    end
    return helper.spawn_server { app = app, args = trust and "--trusted-proxy 127.0.0.1" or nil }
end

for _, server in ipairs({ "moonserve", "nginx" }) do

describe("the framework over a real server (" .. server .. ")", function()
    local srv, url, jar

    setup(function()
        srv = start(server, "spec/fixtures/site.lua")
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

    it("takes the CSRF token from a multipart field before or after the file part", function()
        local token = curl("-s " .. url .. "/form"):match('name="_csrf" value="([^"]+)"')
        local file = os.tmpname()
        assert(helper.run("head -c 3000000 /dev/urandom > " .. file))
        local doc = "-F 'doc=@" .. file .. ";filename=big.bin' "
        local field = "-F _csrf=" .. token .. " "
        -- curl sends the parts in the order given; the handler reads every one of them
        local out = curl("-s " .. field .. "-F title=hello " .. doc .. url .. "/upload")
        assert.equal("_csrf::" .. #token .. ",title::5,doc:big.bin:3000000", out)
        out = curl("-s -F title=hello " .. doc .. field .. url .. "/upload")
        assert.equal("title::5,doc:big.bin:3000000,_csrf::" .. #token, out)
        out = curl("-s -o /dev/null -w '%{http_code}' -F title=hello " .. doc .. url .. "/upload")
        assert.equal("403", out)
        out = curl("-s -o /dev/null -w '%{http_code}' -F title=hello " .. doc .. "-F _csrf="
            .. token:sub(1, -3) .. "xx " .. url .. "/upload")
        assert.equal("403", out)
        os.remove(file)
    end)

    it("negotiates within a route group", function()
        assert.equal("json", curl("-s -H 'Accept: application/json' " .. url .. "/api/who"))
        assert.equal("html", curl("-s -H 'Accept: text/html' " .. url .. "/api/who"))
        assert.equal("none", curl("-s -H 'Accept: image/png' " .. url .. "/api/who"))
    end)

    it("validates a query: 422 with every field's error, repeated parameters as lists", function()
        local json = require "cjson"
        local out = curl("-s -w '\n%{http_code} %{content_type}' '" .. url ..
            "/api/search?page=0&tag=ok&tag=toolong'")
        local body, status = out:match("^(.*)\n(%d+ .*)$")
        assert.equal("422 application/json", status, out)
        assert.same({ errors = { page = "at least 1", ["tag[2]"] = "at most 5 characters" } },
            json.decode(body))
        out = curl("-s '" .. url .. "/api/search?page=2&tag=a&tag=b&tag=a'")
        assert.same({ page = 2, tags = { "a", "b", "a" }, all = { "a", "b", "a" }, none = {} },
            json.decode(out))
        -- an empty list stays [] through res:json; one value is a list of one
        out = curl("-s '" .. url .. "/api/search'")
        assert.truthy(out:find('"tags":[]', 1, true), out)
        assert.truthy(out:find('"all":[]', 1, true), out)
        out = curl("-s '" .. url .. "/api/search?tag=x'")
        assert.truthy(out:find('"all":["x"]', 1, true), out)
    end)

    it("validates a JSON body and answers the JSON error envelopes", function()
        local json = require "cjson"
        local token = curl("-s " .. url .. "/form"):match('name="_csrf" value="([^"]+)"')
        local post = "-s -w '\n%{http_code}' -H 'X-CSRF-Token: " .. token ..
            "' -H 'Content-Type: application/json' " .. url .. "/api/notes -d "
        local body, status = curl(post .. [['{"title":"far too long a title","author":{}}']])
            :match("^(.*)\n(%d+)$")
        assert.equal("422", status)
        assert.same({ errors = { title = "at most 10 characters", ["author.name"] = "required" } },
            json.decode(body))
        body, status = curl(post .. [['{"title":"hi","x":1}']]):match("^(.*)\n(%d+)$")
        assert.equal("201", status)
        assert.same({ note = { title = "hi" }, missing = json.null }, json.decode(body))
        body, status = curl(post .. [['{"title":']]):match("^(.*)\n(%d+)$")
        assert.equal("400", status)
        local e = json.decode(body).error
        assert.equal(400, e.status)
        assert.truthy(e.message:find("invalid JSON", 1, true), body)
        body, status = curl("-s -w '\n%{http_code}' " .. url .. "/api/notes/7")
            :match("^(.*)\n(%d+)$")
        assert.equal("404", status)
        assert.same({ error = { status = 404, message = "no such note", id = "7" } },
            json.decode(body))
    end)
end)

describe("form tokens and the origin check over a real server (" .. server .. ")", function()
    local srv, url

    setup(function()
        srv = start(server, "spec/fixtures/forms.lua", true)
        url = "http://127.0.0.1:" .. srv.port
    end)

    teardown(function()
        srv:stop()
    end)

    local function status(args)
        return helper.curl("-o /dev/null -w '%{http_code}' " .. args)
    end

    -- A visitor with no cookie gets the form, then posts it back with what it was given.
    for _, where in ipairs({ "/s", "/c" }) do
        it("takes a token from a visitor's first page on the next request (" .. where .. ")", function()
            local jar = os.tmpname()
            local page = helper.curl("-c " .. jar .. " " .. url .. where .. "/login")
            local token = page:match('name="_csrf" value="([^"]+)"')
            assert.truthy(token, page)
            local form = "-d 'user=ada&_csrf=" .. token .. "' " .. url .. where .. "/login"
            assert.equal("welcome ada", helper.curl("-b " .. jar .. " " .. form))
            assert.equal("welcome ada", helper.curl("-b " .. jar .. " -H 'Origin: " .. url
                .. "' " .. form))
            assert.equal("403", status(form))                         -- without the cookie
            assert.equal("403", status("-b " .. jar .. " -d 'user=ada&_csrf=" .. token:sub(1, -3)
                .. "xx' " .. url .. where .. "/login"))                -- a wrong token
            assert.equal("403", status("-b " .. jar .. " -d 'user=ada' " .. url .. where
                .. "/login"))                                          -- no token
            -- another visitor's cookie with this token
            local other = os.tmpname()
            helper.curl("-c " .. other .. " " .. url .. where .. "/login")
            assert.equal("403", status("-b " .. other .. " " .. form))
            os.remove(jar)
            os.remove(other)
        end)
    end

    it("refuses cross-site posts by default, and lets a route opt out", function()
        assert.equal("200", status("-d x=1 " .. url .. "/open"))     -- curl: no Origin
        assert.equal("200", status("-H 'Origin: " .. url .. "' -d x=1 " .. url .. "/open"))
        assert.equal("403", status("-H 'Origin: http://evil.test' -d x=1 " .. url .. "/open"))
        assert.equal("403", status("-H 'Sec-Fetch-Site: cross-site' -d x=1 " .. url .. "/open"))
        assert.equal("403", status("-H 'Origin: null' -X DELETE " .. url .. "/open"))
        assert.equal("200", status("-H 'Origin: http://evil.test' -d x=1 " .. url .. "/hook"))
    end)

    it("compares the Origin with a trusted proxy's X-Forwarded-Host and -Proto", function()
        local public = "-H 'Origin: https://public.example' "
        assert.equal("403", status(public .. "-d x=1 " .. url .. "/open"))
        assert.equal("200", status(public .. "-H 'X-Forwarded-Host: public.example' -d x=1 "
            .. url .. "/open"))
        assert.equal("200", status(public .. "-H 'X-Forwarded-Host: public.example' "
            .. "-H 'X-Forwarded-Proto: https' -d x=1 " .. url .. "/open"))
        assert.equal("403", status("-H 'Origin: http://public.example' "
            .. "-H 'X-Forwarded-Host: public.example' -H 'X-Forwarded-Proto: https' -d x=1 "
            .. url .. "/open"))
    end)

    it("logs refusals as one line a second with their count", function()
        local function lines()
            local n, counts = 0, {}
            for count in srv:log():gmatch("refused (%d+) cross%-origin requests") do
                n = n + 1
                counts[n] = tonumber(count)
            end
            return n, counts
        end
        local socket = require "socket"
        socket.sleep(1.1)              -- past the second of the earlier cases' refusals
        local before = lines()
        local evil = "-H 'Origin: http://evil.test' -d x=1 " .. url .. "/open"
        local args = {}
        for i = 1, 20 do
            args[i] = evil
        end
        assert.equal(string.rep("403", 20), status(table.concat(args, " --next -o /dev/null "
            .. "-w '%{http_code}' ")))
        local n = lines()
        assert.equal(before + 1, n)    -- the first at once (with any earlier ones), 19 wait
        local counts
        socket.sleep(1.1)
        assert.equal("403", status(evil))
        n, counts = lines()
        assert.equal(before + 2, n)
        assert.equal(20, counts[n])
    end)
end)

end
