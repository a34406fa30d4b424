-- The framework through the real engine and dispatch, in-process (no socket).
describe("moonserve.app", function()
    local moonserve = require "moonserve"
    local helper = require "helper"

    it("routes to a handler and sends text by default", function()
        local app = moonserve.app()
        app:get("/users/:id", function(req, res) res:send("user " .. req.params.id) end)
        local status, headers, body = helper.simulate(app, "GET", "/users/7")
        assert.equal(200, status)
        assert.equal("user 7", body)
        assert.equal("text/plain; charset=utf-8", headers["content-type"])
    end)

    it("takes status, body and headers returned by a handler", function()
        local app = moonserve.app()
        app:get("/t", function() return 201, "made", { ["x-a"] = "1" } end)
        app:get("/s", function() return "just text" end)
        app:get("/j", function() return 200, { ok = true } end)
        local _
        local status, headers, body = helper.simulate(app, "GET", "/t")
        assert.equal(201, status)
        assert.equal("made", body)
        assert.equal("1", headers["x-a"])
        status, _, body = helper.simulate(app, "GET", "/s")
        assert.equal(200, status)
        assert.equal("just text", body)
        _, headers, body = helper.simulate(app, "GET", "/j")
        assert.equal("application/json", headers["content-type"])
        assert.equal('{"ok":true}', body)
    end)

    it("answers 404 and 405 with Allow", function()
        local app = moonserve.app()
        app:post("/only-post", function(_, res) res:send("x") end)
        assert.equal(404, (helper.simulate(app, "GET", "/nope")))
        local status, headers = helper.simulate(app, "GET", "/only-post")
        assert.equal(405, status)
        assert.equal("POST", headers["allow"])
    end)

    it("runs middleware around the handler, which may answer itself", function()
        local app = moonserve.app()
        local order = {}
        app:use(function(_, res, next)
            order[#order + 1] = "before"
            res:header("x-mw", "1")
            local r = next()
            order[#order + 1] = "after"
            return r
        end)
        app:use(function(req, res, next)
            if req.query.deny then return res:status(403):send("no") end
            return next()
        end)
        app:get("/", function(_, res) order[#order + 1] = "handler"; res:send("ok") end)
        local status, headers = helper.simulate(app, "GET", "/")
        assert.equal(200, status)
        assert.equal("1", headers["x-mw"])
        assert.same({ "before", "handler", "after" }, order)
        assert.equal(403, (helper.simulate(app, "GET", "/?deny=1")))
    end)

    it("answers OPTIONS with what the path allows, and OPTIONS * with every method", function()
        local app = moonserve.app()
        app:get("/x", function(_, res) res:send("x") end)
        app:post("/x", function(_, res) res:send("x") end)
        local status, headers = helper.simulate(app, "OPTIONS", "/x")
        assert.equal(204, status)
        assert.equal("GET, HEAD, POST", headers["allow"])
        status, headers = helper.simulate(app, "OPTIONS", "*")
        assert.equal(204, status)
        assert.truthy(headers["allow"]:find("DELETE", 1, true))
        assert.equal(404, (helper.simulate(app, "OPTIONS", "/nothing")))
    end)

    it("runs route groups under a prefix with their own middleware, and route middleware", function()
        local app = moonserve.app()
        local seen = {}
        app:use(function(_, _, next) seen[#seen + 1] = "app"; return next() end)
        local admin = app:group("/admin", function(g)
            g:use(function(req, res, next)
                seen[#seen + 1] = "group"
                if not req:header("x-admin") then return res:status(403):send("no") end
                return next()
            end)
            g:get("/users", function(_, _, next)
                seen[#seen + 1] = "route"
                return next()
            end, function(_, res) seen[#seen + 1] = "handler"; res:send("users") end)
        end)
        admin:group("/deep"):get("/x", function(_, res) res:send("deep") end)
        app:get("/open", function(_, res) res:send("open") end)
        assert.equal(403, (helper.simulate(app, "GET", "/admin/users")))
        seen = {}
        local _, _, body = helper.simulate(app, "GET", "/admin/users", { headers = { ["x-admin"] = "1" } })
        assert.equal("users", body)
        assert.same({ "app", "group", "route", "handler" }, seen)
        assert.equal(403, (helper.simulate(app, "GET", "/admin/deep/x")))
        assert.equal("open", select(3, helper.simulate(app, "GET", "/open")))
    end)

    it("keeps a route's chain as its middleware grows, and lets next run the rest again",
        function()
        local app = moonserve.app()
        local seen = {}
        local g = app:group("/g", function(grp)
            grp:get("/r", function(_, _, next)
                seen[#seen + 1] = "route"
                local ok, r = pcall(next) -- a middleware may hand next to pcall
                assert(ok, r)
                return r
            end, function(_, res) seen[#seen + 1] = "handler"; res:send("r") end)
        end)
        assert.equal("r", select(3, helper.simulate(app, "GET", "/g/r")))
        assert.same({ "route", "handler" }, seen)
        -- Middleware added after a first request (the chain made for the route then) counts.
        app:use(function(_, _, next) seen[#seen + 1] = "app"; return next() end)
        g:use(function(_, _, next) seen[#seen + 1] = "group"; return next() end)
        seen = {}
        assert.equal("r", select(3, helper.simulate(app, "GET", "/g/r")))
        assert.same({ "app", "group", "route", "handler" }, seen)
        -- next() twice (a retry) runs the rest of the chain twice, from where it was given.
        local retry = moonserve.app()
        local runs = 0
        retry:get("/", function(_, _, next)
            next()
            return next()
        end, function(_, _, next) runs = runs + 1; return next() end,
            function(_, res) if not res:sent() then res:send("once") end end)
        assert.equal(200, (helper.simulate(retry, "GET", "/")))
        assert.equal(2, runs)
    end)

    it("names routes and builds their URLs", function()
        local app = moonserve.app()
        app:get("user", "/users/:id", function(req, res) res:send(req.params.id) end)
        assert.equal("/users/42", app:url_for("user", { id = 42 }))
        assert.equal("42", select(3, helper.simulate(app, "GET", "/users/42")))
    end)

    it("mounts another app under a prefix", function()
        local blog = moonserve.app()
        blog:get("/", function(req, res) res:send("blog home " .. req.base_path) end)
        blog:get("/posts/:id", function(req, res) res:send("post " .. req.params.id .. " at " .. req.path) end)
        local app = moonserve.app()
        app:mount("/blog", blog)
        blog:get("/about", function(req, res) res:send(tostring(req.params.splat)) end)
        assert.equal("nil", select(3, helper.simulate(app, "GET", "/blog/about")))
        assert.equal("blog home /blog", select(3, helper.simulate(app, "GET", "/blog")))
        assert.equal("post 3 at /posts/3", select(3, helper.simulate(app, "GET", "/blog/posts/3")))
        assert.equal(404, (helper.simulate(app, "GET", "/blog/nope")))
    end)

    it("routes an HTTP/2 WebSocket's CONNECT into a mounted app as it routes the GET", function()
        -- RFC 8441: over HTTP/2 a browser opens a WebSocket with CONNECT and :protocol.
        local websocket = require "moonserve.websocket"
        local serve, seen = websocket.serve, {}
        websocket.serve = function(req, res) -- the handshake itself needs the core
            seen[#seen + 1] = req.method .. " " .. req.base_path .. " " .. req.path
            return res:send("upgraded")
        end
        local inner = moonserve.app()
        local ok, err = pcall(inner.websocket, inner, "/live", function() end)
        websocket.serve = serve
        assert(ok, err)
        inner:get("/page", function(_, res) res:send("page") end)
        local app = moonserve.app()
        app:use(moonserve.sessions { secret = string.rep("s", 32) })
        app:use(moonserve.csrf { secret = string.rep("t", 32) })
        app:mount("/chat", inner)
        -- A request and reply made in Lua: the fields and methods app:handle uses.
        local function handle(method, path, fields)
            fields.host = "test"
            local req = setmetatable({ method = method, path = path, target = path,
                query_string = "", id = 1, tls = true }, require("moonserve.request_methods")
                .metatable({}, {
                    header = function(_, name) return fields[name:lower()] end,
                    headers = function() return fields end,
                    _static_dir = function() return false end,
                }))
            local res = { code = 200 }
            function res:status(c) self.code = c return self end
            function res:header() return self end
            function res:cookie() return self end
            function res:before_send() return self end
            function res:_fields_checked() return self end
            function res:send(b) self.body = b or "" return true end
            function res:sent() return self.body ~= nil end
            function res:_reset() self.code = 200 return true end
            local r = app:handle(req, res)
            return res.code, res.body, r
        end
        local code, body = handle("CONNECT", "/chat/live", { [":protocol"] = "websocket",
            origin = "https://test", ["sec-websocket-version"] = "13" })
        assert.equal(200, code, body)
        assert.equal("upgraded", body)
        code = handle("GET", "/chat/live", { upgrade = "websocket", connection = "Upgrade" })
        assert.equal(200, code)
        assert.same({ "CONNECT /chat /live", "GET /chat /live" }, seen)
        -- Any other CONNECT under the mount is the mounted app's to refuse.
        assert.equal(405, (handle("CONNECT", "/chat/page", { [":protocol"] = "websocket",
            origin = "https://test" })))
    end)

    it("sends a mounted app's security fields, once, in place of its parent's", function()
        local inner = moonserve.app()
        inner:get("/", function(_, res) res:send("in") end)
        local bare = moonserve.app():security(false)
        bare:get("/", function(_, res) res:send("bare") end)
        local app = moonserve.app()
        app:get("/", function(_, res) res:send("out") end)
        app:mount("/in", inner)
        app:mount("/bare", bare)
        local run = helper.memory_server(app)
        local function count(path)
            local out = run("GET " .. path .. " HTTP/1.1\r\nHost: test\r\n\r\n")
            local _, n = out:gsub("\r\nx%-content%-type%-options: nosniff\r\n", "")
            return n, out
        end
        for path, want in pairs({ ["/"] = 1, ["/in"] = 1, ["/in/x"] = 1, ["/bare"] = 0,
            ["/bare/nope"] = 0, ["/inside"] = 1 }) do
            local n, out = count(path)
            assert.equal(want, n, path .. ": " .. out)
        end
    end)

    it("redirects a non-canonical path to the canonical one with 308, keeping the query", function()
        local app = moonserve.app()
        app:get("/users/:id", function(req, res) res:send(req.params.id) end)
        local status, headers = helper.simulate(app, "GET", "/users//7/?x=1")
        assert.equal(308, status)
        assert.equal("/users/7?x=1", headers["location"])
        status, headers = helper.simulate(app, "GET", "/users/./%37")
        assert.equal(308, status)
        assert.equal("/users/7", headers["location"])
        assert.equal("7", select(3, helper.simulate(app, "GET", "/users/7")))
        local loose = moonserve.app { canonical = false }
        loose:get("/a/", function(_, res) res:send("slash") end)
        assert.equal("slash", select(3, helper.simulate(loose, "GET", "/a/")))
    end)

    it("sends security headers by default, HSTS only over TLS, and lets a site opt out", function()
        local app = moonserve.app()
        app:get("/", function(_, res) res:send("ok") end)
        local _, h = helper.simulate(app, "GET", "/")
        assert.equal("nosniff", h["x-content-type-options"])
        assert.equal("strict-origin-when-cross-origin", h["referrer-policy"])
        assert.equal("SAMEORIGIN", h["x-frame-options"])
        assert.equal("frame-ancestors 'self'", h["content-security-policy"])
        assert.is_nil(h["strict-transport-security"]) -- plain HTTP, no trusted proxy
        local site = app:site("open.example"):security(false)
        site:get("/", function(_, res) res:send("site") end)
        _, h = helper.simulate(app, "GET", "/", { host = "open.example" })
        assert.is_nil(h["x-content-type-options"])
        local strict = moonserve.app { security = { csp = "default-src 'self'", frame = "DENY" } }
        strict:get("/", function(_, res) res:send("ok") end)
        _, h = helper.simulate(strict, "GET", "/")
        assert.equal("default-src 'self'; frame-ancestors 'none'", h["content-security-policy"])
        assert.equal("DENY", h["x-frame-options"])
        -- error pages carry them too
        _, h = helper.simulate(app, "GET", "/missing")
        assert.equal("nosniff", h["x-content-type-options"])
    end)

    it("refuses cross-site unsafe requests with 403 before any middleware or handler runs", function()
        local app = moonserve.app()
        local ran = 0
        app:use(function(_, _, next) ran = ran + 1; return next() end)
        app:post("/form", function(_, res) res:send("taken") end)
        app:get("/form", function(_, res) res:send("page") end)
        local function post(headers, method)
            local status, _, body = helper.simulate(app, method or "POST", "/form",
                { headers = headers, body = "" })
            return status, body
        end
        for _, method in ipairs({ "POST", "PUT", "PATCH", "DELETE", "PROPFIND" }) do
            assert.equal(403, (post({ ["Sec-Fetch-Site"] = "cross-site" }, method)), method)
        end
        assert.equal(403, (post { ["Sec-Fetch-Site"] = "same-site" }))
        assert.equal(403, (post { Origin = "http://evil.example" }))
        assert.equal(403, (post { Origin = "http://test:8080" }))
        assert.equal(403, (post { Origin = "null" }))
        assert.equal(0, ran)
        assert.equal(200, (post {}))                                -- curl, other servers
        assert.equal(200, (post { ["Sec-Fetch-Site"] = "same-origin", Origin = "http://test" }))
        assert.equal(200, (post { ["Sec-Fetch-Site"] = "none" }))
        assert.equal(200, (post({ ["Sec-Fetch-Site"] = "cross-site" }, "GET")))
        assert.equal(405, (post({ Origin = "http://test" }, "PUT")))
        assert.equal(5, ran)
    end)

    it("lets an app allow origins and same-site, and turn the check off per app, site or route", function()
        local function app_with(opts)
            local app = moonserve.app(opts)
            app:post("/", function(_, res) res:send("taken") end)
            return app
        end
        local function status(app, headers, host)
            return (helper.simulate(app, "POST", "/", { headers = headers, host = host, body = "" }))
        end
        local cross = { ["Sec-Fetch-Site"] = "cross-site", Origin = "https://app.example.net" }
        local sibling = { ["Sec-Fetch-Site"] = "same-site", Origin = "http://blog.test" }
        assert.equal(200, status(app_with { security = { csrf = { origins = {
            "https://app.example.net" } } } }, cross))
        assert.equal(200, status(app_with { security = { csrf = { same_site = true } } }, sibling))
        assert.equal(403, status(app_with { security = { csrf = { same_site = true } } }, cross))
        assert.equal(200, status(app_with { security = { csrf = false } }, cross))
        -- a site: its own setting, else its app's; security(false) drops headers, not the check
        local app = app_with()
        app:site("open.test"):security({ csrf = false }):post("/", function(_, res) res:send("s") end)
        app:site("bare.test"):security(false):post("/", function(_, res) res:send("s") end)
        app:site("plain.test"):post("/", function(_, res) res:send("s") end)
        assert.equal(403, status(app, cross))
        assert.equal(200, status(app, cross, "open.test"))
        assert.equal(403, status(app, cross, "bare.test"))
        assert.equal(403, status(app, cross, "plain.test"))
        local off = app_with { security = { csrf = false } }
        off:site("plain.test"):post("/", function(_, res) res:send("s") end)
        assert.equal(200, status(off, cross, "plain.test"))
        -- a route
        local hooks = moonserve.app()
        hooks:post("/hook", function(_, res) res:send("hook") end, { csrf = false })
        hooks:post("/form", function(_, res) res:send("form") end)
        assert.equal(200, (helper.simulate(hooks, "POST", "/hook", { headers = cross, body = "" })))
        assert.equal(403, (helper.simulate(hooks, "POST", "/form", { headers = cross, body = "" })))
        -- a mounted app by its own settings
        local outer = moonserve.app()
        outer:mount("/in", hooks)
        assert.equal(200, (helper.simulate(outer, "POST", "/in/hook", { headers = cross, body = "" })))
        assert.equal(403, (helper.simulate(outer, "POST", "/in/form", { headers = cross, body = "" })))
        assert.has_error(function() hooks:post("/x", function() end, { csrf = "no" }) end)
    end)

    it("uses the app's error pages, with the reference id on 5xx and the trace in dev mode", function()
        local app = moonserve.app { dev = true }
        app:error_page(404, function(req, res)
            return res:status(404):send("no " .. req.path)
        end)
        app:get("/boom", function() error("kaboom") end)
        assert.equal("no /x", select(3, helper.simulate(app, "GET", "/x")))
        local status, _, body = helper.simulate(app, "GET", "/boom")
        assert.equal(500, status)
        assert.truthy(body:match("reference: %x+"))
        assert.truthy(body:find("kaboom", 1, true))
        assert.truthy(body:find("stack traceback", 1, true))
        local prod = moonserve.app()
        prod:get("/boom", function() error("secret detail") end)
        status, _, body = helper.simulate(prod, "GET", "/boom")
        assert.equal(500, status)
        assert.falsy(body:find("secret detail", 1, true))
    end)

    it("negotiates content types by Accept", function()
        local app = moonserve.app()
        app:get("/", function(req, res) res:send(tostring(req:accepts("json", "html"))) end)
        local function pick(accept)
            return select(3, helper.simulate(app, "GET", "/", { headers = { accept = accept } }))
        end
        assert.equal("html", pick("text/html,application/xhtml+xml,*/*;q=0.8"))
        assert.equal("json", pick("application/json"))
        assert.equal("json", pick("text/html;q=0.5, application/json"))
        assert.equal("json", pick("*/*"))
        assert.equal("json", pick("*/*;q=0.5"))
        assert.equal("nil", pick("*/*;q=0"))
        assert.equal("html", pick("*/*;q=0.5, text/html"))
        assert.equal("nil", pick("image/png"))
        assert.equal("html", pick("text/*"))
    end)

    it("serves a site under a base path, and 404 outside it", function()
        local app = moonserve.app()
        local site = app:site("docs.example", { base = "/docs" })
        site:get("/", function(req, res) res:send("index at " .. req.base_path) end)
        site:get("/page", function(req, res) res:send("page " .. req.path) end)
        local h = { host = "docs.example" }
        assert.equal("index at /docs", select(3, helper.simulate(app, "GET", "/docs", h)))
        assert.equal("page /page", select(3, helper.simulate(app, "GET", "/docs/page", h)))
        assert.equal(404, (helper.simulate(app, "GET", "/page", h)))
        assert.equal(404, (helper.simulate(app, "GET", "/docsx", h)))
    end)

    it("lets error handlers answer a handler's error before the error page", function()
        local app = moonserve.app()
        local seen
        app:on_error(function(_, res, err, ref)
            seen = ref
            if tostring(err):find("teapot", 1, true) then
                return res:status(418):send("short and stout")
            end
        end)
        app:get("/teapot", function() error("I am a teapot") end)
        app:get("/other", function() error("something else") end)
        local status, _, body = helper.simulate(app, "GET", "/teapot")
        assert.equal(418, status)
        assert.equal("short and stout", body)
        assert.truthy(seen:match("^%x+$"))
        status, _, body = helper.simulate(app, "GET", "/other")
        assert.equal(500, status)
        assert.truthy(body:find("reference: " .. seen, 1, true))
    end)

    it("flushes a streamed reply", function()
        local app = moonserve.app()
        app:get("/", function(_, res)
            res:write("a")
            assert.is_true(res:flush())
            res:write("b")
        end)
        assert.equal("ab", select(3, helper.simulate(app, "GET", "/")))
    end)

    it("serves sites by host, case-insensitively and without the port", function()
        local app = moonserve.app()
        app:get("/", function(_, res) res:send("main") end)
        app:site("Example.ORG"):get("/", function(_, res) res:send("site") end)
        assert.equal("site", select(3, helper.simulate(app, "GET", "/", { host = "example.org:8080" })))
        assert.equal("main", select(3, helper.simulate(app, "GET", "/", { host = "other" })))
    end)

    -- The same cases as the core's static mounts (spec/core/http/static/static_test.c, host_is).
    it("matches IPv6 sites with and without a port, as the core's static mounts do", function()
        local app = moonserve.app()
        app:get("/", function(_, res) res:send("main") end)
        app:site("[::1]"):get("/", function(_, res) res:send("v6") end)
        app:site("2001:DB8::1"):get("/", function(_, res) res:send("bare v6") end)
        app:site("example.com"):get("/", function(_, res) res:send("name") end)
        local function body(host)
            return select(3, helper.simulate(app, "GET", "/", { host = host }))
        end
        assert.equal("v6", body("[::1]:8080"))
        assert.equal("v6", body("[::1]"))
        assert.equal("bare v6", body("[2001:db8::1]:443"))
        assert.equal("bare v6", body("[2001:DB8::1]"))
        assert.equal("name", body("example.com:80"))
        assert.equal("name", body("EXAMPLE.com"))
        assert.equal("main", body("[::2]:8080"))
        assert.equal("main", body("example.com.evil:80"))
    end)

    it("percent-encodes a backslash in a canonical redirect, never sending /\\host", function()
        local app = moonserve.app()
        app:get("/*", function(_, res) res:send("x") end)
        for _, path in ipairs({ "/\\evil.test/", "//\\evil.test", "/./\\evil.test" }) do
            local status, headers = helper.simulate(app, "GET", path)
            assert.equal(308, status, path)
            assert.equal("/%5Cevil.test", headers["location"], path)
        end
        local status, headers = helper.simulate(app, "GET", '/a"b|c/?q=1')
        assert.equal(308, status)
        assert.equal("/a%22b%7Cc?q=1", headers["location"])
        assert.equal(200, (helper.simulate(app, "GET", "/%5Cevil.test")))
    end)

    it("keeps a site's base and a mount's prefix in a canonical redirect", function()
        local app = moonserve.app()
        local site = app:site("docs.example", { base = "/docs" })
        site:get("/page", function(_, res) res:send("page") end)
        local blog = moonserve.app { trailing_slash = "add" }
        blog:get("/post/", function(_, res) res:send("post") end)
        app:mount("/blog", blog)
        local status, headers = helper.simulate(app, "GET", "/docs//page/",
            { host = "docs.example" })
        assert.equal(308, status)
        assert.equal("/docs/page", headers["location"])
        status, headers = helper.simulate(app, "GET", "/blog/post")
        assert.equal(308, status)
        assert.equal("/blog/post/", headers["location"])
    end)

    it("reads query, headers, form and JSON bodies", function()
        local app = moonserve.app()
        app:post("/f", function(req, res)
            local form = assert(req:form())
            res:json { q = req.query.q, a = form.a, ua = req:header("User-Agent"),
                ua2 = req:headers()["user-agent"] }
        end)
        app:post("/j", function(req, res)
            local v, err = req:json()
            if not v then return res:status(400):send(err) end
            res:send(tostring(v.n + 1))
        end)
        local _, _, body = helper.simulate(app, "POST", "/f?q=1", { body = "a=x+y",
            headers = { ["content-type"] = "application/x-www-form-urlencoded",
                ["user-agent"] = "spec" } })
        assert.same({ q = "1", a = "x y", ua = "spec", ua2 = "spec" }, require("cjson").decode(body))
        assert.equal("42", select(3, helper.simulate(app, "POST", "/j", { body = '{"n":41}' })))
        local status, _, err = helper.simulate(app, "POST", "/j", { body = "{nope" })
        assert.equal(400, status)
        assert.truthy(err:find("invalid JSON", 1, true))
    end)

    it("turns an error into a 500 page with a reference id, and drops headers set before", function()
        local app = moonserve.app()
        app:get("/", function(_, res)
            res:header("content-type", "application/json")
            error("broken")
        end)
        local status, headers, body = helper.simulate(app, "GET", "/")
        assert.equal(500, status)
        assert.truthy(body:match("reference: %x+"))
        assert.equal("text/plain; charset=utf-8", headers["content-type"])
    end)

    it("raises on misuse: bad status, bad header, header after send", function()
        local app = moonserve.app()
        local errors = {}
        app:get("/", function(_, res)
            errors[1] = select(2, pcall(res.status, res, 99))
            errors[2] = select(2, pcall(res.header, res, "x", "a\r\nb: c"))
            errors[3] = select(2, pcall(res.header, res, "content-length", "5"))
            res:send("ok")
            errors[4] = select(2, pcall(res.header, res, "x-late", "1"))
            local ok, err = res:send("again")
            errors[5] = err
            assert(ok == nil)
        end)
        assert.equal("ok", select(3, helper.simulate(app, "GET", "/")))
        assert.truthy(errors[1]:find("bad status"))
        assert.truthy(errors[2]:find("EBADHEADER"))
        assert.truthy(errors[3]:find("ERESERVED"))
        assert.truthy(errors[4]:find("ESENT"))
        assert.truthy(errors[5]:find("ESENT"))
    end)

    it("sets cookies with every attribute", function()
        local app = moonserve.app()
        app:get("/", function(_, res)
            res:cookie("sid", "abc", { path = "/", domain = "example.org", max_age = 60,
                expires = 0, secure = true, http_only = true, same_site = "lax" })
            res:send("ok")
        end)
        local _, headers = helper.simulate(app, "GET", "/")
        assert.equal("sid=abc; Path=/; Domain=example.org; Max-Age=60; "
            .. "Expires=Thu, 01 Jan 1970 00:00:00 GMT; Secure; HttpOnly; SameSite=Lax",
            headers["set-cookie"])
        assert.has_error(function()
            local res = { }
            require("moonserve.host.core.response").methods.cookie(res, "bad name", "v")
        end)
    end)

    it("redirects", function()
        local app = moonserve.app()
        app:get("/old", function(_, res) res:redirect("/new", 301) end)
        local status, headers = helper.simulate(app, "GET", "/old")
        assert.equal(301, status)
        assert.equal("/new", headers["location"])
    end)

    it("percent-encodes in a redirect the bytes no URL may hold, a backslash above all", function()
        local app = moonserve.app()
        app:get("/go", function(req, res) res:redirect(req.query.to) end)
        local _
        local status, headers = helper.simulate(app, "GET", "/go?to=%2F%5Cevil.test")
        assert.equal(302, status)
        assert.equal("/%5Cevil.test", headers["location"])
        _, headers = helper.simulate(app, "GET", "/go?to=%2Fa%20b%3Cc%3E%60%7B%7D%5E")
        assert.equal("/a%20b%3Cc%3E%60%7B%7D%5E", headers["location"])
        _, headers = helper.simulate(app, "GET", "/go?to=https%3A%2F%2Fok.test%2Fa%3Fb%3D1%25")
        assert.equal("https://ok.test/a?b=1%", headers["location"])
    end)

    it("parks a handler in moonserve.sleep and finishes it when the timer fires", function()
        local app = moonserve.app()
        app:get("/", function(_, res)
            moonserve.sleep(0.05)
            res:send("woke")
        end)
        assert.equal("woke", select(3, helper.simulate(app, "GET", "/", { wait = 0.3 })))
    end)

    it("refuses unknown limits and out-of-range values", function()
        local server = require "moonserve.server"
        assert.has_error(function() server.create(moonserve.app(), { bogus = 1 }) end,
            nil)
        local ok, err = pcall(server.create, moonserve.app(), { bogus = 1 })
        assert.is_false(ok)
        assert.truthy(err:find("unknown limit bogus", 1, true))
        ok, err = pcall(server.create, moonserve.app(), { head_timeout = -1 })
        assert.is_false(ok)
        assert.truthy(err:find("bad limit head_timeout", 1, true))
        ok, err = pcall(server.create, moonserve.app(), { per_source = "many" })
        assert.is_false(ok)
        assert.truthy(err:find("number expected", 1, true))
        assert.truthy(server.create(moonserve.app(), { per_source = 10, head_timeout = 0.5 }))
    end)

    it("lets go of large written strings as their writes complete", function()
        local anchors = require("moonserve.base").anchors
        local app = moonserve.app()
        local piece = string.rep("z", 64 * 1024)
        app:get("/", function(_, res)
            for i = 1, 200 do
                res:write(piece .. i) -- a new string each time, referenced by the core
            end
        end)
        local status, _, body = helper.simulate(app, "GET", "/", { wait = 0.2 })
        assert.equal(200, status)
        assert.equal(200 * (64 * 1024) + 9 + 90 * 2 + 101 * 3, #body)
        local held = 0
        for _, v in pairs(anchors) do
            if v then held = held + 1 end
        end
        assert.is_true(held < 10, held .. " strings still held")
    end)

    it("counts requests and connections in server:stats()", function()
        local app = moonserve.app()
        app:get("/", function(_, res) res:send("ok") end)
        local srv = require("moonserve.server").create(app)
        local conn = srv:memconn()
        conn:feed("GET / HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\n\r\n")
        local st = srv:stats()
        assert.equal(1, st.requests)
        assert.equal(1, st.bad_requests) -- the second has no Host
        assert.equal(1, st.accepted)
        assert.equal(0, st.in_flight)
        conn:close()
        assert.equal(0, srv:stats().connections)
    end)

    it("hands over what a memory connection's feed returns: a take after it has only what came later", function()
        local app = moonserve.app()
        app:get("/", function(_, res) res:send("now") end)
        app:get("/later", function(_, res) moonserve.sleep(0); res:send("later") end)
        local core = require("moonserve.base").core
        local conn = require("moonserve.server").create(app):memconn()
        assert.matches("\r\n\r\nnow$", (conn:feed("GET / HTTP/1.1\r\nHost: t\r\n\r\n")))
        assert.equal("", (conn:take()))
        assert.equal("", (conn:feed("GET /later HTTP/1.1\r\nHost: t\r\n\r\n")))
        local out = ""
        for _ = 1, 100 do
            core.run_once()
            out = out .. conn:take()
            if out:find("later$") then break end
        end
        assert.matches("^HTTP/1%.1 200.-\r\n\r\nlater$", out)
        conn:close()
    end)

    it("tells a streaming handler once its client has gone (res:gone)", function()
        local app = moonserve.app()
        local seen = {}
        app:get("/events", function(_, res)
            res:write("a")
            seen[#seen + 1] = res:gone()
            moonserve.sleep(0) -- the client leaves meanwhile
            res:write("b") -- the last bytes go out, and the connection closes
            seen[#seen + 1] = res:gone()
        end)
        local core = require("moonserve.base").core
        local srv = require("moonserve.server").create(app)
        local conn = srv:memconn()
        conn:feed("GET /events HTTP/1.1\r\nHost: t\r\n\r\n")
        conn:close()
        for _ = 1, 100 do
            core.run_once()
            if #seen == 2 then break end
        end
        assert.same({ false, true }, seen)
    end)

    it("refuses moonserve.sleep outside a handler", function()
        assert.has_error(function() moonserve.sleep(1) end)
    end)

    it("keeps header lookup on trace", function()
        local app = moonserve.app()
        local log
        app:get("/", function(req, res)
            log = helper.jit_log(function()
                local n = 0
                for _ = 1, 300 do
                    if req:header("host") then n = n + 1 end
                end
                assert(n == 300)
            end)
            res:send("ok")
        end)
        helper.simulate(app, "GET", "/")
        assert.matches("TRACE%s+%d+ .- loop", log)
        assert.not_matches("NYI", log)
    end)

    describe("refusal_body", function()
        it("refuses at start what the core could not send as given", function()
            local app = moonserve.app()
            local function bad(status, bodies, want)
                local ok, err = pcall(app.refusal_body, app, status, bodies)
                assert.is_false(ok)
                assert.matches(want, err, 1, true)
            end
            bad(404, { text = "x" }, "the core refuses with 400, 403, 408, 413, 414, 431 or 503")
            bad(413, "x", "{ json =, html =, text = } expected")
            bad(413, {}, "json, html or text expected")
            bad(413, { xml = "<a/>" }, "unknown kind xml")
            bad(413, { json = "{not json" }, "json is not valid JSON")
            bad(413, { html = "\255\254" }, "html is not UTF-8")
            bad(413, { text = string.rep("a", 16385) }, "more than 16384")
            assert.equal(app, app:refusal_body(413, { json = "null", text = string.rep("a", 16384) }))
        end)

        it("answers the cross-site 403 with the app's body, chosen by Accept", function()
            local app = moonserve.app()
            app:refusal_body(403, { json = '{"error":"cross-site"}', html = "<h1>No</h1>" })
            app:post("/x", function() return "done" end)
            local h = { ["Sec-Fetch-Site"] = "cross-site", Accept = "application/json" }
            local status, headers, body = helper.simulate(app, "POST", "/x", { headers = h })
            assert.equal(403, status)
            assert.equal("application/json", headers["content-type"])
            assert.equal('{"error":"cross-site"}', body)
            h.Accept = "text/html"
            status, headers, body = helper.simulate(app, "POST", "/x", { headers = h })
            assert.equal(403, status)
            assert.equal("text/html; charset=utf-8", headers["content-type"])
            assert.equal("<h1>No</h1>", body)
        end)

        it("is handed to the core, which answers a body over the limit with it", function()
            local app = moonserve.app()
            app:refusal_body(413, { json = '{"error":"too large"}' })
            app:post("/up", function(req, res)
                local _, err = req:body()
                assert(not res:status(400):json{ err = err }) -- nil, ESENT: no raise
            end, { body_bytes = 10 })
            local status, headers, body = helper.simulate(app, "POST", "/up",
                { body = string.rep("x", 100) })
            assert.equal(413, status)
            assert.equal("application/json", headers["content-type"])
            assert.equal('{"error":"too large"}', body)
        end)
    end)
end)
