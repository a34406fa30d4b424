-- spec/it/socket_spec.lua: moonserve.socket from handlers of a real server, against a real
-- Redis and memcached and small peers that this spec starts and stops itself.
local helper = require "helper"
local socket = require "socket"

local free_port, start, stop, wait_port = helper.free_port, helper.background, helper.stop_pid,
    helper.wait_port

-- The peers: a listener that accepts and never answers, one that answers a part and
-- closes, a UDP echo and a UDP peer that never answers.
local PEERS = [[
local socket = require "socket"
local silent_port, closer_port, udp_port, quiet_port = tonumber(arg[1]), tonumber(arg[2]),
    tonumber(arg[3]), tonumber(arg[4])
local silent = assert(socket.bind("127.0.0.1", silent_port))
local closer = assert(socket.bind("127.0.0.1", closer_port))
local u = assert(socket.udp()); assert(u:setsockname("127.0.0.1", udp_port))
local q = assert(socket.udp()); assert(q:setsockname("127.0.0.1", quiet_port))
local held = {}
while true do
    local ready = socket.select({ silent, closer, u }, nil, 1)
    for _, s in ipairs(ready) do
        if s == silent then
            held[#held + 1] = silent:accept() -- never read, never answered
        elseif s == closer then
            local c = closer:accept()
            c:settimeout(1)
            c:receive()
            c:send("partial")
            c:close()
        else
            local data, ip, port = u:receivefrom()
            if data then u:sendto("echo:" .. data, ip, port) end
        end
    end
end
]]

local function get(srv, path)
    local res = assert(helper.request(srv.port, "GET " .. path .. " HTTP/1.1\r\nHost: t\r\n\r\n"))
    return res.body, res.status
end

local redis_cmd = helper.redis_cmd

local function clients(port)
    local n = 0
    for _ in redis_cmd(port, "CLIENT LIST"):gmatch("[^\n]+") do
        n = n + 1
    end
    return n - 1 -- (the spec's own connection)
end

describe("moonserve.socket from handlers of a real server", function()
    local srv, redis_pid, mc_pid, peers_pid
    local unix_path
    local rport, mport, silent, closer, uport, quiet, closed

    setup(function()
        rport, mport, silent, closer = free_port(), free_port(), free_port(), free_port()
        uport, quiet, closed = free_port(), free_port(), free_port()
        unix_path = os.tmpname()
        os.remove(unix_path)
        redis_pid = start(string.format("%s --port %d --bind 127.0.0.1 --save '' "
            .. "--appendonly no --daemonize no --unixsocket %s", helper.tool("redis-server"),
            rport, unix_path))
        mc_pid = start(string.format("%s -p %d -l 127.0.0.1 -U 0 -u root",
            helper.tool("memcached"), mport))
        local script = os.tmpname()
        helper.write_file(script, PEERS)
        peers_pid = start(string.format("%s %s %d %d %d %d", helper.tool("luajit"), script, silent, closer, uport,
            quiet))
        wait_port(rport)
        wait_port(mport)
        wait_port(silent)
        os.remove(script)
        srv = helper.spawn_server { app = "spec/fixtures/sockets.lua" }
    end)

    teardown(function()
        if srv then srv:stop() end
        stop(redis_pid)
        stop(mc_pid)
        stop(peers_pid)
        if unix_path then os.remove(unix_path) end
    end)

    local twice = helper.twice(it)
    local function q(path, extra)
        return path .. "?port=" .. rport .. (extra or "")
    end

    twice("speaks RESP to Redis: SET, GET, INCR, and reuses the pooled connection", function()
        local body = get(srv, q("/redis/basic"))
        local reused = tonumber(body:match(" (%d+)$"))
        assert.matches("^OK v1 [01] 1 2$", body:match("^(.*) %d+$"))
        body = get(srv, q("/redis/basic"))
        assert.is_true(tonumber(body:match(" (%d+)$")) > reused)
    end)

    twice("sends a pipeline gathered from a table and reads the replies", function()
        assert.equal("OK 42 42", get(srv, q("/redis/pipeline")))
    end)

    it("returns the bytes sent of flat, nested and large tables", function()
        local n = 4 * 1024 * 1024
        assert.equal(table.concat({ 29, "OK", 8, "42", 27 + #tostring(n) + n, "OK", n }, " "),
            get(srv, q("/redis/send_counts")))
    end)

    it("runs a pub/sub loop on read timeouts, which leave the socket usable", function()
        assert.equal("m1,m2,m3 true", get(srv, q("/redis/pubsub")))
    end)

    twice("connects to a unix socket, sets options, and reads with receiveany", function()
        local body = get(srv, "/unix?path=" .. unix_path)
        assert.matches("^42|1|1|nil|nil|unsupported option linger|%+PO|NG\r\n%-ERR [^|]*$",
            body)
    end)

    twice("speaks memcached's text protocol: set, get, incr, delete", function()
        assert.equal("STORED VALUE mk 0 2|10 15 DELETED END",
            get(srv, "/memcached?port=" .. mport))
    end)

    twice("waits inside pcall, xpcall, coroutine.wrap and an iterator", function()
        assert.equal("true:PONG true:x w1w2 i1 i2 i3 abc/def/gh", get(srv, q("/waits")))
    end)

    it("keeps Redis at the pool's size under concurrent load, reusing connections", function()
        redis_cmd(rport, "SET kload hot")
        local url = string.format("http://127.0.0.1:%d%s", srv.port, q("/redis/load"))
        local out = os.tmpname()
        local wrk = io.popen(string.format("%s -t2 -c16 -d2s %s >%s 2>&1", helper.tool("wrk"),
            url, out), "r")
        socket.sleep(1)
        local busy = 0 -- the load pool's connections: the only ones whose last command is GET
        for _ in redis_cmd(rport, "CLIENT LIST"):gmatch("cmd=get") do
            busy = busy + 1
        end
        wrk:close()
        local text = helper.read_file(out)
        os.remove(out)
        local reqs = tonumber(text:match("(%d+) requests in"))
        assert.is_true(reqs > 100, text)
        assert.not_matches("Non%-2xx", text)
        assert.equal(4, busy)
        local body = get(srv, q("/redis/load"))
        assert.matches("^hot %d+$", body)
        assert.is_true(tonumber(body:match("%d+$")) > 0)
    end)

    it("does not hand out a pooled connection that Redis closed while idle", function()
        local id = get(srv, q("/redis/id")):match("^(%d+)")
        assert.equal("+OK", redis_cmd(rport, "CLIENT KILL ID " .. id):gsub("^:1$", "+OK"))
        socket.sleep(0.1)
        local id2, reused = get(srv, q("/redis/id")):match("^(%d+) (%d+)$")
        assert.are_not.equal(id, id2)
        assert.equal("0", reused)
    end)

    twice("makes a connect beyond the pool wait in its backlog, and refuses past it", function()
        local body = get(srv, q("/redis/backlog"))
        local first, second = body:match("^PONG:(%d+) PONG:(%d+) too many waiting connect "
            .. "operations$")
        assert.is_truthy(first, body)
        assert.equal(tonumber(first) + 1, tonumber(second)) -- handed over, not a new connection
    end)

    -- A connect waiting in the backlog completes inside the setkeepalive that gives the
    -- connection back, an FFI call from Lua that the JIT has compiled: the waiter must not
    -- be resumed inside it (LuaJIT cannot be entered again from there; the worker crashed).
    twice("hands a connection given back with setkeepalive to a connect in the backlog", function()
        assert.equal("300 300", get(srv, q("/redis/handoff", "&n=300")))
        assert.is_true(srv:alive())
    end)

    it("closes a pooled connection idle past its time", function()
        local id = get(srv, q("/redis/idle"))
        assert.matches("id=" .. id .. " ", redis_cmd(rport, "CLIENT LIST"), 1, true)
        socket.sleep(0.4)
        assert.not_matches("id=" .. id .. " ", redis_cmd(rport, "CLIENT LIST"), 1, true)
    end)

    it("closes a socket its request left open instead of pooling it", function()
        local before = clients(rport)
        assert.equal("PONG 0", get(srv, q("/redis/leave")))
        assert.equal("PONG 0", get(srv, q("/redis/leave")))
        socket.sleep(0.1)
        assert.equal(before, clients(rport))
    end)

    twice("times a read out and leaves the socket usable", function()
        assert.equal("nil timeout [] 14", get(srv, "/timeout/read?port=" .. silent))
    end)

    it("times a send out against a peer that never reads, and closes the socket", function()
        assert.equal("timeout closed", get(srv, "/timeout/send?port=" .. silent))
    end)

    it("times a connect out against a listener whose backlog is full", function()
        local l = assert(socket.tcp())
        assert(l:bind("127.0.0.1", 0))
        assert(l:listen(0))
        local _, lport = l:getsockname()
        local fill = {}
        finally(function()
            for _, c in ipairs(fill) do c:close() end
            l:close()
        end)
        for _ = 1, 8 do
            local c = socket.tcp()
            c:settimeout(0.1)
            c:connect("127.0.0.1", lport)
            fill[#fill + 1] = c
        end
        assert.equal("nil timeout", get(srv, "/timeout/connect?port=" .. lport))
    end)

    twice("returns the partial data when the peer closes mid-reply", function()
        assert.equal("nil closed partial closed", get(srv, "/closer?port=" .. closer))
    end)

    it("takes a socket's timeouts and pool size from the server's limits", function()
        assert.equal("1 1", get(srv, q("/limits")))
        local limited = helper.spawn_server { app = "spec/fixtures/sockets.lua",
            args = "--limit socket_read_timeout=0.3 --limit socket_pool_size=1" }
        finally(function() limited:stop() end)
        assert.equal("timeout 0.3 1 0", get(limited, q("/limits", "&silent=" .. silent)))
    end)

    twice("resolves localhost and reports a name that does not resolve", function()
        assert.equal("1|PONG|nil|nonexistent.invalid could not be resolved (3: Host not found)"
            .. "|connection refused", get(srv, q("/dns", "&closed=" .. closed)))
    end)

    twice("exchanges datagrams with a UDP echo, and times a receive out", function()
        assert.equal("echo:ping 1 nil timeout closed",
            get(srv, "/udp?port=" .. uport .. "&quiet=" .. quiet))
    end)

    twice("closes a socket whose reading light thread is killed", function()
        assert.equal("closed true slept", get(srv, "/kill?port=" .. silent))
    end)

    it("runs in a timer, which owns the socket it made", function()
        assert.equal("false the socket belongs to another request, timer or hook|from a timer",
            (get(srv, q("/timer")):gsub("^false [^|]-: the", "false the")))
    end)

    it("raises on misuse and reports a second reader as busy", function()
        local first = get(srv, q("/misuse"))
        assert.equal("moonserve.socket.tcp: not inside a request, timer or hook (an app file's "
            .. "top level is none: use app:on_worker_start or a timer)|socket busy reading|+PONG|"
            .. "false bad argument #1 to 'receive' (\"*l\", \"*a\" or a number expected)",
            (first:gsub("^[^|]-: moonserve", "moonserve")))
        local second = get(srv, q("/misuse"))
        assert.matches("|false the socket belongs to another request, timer "
            .. "or hook|", second, 1, true)
        assert.is_true(srv:alive())
    end)
end)
