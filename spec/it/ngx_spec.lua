-- spec/it/ngx_spec.lua: OpenResty-style handlers (spec/fixtures/ngx.lua) on a real server, with
-- the real lua-resty drivers from Debian against a real Redis and memcached this spec starts.
local helper = require "helper"
local cjson = require "cjson"

local free_port, start, stop, wait_port = helper.free_port, helper.background, helper.stop_pid,
    helper.wait_port

local redis_cmd = helper.redis_cmd

describe("the ngx layer on a real server", function()
    local srv, redis_pid, mc_pid, rport, mport

    setup(function()
        for _, driver in ipairs { "nginx.redis", "nginx.memcached", "resty.lrucache" } do
            helper.tool(driver) -- fails naming the Debian package when it is missing
        end
        rport, mport = free_port(), free_port()
        redis_pid = start(string.format("%s --port %d --bind 127.0.0.1 --save '' "
            .. "--appendonly no --daemonize no", helper.tool("redis-server"), rport))
        mc_pid = start(string.format("%s -p %d -l 127.0.0.1 -U 0 -u root",
            helper.tool("memcached"), mport))
        wait_port(rport)
        wait_port(mport)
        srv = helper.spawn_server { app = "spec/fixtures/ngx.lua",
            env = { REDIS_PORT = rport, MEMCACHED_PORT = mport } }
    end)

    teardown(function()
        if srv then srv:stop() end
        stop(redis_pid)
        stop(mc_pid)
    end)

    local twice = helper.twice(it)

    local function request(path, head_extra, body)
        local raw = "GET " .. path .. " HTTP/1.1\r\nHost: Example.ORG:8080\r\n" .. (head_extra or "")
        if body then
            raw = raw:gsub("^GET", "POST") .. "Content-Length: " .. #body .. "\r\n\r\n" .. body
        else
            raw = raw .. "\r\n"
        end
        return assert(helper.request(srv.port, raw))
    end

    local function get(path, extra, body)
        local res = request(path, extra, body)
        return res.body, res.status, res
    end

    describe("output", function()
        twice("prints as OpenResty: numbers, booleans, nil, ngx.null, nested tables; say "
            .. "returns 1, bad arguments raise with its messages, eof ends the reply", function()
            local body, status = get("/say")
            assert.equal(200, status)
            assert.equal("a1 2.5 true false nil null\ntn3\n1 1 1 false bad argument #1 to 'say' "
                .. "(string, number, boolean, nil, ngx.null, or array table expected, but got "
                .. "function)\nfalse bad argument #1 to 'print' (non-array table found)\n", body)
        end)

        twice("ngx.header reads and writes fields: multi-values, '_' for '-', any case, "
            .. "replaced and cleared; refused once the head is out", function()
            local body, status, res = get("/header")
            assert.equal(201, status)
            assert.equal("table one,two s nil false false\n201 nil true\n", body)
            local h = res.headers
            assert.equal("text/x-spec", h["content-type"])
            assert.equal("s", h["x-single"])
            assert.equal("42", h["x-num"])
            assert.equal("second", h["x-replaced"])
            assert.is_nil(h["x-gone"])
            assert.is_nil(h["x-late"])
            local multi = 0
            for _ in res.raw_head:gmatch("\r\n[Xx]%-[Mm]ulti: ") do
                multi = multi + 1
            end
            assert.equal(2, multi)
        end)

        twice("ngx.say after res:write appends to the same stream, and the other way round",
            function()
            assert.equal("w1 s1\nw2 p2", (get("/mix")))
            local body, _, res = get("/mix2")
            assert.equal("p1 w1 s2\n", body)
            assert.equal("yes", res.headers["x-from-ngx"])
        end)

        it("refuses a handler that prints and then returns values", function()
            local body, status = get("/returns")
            assert.equal(500, status)
            assert.not_matches("and returned", body)
            assert.matches("returned values after printing", srv:log())
        end)

        twice("flushes: the reply streams from there on", function()
            local body, status, res = get("/flush")
            assert.equal(200, status)
            assert.equal("ab 1 1\n", body)
            assert.equal("chunked", res.headers["transfer-encoding"])
        end)

        twice("streams a large output", function()
            local body = get("/big")
            assert.equal(100001, #body)
        end)
    end)

    describe("ending the handler", function()
        twice("ngx.exit after output ends the handler and keeps the reply as it is", function()
            local body, status = get("/exit/page")
            assert.equal(200, status)
            assert.equal("dropped", body)
        end)

        twice("ngx.exit(403) inside pcall inside a user coroutine ends the handler with the "
            .. "status's page and ngx.header's fields", function()
            local body, status, res = get("/exit/status")
            assert.equal(403, status)
            assert.equal("403 Forbidden\n", body)
            assert.equal("k", res.headers["x-kept"])
        end)

        twice("ngx.exit(ngx.OK) ends the handler with what was printed", function()
            assert.equal("before\n", (get("/exit/ok")))
        end)

        twice("ngx.exit(201) before output sends that status", function()
            local _, status = get("/exit/created")
            assert.equal(201, status)
        end)

        twice("ngx.redirect sends the status and Location and ends the handler", function()
            local body, status, res = get("/redirect")
            assert.equal(301, status)
            assert.equal("/elsewhere?x=1", res.headers.location)
            assert.not_matches("not reached", body)
        end)
    end)

    describe("the request", function()
        twice("get_headers: lowercase names with OpenResty's normalising look-up, raw names, "
            .. "repeats as a list, max and truncated", function()
            local body = get("/get_headers", "User-Agent: spec-ua\r\nX-Mixed-Case: m\r\n"
                .. "X-Multi: 1\r\nX-Multi: 2\r\n")
            local t = cjson.decode(body)
            assert.equal("spec-ua", t.ua)
            assert.equal("spec-ua", t.ua2)
            assert.same({ "1", "2" }, t.multi)
            assert.equal("m", t.raw_case)
            assert.is_false(t.raw_lower)
            assert.equal("truncated", t.truncated)
            assert.equal(2, t.few)
        end)

        twice("ngx.var: nginx's variables as strings, and the handler's own", function()
            local body = get("/var?a=1%202&b", "X-Test: xt\r\nCookie: c1=v1; c2=v%202\r\n"
                .. "Content-Type: text/plain\r\n", "body")
            local t = cjson.decode(body)
            assert.equal("example.org", t.host)
            assert.equal("/var", t.uri)
            assert.equal("/var?a=1%202&b", t.request_uri)
            assert.equal("a=1%202&b", t.args)
            assert.equal("1%202", t.arg_a)
            assert.is_false(t.arg_missing)
            assert.equal("xt", t.http_x_test)
            assert.equal("v1", t.cookie_c1)
            assert.equal("v%202", t.cookie_c2)
            assert.equal("127.0.0.1", t.remote_addr)
            assert.matches("^%d+$", t.remote_port)
            assert.equal(tostring(srv.port), t.server_port)
            assert.equal("http", t.scheme)
            assert.equal("POST", t.request_method)
            assert.equal("text/plain", t.content_type)
            assert.equal("4", t.content_length)
            assert.matches("^%x+$", t.request_id)
            assert.matches("^%d+%.%d%d%d$", t.request_time)
            assert.equal("mine", t.my_var)
            assert.equal("7", t.num_var)
            assert.matches('variable "uri" not changeable', t.uri_write)
            assert.equal("HTTP/1.1", t.server_protocol)
            assert.equal("?", t.is_args)
        end)

        twice("ngx.req: method, version, arguments, the body, and the handler's changes",
            function()
            local body = get("/req?a=1&flag", "Content-Type: application/x-www-form-urlencoded\r\n"
                .. "X-Remove: r\r\n", "p=q%20r")
            local t = cjson.decode(body)
            assert.equal("POST", t.method)
            assert.equal(1.1, t.version)
            assert.equal("1", t.a)
            assert.is_true(t.flag)
            assert.equal("q r", t.post_p)
            assert.equal("p=q%20r", t.body)
            assert.is_false(t.file)
            assert.equal("yes", t.added)
            assert.is_false(t.removed)
            assert.equal("yes", t.var_added)
            assert.equal("z=1", t.args_now)
            assert.equal("/changed", t.uri_now)
            assert.is_true(t.start)
            assert.equal("POST /req?a=1&flag HTTP/1.1", t.raw)
        end)
    end)

    twice("ngx.ctx is the request's in its coroutines and light threads; a timer has its own, "
        .. "phase timer, and no output API", function()
        assert.equal("handler|coroutine content|v|thread GET|true done|timer true false "
            .. "API disabled in the context of ngx.timer|content\n", (get("/ctx?k=v")))
    end)

    describe("lua-resty-redis (Debian's lua-nginx-redis, unchanged)", function()
        twice("gets and sets, and reuses its pooled connection", function()
            local body = get("/redis/basic")
            local reused = tonumber(body:match("(%d+)\n$"))
            assert.matches("^v1 true number %d+\n$", body)
            body = get("/redis/basic")
            assert.is_true(tonumber(body:match("(%d+)\n$")) > reused)
        end)

        twice("runs a pipeline", function()
            assert.equal("6 OK OK a a,b,true 1\n", (get("/redis/pipeline")))
        end)

        twice("runs a transaction: multi, queued commands, exec with a failed one", function()
            assert.equal("QUEUED OK tx table true WRONGTYPE\n", (get("/redis/multi")))
        end)

        twice("subscribes and reads what another connection publishes", function()
            assert.equal("subscribe ngx:ch 1|message ngx:ch hello|world|nil timeout\n",
                (get("/redis/pubsub")))
        end)

        it("keeps Redis at the pool's size under wrk load, reusing connections", function()
            redis_cmd(rport, "SET ngx:load hot")
            local before = tonumber(redis_cmd(rport, "INFO stats")
                :match("total_connections_received:(%d+)"))
            local url = string.format("http://127.0.0.1:%d/redis/load", srv.port)
            local out = os.tmpname()
            local code = os.execute(string.format("%s -t2 -c8 -d2s %s >%s 2>&1",
                helper.tool("wrk"), url, out))
            local text = helper.read_file(out)
            os.remove(out)
            assert.is_true(code == 0 or code == true, text)
            local reqs = tonumber(text:match("(%d+) requests in"))
            assert.is_true(reqs > 500, text)
            assert.not_matches("Non%-2xx", text)
            local after = tonumber(redis_cmd(rport, "INFO stats")
                :match("total_connections_received:(%d+)"))
            -- at most one connection a concurrent request, plus the spec's own INFOs
            assert.is_true(after - before <= 8 + 2, (after - before) .. " connections for "
                .. reqs .. " requests")
            local idle = 0
            for _ in redis_cmd(rport, "CLIENT LIST"):gmatch("cmd=get") do
                idle = idle + 1
            end
            assert.is_true(idle >= 1 and idle <= 8, idle .. " pooled connections")
            local body = get("/redis/load")
            assert.matches("^hot %d+\n$", body)
            assert.is_true(tonumber(body:match("(%d+)")) > 0)
        end)
    end)

    twice("lua-resty-memcached (Debian's lua-nginx-memcached): set, get with flags, incr, "
        .. "a missing key, delete", function()
        assert.equal("value 1 7 1 15 nil nil nil\n", (get("/memcached")))
    end)

    twice("lua-resty-lrucache: eviction of the least recently used, expiry and stale values",
        function()
        assert.equal("nil 2 nil 2 3\n", (get("/lru")))
    end)
end)
