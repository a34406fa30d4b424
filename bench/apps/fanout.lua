-- fanout.lua: the app bench/fanout_compare runs: every socket of /ws subscribes to one
-- channel, through the Redis of FANOUT_REDIS when it is set (several instances), else within
-- the instance; POST /publish publishes its body to it.
local moonserve = require "moonserve"
local app = moonserve.app()

local room = app:channel("room", { redis = os.getenv("FANOUT_REDIS"), size = "4m" })

app:get("/", function(_, res)
    res:send("hello world")
end)

-- Callbacks: an idle socket parks no coroutine.
app:websocket("/ws", {
    open = function(ws)
        assert(room:subscribe(ws))
    end,
})

app:post("/publish", function(req, res)
    assert(room:publish(req:body()))
    res:send("ok")
end)

return app
