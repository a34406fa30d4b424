-- spec/it/ngx_capture_spec.lua: what a client sends reaches a subrequest as data, never as
-- request syntax (spec/fixtures/ngx_capture.lua), over a real socket: args built from a
-- decoded query argument, and fields set from one with ngx.req.set_header.
local helper = require "helper"

describe("ngx.location.capture with what a client sent", function()
    local srv

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/ngx_capture.lua" }
    end)

    teardown(function()
        if srv then srv:stop() end
    end)

    local function get(target)
        local res = assert(helper.request(srv.port, "GET " .. target
            .. " HTTP/1.1\r\nHost: t\r\n\r\n"))
        assert.equal(200, res.status, res.body)
        return res.body
    end

    -- How many requests reached the backend and /admin/delete.
    local function hits()
        local backend, admin = get("/hits"):match("^(%d+) (%d+)$")
        return tonumber(backend), tonumber(admin)
    end

    it("raises on a control byte in string args (CR, LF): no field is added to the "
        .. "subrequest", function()
        local before = hits()
        -- q = "x HTTP/1.1\r\nX-Role: admin\r\nY: z"
        local body = get("/front/args?q=x%20HTTP%2F1.1%0D%0AX-Role:%20admin%0D%0AY:%20z")
        assert.equal("raised: unsafe byte \"0x0d\" in args: a request line cannot hold it "
            .. "(escape it with ngx.escape_uri, or give args as a table)\n", body)
        assert.falsy(body:find("role=admin", 1, true))
        assert.equal(before, (hits()))
    end)

    it("raises on a second request smuggled in string args: it never runs", function()
        local before_backend, before_admin = hits()
        -- q = "x HTTP/1.1\r\nHost: a\r\n\r\nGET /admin/delete HTTP/1.1\r\nY: z"
        local body = get("/front/args?q=x%20HTTP/1.1%0D%0AHost:%20a%0D%0A%0D%0AGET%20"
            .. "/admin/delete%20HTTP/1.1%0D%0AY:%20z")
        assert.equal("raised: unsafe byte \"0x0d\" in args: a request line cannot hold it "
            .. "(escape it with ngx.escape_uri, or give args as a table)\n", body)
        local backend, admin = hits()
        assert.equal(before_admin, admin)
        assert.equal(before_backend, backend)
        -- the same bytes in table args are encoded: data for the one subrequest
        assert.equal("200 role=nil q=x HTTP/1.1\r\nHost: a\r\n\r\nGET /admin/delete "
            .. "HTTP/1.1\r\nY: z x-query=nil\n\n", get("/front/table?q=x%20HTTP/1.1%0D%0AHost:"
            .. "%20a%0D%0A%0D%0AGET%20/admin/delete%20HTTP/1.1%0D%0AY:%20z"))
        assert.equal(before_admin, select(2, hits()))
    end)

    it("escapes CR and LF in a value set with ngx.req.set_header, as lua-nginx-module does",
        function()
            local before_backend, before_admin = hits()
            -- q = "v\r\nX-Role: admin"; then one that ends the head and starts a request
            assert.equal("200 role=nil q=nil x-query=v%0D%0AX-Role: admin\n\n",
                get("/front/field?q=v%0D%0AX-Role:%20admin"))
            assert.equal("200 role=nil q=nil x-query=v%0D%0A%0D%0AGET /admin/delete "
                .. "HTTP/1.1%0D%0AX-Role: admin\n\n", get("/front/field?q=v%0D%0A%0D%0AGET%20"
                .. "/admin/delete%20HTTP/1.1%0D%0AX-Role:%20admin"))
            local backend, admin = hits()
            assert.equal(before_admin, admin)
            assert.equal(before_backend + 2, backend)
        end)

    it("escapes a name set with ngx.req.set_header that is not a token", function()
        -- q = "X-A: 1\r\nX-Role" (the value is "1")
        assert.equal("200 role=nil q=nil x-query=nil\n\n",
            get("/front/name?q=X-A:%201%0D%0AX-Role"))
        assert.equal(0, select(2, hits()))
    end)

    it("raises on a control byte in a URI: the subrequest never runs", function()
        local before = hits()
        assert.equal("raised: bad argument #1 to 'capture' (a URI that starts with / and has "
            .. "no control characters expected)\n",
            get("/front/uri?q=a%0D%0AX-Role:%20admin"))
        assert.equal(before, (hits()))
    end)

    it("sends a space and bytes from 0x80 in a URI or string args as data, as nginx takes "
        .. "them", function()
        local before = hits()
        assert.equal("200 role=nil q=caf\195\169 x y x-query=nil\n\n",
            get("/front/args?q=caf%C3%A9%20x%20y"))
        assert.equal("200 role=nil q=nil x-query=nil\n\n", get("/front/uri?q=caf%C3%A9%20x"))
        assert.equal(before + 2, (hits()))
    end)
end)
