describe("moonserve.csrf", function()
    local csrf = require "moonserve.csrf"

    local SECRET = "an example secret of at least 32 bytes, never this one"
    local HOST = "example.org"

    describe("check", function()
        it("lets every safe method through, whatever its headers say", function()
            local hostile = { ["sec-fetch-site"] = "cross-site", origin = "https://evil.test" }
            for _, method in ipairs({ "GET", "HEAD", "OPTIONS", "TRACE", "get" }) do
                assert.is_true(csrf.check(method, hostile, HOST))
            end
        end)

        -- { what, method, headers, opts }: each is let through.
        local allowed = {
            { "a same-origin fetch", "POST", { ["sec-fetch-site"] = "same-origin" } },
            { "a request the user typed or bookmarked", "POST", { ["sec-fetch-site"] = "none" } },
            { "a same-site fetch when same-site is allowed", "PUT",
                { ["sec-fetch-site"] = "same-site" }, { allow_same_site = true } },
            { "a matching Origin", "POST", { origin = "http://example.org" } },
            { "a matching Origin in another case", "POST", { origin = "HTTP://Example.ORG" } },
            { "a matching Origin with the default port spelled out", "DELETE",
                { origin = "https://example.org:443" }, { scheme = "https" } },
            { "a matching Origin over https", "PATCH", { origin = "https://example.org" },
                { scheme = "https" } },
            { "a trusted Origin", "POST", { origin = "https://app.example.net" },
                { trusted_origins = { "https://app.example.net" } } },
            { "a trusted Origin that the browser calls cross-site", "POST",
                { origin = "https://app.example.net", ["sec-fetch-site"] = "cross-site" },
                { trusted_origins = { "https://APP.example.net:443" } } },
            { "a matching Referer", "POST", { referer = "http://example.org/form?x=1" } },
            { "a trusted Referer", "POST", { referer = "https://app.example.net/page" },
                { trusted_origins = { "https://app.example.net" } } },
            { "a request with no Origin or Referer", "POST", {} },
            { "an unknown method from the same origin", "PROPFIND",
                { origin = "http://example.org" } },
        }
        for _, case in ipairs(allowed) do
            it("allows " .. case[1], function()
                local ok, why = csrf.check(case[2], case[3], HOST, case[4])
                assert.is_nil(why)
                assert.is_true(ok)
            end)
        end

        local refused = {
            { "a cross-site fetch", "POST", { ["sec-fetch-site"] = "cross-site" } },
            { "a same-site fetch by default", "POST", { ["sec-fetch-site"] = "same-site" } },
            { "a cross-site fetch even with a matching Origin", "POST",
                { ["sec-fetch-site"] = "cross-site", origin = "http://example.org" } },
            { "an unknown Sec-Fetch-Site", "POST", { ["sec-fetch-site"] = "maybe" } },
            { "another Origin", "POST", { origin = "http://evil.test" } },
            { "an Origin whose host only starts like ours", "POST",
                { origin = "http://example.org.evil.test" } },
            { "an Origin on another port", "POST", { origin = "http://example.org:8080" } },
            { "an Origin with another scheme", "POST", { origin = "https://example.org" },
                { scheme = "http" } },
            { "an http Origin on an https site", "POST", { origin = "http://example.org" },
                { scheme = "https" } },
            { "the null Origin", "POST", { origin = "null" } },
            { "an Origin that is not a URL", "POST", { origin = "example.org" } },
            { "an Origin with userinfo naming our host", "POST",
                { origin = "http://example.org@evil.test" } },
            { "another Origin even with a matching Referer", "POST",
                { origin = "http://evil.test", referer = "http://example.org/" } },
            { "an Origin not in the trusted list", "POST", { origin = "https://evil.test" },
                { trusted_origins = { "https://app.example.net" } } },
            { "another Referer", "PUT", { referer = "http://evil.test/example.org" } },
            { "a relative Referer", "POST", { referer = "/form" } },
            { "an unknown method from another origin", "PROPFIND",
                { origin = "http://evil.test" } },
            { "a request with no Origin or Referer when one is required", "POST", {},
                { require_origin = true } },
        }
        for _, case in ipairs(refused) do
            it("refuses " .. case[1], function()
                local ok, why = csrf.check(case[2], case[3], HOST, case[4])
                assert.is_false(ok)
                assert.is_string(why)
            end)
        end

        it("takes the host from the Host field when none is given", function()
            local headers = { host = "example.org:8080", origin = "http://example.org:8080" }
            assert.is_true(csrf.check("POST", headers))
            headers = { host = "example.org", origin = "http://evil.test" }
            assert.is_false(csrf.check("POST", headers))
        end)

        it("refuses an Origin when there is no host to compare it with", function()
            local ok, why = csrf.check("POST", { origin = "http://example.org" })
            assert.is_false(ok)
            assert.equal("Origin: http://example.org (no Host to compare it with)", why)
        end)

        it("says which header it refused", function()
            local _, why = csrf.check("POST", { origin = "http://evil.test" }, HOST)
            assert.equal("Origin: http://evil.test (Host: example.org)", why)
            _, why = csrf.check("POST", { ["sec-fetch-site"] = "cross-site" }, HOST)
            assert.equal("Sec-Fetch-Site: cross-site", why)
        end)

        it("compares the scheme only when it is given", function()
            assert.is_true(csrf.check("POST", { origin = "https://example.org" }, HOST))
            assert.is_false(csrf.check("POST", { origin = "https://example.org" }, HOST,
                { scheme = "http" }))
        end)

        it("lets an HTTP/2 WebSocket's CONNECT through as the GET of an upgrade", function()
            -- RFC 8441: the handshake of app:websocket checks its Origin.
            local hostile = { [":protocol"] = "websocket", origin = "https://evil.test" }
            assert.is_true(csrf.check("CONNECT", hostile, HOST))
            assert.is_false(csrf.check("CONNECT", { origin = "https://evil.test" }, HOST))
            assert.is_false(csrf.check("CONNECT", { [":protocol"] = "webtransport",
                origin = "https://evil.test" }, HOST))
            assert.is_false(csrf.check("POST", hostile, HOST))
        end)

        it("raises on a method or headers of the wrong type", function()
            assert.has_error(function() csrf.check(nil, {}, HOST) end)
            assert.has_error(function() csrf.check("POST", nil, HOST) end)
        end)
    end)

    describe("tokens", function()
        local SID = "dGhlIHNlc3Npb24gaWQ"

        it("verifies a token made for the same secret and session", function()
            assert.is_true(csrf.verify(SECRET, SID, csrf.token(SECRET, SID)))
        end)

        it("makes a different token each time, and every one verifies", function()
            local seen = {}
            for _ = 1, 50 do
                local t = csrf.token(SECRET, SID)
                assert.is_nil(seen[t])
                seen[t] = true
                assert.is_true(csrf.verify(SECRET, SID, t))
            end
        end)

        it("makes tokens that fit in a form field or a header without escaping", function()
            assert.matches("^[%w%-_]+$", csrf.token(SECRET, SID))
        end)

        it("refuses a token of another session", function()
            assert.is_false(csrf.verify(SECRET, SID, csrf.token(SECRET, "another id")))
        end)

        it("refuses a token made with another secret", function()
            assert.is_false(csrf.verify(SECRET, SID, csrf.token(string.rep("k", 32), SID)))
        end)

        it("refuses a token with any one character changed", function()
            local t = csrf.token(SECRET, SID)
            for i = 1, #t do
                local c = t:sub(i, i)
                local bad = t:sub(1, i - 1) .. (c == "A" and "B" or "A") .. t:sub(i + 1)
                assert.is_false(csrf.verify(SECRET, SID, bad), "changed at " .. i)
            end
        end)

        it("refuses a truncated, extended or missing token", function()
            local t = csrf.token(SECRET, SID)
            assert.is_false(csrf.verify(SECRET, SID, t:sub(1, -2)))
            assert.is_false(csrf.verify(SECRET, SID, t:sub(1, 22)))
            assert.is_false(csrf.verify(SECRET, SID, t .. "AAAA"))
            assert.is_false(csrf.verify(SECRET, SID, ""))
            assert.is_false(csrf.verify(SECRET, SID, nil))
            assert.is_false(csrf.verify(SECRET, SID, "not a token!"))
        end)

        it("raises on a short secret or a missing session id", function()
            assert.has_error(function() csrf.token("short", SID) end)
            assert.has_error(function() csrf.token(SECRET, nil) end)
            assert.has_error(function() csrf.verify(SECRET, nil, "x") end)
        end)
    end)

    describe("middleware", function()
        local moonserve = require "moonserve"
        local helper = require "helper"
        local request_methods = require "moonserve.request_methods"

        -- A request as the middleware sees it, made in Lua: method, fields, a session and a
        -- body read in the given pieces; and a reply that records its status.
        local function fake(method, fields, pieces)
            local i = 0
            local methods = {
                header = function(_, name) return fields[name:lower()] end,
                headers = function() return fields end,
                read = function()
                    i = i + 1
                    return pieces and pieces[i]
                end,
            }
            methods._read = methods.read
            local req = setmetatable({ method = method, cookies = {},
                session = { id = "the session id", keep = function() end } },
                request_methods.metatable({}, methods))
            local res = { code = 200 }
            function res:status(c) self.code = c return self end
            function res:send(b) self.body = b return true end
            return req, res
        end

        local function run(mw, req, res)
            local passed = false
            mw(req, res, function() passed = true end)
            return passed, res.code, res.body
        end

        it("lets an HTTP/2 WebSocket's CONNECT through without a token", function()
            -- As the GET of an HTTP/1.1 upgrade: no form sends it, and app:websocket checks
            -- its Origin (a 403 here would fail every browser's socket over TLS).
            local mw = csrf.middleware { secret = SECRET }
            local req, res = fake("CONNECT", { host = HOST, [":protocol"] = "websocket",
                origin = "https://" .. HOST, ["sec-websocket-version"] = "13" })
            assert.is_true((run(mw, req, res)))
            assert.is_function(res.csrf_token) -- pages it serves may still make tokens
            -- a CONNECT for anything else needs what any unsafe method needs
            req, res = fake("CONNECT", { host = HOST, origin = "https://" .. HOST })
            local passed, code, body = run(mw, req, res)
            assert.is_false(passed)
            assert.equal(403, code)
            assert.equal("Forbidden: missing or bad CSRF token\n", body)
            -- and without tokens, the origin check alone lets it through as well
            req, res = fake("CONNECT", { host = HOST, [":protocol"] = "websocket",
                origin = "https://evil.test" })
            assert.is_true((run(csrf.middleware(), req, res)))
        end)

        local B = "----form-boundary-7MA4YWxk"
        local CT = "multipart/form-data; boundary=" .. B

        local mp = require "fixtures.multipart_body"
        local pieces_of = mp.pieces

        -- A multipart body of { name, value[, filename] } parts.
        local function multipart_body(parts)
            return mp.fields(B, parts)
        end

        it("takes the token from a multipart field before or after a file part", function()
            local mw = csrf.middleware { secret = SECRET }
            local token = csrf.token(SECRET, "the session id")
            local file = string.rep("0123456789abcdef", 4096) -- 64 KiB
            local orders = {
                { { "_csrf", token }, { "title", "hi" }, { "upload", file, "a.bin" } },
                { { "title", "hi" }, { "upload", file, "a.bin" }, { "_csrf", token } },
            }
            for _, parts in ipairs(orders) do
                local body = multipart_body(parts)
                for _, size in ipairs { 1, 1000, #body } do
                    local pieces = pieces_of(body, size)
                    local req, res = fake("POST", { host = HOST, ["content-type"] = CT }, pieces)
                    assert.is_true((run(mw, req, res)), size)
                    -- The handler reads the whole body, the pieces the middleware took first.
                    local seen = {}
                    for p in assert(req:parts()) do
                        seen[#seen + 1] = p.name .. "=" .. #p:body()
                    end
                    assert.equal(#parts, #seen)
                    for k, p in ipairs(parts) do
                        assert.equal(p[1] .. "=" .. #p[2], seen[k])
                    end
                    -- and the body whole, as it came
                    req, res = fake("POST", { host = HOST, ["content-type"] = CT },
                        pieces_of(body, size))
                    assert.is_true((run(mw, req, res)))
                    assert.equal(body, req:body())
                    assert.is_nil(req:read())
                end
            end
        end)

        it("reads a multipart body only up to the end of its _csrf field", function()
            local mw = csrf.middleware { secret = SECRET }
            local token = csrf.token(SECRET, "the session id")
            local body = multipart_body { { "_csrf", token }, { "upload", string.rep("x", 5000),
                "a.bin" } }
            local pieces = pieces_of(body, 100)
            local req, res = fake("POST", { host = HOST, ["content-type"] = CT }, pieces)
            local taken = 0
            local read = getmetatable(req).__index(req, "read")
            rawset(req, "read", function(self) taken = taken + 1 return read(self) end)
            assert.is_true((run(mw, req, res)))
            assert.truthy(taken < 5, taken) -- not the 52 pieces of the whole body
            rawset(req, "read", nil)
            assert.equal(body, req:body())
        end)

        it("refuses a multipart body without a good _csrf field, and leaves it readable", function()
            local mw = csrf.middleware { secret = SECRET }
            local bad = {
                multipart_body { { "title", "hi" }, { "upload", "data", "a.bin" } },
                multipart_body { { "_csrf", "not a token" } },
                multipart_body { { "_csrf", string.rep("A", 300) } }, -- longer than any token
                multipart_body { { "_csrf", csrf.token(SECRET, "another session") } },
                "--" .. B .. "\r\nContent-Type: text/plain\r\n\r\nno disposition\r\n--" .. B,
            }
            for _, body in ipairs(bad) do
                local req, res = fake("POST", { host = HOST, ["content-type"] = CT },
                    pieces_of(body, 7))
                local passed, code, text = run(mw, req, res)
                assert.is_false(passed)
                assert.equal(403, code)
                assert.equal("Forbidden: missing or bad CSRF token\n", text)
                assert.equal(body, req:body())
            end
        end)

        it("refuses through the app's error page for 403 when it has one", function()
            local app = moonserve.app()
            app:use(moonserve.sessions { secret = SECRET })
            app:use(moonserve.csrf { secret = SECRET })
            app:post("/api/notes", function(_, res) res:send("stored") end)
            local status, _, body = helper.simulate(app, "POST", "/api/notes",
                { headers = { ["content-type"] = "application/json" }, body = "{}" })
            assert.equal(403, status)
            assert.equal("Forbidden: missing or bad CSRF token\n", body) -- (no page: text)
            app:error_page(403, function(_, res, info)
                res:error_json(403, info.reason)
            end)
            local headers
            status, headers, body = helper.simulate(app, "POST", "/api/notes",
                { headers = { ["content-type"] = "application/json" }, body = "{}" })
            assert.equal(403, status)
            assert.equal("application/json", headers["content-type"])
            assert.same({ error = { status = 403, message = "missing or bad CSRF token" } },
                require("cjson").decode(body))
        end)

        it("checks a multipart token through the real dispatch, with sessions", function()
            local app = moonserve.app()
            app:use(moonserve.sessions { secret = SECRET })
            app:use(moonserve.csrf { secret = SECRET })
            app:get("/form", function(_, res) res:send(res.csrf_token()) end)
            app:post("/up", function(req, res)
                local out = {}
                for part in assert(req:parts()) do
                    out[#out + 1] = part.name .. ":" .. #part:body()
                end
                res:send(table.concat(out, " "))
            end)
            local _, gh, token = helper.simulate(app, "GET", "/form")
            local cookie = gh["set-cookie"]:match("^([^;]+)")
            local headers = { cookie = cookie, ["content-type"] = CT }
            local file = string.rep("z", 20000)
            for _, parts in ipairs {
                { { "_csrf", token }, { "upload", file, "z.bin" } },
                { { "upload", file, "z.bin" }, { "_csrf", token } },
            } do
                local status, _, out = helper.simulate(app, "POST", "/up",
                    { headers = headers, body = multipart_body(parts) })
                assert.equal(200, status, out)
                assert.equal(parts[1][1] .. ":" .. #parts[1][2] .. " " .. parts[2][1] .. ":"
                    .. #parts[2][2], out)
            end
            local status = helper.simulate(app, "POST", "/up", { headers = headers,
                body = multipart_body { { "upload", file, "z.bin" } } })
            assert.equal(403, status)
        end)
    end)
end)
