-- spec/it/systemd_spec.lua: the master under systemd: readiness, reload and stop
-- notifications on NOTIFY_SOCKET, and listening sockets passed by socket activation.
local helper = require "helper"
local socket = require "socket"
local unix = require "socket.unix"

local children, wait_for = helper.children, helper.wait_for

local function get(port, path)
    return helper.request(port, "GET " .. path .. " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
end

-- A notification socket as systemd has one: a unix datagram socket at a path.
local function notify_socket()
    local path = os.tmpname()
    os.remove(path)
    local s = assert(unix.dgram())
    assert(s:bind(path))
    s:settimeout(10)
    return s, path
end

describe("moonserve under systemd", function()
    it("says READY=1 once its workers are, RELOADING=1 and READY=1 around a HUP, " ..
        "STOPPING=1 on TERM", function()
        local ns, path = notify_socket()
        local srv = helper.spawn_server { app = "spec/fixtures/app.lua", args = "--workers 2",
            env = { NOTIFY_SOCKET = path } }
        finally(function()
            srv:stop()
            ns:close()
            os.remove(path)
        end)
        assert.equal("READY=1\nSTATUS=serving with 2 workers", ns:receive())
        local workers = children(srv.pid)
        assert.equal(2, #workers)
        -- Only the master speaks for the service.
        for _, pid in ipairs(workers) do
            local env = "\0" .. helper.read_file("/proc/" .. pid .. "/environ")
            assert.is_nil(env:find("\0NOTIFY_SOCKET=", 1, true))
        end
        os.execute("kill -HUP " .. srv.pid)
        assert.equal("RELOADING=1", ns:receive())
        assert.equal("READY=1\nSTATUS=serving with 2 workers", ns:receive())
        -- By then the new workers serve.
        local now = children(srv.pid)
        assert.is_true(wait_for(function()
            now = children(srv.pid)
            return #now == 2 and now[1] ~= workers[1] and now[2] ~= workers[2]
        end))
        assert.equal(200, get(srv.port, "/pid").status)
        os.execute("kill -TERM " .. srv.pid)
        assert.equal("STOPPING=1", ns:receive())
    end)

    it("serves on the sockets systemd passes, from every worker", function()
        local s = assert(socket.bind("127.0.0.1", 0))
        local _, port = s:getsockname()
        s:close()
        local log = os.tmpname()
        -- systemd-socket-activate binds, and starts the server at the first connection, with
        -- only the environment it is told to pass on.
        local keep = {}
        for _, name in ipairs({ "PATH", "LUA_PATH", "LUA_CPATH", "MOONSERVE_CORE" }) do
            if os.getenv(name) then
                keep[#keep + 1] = "-E " .. name
            end
        end
        local p = io.popen(string.format("%s %s -l 127.0.0.1:%d %s %s --listen 127.0.0.1:%d " ..
            "--workers 2 >%s 2>&1 & echo $!", helper.tool("systemd-socket-activate"),
            table.concat(keep, " "), port,
            helper.sh_quote(helper.bin), helper.sh_quote(helper.root .. "/spec/fixtures/app.lua"),
            port, helper.sh_quote(log)))
        local pid = p:read("*l")
        p:close()
        finally(function()
            os.execute("kill -TERM " .. pid .. " 2>/dev/null")
            wait_for(function() return os.execute("kill -0 " .. pid .. " 2>/dev/null") ~= 0 end)
            os.remove(log)
        end)
        assert.is_true(wait_for(function()
            return helper.read_file(log):find("Listening on", 1, true) ~= nil
        end))
        -- Had the master bound the port itself, it would have failed: it is taken.
        local res = assert(get(tonumber(port), "/pid"))
        assert.equal(200, res.status, helper.read_file(log))
        assert.is_true(wait_for(function() return #children(pid) == 2 end))
        -- Both workers wait on the one socket, and which of them the kernel wakes first is
        -- its choice: while one worker is held in a handler, the other must take the
        -- connections.
        local started = os.tmpname()
        os.remove(started)
        local held = assert(socket.connect("127.0.0.1", tonumber(port)))
        held:settimeout(10)
        assert(held:send("GET /hold?ms=1500&started=" .. started ..
            " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"))
        assert.is_true(wait_for(function() return os.rename(started, started) ~= nil end))
        os.remove(started)
        local other = get(tonumber(port), "/pid")
        assert.equal(200, other.status)
        local reply = held:receive("*a")
        held:close()
        local holder = reply:match("\r\n\r\n(%d+)$")
        assert.is_not_nil(holder, reply)
        assert.are_not.equal(holder, other.body)
        for _, w in ipairs(children(pid)) do
            local env = "\0" .. helper.read_file("/proc/" .. w .. "/environ")
            assert.is_nil(env:find("\0LISTEN_FDS=", 1, true))
            assert.is_nil(env:find("\0LISTEN_PID=", 1, true))
        end
    end)
end)
