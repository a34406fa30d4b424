--- moonserve/codec.lua: percent-decoding and urlencoded forms (query strings and bodies).
-- @module moonserve.codec
local byte, char, find, gsub, sub = string.byte, string.char, string.find, string.gsub, string.sub
local tonumber = tonumber

local _M = {}

local function hex_byte(h)
    return char(tonumber(h, 16))
end

--- Decodes %XX escapes; with `plus`, "+" is a space (forms and query strings).
function _M.unescape(s, plus)
    if plus and find(s, "+", 1, true) then
        s = gsub(s, "+", " ")
    end
    if find(s, "%", 1, true) then
        s = gsub(s, "%%(%x%x)", hex_byte)
    end
    return s
end

local function escape_byte(c)
    return string.format("%%%02X", byte(c))
end

--- Encodes every byte but the unreserved ones (RFC 3986 2.3).
function _M.escape(s)
    return (gsub(s, "[^%w%-%._~]", escape_byte))
end

local unescape = _M.unescape

--- Adds value `v` of key `k` to `t`: the value alone the first time, then the list of the
-- values in order (what a repeated argument of a query string or form gives).
function _M.add_value(t, k, v)
    local old = t[k]
    if old == nil then
        t[k] = v
    elseif type(old) == "table" then
        old[#old + 1] = v
    else
        t[k] = { old, v }
    end
end
local add_value = _M.add_value

--- Parses "a=1&b=2&a=3" into { a = { "1", "3" }, b = "2" }: a key seen once maps to its
-- value, a repeated key to the list of its values in order. A key without "=" maps to "".
-- At most `max` pairs are read (default 1000): the rest is ignored, not an error.
-- @usage codec.parse_form("a=1&b=2&a=3")   -- { a = { "1", "3" }, b = "2" }
function _M.parse_form(s, max)
    local t = {}
    if s == nil or s == "" then
        return t
    end
    max = max or 1000
    local pos, n, len = 1, 0, #s
    while pos <= len and n < max do
        local amp = find(s, "&", pos, true) or len + 1
        if amp > pos then
            local eq = find(s, "=", pos, true)
            local k, v
            if eq and eq < amp then
                k, v = sub(s, pos, eq - 1), sub(s, eq + 1, amp - 1)
            else
                k, v = sub(s, pos, amp - 1), ""
            end
            add_value(t, unescape(k, true), unescape(v, true))
            n = n + 1
        end
        pos = amp + 1
    end
    return t
end

--- Encodes a table as a form; list values repeat their key. Keys are sorted, so the result
-- is stable.
function _M.encode_form(t)
    local keys = {}
    for k in pairs(t) do
        keys[#keys + 1] = tostring(k)
    end
    table.sort(keys)
    local out = {}
    for _, k in ipairs(keys) do
        local v = t[k]
        if type(v) == "table" then
            for _, x in ipairs(v) do
                out[#out + 1] = _M.escape(k) .. "=" .. _M.escape(tostring(x))
            end
        else
            out[#out + 1] = _M.escape(k) .. "=" .. _M.escape(tostring(v))
        end
    end
    return table.concat(out, "&")
end

-- Escapes text for HTML element content and attribute values.
local html_escapes = { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;",
    ["'"] = "&#39;" }
--- `s` with `& < > " '` escaped for HTML element content and quoted attributes.
function _M.escape_html(s)
    return (gsub(tostring(s), "[&<>\"']", html_escapes))
end

return _M
