-- A notes board, the moonserve way: members sign up and log in (argon2id off the loop,
-- sessions, CSRF, flash messages), post notes kept in PostgreSQL (moonserve.pg, migrations in
-- migrations/), see everyone's new notes live on every worker (a channel, over server-sent
-- events with replay and over a WebSocket), upload an avatar, and reach it all from a JSON
-- API under /api (validation, one error shape, pagination, CORS). See README.md.
local moonserve = require "moonserve"
local json = moonserve.json

-- Next to this file: views/, static/, migrations/ and config.lua.
local here = debug.getinfo(1, "S").source:match("^@(.*/)[^/]*$") or "./"

local config = moonserve.config
-- Sessions and CSRF tokens are signed with one secret that every worker shares: drawn by
-- the master in development; elsewhere a file in secrets_dir, systemd's credentials or
-- MOONSERVE_SECRET_SESSION (docs/guide/configuration.md).
local secret = moonserve.secret("session")

-- No I/O here: each worker's pool connects at its first query. (DATABASE_URL, when set,
-- is database_url: the configuration reads it.) Production declares it empty: say so at
-- the start (and in --check) rather than at the first request.
if (config.database_url or "") == "" then
    error("database_url is not set in the " .. moonserve.env .. " environment: set "
        .. "DATABASE_URL (or database_url in config.lua)", 0)
end
local db = moonserve.pg.new { url = config.database_url,
    pool_size = config.pool_size, application_name = "board" }

local app = moonserve.app()

-- Everything the pages use comes from this origin; no inline script or style.
app:security {
    csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        .. "connect-src 'self'; form-action 'self'; base-uri 'none'",
    -- the pages of cors_origins may write to /api with the member's cookie (their token too)
    csrf = { origins = config.cors_origins },
}

-- The core's own refusals, in the API's shape for a script and in HTML for a browser; the
-- core answers them without entering Lua.
for status, text in pairs {
    [400] = "Bad request", [408] = "The request came too slowly",
    [413] = "That is too large", [414] = "That address is too long",
    [431] = "The request's header is too large", [503] = "Busy, please try again",
} do
    app:refusal_body(status, {
        json = json.encode { error = { status = status, message = text } },
        html = "<!doctype html><title>" .. status .. "</title><h1>" .. text .. "</h1>",
        text = text .. "\n",
    })
end

-- CORS for the API only: the pages of cors_origins may read its replies, with cookies.
local cors = moonserve.cors { origins = config.cors_origins, credentials = true,
    max_age = 600 }
app:use(function(req, res, next)
    if req.path:sub(1, 5) == "/api/" then
        return cors(req, res, next)
    end
    return next()
end)
app:use(moonserve.sessions { secret = secret })
app:use(moonserve.csrf { secret = secret, trusted_origins = config.cors_origins })
app:views { root = here .. "views" }
app:static("/static", here .. "static", { cache_control = "public, max-age=300" })

-- New notes and deletions reach every page on every worker through this channel; its ring
-- keeps the last 512 so that a page that reconnects gets what it missed.
local live = app:channel("notes", { history = 512, size = "1m" })

-- -- Errors: JSON under /api (or for a client that asks for JSON), a page elsewhere ---------
-- (403 includes the cross-site refusal and moonserve.csrf's, whose info.reason says why.)

local function wants_json(req)
    return req.path:sub(1, 5) == "/api/"
        or (req:header("accept") or ""):find("application/json", 1, true) ~= nil
end

for _, status in ipairs { 403, 404, 405, 500 } do
    app:error_page(status, function(req, res, info)
        if wants_json(req) then
            return res:error_json(status, info.reason, info.ref and { ref = info.ref } or nil)
        end
        return res:status(status):render("error.html", { title = tostring(status),
            status = status, ref = info.ref, user = false })
    end)
end

-- -- Members -------------------------------------------------------------------------------

-- A route's :id as a row id: digits only (at most 15, within a double's exact integers), or
-- 0, which no row has ("1e9", "-1", "0x10" and "inf" are no ids).
local function id_param(req)
    local s = req.params.id
    return s:match("^%d%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?$") and tonumber(s) or 0
end

local function current_user(req)
    return req.session:get("user")
end

-- Route middleware: a member must be logged in.
local function member(req, res, next)
    local user = current_user(req)
    if not user then
        if wants_json(req) then
            return res:error_json(401, "log in first")
        end
        req.session:flash("error", "Log in first.")
        return res:redirect("/login", 303)
    end
    req.ctx.user = user
    return next()
end

local credentials = moonserve.validate {
    name = { "string", required = true, min_len = 3, max_len = 32,
        pattern = "^[%w_.%-]+$" },
    password = { "string", required = true, min_len = 8, max_len = 200 },
}

local NAME_RULE = "3 to 32 letters, digits, '.', '_' or '-'"

-- A hash to verify against when the name is unknown, so that a log-in takes as long
-- whether the name exists or not (made once per worker, at the first such log-in).
local decoy

local function page(res, view, vars, status)
    vars.title = vars.title or "board"
    return res:status(status or 200):render(view, vars)
end

app:get("signup", "/signup", function(req, res)
    return page(res, "signup.html", { title = "Sign up", user = current_user(req),
        flashes = req.session:flashes(), errors = {}, name = "", open = config.signup_open })
end)

app:post("/signup", function(req, res)
    local form, err = req:form()
    if not form then
        return res:status(400):send(err)
    end
    if not config.signup_open then
        return res:status(403):send("sign-up is closed\n")
    end
    local data, errors = credentials(form)
    if errors then
        if errors.name == "does not match the expected format" then
            errors.name = NAME_RULE
        end
        return page(res, "signup.html", { title = "Sign up", errors = errors, open = true,
            name = type(form.name) == "string" and form.name or "", flashes = {} }, 422)
    end
    local hash, herr = moonserve.password.hash(data.password)   -- on the thread pool
    if not hash then
        error(herr)
    end
    local rows, qerr = db:query("INSERT INTO users (name, password_hash) VALUES ($1, $2) "
        .. "RETURNING id, name", data.name, hash)
    if not rows then
        if qerr.code == "23505" then -- unique_violation: the name is taken
            return page(res, "signup.html", { title = "Sign up", open = true, flashes = {},
                errors = { name = "that name is taken" }, name = data.name }, 422)
        end
        error(qerr)
    end
    req.session:regenerate()
    req.session:set("user", { id = rows[1].id, name = rows[1].name })
    req.session:flash("notice", "Welcome, " .. rows[1].name .. "!")
    return res:redirect("/", 303)
end)

app:get("login", "/login", function(req, res)
    return page(res, "login.html", { title = "Log in", user = current_user(req),
        flashes = req.session:flashes(), name = "" })
end)

app:post("/login", function(req, res)
    local form, err = req:form()
    if not form then
        return res:status(400):send(err)
    end
    local name = type(form.name) == "string" and form.name or ""
    local password = type(form.password) == "string" and form.password or ""
    local rows = assert(db:query("SELECT id, name, password_hash FROM users WHERE name = $1",
        name))
    local user = rows[1]
    if not user then
        decoy = decoy or assert(moonserve.password.hash("not anyone's password"))
        moonserve.password.verify(password, decoy)
        return page(res, "login.html", { title = "Log in", name = name,
            flashes = { { kind = "error", message = "Wrong name or password." } } }, 401)
    end
    local ok, needs_rehash = moonserve.password.verify(password, user.password_hash)
    if not ok then
        return page(res, "login.html", { title = "Log in", name = name,
            flashes = { { kind = "error", message = "Wrong name or password." } } }, 401)
    end
    if needs_rehash then -- the defaults were raised since: store a hash made with them
        local hash = moonserve.password.hash(password)
        if hash then
            db:query("UPDATE users SET password_hash = $1 WHERE id = $2", hash, user.id)
        end
    end
    -- a new session id when the privilege changes (no fixation)
    req.session:regenerate()
    req.session:set("user", { id = user.id, name = user.name })
    req.session:flash("notice", "Welcome back, " .. user.name .. ".")
    return res:redirect("/", 303)
end)

app:post("/logout", function(req, res)
    req.session:destroy()
    req.session:flash("notice", "Logged out.")
    return res:redirect("/", 303)
end)

-- -- Notes ---------------------------------------------------------------------------------

local new_note = moonserve.validate {
    body = { "string", required = true, min_len = 1, max_len = 1000,
        check = function(s) return s:find("%S") ~= nil, "must not be blank" end },
}

local NOTE_COLUMNS = "n.id, n.body, n.created_at, n.author AS author_id, u.name AS author, "
    .. "u.avatar_type IS NOT NULL AS has_avatar"

-- The notes of page `n` (from 1), newest first, and how many there are in all.
local function notes_page(n, per_page)
    local rows, err = db:query("SELECT " .. NOTE_COLUMNS .. " FROM notes n JOIN users u "
        .. "ON u.id = n.author ORDER BY n.id DESC LIMIT $1 OFFSET $2", per_page,
        (n - 1) * per_page)
    if not rows then
        return nil, err
    end
    local count
    count, err = db:query("SELECT count(*) AS n FROM notes")
    if not count then
        return nil, err
    end
    return rows, tonumber(count[1].n)
end

-- Stores a note by `user` and tells every page: the note's row, or nil, err.
local function post_note(user, body)
    local rows, err = db:query("WITH n AS (INSERT INTO notes (author, body) VALUES ($1, $2) "
        .. "RETURNING id, body, created_at, author) SELECT " .. NOTE_COLUMNS
        .. " FROM n JOIN users u ON u.id = n.author", user.id, body)
    if not rows then
        return nil, err
    end
    live:publish(json.encode { note = rows[1] })
    return rows[1]
end

-- Deletes note `id` if `user` wrote it: true, or nil and 404 or 403.
local function delete_note(user, id)
    local rows = assert(db:query("DELETE FROM notes WHERE id = $1 AND author = $2 RETURNING id",
        id, user.id))
    if rows[1] then
        live:publish(json.encode { deleted = id })
        return true
    end
    local other = assert(db:query("SELECT 1 AS found FROM notes WHERE id = $1", id))
    return nil, other[1] and 403 or 404
end

app:get("home", "/", function(req, res)
    -- The channel's last sequence number before the query: a note published after it is
    -- replayed to the page's stream (and shown once: the page knows the ids it has).
    local since = live:stats().published
    local notes = assert(notes_page(1, config.page_size))
    return page(res, "index.html", { user = current_user(req), notes = notes, since = since,
        flashes = req.session:flashes(), errors = {} })
end)

app:post("/notes", member, function(req, res)
    local form, err = req:form()
    if not form then
        return res:status(400):send(err)
    end
    local data, errors = new_note(form)
    if errors then
        local notes = assert(notes_page(1, config.page_size))
        return page(res, "index.html", { user = req.ctx.user, notes = notes, errors = errors,
            since = live:stats().published, flashes = {}, draft = form.body }, 422)
    end
    assert(post_note(req.ctx.user, data.body))
    req.session:flash("notice", "Posted.")
    return res:redirect("/", 303)
end)

app:post("/notes/:id/delete", member, function(req, res)
    local ok, status = delete_note(req.ctx.user, id_param(req))
    if not ok then
        return res:status(status):send(status == 403 and "not your note\n" or "no such note\n")
    end
    req.session:flash("notice", "Deleted.")
    return res:redirect("/", 303)
end)

-- -- Live: server-sent events with replay, and a WebSocket ---------------------------------

-- The channel's messages as events (id = sequence number). A browser that reconnects sends
-- Last-Event-ID and gets what it missed from the ring; the page's first connection names
-- the sequence number it was rendered at (?since=N) for the same.
app:get("/events", function(req, res)
    local ev = res:events { channel = live, replay = true, retry = 2000,
        last_event_id = req:header("last-event-id") or req.query.since }
    ev:comment("worker " .. moonserve.worker.id()) -- (clients ignore comments)
    ev:follow()
end)

-- The same messages over a WebSocket, after those since ?since=N still in the ring.
app:websocket("/live", function(ws, req)
    local ok, lost = live:subscribe(ws, { since = tonumber(req.query.since) })
    if ok and lost ~= 0 then
        ws:send(json.encode { reset = lost })
    end
    while true do
        local data, kind = ws:receive()
        if not data or kind == "close" then
            return
        end
    end
end, { max_message_bytes = 1024 })

-- -- Avatars: a multipart upload, checked by its first bytes, kept in the row --------------

-- What an image's first bytes say it is (the client's content type is not trusted).
local function image_type(data)
    if data:sub(1, 8) == "\137PNG\r\n\26\n" then
        return "image/png"
    elseif data:sub(1, 3) == "\255\216\255" then
        return "image/jpeg"
    elseif data:sub(1, 6) == "GIF87a" or data:sub(1, 6) == "GIF89a" then
        return "image/gif"
    elseif data:sub(1, 4) == "RIFF" and data:sub(9, 12) == "WEBP" then
        return "image/webp"
    end
end

app:get("account", "/account", member, function(req, res)
    local rows = assert(db:query("SELECT avatar_type IS NOT NULL AS has_avatar FROM users "
        .. "WHERE id = $1", req.ctx.user.id))
    return page(res, "account.html", { title = "Your avatar", user = req.ctx.user,
        has_avatar = rows[1] and rows[1].has_avatar, flashes = req.session:flashes(),
        max_kib = math.floor(config.avatar_max_bytes / 1024) })
end)

app:post("/avatar", member, function(req, res)
    local parts, err = req:parts()
    if not parts then
        return res:status(400):send(err)
    end
    local data
    for part in parts do
        if part.name == "avatar" and part.filename then
            data = part:body()   -- bounded by the route's body_bytes
            if not data then          -- (the core answered 413 or 408 already)
                return
            end
        end
    end
    local kind = data and image_type(data)
    if not kind then
        req.session:flash("error", "A PNG, JPEG, GIF or WebP image, please.")
        return res:redirect("/account", 303)
    end
    assert(db:query("UPDATE users SET avatar = $1, avatar_type = $2 WHERE id = $3",
        moonserve.pg.bytea(data), kind, req.ctx.user.id))
    req.session:flash("notice", "Avatar saved.")
    return res:redirect("/account", 303)
end, { body_bytes = config.avatar_max_bytes })

app:get("/avatars/:id", function(req, res)
    local rows = assert(db:query("SELECT avatar, avatar_type FROM users WHERE id = $1 AND "
        .. "avatar IS NOT NULL", id_param(req)))
    if not rows[1] then
        return res:status(404):send("no avatar\n")
    end
    res:header("content-type", rows[1].avatar_type)
    res:header("cache-control", "private, max-age=60")
    return res:send(rows[1].avatar)
end)

-- -- The JSON API --------------------------------------------------------------------------

local page_query = moonserve.validate {
    page = { "integer", min = 1, max = 100000, default = 1 },
    per_page = { "integer", min = 1, max = 100, default = config.page_size },
}

-- A script's token for X-CSRF-Token, with the session cookie that binds it.
app:get("/api/csrf", function(_, res)
    res:header("cache-control", "no-store")
    return res:json { csrf_token = res.csrf_token() }
end)

app:get("/api/me", member, function(req, res)
    return res:json { id = req.ctx.user.id, name = req.ctx.user.name }
end)

app:get("/api/notes", function(req, res)
    local q, errors = page_query(req.query)
    if errors then
        return res:invalid(errors)
    end
    local rows, total = assert(notes_page(q.page, q.per_page))
    local pages = math.max(1, math.ceil(total / q.per_page))
    return res:json { notes = json.array(rows), page = q.page, per_page = q.per_page,
        total = total, pages = pages, next = q.page < pages and q.page + 1 or json.null }
end)

app:post("/api/notes", member, function(req, res)
    local body, err = req:json()
    if err then
        return res:error_json(400, err)
    end
    local data, errors = new_note(body)
    if errors then
        return res:invalid(errors)
    end
    local note = assert(post_note(req.ctx.user, data.body))
    res:header("location", "/api/notes/" .. note.id)
    return res:status(201):json { note = note }
end)

app:get("/api/notes/:id", function(req, res)
    local rows = assert(db:query("SELECT " .. NOTE_COLUMNS .. " FROM notes n JOIN users u ON "
        .. "u.id = n.author WHERE n.id = $1", id_param(req)))
    if not rows[1] then
        return res:error_json(404, "no such note")
    end
    return res:json { note = rows[1] }
end)

app:delete("/api/notes/:id", member, function(req, res)
    local ok, status = delete_note(req.ctx.user, id_param(req))
    if not ok then
        return res:error_json(status, status == 403 and "not your note" or "no such note")
    end
    return res:status(204):send("")
end)

return app
