-- moonserve/csrf.lua: refusing cross-site requests, by their origin headers or by form tokens.
local crypto = require "moonserve.crypto"

local b64enc, b64dec = crypto.base64url_encode, crypto.base64url_decode
local hmac, equal = crypto.hmac_sha256, crypto.equal
local lower, upper, match, sub, format = string.lower, string.upper, string.match, string.sub,
    string.format
local type = type

local _M = {}

-- Methods that must not change anything (RFC 9110 9.2.1). Every other method, including
-- ones this table does not know, is checked.
local SAFE = { GET = true, HEAD = true, OPTIONS = true, TRACE = true }
local DEFAULT_PORT = { http = "80", https = "443" }

-- "scheme://host[:port]" in lowercase without the scheme's default port, or nil.
local function origin(scheme, authority)
    scheme, authority = lower(scheme), lower(authority)
    local host, port = match(authority, "^(.-):(%d+)$")
    if port and DEFAULT_PORT[scheme] == port then
        authority = host
    end
    return scheme .. "://" .. authority
end

-- The origin of an absolute URL (an Origin or Referer value), or nil.
local function origin_of(url)
    local scheme, authority = match(url, "^(%a[%w+.%-]*)://([^/?#]+)")
    if not scheme then
        return nil
    end
    authority = match(authority, "[^@]*$")    -- userinfo is no part of an origin
    if authority == "" then
        return nil
    end
    return origin(scheme, authority)
end

local function trusted(o, list)
    if o and list then
        for i = 1, #list do
            if origin_of(list[i]) == o then
                return true
            end
        end
    end
    return false
end

-- Whether a request may go on. `headers` has lowercase names (as req:headers() gives them);
-- `host` is the Host field (default: headers.host). opts: scheme ("http": how the client
-- reached us), trusted_origins ({ "https://app.example.org" }), allow_same_site (accept
-- Sec-Fetch-Site: same-site), require_origin (refuse a request with neither Origin nor
-- Referer). Returns true, or false and the reason.
function _M.check(method, headers, host, opts)
    if type(method) ~= "string" then
        error("bad method (string expected)", 2)
    end
    if type(headers) ~= "table" then
        error("bad headers (table expected)", 2)
    end
    if SAFE[upper(method)] then
        return true
    end
    opts = opts or {}
    local sent_origin = headers.origin
    -- A trusted origin is let through before Sec-Fetch-Site is looked at: its requests are
    -- cross-site by design, and browsers say so.
    if sent_origin and trusted(origin_of(sent_origin), opts.trusted_origins) then
        return true
    end

    -- Sec-Fetch-Site comes from the browser itself and cannot be set by a page.
    local site = headers["sec-fetch-site"]
    if site then
        site = lower(site)
        if site == "same-origin" or site == "none" then
            return true
        elseif site == "same-site" and opts.allow_same_site then
            return true
        end
        return false, "cross-site request (Sec-Fetch-Site: " .. site .. ")"
    end

    local what, url = "Origin", sent_origin
    if not url then
        what, url = "Referer", headers.referer
    end
    if not url then
        if opts.require_origin then
            return false, "no Origin or Referer"
        end
        -- Browsers send Origin with every cross-site POST: a request without it is from a
        -- program, which could send any Origin it liked anyway.
        return true
    end
    local o = origin_of(url)   -- nil for "null", the origin of sandboxed or privacy-hiding pages
    if trusted(o, opts.trusted_origins) then
        return true
    end
    host = host or headers.host
    if type(host) ~= "string" or host == "" then
        return false, "no Host"
    end
    if o and o == origin(opts.scheme or "http", host) then
        return true
    end
    return false, format("cross-origin request (%s: %s)", what, url)
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

-- A token for forms of this session: base64url of a random nonce and the HMAC of the nonce
-- with the session id. Each call gives another token, so a page never shows the same secret
-- bytes twice (compression side channels such as BREACH learn nothing); each one verifies
-- for as long as the session keeps its id.
function _M.token(secret, session_id)
    local key = key_of(secret)
    check_id(session_id)
    local nonce = assert(crypto.random(NONCE_LEN))
    return b64enc(nonce .. hmac(key, nonce .. session_id))
end

-- Whether `token` came from token() with this secret and session id. Anything that is not
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

return _M
