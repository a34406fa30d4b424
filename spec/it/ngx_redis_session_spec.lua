-- spec/it/ngx_redis_session_spec.lua: an OpenResty app that keeps its own sessions in Redis
-- (spec/fixtures/ngx_redis_session_cases.lua: lua-resty-redis, ngx.var.cookie_*, ngx.header,
-- ngx.var.arg_*) works unchanged through moonserve's ngx layer, and says the same as on nginx
-- with the lua module: login, the session on the next request, rotation at a second login
-- (the old id dead), and "log out everywhere".
local helper = require "spec.helper"

describe("OpenResty sessions kept in Redis by hand, on moonserve and on nginx", function()
    local srv, nginx, redis_pid, redis_port

    setup(function()
        helper.tool("nginx.redis")
        redis_pid, redis_port = helper.redis_server()
        srv = helper.spawn_server { app = "spec/fixtures/ngx_diff.lua",
            env = { NGX_CASES = "ngx_redis_session_cases" } }
        nginx = helper.nginx_lua [[
    server {
        listen 127.0.0.1:%d;
        location / {
            content_by_lua_block { require("ngx_redis_session_cases")[ngx.var.uri:sub(2)]() }
        }
    }]]
    end)

    teardown(function()
        if srv then srv:stop() end
        if nginx then nginx.stop() end
        helper.stop_pid(redis_pid)
    end)

    local function call(port, method, name, query, sid)
        local raw = method .. " /" .. name .. "?redis=" .. redis_port .. (query or "")
            .. " HTTP/1.1\r\nHost: s.test\r\nContent-Length: 0\r\n"
            .. (sid and ("Cookie: theme=dark; sid=" .. sid .. "\r\n") or "") .. "\r\n"
        local r = assert(helper.request(port, raw))
        r.sid = (r.headers["set-cookie"] or ""):match("^sid=(%x*);")
        return r
    end

    -- The same story on one server: the bodies and statuses it answered, in order.
    local function story(port)
        local out = {}
        local function note(r)
            out[#out + 1] = r.status .. " " .. r.body
        end
        local a = call(port, "POST", "login", "&user=ada")
        note(a)
        assert.matches("^%x+$", a.sid)
        assert.matches("Max%-Age=30", a.headers["set-cookie"])
        assert.matches("HttpOnly", a.headers["set-cookie"])
        note(call(port, "GET", "whoami", nil, a.sid))
        -- A second login from the same browser rotates the id: the old one is dead at once.
        local b = call(port, "POST", "login", "&user=ada", a.sid)
        note(b)
        assert.not_equal(a.sid, b.sid)
        note(call(port, "GET", "whoami", nil, a.sid))
        note(call(port, "GET", "whoami", nil, b.sid))
        -- Another browser, then "log out everywhere" from the first.
        local c = call(port, "POST", "login", "&user=ada")
        note(call(port, "GET", "whoami", nil, c.sid))
        local out_all = call(port, "POST", "logout_all", nil, b.sid)
        note(out_all)
        assert.equal("sid=; Path=/; Max-Age=0", out_all.headers["set-cookie"])
        note(call(port, "GET", "whoami", nil, b.sid))
        note(call(port, "GET", "whoami", nil, c.sid))
        note(call(port, "GET", "whoami"))
        return table.concat(out, "")
    end

    it("logs in, reads, rotates and revokes the same way on both servers", function()
        local want = table.concat {
            "200 logged in ada new\n", "200 ada ttl ok\n", "200 logged in ada rotated\n",
            "401 nobody\n", "200 ada ttl ok\n", "200 ada ttl ok\n", "200 ended 2\n",
            "401 nobody\n", "401 nobody\n", "401 nobody\n" }
        assert.equal(want, story(srv.port), srv:log():sub(-800))
        assert.equal(want, story(nginx.port))
    end)

    it("answers 503 from both when Redis is not there", function()
        local closed = helper.free_port()
        for _, port in ipairs { srv.port, nginx.port } do
            local r = assert(helper.request(port, "GET /whoami?redis=" .. closed
                .. " HTTP/1.1\r\nHost: s.test\r\nCookie: sid=ab\r\n\r\n"))
            assert.equal(503, r.status)
            assert.equal("redis: connection refused\n", r.body)
        end
    end)
end)
