--- moonserve/json.lua: JSON that keeps its shapes: arrays marked as arrays (an empty one is
-- `[]`, not `{}`) and `null` as a value, over lua-cjson (res:json and req:json use it).
-- @module moonserve.json
local cjson = require "cjson"
-- A decoder of our own (lua-cjson's default one may be set otherwise by others in the
-- process): "nan", "inf" and hex numbers are not JSON (RFC 8259 6), and give an error.
local decoder = require("cjson.safe").new()
decoder.decode_invalid_numbers(false)
local crypto = require "moonserve.crypto"

local type, pairs, next, getmetatable, setmetatable, concat, find, sub, error =
    type, pairs, next, getmetatable, setmetatable, table.concat, string.find, string.sub, error
local huge = math.huge

local _M = {}

--- What decoding gives for `null`, and what encodes as `null`: lua-cjson's own (a value
-- distinct from nil, so a list may hold it and a field may be set to it).
_M.null = cjson.null

-- The metatable of the tables marked as arrays.
local array_mt = { __name = "moonserve.json.array" }
_M.array_mt = array_mt

-- Set once a table was marked: until then encode() is lua-cjson's alone, with no walk.
local marked = false

--- Marks `t` (or a new table) to encode as a JSON array, an empty one as `[]`. Its
-- metatable is replaced.
-- @tparam[opt] table t
-- @treturn table t
-- @usage res:json{ tags = moonserve.json.array{} }   -- {"tags":[]}
function _M.array(t)
    t = t or {}
    if type(t) ~= "table" then
        error("bad argument to json.array (table expected, got " .. type(t) .. ")", 2)
    end
    marked = true
    return setmetatable(t, array_mt)
end

--- Whether `t` was marked with json.array.
function _M.is_array(t)
    return type(t) == "table" and getmetatable(t) == array_mt
end

local MAX_DEPTH = 1000 -- as lua-cjson's encoder

-- Whether `v` holds an empty marked array, MAX_DEPTH levels down at most (deeper, lua-cjson
-- raises anyway).
local function has_empty_array(v, depth)
    if depth > MAX_DEPTH then
        return false
    end
    if getmetatable(v) == array_mt and next(v) == nil then
        return true
    end
    for _, x in pairs(v) do
        if type(x) == "table" and has_empty_array(x, depth + 1) then
            return true
        end
    end
    return false
end

-- Whether `t` is a list 1..n without holes (or marked as an array).
local function is_list(t)
    if getmetatable(t) == array_mt then
        return true
    end
    local n = #t
    if n == 0 then
        return false
    end
    local count = 0
    for _ in pairs(t) do
        count = count + 1
    end
    return count == n
end

-- The encoder for values that hold an empty marked array: tables walked here, the rest
-- (strings, numbers, booleans, null) and the tables without any marked array below them
-- are lua-cjson's.
local function encode_into(v, out, depth)
    if type(v) ~= "table" then
        out[#out + 1] = cjson.encode(v)
        return
    end
    if depth > MAX_DEPTH then
        error("Cannot serialise, excessive nesting (" .. MAX_DEPTH .. ")", 0)
    end
    if not has_empty_array(v, depth) then
        out[#out + 1] = cjson.encode(v)
        return
    end
    if is_list(v) then
        out[#out + 1] = "["
        for i = 1, #v do
            if i > 1 then
                out[#out + 1] = ","
            end
            encode_into(v[i], out, depth + 1)
        end
        out[#out + 1] = "]"
        return
    end
    out[#out + 1] = "{"
    local first = true
    for k, x in pairs(v) do
        local tk = type(k)
        if tk ~= "string" and tk ~= "number" then
            error("Cannot serialise " .. tk .. ": table key must be a number or string", 0)
        end
        if not first then
            out[#out + 1] = ","
        end
        first = false
        out[#out + 1] = cjson.encode(tostring(k))
        out[#out + 1] = ":"
        encode_into(x, out, depth + 1)
    end
    out[#out + 1] = "}"
end

--- `v` as JSON text. Raises on what JSON cannot hold (functions, cycles, excessive nesting),
-- as lua-cjson.
-- @return string
function _M.encode(v)
    if not marked or type(v) ~= "table" then
        return cjson.encode(v)
    end
    -- lua-cjson writes every empty table as `{}`: text without one has no empty array to
    -- mend, and the walk below (which LuaJIT leaves to the interpreter) is skipped.
    local ok, s = pcall(cjson.encode, v)
    if ok and not find(s, "{}", 1, true) then
        return s
    end
    if not has_empty_array(v, 1) then
        return ok and s or cjson.encode(v) -- (raises as lua-cjson does)
    end
    local out = {}
    encode_into(v, out, 1)
    return concat(out)
end

-- The positions of the `[` of the empty arrays of JSON text (`[]` outside strings), found
-- by skipping its strings; nil when there is none.
local function empty_arrays(s)
    local pos, found = 1, nil
    while true do
        local i = find(s, '["[]', pos)
        if not i then
            return found
        end
        if sub(s, i, i) == '"' then
            -- skip the string: to the next quote not escaped
            local j = i + 1
            while true do
                local q = find(s, '["\\]', j)
                if not q then
                    return found
                end
                if sub(s, q, q) == "\\" then
                    j = q + 2
                else
                    pos = q + 1
                    break
                end
            end
        else
            if find(s, "^%s*%]", i + 1) then
                found = found or {}
                found[#found + 1] = i
            end
            pos = i + 1
        end
    end
end

-- Turns the marker lists of a decoded value (where the text had `[]`) into empty arrays.
local function mark(v, token, depth)
    if depth > MAX_DEPTH then
        return v
    end
    if v[1] == token and #v == 1 then
        v[1] = nil
        return setmetatable(v, array_mt)
    end
    for k, x in pairs(v) do
        if type(x) == "table" then
            v[k] = mark(x, token, depth + 1)
        end
    end
    return v
end

-- Whether `s` may hold a number too large for a double (an exponent of three digits, or 309
-- digits in a row), which would decode to an infinity.
local function may_overflow(s)
    return find(s, "[eE][+]?%d%d%d") ~= nil or find(s, "%d" .. string.rep("%d", 308)) ~= nil
end

-- Whether every number in `v` is finite (a NaN or an infinity cannot be encoded again).
local function finite(v, depth)
    local t = type(v)
    if t == "number" then
        return v == v and v ~= huge and v ~= -huge
    elseif t ~= "table" or depth > 1000 then
        return true
    end
    for k, x in pairs(v) do
        if not finite(k, depth + 1) or not finite(x, depth + 1) then
            return false
        end
    end
    return true
end

--- Decodes JSON text: `null` gives json.null; an empty array comes back marked
-- (json.is_array), so it encodes as `[]` again (other arrays are plain lists, which encode
-- as arrays while they hold items).
-- @tparam string s
-- @return the value, or nil and an error
function _M.decode(s)
    if type(s) ~= "string" then
        return nil, "JSON text expected, got " .. type(s)
    end
    local token
    local at = empty_arrays(s)
    if at then
        -- each `[]` holds a marker string: random, so no text can hold it in advance
        local hex = crypto.hex(crypto.random(12))
        token = "\1ms" .. hex
        local marker = '"\\u0001ms' .. hex .. '"'
        local out, from = {}, 1
        for n = 1, #at do
            out[#out + 1] = sub(s, from, at[n])
            out[#out + 1] = marker
            from = at[n] + 1
        end
        out[#out + 1] = sub(s, from)
        s = concat(out)
    end
    local v, err = decoder.decode(s)
    if v == nil then
        return nil, err
    end
    if may_overflow(s) and not finite(v, 1) then
        return nil, "a number out of range (larger than a double holds)"
    end
    if token and type(v) == "table" then
        marked = true
        v = mark(v, token, 1)
    end
    return v
end

return _M
