-- bench/redis_dict_compare's (and bench/redis_counts dict's) moonserve side: a shared
-- dictionary on Redis, one get or one incr a request; and a rate-limited request, counted in
-- a local shared dictionary (/limit) or in Redis for a fleet (/limitfleet), by the client's
-- address, under limits never reached (the RateLimit fields on each reply).
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

local redis_url = "redis://127.0.0.1:" .. os.getenv("REDIS_PORT")
app:get("/limit", moonserve.ratelimit { limit = 65536, window = 0.25, name = "local" },
    function(_, res) res:send("ok") end)
app:get("/limitfleet", moonserve.ratelimit { limit = 100000, window = 1, name = "fleet",
    fleet = redis_url }, function(_, res) res:send("ok") end)

return app
