-- The app of bench/soak: a little of everything a site does, for half an hour of mixed
-- traffic: a hello, static files, a JSON body, a Redis counter, an indexed PostgreSQL
-- query, a WebSocket echo. REDIS_URL and DATABASE_URL name the servers the soak started.
local moonserve = require "moonserve"
local app = moonserve.app()

local redis = require("moonserve.redis").new(os.getenv("REDIS_URL"))
local db = moonserve.pg.new{ url = os.getenv("DATABASE_URL"), sslmode = "disable",
    pool_size = 16 }

app:get("/", function()
    return 200, "hello"
end)

app:static("/static", os.getenv("SOAK_STATIC"))

app:post("/echo", function(req, res)
    local body, err = req:json()
    if not body then
        return 400, tostring(err)
    end
    return res:json({ got = body })
end)

app:get("/redis", function()
    local n, err = redis:call("INCR", "soak:hits")
    if not n then
        return 503, tostring(err)
    end
    return 200, tostring(n)
end)

app:get("/pg", function(_, res)
    local rows, err = db:query("SELECT id, body FROM notes WHERE id = $1::int", math.random(1000))
    if not rows then
        return 503, tostring(err)
    end
    return res:json(rows[1])
end)

app:websocket("/ws", function(ws)
    while true do
        local data = ws:receive()
        if not data then
            return
        end
        ws:send(data)
    end
end)

return app
