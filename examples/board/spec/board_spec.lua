-- The board through the test client (app:test()): every request goes through moonserve's
-- parser, limits, middleware and routes in this process, against a real PostgreSQL
-- (spec/support.lua: a database of its own on DATABASE_URL's server, or a throwaway cluster).
local ffi = require "ffi"
local support = dofile("spec/support.lua")

pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")

local PNG = "\137PNG\r\n\26\n\0\0\0\rIHDR\0\0\0\1\0\0\0\1\8\6\0\0\0\31\21\196\137"

describe("the board", function()
    local app, drop, url

    setup(function()
        url, drop = support.database("app.lua")
        -- (the test environment: database_url from DATABASE_URL, the secret from its variable)
        ffi.C.setenv("DATABASE_URL", url, 1)
        ffi.C.setenv("MOONSERVE_SECRET_SESSION", string.rep("s", 40), 1)
        require("moonserve.config").setup { file = "config.lua", env = "test" }
        app = dofile("app.lua")
    end)

    teardown(function()
        if drop then
            drop()
        end
    end)

    local clients = {}
    local function client()
        local t = app:test { quiet = true }
        clients[#clients + 1] = t
        return t
    end
    after_each(function()
        for _, t in ipairs(clients) do
            t:close()
        end
        clients = {}
    end)

    local n = 0
    -- A new member, signed up and logged in on a client of its own: the client, the name.
    local function member()
        n = n + 1
        local name = ("member%d_%d"):format(n, math.random(1e6))
        local t = client()
        local token = t:get("/signup"):csrf_token()
        local r = t:post("/signup", { form = { name = name, password = "correct horse",
            _csrf = token } })
        assert.equal(303, r.status, r.body)
        return t, name
    end

    local function post(t, body)
        local token = t:get("/"):csrf_token()
        return t:post("/notes", { form = { body = body, _csrf = token } })
    end

    describe("members", function()
        it("signs up, is welcomed once by a flash message, and stays logged in", function()
            local t, name = member()
            local home = t:get("/")
            assert.matches("Welcome, " .. name .. "!", home.body, 1, true)
            assert.matches('id="me">' .. name .. "<", home.body, 1, true)
            assert.not_matches("Welcome,", t:get("/").body) -- (a flash lasts one page)
            assert.same(name, t:get("/api/me"):json().name)
        end)

        it("refuses a bad name, a short password and a taken name with 422", function()
            local t = client()
            local token = t:get("/signup"):csrf_token()
            local r = t:post("/signup", { form = { name = "a b", password = "short",
                _csrf = token } })
            assert.equal(422, r.status)
            assert.matches("Name: 3 to 32 letters", r.body, 1, true)
            assert.matches("Password: at least 8 characters", r.body, 1, true)
            local _, name = member()
            r = t:post("/signup", { form = { name = name, password = "long enough",
                _csrf = token } })
            assert.equal(422, r.status)
            assert.matches("that name is taken", r.body, 1, true)
        end)

        it("refuses a form without its CSRF token", function()
            local r = client():post("/signup", { form = { name = "nobody", password = "xxxxxxxx" } })
            assert.equal(403, r.status)
        end)

        it("keeps an argon2id hash, never the password", function()
            local _, name = member()
            local out = io.popen("psql -X -At '" .. url .. "' -c \"SELECT password_hash FROM "
                .. "users WHERE name = '" .. name .. "'\""):read("*a")
            assert.matches("^%$argon2id%$v=19%$", out)
            assert.not_matches("correct horse", out)
        end)

        it("logs in with the right password only, then logs out with a notice", function()
            local _, name = member()
            local t = client()
            local token = t:get("/login"):csrf_token()
            local r = t:post("/login", { form = { name = name, password = "wrong horse",
                _csrf = token } })
            assert.equal(401, r.status)
            assert.matches("Wrong name or password.", r.body, 1, true)
            r = t:post("/login", { form = { name = "no_such_member", password = "wrong horse",
                _csrf = token } })
            assert.equal(401, r.status)
            r = t:post("/login", { form = { name = name, password = "correct horse",
                _csrf = token } })
            assert.equal(303, r.status)
            assert.matches("Welcome back", t:get("/").body)
            r = t:post("/logout", { form = { _csrf = t:get("/"):csrf_token() } })
            assert.equal(303, r.status)
            local home = t:get("/")
            assert.matches("Logged out.", home.body, 1, true)
            assert.equal(401, t:get("/api/me").status)
        end)
    end)

    describe("notes", function()
        it("posts a note from the form, and shows it on everyone's page", function()
            local t, name = member()
            local r = post(t, "hello <world>")
            assert.equal(303, r.status)
            local page = client():get("/")
            assert.matches("<b>" .. name .. "</b> <span class=\"body\">hello &lt;world&gt;</span>",
                page.body, 1, true)
        end)

        it("refuses a blank note with 422, and a visitor's with a redirect to log in", function()
            local t = member()
            local r = post(t, "   ")
            assert.equal(422, r.status)
            assert.matches("must not be blank", r.body)
            local v = client()
            r = v:post("/notes", { form = { body = "x", _csrf = v:get("/"):csrf_token() } })
            assert.equal(303, r.status)
            assert.equal("/login", r.headers.location)
        end)

        it("deletes one's own note only", function()
            local a = member()
            local b = member()
            post(a, "mine")
            local id = a:get("/api/notes"):json().notes[1].id
            local r = b:post("/notes/" .. id .. "/delete", { form = { _csrf = b:get("/"):csrf_token() } })
            assert.equal(403, r.status)
            r = a:post("/notes/" .. id .. "/delete", { form = { _csrf = a:get("/"):csrf_token() } })
            assert.equal(303, r.status)
            assert.equal(404, a:get("/api/notes/" .. id).status)
        end)
    end)

    describe("the API", function()
        it("lists notes a page at a time, newest first", function()
            local t = member()
            for i = 1, 3 do
                post(t, "page note " .. i)
            end
            local r = client():get("/api/notes", { query = { per_page = 2 } })
            assert.equal(200, r.status)
            assert.equal("application/json", r.headers["content-type"])
            local p = r:json()
            assert.equal(2, #p.notes)
            assert.equal("page note 3", p.notes[1].body)
            assert.equal("page note 2", p.notes[2].body)
            assert.equal(1, p.page)
            assert.equal(2, p.per_page)
            assert.is_true(p.total >= 3)
            assert.equal(2, p.next)
            local last = client():get("/api/notes", { query = { per_page = 2,
                page = p.pages } }):json()
            assert.equal(require("moonserve").json.null, last.next)
            local empty = client():get("/api/notes", { query = { page = 1000 } })
            assert.matches('"notes":[]', empty.body, 1, true)
        end)

        it("answers a bad page with 422 and every field's error", function()
            local r = client():get("/api/notes", { query = { page = 0, per_page = "x" } })
            assert.equal(422, r.status)
            local e = r:json().errors
            assert.truthy(e.page)
            assert.truthy(e.per_page)
        end)

        it("creates a note with the session's cookie and its token", function()
            local t, name = member()
            local token = t:get("/api/csrf"):json().csrf_token
            local r = t:post("/api/notes", { json = { body = "from a script" }, csrf = token })
            assert.equal(201, r.status, r.body)
            local note = r:json().note
            assert.equal(name, note.author)
            assert.equal("/api/notes/" .. note.id, r.headers.location)
            assert.equal("from a script", t:get(r.headers.location):json().note.body)
        end)

        it("answers errors in one JSON shape: 400, 401, 403, 404, 405, 422", function()
            local t = member()
            local token = t:get("/api/csrf"):json().csrf_token
            local r = t:post("/api/notes", { body = "{not json", csrf = token,
                headers = { ["content-type"] = "application/json" } })
            assert.equal(400, r.status)
            assert.equal(400, r:json().error.status)
            r = t:post("/api/notes", { json = { body = ("x"):rep(1001) }, csrf = token })
            assert.equal(422, r.status)
            assert.truthy(r:json().errors.body)
            local v = client()
            r = v:post("/api/notes", { json = { body = "x" },
                csrf = v:get("/api/csrf"):json().csrf_token })
            assert.equal(401, r.status)
            assert.equal("log in first", r:json().error.message)
            r = t:post("/api/notes", { json = { body = "x" } }) -- no token
            assert.equal(403, r.status)
            assert.equal("missing or bad CSRF token", r:json().error.message)
            for _, id in ipairs { "1e400", "-1", "0x10", "inf", "1234567890123456789" } do
                r = t:get("/api/notes/" .. id)
                assert.equal(404, r.status, id .. ": " .. r.body)
                assert.equal("no such note", r:json().error.message)
                assert.equal(404, t:get("/avatars/" .. id).status)
            end
            r = t:get("/api/nothing")
            assert.equal(404, r.status)
            assert.equal("Not Found", r:json().error.message)
            r = t:put("/api/notes", { json = {}, csrf = token })
            assert.equal(405, r.status)
            assert.equal(405, r:json().error.status)
            assert.matches("text/html", t:get("/nothing").headers["content-type"], 1, true)
        end)

        it("deletes one's own note: 204, then 404; another's: 403", function()
            local a = member()
            local b = member()
            local ta = a:get("/api/csrf"):json().csrf_token
            local tb = b:get("/api/csrf"):json().csrf_token
            local id = a:post("/api/notes", { json = { body = "to go" }, csrf = ta }):json().note.id
            assert.equal(403, b:delete("/api/notes/" .. id, { csrf = tb }).status)
            assert.equal(204, a:delete("/api/notes/" .. id, { csrf = ta }).status)
            local r = a:delete("/api/notes/" .. id, { csrf = ta })
            assert.equal(404, r.status)
            assert.equal("no such note", r:json().error.message)
        end)

        it("lets the configured origin's pages call it (CORS), and no other", function()
            local ok = "http://localhost:5173"
            local r = client():options("/api/notes", { headers = { origin = ok,
                ["access-control-request-method"] = "POST",
                ["access-control-request-headers"] = "content-type, x-csrf-token" } })
            assert.equal(204, r.status)
            assert.equal(ok, r.headers["access-control-allow-origin"])
            assert.equal("true", r.headers["access-control-allow-credentials"])
            r = client():get("/api/notes", { headers = { origin = ok } })
            assert.equal(ok, r.headers["access-control-allow-origin"])
            assert.matches("Origin", r.headers.vary)
            r = client():options("/api/notes", { headers = { origin = "https://evil.example",
                ["access-control-request-method"] = "POST" } })
            assert.equal(403, r.status)
            assert.is_nil(r.headers["access-control-allow-origin"])
            -- (pages are not the API's: no CORS fields there)
            r = client():get("/", { headers = { origin = ok } })
            assert.is_nil(r.headers["access-control-allow-origin"])
        end)
    end)

    describe("avatars", function()
        it("takes an image by its first bytes, and serves it back", function()
            local t = member()
            local token = t:get("/account"):csrf_token()
            local r = t:post("/avatar", { form = { _csrf = token }, files = { avatar = {
                filename = "me.png", content_type = "image/png", data = PNG } } })
            assert.equal(303, r.status, r.body)
            assert.matches("Avatar saved.", t:get("/account").body, 1, true)
            local id = t:get("/api/me"):json().id
            r = client():get("/avatars/" .. id)
            assert.equal(200, r.status)
            assert.equal("image/png", r.headers["content-type"])
            assert.equal(PNG, r.body)
            assert.matches('src="/avatars/' .. id .. '"', post(t, "with a face") and
                t:get("/").body, 1, true)
        end)

        it("refuses a file that is not an image, whatever its name and type say", function()
            local t = member()
            local token = t:get("/account"):csrf_token()
            local r = t:post("/avatar", { form = { _csrf = token }, files = { avatar = {
                filename = "me.png", content_type = "image/png", data = "<svg onload=x>" } } })
            assert.equal(303, r.status)
            assert.matches("A PNG, JPEG, GIF or WebP image, please.", t:get("/account").body,
                1, true)
            assert.equal(404, client():get("/avatars/" .. t:get("/api/me"):json().id).status)
        end)

        it("refuses one over the limit with 413, in JSON for a script", function()
            local t = member()
            local token = t:get("/account"):csrf_token()
            local r = t:post("/avatar", { form = { _csrf = token }, headers = {
                accept = "application/json" }, files = { avatar = { filename = "big.png",
                data = PNG .. ("\0"):rep(300 * 1024) } } })
            assert.equal(413, r.status)
            assert.equal("application/json", r.headers["content-type"])
            assert.equal(413, r:json().error.status)
            assert.truthy(r:logged("413"))
        end)
    end)

    describe("the live list", function()
        it("streams new notes as server-sent events, with replay since Last-Event-ID", function()
            local t = member()
            post(t, "before the stream")
            local r = client():get("/events", { timeout = 0.3, partial = true,
                headers = { ["last-event-id"] = "0" } })
            assert.equal("text/event-stream", r.headers["content-type"])
            assert.matches("before the stream", r.body, 1, true)
            local first = tonumber(r.body:match("id: (%d+)"))
            local last
            for id in r.body:gmatch("id: (%d+)") do
                last = tonumber(id)
            end
            post(t, "after the stream")
            r = client():get("/events", { timeout = 0.3, partial = true,
                headers = { ["last-event-id"] = tostring(last) } })
            assert.matches("after the stream", r.body, 1, true)
            assert.not_matches("before the stream", r.body, 1, true)
            -- ?since=N, the page's first connection, the same
            r = client():get("/events?since=" .. first, { timeout = 0.3, partial = true })
            assert.matches("after the stream", r.body, 1, true)
        end)

        it("sends new notes and deletions to a WebSocket", function()
            local t = member()
            local ws, r = client():websocket("/live")
            assert.equal(101, r.status)
            local token = t:get("/api/csrf"):json().csrf_token
            local id = t:post("/api/notes", { json = { body = "over the socket" },
                csrf = token }):json().note.id
            local data = ws:receive(2)
            assert.matches("over the socket", data, 1, true)
            t:delete("/api/notes/" .. id, { csrf = token })
            data = ws:receive(2)
            assert.equal('{"deleted":' .. id .. "}", data)
            ws:close()
        end)
    end)
end)
