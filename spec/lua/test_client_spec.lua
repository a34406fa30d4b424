-- The test client for apps (moonserve.test, app:test()): requests through the engine's
-- in-memory transport, with no socket.
local moonserve = require "moonserve"
local lfs = require "lfs"

local SECRET = string.rep("s", 32)

-- How many of this process's descriptors are sockets.
local function sockets()
    local n = 0
    for name in lfs.dir("/proc/self/fd") do
        local target = name:match("^%d+$") and lfs.symlinkattributes("/proc/self/fd/" .. name,
            "target")
        if target and target:find("^socket:") then
            n = n + 1
        end
    end
    return n
end

local function echo_app()
    local app = moonserve.app()
    for _, m in ipairs({ "get", "post", "put", "patch", "delete", "options" }) do
        app[m](app, "/m", function(req, res)
            res:header("x-method", req.method)
            res:send(req.method .. " " .. (req:body() or ""))
        end)
    end
    app:get("/q", function(req, res)
        res:json({ page = req.query.page, tags = req:query_all("tag") })
    end)
    app:route("PROPFIND", "/m", function(_, res) res:send("PROPFIND") end)
    return app
end

describe("the test client", function()
    it("sends every method and reads the reply as a client does", function()
        local t = echo_app():test()
        for _, m in ipairs({ "get", "post", "put", "patch", "delete", "options" }) do
            local r = t[m](t, "/m", { body = m ~= "get" and "x" or nil })
            assert.equal(200, r.status)
            assert.equal(m:upper(), r.headers["x-method"])
            assert.equal(m:upper() .. (m ~= "get" and " x" or " "), r.body)
        end
        local r = t:head("/m")
        assert.equal(200, r.status)
        assert.equal("", r.body)
        assert.equal("5", r.headers["content-length"]) -- "HEAD ", which a GET would get
        assert.equal("PROPFIND", t:request("PROPFIND", "/m").body)
        -- the core's own path: its security headers, its date
        assert.equal("nosniff", r.headers["x-content-type-options"])
        assert.truthy(r.headers.date)
        -- a query from a table, added to the path's
        local q = t:get("/q?page=2", { query = { tag = { "a", "b" } } }):json()
        assert.same({ page = "2", tags = { "a", "b" } }, q)
        assert.equal(404, t:get("/nowhere").status)
        t:close()
    end)

    it("sends form, JSON and multipart bodies", function()
        local app = moonserve.app()
        app:post("/form", function(req, res) res:json(req:form()) end)
        app:post("/json", function(req, res) res:json(req:json()) end)
        app:post("/upload", function(req, res)
            local got = {}
            for part in assert(req:parts()) do
                got[#got + 1] = { name = part.name, filename = part.filename,
                    type = part.content_type, data = part:body() }
            end
            res:json(got)
        end)
        local t = app:test()
        assert.same({ user = "a b", password = "c&d" },
            t:post("/form", { form = { user = "a b", password = "c&d" } }):json())
        assert.same({ title = "x", n = 2 }, t:post("/json", { json = { title = "x", n = 2 } }):json())
        local r = t:post("/upload", { form = { title = "me" },
            files = { avatar = { filename = "a.png", content_type = "image/png",
                data = "\137PNG\r\n\26\n" .. string.rep("\0", 3000) } } })
        assert.equal(200, r.status)
        local parts = r:json()
        assert.equal("title", parts[1].name)
        assert.equal("me", parts[1].data)
        assert.equal("avatar", parts[2].name)
        assert.equal("a.png", parts[2].filename)
        assert.equal("\137PNG\r\n\26\n" .. string.rep("\0", 3000), parts[2].data)
        t:close()
    end)

    it("keeps cookies across calls: a login, its session, and a logout", function()
        local app = moonserve.app()
        app:use(moonserve.sessions { secret = SECRET })
        app:post("/login", function(req, res)
            req.session:set("user", req:form().user)
            res:redirect("/me", 303)
        end)
        app:get("/me", function(req, res)
            res:send(req.session:get("user") or "nobody")
        end)
        app:post("/logout", function(req, res)
            req.session:destroy()
            res:send("bye")
        end)
        local t = app:test()
        assert.equal("nobody", t:get("/me").body)
        local r = t:post("/login", { form = { user = "ada" } })
        -- redirects are not followed
        assert.equal(303, r.status)
        assert.equal("/me", r.headers.location)
        assert.truthy(r.cookies[1])
        assert.equal("ada", t:get("/me").body)
        assert.equal("bye", t:post("/logout").body)
        assert.equal("nobody", t:get("/me").body)
        -- and a client of its own has a jar of its own
        local other = app:test()
        other:post("/login", { form = { user = "bob" } })
        assert.equal("bob", other:get("/me").body)
        assert.equal("nobody", t:get("/me").body)
        other:close()
        t:close()
    end)

    it("reads a CSRF token from a page and sends it back", function()
        local app = moonserve.app()
        app:use(moonserve.sessions { secret = SECRET })
        app:use(moonserve.csrf { secret = SECRET })
        app:get("/form", function(_, res)
            res:header("content-type", "text/html")
            res:send('<form method="post"><input type="hidden" name="_csrf" value="'
                .. res.csrf_token() .. '"></form>')
        end)
        app:get("/token", function(_, res) res:json({ csrf_token = res.csrf_token() }) end)
        app:post("/note", function(req, res) res:send("saved " .. req:form().title) end)
        local t = app:test()
        local token = t:get("/form"):csrf_token()
        assert.is_string(token)
        assert.equal(403, t:post("/note", { form = { title = "x" } }).status)
        assert.equal(403, t:post("/note", { form = { title = "x", _csrf = "nope" } }).status)
        assert.equal("saved x", t:post("/note", { form = { title = "x", _csrf = token } }).body)
        local json_token = t:get("/token"):csrf_token()
        assert.equal("saved y", t:post("/note", { form = { title = "y" }, csrf = json_token }).body)
        -- another visitor's token is no good here
        local other = app:test()
        assert.equal(403, other:post("/note", { form = { title = "z" }, csrf = token }).status)
        other:close()
        t:close()
    end)

    it("answers with the core's refusals: 413 past the body limit, one log line", function()
        local app = moonserve.app()
        local ran
        app:post("/up", function(req, res)
            ran = true
            res:send(#req:body())
        end)
        local t = app:test { limits = { body_bytes = 1000 } }
        assert.equal("1000", t:post("/up", { body = string.rep("x", 1000) }).body)
        ran = false
        local r = t:post("/up", { body = string.rep("x", 1001) })
        assert.equal(413, r.status)
        assert.is_false(ran)
        assert.truthy(r:logged("413"))
        -- a bad request from raw bytes: the parser's 400, as over a socket
        local out = t:raw("GET /up HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n")
        assert.matches("^HTTP/1.1 400", out)
        t:close()
    end)

    it("turns the loop while a handler waits: sleeps, timers, light threads", function()
        local app = moonserve.app()
        app:get("/sleep", function(_, res)
            moonserve.sleep(0.2)
            res:send("slept")
        end)
        app:get("/timer", function(_, res)
            local sema = moonserve.semaphore(0)
            moonserve.timer.at(0.05, function() sema:post(1) end)
            assert(sema:wait(2))
            local th = moonserve.spawn(function() moonserve.sleep(0.05) return "thread" end)
            local _, v = moonserve.wait(th)
            res:send("timer " .. v)
        end)
        app:get("/stream", function(_, res)
            res:write("a")
            moonserve.sleep(0.05)
            res:write("b")
        end)
        local t = app:test()
        local core = require("moonserve.base").core
        local t0 = core.now()
        assert.equal("slept", t:get("/sleep").body)
        assert.is_true(core.now() - t0 >= 0.19)
        assert.equal("timer thread", t:get("/timer").body)
        local r = t:get("/stream")
        assert.equal("chunked", r.headers["transfer-encoding"])
        assert.equal("ab", r.body)
        -- a timer due later does not stretch a short turn of the loop (a bound under a
        -- millisecond once fired before the poll, which then slept until that timer)
        app:get("/later", function(_, res)
            moonserve.timer.at(2, function() end)
            res:send("armed")
        end)
        assert.equal("armed", t:get("/later").body)
        for _, wait in ipairs({ 0.0001, 0.001, 0.01 }) do
            t0 = core.now()
            core.run_once(wait)
            assert.is_true(core.now() - t0 < 0.5, "run_once(" .. wait .. ") slept")
        end
        t0 = core.now()
        t:run(0.1)
        assert.is_true(core.now() - t0 >= 0.09 and core.now() - t0 < 0.5)
        t:close()
    end)

    it("holds a request to its timeout", function()
        local app = moonserve.app()
        app:get("/slow", function(_, res)
            res:write("part")
            moonserve.sleep(5)
            res:write("rest")
        end)
        local t = app:test { timeout = 0.3 }
        local ok, err = pcall(t.get, t, "/slow")
        assert.is_false(ok)
        assert.matches("GET /slow: no whole reply within 0.3 s", err)
        local r = t:get("/slow", { partial = true, timeout = 0.2 })
        assert.is_false(r.complete)
        assert.equal(200, r.status)
        assert.equal("part", r.body)
        t:close()
    end)

    it("shows a handler's error: the 500 and its log line, with one reference", function()
        local app = moonserve.app()
        app:get("/boom", function() error("the handler broke") end)
        local t = app:test()
        local r = t:get("/boom")
        assert.equal(500, r.status)
        local ref = r.body:match("reference: (%x+)")
        assert.truthy(ref)
        local line = r:logged("the handler broke")
        assert.truthy(line)
        assert.matches("^error: %[" .. ref .. "%]", line)
        -- the next request's log is its own
        assert.same({}, t:get("/nowhere").log)
        t:close()
        -- quiet: the lines reach the reply only, not the log (here a file)
        local core = require("moonserve.base").core
        local file = os.tmpname()
        assert(core.log_open(file))
        local q = app:test { quiet = true }
        local quiet_log = q:get("/boom").log
        q:close()
        local loud = app:test()
        local loud_log = loud:get("/boom").log
        loud:close()
        core.log_open(nil)
        local f = io.open(file)
        local text = f:read("*a")
        f:close()
        os.remove(file)
        assert.equal(1, #quiet_log)
        assert.equal(1, #loud_log)
        local _, n = text:gsub("the handler broke", "")
        assert.equal(1, n)
    end)

    it("runs the app's worker hooks, and serves two apps in turn", function()
        local a, b = moonserve.app(), moonserve.app()
        local started = 0
        a:on_worker_start(function()
            moonserve.sleep(0.01)
            started = started + 1
        end)
        a:get("/", function(_, res) res:send("a " .. started) end)
        b:get("/", function(_, res) res:send("b") end)
        local stopped = 0
        a:on_worker_stop(function() stopped = stopped + 1 end)
        local ta, tb = a:test(), b:test()
        assert.equal(1, started)
        assert.equal("a 1", ta:get("/").body)
        assert.equal("b", tb:get("/").body)
        assert.equal("a 1", ta:get("/").body)
        tb:close()
        assert.equal(0, stopped)
        ta:close()
        assert.equal(1, stopped)
        assert.has_error(function() ta:get("/") end, "the test client is closed")
    end)

    it("opens no socket", function()
        local before = sockets()
        local app = echo_app()
        local t = app:test()
        for _ = 1, 3 do
            assert.equal(200, t:post("/m", { body = "x" }).status)
        end
        assert.equal(before, sockets())
        t:close()
        -- (the count sees a socket: this check can fail)
        local s = assert(require("socket").bind("127.0.0.1", 0))
        assert.equal(before + 1, sockets())
        s:close()
    end)

    it("opens a WebSocket: messages both ways, fragments joined, pings, close", function()
        local app = moonserve.app()
        app:websocket("/chat", function(ws, req)
            ws:send("hello " .. (req.cookies.user or "?"))
            while true do
                local data, kind = ws:receive()
                if not data or kind == "close" then
                    return
                end
                if data == "bye" then
                    return ws:close(4000, "asked")
                end
                ws:send("echo: " .. data, kind == "binary" and "binary" or nil)
            end
        end)
        app:get("/login", function(_, res) res:cookie("user", "ada"); res:send("in") end)
        local t = app:test()
        t:get("/login")
        local ws, r = t:websocket("/chat")
        assert.equal(101, r.status)
        assert.same({ "hello ada", "text" }, { ws:receive() })
        ws:send("hi")
        assert.same({ "echo: hi", "text" }, { ws:receive() })
        local big = string.rep("x", 70000)
        ws:send(big, "binary")
        assert.same({ "echo: " .. big, "binary" }, { ws:receive() })
        assert.same({ nil, "timeout" }, { ws:receive(0.1) })
        ws:send("bye")
        assert.same({ "4000 asked", "close" }, { ws:receive() })
        ws:close()
        -- the core's origin rule holds for it as for a browser
        local none, refused = t:websocket("/chat", { headers = { origin = "https://evil.example" } })
        assert.is_nil(none)
        assert.equal(403, refused.status)
        t:close()
    end)

    it("refuses requests it cannot write", function()
        local t = echo_app():test()
        assert.has_error(function() t:get("/a b") end)
        assert.has_error(function() t:get("/m", { headers = { ["x-a"] = "1\r\nx-b: 2" } }) end)
        assert.has_error(function() t:request("get", "/m") end)
        t:close()
    end)
end)
