-- spec/helper.lua: starting real servers, talking to them, and running apps in-process.
local ffi = require "ffi"
local socket = require "socket"

ffi.cdef [[
int setenv(const char *name, const char *value, int overwrite);
int unsetenv(const char *name);
]]

local helper = {}

-- Sets `name` in this process's environment (what a server or a command started from here
-- inherits), or unsets it when `value` is nil.
function helper.setenv(name, value)
    if value == nil then
        ffi.C.unsetenv(name)
    else
        ffi.C.setenv(name, tostring(value), 1)
    end
end

-- Runs fn() with the variables of `env` set, then puts back what they were; returns fn's
-- results (and raises its error after putting them back).
function helper.with_env(env, fn)
    local was = {}
    for k, v in pairs(env) do
        was[k] = os.getenv(k) or false
        helper.setenv(k, v)
    end
    local out = { pcall(fn) }
    for k, v in pairs(was) do
        helper.setenv(k, v or nil)
    end
    if not out[1] then
        error(out[2], 0)
    end
    return unpack(out, 2, table.maxn(out))
end

local ROOT = os.getenv("MOONSERVE_SRC") or "."
helper.root = ROOT
local BIN = os.getenv("MOONSERVE_BIN") or (ROOT .. "/lua/bin/moonserve")
helper.bin = BIN

local function sh_quote(s)
    return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
helper.sh_quote = sh_quote

local function read_file(path)
    local f = io.open(path, "rb")
    if not f then
        return ""
    end
    local s = f:read("*a")
    f:close()
    return s
end
helper.read_file = read_file

local function alive(pid)
    return os.execute("kill -0 " .. pid .. " 2>/dev/null") == 0
end

-- Starts `moonserve APP` on 127.0.0.1 with an ephemeral port. opts.app: the app file
-- (absolute, or relative to the source root); opts.args: more command-line arguments; opts.env:
-- { NAME = value } for its environment; opts.log: the
-- file the server logs to, when the arguments say --log; opts.bare: none of the --listen
-- and --workers of its own (where it listens, and how many workers, is the environment's or
-- the defaults'); opts.limits: ulimit's arguments for it ("-n 64"). Returns a server with
-- .port, .pid, :log() and :stop().
function helper.spawn_server(opts)
    local log = os.tmpname()
    local logfile = opts.log or log
    local app = opts.app or ""
    if app ~= "" then
        app = sh_quote(app:sub(1, 1) == "/" and app or ROOT .. "/" .. app)
    end
    -- (The server gets none of this process's descriptors past stderr: a lock or a pipe it
    -- held would outlive this process in a server left running.)
    local cmd = string.format("%s %s %s %s >%s 2>&1 " ..
        "3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- & echo $!", sh_quote(BIN), app,
        opts.bare and "" or "--listen 127.0.0.1:0 --workers 0", opts.args or "", sh_quote(log))
    if opts.limits then -- (in a subshell of its own, so that $! is the server)
        cmd = string.format("(ulimit %s && exec %s", opts.limits, (cmd:gsub(" & echo %$!$", "")))
            .. ") & echo $!"
    end
    -- The server's environment is this process's, with opts.env set while it starts.
    local pid = helper.with_env(opts.env or {}, function()
        local p = io.popen(cmd)
        local pid = p:read("*l")
        p:close()
        return pid
    end)
    local port
    for _ = 1, 200 do -- 10 s at most
        port = read_file(logfile):match("listening on https?://[^ ]+:(%d+)/")
        if port or not alive(pid) then
            break
        end
        socket.sleep(0.05)
    end
    if not port then
        local text = read_file(log)
        os.execute("kill -9 " .. pid .. " 2>/dev/null")
        os.remove(log)
        error("server did not start:\n" .. text, 2)
    end
    local srv = { pid = pid, port = tonumber(port), logfile = logfile, ports = {} }
    for listening in read_file(logfile):gmatch("listening on https?://[^ ]+:(%d+)/") do
        srv.ports[#srv.ports + 1] = tonumber(listening)
    end
    function srv:log()
        return read_file(self.logfile)
    end
    function srv:alive()
        return alive(self.pid)
    end
    -- Stops the server with SIGTERM (SIGKILL after 5 s); returns true if it exited by itself.
    function srv:stop()
        os.execute("kill -TERM " .. self.pid .. " 2>/dev/null")
        for _ = 1, 100 do
            if not alive(self.pid) then
                os.remove(self.logfile)
                return true
            end
            socket.sleep(0.05)
        end
        os.execute("kill -9 " .. self.pid .. " 2>/dev/null")
        return false
    end
    return srv
end

-- Opens a WebSocket on `path`, sends `text` (one masked frame, under 126 bytes) and returns
-- the code of the close frame the server answers with.
function helper.websocket_close_code(port, path, text)
    local c = assert(socket.connect("127.0.0.1", port))
    c:settimeout(10)
    assert(c:send("GET " .. path .. " HTTP/1.1\r\nHost: w\r\nUpgrade: websocket\r\n"
        .. "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        .. "Sec-WebSocket-Version: 13\r\n\r\n"))
    repeat
        local line = assert(c:receive("*l"))
    until line == ""
    -- a text frame with a mask of zeros: the payload as it is
    assert(c:send(string.char(0x81, 0x80 + #text) .. "\0\0\0\0" .. text))
    local head = assert(c:receive(2))
    local payload = assert(c:receive(head:byte(2) % 128))
    c:close()
    assert(head:byte(1) == 0x88, "a close frame expected")
    return payload:byte(1) * 256 + payload:byte(2)
end

-- The runaway specs (spec/fixtures/runaway.lua): how many additions a compiled loop makes in
-- 20 ms of CPU before and after `stop` runs `n` times; a JIT that stopped compiling would be
-- some ten times slower after.
function helper.jit_rates(port, n, stop)
    local function rate()
        local res = helper.request(port, "GET /rate HTTP/1.1\r\nHost: r\r\n"
            .. "Connection: close\r\n\r\n")
        assert(res.status == 200, "GET /rate failed")
        return tonumber(res.body)
    end
    local before = rate()
    for _ = 1, n do
        stop()
    end
    return before, rate()
end

-- The pids of a process's children (a master's workers), sorted.
function helper.children(pid)
    local out = helper.run(helper.tool("pgrep") .. " -P " .. pid)
    local pids = {}
    for p in out:gmatch("%d+") do
        pids[#pids + 1] = p
    end
    table.sort(pids)
    return pids
end

-- Calls fn every 50 ms until it returns a true value, which it returns; false after
-- `seconds` (default 10).
function helper.wait_for(fn, seconds)
    for _ = 1, (seconds or 10) * 20 do
        local v = fn()
        if v then
            return v
        end
        socket.sleep(0.05)
    end
    return false
end

-- A raw TCP connection to the server.
function helper.connect(port, timeout)
    local s = assert(socket.tcp())
    s:settimeout(timeout or 10)
    assert(s:connect("127.0.0.1", port))
    return s
end

local function receive_exact(s, n)
    local parts, got = {}, 0
    while got < n do
        local data, err, partial = s:receive(math.min(n - got, 65536))
        data = data or partial
        if data and #data > 0 then
            parts[#parts + 1] = data
            got = got + #data
        end
        if err then
            return nil, err, table.concat(parts)
        end
    end
    return table.concat(parts)
end

-- Reads one response from a raw connection: { status, reason, headers (lowercase names;
-- repeated ones joined with ", "), body, raw_head }. HEAD replies pass head_only = true.
function helper.read_response(s, head_only)
    local line, err = s:receive("*l")
    if not line then
        return nil, err
    end
    local status, reason = line:match("^HTTP/1%.1 (%d%d%d) ?(.*)$")
    if not status then
        return nil, "bad status line: " .. line
    end
    local headers, raw = {}, { line }
    while true do
        local l = assert(s:receive("*l"))
        if l == "" then
            break
        end
        raw[#raw + 1] = l
        local k, v = l:match("^([^:]+):%s*(.-)%s*$")
        k = k:lower()
        headers[k] = headers[k] and (headers[k] .. ", " .. v) or v
    end
    local res = { status = tonumber(status), reason = reason, headers = headers,
        raw_head = table.concat(raw, "\r\n") }
    local code = res.status
    if head_only or code == 204 or code == 304 or code < 200 then
        res.body = ""
    elseif headers["content-length"] then
        res.body = assert(receive_exact(s, tonumber(headers["content-length"])))
    elseif headers["transfer-encoding"] == "chunked" then
        local parts = {}
        while true do
            local size = tonumber(assert(s:receive("*l")):match("^%x+"), 16)
            if size == 0 then
                repeat
                    local l = assert(s:receive("*l"))
                until l == ""
                break
            end
            parts[#parts + 1] = assert(receive_exact(s, size))
            assert(s:receive("*l") == "")
        end
        res.body = table.concat(parts)
    else
        res.body = s:receive("*a")
    end
    return res
end

-- One request on a fresh connection; returns the response.
function helper.request(port, raw, head_only)
    local s = helper.connect(port)
    assert(s:send(raw))
    local res, err = helper.read_response(s, head_only)
    s:close()
    return res, err
end

-- Whether the peer closed the connection (reads until EOF, within `timeout`).
function helper.closed(s, timeout)
    s:settimeout(timeout or 5)
    local _, err = s:receive("*a")
    return err == nil or err == "closed"
end

-- The program a spec runs for `name`, from spec/tools.txt: its path (for a Python module,
-- Debian's python3, which imports it). Fails naming the Debian package when it is missing,
-- or when the list does not have it. Build commands with it: helper.tool("nghttp") .. " -v ".
local tool_list, tool_found = nil, {}
function helper.tool(name)
    if tool_found[name] then
        return tool_found[name]
    end
    local tools = require "tools"
    if not tool_list then
        tool_list = assert(tools.read(ROOT .. "/spec/tools.txt"))
    end
    local entry = tool_list.by_name[name]
    if not entry then
        error(name .. " is not in spec/tools.txt: add it there with the Debian package that "
            .. "brings it", 2)
    end
    local found, why = tools.find(entry)
    if not found then
        error(why, 2)
    end
    tool_found[name] = found
    return found
end

-- Runs a shell command; returns its output and exit status.
function helper.run(cmd)
    local p = io.popen(cmd .. "; echo \"__status=$?\"")
    local out = p:read("*a")
    p:close()
    local status = tonumber(out:match("__status=(%d+)%s*$"))
    return out:gsub("__status=%d+%s*$", ""), status
end

-- curl with the given arguments against the server; returns its output.
function helper.curl(args)
    local out = helper.run(helper.tool("curl") .. " -sS --max-time 30 " .. args .. " 2>&1")
    return out
end

-- In-process: the app served through the real engine and dispatch, over a memory
-- connection instead of a socket (the product's test client, moonserve.test, without the
-- app's worker hooks). Returns a function(raw_request[, wait]) -> what the server wrote by
-- then, the loop turned for `wait` seconds (0) for parked handlers (sleep).
function helper.memory_server(app, limits)
    local t = require("moonserve.test").client(app, { limits = limits, start_hooks = false })
    return function(raw, wait)
        return (t:raw(raw, wait or 0))
    end
end

-- A way to declare a case that runs twice: state the first run leaves behind (a leak, a
-- cache it filled) shows in the second. Pass busted's `it`:
--   local twice = helper.twice(it); twice("does x", function() ... end)
function helper.twice(it)
    return function(name, fn)
        it(name, function()
            fn()
            fn()
        end)
    end
end

-- A loopback port nothing listens on now (for a peer a spec starts).
function helper.free_port()
    local s = assert(socket.bind("127.0.0.1", 0))
    local _, p = s:getsockname()
    s:close()
    return tonumber(p)
end

-- Starts the command `cmd` in the background, its output dropped; returns its PID.
function helper.background(cmd)
    local p = io.popen(cmd .. " >/dev/null 2>&1 & echo $!")
    local pid = p:read("*l")
    p:close()
    return pid
end

-- Stops what helper.background started: TERM, then KILL after 0.1 s.
function helper.stop_pid(pid)
    if pid then
        os.execute("kill " .. pid .. " 2>/dev/null")
        socket.sleep(0.1)
        os.execute("kill -9 " .. pid .. " 2>/dev/null")
    end
end

-- Starts Debian's nginx with the lua module in a temporary directory: one worker, no master,
-- on a free loopback port, with spec/fixtures on its Lua path and `http_extra` inside its http
-- block (a server with `listen 127.0.0.1:%d;` for the port, and `...` for the format's other
-- places); or a table { main = ..., http = ... } with lines for the main context too.
-- Returns { port, work, pid, log, stop }.
function helper.nginx_lua(http_extra, ...)
    local main = ""
    if type(http_extra) == "table" then
        main, http_extra = http_extra.main or "", http_extra.http
    end
    local nginx = helper.tool("nginx")
    local lua_mod = helper.tool("ngx_http_lua_module")
    local ndk = helper.tool("ndk_http_module")
    local port = helper.free_port()
    local work = helper.sh(helper.tool("mktemp") .. " -d"):gsub("%s+$", "")
    helper.write_file(work .. "/nginx.conf", string.format([[
load_module %s;
load_module %s;
worker_processes 1;
master_process off;
daemon off;
env MOONSERVE_SRC;
%spid %s/nginx.pid;
error_log %s/error.log warn;
events { worker_connections 64; }
http {
    access_log off;
    default_type text/plain;
    lua_package_path "%s/spec/fixtures/?.lua;%s/lua/?.lua;%s/lua/?/init.lua;/usr/share/lua/5.1/?.lua;;";
]], ndk, lua_mod, main, work, work, ROOT, ROOT, ROOT) .. string.format(http_extra, port, ...) .. "\n}\n")
    local p = io.popen(string.format("%s -p %s -c %s/nginx.conf >%s/out.log 2>&1 & echo $!",
        nginx, work, work, work))
    local pid = p:read("*l")
    p:close()
    local ngx = { port = port, work = work, pid = pid }
    function ngx.log()
        return read_file(work .. "/error.log")
    end
    function ngx.stop()
        os.execute("kill " .. pid .. " 2>/dev/null")
        os.execute("rm -rf " .. sh_quote(work))
    end
    if not helper.wait_for(function()
        local c = socket.connect("127.0.0.1", port)
        if c then
            c:close()
            return true
        end
    end) then
        local log = read_file(work .. "/error.log") .. read_file(work .. "/out.log")
        ngx.stop()
        error("nginx did not start: " .. log, 2)
    end
    return ngx
end

-- Serves the moonserve app file `opts.app` (absolute, or relative to the source root) from
-- Debian's nginx with its Lua module, through moonserve.openresty, as the guide shows:
-- opts.http for more of the http block (lua_shared_dict ...), opts.locations for more of the
-- server block, opts.init for init_worker's options (Lua source), opts.http2 to listen for
-- HTTP/2 with prior knowledge (and nothing else), opts.main for nginx.conf's main context
-- (thread_pool ...). Returns what
-- helper.nginx_lua does, with .port and :stop() as helper.spawn_server's server.
function helper.nginx_app(opts)
    local app = opts.app:sub(1, 1) == "/" and opts.app or ROOT .. "/" .. opts.app
    local conf = (opts.http or "") .. string.format([[
    init_by_lua_block { moonserve_app = dofile(%q) }
    init_worker_by_lua_block {
        require("moonserve.openresty").init_worker(moonserve_app, %s)
    }
    exit_worker_by_lua_block { require("moonserve.openresty").exit_worker(moonserve_app) }
    server {
        listen 127.0.0.1:@PORT@%s;
        client_max_body_size 64m;
        %s
        location / {
            content_by_lua_block { require("moonserve.openresty").run(moonserve_app) }
        }
    }]], app, opts.init or "nil", opts.http2 and " http2" or "", opts.locations or "")
    local n = helper.nginx_lua { main = opts.main,
        http = (conf:gsub("%%", "%%%%"):gsub("@PORT@", "%%d")) }
    -- (log and stop take no argument: srv:stop() and srv.stop() both do)
    return { port = n.port, pid = n.pid, work = n.work, log = n.log, stop = n.stop }
end

-- Waits up to 5 s for something to listen on loopback `port`; raises if nothing does.
function helper.wait_port(port)
    for _ = 1, 100 do
        local c = socket.connect("127.0.0.1", port)
        if c then
            c:close()
            return true
        end
        socket.sleep(0.05)
    end
    error("nothing listens on " .. port)
end

-- Writes `data` to the file at `path`.
function helper.write_file(path, data)
    local f = assert(io.open(path, "wb"))
    assert(f:write(data))
    f:close()
end

-- Runs a shell command that must succeed; returns its output.
function helper.sh(cmd)
    local out, status = helper.run(cmd)
    assert(status == 0, cmd .. " failed: " .. out)
    return out
end

-- Runs a request through `app` in-process (moonserve.test); returns status, headers (a
-- repeated field's last value), body. opts: host, headers, body, wait (seconds the reply
-- may take; what came by then is returned).
function helper.simulate(app, method, path, opts)
    opts = opts or {}
    local t = require("moonserve.test").client(app, { start_hooks = false })
    local r = t:request(method, path, { host = opts.host or "test", headers = opts.headers,
        body = opts.body, timeout = opts.wait, partial = opts.wait ~= nil })
    assert(r.status, "no response: " .. r.raw)
    r.headers["set-cookie"] = r.cookies[#r.cookies]
    return r.status, r.headers, r.body
end

-- Makes a CA (DIR/ca.pem, ca.key, its name `ca_name`) and a certificate it signed for
-- 127.0.0.1 alone, no DNS name (DIR/leaf.pem, leaf.key): what a test server speaks TLS with.
function helper.test_certs(dir, ca_name)
    local function openssl(args)
        return helper.sh(helper.tool("openssl") .. " " .. args .. " 2>&1")
    end
    local q = sh_quote
    openssl(string.format("req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
        .. "-keyout %s -out %s -days 2 -subj /CN=%s -addext "
        .. "basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign",
        q(dir .. "/ca.key"), q(dir .. "/ca.pem"), ca_name))
    openssl(string.format("req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
        .. "-keyout %s -out %s -subj /CN=127.0.0.1", q(dir .. "/leaf.key"),
        q(dir .. "/leaf.csr")))
    helper.write_file(dir .. "/leaf.ext", "subjectAltName=IP:127.0.0.1\n")
    openssl(string.format("x509 -req -in %s -CA %s -CAkey %s -CAcreateserial -days 2 "
        .. "-extfile %s -out %s", q(dir .. "/leaf.csr"), q(dir .. "/ca.pem"),
        q(dir .. "/ca.key"), q(dir .. "/leaf.ext"), q(dir .. "/leaf.pem")))
end

-- Starts Debian's redis-server on loopback `port` (a free one when nil), with no persistence
-- and its files in `dir` (a replica writes the primary's snapshot there; default /tmp), and
-- `args` more; waits until it listens. Returns its pid and port.
function helper.redis_server(port, args, dir)
    port = port or helper.free_port()
    local pid = helper.background(string.format("%s --port %d --bind 127.0.0.1 --save '' "
        .. "--appendonly no --daemonize no --dir %s %s", helper.tool("redis-server"), port,
        helper.sh_quote(dir or "/tmp"), args or ""))
    helper.wait_port(port)
    return pid, port
end

-- A RESP command to the Redis at `port` from the spec itself (not through moonserve); the
-- reply's text, a bulk reply whole.
function helper.redis_cmd(port, line)
    local c = assert(socket.connect("127.0.0.1", port))
    c:settimeout(2)
    assert(c:send(line .. "\r\n"))
    local head = assert(c:receive())
    local out = head
    if head:sub(1, 1) == "$" then
        out = assert(c:receive(tonumber(head:sub(2)) + 2))
    end
    c:close()
    return out
end

-- Runs fn with the JIT's trace log on; returns the log text.
function helper.jit_log(fn)
    local v = require "jit.v"
    local file = os.tmpname()
    -- From a clean slate: a trace made before, or the JIT left off by another spec, would
    -- leave nothing to log.
    jit.on()
    jit.flush()
    v.on(file)
    fn()
    v.off()
    local text = read_file(file)
    os.remove(file)
    return text
end

return helper
