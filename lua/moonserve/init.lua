-- moonserve: a Lua-scriptable HTTP server on a C core.
local _M = { _VERSION = "0.1.0" }

-- Handler code sees coroutine.resume, wrap and status that let waits through the
-- handler's own coroutines (moonserve/coroutine.lua): installed before the app's modules load.
require "moonserve.coroutine"

-- A new application; see app.lua.
function _M.app(opts)
    return require("moonserve.app").new(opts)
end

-- Middleware: a session per request in req.session (moonserve.session options: secret or
-- secrets, encrypt, max_age, cookie, store). It is saved, and its cookie set, just before
-- the reply's head leaves.
function _M.sessions(opts)
    local manager = require("moonserve.session").new(opts)
    return function(req, res, next)
        local s = manager:load(req)
        req.session = s
        res:before_send(function(r)
            local cookie, err = manager:save(s)
            if cookie then
                r:header("set-cookie", cookie)
            elseif err then
                error("session not saved: " .. tostring(err))
            end
        end)
        return next()
    end
end

-- Middleware against cross-site requests: unsafe methods from another origin get 403
-- (moonserve.csrf.check: opts.trusted_origins, opts.allow_same_site, opts.require_origin).
-- With opts.secret, forms must also carry a token: the field _csrf, or the header
-- X-CSRF-Token; templates get it as csrf_token(). A token is bound to the session (with
-- sessions before this middleware), whose cookie it makes sure is set, or else to a cookie
-- of its own (opts.cookie, "csrf"): either way it verifies on the visitor's next request.
function _M.csrf(opts)
    local csrf = require "moonserve.csrf"
    local crypto = require "moonserve.crypto"
    local security = require "moonserve.security"
    opts = opts or {}
    local secret, name = opts.secret, opts.cookie or "csrf"
    if secret ~= nil then
        csrf.token(secret, "-") -- a bad secret raises here, at setup
    end
    local SAFE = security.SAFE
    return function(req, res, next)
        local host, scheme = security.authority(req)
        local ok, why = csrf.check(req.method, req:headers(), host, {
            scheme = scheme, trusted_origins = opts.trusted_origins,
            allow_same_site = opts.allow_same_site, require_origin = opts.require_origin })
        if not ok then
            return res:status(403):send("Forbidden: " .. tostring(why) .. "\n")
        end
        if not secret then
            return next()
        end
        local s, id = req.session, nil -- id: what this request's token must be bound to
        if s then
            id = s.id
            res.csrf_token = function()
                s:keep() -- a new session's id must outlive this request, or its token dies
                return csrf.token(secret, s.id)
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
                return csrf.token(secret, bound)
            end
        end
        if not SAFE[req.method] then
            local token = req:header("x-csrf-token")
            if not token then
                local form = req:form()
                token = form and form._csrf
            end
            if not id or type(token) ~= "string" or not csrf.verify(secret, id, token) then
                return res:status(403):send("Forbidden: missing or bad CSRF token\n")
            end
        end
        return next()
    end
end

-- Parks the running handler for `seconds` while the worker serves others; works inside
-- pcall and the handler's own coroutines, raises inside a C call (a string.gsub callback...).
function _M.sleep(seconds)
    return require("moonserve.server").sleep(seconds)
end

return _M
