-- bench/redis_compare's moonserve side: one Redis GET a request through the worker's pool,
-- spoken in RESP by hand (the `ngx` layer, which runs lua-resty-redis itself, comes later).
local moonserve = require "moonserve"

local app = moonserve.app()
local port = tonumber(os.getenv("REDIS_PORT"))
local GET = "*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n"

app:get("/redis", function(_, res)
    local sock = moonserve.socket.tcp()
    sock:settimeout(1000)
    assert(sock:connect("127.0.0.1", port))
    assert(sock:send(GET))
    local line = assert(sock:receive())
    local value = assert(sock:receive(tonumber(line:sub(2)) + 2)):sub(1, -3)
    sock:setkeepalive(10000, 32)
    res:send(value)
end)

return app
