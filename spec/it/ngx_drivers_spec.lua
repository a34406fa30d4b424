-- spec/it/ngx_drivers_spec.lua: Debian's lua-nginx-dns (resty.dns.resolver) and
-- lua-nginx-redis-connector, unchanged, on moonserve's ngx layer and on Debian's nginx with the
-- lua module, side by side (spec/fixtures/ngx_driver_cases.lua): the same handler must give
-- the same body on both. The peers are real: a DNS responder over UDP and TCP
-- (spec/fixtures/dns_responder.py), a Redis server, one that asks for a password, and a
-- Redis Sentinel watching the first.
local helper = require "helper"

local free_port, start, stop, wait_port = helper.free_port, helper.background, helper.stop_pid,
    helper.wait_port

describe("lua-resty-dns and lua-resty-redis-connector on moonserve and on nginx", function()
    local srv, nginx, pids, work, args = nil, nil, {}, nil, nil

    setup(function()
        helper.tool("nginx.dns.resolver")
        helper.tool("nginx.redis.connector")
        work = helper.sh(helper.tool("mktemp") .. " -d"):gsub("%s+$", "")
        local dns, redis, redis_auth, sentinel = free_port(), free_port(), free_port(), free_port()
        local redis_server = helper.tool("redis-server")
        pids[#pids + 1] = start(string.format("%s %s/spec/fixtures/dns_responder.py %d %s/dns.log",
            helper.tool("struct"), helper.root, dns, work))
        local plain = "--bind 127.0.0.1 --save '' --appendonly no --daemonize no"
        pids[#pids + 1] = start(string.format("%s --port %d %s", redis_server, redis, plain))
        pids[#pids + 1] = start(string.format("%s --port %d %s --requirepass s3cret", redis_server,
            redis_auth, plain))
        wait_port(redis)
        -- Sentinel rewrites its configuration file: one of its own in the work directory.
        helper.write_file(work .. "/sentinel.conf", string.format(
            "port %d\nbind 127.0.0.1\nsentinel monitor moonmaster 127.0.0.1 %d 1\n", sentinel,
            redis))
        pids[#pids + 1] = start(string.format("%s %s/sentinel.conf --sentinel", redis_server, work))
        for _, port in ipairs { dns, redis_auth, sentinel } do
            wait_port(port)
        end
        args = string.format("?dns=%d&redis=%d&redis_auth=%d&sentinel=%d&closed=%d", dns, redis,
            redis_auth, sentinel, free_port())
        srv = helper.spawn_server { app = "spec/fixtures/ngx_diff.lua",
            env = { NGX_CASES = "ngx_driver_cases" } }
        nginx = helper.nginx_lua [[
    server {
        listen 127.0.0.1:%d;
        location / {
            content_by_lua_block { require("ngx_driver_cases")[ngx.var.uri:sub(2)]() }
        }
    }]]
    end)

    teardown(function()
        if srv then srv:stop() end
        if nginx then nginx.stop() end
        for _, pid in ipairs(pids) do
            stop(pid)
        end
        if work then
            os.execute("rm -rf " .. helper.sh_quote(work))
        end
    end)

    -- The body from both servers, which must agree; returns it.
    local function both(name)
        local raw = "GET /" .. name .. args .. " HTTP/1.1\r\nHost: drivers.test\r\n\r\n"
        local want = assert(helper.request(nginx.port, raw))
        local got = assert(helper.request(srv.port, raw))
        assert.equal(want.status, got.status)
        assert.equal(want.body, got.body)
        assert.equal(200, got.status, srv:log():sub(-800))
        return got.body
    end

    local function queries()
        return helper.read_file(work .. "/dns.log")
    end

    it("resolves A and AAAA records over UDP", function()
        assert.equal("name=a.moon.test type=1 class=1 ttl=300 section=1 address=127.0.0.7\n"
            .. "name=a.moon.test type=28 class=1 ttl=300 section=1 address=0:0:0:0:0:0:0:7\n",
            both("dns_a"))
        assert.matches("udp a.moon.test AAAA\n", queries())
    end)

    it("follows a CNAME, and reads TXT, SRV, MX and PTR records", function()
        assert.equal("name=alias.moon.test type=5 class=1 ttl=60 section=1 cname=a.moon.test\n"
            .. "name=a.moon.test type=1 class=1 ttl=300 section=1 address=127.0.0.7\n",
            both("dns_cname"))
        assert.equal("name=txt.moon.test type=16 class=1 ttl=300 section=1 txt=hello,world\n"
            .. "name=_sip._udp.moon.test type=33 class=1 ttl=300 section=1 target=a.moon.test "
            .. "port=5060 priority=10 weight=20\n"
            .. "name=mx.moon.test type=15 class=1 ttl=300 section=1 exchange=a.moon.test "
            .. "preference=10\n"
            .. "name=7.0.0.127.in-addr.arpa type=12 class=1 ttl=300 section=1 "
            .. "ptrdname=a.moon.test\n", both("dns_records"))
    end)

    it("answers a name that does not exist with the server's error code", function()
        assert.equal("errcode 3: name error\n", both("dns_nxdomain"))
    end)

    it("asks again over TCP when the UDP answer is truncated, and tcp_query asks over TCP",
        function()
            assert.equal("30 10.0.0.1 10.0.0.30\n1 127.0.0.7\n", both("dns_truncated"))
            local log = queries()
            assert.matches("udp many.moon.test A\n", log)
            assert.matches("tcp many.moon.test A\n", log)
            assert.matches("tcp a.moon.test A\n", log)
        end)

    it("times out on a server that does not answer, after its retries", function()
        local body = both("dns_timeout")
        assert.matches("^nil failed to receive reply from UDP server 127%.0%.0%.1:%d+: timeout "
            .. "true\n$", body)
    end)

    it("says why when nothing listens at the name server's port", function()
        assert.matches("^error: failed to receive reply from UDP server 127%.0%.0%.1:%d+: "
            .. "connection refused\n$", both("dns_refused"))
    end)

    it("connects by a redis:// URL with a database, and through the pool again", function()
        assert.equal("set: OK nil\nget: v2 nil\nkeepalive: 1 nil\nreused more: true\n"
            .. "db 0: userdata: NULL nil\n", both("connector_url"))
    end)

    it("authenticates with the URL's password, and a wrong one is refused", function()
        local body = both("connector_auth")
        assert.matches("^set: OK nil\nget: yes nil\nwrong: false WRONGPASS", body)
        assert.matches("\nnone: false NOAUTH Authentication required%.\n$", body)
    end)

    it("finds the master through Sentinel", function()
        assert.equal("master set: OK nil\nmaster get: m nil\nslave: nil no slaves available\n",
            both("connector_sentinel"))
    end)

    it("takes socket timeouts as OpenResty does: numeric strings, the default for anything "
        .. "else, a negative one refused (on TCP)", function()
        assert.equal("nil nil \nfalsebad timeout value\nfalsebad timeout value\n"
            .. "nil timeout true\nnil true\n", both("socket_timeouts"))
    end)

    it("says connection refused for a Redis that is down", function()
        assert.equal("nil connection refused\n", both("connector_down"))
    end)
end)
