-- dispatch_bench.lua: keep-alive GETs through the engine and the Lua dispatch of a hello
-- handler, in-process over the memory transport (no socket). For callgrind, like
-- engine_bench.c: two counts, the difference divided.
--   luajit bench/dispatch_bench.lua N [PIPELINE] [framework|raw]   (or MODE=...)
local n = tonumber(arg[1]) or 100000
local pipeline = tonumber(arg[2]) or 1
local mode = arg[3] or os.getenv("MODE") or "framework"

local moonserve = require "moonserve"
local server = require "moonserve.server"

local app
if mode == "raw" then
    -- The dispatcher alone: an app object whose handle() answers directly.
    app = { handle = function(_, _, res) res:send("hello world") end }
else
    app = moonserve.app()
    app:get("/", function(_, res) res:send("hello world") end)
end

local srv = server.create(app, { requests_per_connection = 1e9 })
local conn = srv:memconn()
local req = "GET / HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"
local batch = req:rep(pipeline)
local bytes = 0
for _ = 1, n, pipeline do
    local out = conn:feed(batch)
    bytes = bytes + #out
end
conn:close()
print(("%d requests, %d bytes out (%s)"):format(n, bytes, mode))
