-- bench/shdict_compare's moonserve side: N operations on a shared dictionary in one handler;
-- answers "PID CPU-SECONDS" (the same loop as its nginx side).
local ffi = require "ffi"
local moonserve = require "moonserve"

ffi.cdef "int getpid(void);"

local app = moonserve.app()
app:shared_dict("d", "16m")

app:get("/bench", function(req)
    local d = moonserve.shared.d
    local n, op = tonumber(req.query.n), req.query.op
    d:set("k", "value-0123456789")
    local t0 = os.clock()
    if op == "get" then
        for _ = 1, n do
            d:get("k")
        end
    else
        for _ = 1, n do
            d:incr("n", 1, 0)
        end
    end
    return 200, string.format("%d %.6f", ffi.C.getpid(), os.clock() - t0)
end)

return app
