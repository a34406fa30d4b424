describe("moonserve.codec", function()
    local codec = require "moonserve.codec"

    it("decodes percent escapes and plus signs in forms", function()
        assert.equal("a b/c", codec.unescape("a+b%2Fc", true))
        assert.equal("a+b/c", codec.unescape("a+b%2fc"))
        assert.equal("%zz", codec.unescape("%zz"))
    end)

    it("parses a form, keeping repeated keys as lists", function()
        local t = codec.parse_form("a=1&b=two+words&a=3&flag&=empty&&c=%26")
        assert.same({ "1", "3" }, t.a)
        assert.equal("two words", t.b)
        assert.equal("", t.flag)
        assert.equal("empty", t[""])
        assert.equal("&", t.c)
    end)

    it("stops reading a form after max pairs", function()
        local t = codec.parse_form("a=1&b=2&c=3", 2)
        assert.equal("1", t.a)
        assert.equal("2", t.b)
        assert.is_nil(t.c)
    end)

    it("encodes a form that parses back to the same table", function()
        local t = { q = "a b&c", list = { "1", "2" } }
        assert.same(t, codec.parse_form(codec.encode_form(t)))
    end)

    it("escapes HTML", function()
        assert.equal("&lt;a href=&quot;x&quot;&gt;&amp;&#39;", codec.escape_html("<a href=\"x\">&'"))
    end)
end)
