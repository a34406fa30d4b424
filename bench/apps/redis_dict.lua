-- bench/redis_dict_compare's (and bench/redis_counts dict's) moonserve side: a shared
-- dictionary on Redis, one get or one incr a request.
local moonserve = require "moonserve"

local app = moonserve.app()
app:shared_dict("bench", { redis = "redis://127.0.0.1:" .. os.getenv("REDIS_PORT"),
    prefix = "dict:", pool_size = 32 })

app:get("/redis", function(_, res)
    res:send((assert(moonserve.shared.bench:get("key"))))
end)

app:get("/incr", function(_, res)
    res:send(tostring(assert(moonserve.shared.bench:incr("hits", 1, 0))))
end)

return app
