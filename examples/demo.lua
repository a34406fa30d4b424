-- The demo site `moonserve` serves when given no app: one page that shows what moonserve
-- does. Its stylesheet and script are static files the core serves (demo/static), the page
-- is a template with a layout (demo/views), a session remembers the visitor, the guestbook
-- is a form with a CSRF token, /api/status is JSON with live numbers from the metrics, and
-- a WebSocket carries a shared counter and a chat to every tab on every worker (a channel),
-- and with a Redis (redis_url, or REDIS_URL) on every instance.
local cjson = require "cjson.safe"
local moonserve = require "moonserve"

-- Next to this file (examples/ in the source tree, moonserve/ where the rock installs it).
local here = (debug.getinfo(1, "S").source:match("^@(.*/)[^/]*$") or "./") .. "demo/"

-- Sessions and form tokens are signed with a secret every worker must share: in
-- development (the default) one the master draws once and keeps across reloads; elsewhere a
-- file (secrets_dir, or systemd's LoadCredential=) or MOONSERVE_SECRET_SESSION.
local secret = moonserve.secret("session")

local app = moonserve.app()
-- Everything the page uses comes from this server: scripts, styles, images and the
-- WebSocket from its own origin, nothing else (no inline script or style).
app:security {
    csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        .. "connect-src 'self'; form-action 'self'; base-uri 'none'",
}
app:use(moonserve.sessions { secret = secret })
app:use(moonserve.csrf { secret = secret })
app:views { root = here .. "views" }
app:static("/static", here .. "static", { cache_control = "public, max-age=300" })
app:get("metrics", "/metrics", moonserve.metrics.handler)

local started = os.time()

-- The guestbook and the counter live in a dictionary every worker shares: post N under
-- "post:N", the number from one atomic incr, so two workers posting at once never take the
-- same slot.
app:shared_dict("demo", "1m")
local KEEP = 8 -- posts shown, newest first

-- Across instances: given a Redis (the setting redis_url of the configuration, or REDIS_URL),
-- the counter lives in Redis and the live channel goes through it, so that the tabs of every
-- instance see one counter and one chat. Without one, all of it stays in this instance.
local redis_url = moonserve.config.redis_url or os.getenv("REDIS_URL")
local redis = redis_url and assert(require("moonserve.redis").new(redis_url, { timeout = 0.5 }))

-- The live page's channel: what one tab sends reaches every tab, whichever worker (and with
-- Redis, whichever instance) holds it.
local live = app:channel("live", { history = 256, size = "512k", redis = redis or nil })

-- The counter: one INCR in Redis, or the dictionary's incr; should Redis be away, the
-- instance counts on by itself until it comes back.
local function count()
    if redis then
        local n = redis:call("GET", "moonserve:demo:count")
        if n then
            return tonumber(n) or 0
        end
    end
    return moonserve.shared.demo:get("count") or 0
end

local function count_up()
    if redis then
        local n = redis:call("INCR", "moonserve:demo:count")
        if n then
            return n
        end
    end
    return moonserve.shared.demo:incr("count", 1, 0)
end

-- `s` cut to at most `n` bytes, never inside a UTF-8 sequence.
local function cut(s, n)
    local i = math.min(#s, n)
    while i > 0 and i < #s and s:byte(i + 1) >= 0x80 and s:byte(i + 1) < 0xC0 do
        i = i - 1
    end
    return s:sub(1, i)
end

local function guestbook()
    local book = moonserve.shared.demo
    local last = book:get("seq") or 0
    local posts = {}
    for n = last, math.max(1, last - KEEP + 1), -1 do
        posts[#posts + 1] = book:get("post:" .. n)
    end
    return posts, last
end

app:get("home", "/", function(req, res)
    local s = req.session
    local visits = (s:get("visits") or 0) + 1
    s:set("visits", visits)
    local posts, signatures = guestbook()
    return res:render("index.html", {
        title = "moonserve",
        version = moonserve._VERSION,
        client = req.client_ip,
        request = req.id,
        worker = moonserve.worker.id(),
        workers = moonserve.worker.count(),
        visits = visits,
        name = s:get("name"),
        posts = posts,
        signatures = signatures,
        count = count(),
        error = req.query.error,
    })
end)

app:get("status", "/api/status", function(req, res)
    local totals = moonserve.metrics.totals() or {}
    local ch = live:stats()
    res:header("cache-control", "no-store")
    return res:json {
        server = "moonserve",
        version = moonserve._VERSION,
        uptime = os.time() - started,
        request = req.id,
        worker = moonserve.worker.id(),
        workers = moonserve.worker.count(),
        requests = totals.requests,
        connections = totals.connections,
        in_flight = totals.in_flight,
        bytes_out = totals.bytes_out,
        live = { published = ch.published, lost = ch.lost, here = ch.subscribers },
        signatures = select(2, guestbook()),
        count = count(),
        fleet = redis ~= nil,
    }
end)

app:post("sign", "/guestbook", function(req, res)
    local form, err = req:form()
    if not form then
        return res:status(400):send(err)
    end
    local name = type(form.name) == "string" and cut((form.name:gsub("%s+", " ")), 60) or ""
    if name:match("^ ?$") then
        return res:redirect("/?error=name#guestbook", 303)
    end
    local book = moonserve.shared.demo
    local n = assert(book:incr("seq", 1, 0))
    book:set("post:" .. n, name)
    book:delete("post:" .. (n - KEEP))
    req.session:set("name", name)
    -- Post/redirect/get: a reload does not post twice.
    return res:redirect("/#guestbook", 303)
end)

-- The live socket: {"op":"inc"} adds one to the shared counter, {"op":"say","text":...}
-- says something in the chat; both go to everyone as {"count":N} or {"say":...,"from":...}.
-- The first message tells the tab its worker and the counter.
app:websocket("/live", function(ws, req)
    local worker = moonserve.worker.id()
    local who = req.session:get("name") or "guest"
    ws:send(cjson.encode { hello = true, worker = worker, count = count() })
    live:subscribe(ws)
    while true do
        local data, kind = ws:receive()
        if not data or kind == "close" then
            return
        end
        local m = cjson.decode(data)
        if type(m) == "table" and m.op == "inc" then
            local n = count_up()
            live:publish(cjson.encode { count = n, worker = worker })
        elseif type(m) == "table" and m.op == "say" and type(m.text) == "string" then
            local text = cut((m.text:gsub("%s+", " ")), 200)
            if not text:match("^ ?$") then
                live:publish(cjson.encode { say = text, from = who, worker = worker })
            end
        end
    end
end, { max_message_bytes = 4096 })

app:get("slow", "/slow", function(_, res)
    local t0 = os.clock()
    moonserve.sleep(1)
    return res:render("slow.html", { title = "slow", version = moonserve._VERSION,
        cpu_ms = ("%.1f"):format((os.clock() - t0) * 1000) })
end)

app:get("/hello", function()
    return 200, "hello world"
end)

return app
