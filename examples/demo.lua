-- The demo site `moonserve` serves when given no app: a page, a JSON endpoint, a form that
-- posts back, and a slow route that shows one waiting handler does not hold up the others.
local moonserve = require "moonserve"
local codec = require "moonserve.codec"

local app = moonserve.app()
-- The guestbook takes posts from this site's own pages only: cross-site POSTs get 403 from
-- every app's default origin check.
local esc = codec.escape_html
local started = os.time()

-- The guestbook lives in a dictionary every worker shares: post N under "post:N", the
-- number from one atomic incr, so two workers posting at once never take the same slot.
app:shared_dict("guestbook", "1m")
local KEEP = 10 -- posts shown, newest first

local function guestbook()
    local book = moonserve.shared.guestbook
    local last = book:get("seq") or 0
    local posts = {}
    for n = last, math.max(1, last - KEEP + 1), -1 do
        posts[#posts + 1] = book:get("post:" .. n)
    end
    return posts, last
end

local STYLE = [[
:root { color-scheme: light dark; --accent: #6b5bd6; --muted: #8a8a99; }
* { box-sizing: border-box; }
body { margin: 0; font: 16px/1.55 system-ui, -apple-system, "Segoe UI", sans-serif;
  background: Canvas; color: CanvasText; }
header { padding: 3rem max(1.5rem, calc((100% - 52rem) / 2 + 1.5rem)) 2rem;
  background: linear-gradient(135deg, #2b2350, #6b5bd6); color: #fff; }
header h1 { margin: 0; font-size: 2.4rem; letter-spacing: -0.02em; }
header p { margin: .4rem 0 0; opacity: .85; }
main { max-width: 52rem; margin: 0 auto; padding: 1.5rem; display: grid; gap: 1.2rem;
  grid-template-columns: repeat(auto-fit, minmax(15rem, 1fr)); }
section { border: 1px solid color-mix(in srgb, CanvasText 15%, transparent);
  border-radius: .8rem; padding: 1.1rem 1.3rem; }
h2 { margin: 0 0 .5rem; font-size: 1.1rem; }
code, pre { font: .9em ui-monospace, "SFMono-Regular", Menlo, monospace; }
pre { margin: .6rem 0 0; padding: .7rem; border-radius: .5rem; white-space: pre-wrap;
  overflow-wrap: break-word; font-size: .82em;
  background: color-mix(in srgb, CanvasText 7%, transparent); }
a { color: var(--accent); }
form { display: flex; gap: .5rem; }
input, button { font: inherit; padding: .45rem .6rem; border-radius: .45rem;
  border: 1px solid var(--muted); }
input { flex: 1; min-width: 0; }
button { background: var(--accent); color: #fff; border: 0; cursor: pointer; }
ul { padding-left: 1.1rem; margin: .6rem 0 0; }
.muted { color: var(--muted); font-size: .9rem; }
footer { text-align: center; padding: 1rem; color: var(--muted); font-size: .85rem; }
]]

local function page(title, body)
    return ([[<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>%s</title><style>%s</style></head>
<body>%s<footer>moonserve %s &middot; C core, Lua site</footer></body></html>
]]):format(esc(title), STYLE, body, moonserve._VERSION)
end

app:get("/", function(req, res)
    local items = {}
    for i, entry in ipairs((guestbook())) do
        items[i] = "<li>" .. esc(entry) .. "</li>"
    end
    local book = #items > 0 and ("<ul>" .. table.concat(items) .. "</ul>")
        or '<p class="muted">Nobody has signed yet.</p>'
    res:header("content-type", "text/html; charset=utf-8")
    res:send(page("moonserve", ([[
<header><h1>moonserve</h1>
<p>A Lua-scriptable web server: the hot path in C, your site in Lua.</p></header>
<main>
<section><h2>Hello, %s</h2>
<p>This page came from a Lua handler. Request <code>%s</code>.</p>
<pre>app:get("/", function(req, res)
  res:send("hello world")
end)</pre></section>
<section><h2>JSON</h2>
<p><a href="/api/status">/api/status</a> answers with <code>res:json{...}</code>.</p>
<pre>curl localhost:8080/api/status</pre></section>
<section><h2>Sign the guestbook</h2>
<form method="post" action="/guestbook">
<input name="name" placeholder="your name" maxlength="60" required>
<button>Sign</button></form>%s</section>
<section><h2>A slow route</h2>
<p><a href="/slow">/slow</a> sleeps one second with <code>moonserve.sleep(1)</code>.
Open it and reload this page meanwhile: the worker keeps serving.</p></section>
</main>]]):format(esc(req.client_ip), esc(req.id), book)))
end)

app:get("/api/status", function(req, res)
    res:json {
        server = "moonserve",
        version = moonserve._VERSION,
        uptime = os.time() - started,
        request = req.id,
        signatures = select(2, guestbook()),
    }
end)

app:post("/guestbook", function(req, res)
    local form, err = req:form()
    if not form then
        return res:status(400):send(err)
    end
    local name = type(form.name) == "string" and form.name:gsub("%s+", " "):sub(1, 60) or ""
    if name == "" or name == " " then
        return res:status(422):send("A name, please.\n")
    end
    local book = moonserve.shared.guestbook
    local n = assert(book:incr("seq", 1, 0))
    book:set("post:" .. n, name)
    book:delete("post:" .. (n - KEEP))
    -- Post/redirect/get: a reload does not post twice.
    res:redirect("/", 303)
end)

app:get("/slow", function(_, res)
    local t0 = os.clock()
    moonserve.sleep(1)
    res:header("content-type", "text/html; charset=utf-8")
    res:send(page("slow", ([[<header><h1>That took a second</h1>
<p>This handler slept for one second; it used %.1f ms of CPU.</p></header>
<main><section><p><a href="/">Back</a></p></section></main>]]):format((os.clock() - t0) * 1000)))
end)

app:get("/hello", function()
    return 200, "hello world"
end)

return app
