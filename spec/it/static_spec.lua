-- spec/it/static_spec.lua: static files from the core, through a real server, with raw sockets
-- and curl: types, validators, ranges, encodings, directories, confinement, cache freshness.
local helper = require "helper"
local socket = require "socket"

local q = helper.sh_quote

-- -- Helpers ------------------------------------------------------------------------------

local write, sh = helper.write_file, helper.sh

-- Some random hex, so a leaked secret cannot be text that is anywhere else.
local function random_hex(n)
    return (sh("head -c " .. n .. " /dev/urandom | od -An -tx1 | tr -d ' \\n'"))
end

-- The Content-Type the core sends for an extension: the first type /etc/mime.types names it
-- with, and a charset for text.
local BUILTIN = { html = "text/html", css = "text/css", js = "text/javascript",
    json = "application/json", svg = "image/svg+xml", png = "image/png", txt = "text/plain" }
local function mime_of(ext)
    local f = io.open("/etc/mime.types")
    if f then
        for line in f:lines() do
            local t, exts = line:gsub("#.*", ""):match("^%s*([%w%.%+%-]+/[%w%.%+%-]+)%s+(.*)$")
            for e in (exts or ""):gmatch("%S+") do
                if e:lower() == ext then
                    f:close()
                    return t
                end
            end
        end
        f:close()
    end
    return BUILTIN[ext]
end
local function typed(ext)
    local t = mime_of(ext)
    if t:match("^text/") or t == "application/javascript" or t == "application/json"
        or t == "application/xml" or t == "image/svg+xml" then
        return t .. "; charset=utf-8"
    end
    return t
end

local function http_date(t)
    return os.date("!%a, %d %b %Y %H:%M:%S GMT", t)
end

-- A raw request: `fields` is a list of "Name: value" lines.
local function raw(method, path, fields)
    local lines = { method .. " " .. path .. " HTTP/1.1", "Host: t" }
    for _, l in ipairs(fields or {}) do
        lines[#lines + 1] = l
    end
    return table.concat(lines, "\r\n") .. "\r\n\r\n"
end

-- Runs `cmd` in the background; returns a job whose :wait(seconds) gives the output and the
-- exit status once it has ended (nil if it has not within the time).
local function background(cmd)
    local base = os.tmpname()
    local p = io.popen(("( (%s) >%s 2>&1; echo $? >%s ) >/dev/null 2>&1 &")
        :format(cmd, q(base .. ".out"), q(base .. ".rc")))
    p:close()
    local function done()
        return helper.read_file(base .. ".rc"):match("%d+") ~= nil
    end
    local job = { done = done }
    function job.wait(_, seconds)
        local deadline = socket.gettime() + seconds
        while not done() and socket.gettime() < deadline do
            socket.sleep(0.05)
        end
        local rc = tonumber(helper.read_file(base .. ".rc"):match("%d+"))
        local out = helper.read_file(base .. ".out")
        if rc then
            os.remove(base)
            os.remove(base .. ".out")
            os.remove(base .. ".rc")
        end
        return rc and out, rc
    end
    return job
end

local function rss_kb(pid)
    return tonumber(helper.read_file("/proc/" .. pid .. "/status"):match("VmRSS:%s*(%d+)"))
end

-- The parts of a multipart/byteranges body: { headers = {...}, data = "..." } each.
local function byteranges(body, boundary)
    local delim = "--" .. boundary
    local s, e = body:find(delim, 1, true)
    assert(s == 1, "the body must open with the boundary: " .. body:sub(1, 80))
    local parts, pos = {}, e + 1
    while body:sub(pos, pos + 1) ~= "--" do
        assert(body:sub(pos, pos + 1) == "\r\n", "a CRLF after the boundary")
        local hend = assert(body:find("\r\n\r\n", pos, true), "part head")
        local headers = {}
        for k, v in body:sub(pos + 2, hend - 1):gmatch("([^:\r\n]+):%s*([^\r\n]*)") do
            headers[k:lower()] = v
        end
        local next_delim = assert(body:find("\r\n" .. delim, hend + 4, true), "next boundary")
        parts[#parts + 1] = { headers = headers, data = body:sub(hend + 4, next_delim - 1) }
        pos = next_delim + 2 + #delim
    end
    assert(body:sub(pos) == "--\r\n", "the closing delimiter ends the body")
    return parts
end

local twice = helper.twice(it)

-- -- The tree ---------------------------------------------------------------------------------

describe("static files", function()
    local tmp, www, list, spa, secret, srv
    local files = {}

    local RANGES = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"):rep(4) -- 208 bytes
    local CSS = ("body { color: #333; margin: 0 auto; padding: 1em }\n"):rep(60)
    local BR_SIDECAR = "brotli sidecar bytes\0\1\2" -- served as they are, so unmistakable
    local LOREM = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod "
        .. "tempor incididunt ut labore et dolore magna aliqua.\n"):rep(64)
    local ROOT_INDEX = "<!DOCTYPE html><title>root</title><p>root index</p>\n"
    local SPA_INDEX = "<!DOCTYPE html><title>spa</title><div id=app></div>\n"
    local MTIME = 1577836800 -- 2020-01-01 00:00:00 UTC

    setup(function()
        tmp = os.tmpname()
        os.remove(tmp)
        sh("mkdir -p " .. q(tmp .. "/www/docs") .. " " .. q(tmp .. "/www/noindex") .. " "
            .. q(tmp .. "/www/private") .. " "
            .. q(tmp .. "/www/big") .. " " .. q(tmp .. "/list/sub") .. " "
            .. q(tmp .. "/spa/assets") .. " " .. q(tmp .. "/outside"))
        www, list, spa = tmp .. "/www", tmp .. "/list", tmp .. "/spa"

        -- Outside the served directory: what no request may ever see.
        secret = "TOPSECRET-" .. random_hex(12)
        write(tmp .. "/secret", secret .. "\n")
        write(tmp .. "/outside/inner.txt", secret .. "\n")

        files = {
            ["hello.txt"] = "hello static\n",
            ["index.html"] = ROOT_INDEX,
            ["style.css"] = CSS,
            ["style.css.br"] = BR_SIDECAR,
            ["app.js"] = "console.log(1)\n",
            ["data.json"] = '{"a":1}\n',
            ["pic.svg"] = '<svg xmlns="http://www.w3.org/2000/svg"/>\n',
            ["blob.qqq"] = "opaque bytes\n",
            ["image.png"] = "\137PNG\r\n\26\n" .. ("\0"):rep(4088),
            ["lorem.txt"] = LOREM,
            ["small.txt"] = ("s"):rep(100),
            ["ranges.txt"] = RANGES,
            ["cond.txt"] = "conditional\n",
            ["app.3f9a1c.js"] = "fingerprinted()\n",
            ["plain.js"] = "plain()\n",
            ["private.txt"] = "private, behind the hook\n",
            ["private/secret.txt"] = "SECRET behind the inner mount's hook\n",
            ["docs/index.html"] = "<p>docs index</p>\n",
            ["noindex/a.txt"] = "a\n",
            [".env"] = "SECRET_ENV=" .. secret .. "\n",
        }
        for name, data in pairs(files) do
            write(www .. "/" .. name, data)
        end
        sh("gzip -9 -n -c " .. q(www .. "/style.css") .. " > " .. q(www .. "/style.css.gz"))
        files["style.css.gz"] = helper.read_file(www .. "/style.css.gz")
        sh("touch -d @" .. MTIME .. " " .. q(www .. "/cond.txt"))
        -- Symlinks: two ways out of the root, and one that stays inside.
        sh("ln -s ../secret " .. q(www .. "/link-up") .. " && ln -s " .. q(tmp .. "/secret")
            .. " " .. q(www .. "/link-abs") .. " && ln -s " .. q(tmp .. "/outside") .. " "
            .. q(www .. "/link-dir") .. " && ln -s hello.txt " .. q(www .. "/link-in.txt"))
        -- Large files: a sparse 1 GiB one, and 8 MiB of random bytes.
        sh("truncate -s 1G " .. q(www .. "/big/sparse.bin"))
        sh("head -c 8388608 /dev/urandom > " .. q(www .. "/big/random.bin"))

        write(list .. '/<b>&"x.txt', "tricky name\n")
        write(list .. "/plain.txt", "plain\n")
        write(list .. "/.hidden-note", "hidden\n")
        write(spa .. "/index.html", SPA_INDEX)
        write(spa .. "/assets/app.js", "spa()\n")

        local app = tmp .. "/app.lua"
        write(app, ([[
-- The app of the static specs: mounts with each option, and the Lua routes around them.
local moonserve = require "moonserve"
local app = moonserve.app()
local WWW, LIST, SPA = %q, %q, %q

app:error_page(404, function(req, res)
    return res:status(404):send("app 404\n")
end)

app:static("/", WWW)
app:static("/cc", WWW, { cache_control = "public, max-age=60" })
app:static("/dot", WWW, { dotfiles = true })
app:static("/list", LIST, { listing = true })
app:static("/spa", SPA, { spa = true })
app:static("/hooked", WWW, { hook = function(req, res)
    res:header("x-hook", "ran")
    if req.path:find("private", 1, true) then
        return res:status(403):send("forbidden by the hook\n")
    end
end })

-- A hooked mount inside the plain one at "/": its own paths are the hook's.
app:static("/private", WWW .. "/private", { hook = function(req, res)
    return res:status(403):send("denied by the inner hook\n")
end })

app:get("/api/x", function(req, res)
    res:send("lua x")
end)

app:get("/rf/hello", function(req, res)
    assert(res:file(WWW .. "/hello.txt"))
end)

app:get("/rf/missing", function(req, res)
    local ok, err = res:file(WWW .. "/no-such-file.txt")
    if not ok then
        return res:status(404):send("no file: " .. tostring(err))
    end
end)

app:get("/rf/typed", function(req, res)
    res:header("content-type", "text/x-custom")
    assert(res:file(WWW .. "/hello.txt"))
end)

return app
]]):format(www, list, spa))
        srv = helper.spawn_server { app = app }
    end)

    teardown(function()
        if srv then
            assert.is_true(srv:stop(), "the server must stop on SIGTERM")
        end
        if tmp and #tmp > 5 then
            sh("rm -rf " .. q(tmp))
        end
    end)

    local function get(path, fields, method)
        method = method or "GET"
        return assert(helper.request(srv.port, raw(method, path, fields), method == "HEAD"))
    end

    -- Sends `req` and a GET /hello.txt behind it on one connection: the second reply parses
    -- only if the first one sent exactly the body its head announced (none for HEAD, 304).
    local function then_hello(req, head_only)
        local s = helper.connect(srv.port)
        assert(s:send(req .. raw("GET", "/hello.txt")))
        local res = assert(helper.read_response(s, head_only))
        local after = assert(helper.read_response(s))
        s:close()
        assert.equal(200, after.status)
        assert.equal(files["hello.txt"], after.body)
        return res
    end

    -- -- Types, validators, HEAD -----------------------------------------------------------

    describe("a file", function()
        twice("comes with its type, length, validators and Accept-Ranges", function()
            for _, c in ipairs {
                { "/index.html", "html" }, { "/style.css", "css" }, { "/app.js", "js" },
                { "/data.json", "json" }, { "/pic.svg", "svg" },
            } do
                local path, ext = c[1], c[2]
                local res = get(path)
                assert.equal(200, res.status)
                assert.equal(files[path:sub(2)], res.body)
                assert.equal(typed(ext), res.headers["content-type"])
                assert.matches("; charset=utf%-8$", res.headers["content-type"])
                assert.equal(tostring(#files[path:sub(2)]), res.headers["content-length"])
                assert.matches('^"[^"]+"$', res.headers["etag"]) -- strong: no W/
                assert.matches("^%a%a%a, %d%d %a%a%a %d%d%d%d %d%d:%d%d:%d%d GMT$",
                    res.headers["last-modified"])
                assert.equal("bytes", res.headers["accept-ranges"])
            end
            local res = get("/blob.qqq")
            assert.equal(200, res.status)
            assert.equal("application/octet-stream", res.headers["content-type"])
            assert.equal(files["blob.qqq"], res.body)
        end)

        it("has the Last-Modified of its mtime", function()
            assert.equal(http_date(MTIME), get("/cond.txt").headers["last-modified"])
        end)

        twice("answers HEAD with the same fields and no body", function()
            local g = get("/hello.txt")
            local h = then_hello(raw("HEAD", "/hello.txt"), true)
            assert.equal(200, h.status)
            for _, k in ipairs { "content-type", "content-length", "etag", "last-modified",
                "accept-ranges" } do
                assert.equal(g.headers[k], h.headers[k], k)
            end
            assert.equal(tostring(#files["hello.txt"]), h.headers["content-length"])
        end)
    end)

    -- -- Conditional requests ---------------------------------------------------------------

    describe("conditional requests", function()
        local function etag()
            return get("/cond.txt").headers["etag"]
        end

        twice("answer If-None-Match with 304 and the ETag, and no body", function()
            local tag = etag()
            for _, v in ipairs { tag, '"nope", ' .. tag .. ', "other"', "*", "W/" .. tag } do
                local res = then_hello(raw("GET", "/cond.txt", { "If-None-Match: " .. v }))
                assert.equal(304, res.status, "If-None-Match: " .. v)
                assert.equal(tag, res.headers["etag"])
            end
            local res = get("/cond.txt", { 'If-None-Match: "something-else"' })
            assert.equal(200, res.status)
            assert.equal(files["cond.txt"], res.body)
        end)

        twice("answer If-Modified-Since with 304 unless the file is newer", function()
            local res = then_hello(raw("GET", "/cond.txt",
                { "If-Modified-Since: " .. http_date(MTIME) }))
            assert.equal(304, res.status)
            res = get("/cond.txt", { "If-Modified-Since: " .. http_date(MTIME + 86400) })
            assert.equal(304, res.status)
            res = get("/cond.txt", { "If-Modified-Since: " .. http_date(MTIME - 86400) })
            assert.equal(200, res.status)
            assert.equal(files["cond.txt"], res.body)
        end)

        twice("answer a failed If-Match or If-Unmodified-Since with 412", function()
            local res = get("/cond.txt", { 'If-Match: "not-the-etag"' })
            assert.equal(412, res.status)
            assert.not_equal(files["cond.txt"], res.body)
            res = get("/cond.txt", { "If-Match: " .. etag() })
            assert.equal(200, res.status)
            res = get("/cond.txt", { "If-Unmodified-Since: " .. http_date(MTIME - 86400) })
            assert.equal(412, res.status)
            res = get("/cond.txt", { "If-Unmodified-Since: " .. http_date(MTIME) })
            assert.equal(200, res.status)
            assert.equal(files["cond.txt"], res.body)
        end)
    end)

    -- -- Ranges -----------------------------------------------------------------------------

    describe("ranges", function()
        local SIZE = #RANGES

        local function range(spec, fields)
            local f = { "Range: bytes=" .. spec }
            for _, l in ipairs(fields or {}) do
                f[#f + 1] = l
            end
            return get("/ranges.txt", f)
        end

        local function single(spec, first, last)
            local res = range(spec)
            assert.equal(206, res.status, spec)
            assert.equal(("bytes %d-%d/%d"):format(first, last, SIZE), res.headers["content-range"])
            assert.equal(tostring(last - first + 1), res.headers["content-length"])
            assert.equal(RANGES:sub(first + 1, last + 1), res.body)
            assert.equal(typed("txt"), res.headers["content-type"])
        end

        twice("serve one range: first byte, last byte, to the end, cut at the end", function()
            single("0-0", 0, 0)
            single("-1", SIZE - 1, SIZE - 1)
            single("200-", 200, SIZE - 1)
            single("10-999999", 10, SIZE - 1)
            single("-10", SIZE - 10, SIZE - 1)
        end)

        twice("answer a range past the end with 416 and the size", function()
            local res = range(SIZE .. "-")
            assert.equal(416, res.status)
            assert.equal("bytes */" .. SIZE, res.headers["content-range"])
            assert.not_equal(RANGES, res.body)
        end)

        twice("serve two ranges as multipart/byteranges", function()
            local res = range("0-4,20-29")
            assert.equal(206, res.status)
            assert.is_nil(res.headers["content-range"])
            local boundary = res.headers["content-type"]
                :match('^multipart/byteranges; boundary="?([^";]+)"?$')
            assert.truthy(boundary, res.headers["content-type"])
            assert.equal(tostring(#res.body), res.headers["content-length"])
            local parts = byteranges(res.body, boundary)
            assert.equal(2, #parts)
            assert.equal("bytes 0-4/" .. SIZE, parts[1].headers["content-range"])
            assert.equal(RANGES:sub(1, 5), parts[1].data)
            assert.equal(typed("txt"), parts[1].headers["content-type"])
            assert.equal("bytes 20-29/" .. SIZE, parts[2].headers["content-range"])
            assert.equal(RANGES:sub(21, 30), parts[2].data)
        end)

        twice("join overlapping and adjacent ranges into one part", function()
            single("0-9,5-14", 0, 14)
            single("0-4,5-9", 0, 9)
            single("30-39,0-4,3-31", 0, 39)
        end)

        twice("serve the whole file for more than 16 disjoint ranges", function()
            local specs = {}
            for i = 0, 16 do
                specs[#specs + 1] = (i * 4) .. "-" .. (i * 4)
            end
            local res = range(table.concat(specs, ","))
            assert.equal(200, res.status)
            assert.is_nil(res.headers["content-range"])
            assert.equal(RANGES, res.body)
        end)

        twice("honour If-Range only with the current ETag", function()
            local tag = get("/ranges.txt").headers["etag"]
            local res = range("0-3", { "If-Range: " .. tag })
            assert.equal(206, res.status)
            assert.equal(RANGES:sub(1, 4), res.body)
            res = range("0-3", { 'If-Range: "another-etag"' })
            assert.equal(200, res.status)
            assert.equal(RANGES, res.body)
        end)
    end)

    -- -- Encodings -------------------------------------------------------------------------

    describe("precompressed sidecars", function()
        local function css(ae)
            return get("/style.css", ae and { "Accept-Encoding: " .. ae } or nil)
        end

        twice("are chosen by Accept-Encoding, each with its own ETag", function()
            local br = css("br")
            assert.equal(200, br.status)
            assert.equal("br", br.headers["content-encoding"])
            assert.equal(BR_SIDECAR, br.body)
            assert.equal(tostring(#BR_SIDECAR), br.headers["content-length"])
            assert.equal(typed("css"), br.headers["content-type"])

            local gz = css("gzip")
            assert.equal(200, gz.status)
            assert.equal("gzip", gz.headers["content-encoding"])
            assert.equal(files["style.css.gz"], gz.body)

            local gz2 = css("br;q=0, gzip")
            assert.equal("gzip", gz2.headers["content-encoding"])
            assert.equal(files["style.css.gz"], gz2.body)

            local id = css(nil)
            assert.equal(200, id.status)
            assert.is_nil(id.headers["content-encoding"])
            assert.equal(CSS, id.body)

            for _, res in ipairs { br, gz, gz2, id } do
                assert.equal("accept-encoding", res.headers["vary"])
                assert.matches('^"[^"]+"$', res.headers["etag"])
            end
            assert.not_equal(id.headers["etag"], br.headers["etag"])
            assert.not_equal(id.headers["etag"], gz.headers["etag"])
            assert.not_equal(br.headers["etag"], gz.headers["etag"])
            assert.equal(gz.headers["etag"], gz2.headers["etag"])
        end)

        twice("match a 304 against the ETag of the encoding asked for", function()
            local br = css("br")
            local res = get("/style.css", { "Accept-Encoding: br",
                "If-None-Match: " .. br.headers["etag"] })
            assert.equal(304, res.status)
            assert.equal(br.headers["etag"], res.headers["etag"])
        end)

        twice("never serve a range from a sidecar", function()
            local res = get("/style.css", { "Accept-Encoding: br, gzip", "Range: bytes=0-9" })
            assert.equal(206, res.status)
            assert.is_nil(res.headers["content-encoding"])
            assert.equal("bytes 0-9/" .. #CSS, res.headers["content-range"])
            assert.equal(CSS:sub(1, 10), res.body)
        end)
    end)

    describe("compression on the fly", function()
        twice("gzips a text file above compress_min, and it decodes to the file", function()
            local res = get("/lorem.txt", { "Accept-Encoding: gzip" })
            assert.equal(200, res.status)
            assert.equal("gzip", res.headers["content-encoding"])
            assert.equal("accept-encoding", res.headers["vary"])
            assert.equal(tostring(#res.body), res.headers["content-length"])
            assert.is_true(#res.body < #LOREM)
            local gz = os.tmpname()
            write(gz, res.body)
            local out = sh("gzip -dc < " .. q(gz))
            os.remove(gz)
            assert.equal(LOREM, out)
        end)

        twice("decodes to the file through curl --compressed", function()
            local out = helper.curl(("--compressed -o - http://127.0.0.1:%d/lorem.txt")
                :format(srv.port))
            assert.equal(LOREM, out)
        end)

        twice("leaves a file under compress_min, and an image, as they are", function()
            local res = get("/small.txt", { "Accept-Encoding: gzip, br" })
            assert.equal(200, res.status)
            assert.is_nil(res.headers["content-encoding"])
            assert.equal(files["small.txt"], res.body)
            res = get("/image.png", { "Accept-Encoding: gzip, br" })
            assert.equal(200, res.status)
            assert.equal(typed("png"), res.headers["content-type"])
            assert.is_nil(res.headers["content-encoding"])
            assert.equal(files["image.png"], res.body)
        end)
    end)

    -- -- Directories, SPA, caching fields, dotfiles ------------------------------------------

    describe("directories", function()
        twice("serve a directory's index.html at its name with a slash", function()
            local res = get("/docs/")
            assert.equal(200, res.status)
            assert.equal(files["docs/index.html"], res.body)
            assert.equal(typed("html"), res.headers["content-type"])
            res = get("/")
            assert.equal(200, res.status)
            assert.equal(ROOT_INDEX, res.body)
        end)

        twice("redirect a directory's name without the slash, keeping the query", function()
            local res = get("/docs")
            assert.equal(301, res.status)
            assert.equal("/docs/", res.headers["location"])
            res = get("/docs?x=1&y=2")
            assert.equal(301, res.status)
            assert.equal("/docs/?x=1&y=2", res.headers["location"])
        end)

        twice("answer a directory without an index page with the app's 404", function()
            local res = get("/noindex/")
            assert.equal(404, res.status, "location: " .. tostring(res.headers["location"]))
            assert.equal("app 404\n", res.body)
            -- and a client following redirects from the name without the slash ends there
            local out = helper.curl(("-L --max-redirs 5 -o /dev/null -w '%%{http_code}' "
                .. "http://127.0.0.1:%d/noindex"):format(srv.port))
            assert.equal("404", out)
        end)

        twice("list a directory with listing, names escaped and dotfiles left out", function()
            local res = get("/list/")
            assert.equal(200, res.status)
            assert.equal("text/html; charset=utf-8", res.headers["content-type"])
            local body = res.body
            assert.truthy(body:find('<a href="./%3Cb%3E%26%22x.txt">&lt;b&gt;&amp;&quot;x.txt</a>',
                1, true), body)
            assert.truthy(body:find('<a href="./plain.txt">plain.txt</a>', 1, true), body)
            assert.truthy(body:find('href="./sub/"', 1, true), body)
            assert.falsy(body:find('<b>&"x', 1, true), body)
            assert.falsy(body:find("hidden", 1, true), body)
            -- and the escaped link leads to the file
            res = get("/list/%3Cb%3E%26%22x.txt")
            assert.equal(200, res.status)
            assert.equal("tricky name\n", res.body)
        end)
    end)

    describe("a single-page application mount", function()
        twice("answers a path with no extension with the root index.html", function()
            for _, path in ipairs { "/spa/some/route", "/spa/users/42", "/spa/" } do
                local res = get(path)
                assert.equal(200, res.status, path)
                assert.equal(SPA_INDEX, res.body)
                assert.equal(typed("html"), res.headers["content-type"])
            end
            assert.equal("spa()\n", get("/spa/assets/app.js").body)
        end)

        twice("leaves a missing file with an extension a 404", function()
            local res = get("/spa/missing.js")
            assert.equal(404, res.status)
            assert.equal("app 404\n", res.body)
        end)
    end)

    describe("caching fields", function()
        twice("mark a fingerprinted name immutable for a year", function()
            for _, prefix in ipairs { "", "/cc" } do
                local res = get(prefix .. "/app.3f9a1c.js")
                assert.equal(200, res.status)
                assert.equal("public, max-age=31536000, immutable", res.headers["cache-control"])
            end
        end)

        twice("give a plain name the mount's cache_control, or none", function()
            local res = get("/cc/plain.js")
            assert.equal(200, res.status)
            assert.equal("public, max-age=60", res.headers["cache-control"])
            res = get("/plain.js")
            assert.equal(200, res.status)
            assert.equal(files["plain.js"], res.body)
            assert.is_nil(res.headers["cache-control"])
        end)
    end)

    describe("dotfiles", function()
        twice("are not found, and their content never shows", function()
            for _, path in ipairs { "/.env", "/cc/.env" } do
                local res = get(path)
                assert.equal(404, res.status, path)
                assert.equal("app 404\n", res.body)
            end
            -- other spellings of the name: never served, whatever else they get
            for _, path in ipairs { "/%2eenv", "/%2Eenv", "/docs/../.env", "/./.env" } do
                local res = get(path)
                assert.not_equal(200, res.status, path)
                assert.falsy(res.body:find(secret, 1, true), path)
                assert.falsy(res.raw_head:find(secret, 1, true), path)
            end
        end)

        twice("are served by a mount with dotfiles = true", function()
            local res = get("/dot/.env")
            assert.equal(200, res.status)
            assert.equal(files[".env"], res.body)
        end)
    end)

    -- -- Confinement -----------------------------------------------------------------------

    describe("confinement", function()
        local ATTACKS = {
            { "/../secret" },
            { "/%2e%2e/secret" },
            { "/%2E%2E%2Fsecret" },
            { "/%2e%2e%2fsecret" },
            { "/..%2fsecret" },
            { "/a/../../secret" },
            { "/%00" },
            { "/a%00.txt" },
            { "/hello.txt%00.png" },
            { "/..%5csecret" },
            { "/\\..\\secret" },
            { "/a%5c..%5c..%5csecret" },
            -- not a file of the mount: the app's rule makes the path canonical first (308
            -- to /etc/passwd, which is then 404)
            { "//etc/passwd", also = { 308 }, location = "/etc/passwd" },
            { "/./././../secret" },
            { "/%252e%252e/secret", only = 404 },
            { "/%zz" },
            { "/%1b[31m" },
            { "/" .. ("a"):rep(300) },
            { "/" .. ("a/"):rep(2499) .. "a", also = { 414, 431 } },
            { "/dot/../secret" },
            { "/dot/%2e%2e/secret" },
            { "/list/../secret" },
        }

        twice("answers each traversal and encoding attack with 400 or 404, never the secret",
            function()
                local failures = {}
                for _, c in ipairs(ATTACKS) do
                    local path = c[1]
                    local shown = #path > 60 and (path:sub(1, 40) .. "... (" .. #path .. " bytes)")
                        or path
                    local s = helper.connect(srv.port, 3)
                    local t0 = socket.gettime()
                    assert(s:send(raw("GET", path)))
                    local res, err = helper.read_response(s)
                    local took = socket.gettime() - t0
                    s:close()
                    local ok_status = {}
                    if c.only then
                        ok_status[c.only] = true
                    else
                        ok_status[400], ok_status[404] = true, true
                        for _, code in ipairs(c.also or {}) do
                            ok_status[code] = true
                        end
                    end
                    if not res then
                        failures[#failures + 1] = shown .. ": no response (" .. tostring(err) .. ")"
                    elseif not ok_status[res.status] then
                        failures[#failures + 1] = shown .. ": " .. res.status .. " "
                            .. (res.headers["location"] or res.body):sub(1, 60)
                    elseif res.status == 308 and res.headers["location"] ~= c.location then
                        failures[#failures + 1] = shown .. ": 308 to "
                            .. tostring(res.headers["location"])
                    elseif res.body:find(secret, 1, true) or res.raw_head:find(secret, 1, true) then
                        failures[#failures + 1] = shown .. ": the secret leaked"
                    elseif took > 2 then
                        failures[#failures + 1] = shown .. ": took " .. took .. " s"
                    end
                end
                assert.same({}, failures)
                -- and the server is still fine
                assert.equal(files["hello.txt"], get("/hello.txt").body)
            end)

        it("logs one line for a bad path", function()
            local before = select(2, srv:log():gsub("static path: NUL byte", ""))
            local res = get("/a%00.txt")
            assert.equal(400, res.status)
            socket.sleep(0.1)
            local after = select(2, srv:log():gsub("static path: NUL byte", ""))
            assert.equal(before + 1, after)
        end)

        twice("does not follow a symlink out of the root", function()
            for _, path in ipairs { "/link-up", "/link-abs", "/link-dir/inner.txt", "/link-dir",
                "/link-dir/", "/dot/link-up", "/dot/link-dir/inner.txt" } do
                local res = get(path)
                if path == "/link-dir/" then
                    -- no directory there for the mount: the app's trailing-slash rule first
                    assert.equal(308, res.status)
                    assert.equal("/link-dir", res.headers["location"])
                    res = get(res.headers["location"])
                end
                assert.equal(404, res.status, path .. " (location: "
                    .. tostring(res.headers["location"]) .. ")")
                assert.equal("app 404\n", res.body)
                assert.falsy(res.raw_head:find(secret, 1, true), path)
            end
        end)

        twice("serves a symlink that stays inside the root", function()
            local res = get("/link-in.txt")
            assert.equal(200, res.status)
            assert.equal(files["hello.txt"], res.body)
        end)
    end)

    -- -- Freshness of the cache -----------------------------------------------------------

    describe("a cached file", function()
        -- Each change is followed at once by the next request, and that many times over, so
        -- that a check skipped because the loop's clock has not moved (it counts
        -- milliseconds) shows as a failure rather than as luck.
        local ROUNDS = 30

        it("is served with its new content and ETag on the request after a rewrite", function()
            local path = www .. "/changing.txt"
            write(path, "version 0\n")
            local last = get("/changing.txt")
            assert.equal("version 0\n", last.body)
            assert.equal(last.headers["etag"], get("/changing.txt").headers["etag"]) -- cached
            for i = 1, ROUNDS do
                local data = "version " .. i .. ("!"):rep(i) .. "\n" -- a new size each time
                write(path, data)
                local res = get("/changing.txt")
                assert.equal(data, res.body, "round " .. i)
                assert.equal(tostring(#data), res.headers["content-length"])
                assert.not_equal(last.headers["etag"], res.headers["etag"], "round " .. i)
                last = res
            end
            os.remove(path)
        end)

        it("is not found on the request after it is deleted", function()
            local path = www .. "/deleted.txt"
            for i = 1, ROUNDS do
                write(path, "here " .. i .. "\n")
                assert.equal("here " .. i .. "\n", get("/deleted.txt").body, "round " .. i)
                os.remove(path)
                local res = get("/deleted.txt")
                assert.equal(404, res.status, "round " .. i)
                assert.equal("app 404\n", res.body)
            end
        end)

        it("is served anew on the request after a new file is renamed over it", function()
            local path = www .. "/renamed.txt"
            write(path, "old\n")
            assert.equal("old\n", get("/renamed.txt").body)
            for i = 1, ROUNDS do
                local data = "renamed in " .. i .. "\n"
                write(path .. ".new", data)
                assert(os.rename(path .. ".new", path))
                local res = get("/renamed.txt")
                assert.equal(data, res.body, "round " .. i)
            end
            -- and the same through mv(1)
            write(path .. ".new", "moved\n")
            sh("mv " .. q(path .. ".new") .. " " .. q(path))
            assert.equal("moved\n", get("/renamed.txt").body)
            os.remove(path)
        end)

        it("is not found on the request after it is moved out of the mount", function()
            local path, away = www .. "/moving.txt", tmp .. "/outside/moving.txt"
            write(path, "moving\n")
            for i = 1, ROUNDS do
                assert.equal("moving\n", get("/moving.txt").body, "round " .. i)
                sh("mv " .. q(path) .. " " .. q(away))
                local res = get("/moving.txt")
                assert.equal(404, res.status, "round " .. i)
                assert.equal("app 404\n", res.body)
                sh("mv " .. q(away) .. " " .. q(path))
            end
            -- and a directory above it, which leaves the file itself as it was
            sh("mkdir -p " .. q(www .. "/movingdir") .. " && mv " .. q(path) .. " "
                .. q(www .. "/movingdir/f.txt"))
            assert.equal("moving\n", get("/movingdir/f.txt").body)
            sh("mv " .. q(www .. "/movingdir") .. " " .. q(tmp .. "/outside/movingdir"))
            assert.equal(404, get("/movingdir/f.txt").status)
            sh("rm -rf " .. q(tmp .. "/outside/movingdir"))
        end)

        it("is not served on the request after it is made unreadable", function()
            local path = www .. "/unreadable.txt"
            write(path, "readable\n")
            for i = 1, ROUNDS do
                assert.equal("readable\n", get("/unreadable.txt").body, "round " .. i)
                sh("chmod 000 " .. q(path))
                local res = get("/unreadable.txt")
                assert.equal(404, res.status, "round " .. i)
                assert.equal("app 404\n", res.body)
                sh("chmod 644 " .. q(path))
            end
            -- nor on a first open, whoever the server runs as
            sh("chmod 000 " .. q(path))
            assert.equal(404, get("/unreadable.txt").status)
            assert.equal(404, get("/unreadable.txt").status)
            os.remove(path)
        end)

        it("is served anew after a large file is rewritten", function()
            local path = www .. "/big/changing.bin"
            write(path, ("1"):rep(200000))
            assert.equal(("1"):rep(200000), get("/big/changing.bin").body)
            write(path, ("2"):rep(100000))
            local res = get("/big/changing.bin")
            assert.equal("100000", res.headers["content-length"])
            assert.equal(("2"):rep(100000), res.body)
            os.remove(path)
        end)
    end)

    -- -- Large files and slow readers ----------------------------------------------------

    describe("large files", function()
        it("streams a 1 GiB file whole while the server stays small", function()
            local before = rss_kb(srv.pid)
            assert.truthy(before, "the server's VmRSS")
            local job = background((helper.tool("curl") .. " -sS --max-time 60 -o /dev/null "
                .. "-w '%%{http_code} %%{size_download}' http://127.0.0.1:%d/big/sparse.bin")
                :format(srv.port))
            local peak = before
            local deadline = socket.gettime() + 65
            while not job:done() and socket.gettime() < deadline do
                peak = math.max(peak, rss_kb(srv.pid) or 0)
                socket.sleep(0.02)
            end
            local out = job:wait(1)
            assert.equal("200 1073741824", out)
            local after = rss_kb(srv.pid)
            assert.is_true(peak < 64 * 1024, "VmRSS peaked at " .. peak .. " kB")
            assert.is_true(after < 64 * 1024, "VmRSS after: " .. after .. " kB")
        end)

        -- The reader paces itself (curl's --limit-rate lets bursts through on loopback) and
        -- keeps a small receive buffer, so the server's writes wait on it for most of the way.
        it("sends every byte to a slow reader while answering others promptly", function()
            local want = helper.read_file(www .. "/big/random.bin")
            local RATE = 4 * 1024 * 1024
            local s = assert(socket.tcp4())
            assert(s:setoption("recv-buffer-size", 65536))
            s:settimeout(10)
            assert(s:connect("127.0.0.1", srv.port))
            assert(s:send(raw("GET", "/big/random.bin")))
            local status = assert(s:receive("*l"))
            assert.equal("HTTP/1.1 200 OK", status)
            local length
            repeat
                local l = assert(s:receive("*l"))
                length = length or tonumber(l:lower():match("^content%-length:%s*(%d+)"))
            until l == ""
            assert.equal(#want, length)
            local parts, got, t0 = {}, 0, socket.gettime()
            local checks, slowest = 0, 0
            while got < length do
                local data, err, partial = s:receive(math.min(65536, length - got))
                data = data or partial
                assert(data and #data > 0, err) -- a stall of 10 s ends the test
                parts[#parts + 1] = data
                got = got + #data
                -- Every 2 MiB, another request on a second connection.
                if got >= (checks + 1) * 2 * 1024 * 1024 and got < length then
                    checks = checks + 1
                    local t1 = socket.gettime()
                    local res = get("/hello.txt")
                    slowest = math.max(slowest, socket.gettime() - t1)
                    assert.equal(200, res.status)
                    assert.equal(files["hello.txt"], res.body)
                end
                local ahead = t0 + got / RATE - socket.gettime()
                if ahead > 0 then
                    socket.sleep(ahead)
                end
            end
            s:close()
            assert.equal(3, checks)
            assert.is_true(slowest < 0.5, "another request took " .. slowest .. " s")
            local body = table.concat(parts)
            assert.equal(#want, #body)
            assert.is_true(body == want, "the bytes differ from the file's")
        end)
    end)

    -- -- From Lua --------------------------------------------------------------------------

    describe("res:file", function()
        twice("serves the file with its validators, 304 and ranges", function()
            local res = get("/rf/hello")
            assert.equal(200, res.status)
            assert.equal(files["hello.txt"], res.body)
            assert.equal(typed("txt"), res.headers["content-type"])
            assert.equal(tostring(#files["hello.txt"]), res.headers["content-length"])
            local tag = res.headers["etag"]
            assert.matches('^"[^"]+"$', tag)
            assert.truthy(res.headers["last-modified"])
            local nm = then_hello(raw("GET", "/rf/hello", { "If-None-Match: " .. tag }))
            assert.equal(304, nm.status)
            assert.equal(tag, nm.headers["etag"])
            local part = get("/rf/hello", { "Range: bytes=0-4" })
            assert.equal(206, part.status)
            assert.equal("bytes 0-4/" .. #files["hello.txt"], part.headers["content-range"])
            assert.equal("hello", part.body)
        end)

        twice("returns nil and the error for a missing file", function()
            local res = get("/rf/missing")
            assert.equal(404, res.status)
            assert.matches("^no file: ENOENT", res.body)
        end)

        twice("keeps the Content-Type the handler set, once", function()
            local res = get("/rf/typed")
            assert.equal(200, res.status)
            assert.equal("text/x-custom", res.headers["content-type"])
            local _, n = res.raw_head:lower():gsub("\ncontent%-type:", "")
            assert.equal(1, n)
            assert.equal(files["hello.txt"], res.body)
        end)
    end)

    describe("a mount with a hook", function()
        twice("runs the hook, then serves the file", function()
            local res = get("/hooked/hello.txt")
            assert.equal(200, res.status)
            assert.equal("ran", res.headers["x-hook"])
            assert.equal(files["hello.txt"], res.body)
            assert.equal(typed("txt"), res.headers["content-type"])
            assert.truthy(res.headers["etag"])
        end)

        twice("lets the hook answer instead", function()
            local res = get("/hooked/private.txt")
            assert.equal(403, res.status)
            assert.equal("forbidden by the hook\n", res.body)
        end)

        twice("inside a mount without one, runs its hook for its own paths", function()
            for _, method in ipairs { "GET", "HEAD" } do
                local res = get("/private/secret.txt", nil, method)
                assert.equal(403, res.status, method)
                assert.falsy(res.body:find("SECRET", 1, true), method)
            end
            -- the outer mount still serves what is outside the inner one
            assert.equal(files["hello.txt"], get("/hello.txt").body)
        end)

        twice("gives the app's 404 for a missing file", function()
            local res = get("/hooked/nope.txt")
            assert.equal(404, res.status)
            assert.equal("app 404\n", res.body)
        end)
    end)

    describe("falling through to Lua", function()
        twice("leaves a path with no file to the app's routes", function()
            local res = get("/api/x")
            assert.equal(200, res.status)
            assert.equal("lua x", res.body)
            res = get("/nothing-here.txt")
            assert.equal(404, res.status)
            assert.equal("app 404\n", res.body)
        end)

        twice("does not serve a POST to a static path", function()
            local res = get("/hello.txt", { "Content-Length: 0" }, "POST")
            assert.truthy(res.status == 404 or res.status == 405, "status " .. res.status)
            assert.falsy(res.body:find(files["hello.txt"], 1, true))
        end)
    end)
end)

-- -- The command line ----------------------------------------------------------------------

describe("moonserve --static", function()
    local tmp, srv
    local INDEX = "<!DOCTYPE html><title>cli</title><p>from the command line</p>\n"

    setup(function()
        tmp = os.tmpname()
        os.remove(tmp)
        sh("mkdir -p " .. q(tmp))
        write(tmp .. "/index.html", INDEX)
        srv = helper.spawn_server { args = "--static " .. q(tmp) }
    end)

    teardown(function()
        if srv then
            srv:stop()
        end
        sh("rm -rf " .. q(tmp))
    end)

    twice("serves index.html at / and 404 for a missing file", function()
        local res = helper.request(srv.port, raw("GET", "/"))
        assert.equal(200, res.status)
        assert.equal(INDEX, res.body)
        assert.equal(typed("html"), res.headers["content-type"])
        res = helper.request(srv.port, raw("GET", "/missing.txt"))
        assert.equal(404, res.status)
        assert.falsy(res.body:find(INDEX, 1, true))
    end)
end)

describe("moonserve --static --dev", function()
    local tmp, srv
    local PAGE = "<!DOCTYPE html><title>live</title><p>live page</p>\n"

    setup(function()
        tmp = os.tmpname()
        os.remove(tmp)
        sh("mkdir -p " .. q(tmp))
        write(tmp .. "/index.html", PAGE)
        srv = helper.spawn_server { args = "--static " .. q(tmp) .. " --dev" }
    end)

    teardown(function()
        if srv then
            srv:stop()
            os.remove(srv.logfile)
        end
        sh("rm -rf " .. q(tmp))
    end)

    twice("ends an HTML page with the live reload script, and counts it in the length", function()
        local s = helper.connect(srv.port)
        assert(s:send(raw("GET", "/index.html") .. raw("GET", "/index.html")))
        local res = assert(helper.read_response(s))
        assert.equal(200, res.status)
        assert.equal(PAGE, res.body:sub(1, #PAGE))
        local script = res.body:sub(#PAGE + 1)
        assert.matches("^<script>.*/%.moonserve/live.*</script>%s*$", script)
        assert.equal(tostring(#res.body), res.headers["content-length"])
        -- the next reply on the connection starts where the length said
        local after = assert(helper.read_response(s))
        assert.equal(200, after.status)
        assert.equal(res.body, after.body)
        s:close()
    end)

    it("streams events and sends a reload when a file changes", function()
        local s = helper.connect(srv.port, 1)
        assert(s:send(raw("GET", "/.moonserve/live")))
        local status = s:receive("*l")
        assert.equal("HTTP/1.1 200 OK", status)
        local head = {}
        while true do
            local l = assert(s:receive("*l"))
            if l == "" then
                break
            end
            local k, v = l:match("^([^:]+):%s*(.-)%s*$")
            head[k:lower()] = v
        end
        assert.equal("text/event-stream", head["content-type"])
        -- Wait for the stream's first event, so the handler has seen the files as they are.
        local deadline = socket.gettime() + 5
        local seen = {}
        local function read_until(want)
            while socket.gettime() < deadline do
                local l, err = s:receive("*l")
                if l then
                    seen[#seen + 1] = l
                    if l:find(want, 1, true) == 1 then
                        return true
                    end
                elseif err ~= "timeout" then
                    return false
                end
            end
            return false
        end
        assert.is_true(read_until("retry:"), table.concat(seen, "\n"))
        write(tmp .. "/changed.css", "body { color: red }\n")
        deadline = socket.gettime() + 5
        assert.is_true(read_until("data: reload"), table.concat(seen, "\n"))
        s:close()
    end)

    -- Last: it stops the server.
    it("stops on SIGTERM while a page listens for reloads", function()
        local s = helper.connect(srv.port, 2)
        assert(s:send(raw("GET", "/.moonserve/live")))
        assert.equal("HTTP/1.1 200 OK", s:receive("*l"))
        local stopped = srv:stop() -- SIGTERM, then SIGKILL after 5 s
        local log = srv:log()
        os.remove(srv.logfile)
        srv = nil
        s:close()
        assert.is_true(stopped, "still running 5 s after SIGTERM:\n" .. log)
    end)
end)
