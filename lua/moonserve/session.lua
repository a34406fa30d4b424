--- moonserve/session.lua: sessions in a signed, optionally encrypted cookie, or in a store.
--
-- A cookie session's value is `token.mac`: token is the base64url of the JSON payload
-- { i = id, e = expiry, d = data } (with `encrypt`, of its AES-256-GCM blob instead) and mac
-- the base64url of HMAC-SHA256 over "name=token". With a store, token is the session id
-- alone and the data stays on the server. The MAC covers the cookie's name, so a value
-- cannot be moved into another cookie signed with the same secret.
--
-- `Session`: A session (req.session with moonserve.sessions): a table of JSON values in a
--   cookie or a store.
-- @module moonserve.session
local cjson = require "cjson"
local crypto = require "moonserve.crypto"
local cookie = require "moonserve.cookie"

local b64enc, b64dec = crypto.base64url_encode, crypto.base64url_decode
local hmac, equal = crypto.hmac_sha256, crypto.equal
local find, sub, format = string.find, string.sub, string.format
local type, pairs, ipairs, next, pcall = type, pairs, ipairs, next, pcall
local getmetatable, setmetatable, rawget, tostring = getmetatable, setmetatable, rawget, tostring

local function host_log(msg)
    require("moonserve.log").warn(msg)
end

local MAX_COOKIE = 4096   -- what browsers keep at least, attributes included (RFC 6265 6.1)
local MIN_SECRET = 32     -- bytes: a shorter secret can be guessed offline from one cookie
local ID_BYTES = 16       -- 128 random bits: ids cannot be guessed
local FLASH = "_flash"    -- where flash messages wait in the data: a list of { kind, message }

local _M = { MAX_COOKIE = MAX_COOKIE }

local function new_id()
    -- Without randomness there is no safe session to hand out: raising makes it a 500.
    return b64enc(assert(crypto.random(ID_BYTES)))
end

-- -- The session a handler holds --------------------------------------------------------

local Session = {}
-- A new session's id is made when something first reads it (a CSRF token, a save, the
-- handler): most requests that come without a cookie never need one, and 128 random bits in
-- base64 are the dearest part of such a request's session.
Session.__index = function(s, k)
    if k == "id" then
        local id = new_id()
        s.id = id
        return id
    end
    return Session[k]
end

local function new_session(id, data, is_new)
    -- What the previous request left with flash() is this request's to read, and is not
    -- saved again: the session changes, so its cookie (or record) is written without them.
    local flashes = data[FLASH]
    local had = flashes ~= nil
    if had then
        data[FLASH] = nil
        if type(flashes) ~= "table" then
            flashes = nil
        end
    end
    return setmetatable({
        id = id,            -- public: csrf tokens and logs may use it (see __index)
        is_new = is_new,    -- true when no valid cookie came with the request
        _data = data,
        _dirty = had,       -- save() writes a cookie only when something changed
        _keep = false,      -- keep(): save() writes a cookie even for an empty session
        _old_id = nil,      -- set by regenerate(): the stored record to delete on save
        _flashes = flashes or {}, -- the previous request's flash messages: { kind, message }
    }, Session)
end

--- The value stored under `key`, or nil.
function Session:get(key)
    return self._data[key]
end

--- Sets a value (nil removes it). Values must be what JSON can hold. A table changed in
-- place after set() is not noticed: set it again.
-- @usage req.session:set("user", { id = 7, name = "ada" })
function Session:set(key, value)
    if type(key) ~= "string" then
        error("bad session key (string expected, got " .. type(key) .. ")", 2)
    end
    self._data[key] = value
    self._dirty = true
    return self
end

--- Keeps a message for the next request of this session (after a redirect, the page it
-- lands on): `kind` says what it is ("notice", "error"...), `message` is any JSON value.
-- The next request that loads the session reads it with flashes(); it is dropped at the end
-- of that request whether read or not, so a message is shown once.
-- @usage req.session:flash("notice", "Saved"); return res:redirect("/notes")
function Session:flash(kind, message)
    if type(kind) ~= "string" then
        error("bad flash kind (string expected, got " .. type(kind) .. ")", 2)
    end
    if message == nil then
        error("bad flash message (a value expected)", 2)
    end
    local list = self._data[FLASH]
    if type(list) ~= "table" then
        list = {}
        self._data[FLASH] = list
    end
    list[#list + 1] = { kind, message }
    self._dirty = true
    return self
end

--- The messages the previous request left with flash(), and forgets them: with `kind`, the
-- list of that kind's messages (the others stay for this request); without, a list of
-- { kind =, message = } in the order they were left. Empty lists when there are none.
-- @usage for _, f in ipairs(req.session:flashes()) do ... f.kind, f.message ... end
function Session:flashes(kind)
    local got, keep = {}, {}
    for _, f in ipairs(self._flashes) do
        -- (an entry flash() did not write, from a store's data, is nothing to show)
        local ok = type(f) == "table" and type(f[1]) == "string"
        if ok and kind == nil then
            got[#got + 1] = { kind = f[1], message = f[2] }
        elseif ok and f[1] == kind then
            got[#got + 1] = f[2]
        elseif ok then
            keep[#keep + 1] = f
        end
    end
    self._flashes = keep
    return got
end

--- Gives the session a new id, keeping its data. Call it when privileges change (at login):
-- an id planted by an attacker before then is worth nothing after.
function Session:regenerate()
    -- Only a stored id needs ending; a new session's id never reached the store.
    if self._old_id == nil and not self.is_new then
        self._old_id = self.id
    end
    self.id = new_id()
    self._dirty = true
    return self
end

--- Makes save() set the cookie even when the session holds nothing, so that its id lasts
-- into the next request: what a CSRF token bound to the id of a new session needs. A
-- session that came with its cookie is not saved again for it.
function Session:keep()
    if not self._keep then
        self._keep = true
        if self.is_new then
            self._dirty = true
        end
    end
    return self
end

--- Empties the session under a new id; save() then clears the cookie (and the stored record),
-- unless keep() is called after this.
function Session:destroy()
    self._data = {}
    self._keep = false
    return self:regenerate()
end

-- -- The manager ------------------------------------------------------------------------

local Manager = {}
Manager.__index = Manager

local function check_secret(s)
    if type(s) ~= "string" or #s < MIN_SECRET then
        error(format("bad session secret (string of %d bytes or more expected)", MIN_SECRET), 3)
    end
    -- One key per purpose, so that no value computed for one use is valid for the other.
    return { sign = hmac(s, "moonserve.session.sign"), enc = hmac(s, "moonserve.session.encrypt") }
end

local COOKIE_DEFAULTS = { path = "/", http_only = true, same_site = "Lax", secure = false }

--- opts: secret, or secrets = { newest, older... } (the first signs and encrypts, any of them
-- is accepted); name ("session"); encrypt (true); max_age (86400 seconds); cookie
-- (attributes for cookie.serialize: path "/", http_only, same_site "Lax", and secure when
-- the request came over https, unless `secure` is given); store
-- ({ get, set, delete }, for server-side data: set(id, json, ttl, data, old_id) may end
-- old_id, the id regenerate() replaced, in the same step and then return "rotated"; else
-- delete(old_id) follows; it returns nil, "revoked" when the session was ended meanwhile,
-- and save() then clears the cookie); now (the clock, os.time).
function _M.new(opts)
    if type(opts) ~= "table" then
        error("bad session options (table expected)", 2)
    end
    local secrets = opts.secrets
    if secrets and opts.secret then
        error("give secret or secrets, not both", 2)
    end
    secrets = secrets or { opts.secret }
    if type(secrets) ~= "table" or #secrets == 0 then
        error("bad session options (secret or secrets expected)", 2)
    end
    local keys = {}
    for i = 1, #secrets do
        keys[i] = check_secret(secrets[i])
    end

    local m = setmetatable({
        keys = keys,
        name = opts.name or "session",
        encrypt = opts.encrypt ~= false,
        max_age = opts.max_age or 86400,
        store = opts.store,
        now = opts.now or os.time,
    }, Manager)
    if type(m.max_age) ~= "number" or m.max_age <= 0 or m.max_age % 1 ~= 0 then
        error("bad session max_age (positive integer of seconds expected)", 2)
    end
    if type(m.now) ~= "function" then
        error("bad session clock (function expected)", 2)
    end
    local store = m.store
    if store ~= nil and (type(store) ~= "table" or type(store.get) ~= "function"
            or type(store.set) ~= "function" or type(store.delete) ~= "function") then
        error("bad session store (table with get, set and delete expected)", 2)
    end

    local attrs = {}
    for k, v in pairs(COOKIE_DEFAULTS) do
        attrs[k] = v
    end
    for k, v in pairs(opts.cookie or {}) do
        attrs[k] = v
    end
    -- Two sets of attributes: one keeps the cookie for max_age, the other drops it now.
    local gone = {}
    for k, v in pairs(attrs) do
        gone[k] = v
    end
    attrs.max_age, attrs.expires = m.max_age, nil
    gone.max_age, gone.expires = 0, 0
    -- Serializing once now raises here, at setup, on a bad name or bad attributes.
    cookie.serialize(m.name, "", attrs)
    m.attrs, m.attrs_gone = attrs, gone
    -- Unless opts.cookie says, a cookie sent over https is Secure: the same again with it.
    if opts.cookie == nil or opts.cookie.secure == nil then
        local sa, sg = {}, {}
        for k, v in pairs(attrs) do
            sa[k] = v
        end
        for k, v in pairs(gone) do
            sg[k] = v
        end
        sa.secure, sg.secure = true, true
        m.attrs_https, m.attrs_gone_https = sa, sg
    end
    return m
end

local function sign(key, name, token)
    return b64enc(hmac(key.sign, name .. "=" .. token))
end

-- The token of a cookie value, the key that signed it and whether that key is an older one;
-- or nil and why not.
local function verify(self, value)
    local dot = find(value, ".", 1, true)
    if not dot then
        return nil, "malformed cookie"
    end
    local token, mac = sub(value, 1, dot - 1), sub(value, dot + 1)
    for i, key in ipairs(self.keys) do
        if equal(mac, sign(key, self.name, token)) then
            return token, key, i > 1
        end
    end
    return nil, "bad signature"
end

local function decode(json)
    local ok, p = pcall(cjson.decode, json)
    if not ok or type(p) ~= "table" or type(p.e) ~= "number" or type(p.d) ~= "table" then
        return nil, "bad payload"
    end
    return p
end

-- The payload inside a verified token, or nil and why not (and true when the store failed,
-- rather than not knowing the session).
local function open(self, token, key)
    if self.store then
        local raw, err = self.store.get(token)
        if not raw then
            return nil, err or "unknown session", err ~= nil
        end
        local p, perr = decode(raw)
        if p then
            p.i = token
        end
        return p, perr
    end
    local body = b64dec(token)
    if not body then
        return nil, "malformed cookie"
    end
    if self.encrypt then
        body = crypto.aes256gcm_decrypt(key.enc, body, self.name)
        if not body then
            return nil, "decryption failed"
        end
    end
    local p, err = decode(body)
    if p and type(p.i) ~= "string" then
        return nil, "bad payload"
    end
    return p, err
end

--- The session of a request: `from` is the request, or the Cookie field's value, or nil.
-- Returns the session, and when a cookie came but was refused, why (it never raises on a bad
-- cookie: tampered, truncated, expired or signed with an unknown key, the session is new
-- and empty), and true when that was the store failing (its get returned nil and an error).
-- @local
function Manager:load(from)
    local header = from
    if type(from) == "table" then
        header = from:header("cookie")
    elseif from ~= nil and type(from) ~= "string" then
        error("bad session source (request or cookie header expected)", 2)
    end
    local value = cookie.parse(header)[self.name]
    if not value then
        return new_session(nil, {}, true)
    end
    local token, key, rotated = verify(self, value)
    local p, why, failed
    if token then
        p, why, failed = open(self, token, key)
    else
        why = key
    end
    if p and self.now() >= p.e then
        p, why = nil, "expired"
    end
    if not p then
        return new_session(nil, {}, true), why, failed
    end
    local s = new_session(p.i, p.d, false)
    -- Signed with an older secret: saving it again moves it to the newest one.
    s._dirty = s._dirty or rotated
    return s
end

--- The Set-Cookie value that stores the session, or nil when nothing changed (or nil and an
-- error when the store failed). Raises when the data cannot be JSON, or is too big for a
-- cookie. With `req`, a request that came over https, the cookie is Secure (unless the
-- cookie options set `secure` themselves).
-- @local
function Manager:save(s, req)
    if getmetatable(s) ~= Session then
        error("bad session (from load() expected)", 2)
    end
    local https = req ~= nil and req.scheme == "https" and self.attrs_https ~= nil
    if not s._dirty then
        return nil
    end
    local store, name = self.store, self.name

    if next(s._data) == nil and not s._keep then
        -- Nothing to keep: drop the record and ask the browser to drop the cookie.
        if store then
            store.delete(s.id)
            if s._old_id then
                store.delete(s._old_id)
            end
        end
        s._old_id, s._dirty, s.is_new = nil, false, false
        return cookie.serialize(name, "", https and self.attrs_gone_https or self.attrs_gone)
    end

    local expires = self.now() + self.max_age
    local ok, json = pcall(cjson.encode, { i = (not store) and s.id or nil, e = expires,
        d = s._data })
    if not ok then
        error("session data cannot be saved as JSON: " .. json, 2)
    end

    local key, token = self.keys[1]
    if store then
        local sok, err = store.set(s.id, json, self.max_age, s._data, s._old_id)
        if not sok and err == "revoked" then
            -- Ended meanwhile (revoke_user, a log out elsewhere): nothing was stored, and the
            -- browser drops its cookie.
            s._old_id, s._dirty, s.is_new = nil, false, false
            return cookie.serialize(name, "", https and self.attrs_gone_https or self.attrs_gone)
        end
        if not sok then
            return nil, err or "session store failed"
        end
        if sok == "rotated" then -- (the store ended the old id in the same step)
            s._old_id = nil
        end
        token = s.id
    elseif self.encrypt then
        token = b64enc(assert(crypto.aes256gcm_encrypt(key.enc, json, name)))
    else
        token = b64enc(json)
    end

    local v = cookie.serialize(name, token .. "." .. sign(key, name, token),
        https and self.attrs_https or self.attrs)
    if #v > MAX_COOKIE then
        error(format("session too big for a cookie (%d bytes, at most %d): keep less in it, "
            .. "or use a store", #v, MAX_COOKIE), 2)
    end
    -- The old record goes only once the new one is stored: a failed save loses nothing.
    if store and s._old_id then
        store.delete(s._old_id)
    end
    s._old_id, s._dirty, s.is_new = nil, false, false
    return v
end

-- -- A store in this process --------------------------------------------------------------

--- Keeps sessions in a table of this process, each until its ttl runs out. Each worker has its
-- own, so it suits one worker (workers = 0) and tests; several workers need a shared store.
-- opts: max (10000 sessions; then expired ones are swept out, and if none are, set fails),
-- now (the clock).
function _M.memory_store(opts)
    opts = opts or {}
    local now = opts.now or os.time
    local max = opts.max or 10000
    local items, count = {}, 0

    local function drop(id)
        items[id] = nil
        count = count - 1
    end

    local store = {}

    function store.get(id)
        local it = items[id]
        if not it then
            return nil
        end
        if now() >= it.expires then
            drop(id)
            return nil
        end
        return it.data
    end

    function store.set(id, data, ttl)
        if items[id] == nil then
            if count >= max then
                local t = now()
                for k, it in pairs(items) do
                    if t >= it.expires then
                        drop(k)   -- clearing a field while traversing is allowed
                    end
                end
                if count >= max then
                    return nil, "memory store full"
                end
            end
            count = count + 1
        end
        items[id] = { data = data, expires = now() + ttl }
        return true
    end

    function store.delete(id)
        if items[id] ~= nil then
            drop(id)
        end
        return true
    end

    return store
end

-- -- A store in Redis ---------------------------------------------------------------------
-- A session is a hash under PREFIX..id: d (the JSON) and u (its user, if any), with Redis's
-- TTL as its expiry. A user's sessions are a set under PREFIX.."user:"..uid, changed in the
-- same script as the session, so revoke_user finds every one. A deleted or revoked session
-- leaves a tombstone (the hash with r = 1 and no d) until its TTL runs out: a request that
-- loaded it before and saves after cannot bring it back.

-- KEYS[1] the session, KEYS[2] its user's set (when it has a user); ARGV: json, ttl (s), id,
-- uid (or ""), the prefix, the id this one replaces (or ""), ended here: a rotation is one
-- step. Returns 1, or 0 when the session or the one it replaces is dead (a tombstone,
-- revoked or expired meanwhile): nothing is written, so a request that loaded a session
-- before revoke_user and regenerates after cannot sign the user in again.
local REDIS_SET = [[
local key, set = KEYS[1], KEYS[2]
local json, ttl, id, uid, prefix = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
local old_id = ARGV[6]
if old_id ~= '' then
  local old_key = prefix .. old_id
  if redis.call('HEXISTS', old_key, 'd') == 0 then return 0 end
  local u = redis.call('HGET', old_key, 'u')
  if u then redis.call('SREM', prefix .. 'user:' .. u, old_id) end
  redis.call('HDEL', old_key, 'd', 'u')
  redis.call('HSET', old_key, 'r', 1)
end
if redis.call('HEXISTS', key, 'r') == 1 then return 0 end
local old = redis.call('HGET', key, 'u')
if old and old ~= uid then redis.call('SREM', prefix .. 'user:' .. old, id) end
redis.call('DEL', key)
if uid ~= '' then
  redis.call('HSET', key, 'd', json, 'u', uid)
else
  redis.call('HSET', key, 'd', json)
end
redis.call('EXPIRE', key, ttl)
if set then
  -- Ended sessions leave the set a few at a time: a sample at each new one, so a login
  -- costs the same however many sessions the user has (a walk of the whole set blocked
  -- Redis for an account signed in thousands of times).
  if redis.call('SADD', set, id) == 1 then
    for _, m in ipairs(redis.call('SRANDMEMBER', set, 16)) do
      if redis.call('HEXISTS', prefix .. m, 'd') == 0 then redis.call('SREM', set, m) end
    end
  end
  if redis.call('TTL', set) < ttl then redis.call('EXPIRE', set, ttl) end
end
return 1
]]

-- KEYS[1] the session; ARGV: id, the prefix. A tombstone for the rest of its TTL.
local REDIS_DELETE = [[
local key = KEYS[1]
if redis.call('HEXISTS', key, 'd') == 0 then return 0 end
local u = redis.call('HGET', key, 'u')
if u then redis.call('SREM', ARGV[2] .. 'user:' .. u, ARGV[1]) end
redis.call('HDEL', key, 'd', 'u')
redis.call('HSET', key, 'r', 1)
return 1
]]

-- KEYS[1] the user's set; ARGV: the prefix. Tombstones every session of the user; returns
-- how many were live.
local REDIS_REVOKE = [[
local n = 0
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local key = ARGV[1] .. id
  if redis.call('HEXISTS', key, 'd') == 1 then
    redis.call('HDEL', key, 'd', 'u')
    redis.call('HSET', key, 'r', 1)
    n = n + 1
  end
end
redis.call('DEL', KEYS[1])
return n
]]

local function user_key_of(user)
    if type(user) == "function" then
        return user
    end
    return function(data)
        local u = data[user]
        if type(u) == "table" then
            u = u.id
        end
        return u
    end
end

--- Keeps sessions in Redis (moonserve.redis), for every worker of every instance: a store for
-- new{ store = } and moonserve.sessions. `redis` is a redis:// URL or a moonserve.redis
-- client; opts: prefix ("moonserve:session:"), user (the session key holding the user: a
-- value, or a table whose id is used; default "user"; or function(data) returning the user's
-- id or nil). Expiry is Redis's TTL (the manager's max_age, renewed at each save). One round
-- trip reads a session; a save is one script, which after regenerate() also ends the old
-- id (dead from then on, on every instance). store:revoke_user(uid) ends every session of a
-- user at once (on every instance) and returns how many there were. When Redis fails, get,
-- set and delete return nil and the error: moonserve.sessions then answers 503.
-- @usage local store = require("moonserve.session").redis_store(os.getenv("REDIS_URL"))
-- app:use(moonserve.sessions{ secret = moonserve.secret("session"), store = store })
-- store:revoke_user(7)   -- "log out everywhere"
function _M.redis_store(redis_or_url, opts)
    opts = opts or {}
    if type(opts) ~= "table" then
        error("bad redis store options (table expected)", 2)
    end
    for k in pairs(opts) do
        if k ~= "prefix" and k ~= "user" then
            error("bad redis store option " .. tostring(k) .. " (prefix or user)", 2)
        end
    end
    local redis = require "moonserve.redis"
    local r = redis_or_url
    if type(r) == "string" then
        local err
        r, err = redis.new(r)
        if not r then
            error("bad session store: " .. tostring(err), 2)
        end
    elseif type(r) ~= "table" or type(r.eval) ~= "function" then
        error("bad session store (a redis:// URL or a moonserve.redis client expected)", 2)
    end
    local prefix = opts.prefix or "moonserve:session:"
    if type(prefix) ~= "string" then
        error("bad redis store prefix (string expected)", 2)
    end
    local claimed, why = redis.claim_prefix(r, prefix, "the session store")
    if not claimed then
        error(why, 2)
    end
    local user = opts.user or "user"
    if type(user) ~= "string" and type(user) ~= "function" then
        error("bad redis store user (a session key or function(data) expected)", 2)
    end
    local user_of = user_key_of(user)
    local set_script = redis.script(REDIS_SET)
    local delete_script = redis.script(REDIS_DELETE)
    local revoke_script = redis.script(REDIS_REVOKE)

    local store = { redis = r, prefix = prefix }

    function store.get(id)
        local v, err = r:call("HGET", prefix .. id, "d")
        if v == nil then
            return nil, err
        end
        if type(v) ~= "string" then -- (redis.null: unknown, expired or revoked)
            return nil
        end
        return v
    end

    function store.set(id, json, ttl, data, old_id)
        local uid = data and user_of(data)
        local keys = { prefix .. id }
        if uid ~= nil then
            uid = tostring(uid)
            keys[2] = prefix .. "user:" .. uid
        end
        local v, err = r:eval(set_script, keys, { json, ttl, id, uid or "", prefix,
            old_id or "" })
        if v == nil then
            return nil, err
        end
        if v == 0 then -- (revoked or ended meanwhile: nothing written, the ids stay dead)
            return nil, "revoked"
        end
        return old_id and "rotated" or true
    end

    function store.delete(id)
        local v, err = r:eval(delete_script, { prefix .. id }, { id, prefix })
        if v == nil then
            return nil, err
        end
        return true
    end

    --- Ends every session of user `uid` (as the `user` option finds it in the data).
    function store.revoke_user(self, uid)
        if self ~= store then -- (called as store.revoke_user(uid))
            uid = self
        end
        if uid == nil then
            error("bad user id (nil)", 2)
        end
        return r:eval(revoke_script, { prefix .. "user:" .. tostring(uid) }, { prefix })
    end

    return store
end

-- -- The middleware ---------------------------------------------------------------------

-- The middleware's hook, which saves the session before the head leaves: a table called
-- through its metatable, not a function made per request, which LuaJIT would not compile.
local Save = {}
Save.__call = function(hook, r)
    local cookie_line, err = hook.manager:save(hook.s, hook.req)
    if cookie_line then
        r:header("set-cookie", cookie_line)
    elseif err then
        error("session not saved: " .. tostring(err))
    end
end

--- Middleware (moonserve.sessions): a session per request in req.session, with `opts` as
-- new() takes them. It is saved, and its cookie set, just before the reply's head leaves.
-- @usage app:use(moonserve.sessions{ secret = os.getenv("SESSION_SECRET") })
function _M.middleware(opts)
    local manager = _M.new(opts)
    local failing = 0 -- requests refused since the store last answered
    return function(req, res, pass)
        local s, why, failed = manager:load(req)
        if failed then
            -- The store failed (Redis down): a signed-in visitor is not shown as signed out,
            -- and nothing is saved over the session; one line when an outage starts.
            if failing == 0 then
                host_log("session store failed: " .. tostring(why) .. " (503 until it answers)")
            end
            failing = failing + 1
            local app = rawget(req, "_app")
            res:header("retry-after", "1")
            if type(app) == "table" and app.error then
                return app:error(req, res, { status = 503 })
            end
            return res:status(503):send("503 Service Unavailable\n")
        end
        if failing > 0 then
            host_log("session store answers again (" .. failing .. " requests refused)")
            failing = 0
        end
        req.session = s
        res:before_send(setmetatable({ manager = manager, s = s, req = req }, Save))
        return pass()
    end
end

return _M
