describe("moonserve.security", function()
    local security = require "moonserve.security"

    describe("split_host", function()
        -- The same cases as the core's static mounts (spec/core/http/static/static_test.c, host_is).
        local cases = {
            { "example.com:80", "example.com", "80" },
            { "Example.COM", "example.com", nil },
            { "example.com:", "example.com", nil },
            { "example.com:0080", "example.com", "80" },
            { "[::1]:8080", "[::1]", "8080" },
            { "[::1]", "[::1]", nil },
            { "[2001:DB8::1]:443", "[2001:db8::1]", "443" },
            { "example.com:http", "example.com", ":http" },
            { "[::1]x", "[::1]", "x" },
            { "[::1", "[::1", nil },
        }
        for _, c in ipairs(cases) do
            it(("splits %s into %s and %s"):format(c[1], c[2], tostring(c[3])), function()
                local host, port = security.split_host(c[1])
                assert.equal(c[2], host)
                assert.equal(c[3], port)
            end)
        end
    end)

    describe("origin_ok", function()
        local DEFAULT = security.compile(nil).csrf
        local function ok(f, opts)
            local pass, why = security.origin_ok(f, opts or DEFAULT)
            assert.is_nil(why)
            return pass
        end
        local function refused(f, opts)
            local pass, why = security.origin_ok(f, opts or DEFAULT)
            assert.is_string(why)
            return pass == false
        end
        local H = "example.org"

        it("lets through what has neither Sec-Fetch-Site nor Origin (curl, other servers)", function()
            assert.is_true(ok { host = H })
            assert.is_true(ok {})
        end)

        it("lets through same-origin and user-initiated requests", function()
            assert.is_true(ok { host = H, fetch_site = "same-origin" })
            assert.is_true(ok { host = H, fetch_site = "none" })
            assert.is_true(ok { host = H, fetch_site = "Same-Origin", origin = "http://example.org" })
        end)

        it("refuses cross-site, and same-site unless the app allows it", function()
            assert.is_true(refused { host = H, fetch_site = "cross-site" })
            assert.is_true(refused { host = H, fetch_site = "same-site" })
            assert.is_true(refused { host = H, fetch_site = "whatever" })
            local same_site = security.compile({ csrf = { same_site = true } }).csrf
            assert.is_true(ok({ host = H, fetch_site = "same-site",
                origin = "https://blog.example.org" }, same_site))
            assert.is_true(refused({ host = H, fetch_site = "cross-site" }, same_site))
            assert.is_true(refused({ host = H, fetch_site = "same-site", origin = "null" },
                same_site))
        end)

        it("refuses an Origin whose host or port is not the Host's", function()
            assert.is_true(ok { host = H, origin = "http://example.org" })
            assert.is_true(ok { host = "Example.ORG:8080", origin = "http://example.org:8080" })
            assert.is_true(ok { host = "[::1]:8080", origin = "http://[::1]:8080" })
            assert.is_true(ok { host = "example.org:80", origin = "http://example.org" })
            assert.is_true(refused { host = H, origin = "http://evil.test" })
            assert.is_true(refused { host = H, origin = "http://example.org.evil.test" })
            assert.is_true(refused { host = H, origin = "http://example.org:8080" })
            assert.is_true(refused { host = "example.org:8080", origin = "http://example.org" })
            assert.is_true(refused { host = "[::1]:8080", origin = "http://[::1]:8081" })
            assert.is_true(refused { host = H, origin = "http://evil.test",
                fetch_site = "same-origin" })
        end)

        it("refuses the null Origin, and Origins that are not origins", function()
            assert.is_true(refused { host = H, origin = "null" })
            assert.is_true(refused { host = H, origin = "example.org" })
            assert.is_true(refused { host = H, origin = "http://user@example.org" })
            assert.is_true(refused { host = H, origin = "http://example.org/path" })
            assert.is_true(refused { host = H, origin = "ftp://example.org" })
            assert.is_true(refused { origin = "http://example.org" })
        end)

        it("compares the scheme only when it is known", function()
            -- unknown: either scheme's default port stands for a Host without one
            assert.is_true(ok { host = H, origin = "https://example.org" })
            assert.is_true(ok { host = H, origin = "https://example.org:443" })
            assert.is_true(ok { host = "example.org:443", origin = "https://example.org" })
            assert.is_true(refused { host = "example.org:443", origin = "http://example.org" })
            -- known
            assert.is_true(ok { host = H, origin = "https://example.org", scheme = "https" })
            assert.is_true(refused { host = H, origin = "http://example.org", scheme = "https" })
            assert.is_true(refused { host = H, origin = "https://example.org", scheme = "http" })
            assert.is_true(refused { host = "example.org:443", origin = "http://example.org:443",
                scheme = "https" })
        end)

        it("lets in the origins the app allows, even when the browser calls them cross-site", function()
            local opts = security.compile({ csrf = { origins = { "https://APP.example.net/",
                "http://localhost:3000" } } }).csrf
            assert.is_true(ok({ host = H, origin = "https://app.example.net",
                fetch_site = "cross-site" }, opts))
            assert.is_true(ok({ host = H, origin = "https://app.example.net:443" }, opts))
            assert.is_true(ok({ host = H, origin = "http://localhost:3000" }, opts))
            assert.is_true(refused({ host = H, origin = "http://app.example.net" }, opts))
            assert.is_true(refused({ host = H, origin = "http://localhost:3001" }, opts))
            assert.is_true(refused({ host = H, fetch_site = "cross-site" }, opts))
        end)

        it("says why it refused", function()
            local _, why = security.origin_ok({ host = H, origin = "http://evil.test" }, DEFAULT)
            assert.equal("Origin: http://evil.test (Host: example.org)", why)
            _, why = security.origin_ok({ host = H, fetch_site = "cross-site" }, DEFAULT)
            assert.equal("Sec-Fetch-Site: cross-site", why)
        end)
    end)

    describe("compile", function()
        it("keeps the origin check on by default and with the headers off", function()
            assert.is_table(security.compile(nil).csrf)
            assert.is_table(security.compile(false).csrf)
            assert.is_table(security.compile({ csp = "default-src 'self'" }).csrf)
            assert.is_false(security.compile({ csrf = false }).csrf)
        end)

        it("raises on a bad csrf option", function()
            assert.has_error(function() security.compile({ csrf = "off" }) end)
            assert.has_error(function() security.compile({ csrf = { origin = {} } }) end)
            assert.has_error(function() security.compile({ csrf = { origins = "x" } }) end)
            assert.has_error(function() security.compile({ csrf = { origins = { "app.test" } } }) end)
            assert.has_error(function() security.compile({ csrf = { origins = { "null" } } }) end)
        end)
    end)
end)
