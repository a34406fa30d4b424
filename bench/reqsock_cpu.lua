-- reqsock_cpu.lua: the server's CPU for ngx.req.socket line and pattern reads that hold a
-- whole body without a line feed (a raw socket's reads hold the same way). Starts moonserve
-- (one process) with a handler that reads the body with receive("*l") and with
-- receiveuntil("\r\n--b") whole, posts bodies of 1.75 MiB and 7 MiB, and prints the
-- server's user+system CPU time per request, from /proc/PID/stat: its clock ticks are 10 ms,
-- so the mean over REQS requests (default 20), not one request's. /pieces reads the same
-- bodies with the pattern iterator in 8 KiB pieces, as lua-resty-upload reads a part.
--   MOONSERVE_SRC=. LUA_PATH='lua/?.lua;lua/?/init.lua;;' MOONSERVE_CORE=build/modules/core.so \
--     luajit bench/reqsock_cpu.lua
local socket = require "socket"

local ROOT = os.getenv("MOONSERVE_SRC") or "."
local app = os.tmpname()
local f = assert(io.open(app, "w"))
f:write([[
local moonserve = require "moonserve"
require "moonserve.ngx"
local app = moonserve.app()
app:ngx_content("/line", function()
    local sock = assert(ngx.req.socket())
    local line, err, partial = sock:receive()
    ngx.say(line and #line or err .. " " .. #partial)
end)
app:ngx_content("/until", function()
    local sock = assert(ngx.req.socket())
    local data, err, partial = sock:receiveuntil("\r\n--b")()
    ngx.say(data and #data or err .. " " .. #partial)
end)
app:ngx_content("/pieces", function()
    local sock = assert(ngx.req.socket())
    local it, n = sock:receiveuntil("\r\n--b"), 0
    while true do
        local data, err, partial = it(8192)
        if not data then
            ngx.say(err and err .. " " .. n + #partial or n)
            return
        end
        n = n + #data
    end
end)
return app
]])
f:close()

local log = os.tmpname()
local p = io.popen(string.format("%s/lua/bin/moonserve %s --listen 127.0.0.1:0 --workers 0 "
    .. "--limit body_bytes=16777216 >%s 2>&1 & echo $!", ROOT, app, log))
local pid = p:read("*l")
p:close()
local port
for _ = 1, 100 do
    local l = io.open(log):read("*a")
    port = l:match("listening on https?://[^ ]+:(%d+)/")
    if port then break end
    socket.sleep(0.05)
end
assert(port, "the server did not start")

local CLK = 100 -- sysconf(_SC_CLK_TCK) on Linux
local function cpu()
    local s = io.open("/proc/" .. pid .. "/stat"):read("*a")
    local fields = {}
    for x in s:match("%) (.*)"):gmatch("%S+") do fields[#fields + 1] = x end
    return (tonumber(fields[12]) + tonumber(fields[13])) / CLK -- utime, stime
end

local function post(path, body)
    local c = assert(socket.connect("127.0.0.1", tonumber(port)))
    c:send("POST " .. path .. " HTTP/1.1\r\nHost: b\r\nConnection: close\r\nContent-Length: "
        .. #body .. "\r\n\r\n")
    for i = 1, #body, 65536 do
        assert(c:send(body, i, math.min(i + 65535, #body)))
    end
    local out = c:receive("*a")
    c:close()
    return out
end

local REQS = tonumber(os.getenv("REQS") or "") or 20
for _, path in ipairs { "/line", "/until", "/pieces" } do
    for _, mib in ipairs { 1.75, 7 } do
        local body = ("x"):rep(math.floor(mib * 1048576))
        post(path, body) -- the handler's traces are recorded outside the count
        local c0 = cpu()
        for _ = 1, REQS do
            post(path, body)
        end
        print(string.format("%-7s %5.2f MiB: %6.1f ms of server CPU a request (mean of %d)",
            path, mib, (cpu() - c0) * 1000 / REQS, REQS))
    end
end
os.execute("kill " .. pid)
os.remove(app)
os.remove(log)
