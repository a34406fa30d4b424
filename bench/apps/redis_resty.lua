-- bench/redis_compare's moonserve side with `resty` (the default): the handler nginx runs,
-- word for word, on moonserve's ngx layer: Debian's lua-resty-redis, unchanged.
local moonserve = require "moonserve"
require "moonserve.ngx"

local app = moonserve.app()
local port = tonumber(os.getenv("REDIS_PORT"))

app:ngx_content("/redis", function()
    local redis = require "nginx.redis"
    local red = redis:new()
    red:set_timeout(1000)
    assert(red:connect("127.0.0.1", port))
    local value = assert(red:get("key"))
    red:set_keepalive(10000, 32)
    ngx.print(value)
end)

return app
