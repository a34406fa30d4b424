describe("moonserve.canon", function()
    local canon = require "moonserve.canon"

    local cases = {
        -- path, trailing policy, canonical form
        { "/", "strip", "/" },
        { "/a/b", "strip", "/a/b" },
        { "/a/b/", "strip", "/a/b" },
        { "/a//b", "strip", "/a/b" },
        { "//a///b//", "strip", "/a/b" },
        { "/a/./b", "strip", "/a/b" },
        { "/a/b/..", "strip", "/a" },
        { "/a/../../b", "strip", "/b" },
        { "/../../etc/passwd", "strip", "/etc/passwd" },
        { "/%7Euser/%61bc", "strip", "/~user/abc" },
        { "/a%2fb", "strip", "/a%2Fb" },
        { "/a%20b", "strip", "/a%20b" },
        { "/.well-known/x", "strip", "/.well-known/x" },
        { "/a/b", "add", "/a/b/" },
        { "/a/b.css", "add", "/a/b.css" },
        { "/a/b/", "keep", "/a/b/" },
        { "/a/b", "keep", "/a/b" },
        -- bytes a path may not hold: a browser reads "/\\evil.test" as "//evil.test"
        { "/\\evil.test/", "strip", "/%5Cevil.test" },
        { "//\\evil.test", "strip", "/%5Cevil.test" },
        { "/\\/evil.test", "strip", "/%5C/evil.test" },
        { '/a"b<c>d^e`f{g|h}', "strip", "/a%22b%3Cc%3Ed%5Ee%60f%7Bg%7Ch%7D" },
        { "/a b\\1", "strip", "/a%20b%5C1" },
        { "/%5c", "strip", "/%5C" },
        { "/!$&'()*+,;=:@x", "strip", "/!$&'()*+,;=:@x" },
    }
    for _, c in ipairs(cases) do
        it(("turns %s into %s (trailing slash: %s)"):format(c[1], c[3], c[2]), function()
            assert.equal(c[3], canon.path(c[1], c[2]))
            assert.equal(c[3], canon.path(c[3], c[2])) -- and the result is a fixed point
        end)
    end

    it("returns a canonical path itself, so a comparison is enough", function()
        local p = "/users/42"
        assert.is_true(rawequal(p, canon.path(p, "strip")))
    end)
end)
