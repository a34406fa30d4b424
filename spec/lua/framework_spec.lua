-- The framework's parts working together through the real dispatch, in-process.
describe("moonserve's framework pieces together", function()
    local moonserve = require "moonserve"
    local helper = require "helper"
    local SECRET = string.rep("k", 32)

    it("keeps a session across requests in a signed, encrypted cookie", function()
        local app = moonserve.app()
        app:use(moonserve.sessions { secret = SECRET })
        app:get("/count", function(req, res)
            local n = (req.session:get("n") or 0) + 1
            req.session:set("n", n)
            res:send(tostring(n))
        end)
        local _, h1, b1 = helper.simulate(app, "GET", "/count")
        assert.equal("1", b1)
        local cookie = h1["set-cookie"]:match("^([^;]+)")
        assert.falsy(cookie:find('"n"', 1, true)) -- encrypted: the data does not show
        local _, h2, b2 = helper.simulate(app, "GET", "/count", { headers = { cookie = cookie } })
        assert.equal("2", b2)
        -- a tampered cookie is a fresh session
        local bad = cookie:sub(1, -2) .. (cookie:sub(-1) == "A" and "B" or "A")
        assert.equal("1", select(3, helper.simulate(app, "GET", "/count", { headers = { cookie = bad } })))
        assert.truthy(h2["set-cookie"])
    end)

    it("refuses cross-site posts and checks form tokens", function()
        local app = moonserve.app()
        app:use(moonserve.sessions { secret = SECRET })
        app:use(moonserve.csrf { secret = SECRET })
        app:get("/form", function(req, res)
            req.session:set("seen", true)
            res:send(res.csrf_token())
        end)
        app:post("/form", function(_, res) res:send("posted") end)
        local form_headers = { ["content-type"] = "application/x-www-form-urlencoded" }
        -- another origin: refused before any token check
        local h = { origin = "http://evil.example", ["content-type"] = form_headers["content-type"] }
        assert.equal(403, (helper.simulate(app, "POST", "/form", { headers = h, body = "a=1" })))
        -- same origin, with the session's token: accepted; without it: refused
        local _, gh, token = helper.simulate(app, "GET", "/form")
        local cookie = gh["set-cookie"]:match("^([^;]+)")
        local ok_headers = { origin = "http://test", cookie = cookie,
            ["content-type"] = form_headers["content-type"] }
        local status, _, body = helper.simulate(app, "POST", "/form",
            { headers = ok_headers, body = "_csrf=" .. token })
        assert.equal(200, status)
        assert.equal("posted", body)
        assert.equal(403, (helper.simulate(app, "POST", "/form", { headers = ok_headers, body = "a=1" })))
    end)

    it("renders templates into a reply sent as pieces, escaped, with the right length", function()
        local dir = os.tmpname()
        os.remove(dir)
        assert(os.execute("mkdir -p " .. dir .. "/layouts") == 0)
        local function write(name, text)
            local f = assert(io.open(dir .. "/" .. name, "w"))
            f:write(text)
            f:close()
        end
        write("layouts/main.html", "<html><body>{{! content }}</body></html>")
        write("page.html", '{% layout("layouts/main") %}<p>Hello {{ name }}</p>'
            .. string.rep("x", 5000))
        local app = moonserve.app()
        app:views { root = dir }
        app:get("/", function(_, res) res:render("page", { name = "<b>Ada</b>" }) end)
        local status, headers, body = helper.simulate(app, "GET", "/")
        assert.equal(200, status)
        assert.equal("text/html; charset=utf-8", headers["content-type"])
        assert.truthy(body:find("<p>Hello &lt;b&gt;Ada&lt;/b&gt;</p>", 1, true))
        assert.equal(#body, tonumber(headers["content-length"]))
        assert.equal("<html><body>", body:sub(1, 12))
        os.execute("rm -rf " .. dir)
    end)

    it("reads multipart parts as they arrive", function()
        local app = moonserve.app()
        app:post("/up", function(req, res)
            local out = {}
            for part in assert(req:parts()) do
                out[#out + 1] = part.name .. "=" .. (part.filename or "") .. ":" .. part:body()
            end
            res:send(table.concat(out, ";"))
        end)
        local b = "XyZ"
        local body = "--" .. b .. "\r\nContent-Disposition: form-data; name=\"title\"\r\n\r\nhi\r\n"
            .. "--" .. b .. "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n"
            .. "Content-Type: text/plain\r\n\r\nfile data\r\n--" .. b .. "--\r\n"
        local _, _, out = helper.simulate(app, "POST", "/up", { body = body,
            headers = { ["content-type"] = "multipart/form-data; boundary=" .. b } })
        assert.equal("title=:hi;file=a.txt:file data", out)
    end)

    it("runs before_send hooks once, before the head leaves", function()
        local app = moonserve.app()
        local runs = 0
        app:get("/", function(_, res)
            res:before_send(function(r) runs = runs + 1; r:header("x-hook", "yes") end)
            res:write("a")
            res:write("b")
        end)
        local _, headers, body = helper.simulate(app, "GET", "/")
        assert.equal("yes", headers["x-hook"])
        assert.equal("ab", body)
        assert.equal(1, runs)
    end)

    it("runs several before_send hooks once each, in the order they were added", function()
        local app = moonserve.app()
        local order = {}
        app:get("/", function(_, res)
            for i = 1, 3 do
                res:before_send(function(r)
                    order[#order + 1] = i
                    r:header("x-hook-" .. i, "yes")
                end)
            end
            res:send("done")
        end)
        local status, headers, body = helper.simulate(app, "GET", "/")
        assert.equal(200, status)
        assert.same({ 1, 2, 3 }, order)
        assert.equal("yes", headers["x-hook-1"])
        assert.equal("yes", headers["x-hook-3"])
        assert.equal("done", body)
    end)

    it("takes a table with __call as a before_send hook, and refuses any other table", function()
        local app = moonserve.app()
        local Hook = { __call = function(h, r) r:header("x-hook", h.value) end }
        local refused
        app:get("/", function(_, res)
            res:before_send(setmetatable({ value = "called" }, Hook))
            refused = select(2, pcall(res.before_send, res, {}))
            res:send("done")
        end)
        local _, headers = helper.simulate(app, "GET", "/")
        assert.equal("called", headers["x-hook"])
        assert.matches("bad hook %(function expected%)", refused)
    end)
end)
