-- bench/re_compare's moonserve side: bench/apps/re_loop.lua over moonserve.ngx.re.match.
local moonserve = require "moonserve"
local re = require "moonserve.ngx.re"

local app = moonserve.app()
local loop = dofile(os.getenv("RE_LOOP"))

app:get("/re", function(req, res)
    res:send(loop(re.match, tonumber(req.query.n) or 1000000))
end)

return app
