-- bench/limits: what a rate limit and a Redis session cost a request. /free answers alone;
-- /local and /fleet pass one limit each (never reached: 131,072 and 10^6 a second), on a shared dictionary
-- and in Redis (REDIS_URL); /cs/me reads a session from its cookie and /rs/me one from Redis,
-- after /cs/login and /rs/login (POST) made them. /noop passes one middleware that does
-- nothing: what any middleware costs.
local moonserve = require "moonserve"
local session = require "moonserve.session"
local app = moonserve.app()
local url = assert(os.getenv("REDIS_URL"), "REDIS_URL")
local secret = string.rep("b", 32)

app:get("/free", function() return "ok\n" end)
app:get("/noop", function(_, _, next) return next() end, function() return "ok\n" end)
app:get("/local", moonserve.ratelimit { limit = 65536, window = 0.5, name = "local" },
    function() return "ok\n" end)
app:get("/fleet", moonserve.ratelimit { limit = 1000000, window = 1, name = "fleet",
    fleet = url }, function() return "ok\n" end)

local function me(req)
    local user = req.session:get("user")
    return user and (user.name .. "\n") or "nobody\n"
end
local function login(req, res)
    req.session:set("user", { id = 1, name = "ada" })
    return res:send("in\n")
end
app:group("/cs", function(g)
    g:use(moonserve.sessions { secret = secret, name = "cs" })
    g:get("/me", me)
    g:post("/login", login, { csrf = false })
end)
app:group("/rs", function(g)
    g:use(moonserve.sessions { secret = secret, name = "rs",
        store = session.redis_store(url) })
    g:get("/me", me)
    g:post("/login", login, { csrf = false })
end)
return app
