-- openresty.lua: the app bench/openresty_compare serves inside nginx through
-- moonserve.openresty and on the moonserve server: the framework's hello and a :param route.
local moonserve = require "moonserve"
local app = moonserve.app()

app:get("/", function(_, res)
    res:send("hello world")
end)

app:get("/users/:id", function(req, res)
    res:json({ id = req.params.id })
end)

return app
