-- app:static and res:file through the real engine, in-process (no socket).
describe("moonserve static files", function()
    local moonserve = require "moonserve"
    local helper = require "helper"

    local dir
    local function put(name, text)
        local f = assert(io.open(dir .. "/" .. name, "wb"))
        f:write(text)
        f:close()
    end

    setup(function()
        dir = os.tmpname()
        os.remove(dir)
        assert(os.execute("mkdir -p " .. dir .. "/sub") == 0)
        put("a.txt", "file a")
        put("sub/b.css", "b{}")
        put("page.html", "<p>page</p>")
    end)

    teardown(function()
        os.execute("rm -rf " .. dir)
    end)

    it("refuses unknown options, wrong types and bad prefixes where they are written", function()
        local app = moonserve.app()
        assert.has_error(function() app:static("/a", dir, { colour = true }) end,
            "unknown static option colour")
        assert.has_error(function() app:static("/a", dir, { spa = "yes" }) end,
            "bad static option spa (boolean expected)")
        assert.has_error(function() app:static("a", dir) end)
        assert.has_error(function() app:static("/a", 42) end,
            "bad static directory (a path expected)")
        app:static("/a", dir, { index = false })
    end)

    it("gives the core a site's mounts under its base, for its host, with its security fields",
        function()
            local app = moonserve.app()
            app:static("/assets", dir)
            app:site("Example.COM", { base = "/blog" }):static("/files", dir,
                { hook = function() end })
            local mounts = app:static_mounts()
            table.sort(mounts, function(a, b) return a.prefix < b.prefix end)
            assert.equal("/assets", mounts[1].prefix)
            assert.is_nil(mounts[1].opts.host)
            assert.is_false(mounts[1].opts.hooked)
            assert.equal("/blog/files", mounts[2].prefix)
            assert.equal("example.com", mounts[2].opts.host)
            assert.is_true(mounts[2].opts.hooked)
            assert.is_nil(mounts[2].opts.hook)
            assert.matches("x%-content%-type%-options: nosniff\r\n", mounts[1].opts.fields)
        end)

    it("serves a file from the core, and lets a miss through to the app's routes", function()
        local app = moonserve.app()
        local handled = 0
        app:use(function(_, _, nxt)
            handled = handled + 1
            return nxt()
        end)
        app:static("/files", dir)
        app:error_page(404, function(_, res) return res:status(404):send("app 404") end)
        local _
        local status, headers, body = helper.simulate(app, "GET", "/files/a.txt")
        assert.equal(200, status)
        assert.equal("file a", body)
        assert.equal("text/plain; charset=utf-8", headers["content-type"])
        assert.equal("nosniff", headers["x-content-type-options"])
        assert.equal(0, handled) -- no Lua ran
        status, _, body = helper.simulate(app, "GET", "/files/none.txt")
        assert.equal(404, status)
        assert.equal("app 404", body)
        assert.equal(1, handled)
    end)

    it("serves a site's mount to its host only", function()
        local app = moonserve.app()
        app:site("files.test"):static("/", dir)
        assert.equal(200, (helper.simulate(app, "GET", "/a.txt", { host = "files.test:8080" })))
        assert.equal(404, (helper.simulate(app, "GET", "/a.txt", { host = "other.test" })))
    end)

    it("runs a mount's hook first: it may answer, add fields, or let the file go", function()
        local app = moonserve.app()
        app:static("/files", dir, { hook = function(req, res)
            if req.query.deny then
                return 403, "no"
            end
            res:header("x-hooked", "1")
        end })
        local _
        local status, headers, body = helper.simulate(app, "GET", "/files/sub/b.css")
        assert.equal(200, status)
        assert.equal("b{}", body)
        assert.equal("1", headers["x-hooked"])
        assert.equal("text/css; charset=utf-8", headers["content-type"])
        status, _, body = helper.simulate(app, "GET", "/files/a.txt?deny=1")
        assert.equal(403, status)
        assert.equal("no", body)
        assert.equal(404, (helper.simulate(app, "GET", "/files/none.txt")))
    end)

    it("sends a file a handler names, keeping a Content-Type it set, or says why not", function()
        local app = moonserve.app()
        app:get("/a", function(_, res) return res:file(dir .. "/a.txt") end)
        app:get("/typed", function(_, res)
            res:header("content-type", "application/x-mine")
            return res:file(dir .. "/page.html")
        end)
        app:get("/none", function(_, res)
            local ok, err = res:file(dir .. "/none.txt")
            return 404, tostring(ok) .. " " .. err
        end)
        local _
        local status, headers, body = helper.simulate(app, "GET", "/a")
        assert.equal(200, status)
        assert.equal("file a", body)
        assert.truthy(headers.etag)
        local etag = headers.etag
        status, _, body = helper.simulate(app, "GET", "/a", { headers = { ["if-none-match"] = etag } })
        assert.equal(304, status)
        assert.equal("", body)
        status, headers = helper.simulate(app, "GET", "/typed")
        assert.equal(200, status)
        assert.equal("application/x-mine", headers["content-type"])
        status, _, body = helper.simulate(app, "GET", "/none")
        assert.equal(404, status)
        assert.matches("^nil ENOENT", body)
        assert.has_error(function()
            require("moonserve.host.core.response").methods.file({ r = true }, 42)
        end)
    end)
end)
