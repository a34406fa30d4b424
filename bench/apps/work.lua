-- work.lua: the app bench/overload runs: each request waits 5 ms, as if on a backend.
local moonserve = require "moonserve"
local app = moonserve.app()

app:get("/work", function(req, res)
    moonserve.sleep(0.005)
    res:send("done")
end)

return app
