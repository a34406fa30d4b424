describe("moonserve.cors", function()
    local cors = require "moonserve.cors"

    -- A request with these fields (lowercase names) and a reply that records what it got.
    local function exchange(method, fields)
        local req = { method = method, header = function(_, name) return fields[name] end }
        local res = { status_code = 200, fields = {}, hooks = {} }
        function res:status(code) self.status_code = code; return self end
        function res:header(name, value)
            self.fields[#self.fields + 1] = { name, value }
            return self
        end
        function res:before_send(fn) self.hooks[#self.hooks + 1] = fn; return self end
        function res:send(body)
            for _, fn in ipairs(self.hooks) do fn(self) end
            self.body = body or ""
            return true
        end
        return req, res
    end

    -- Every value of field `name`, in order.
    local function all(res, name)
        local out = {}
        for _, f in ipairs(res.fields) do
            if f[1] == name then
                out[#out + 1] = f[2]
            end
        end
        return out
    end
    local function one(res, name)
        return all(res, name)[1]
    end

    -- Runs the middleware; the route's handler, if reached, answers 200 "route".
    local function run(mw, method, fields)
        local req, res = exchange(method, fields)
        local reached = false
        mw(req, res, function()
            reached = true
            res:header("vary", "Accept-Encoding")
            return res:send("route")
        end)
        return res, reached
    end

    local APP = "https://app.example"

    describe("a list of origins, with credentials", function()
        local mw = cors.middleware { origins = { APP, "https://admin.example:8443/" },
            credentials = true, expose = { "x-total" }, max_age = 600 }

        it("answers a preflight itself, 204 with the policy's fields", function()
            local res, reached = run(mw, "OPTIONS", { origin = APP,
                ["access-control-request-method"] = "PUT",
                ["access-control-request-headers"] = "content-type, x-csrf-token" })
            assert.is_false(reached)
            assert.equal(204, res.status_code)
            assert.equal(APP, one(res, "access-control-allow-origin"))
            assert.equal("true", one(res, "access-control-allow-credentials"))
            assert.equal("GET, HEAD, PUT, PATCH, POST, DELETE",
                one(res, "access-control-allow-methods"))
            assert.equal("content-type, x-csrf-token", one(res, "access-control-allow-headers"))
            assert.equal("600", one(res, "access-control-max-age"))
            assert.same({ "Origin", "Access-Control-Request-Headers" }, all(res, "vary"))
        end)

        it("lets a plain OPTIONS (no Access-Control-Request-Method) reach the route", function()
            local _, reached = run(mw, "OPTIONS", { origin = APP })
            assert.is_true(reached)
        end)

        it("adds the fields to an allowed request's reply, Vary after the route's own", function()
            local res, reached = run(mw, "GET", { origin = APP })
            assert.is_true(reached)
            assert.equal(APP, one(res, "access-control-allow-origin"))
            assert.equal("true", one(res, "access-control-allow-credentials"))
            assert.equal("x-total", one(res, "access-control-expose-headers"))
            assert.same({ "Accept-Encoding", "Origin" }, all(res, "vary"))
            assert.is_nil(one(res, "access-control-max-age"))
        end)

        it("takes an origin written with a slash or its port as browsers send it", function()
            local res = run(mw, "GET", { origin = "https://admin.example:8443" })
            assert.equal("https://admin.example:8443", one(res, "access-control-allow-origin"))
            local m2 = cors.middleware { origins = { "HTTPS://App.Example:443/" } }
            assert.equal(APP, one(run(m2, "GET", { origin = APP }), "access-control-allow-origin"))
        end)

        it("gives no fields but Vary to a request without Origin", function()
            local res = run(mw, "GET", {})
            assert.is_nil(one(res, "access-control-allow-origin"))
            assert.same({ "Accept-Encoding", "Origin" }, all(res, "vary"))
        end)

        for _, hostile in ipairs {
            "null",                                   -- sandboxed frames, data: URLs
            "https://app.example.evil.test",          -- the allowed one is only a prefix
            "https://evil.test",
            "http://app.example",                     -- another scheme
            "https://app.example:444",                -- another port
            "https://app.example/",                   -- not how browsers send it
            "https://APP.example",
            "https://app.example\r\nset-cookie: a=b", -- injection
            "https://user@app.example",
        } do
            it("refuses Origin " .. ("%q"):format(hostile), function()
                local res, reached = run(mw, "GET", { origin = hostile })
                assert.is_true(reached) -- CORS guards reading; the request itself goes on
                assert.is_nil(one(res, "access-control-allow-origin"))
                assert.is_nil(one(res, "access-control-allow-credentials"))
                assert.same({ "Accept-Encoding", "Origin" }, all(res, "vary"))
                local pre, pre_reached = run(mw, "OPTIONS", { origin = hostile,
                    ["access-control-request-method"] = "DELETE" })
                assert.is_false(pre_reached)
                assert.equal(403, pre.status_code)
                assert.is_nil(one(pre, "access-control-allow-origin"))
                assert.is_nil(one(pre, "access-control-allow-methods"))
                assert.same({ "Origin" }, all(pre, "vary"))
            end)
        end
    end)

    describe("a pattern", function()
        it("spans the whole origin, anchored or not", function()
            for _, p in ipairs { "https://[%w-]+%.app%.example", "^https://[%w-]+%.app%.example",
                "https://[%w-]+%.app%.example$", "^https://[%w-]+%.app%.example$" } do
                local mw = cors.middleware { origins = p }
                local function allowed(o)
                    return one(run(mw, "GET", { origin = o }), "access-control-allow-origin")
                end
                assert.equal("https://a.app.example", allowed("https://a.app.example"), p)
                assert.is_nil(allowed("https://a.app.example.evil.test"), p)
                assert.is_nil(allowed("https://evil.test?https://a.app.example"), p)
                assert.is_nil(allowed("xhttps://a.app.example"), p)
                assert.is_nil(allowed("null"), p)
            end
        end)

        it("is never matched against a malformed origin, however loose", function()
            local mw = cors.middleware { origins = "https://.*" }
            for _, o in ipairs { "https://evil.test/x", "https://a@b.test", "https://a b.test",
                "https://a.test\r\nx: y", "https://" } do
                assert.is_nil(one(run(mw, "GET", { origin = o }), "access-control-allow-origin"), o)
            end
            assert.equal("https://ok.test",
                one(run(mw, "GET", { origin = "https://ok.test" }), "access-control-allow-origin"))
        end)

        it("keeps an escaped $ as a character", function()
            local mw = cors.middleware { origins = "https://a%.test%$" }
            assert.is_nil(one(run(mw, "GET", { origin = "https://a.test" }),
                "access-control-allow-origin"))
        end)

        it("raises at definition when it is no pattern", function()
            assert.has_error(function() cors.middleware { origins = "https://[a" } end)
        end)
    end)

    describe("a function", function()
        it("decides with the origin and the request", function()
            local seen
            local mw = cors.middleware { origins = function(origin, req)
                seen = req
                return origin:sub(-8) == ".example" and req.method == "GET"
            end }
            local res = run(mw, "GET", { origin = "https://x.example" })
            assert.equal("https://x.example", one(res, "access-control-allow-origin"))
            assert.equal("GET", seen.method)
            assert.is_nil(one(run(mw, "POST", { origin = "https://x.example" }),
                "access-control-allow-origin"))
        end)

        it("never sees null or a malformed origin, and a truthy non-true is no", function()
            local calls = 0
            local mw = cors.middleware { origins = function() calls = calls + 1; return true end }
            run(mw, "GET", { origin = "null" })
            run(mw, "GET", { origin = "https://a.test/\r\n" })
            assert.equal(0, calls)
            local m2 = cors.middleware { origins = function() return "yes" end }
            assert.is_nil(one(run(m2, "GET", { origin = "https://a.test" }),
                "access-control-allow-origin"))
        end)
    end)

    describe("\"*\"", function()
        it("answers * to any origin, null too, without Vary: Origin", function()
            local mw = cors.middleware { origins = "*" }
            for _, o in ipairs { "https://a.test", "null" } do
                local res = run(mw, "GET", { origin = o })
                assert.equal("*", one(res, "access-control-allow-origin"))
                assert.is_nil(one(res, "access-control-allow-credentials"))
                assert.same({ "Accept-Encoding" }, all(res, "vary"))
            end
        end)

        it("raises with credentials, at definition", function()
            assert.has_error(function()
                cors.middleware { origins = "*", credentials = true }
            end, "cors origins \"*\" cannot go with credentials: list the origins")
        end)
    end)

    describe("headers and methods", function()
        it("sends the configured headers and methods, whatever is asked", function()
            local mw = cors.middleware { origins = { APP }, methods = { "get", "post" },
                headers = { "content-type", "authorization" } }
            local res = run(mw, "OPTIONS", { origin = APP,
                ["access-control-request-method"] = "DELETE",
                ["access-control-request-headers"] = "x-evil" })
            assert.equal("GET, POST", one(res, "access-control-allow-methods"))
            assert.equal("content-type, authorization", one(res, "access-control-allow-headers"))
            assert.same({ "Origin" }, all(res, "vary"))
        end)

        it("does not echo requested headers that are not field names", function()
            local mw = cors.middleware { origins = { APP } }
            local res = run(mw, "OPTIONS", { origin = APP,
                ["access-control-request-method"] = "PUT",
                ["access-control-request-headers"] = "x-a, x b" })
            assert.equal(204, res.status_code)
            assert.is_nil(one(res, "access-control-allow-headers"))
        end)
    end)

    it("refuses misuse at definition", function()
        for _, bad in ipairs {
            {},
            { origins = { "app.example" } },
            { origins = { "https://app.example/path" } },
            { origins = { "null" } },
            { origins = { APP }, colour = "red" },
            { origins = { APP }, credentials = "yes" },
            { origins = { APP }, max_age = -1 },
            { origins = { APP }, headers = { "x a" } },
            { origins = { APP }, methods = { "GET\r\n" } },
            { origins = 42 },
        } do
            assert.has_error(function() cors.middleware(bad) end)
        end
    end)

    it("is moonserve.cors, and loads without the server core", function()
        assert.is_function(require("moonserve").cors)
        assert.is_nil(package.loaded["moonserve.host.core.base"])
    end)
end)
