-- moonserve/security.lua: the security headers every reply gets unless a site says
-- otherwise, built once into field lines the core adds in one call.
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

-- Compiles options into { always = "lines", https = "lines" } (https: only for requests
-- that came over TLS). opts == false: no headers at all. Keys set to false turn one off.
function _M.compile(opts)
    if opts == false then
        return { always = "", https = "" }
    end
    opts = opts or {}
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
    -- The one check every reply line passes, once here: the lines are sent unchecked after.
    local C = require("moonserve.base").C
    for _, lines in pairs(out) do
        if C.ms_ffi_fields_check(lines, #lines) ~= 0 then
            error("bad security fields " .. ("%q"):format(lines), 3)
        end
    end
    return out
end

return _M
