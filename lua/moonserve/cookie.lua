--- moonserve/cookie.lua: parsing Cookie request fields and building Set-Cookie values (RFC 6265).
-- @module moonserve.cookie
local byte, find, format, lower, sub = string.byte, string.find, string.format, string.lower,
    string.sub
local concat, floor, type, tostring = table.concat, math.floor, type, tostring

local _M = { MAX_PAIRS = 100 }

-- token (RFC 9110 5.6.2): what a cookie name may be made of.
local TOKEN = "^[%w!#$%%&'*+%-.^_`|~]+$"
-- Anything but a cookie-octet (RFC 6265 4.1.1): controls, space, DQUOTE, comma, semicolon,
-- backslash, DEL and every non-ASCII byte.
local NOT_OCTET = "[%c \",;\\\128-\255]"

-- header:sub(i, j) without the spaces and tabs at either end. By bytes rather than a
-- pattern: string.match is not compiled by the JIT, and a lazy pattern over a long value
-- (an encrypted session) cost more than the rest of the request.
local function trim(header, i, j)
    local b = byte(header, i)
    while i <= j and (b == 32 or b == 9) do
        i = i + 1
        b = byte(header, i)
    end
    b = byte(header, j)
    while j >= i and (b == 32 or b == 9) do
        j = j - 1
        b = byte(header, j)
    end
    return sub(header, i, j)
end

--- Parses a Cookie field ("a=1; b=2") into { a = "1", b = "2" }. A value in double quotes is
-- unquoted; values are not percent-decoded. The first pair with a name wins, as browsers
-- send the most specific cookie first. Pairs without "=" or with a name that is not a token
-- are skipped. At most `max` pieces are read (default 100): a field stuffed with pairs costs
-- no more than that. `header` may be nil (no Cookie field): the result is then empty.
function _M.parse(header, max)
    local t = {}
    if header == nil then
        return t
    end
    if type(header) ~= "string" then
        error("bad cookie header (string expected, got " .. type(header) .. ")", 2)
    end
    max = max or _M.MAX_PAIRS
    local pos, n, len = 1, 0, #header
    local eq = 0    -- the next "=" at or after pos (found once, kept while it is ahead)
    while pos <= len and n < max do
        local semi = find(header, ";", pos, true) or len + 1
        if eq and eq < pos then
            eq = find(header, "=", pos, true)
        end
        if eq and eq < semi then    -- "=" in this piece only
            local name = trim(header, pos, eq - 1)
            local value = trim(header, eq + 1, semi - 1)
            local vl = #value
            if vl >= 2 and byte(value, 1) == 34 and byte(value, vl) == 34 then -- '"'
                value = sub(value, 2, -2)
            end
            if t[name] == nil and find(name, TOKEN) then
                t[name] = value
            end
        end
        if semi > pos then
            n = n + 1
        end
        pos = semi + 1
    end
    return t
end

-- IMF-fixdate (RFC 9110 5.6.7), with its own names: os.date's %a and %b follow the locale.
local DAYS = { "Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat" }
local MONTHS = { "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
    "Dec" }

--- `t` (seconds since the epoch) as an HTTP date: `Sun, 06 Nov 1994 08:49:37 GMT`.
function _M.http_date(t)
    local d = os.date("!*t", t)
    return format("%s, %02d %s %04d %02d:%02d:%02d GMT", DAYS[d.wday], d.day, MONTHS[d.month],
        d.year, d.hour, d.min, d.sec)
end

local SAME_SITE = { strict = "Strict", lax = "Lax", none = "None" }

-- An attribute value may not end the attribute early or break the field.
local function attr_value(v, what)
    if type(v) ~= "string" or v == "" or find(v, "[%c;]") then
        error("bad cookie " .. what .. " (string without controls or ';' expected)", 3)
    end
    return v
end

local function integer(v, what)
    if type(v) ~= "number" or v ~= floor(v) then
        error("bad cookie " .. what .. " (integer expected, got " .. tostring(v) .. ")", 3)
    end
    return v
end

--- Builds a Set-Cookie value. `value` is a string or a number, sent as it is: it must be made
-- of cookie-octets (encode it first, base64url or percent-encoding). opts: path, domain,
-- max_age (seconds), expires (a time, seconds since the epoch), secure, http_only, same_site
-- ("Strict", "Lax" or "None", any case), partitioned. Misuse raises, including SameSite=None
-- or Partitioned without Secure, which browsers would drop.
-- @usage cookie.serialize("sid", "abc", { path = "/", http_only = true, same_site = "Lax" })
function _M.serialize(name, value, opts)
    if type(name) ~= "string" or not find(name, TOKEN) then
        error("bad cookie name (token expected)", 2)
    end
    local tv = type(value)
    if value == nil then
        value = ""
    elseif tv == "number" then
        value = tostring(value)
    elseif tv ~= "string" then
        error("bad cookie value for " .. name .. " (string expected, got " .. tv .. ")", 2)
    end
    local inner = value:match('^"(.*)"$') or value    -- a quoted value is allowed as well
    if find(inner, NOT_OCTET) then
        error("bad cookie value for " .. name .. " (cookie-octets expected: encode it first)", 2)
    end
    opts = opts or {}
    local parts = { name .. "=" .. value }
    if opts.path ~= nil then
        parts[#parts + 1] = "Path=" .. attr_value(opts.path, "path")
    end
    if opts.domain ~= nil then
        parts[#parts + 1] = "Domain=" .. attr_value(opts.domain, "domain")
    end
    if opts.max_age ~= nil then
        parts[#parts + 1] = format("Max-Age=%d", integer(opts.max_age, "max_age"))
    end
    if opts.expires ~= nil then
        parts[#parts + 1] = "Expires=" .. _M.http_date(integer(opts.expires, "expires"))
    end
    if opts.secure then
        parts[#parts + 1] = "Secure"
    end
    if opts.http_only then
        parts[#parts + 1] = "HttpOnly"
    end
    if opts.same_site ~= nil then
        local ss = type(opts.same_site) == "string" and SAME_SITE[lower(opts.same_site)]
        if not ss then
            error("bad same_site (Strict, Lax or None expected)", 2)
        end
        if ss == "None" and not opts.secure then
            error("same_site None needs secure: browsers refuse the cookie without it", 2)
        end
        parts[#parts + 1] = "SameSite=" .. ss
    end
    if opts.partitioned then
        if not opts.secure then
            error("partitioned needs secure: browsers refuse the cookie without it", 2)
        end
        parts[#parts + 1] = "Partitioned"
    end
    return concat(parts, "; ")
end

return _M
