-- probe.lua: sends N requests one after another, each on a new connection, and prints the
-- p50 and p99 latency (ms) of those answered 200, and how many were refused (503).
--   luajit bench/probe.lua PORT N PATH
local socket = require "socket"
local port, n, path = tonumber(arg[1]), tonumber(arg[2]) or 400, arg[3] or "/work"

local ok_times, refused = {}, 0
for _ = 1, n do
    local t0 = socket.gettime()
    local s = socket.tcp()
    s:settimeout(10)
    if s:connect("127.0.0.1", port) then
        s:send("GET " .. path .. " HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
        local line = s:receive("*l") or ""
        s:receive("*a")
        local code = line:match("^HTTP/1%.1 (%d+)")
        if code == "200" then
            ok_times[#ok_times + 1] = (socket.gettime() - t0) * 1000
        elseif code == "503" then
            refused = refused + 1
        end
    end
    s:close()
end
table.sort(ok_times)
local function pct(p)
    return ok_times[math.max(1, math.ceil(#ok_times * p))] or 0 / 0
end
print(("admitted %d refused %d p50 %.2f ms p99 %.2f ms"):format(#ok_times, refused, pct(0.5),
    pct(0.99)))
