describe("moonserve.cookie", function()
    local cookie = require "moonserve.cookie"

    describe("parse", function()
        it("parses name=value pairs split by semicolons", function()
            assert.same({ a = "1", b = "2", sid = "x.y-z" }, cookie.parse("a=1; b=2; sid=x.y-z"))
        end)

        it("tolerates whitespace around names, values and separators", function()
            assert.same({ a = "1", b = "2", c = "3" }, cookie.parse("  a = 1 ;b=2\t;\tc=3  ;"))
        end)

        it("unquotes a value in double quotes", function()
            assert.same({ a = "quoted", b = "", c = '"' }, cookie.parse('a="quoted"; b=""; c="'))
        end)

        it("keeps the first of several pairs with the same name", function()
            assert.same({ a = "first", b = "2" }, cookie.parse("a=first; b=2; a=second"))
        end)

        it("keeps everything after the first = in the value", function()
            assert.same({ t = "a=b==" }, cookie.parse("t=a=b=="))
        end)

        it("skips pairs without =, with an empty name or a name that is not a token", function()
            assert.same({ ok = "1", e = "" },
                cookie.parse("flag; =nameless; a b=1; (x)=2; ok=1; e=; ;;"))
        end)

        it("finds each pair's = in its own piece, after pieces without one", function()
            assert.same({ z = "3", w = "", v = "a=b" },
                cookie.parse("x; y ;\tz=\t 3 \t; w= \t ;u;v=a=b; q"))
        end)

        it("does not percent-decode values", function()
            assert.same({ a = "x%20y" }, cookie.parse("a=x%20y"))
        end)

        it("gives an empty table for nil or an empty field", function()
            assert.same({}, cookie.parse(nil))
            assert.same({}, cookie.parse(""))
        end)

        it("reads at most 100 pairs, or as many as asked", function()
            local pairs_ = {}
            for i = 1, 150 do
                pairs_[i] = "k" .. i .. "=" .. i
            end
            local t = cookie.parse(table.concat(pairs_, "; "))
            assert.equal("100", t.k100)
            assert.is_nil(t.k101)
            t = cookie.parse("a=1; b=2; c=3", 2)
            assert.same({ a = "1", b = "2" }, t)
        end)

        it("counts malformed pieces towards the limit too", function()
            assert.same({}, cookie.parse(string.rep("junk; ", 100) .. "a=1"))
        end)

        it("reads a field of many empty pieces in linear time", function()
            local t = cookie.parse(string.rep(";", 200000) .. "a=1")
            assert.same({ a = "1" }, t)
        end)

        it("raises on a field that is not a string", function()
            assert.has_error(function() cookie.parse(42) end)
        end)
    end)

    describe("serialize", function()
        it("builds name=value alone when there are no options", function()
            assert.equal("sid=abc", cookie.serialize("sid", "abc"))
            assert.equal("n=42", cookie.serialize("n", 42))
            assert.equal("empty=", cookie.serialize("empty", nil))
        end)

        it("adds every attribute in a fixed order", function()
            assert.equal("sid=abc; Path=/; Domain=example.org; Max-Age=3600; "
                .. "Expires=Sun, 06 Nov 1994 08:49:37 GMT; Secure; HttpOnly; SameSite=None; "
                .. "Partitioned",
                cookie.serialize("sid", "abc", { path = "/", domain = "example.org",
                    max_age = 3600, expires = 784111777, secure = true, http_only = true,
                    same_site = "none", partitioned = true }))
        end)

        it("writes Expires as an IMF-fixdate", function()
            assert.equal("a=; Expires=Thu, 01 Jan 1970 00:00:00 GMT",
                cookie.serialize("a", "", { expires = 0 }))
            assert.equal("Sat, 29 Feb 2020 23:59:59 GMT", cookie.http_date(1583020799))
        end)

        it("writes Max-Age=0, to delete a cookie", function()
            assert.equal("a=; Max-Age=0", cookie.serialize("a", "", { max_age = 0 }))
        end)

        it("spells SameSite the canonical way whatever the case given", function()
            for given, sent in pairs({ strict = "Strict", LAX = "Lax", None = "None" }) do
                assert.equal("a=1; Secure; SameSite=" .. sent,
                    cookie.serialize("a", "1", { same_site = given, secure = true }))
            end
        end)

        it("leaves out false flags", function()
            assert.equal("a=1", cookie.serialize("a", "1", { secure = false, http_only = false,
                partitioned = false }))
        end)

        it("accepts a value in double quotes", function()
            assert.equal('a="x"', cookie.serialize("a", '"x"'))
        end)

        it("serializes what parse reads back", function()
            local header = cookie.serialize("sid", "Zm9v.YmFy-_~!#$") -- Set-Cookie's first pair
            assert.same({ sid = "Zm9v.YmFy-_~!#$" }, cookie.parse(header))
        end)

        local misuse = {
            { "a name that is not a token", "a b", "1", nil },
            { "an empty name", "", "1", nil },
            { "a name that is not a string", 42, "1", nil },
            { "a value with a semicolon", "a", "x;y", nil },
            { "a value with a space", "a", "x y", nil },
            { "a value with a comma", "a", "x,y", nil },
            { "a value with a double quote inside", "a", 'x"y', nil },
            { "a value with a backslash", "a", "x\\y", nil },
            { "a value with a control character", "a", "x\ny", nil },
            { "a value with a non-ASCII byte", "a", "caf\195\169", nil },
            { "a value that is a table", "a", {}, nil },
            { "a path with a semicolon", "a", "1", { path = "/; Domain=evil" } },
            { "a domain with a newline", "a", "1", { domain = "example.org\r\nX: y" } },
            { "a max_age that is not an integer", "a", "1", { max_age = 1.5 } },
            { "a max_age that is a string", "a", "1", { max_age = "60" } },
            { "an expires that is a string", "a", "1", { expires = "tomorrow" } },
            { "an unknown same_site", "a", "1", { same_site = "sometimes" } },
            { "same_site None without secure", "a", "1", { same_site = "None" } },
            { "partitioned without secure", "a", "1", { partitioned = true } },
        }
        for _, case in ipairs(misuse) do
            it("raises on " .. case[1], function()
                assert.has_error(function() cookie.serialize(case[2], case[3], case[4]) end)
            end)
        end
    end)
end)
