-- bench/shdict_compare's moonserve side: N operations on a shared dictionary in one handler;
-- answers "PID CPU-SECONDS START END" (the same loop as its nginx side; START and END are
-- the wall clock, so that the runner can tell two requests ran at the same time).
local ffi = require "ffi"
local moonserve = require "moonserve"

ffi.cdef [[
int getpid(void);
typedef struct { long tv_sec, tv_nsec; } bench_timespec;
int clock_gettime(int clk, bench_timespec *ts);
]]
local ts = ffi.new("bench_timespec")
local function wall()
    ffi.C.clock_gettime(0, ts) -- CLOCK_REALTIME, as nginx's ngx.now()
    return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local app = moonserve.app()
app:shared_dict("d", "16m")

app:get("/bench", function(req)
    local d = moonserve.shared.d
    local n, op = tonumber(req.query.n), req.query.op
    d:set("k", "value-0123456789")
    local w0, t0 = wall(), os.clock()
    if op == "get" then
        for _ = 1, n do
            d:get("k")
        end
    else
        for _ = 1, n do
            d:incr("n", 1, 0)
        end
    end
    local cpu = os.clock() - t0
    return 200, string.format("%d %.6f %.3f %.3f", ffi.C.getpid(), cpu, w0, wall())
end)

return app
