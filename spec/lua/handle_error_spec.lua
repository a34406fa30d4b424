-- app:handle_error, the app's policy for a handler's error, through the real engine and
-- dispatch, in-process.
describe("app:handle_error", function()
    local moonserve = require "moonserve"
    local App = require("moonserve.app").methods
    local helper = require "helper"

    it("can be overridden: the override answers the error", function()
        local app = moonserve.app()
        local seen
        function app:handle_error(req, res, err)
            seen = { app = self, path = req.path, err = err }
            res:status(503):header("retry-after", "5"):send("custom: try later\n")
        end
        app:get("/boom", function() error("kaboom") end)
        local status, headers, body = helper.simulate(app, "GET", "/boom")
        assert.equal(503, status)
        assert.equal("5", headers["retry-after"])
        assert.equal("custom: try later\n", body)
        assert.equal(app, seen.app)
        assert.equal("/boom", seen.path)
        assert.truthy(seen.err:find("kaboom", 1, true))
        assert.truthy(seen.err:find("stack traceback", 1, true))
    end)

    it("can add to the default, which logs and answers with the 500 page", function()
        local app = moonserve.app()
        function app:handle_error(req, res, err)
            res:header("x-seen", "1") -- dropped with the failed reply's fields: the page is new
            req.ctx.noted = true
            return App.handle_error(self, req, res, err)
        end
        app:error_page(500, function(req, res, info)
            return res:status(500):send("sorry, " .. info.ref .. (req.ctx.noted and " noted" or ""))
        end)
        app:get("/boom", function() error("kaboom") end)
        local status, headers, body = helper.simulate(app, "GET", "/boom")
        assert.equal(500, status)
        assert.is_nil(headers["x-seen"])
        assert.matches("^sorry, %x+ noted$", body)
    end)

    it("of a site serves the site's requests; the app's serves the rest", function()
        local app = moonserve.app()
        local site = app:site("a.example")
        function site.handle_error(_, _, res)
            res:status(500):send("site's policy")
        end
        app:get("/boom", function() error("app kaboom") end)
        site:get("/boom", function() error("site kaboom") end)
        local status, _, body = helper.simulate(app, "GET", "/boom", { host = "a.example" })
        assert.equal(500, status)
        assert.equal("site's policy", body)
        status, _, body = helper.simulate(app, "GET", "/boom", { host = "other.example" })
        assert.equal(500, status)
        assert.matches("^500 Internal Server Error\nreference: %x+\n$", body)
    end)

    it("that sends nothing, or raises, leaves a bare 500 to the host", function()
        local quiet = moonserve.app()
        function quiet.handle_error() end
        quiet:get("/boom", function(_, res)
            res:header("x-before", "1")
            error("kaboom")
        end)
        local status, headers, body = helper.simulate(quiet, "GET", "/boom")
        assert.equal(500, status)
        assert.is_nil(headers["x-before"])
        local _
        assert.equal("500 Internal Server Error\n", body)

        local broken = moonserve.app()
        function broken.handle_error() error("the policy is broken too") end
        broken:get("/boom", function() error("kaboom") end)
        status, _, body = helper.simulate(broken, "GET", "/boom")
        assert.equal(500, status)
        assert.equal("500 Internal Server Error\n", body)
        -- and the worker goes on
        broken:get("/fine", function() return "fine" end)
        assert.equal("fine", select(3, helper.simulate(broken, "GET", "/fine")))
    end)

    it("is told of an error after the head left; the host cuts the reply off", function()
        local app = moonserve.app()
        local told
        function app:handle_error(req, res, err)
            told = res:sent()
            return App.handle_error(self, req, res, err)
        end
        app:get("/stream", function(_, res)
            res:write("part one\n")
            error("midway")
        end)
        local run = helper.memory_server(app)
        local out = run("GET /stream HTTP/1.1\r\nHost: test\r\n\r\n")
        assert.is_true(told)
        assert.truthy(out:find("part one", 1, true))
        assert.falsy(out:find("\r\n0\r\n\r\n", 1, true)) -- no last chunk: cut off
    end)
end)
