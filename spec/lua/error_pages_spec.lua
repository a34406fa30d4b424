-- The default error pages: text, JSON or HTML as the request's Accept asks (app:error).
local moonserve = require "moonserve"
local cjson = require "cjson"

local BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"

local function app_of(opts)
    local app = moonserve.app(opts)
    app:get("/boom", function()
        error("broken <script>alert(1)</script>")
    end)
    return app
end

describe("the default error pages", function()
    it("are text for a client that accepts anything (curl's */*) or says nothing", function()
        local t = app_of():test{ quiet = true }
        for _, accept in ipairs({ "*/*", false }) do
            local r = t:get("/missing", { headers = { accept = accept or nil } })
            assert.equal(404, r.status)
            assert.matches("^text/plain", r.headers["content-type"])
            assert.equal("404 Not Found\n", r.body)
        end
    end)

    it("are the JSON error envelope for an API client, the reference in it", function()
        local t = app_of():test{ quiet = true }
        local r = t:get("/missing", { headers = { accept = "application/json" } })
        assert.equal(404, r.status)
        assert.matches("^application/json", r.headers["content-type"])
        assert.same({ error = { status = 404, message = "Not Found" } }, cjson.decode(r.body))
        r = t:post("/boom", { headers = { accept = "application/json" } })
        assert.equal(405, r.status)
        assert.same("Method Not Allowed", cjson.decode(r.body).error.message)
        r = t:get("/boom", { headers = { accept = "application/json" } })
        assert.equal(500, r.status)
        local body = cjson.decode(r.body).error
        assert.equal("Internal Server Error", body.message)
        assert.is_string(body.ref)
        assert.is_nil(body.trace) -- not in production
        assert.truthy(r:logged(body.ref))
    end)

    it("are an HTML page for a browser, with the trace escaped in dev mode", function()
        local t = app_of{ dev = true }:test{ quiet = true }
        local r = t:get("/missing", { headers = { accept = BROWSER } })
        assert.equal(404, r.status)
        assert.matches("^text/html", r.headers["content-type"])
        assert.matches("<h1>404 Not Found</h1>", r.body, 1, true)
        r = t:get("/boom", { headers = { accept = BROWSER } })
        assert.equal(500, r.status)
        assert.matches("<pre>", r.body, 1, true)
        assert.matches("broken &lt;script&gt;alert(1)&lt;/script&gt;", r.body, 1, true)
        assert.is_nil(r.body:find("<script>", 1, true))
    end)

    it("give way to the app's own page", function()
        local app = app_of()
        app:error_page(404, function(_, res) res:status(404):send("mine") end)
        local r = app:test():get("/missing", { headers = { accept = "application/json" } })
        assert.equal("mine", r.body)
    end)
end)
