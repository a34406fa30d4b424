-- spec/it/demo_spec.lua: the demo site `moonserve` serves with no app file (examples/demo.lua;
-- spec/it/browser_spec.lua runs it in a browser).
local helper = require "helper"
local cjson = require "cjson"

local function q(s)
    return "'" .. s:gsub("'", "'\\''") .. "'"
end

-- A visitor with a cookie jar: get(path) and post(path, fields, extra curl arguments).
local function visitor(url)
    local jar = os.tmpname()
    local v = { jar = jar }
    function v.get(path, extra)
        return helper.curl("-b " .. q(jar) .. " -c " .. q(jar) .. " " .. (extra or "") .. " "
            .. q(url .. path))
    end
    function v.token()
        return v.get("/"):match('name="_csrf" value="([^"]+)"')
    end
    -- The status of a POST of `fields` ({ "name=value", ... }), as the page's form sends it.
    function v.post(path, fields, extra)
        local args = { "-o /dev/null -w '%{http_code}'", "-H " .. q("Origin: " .. url) }
        for _, f in ipairs(fields) do
            args[#args + 1] = "--data-urlencode " .. q(f)
        end
        args[#args + 1] = extra or ""
        return v.get(path, table.concat(args, " "))
    end
    function v.done()
        os.remove(jar)
    end
    return v
end

describe("the demo site", function()
    local srv, url

    setup(function()
        srv = helper.spawn_server {}
        url = "http://127.0.0.1:" .. srv.port
    end)

    teardown(function()
        srv:stop()
    end)

    it("serves its page from a template, its files from the core, its JSON and its slow route",
        function()
            local page = helper.curl(url .. "/")
            assert.truthy(page:find("<h1>moonserve</h1>", 1, true), page)
            assert.truthy(page:find('<meta name="viewport" content="width=device-width, '
                .. 'initial-scale=1">', 1, true))
            assert.truthy(page:find('<link rel="stylesheet" href="/static/demo.css">', 1, true))
            local head = helper.curl("-D - -o /dev/null " .. url .. "/static/demo.js")
            assert.matches("content%-type: text/javascript", head:lower())
            head = helper.curl("-D - -o /dev/null " .. url .. "/")
            assert.matches("content%-security%-policy: default%-src 'none'; script%-src 'self'; "
                .. "style%-src 'self'; img%-src 'self'; connect%-src 'self'; form%-action 'self'; "
                .. "base%-uri 'none'; frame%-ancestors 'self'", head:lower())
            local status = cjson.decode(helper.curl(url .. "/api/status"))
            assert.equal("moonserve", status.server)
            assert.is_true(status.requests >= 3, cjson.encode(status))
            assert.is_true(status.connections >= 1)
            assert.equal(1, status.workers)
            assert.equal("slow", helper.curl(url .. "/slow"):match("<title>(%w+)</title>"))
            assert.matches("moonserve_requests_total %d+", helper.curl(url .. "/metrics"))
        end)

    it("signs the guestbook with a form token of the visitor's session, escaping the name",
        function()
            local ada, eve = visitor(url), visitor(url)
            finally(function()
                ada.done()
                eve.done()
            end)
            local token = assert(ada.token())
            assert.equal("303", ada.post("/guestbook", { "name=<b>Ada</b>", "_csrf=" .. token }))
            -- no token, another session's token, another site's page
            assert.equal("403", ada.post("/guestbook", { "name=Eve" }))
            assert.equal("403", eve.post("/guestbook", { "name=Eve", "_csrf=" .. token }))
            assert.equal("403", ada.post("/guestbook", { "name=Eve", "_csrf=" .. token },
                "-H 'Origin: http://evil.example'"))
            assert.equal("303", ada.post("/guestbook", { "name=Grace", "_csrf=" .. token },
                "-H 'Sec-Fetch-Site: same-origin'"))
            local page = ada.get("/")
            assert.truthy(page:find("<li>Grace</li>", 1, true), page)
            assert.truthy(page:find("<li>&lt;b&gt;Ada&lt;/b&gt;</li>", 1, true), page)
            assert.falsy(page:find("Eve", 1, true))
            -- the session remembers who signed, and counts the visits
            assert.truthy(page:find('Hello again, <b id="who">Grace</b>', 1, true), page)
            assert.matches('<b id="visits">%d+</b>', page)
            assert.falsy(eve.get("/"):find("Hello again", 1, true))
        end)
end)

describe("the demo site with workers", function()
    it("takes a form token on every worker, and shows a post on every read", function()
        local srv = helper.spawn_server { args = "--workers 4" }
        local lin = visitor("http://127.0.0.1:" .. srv.port)
        finally(function()
            lin.done()
            srv:stop()
        end)
        -- A token from one worker verifies on the others: they share the demo's secret.
        local token = lin.token()
        for _ = 1, 8 do
            assert.equal("303", lin.post("/guestbook", { "name=Lin", "_csrf=" .. token }))
        end
        local seen = 0
        for _ = 1, 40 do
            if helper.curl("http://127.0.0.1:" .. srv.port .. "/"):find("<li>Lin</li>", 1, true)
            then
                seen = seen + 1
            end
        end
        assert.equal(40, seen)
    end)
end)
