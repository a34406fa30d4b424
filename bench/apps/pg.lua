-- pg.lua: the app bench/pg_compare runs on moonserve: one indexed SELECT a request through
-- moonserve.pg's pool (PG_PORT names the server), the row as JSON.
local moonserve = require "moonserve"

local app = moonserve.app()
local db = moonserve.pg.new{ host = "127.0.0.1", port = tonumber(os.getenv("PG_PORT")),
    user = "bench", database = "bench", sslmode = "disable", pool_size = 32 }
local rows_count = tonumber(os.getenv("PG_ROWS"))

app:get("/note", function(_, res)
    local rows = assert(db:query("SELECT id, author, body FROM notes WHERE id = $1::int",
        math.random(rows_count)))
    res:json(rows[1])
end)

return app
