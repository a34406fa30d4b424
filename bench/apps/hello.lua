-- hello.lua: the app bench/compare, bench/idle and bench/syscalls run on moonserve.
-- The same replies as the peers: an 11-byte text body, a small JSON object built per
-- request, and the generated files under /static (from BENCH_STATIC_DIR).
local moonserve = require "moonserve"
local app = moonserve.app()

app:get("/", function(req, res)
    res:send("hello world")
end)

app:get("/json", function(req, res)
    res:json({ message = "hello world", n = 42 })
end)

-- A build without app:static still runs the other cases; compare's check then reports
-- the static cells as n/a with the status it got.
local static_dir = os.getenv("BENCH_STATIC_DIR")
if static_dir and static_dir ~= "" and app.static then
    app:static("/static", static_dir)
end

-- BENCH_LIVE_MB=N: the app keeps about N MB of Lua tables, as an app with a larger live heap,
-- whose collections free more a cycle.
local live_mb = tonumber(os.getenv("BENCH_LIVE_MB"))
if live_mb then
    local keep = {}
    for i = 1, live_mb * 1024 * 1024 / 80 do
        keep[i] = { i }
    end
    package.loaded["bench.live"] = keep
end

return app
