-- hash.lua: the app bench/hash_loop runs: a cheap route, and argon2id hashes at the
-- defaults computed on the thread pool (moonserve.password) or on the worker's loop.
local moonserve = require "moonserve"
local argon2 = require "moonserve.argon2"
local password = require "moonserve.password"

local app = moonserve.app()

app:get("/fast", function(_, res)
    res:send("ok")
end)

app:get("/hash_pool", function(_, res)
    res:send(assert(password.hash("correct horse battery staple")))
end)

app:get("/hash_loop", function(_, res)
    local d = password.defaults
    res:send(argon2.hash("correct horse battery staple", d.t, d.m, d.p))
end)

return app
