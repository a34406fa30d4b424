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
-- (moonserve.csrf.check: opts.trusted_origins, opts.allow_same_site). With opts.secret and
-- sessions before it, forms must also carry a token: the field _csrf, or the header
-- X-CSRF-Token; templates get it as csrf_token().
function _M.csrf(opts)
    local csrf = require "moonserve.csrf"
    opts = opts or {}
    local SAFE = { GET = true, HEAD = true, OPTIONS = true, TRACE = true }
    return function(req, res, next)
        local ok, why = csrf.check(req.method, req:headers(), req:header("host"), {
            scheme = req.scheme, trusted_origins = opts.trusted_origins,
            allow_same_site = opts.allow_same_site, require_origin = opts.require_origin })
        if not ok then
            return res:status(403):send("Forbidden: " .. tostring(why) .. "\n")
        end
        local s = opts.secret and req.session
        if s then
            res.csrf_token = function() return csrf.token(opts.secret, s.id) end
            if not SAFE[req.method] then
                local token = req:header("x-csrf-token")
                if not token then
                    local form = req:form()
                    token = form and form._csrf
                end
                if type(token) ~= "string" or not csrf.verify(opts.secret, s.id, token) then
                    return res:status(403):send("Forbidden: missing or bad CSRF token\n")
                end
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
