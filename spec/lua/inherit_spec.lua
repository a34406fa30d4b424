-- A site has what its app has unless it sets its own: security, error pages, dev, views,
-- path settings and middleware, through the real engine and dispatch, in-process.
describe("a site inherits from its app", function()
    local moonserve = require "moonserve"
    local inherited = require("moonserve.app").inherited
    local helper = require "helper"

    local function get(app, host, path)
        return helper.simulate(app, "GET", path or "/", { host = host })
    end

    it("looks a key up on the site, then its app (inherited)", function()
        local app = moonserve.app { dev = true }
        local site = app:site("a.example")
        local own = app:site("b.example", { dev = false })
        assert.is_true(inherited(site, "dev"))
        assert.is_false(inherited(own, "dev"))
        app:error_page(404, print)
        own:error_page(404, tostring)
        assert.equal(print, inherited(site, "error_pages", 404))
        assert.equal(tostring, inherited(own, "error_pages", 404))
        assert.is_nil(inherited(site, "error_pages", 500))
        assert.is_nil(inherited(app, "views_engine"))
    end)

    it("has its app's security headers, or its own", function()
        local app = moonserve.app { security = { frame = "DENY" } }
        app:site("a.example"):get("/", function() return "a" end)
        local own = app:site("b.example", { security = { frame = false } })
        own:get("/", function() return "b" end)
        app:site("c.example"):security { frame = "SAMEORIGIN", csp = "default-src 'self'" }
            :get("/", function() return "c" end)
        local _, h = get(app, "a.example")
        assert.equal("DENY", h["x-frame-options"])
        _, h = get(app, "b.example")
        assert.is_nil(h["x-frame-options"])
        _, h = get(app, "c.example")
        assert.equal("SAMEORIGIN", h["x-frame-options"])
        assert.matches("^default%-src 'self'", h["content-security-policy"])
    end)

    it("has its app's error pages, or its own", function()
        local app = moonserve.app()
        app:error_page(404, function(_, res) return res:status(404):send("app's 404") end)
        app:site("a.example")
        app:site("b.example"):error_page(404, function(_, res)
            return res:status(404):send("b's 404")
        end)
        local status, _, body = get(app, "a.example", "/none")
        assert.equal(404, status)
        assert.equal("app's 404", body)
        status, _, body = get(app, "b.example", "/none")
        assert.equal(404, status)
        assert.equal("b's 404", body)
    end)

    it("has its app's dev mode, or its own", function()
        local app = moonserve.app { dev = true }
        app:site("a.example"):get("/boom", function() error("a kaboom") end)
        app:site("b.example", { dev = false }):get("/boom", function() error("b kaboom") end)
        local prod = moonserve.app()
        prod:site("c.example", { dev = true }):get("/boom", function() error("c kaboom") end)
        local status, _, body = get(app, "a.example", "/boom")
        assert.equal(500, status)
        assert.truthy(body:find("a kaboom", 1, true))
        status, _, body = get(app, "b.example", "/boom")
        assert.equal(500, status)
        assert.falsy(body:find("b kaboom", 1, true))
        assert.matches("reference: %x+", body)
        status, _, body = get(prod, "c.example", "/boom")
        assert.equal(500, status)
        assert.truthy(body:find("c kaboom", 1, true))
    end)

    it("has its app's views, or its own", function()
        local app = moonserve.app()
        local views = app:views { root = "views-app" }
        local function which(_, res)
            return res.views == views and "app's" or res.views and res.views.root or "none"
        end
        app:site("a.example"):get("/", which)
        local b = app:site("b.example")
        b:views { root = "views-b" }
        b:get("/", which)
        assert.equal("app's", select(3, get(app, "a.example")))
        assert.equal("views-b", select(3, get(app, "b.example")))
    end)

    it("has its app's path settings, or its own", function()
        local app = moonserve.app { trailing_slash = "add" }
        app:site("a.example"):get("/x/", function() return "x" end)
        app:site("b.example", { trailing_slash = "keep", canonical = false })
            :get("/y", function() return "y" end)
        local status, h = get(app, "a.example", "/x")
        assert.equal(308, status)
        assert.equal("/x/", h["location"])
        assert.equal("y", select(3, get(app, "b.example", "/y")))
        assert.equal(404, (get(app, "b.example", "//y")))
        assert.has_error(function() app:site("c.example", { trailing_slash = "drop" }) end,
            "bad trailing_slash (strip, add or keep)")
    end)

    it("runs its app's middleware, then its own", function()
        local app = moonserve.app()
        local order
        app:use(function(_, res, nxt)
            order[#order + 1] = "app"
            res:header("x-by", "app")
            return nxt()
        end)
        local site = app:site("a.example")
        site:use(function(_, _, nxt)
            order[#order + 1] = "site"
            return nxt()
        end)
        site:get("/", function() return "site" end)
        app:get("/", function() return "app" end)
        order = {}
        local _, h, body = get(app, "a.example")
        assert.equal("site", body)
        assert.equal("app", h["x-by"])
        assert.same({ "app", "site" }, order)
        order = {}
        assert.equal("app", select(3, get(app, "other.example")))
        assert.same({ "app" }, order)
        -- middleware the app adds later reaches the site too
        app:use(function(_, _, nxt)
            order[#order + 1] = "app, later"
            return nxt()
        end)
        order = {}
        get(app, "a.example")
        assert.same({ "app", "app, later", "site" }, order)
    end)
end)
