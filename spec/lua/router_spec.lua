describe("moonserve.router", function()
    local router = require "moonserve.router"

    it("prefers a literal route over a :param route", function()
        local r = router.new()
        r:add("GET", "/users/:id", "param")
        r:add("GET", "/users/me", "literal")
        assert.equal("literal", (r:match("GET", "/users/me")))
        assert.equal("param", (r:match("GET", "/users/42")))
    end)

    it("prefers a :param route over a splat, whatever the order", function()
        local r = router.new()
        r:add("GET", "/files/*", "splat")
        r:add("GET", "/files/:name", "param")
        assert.equal("param", (r:match("GET", "/files/a")))
        local h, params = r:match("GET", "/files/a/b%20c")
        assert.equal("splat", h)
        assert.equal("a/b c", params.splat)
    end)

    it("decodes captures", function()
        local r = router.new()
        r:add("GET", "/users/:id/posts/:post", "h")
        local _, params = r:match("GET", "/users/J%C3%B6rg/posts/7")
        assert.same({ id = "Jörg", post = "7" }, params)
    end)

    it("does not match an empty segment for a :param", function()
        local r = router.new()
        r:add("GET", "/users/:id", "h")
        assert.is_nil((r:match("GET", "/users/")))
    end)

    it("lets the first of two equal routes win", function()
        local r = router.new()
        r:add("GET", "/a/:x", "first")
        r:add("GET", "/a/:y", "second")
        assert.equal("first", (r:match("GET", "/a/1")))
    end)

    it("answers HEAD with the GET route", function()
        local r = router.new()
        r:add("GET", "/x", "get")
        assert.equal("get", (r:match("HEAD", "/x")))
    end)

    it("names the allowed methods when only the method is wrong", function()
        local r = router.new()
        r:add("GET", "/x", "get")
        r:add("POST", "/x", "post")
        r:add("DELETE", "/y/:id", "del")
        local h, _, allow = r:match("PUT", "/x")
        assert.is_nil(h)
        assert.equal("GET, HEAD, POST", allow) -- HEAD comes with GET
        assert.equal("DELETE", select(3, r:match("GET", "/y/3")))
        assert.is_nil(select(3, r:match("GET", "/nothing")))
    end)

    it("refuses a path that does not start with a slash", function()
        assert.has_error(function() router.new():add("GET", "x", "h") end)
    end)
end)

describe("moonserve.router, as a trie", function()
    local router = require "moonserve.router"

    it("backtracks: a literal that leads nowhere gives way to a :param", function()
        local r = router.new()
        r:add("GET", "/a/b/c", "literal")
        r:add("GET", "/a/:x/d", "param")
        assert.equal("param", (r:match("GET", "/a/b/d")))
        assert.equal("literal", (r:match("GET", "/a/b/c")))
    end)

    it("prefers a route for the method over a more literal one for another method", function()
        local r = router.new()
        r:add("GET", "/users/me", "me")
        r:add("POST", "/users/:id", "post")
        local h, params = r:match("POST", "/users/me")
        assert.equal("post", h)
        assert.equal("me", params.id)
    end)

    it("finds every one of 10,000 routes, and nothing else", function()
        local r = router.new()
        for i = 1, 5000 do
            r:add("GET", "/items/" .. i, i)
            r:add("GET", "/users/:id/things/" .. i, -i)
        end
        for i = 1, 5000, 97 do
            assert.equal(i, (r:match("GET", "/items/" .. i)))
            local h, params = r:match("GET", "/users/u" .. i .. "/things/" .. i)
            assert.equal(-i, h)
            assert.equal("u" .. i, params.id)
        end
        assert.is_nil((r:match("GET", "/items/5001")))
        assert.is_nil((r:match("GET", "/users/x/things/0")))
    end)

    it("builds URLs for named routes, escaping what it fills in", function()
        local r = router.new()
        r:add("GET", "/users/:id/posts/:post", "h", "post")
        r:add("GET", "/files/*", "f", "file")
        assert.equal("/users/J%C3%B6rg/posts/7", r:url_for("post", { id = "Jörg", post = 7 }))
        assert.equal("/files/a/b%20c", r:url_for("file", { splat = "a/b c" }))
        assert.has_error(function() r:url_for("post", { id = 1 }) end)
        assert.has_error(function() r:url_for("nope") end)
        assert.has_error(function() r:add("GET", "/x", "h", "post") end) -- name taken
    end)

    it("gives each lookup its own params, and sees routes added after a miss", function()
        local r = router.new()
        r:add("GET", "/u/:id", "u")
        local _, p1 = r:match("GET", "/u/1")
        p1.id = "changed"
        local _, p2 = r:match("GET", "/u/1")
        assert.equal("1", p2.id)
        assert.is_nil((r:match("GET", "/v/1")))
        assert.is_nil(select(3, r:match("GET", "/v/1")))
        r:add("GET", "/v/:id", "v")
        assert.equal("v", (r:match("GET", "/v/1")))
        for i = 1, 5000 do -- more paths than the cache holds: still right
            local h, p = r:match("GET", "/u/" .. i)
            assert(h == "u" and p.id == tostring(i))
        end
    end)

    it("matches no route for a path that does not start with a slash", function()
        local r = router.new()
        r:add("GET", "/admin/secret", "literal")
        r:add("GET", "/admin/:id", "param")
        r:add("GET", "/files/*", "splat")
        r:add("GET", "/", "root")
        for _, path in ipairs { "Xadmin/secret", "Xadmin/7", "Xfiles/a", "X", "*", "" } do
            local value, params, allow = r:match("GET", path)
            assert.is_nil(value, path)
            assert.is_nil(params, path)
            assert.is_nil(allow, path)
        end
        assert.equal("literal", (r:match("GET", "/admin/secret")))
    end)

    it("refuses a * that is not last and a : without a name", function()
        assert.has_error(function() router.new():add("GET", "/a/*/b", "h") end)
        assert.has_error(function() router.new():add("GET", "/a/:", "h") end)
    end)
end)
