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
end)
