-- spec/it/redis_client_spec.lua: moonserve.redis in a served app (spec/fixtures/redis_client.lua)
-- against real redis-server processes on loopback: a plain one, one with ACL users only, one
-- on a unix socket, one speaking TLS alone, and a Sentinel watching the plain one.
local helper = require "helper"
local cjson = require "cjson"
local socket = require "socket"

local function q(s)
    return "'" .. s:gsub("'", "'\\''") .. "'"
end

local function esc(s)
    return (s:gsub("[^%w%-%._~]", function(c) return string.format("%%%02X", c:byte()) end))
end

describe("moonserve.redis", function()
    local srv, dir, base
    local pids = {}
    local ports = {}
    local redis_server = helper.tool("redis-server")
    local plain = "--bind 127.0.0.1 --save '' --appendonly no --daemonize no"

    local function start_redis(name, args)
        pids[name], ports[name] = helper.redis_server(ports[name], args, dir)
    end

    setup(function()
        dir = helper.sh(helper.tool("mktemp") .. " -d"):gsub("%s+$", "")
        helper.test_certs(dir, "redis-test-ca")
        start_redis("plain")
        -- ACL: the default user off, "app" with its password
        start_redis("acl", "--user default off --user app on " .. q(">app:pw%1") .. " '~*' '&*' '+@all'")
        start_redis("unix", "--unixsocket " .. q(dir .. "/redis.sock") .. " --unixsocketperm 700")
        ports.tls = helper.free_port()
        pids.tls = helper.background(string.format("%s --port 0 --tls-port %d %s "
            .. "--tls-cert-file %s --tls-key-file %s --tls-ca-cert-file %s --tls-auth-clients no",
            redis_server, ports.tls, plain, q(dir .. "/leaf.pem"), q(dir .. "/leaf.key"),
            q(dir .. "/ca.pem")))
        ports.sentinel = helper.free_port()
        helper.write_file(dir .. "/sentinel.conf", string.format(
            "port %d\nbind 127.0.0.1\nsentinel monitor moonmaster 127.0.0.1 %d 1\n",
            ports.sentinel, ports.plain))
        pids.sentinel = helper.background(string.format("%s %s --sentinel", redis_server,
            q(dir .. "/sentinel.conf")))
        for _, name in ipairs { "plain", "acl", "unix", "tls", "sentinel" } do
            helper.wait_port(ports[name])
        end
        srv = helper.spawn_server { app = "spec/fixtures/redis_client.lua",
            args = "--ssl-trusted-certificate " .. q(dir .. "/ca.pem") }
        base = "http://127.0.0.1:" .. srv.port
    end)

    teardown(function()
        if srv then
            srv:stop()
        end
        for _, pid in pairs(pids) do
            helper.stop_pid(pid)
        end
        if dir then
            os.execute(helper.tool("rm") .. " -rf " .. q(dir))
        end
    end)

    local function get(case, u, extra)
        local out = helper.curl("-w '\\n%{http_code}' " .. q(base .. "/" .. case .. "?u=" .. esc(u)
            .. (extra or "")))
        local body, code = out:match("^(.*)\n(%d+)$")
        assert(body, out)
        return tonumber(code), body
    end

    local function body_of(...)
        return select(2, get(...))
    end

    local function stat(port, name)
        return tonumber(helper.redis_cmd(port, "INFO stats"):match(name .. ":(%d+)"))
    end

    local BASIC = table.concat({
        "OK", "v\r\n1", "null",
        "nil|ERR value is not an integer or out of range|true",
        "[0,1,42,error:WRONGTYPE Operation against a key holding the wrong kind of value,"
            .. "[v\r\n1,null]]",
        "[basic:s,arg,1]", "[basic:s,arg,2]", "nil|NOPE here|true" }, "\n")

    it("calls, pipelines and runs scripts on a plain server", function()
        for _ = 1, 2 do -- (twice: what the first run leaves must not change the second)
            local code, body = get("basic", "redis://127.0.0.1:" .. ports.plain)
            assert.equal(200, code, body)
            assert.equal(BASIC, body)
        end
    end)

    it("keeps its connections in the pool: no connect per call", function()
        local u = "redis://127.0.0.1:" .. ports.plain .. "/2"
        assert.equal(200, (get("many", u, "&n=1")))
        local before = stat(ports.plain, "total_connections_received")
        for _ = 1, 5 do
            local code, body = get("many", u, "&n=20")
            assert.equal(200, code, body)
            assert.equal("OK", body)
        end
        -- (this spec's own INFO is the one connection more)
        assert.equal(before + 1, stat(ports.plain, "total_connections_received"))
    end)

    it("selects the URL's database once per new connection", function()
        local _, body = get("db", "redis://127.0.0.1:" .. ports.plain .. "/5")
        assert.matches(" db=5 ", body)
        _, body = get("db", "redis://127.0.0.1:" .. ports.plain)
        assert.matches(" db=0 ", body)
    end)

    it("logs in as an ACL user with its password, and says so when it is wrong", function()
        local code, body = get("basic", "redis://app:" .. esc("app:pw%1") .. "@127.0.0.1:"
            .. ports.acl .. "/1")
        assert.equal(200, code)
        assert.equal(BASIC, body)
        local _, info = get("db", "redis://app:" .. esc("app:pw%1") .. "@127.0.0.1:" .. ports.acl
            .. "/1")
        assert.matches(" user=app ", info)
        _, body = get("fail", "redis://app:wrong@127.0.0.1:" .. ports.acl)
        local r = cjson.decode(body)
        assert.matches("^redis: AUTH: WRONGPASS", r.err)
        _, body = get("fail", "redis://127.0.0.1:" .. ports.acl)
        assert.matches("NOAUTH", cjson.decode(body).err)
        assert.is_true(srv:alive())
    end)

    it("speaks to a unix socket", function()
        local code, body = get("basic", "redis+unix://" .. dir .. "/redis.sock?db=3")
        assert.equal(200, code, body)
        assert.equal(BASIC, body)
        local _, info = get("db", "redis+unix://" .. dir .. "/redis.sock?db=3")
        assert.matches(" db=3 ", info)
    end)

    it("speaks TLS, verified against the trusted store; a wrong name fails", function()
        local code, body = get("basic", "rediss://127.0.0.1:" .. ports.tls)
        assert.equal(200, code, body)
        assert.equal(BASIC, body)
        body = body_of("fail", "rediss://127.0.0.1:" .. ports.tls .. "?sni=other.test")
        assert.matches("^TLS: ", cjson.decode(body).err)
        body = body_of("basic", "rediss://127.0.0.1:" .. ports.tls
            .. "?sni=other.test&insecure=1")
        assert.equal(BASIC, body)
        -- plain text to a TLS port is no answer
        body = body_of("fail", "redis://127.0.0.1:" .. ports.tls, "&timeout=0.3")
        assert.is_nil(cjson.decode(body).v)
    end)

    it("finds the primary through a sentinel", function()
        local code, body = get("basic", "redis+sentinel://127.0.0.1:" .. ports.sentinel
            .. "/moonmaster/4", "&k=sentinel")
        assert.equal(200, code, body)
        assert.equal((BASIC:gsub("basic:s", "sentinel:s")), body)
        body = body_of("fail", "redis+sentinel://127.0.0.1:" .. ports.sentinel .. "/nobody")
        assert.matches("no sentinel gave the primary of \"nobody\"",
            cjson.decode(body).err)
    end)

    it("subscribes on a connection of its own and reads messages and patterns", function()
        local code, body = get("sub", "redis://127.0.0.1:" .. ports.plain)
        assert.equal(200, code, body)
        assert.equal(table.concat({ "nil|timeout", "1", "1", "message news hello\r\nworld",
            "pmessage ev:* ev:1 pattern", "0", "nil|closed" }, "\n"), body)
    end)

    it("fails within its timeout when the server stalls, refuses or is gone", function()
        local u = "redis://127.0.0.1:" .. ports.plain
        assert.equal(200, (get("pause", u, "&ms=1500")))
        local _, body = get("fail", u, "&timeout=0.3")
        local r = cjson.decode(body)
        assert.equal("timeout", r.err)
        assert.is_true(r.took >= 0.25 and r.took < 1, body)
        socket.sleep(1.3)
        _, body = get("fail", "redis://127.0.0.1:" .. helper.free_port(), "&timeout=0.3")
        assert.equal("connection refused", cjson.decode(body).err)
        assert.is_true(srv:alive())
    end)

    it("replaces pooled connections a restarted server dropped, with no error", function()
        local u = "redis://127.0.0.1:" .. ports.unix
        for _ = 1, 3 do
            assert.equal(200, (get("basic", u, "&k=restart")))
        end
        helper.stop_pid(pids.unix)
        start_redis("unix")
        helper.wait_port(ports.unix)
        local code, body = get("basic", u, "&k=restart")
        assert.equal(200, code, body)
        assert.equal((BASIC:gsub("basic:s", "restart:s")), body)
    end)

    it("refuses a bad URL with one line", function()
        local code, body = get("basic", "redis://127.0.0.1:" .. ports.plain .. "/x")
        assert.equal(400, code)
        assert.equal("redis: bad URL \"redis://127.0.0.1:" .. ports.plain
            .. "/x\": db must be a non-negative integer", body)
    end)
end)
