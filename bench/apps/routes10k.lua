-- routes10k.lua: the app bench/metrics_scrape runs: 10,000 named routes (ROUTES to change
-- it), each answering "ok", so that a scrape holds a series for every one.
local moonserve = require "moonserve"
local app = moonserve.app()

local n = tonumber(os.getenv("ROUTES")) or 10000
for i = 1, n do
    app:get("r" .. i, "/r/" .. i, function(_, res)
        res:send("ok")
    end)
end

return app
