--- moonserve/csrf.lua: refusing cross-site requests, by their origin headers or by form tokens.
-- @module moonserve.csrf
local crypto = require "moonserve.crypto"
local multipart = require "moonserve.multipart"
local security = require "moonserve.security"

local b64enc, b64dec = crypto.base64url_encode, crypto.base64url_decode
local hmac, equal = crypto.hmac_sha256, crypto.equal
local upper, match, sub = string.upper, string.match, string.sub
local concat = table.concat
local setmetatable, type = setmetatable, type

local _M = {}

local SAFE = security.SAFE

-- Whether a request opens a WebSocket over HTTP/2: RFC 8441's extended CONNECT, which
-- browsers send where HTTP/1.1 has a GET with Upgrade. It is that GET's twin: no form posts
-- it, and app:websocket checks its Origin in the handshake; it passes as the GET does.
local function websocket_connect(method, protocol)
    return protocol == "websocket" and upper(method) == "CONNECT"
end

-- The origin of an absolute URL (a Referer), or nil: "scheme://host[:port]".
local function origin_of(url)
    return (match(url, "^(%a[%w+.%-]*://[^/?#]+)"))
end

-- trusted_origins lists, compiled once each: list -> the check's options.
local compiled = setmetatable({}, { __mode = "k" })
local NO_LIST = {}

local function check_opts(opts)
    local list = opts.trusted_origins or NO_LIST
    local by_site = compiled[list]
    if not by_site then
        local c = security.compile({ csrf = { origins = list } }).csrf
        by_site = {
            [false] = c,
            [true] = { origins = c.origins, same_site = true },
        }
        compiled[list] = by_site
    end
    return by_site[opts.allow_same_site == true]
end

--- Whether a request may go on: the origin check of moonserve.security (origin_ok), with a
-- Referer standing in for a missing Origin. `headers` has lowercase names (as
-- req:headers() gives them); `host` is the Host field (default: headers.host). opts:
-- scheme ("http" or "https": how the client reached us, when that is known),
-- trusted_origins ({ "https://app.example.org" }), allow_same_site (accept Sec-Fetch-Site:
-- same-site), require_origin (refuse a request with none of Sec-Fetch-Site, Origin and
-- Referer). Safe methods pass, and so does an HTTP/2 WebSocket's CONNECT (`:protocol`
-- websocket in headers), whose handshake checks its origin. Returns true, or false and the
-- reason.
function _M.check(method, headers, host, opts)
    if type(method) ~= "string" then
        error("bad method (string expected)", 2)
    end
    if type(headers) ~= "table" then
        error("bad headers (table expected)", 2)
    end
    if SAFE[upper(method)] or websocket_connect(method, headers[":protocol"]) then
        return true
    end
    opts = opts or {}
    local f = { fetch_site = headers["sec-fetch-site"], origin = headers.origin,
        host = host or headers.host, scheme = opts.scheme }
    if not f.origin and not f.fetch_site then
        local referer = headers.referer
        if referer then
            -- A Referer that is no absolute URL names no origin: refused like Origin: null.
            f.origin = origin_of(referer) or "null"
        elseif opts.require_origin then
            return false, "no Origin or Referer"
        end
    end
    return security.origin_ok(f, check_opts(opts))
end

-- -- Form tokens ----------------------------------------------------------------------------

local NONCE_LEN, MAC_LEN = 16, 32

local function key_of(secret)
    if type(secret) ~= "string" or #secret < 32 then
        error("bad csrf secret (string of 32 bytes or more expected)", 3)
    end
    return hmac(secret, "moonserve.csrf")   -- its own key: no session MAC can pass for a token
end

local function check_id(session_id)
    if type(session_id) ~= "string" or session_id == "" then
        error("bad session id (string expected)", 3)
    end
end

--- A token for forms of this session: base64url of a random nonce and the HMAC of the nonce
-- with the session id. Each call gives another token, so a page never shows the same secret
-- bytes twice (compression side channels such as BREACH learn nothing); each one verifies
-- for as long as the session keeps its id.
function _M.token(secret, session_id)
    local key = key_of(secret)
    check_id(session_id)
    local nonce = assert(crypto.random(NONCE_LEN))
    return b64enc(nonce .. hmac(key, nonce .. session_id))
end

--- Whether `token` came from token() with this secret and session id. Anything that is not
-- such a token (nil from a form without one, garbage) is false.
function _M.verify(secret, session_id, token)
    local key = key_of(secret)
    check_id(session_id)
    if type(token) ~= "string" then
        return false
    end
    local raw = b64dec(token)
    if not raw or #raw ~= NONCE_LEN + MAC_LEN then
        return false
    end
    local nonce = sub(raw, 1, NONCE_LEN)
    return equal(sub(raw, NONCE_LEN + 1), hmac(key, nonce .. session_id))
end

-- -- The middleware ---------------------------------------------------------------------

-- The largest _csrf field taken from a multipart body: a token is 64 bytes.
local TOKEN_MAX = 256

-- The value of the first _csrf part of a multipart body, or nil. Reads the body only up to
-- the end of that part, whatever comes before it (a file, if the form put it first), and
-- hands what it read back to the request (req:_unread), so the handler reads the whole body
-- as if nothing had: what is held meanwhile is at most the request's body limit, and only
-- the token when the form puts _csrf first (as a hidden field at the top of the form does).
local function multipart_token(req, boundary)
    local p = multipart.parser(boundary)
    local held, n = {}, 0
    local value, size -- the _csrf part's pieces while it is read
    local token
    while true do
        local ev, err = p:next()
        if ev then
            local kind = ev.type
            if kind == "part" then
                if ev.name == "_csrf" then
                    value, size = {}, 0
                end
            elseif kind == "data" then
                if value then
                    size = size + #ev.data
                    if size > TOKEN_MAX then
                        break -- no token: refused
                    end
                    value[#value + 1] = ev.data
                end
            elseif kind == "part_end" then
                if value then
                    token = concat(value)
                    break
                end
            else -- "end": no _csrf part
                break
            end
        elseif err then
            break -- a malformed body; the handler's own reading will say so
        else
            local piece = req:read()
            if piece then
                n = n + 1
                held[n] = piece
                p:feed(piece)
            else
                -- the end, or a read that failed: the handler's own read says which
                break
            end
        end
    end
    req:_unread(held)
    return token
end

-- The token a request carries: the X-CSRF-Token header, else the _csrf field of its form
-- (urlencoded or multipart/form-data).
local function token_of(req)
    local token = req:header("x-csrf-token")
    if token then
        return token
    end
    local boundary = multipart.boundary(req:header("content-type"))
    if boundary then
        return multipart_token(req, boundary)
    end
    local form = req:form()
    return form and form._csrf
end

-- A refusal: the app's error page for 403 when it has one (a JSON API's envelope, the
-- site's HTML), with info.reason saying why; else a line of text.
local function refuse(req, res, why)
    local app = rawget(req, "_app")
    if type(app) == "table" and app.has_error_page and app:has_error_page(403) then
        return app:error(req, res, { status = 403, reason = why })
    end
    return res:status(403):send("Forbidden: " .. why .. "\n")
end

--- Middleware (moonserve.csrf) against cross-site requests: unsafe methods from another
-- origin get 403 (check above: opts.trusted_origins, opts.allow_same_site,
-- opts.require_origin), through the app's error page for 403 when it has one. With
-- opts.secret, forms must also carry a token: the field _csrf
-- (urlencoded or multipart), or the header X-CSRF-Token; templates get it as csrf_token().
-- An HTTP/2 WebSocket's CONNECT passes as the HTTP/1.1 upgrade's GET does (app:websocket
-- checks its origin). A token is bound to the session (with
-- sessions before this middleware), whose cookie it makes sure is set, or else to a cookie
-- of its own (opts.cookie, "csrf"): either way it verifies on the visitor's next request.
function _M.middleware(opts)
    opts = opts or {}
    local secret, name = opts.secret, opts.cookie or "csrf"
    if secret ~= nil then
        _M.token(secret, "-") -- a bad secret raises here, at setup
    end
    return function(req, res, next)
        local method = req.method
        local safe = SAFE[method] or (method == "CONNECT"
            and websocket_connect(method, req:header(":protocol")))
        if not safe then
            local host, scheme = security.authority(req)
            local ok, why = _M.check(method, req:headers(), host, {
                scheme = scheme, trusted_origins = opts.trusted_origins,
                allow_same_site = opts.allow_same_site, require_origin = opts.require_origin })
            if not ok then
                return refuse(req, res, tostring(why))
            end
        end
        if not secret then
            return next()
        end
        local s = req.session
        local id -- what this request's token must be bound to
        if s then
            id = s.id
            res.csrf_token = function()
                s:keep() -- a new session's id must outlive this request, or its token dies
                return _M.token(secret, s.id)
            end
        else
            id = req.cookies[name]
            if type(id) ~= "string" or not id:find("^[%w_-]+$") or #id ~= 22 then
                id = nil
            end
            local bound = id
            res.csrf_token = function()
                if not bound then
                    bound = crypto.base64url_encode(assert(crypto.random(16)))
                    res:cookie(name, bound, { path = "/", http_only = true, same_site = "Lax",
                        secure = req.scheme == "https" })
                end
                return _M.token(secret, bound)
            end
        end
        if not safe then
            local token = token_of(req)
            if not id or type(token) ~= "string" or not _M.verify(secret, id, token) then
                return refuse(req, res, "missing or bad CSRF token")
            end
        end
        return next()
    end
end

return _M
