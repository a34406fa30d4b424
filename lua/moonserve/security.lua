--- moonserve/security.lua: what every request and reply gets unless a site says otherwise:
-- the security headers, built once into field lines the core adds in one call, and the
-- origin check that refuses cross-site requests that would change something.
-- @module moonserve.security
local byte, format, gsub, lower, match, sub = string.byte, string.format, string.gsub,
    string.lower, string.match, string.sub
local ipairs, pairs, tonumber, tostring, type = ipairs, pairs, tonumber, tostring, type
local the_host = require "moonserve.host" -- the server: its clock, log and field rules

local _M = {}

local DEFAULTS = {
    nosniff = true,                                -- X-Content-Type-Options
    referrer = "strict-origin-when-cross-origin",  -- Referrer-Policy
    frame = "SAMEORIGIN",                          -- X-Frame-Options, and CSP frame-ancestors
    csp = nil,                                     -- Content-Security-Policy
    hsts = { max_age = 31536000, include_subdomains = false, preload = false },
}

local function line(name, value)
    if value:find("[%c]") then
        error("bad " .. name .. " value (control characters)", 4)
    end
    return name .. ": " .. value .. "\r\n"
end

-- -- Hosts and origins ---------------------------------------------------------------------

local DEFAULT_PORT = { http = "80", https = "443" }

--- The host and port of an authority ("Example.org:8080", "[::1]:8080", "[::1]", "a.test"):
-- the host in lower case (an IPv6 literal keeps its brackets), and the port as digits
-- without leading zeros, nil when there is none, or what follows the host when that is no
-- port (it then equals no real port). This is the one rule for where a Host field's port
-- starts: site matching uses it, and the core's static mounts cut the same way.
function _M.split_host(authority)
    local host, rest
    if byte(authority, 1) == 91 then -- "[": an IP literal, which has colons of its own
        host, rest = match(authority, "^(%[[^%]]*%])(.*)$")
        if not host then
            return lower(authority), nil
        end
    else
        host, rest = match(authority, "^([^:]*)(.*)$")
    end
    if rest == "" or rest == ":" then
        return lower(host), nil
    end
    local digits = match(rest, "^:(%d+)$")
    return lower(host), digits and tostring(tonumber(digits)) or rest
end
local split_host = _M.split_host

-- An Origin value ("https://example.org:8443") as scheme, host and port (nil when none is
-- written), or nil when it is not one. "null" is not one.
local function parse_origin(s)
    local scheme, authority = match(s, "^(%a[%w+.%-]*)://([^/?#@]+)$")
    if not scheme then
        return nil
    end
    local host, port = split_host(authority)
    if host == "" then
        return nil
    end
    return lower(scheme), host, port
end

-- The form origins are compared in: "scheme://host:port", the default port written out.
local function origin_key(s)
    local scheme, host, port = parse_origin(s)
    if not scheme then
        return nil
    end
    return scheme .. "://" .. host .. ":" .. (port or DEFAULT_PORT[scheme] or "")
end

-- -- The origin check ----------------------------------------------------------------------

-- Methods that must not change anything (RFC 9110 9.2.1). Every other method, including
-- ones this table does not know, is checked.
_M.SAFE = { GET = true, HEAD = true, OPTIONS = true, TRACE = true }

--- Whether a request's origin fields let it through. f: fetch_site (Sec-Fetch-Site), origin
-- (Origin), host (the authority the client asked for: Host, or X-Forwarded-Host from a
-- trusted proxy), scheme ("http" or "https" when it is known, from TLS or a trusted proxy;
-- nil when not). opts: origins (allowed origins, as compiled by compile), same_site (accept
-- Sec-Fetch-Site: same-site, which includes sibling subdomains). Returns true, or false and
-- the reason.
--
-- Browsers send Sec-Fetch-Site and Origin themselves; no page can set either. A request with
-- neither comes from a program (curl, another server), which could send any value it liked:
-- there is nothing to check, and it passes.
-- @local
function _M.origin_ok(f, opts)
    local o = f.origin
    if o then
        if o == "null" then -- sandboxed frames, data: URLs, redirects across origins
            return false, "Origin: null"
        end
        local key = origin_key(o)
        if not key then
            return false, "Origin: " .. o .. " (not an origin)"
        end
        local allowed = opts.origins
        if allowed and allowed[key] then -- cross-site by design, and browsers say so
            return true
        end
    end
    local site = f.fetch_site
    if site then
        site = lower(site)
        if site == "same-site" and opts.same_site then
            -- A sibling subdomain: its Origin names another host, and only the browser
            -- knows where the site's boundary is (the public suffix list).
            return true
        elseif site ~= "same-origin" and site ~= "none" then
            return false, "Sec-Fetch-Site: " .. site
        end
    end
    if not o then
        return true
    end
    local host = f.host
    if type(host) ~= "string" or host == "" then
        return false, "Origin: " .. o .. " (no Host to compare it with)"
    end
    local oscheme, ohost, oport = parse_origin(o)
    local hhost, hport = split_host(host)
    local scheme = f.scheme
    local same = ohost == hhost and DEFAULT_PORT[oscheme] ~= nil
    if same and scheme then
        same = oscheme == scheme
        hport = hport or DEFAULT_PORT[scheme]
    end
    if same then
        -- Without a port in Host, and without knowing the scheme, the port is the default of
        -- whichever scheme the client used: the Origin's own.
        same = (oport or DEFAULT_PORT[oscheme]) == (hport or DEFAULT_PORT[oscheme])
    end
    if not same then
        return false, "Origin: " .. o .. " (Host: " .. host .. ")"
    end
    return true
end
local origin_ok = _M.origin_ok

-- The last item of a list field ("a, b" -> "b"): what the nearest proxy added.
local function last_item(v)
    return v and match(v, "([^,%s]+)%s*$")
end

local DEFAULT_CHECK = { origins = nil, same_site = false }

--- The authority a request's client asked for, and its scheme when that is known: Host, or
-- from a trusted proxy its X-Forwarded-Host and X-Forwarded-Proto; "https" on a TLS
-- connection. Over plain TCP without a proxy the scheme is not known (a proxy in front may
-- have ended TLS).
-- @local
function _M.authority(req)
    local host, scheme = req:header("host"), nil
    if req.tls then
        scheme = "https"
    end
    if req.trusted_proxy then
        host = last_item(req:header("x-forwarded-host")) or host
        local proto = last_item(req:header("x-forwarded-proto"))
        proto = proto and lower(proto)
        if DEFAULT_PORT[proto] then
            scheme = proto
        end
    end
    return host, scheme
end
local authority = _M.authority

--- The origin check on a request: origin_ok with the request's fields (see authority).
-- opts as origin_ok's (the app's compiled `csrf` option); nil: the defaults. The rule for
-- every unsafe request, and for anything else that must come from the site's own pages.
function _M.same_origin(req, opts)
    local host, scheme = authority(req)
    return origin_ok({ fetch_site = req:header("sec-fetch-site"), origin = req:header("origin"),
        host = host, scheme = scheme }, opts or DEFAULT_CHECK)
end

-- Refusals are logged as one line a second with their count, as the core logs floods: a
-- cross-site flood must not make the log the next thing that overloads the worker. The
-- first refusal is logged at once; later ones within the second join the next line.
-- (The host is reached only here and in compile, so that the checks above run without it.)
local refused, logged_at, last_why = 0, nil, nil

--- Counts a refusal by the origin check for the once-a-second log line.
-- @local
function _M.log_refusal(method, path, why)
    refused = refused + 1
    last_why = sub(method .. " " .. path .. ": " .. why, 1, 200)
    local t = the_host.now()
    if logged_at == nil or t - logged_at >= 1 then
        the_host.log("warn", format("refused %d cross-origin requests (403), the last: %s",
            refused, last_why))
        refused, logged_at = 0, t
    end
end

-- The `csrf` option as the check wants it: false, or { origins = { key = true },
-- same_site }. Misuse raises at the caller of compile's caller.
local function compile_csrf(opt)
    if opt == nil or opt == true then
        return DEFAULT_CHECK
    elseif opt == false then
        return false
    elseif type(opt) ~= "table" then
        error("bad csrf option (false or a table of origins and same_site expected)", 4)
    end
    local c = { origins = nil, same_site = opt.same_site == true }
    for k in pairs(opt) do
        if k ~= "origins" and k ~= "same_site" then
            error("unknown csrf option " .. tostring(k), 4)
        end
    end
    if opt.origins ~= nil then
        if type(opt.origins) ~= "table" then
            error("bad csrf origins (a list of origins expected)", 4)
        end
        c.origins = {}
        for i, o in ipairs(opt.origins) do
            -- "https://app.example.org/" as people write it is the origin without the slash
            local key = type(o) == "string" and origin_key((gsub(o, "/$", "")))
            if not key then
                error(format("bad csrf origin %d (\"scheme://host[:port]\" expected)", i), 4)
            end
            c.origins[key] = true
        end
    end
    return c
end

--- Compiles options into { always = "lines", https = "lines", csrf = the origin check's
-- options or false } (https: only for requests that came over TLS). opts == false: no
-- headers at all (the origin check stays). Keys set to false turn one off; csrf = false
-- turns off the origin check.
-- @local
function _M.compile(opts)
    if opts == false then
        return { always = "", https = "", csrf = DEFAULT_CHECK }
    end
    opts = opts or {}
    if type(opts) ~= "table" then
        error("bad security options (table or false expected)", 3)
    end
    local function pick(k)
        if opts[k] == nil then
            return DEFAULTS[k]
        end
        return opts[k]
    end
    local always, https = {}, {}
    if pick("nosniff") then
        always[#always + 1] = line("x-content-type-options", "nosniff")
    end
    local referrer = pick("referrer")
    if referrer then
        always[#always + 1] = line("referrer-policy", referrer)
    end
    local frame, csp = pick("frame"), pick("csp")
    if frame then
        if frame ~= "DENY" and frame ~= "SAMEORIGIN" then
            error("bad frame option (DENY, SAMEORIGIN or false)", 3)
        end
        always[#always + 1] = line("x-frame-options", frame)
        local ancestors = frame == "DENY" and "'none'" or "'self'"
        if csp then
            if not csp:find("frame-ancestors", 1, true) then
                csp = csp .. "; frame-ancestors " .. ancestors
            end
        else
            csp = "frame-ancestors " .. ancestors
        end
    end
    if csp then
        always[#always + 1] = line("content-security-policy", csp)
    end
    local hsts = pick("hsts")
    if hsts then
        local v = "max-age=" .. math.floor(hsts.max_age or DEFAULTS.hsts.max_age)
        if hsts.include_subdomains then
            v = v .. "; includeSubDomains"
        end
        if hsts.preload then
            v = v .. "; preload"
        end
        https[#https + 1] = line("strict-transport-security", v)
    end
    local out = { always = table.concat(always), https = table.concat(https) }
    -- The one check every reply line passes (the host's), once here: the lines are sent
    -- unchecked after.
    for _, lines in pairs(out) do
        if not the_host.fields_ok(lines) then
            error("bad security fields " .. ("%q"):format(lines), 3)
        end
    end
    out.csrf = compile_csrf(opts.csrf)
    return out
end

return _M
