-- spec/it/demo_spec.lua: the demo site `moonserve` serves with no app file.
local helper = require "helper"

describe("the demo site", function()
    local srv, url

    setup(function()
        srv = helper.spawn_server {}
        url = "http://127.0.0.1:" .. srv.port
    end)

    teardown(function()
        srv:stop()
    end)

    it("serves its page, its JSON and its slow route", function()
        local page = helper.curl(url .. "/")
        assert.truthy(page:find("<h1>moonserve</h1>", 1, true), page)
        local status = require("cjson").decode(helper.curl(url .. "/api/status"))
        assert.equal("moonserve", status.server)
        assert.equal("slow", helper.curl(url .. "/slow"):match("<title>(%w+)</title>"))
    end)

    it("signs the guestbook from its own pages only, escaping what it shows", function()
        local origin = "-H 'Origin: " .. url .. "' "
        assert.equal("303", helper.curl("-o /dev/null -w '%{http_code}' " .. origin
            .. "--data-urlencode 'name=<b>Ada</b>' " .. url .. "/guestbook"))
        assert.equal("403", helper.curl("-o /dev/null -w '%{http_code}' "
            .. "-H 'Origin: http://evil.example' -d name=Eve " .. url .. "/guestbook"))
        -- as a browser posts the form from the page, and as another site's page would
        assert.equal("303", helper.curl("-o /dev/null -w '%{http_code}' " .. origin
            .. "-H 'Sec-Fetch-Site: same-origin' -d name=Grace " .. url .. "/guestbook"))
        assert.equal("403", helper.curl("-o /dev/null -w '%{http_code}' "
            .. "-H 'Sec-Fetch-Site: cross-site' -d name=Eve " .. url .. "/guestbook"))
        local page = helper.curl(url .. "/")
        assert.truthy(page:find("<li>Grace</li>", 1, true), page)
        assert.truthy(page:find("<li>&lt;b&gt;Ada&lt;/b&gt;</li>", 1, true), page)
        assert.falsy(page:find("Eve", 1, true))
    end)
end)

describe("the demo site with workers", function()
    it("shows a post on every read, whichever worker answers", function()
        local srv = helper.spawn_server { args = "--workers 4" }
        finally(function() srv:stop() end)
        local url = "http://127.0.0.1:" .. srv.port
        assert.equal("303", helper.curl("-o /dev/null -w '%{http_code}' -H 'Origin: " .. url
            .. "' -d name=Lin " .. url .. "/guestbook"))
        local seen = 0
        for _ = 1, 40 do
            if helper.curl(url .. "/"):find("<li>Lin</li>", 1, true) then
                seen = seen + 1
            end
        end
        assert.equal(40, seen)
    end)
end)
