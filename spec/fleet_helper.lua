-- spec/fleet_helper.lua: a fleet on loopback for the specs: moonserve instances, the balancers
-- in front of them (HAProxy, nginx), Redis, a load of real clients, and a rolling restart.
-- Everything is started on free loopback ports, in a temporary directory, and stopped by PID.
local socket = require "socket"
local helper = require "helper"
local luassert = require "luassert"

local fleet = {}

local BIN = os.getenv("MOONSERVE_BIN") or (helper.root .. "/lua/bin/moonserve")

local sh_quote, read_file = helper.sh_quote, helper.read_file
-- One session secret for every instance: a cookie signed by one is good on the others.
local SESSION_SECRET = "fleet-spec-session-secret-shared-by-all-instances"

-- Whether `pid` runs: a zombie does not (a process started in the background is the child
-- of a shell that has exited, and waits to be reaped by whoever adopted it, not always at once).
local function alive(pid)
    local stat = read_file("/proc/" .. pid .. "/stat")
    return stat ~= "" and not stat:match("^%d+ %b() Z")
end
fleet.alive = alive

-- A temporary directory, removed by fleet.cleanup(dir).
function fleet.tempdir()
    return (helper.sh(helper.tool("mktemp") .. " -d"):gsub("%s+$", ""))
end

function fleet.cleanup(dir)
    if dir and dir:match("^/tmp/") then
        os.execute("rm -rf " .. sh_quote(dir))
    end
end

-- Starts `cmd` (a shell command line) in the background with its output in `log`; returns
-- its PID.
local function background(cmd, log)
    local p = io.popen(string.format("%s >%s 2>&1 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- & echo $!",
        cmd, sh_quote(log)))
    local pid = p:read("*l")
    p:close()
    return pid
end
fleet.background = background

-- Waits up to `seconds` (default 10) for `pid` to exit; true if it did.
function fleet.wait_exit(pid, seconds)
    return helper.wait_for(function() return not alive(pid) end, seconds or 10)
end

-- Sends `sig` (default TERM) to `pid`, waits up to `seconds` for it to exit, then KILLs it.
-- Returns true if it exited by itself.
function fleet.stop_pid(pid, sig, seconds)
    if not pid or not alive(pid) then
        return true
    end
    os.execute("kill -" .. (sig or "TERM") .. " " .. pid .. " 2>/dev/null")
    if fleet.wait_exit(pid, seconds or 10) then
        return true
    end
    os.execute("kill -9 " .. pid .. " 2>/dev/null")
    return false
end

-- GET `path` from 127.0.0.1:`port` on a connection of its own; the status, or nil and why.
function fleet.get(port, path, timeout)
    local s = socket.tcp()
    s:settimeout(timeout or 2)
    local ok, err = s:connect("127.0.0.1", port)
    if not ok then
        return nil, err
    end
    s:send("GET " .. path .. " HTTP/1.1\r\nHost: fleet\r\nConnection: close\r\n\r\n")
    local line, rerr = s:receive("*l")
    s:close()
    if not line then
        return nil, rerr
    end
    return tonumber(line:match("^HTTP/1%.%d (%d+)"))
end

-- -- Instances ----------------------------------------------------------------------------

-- Starts one moonserve instance (a master and its workers): opts.name, opts.app (relative to
-- the source root; default spec/fixtures/fleet.lua), opts.workers (default 2), opts.ports:
-- { proxy =, plain =, agent = } (free ones when missing; `proxy` is a --listen-proxy listener
-- for HAProxy's PROXY v2, `plain` a plain one for nginx), opts.args: more arguments (default
-- FLEET_ARGS from the environment, else "--readyz /readyz --drain-delay 1": a run with
-- "--readyz /readyz --drain-delay 0" shows what the delay saves), opts.redis: the Redis
-- server (fleet.redis) its sessions and chat use, opts.dir: where its log (and its pid file,
-- with opts.pid_file = true: --pid-file DIR/NAME.pid, in .pid_file) goes. Returns an instance
-- with .pid, .ports, .log(), :ready(), :stop(sig), and :replace() (a new one on its ports).
function fleet.instance(opts)
    local ports = opts.ports or {}
    ports.proxy = ports.proxy or helper.free_port()
    ports.plain = ports.plain or helper.free_port()
    ports.agent = ports.agent or helper.free_port()
    local inst = { name = opts.name or "i", ports = ports, opts = opts, generation = 1 }
    local args = opts.args or os.getenv("FLEET_ARGS") or "--readyz /readyz --drain-delay 1"
    if opts.pid_file then
        inst.pid_file = (opts.dir or "/tmp") .. "/" .. inst.name .. ".pid"
        args = args .. " --pid-file " .. sh_quote(inst.pid_file)
    end
    function inst:start()
        self.logfile = (opts.dir or "/tmp") .. "/" .. self.name .. "." .. self.generation .. ".log"
        local app = opts.app or "spec/fixtures/fleet.lua"
        local redis_url = opts.redis and ("redis://127.0.0.1:" .. opts.redis.port .. "/0") or ""
        local cmd = string.format("REDIS_URL=%s MOONSERVE_SECRET_SESSION=%s FLEET_INSTANCE=%s "
            .. BIN .. " %s --listen-proxy 127.0.0.1:%d --listen 127.0.0.1:%d --workers %d "
            .. "--agent-check 127.0.0.1:%d %s",
            sh_quote(redis_url), SESSION_SECRET, sh_quote(self.name),
            sh_quote(helper.root .. "/" .. app), ports.proxy, ports.plain, opts.workers or 2,
            ports.agent, args)
        self.pid = background(cmd, self.logfile)
        return self
    end
    function inst:log()
        return read_file(self.logfile)
    end
    -- Waits until /readyz answers 200 on the plain listener; raises with the log if not.
    function inst:ready(seconds)
        if not helper.wait_for(function()
            return fleet.get(ports.plain, "/readyz", 0.5) == 200
        end, seconds or 15) then
            error("instance " .. self.name .. " not ready:\n" .. self:log(), 2)
        end
        return self
    end
    function inst:stop(sig, seconds)
        return fleet.stop_pid(self.pid, sig, seconds or 20)
    end
    -- Stops it (TERM) and starts a new one on the same ports once it has exited.
    function inst:replace()
        local clean = self:stop("TERM")
        self.generation = self.generation + 1
        self:start()
        return clean
    end
    return inst:start()
end

-- Starts `n` instances named i1..in (fleet.instance's opts); waits until all are ready.
function fleet.instances(n, opts)
    local list = {}
    for i = 1, n do
        local o = {}
        for k, v in pairs(opts or {}) do
            o[k] = v
        end
        o.name = "i" .. i
        o.ports = {}
        list[i] = fleet.instance(o)
    end
    for _, inst in ipairs(list) do
        inst:ready()
    end
    return list
end

-- -- Balancers ----------------------------------------------------------------------------

-- Debian's HAProxy (2.6) in front of `instances`: PROXY v2 to their proxy listeners, checks
-- GET /readyz every 100 ms (down after 1 failure, up after 2), the agent-check on each
-- instance's agent port, HTTP/1.1 and HTTP/2 with prior knowledge on its frontend, a stats
-- page. opts.dir: where its files go; opts.extra: more lines for the backend; opts.retries:
-- the defaults' lines on retries (default "retries 3" and "option redispatch 1"). Returns
-- { port, stats_port, pid, log(), stop(), status() } where status() maps server names to
-- their state ("UP", "DOWN", "DRAIN", "MAINT", ...).
function fleet.haproxy(instances, opts)
    opts = opts or {}
    local dir = opts.dir or fleet.tempdir()
    local port, stats = helper.free_port(), helper.free_port()
    local servers = {}
    for _, inst in ipairs(instances) do
        servers[#servers + 1] = string.format("    server %s 127.0.0.1:%d send-proxy-v2 check "
            .. "inter 100ms fall 1 rise 2 agent-check agent-port %d agent-inter 100ms",
            inst.name, inst.ports.proxy, inst.ports.agent)
    end
    helper.write_file(dir .. "/haproxy.cfg", string.format([[
global
    maxconn 2000
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout tunnel 60s
    timeout http-keep-alive 10s
%s
frontend web
    bind 127.0.0.1:%d
    default_backend app
backend app
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
%s
%s
listen stats
    bind 127.0.0.1:%d
    stats enable
    stats uri /stats
]], opts.retries or "    retries 3\n    option redispatch 1", port, opts.extra or "",
        table.concat(servers, "\n"), stats))
    local pid = background(string.format("%s -db -f %s", helper.tool("haproxy"),
        sh_quote(dir .. "/haproxy.cfg")), dir .. "/haproxy.log")
    local hap = { port = port, stats_port = stats, pid = pid, dir = dir }
    function hap.log()
        return read_file(dir .. "/haproxy.log")
    end
    function hap.stop()
        fleet.stop_pid(pid, "TERM", 5)
    end
    function hap.status()
        local s = socket.connect("127.0.0.1", stats)
        if not s then
            return {}
        end
        s:settimeout(2)
        s:send("GET /stats;csv HTTP/1.0\r\n\r\n")
        local body = s:receive("*a") or ""
        s:close()
        local st = {}
        for line in body:gmatch("[^\n]+") do
            local px, sv, rest = line:match("^([^,]+),([^,]+),(.*)$")
            if px == "app" and sv ~= "BACKEND" then
                local f = {}
                for v in (rest .. ","):gmatch("([^,]*),") do
                    f[#f + 1] = v
                end
                st[sv] = f[16] -- (the 18th field of the CSV, "status")
            end
        end
        return st
    end
    -- Waits until every server is UP.
    function hap.all_up(seconds)
        return helper.wait_for(function()
            local st, n = hap.status(), 0
            for _, inst in ipairs(instances) do
                if st[inst.name] ~= "UP" then
                    return false
                end
                n = n + 1
            end
            return n > 0
        end, seconds or 15)
    end
    helper.wait_port(port)
    return hap
end

-- Debian's nginx in front of `instances` (their plain listeners): an upstream with
-- keep-alive connections, idempotent requests passed to the next server on an error, a
-- timeout, or a 502/503, WebSocket upgrades passed through. Returns { port, pid, log(),
-- stop() }.
function fleet.nginx(instances, opts)
    opts = opts or {}
    local dir = opts.dir or fleet.tempdir()
    local port = helper.free_port()
    local servers = {}
    for _, inst in ipairs(instances) do
        servers[#servers + 1] = string.format("        server 127.0.0.1:%d max_fails=1 "
            .. "fail_timeout=1s;", inst.ports.plain)
    end
    helper.write_file(dir .. "/nginx.conf", string.format([[
worker_processes 1;
daemon off;
pid %s/nginx.pid;
error_log %s/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    map $http_upgrade $connection_upgrade { default upgrade; '' ''; }
    upstream app {
%s
        keepalive 32;
    }
    server {
        listen 127.0.0.1:%d;
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_next_upstream error timeout http_502 http_503;
            proxy_next_upstream_tries 3;
            proxy_read_timeout 30s;
        }
    }
}
]], dir, dir, table.concat(servers, "\n"), port))
    local pid = background(string.format("%s -p %s -c %s", helper.tool("nginx"), sh_quote(dir),
        sh_quote(dir .. "/nginx.conf")), dir .. "/nginx.out")
    local ngx = { port = port, pid = pid, dir = dir }
    function ngx.log()
        return read_file(dir .. "/error.log") .. read_file(dir .. "/nginx.out")
    end
    function ngx.stop()
        fleet.stop_pid(pid, "TERM", 5)
    end
    helper.wait_port(port)
    return ngx
end

-- Debian's redis-server on a free loopback port, no persistence. Returns { port, pid, stop() }.
function fleet.redis(opts)
    opts = opts or {}
    local dir = opts.dir or fleet.tempdir()
    local pid, port = helper.redis_server(nil, nil, dir)
    local r = { port = port, pid = pid, dir = dir }
    function r.stop()
        fleet.stop_pid(pid, "TERM", 5)
    end
    return r
end

-- -- A rolling case -------------------------------------------------------------------------

-- The users and chat clients of a rolling case's load.
fleet.USERS, fleet.CHATTERS = 30, 6

-- What a rolling case runs in: a temporary folder and a Redis (world.dir, world.redis). The
-- case keeps what it starts in world.instances, world.balancer and world.load;
-- world:finish() ends them all.
function fleet.world()
    local w = { dir = fleet.tempdir() }
    w.redis = fleet.redis { dir = w.dir }
    -- Starts the load through the balancer: `targets` (fleet.load's) and USERS users and
    -- CHATTERS chat clients, whose sessions are tried on each instance after the load.
    function w:start_load(targets)
        local ports = {}
        for i, inst in ipairs(self.instances) do
            ports[i] = inst.ports.plain
        end
        targets.users = { self.balancer.port, fleet.USERS }
        targets.chat = { self.balancer.port, fleet.CHATTERS }
        self.load = fleet.load(targets, { dir = self.dir, check_ports = ports })
        return self.load
    end
    -- Stops the load and checks what it saw (fleet.report).
    function w:check_load(name)
        local counts = self.load.finish()
        self.load = nil
        if counts.failed > 0 and self.balancer then
            print("  the balancer's log:\n" .. self.balancer.log())
        end
        fleet.report(name, counts, #self.instances)
    end
    function w:finish()
        if self.load then
            self.load.finish()
        end
        if self.balancer then
            self.balancer.stop()
        end
        for _, inst in ipairs(self.instances or {}) do
            inst:stop("KILL", 1)
        end
        self.redis.stop()
        fleet.cleanup(self.dir)
    end
    return w
end

-- Prints what a rolling case's load saw (the spec's output is the report of the run) and
-- checks it: enough load, no failed request, every session and chat message kept.
function fleet.report(name, counts, n_instances)
    print(string.format("%s: %d requests and echoes, %d failed (h1 %d/%d, h2 %d/%d, ws %d/%d, "
        .. "WebSockets closed 1001 and reopened %d)", name, counts.ok + counts.failed,
        counts.failed, counts.h1_ok or 0, counts.h1_failed or 0, counts.h2_ok or 0,
        counts.h2_failed or 0, counts.ws_ok or 0, counts.ws_failed or 0,
        counts.ws_going_away_ok or 0))
    for _, f in ipairs(counts.failures) do
        print("  failure: " .. f)
    end
    luassert.is_true(counts.done, counts.text)
    luassert.is_true(counts.ok > 300, "too little load to tell: " .. counts.ok)
    luassert.equal(0, counts.failed)
    luassert.same({}, fleet.sessions_and_chat(name, counts, fleet.USERS, n_instances))
end

-- -- Load ---------------------------------------------------------------------------------

-- Starts the clients of spec/it/fleet_client.py against `targets`: { h1 = { port, n },
-- h2 = { port, n }, ws = { port, n }, users = { port, n }, chat = { port, n } } (any may be
-- missing; users and chat need the fixture's Redis, see the client's header) and
-- opts.check_ports (the instances' plain ports, where each user's session is tried after
-- the load). Returns a load with :finish(), which stops the clients and returns their
-- counts ({ h1_ok =, h1_failed =, ..., chat_lost =, session_invalid = }, failed = the sum
-- of the *_failed, failures = { lines }, chat_clients = { lines })
function fleet.load(targets, opts)
    opts = opts or {}
    local dir = opts.dir or fleet.tempdir()
    local stop_file = dir .. "/load.stop." .. tostring(os.time()) .. math.random(1e6)
    local args = {}
    for _, kind in ipairs({ "h1", "h2", "ws", "users", "chat" }) do
        local t = targets[kind]
        if t then
            args[#args + 1] = string.format("--%s 127.0.0.1:%d:%d", kind, t[1], t[2])
        end
    end
    if opts.check_ports then
        args[#args + 1] = "--check-ports " .. table.concat(opts.check_ports, ",")
    end
    local out = stop_file .. ".out"
    local pid = background(string.format("%s %s/spec/it/fleet_client.py load %s --stop-file %s "
        .. "--seconds %d", helper.tool("h2"), sh_quote(helper.root), table.concat(args, " "),
        sh_quote(stop_file), opts.seconds or 600), out)
    assert(helper.wait_for(function() return read_file(out):find("started=1") end, 10),
        "the load did not start: " .. read_file(out))
    local load = { pid = pid }
    function load.finish()
        helper.write_file(stop_file, "")
        fleet.wait_exit(pid, 40)
        local text = read_file(out)
        os.remove(stop_file)
        os.remove(out)
        local counts = { failed = 0, ok = 0, failures = {}, chat_clients = {}, text = text }
        for k, v in text:gmatch("([%w_]+)=([^\n]*)") do
            if k == "failure" then
                counts.failures[#counts.failures + 1] = v
            elseif k == "chat_client" then
                counts.chat_clients[#counts.chat_clients + 1] = v
            elseif tonumber(v) then
                counts[k] = tonumber(v)
                if k:match("_failed$") then
                    counts.failed = counts.failed + tonumber(v)
                elseif k:match("_ok$") then
                    counts.ok = counts.ok + tonumber(v)
                end
            end
        end
        counts.done = text:find("done=1") ~= nil
        return counts
    end
    return load
end

-- Prints what the load's users and chat saw (fleet.load with users, chat and check_ports)
-- and returns what is wrong with it (a list, empty when all is well): every session must be
-- valid on every instance afterwards (`users` of them on each of `n_instances`), none invalid
-- during the load; every chat message due on a connection (see spec/it/fleet_client.py's
-- header) delivered there once, enough messages posted on one instance due on another's
-- sockets, and chat clients on every instance.
function fleet.sessions_and_chat(name, counts, users, n_instances)
    local joined = counts.text:match("chat_instances=([^\n]*)") or ""
    print(string.format("%s: sessions: %d logged in, %d checked on every instance after the "
        .. "roll, %d invalid; during it GET /me %d ok, %d failed, %d invalid",
        name, users, counts.session_checked or 0, counts.session_invalid or -1,
        counts.me_ok or 0, counts.me_failed or 0, counts.me_invalid or 0))
    print(string.format("%s: chat: %d posted (%d failed), %d due on the clients' connections "
        .. "(%d posted on another instance), %d delivered, %d lost, %d twice; clients joined "
        .. "on %s, reconnected after 1001 %d times", name, counts.chat_posted or 0,
        counts.post_failed or 0, counts.chat_due or 0, counts.chat_cross_due or 0,
        counts.chat_delivered or 0, counts.chat_lost or -1, counts.chat_duplicate or -1, joined,
        counts.chat_going_away_ok or 0))
    for _, line in ipairs(counts.chat_clients) do
        print("  chat client " .. line)
    end
    local wrong = {}
    local function want(ok, what)
        if not ok then
            wrong[#wrong + 1] = what
        end
    end
    want(counts.session_checked == users * n_instances, "not every session was checked")
    want(counts.session_invalid == 0, "sessions invalid after the roll")
    want((counts.me_invalid or 0) == 0, "sessions invalid during the roll")
    want((counts.me_ok or 0) > 50, "too few session requests to tell")
    want(counts.chat_lost == 0 and counts.chat_due == counts.chat_delivered,
        "chat messages lost")
    want(counts.chat_duplicate == 0, "chat messages delivered twice")
    want((counts.chat_posted or 0) > 100, "too few chat messages to tell")
    want((counts.chat_cross_due or 0) > (counts.chat_posted or 0), "too little fan-out to tell")
    for i = 1, n_instances do
        want(("," .. joined .. ","):find(",i" .. i .. ",", 1, true), "no chat client on i" .. i)
    end
    return wrong
end

-- -- The rolling restart -------------------------------------------------------------------

-- Replaces each of `instances` in turn: TERM, a new one on its ports once it has exited,
-- ready (readyz 200), then `settle()` (say, until the balancer sees it up) and `pause`
-- seconds before the next. Returns the number of instances that did not exit by themselves.
function fleet.roll(instances, settle, pause)
    local unclean = 0
    for _, inst in ipairs(instances) do
        if not inst:replace() then
            unclean = unclean + 1
        end
        inst:ready()
        if settle then
            settle(inst)
        end
        socket.sleep(pause or 0.5)
    end
    return unclean
end

return fleet
