--- moonserve/pg/types.lua: PostgreSQL values in text format to Lua values, and Lua values to
-- the text of Bind parameters. A column's decoder is looked up once per statement, by type
-- OID, in tables built when this module loads: decoding a row calls plain functions.
-- @module moonserve.pg.types
local json = require "moonserve.json"
local ffi = require "ffi"

local byte, char, sub, find, match, gsub, format, upper =
    string.byte, string.char, string.sub, string.find, string.match, string.gsub,
    string.format, string.upper
local concat = table.concat
local type, tonumber, tostring, pairs, setmetatable, getmetatable, error =
    type, tonumber, tostring, pairs, setmetatable, getmetatable, error
local huge, floor = math.huge, math.floor

local NULL = json.null
local array_mt = json.array_mt
local json_decode, json_encode = json.decode, json.encode

local _M = {}

--- The SQL NULL: moonserve.json.null, so res:json(rows) writes null. A NULL column is this
-- value, never nil (a row's fields are never holes).
_M.NULL = NULL

-- PostgreSQL's MAXDIM (src/include/utils/array.h): no array has more dimensions. Deeper
-- literals are refused before any recursion, so a hostile literal cannot exhaust the C stack.
local MAX_DIMS = 6
_M.MAX_DIMS = MAX_DIMS

-- The built-in types' OIDs (src/include/catalog/pg_type.dat).
local oids = {
    bool = 16, bytea = 17, char = 18, name = 19, int8 = 20, int2 = 21, int4 = 23, regproc = 24,
    text = 25, oid = 26, xid = 28, cid = 29, json = 114, xml = 142, cidr = 650, float4 = 700,
    float8 = 701, money = 790, macaddr = 829, inet = 869, bpchar = 1042, varchar = 1043,
    date = 1082, time = 1083, timestamp = 1114, timestamptz = 1184, interval = 1186,
    timetz = 1266, bit = 1560, varbit = 1562, numeric = 1700, uuid = 2950, jsonb = 3802,
    -- arrays
    _bool = 1000, _bytea = 1001, _char = 1002, _name = 1003, _int2 = 1005, _int4 = 1007,
    _regproc = 1008, _text = 1009, _oid = 1028, _xid = 1011, _cid = 1012, _bpchar = 1014,
    _varchar = 1015, _int8 = 1016, _float4 = 1021, _float8 = 1022, _json = 199, _xml = 143,
    _cidr = 651, _money = 791, _macaddr = 1040, _inet = 1041, _date = 1182, _time = 1183,
    _timestamp = 1115, _timestamptz = 1185, _interval = 1187, _timetz = 1270, _bit = 1561,
    _varbit = 1563, _numeric = 1231, _uuid = 2951, _jsonb = 3807,
}
_M.oids = oids

-- -- Scalars ---------------------------------------------------------------------------

local function text(s)
    return s
end

local function bool(s)
    if s == "t" then
        return true
    elseif s == "f" then
        return false
    end
    return nil, "pg: bad boolean text"
end

local function integer(s)
    local n = tonumber(s)
    if n then
        return n
    end
    return nil, "pg: bad integer text"
end

local TWO53 = 2 ^ 53

-- int8: a number while it is exact in a double, else the server's digits.
local function int8(s)
    local n = tonumber(s)
    if not n then
        return nil, "pg: bad integer text"
    end
    -- |n| < 2^53 after rounding means the text was below 2^53 too, so n is exact
    if n < TWO53 and n > -TWO53 then
        return n
    end
    return s
end

local specials = { NaN = 0 / 0, Infinity = huge, ["-Infinity"] = -huge }

local function float(s)
    local n = tonumber(s) or specials[s]
    if n then
        return n
    end
    return nil, "pg: bad number text"
end

local function jsonv(s)
    return json_decode(s) -- null is json.null, which is NULL
end

-- bytea's hex output ("\x" then two hex digits a byte), the default since PostgreSQL 9.0;
-- the escape output (bytea_output = escape: "\\" and "\ooo" octal) is read too.
local hexpair = {}
for i = 0, 255 do
    local c = char(i)
    hexpair[format("%02x", i)] = c
    hexpair[format("%02X", i)] = c
    hexpair[format("%x%X", floor(i / 16), i % 16)] = c
    hexpair[format("%X%x", floor(i / 16), i % 16)] = c
end

local B_BSLASH = 92

local function bytea(s)
    if sub(s, 1, 2) == "\\x" then
        if #s % 2 ~= 0 or find(s, "[^%x]", 3) then
            return nil, "pg: bad bytea hex text"
        end
        return (gsub(sub(s, 3), "..", hexpair))
    end
    if not find(s, "\\", 1, true) then
        return s
    end
    local parts, n, from = {}, 0, 1
    while true do
        local b = find(s, "\\", from, true)
        if not b then
            parts[n + 1] = sub(s, from)
            return concat(parts)
        end
        parts[n + 1] = sub(s, from, b - 1)
        if byte(s, b + 1) == B_BSLASH then
            parts[n + 2] = "\\"
            from = b + 2
        else
            local o = match(s, "^[0-3][0-7][0-7]", b + 1)
            if not o then
                return nil, "pg: bad bytea escape text"
            end
            parts[n + 2] = char(tonumber(o, 8))
            from = b + 4
        end
        n = n + 2
    end
end

-- -- Arrays: the text literal (array_out in src/backend/utils/adt/arrayfuncs.c) -------------
-- {a,b}, nested {{1,2},{3,4}}, an element quoted ("...", with \" and \\) when it holds a
-- delimiter, a brace, a quote, a backslash or space or is empty or the word NULL; NULL
-- unquoted is the SQL NULL; "[1:2]={...}" when the lower bound is not 1.

local B_OPEN, B_CLOSE, B_QUOTE, B_COMMA = 123, 125, 34, 44
local SPACE = { [32] = true, [9] = true, [10] = true, [11] = true, [12] = true, [13] = true }

-- The scanning is byte by byte (string.byte and string.sub): LuaJIT compiles those, while
-- pattern matching would leave the loop to the interpreter.
local function skip_space(s, pos)
    while SPACE[byte(s, pos)] do
        pos = pos + 1
    end
    return pos
end

local MIXED = "pg: bad array literal (elements mixed with sub-arrays)"

-- Parses the array at `pos` (a "{"): the marked Lua sequence and the position after its
-- "}", or nil and an error.
local function parse_array(s, pos, depth, elem)
    if depth > MAX_DIMS then
        return nil, "pg: bad array literal (more than " .. MAX_DIMS .. " dimensions)"
    end
    local out, n, nested = setmetatable({}, array_mt), 0, nil
    pos = skip_space(s, pos + 1)
    if byte(s, pos) == B_CLOSE then
        return out, pos + 1
    end
    while true do
        pos = skip_space(s, pos)
        local c = byte(s, pos)
        local v, err
        if c == B_OPEN then
            if nested == false then
                return nil, MIXED
            end
            nested = true
            v, pos = parse_array(s, pos, depth + 1, elem)
            if not v then
                return nil, pos
            end
        else
            if nested then
                return nil, MIXED
            end
            nested = false
            if c == B_QUOTE then
                local parts, np, from, q = nil, 0, pos + 1, pos + 1
                while true do
                    c = byte(s, q)
                    if c == B_QUOTE then
                        break
                    elseif c == B_BSLASH then
                        -- a backslash quotes the next character, whatever it is
                        if q == #s then
                            return nil, "pg: bad array literal (backslash at the end)"
                        end
                        parts = parts or {}
                        parts[np + 1] = sub(s, from, q - 1)
                        parts[np + 2] = sub(s, q + 1, q + 1)
                        np = np + 2
                        from = q + 2
                        q = q + 2
                    elseif c == nil then
                        return nil, "pg: bad array literal (unterminated quote)"
                    else
                        q = q + 1
                    end
                end
                if parts then
                    parts[np + 1] = sub(s, from, q - 1)
                    v = concat(parts)
                else
                    v = sub(s, from, q - 1)
                end
                pos = q + 1
                v, err = elem(v)
                if v == nil then
                    return nil, err or "pg: bad array element"
                end
            else
                -- unquoted: up to "," or "}", without braces, quotes or backslashes;
                -- spaces around it are not part of it
                local start = pos
                while c ~= B_COMMA and c ~= B_CLOSE do
                    if c == nil or c == B_OPEN or c == B_QUOTE or c == B_BSLASH then
                        return nil, "pg: bad array literal (bad element at " .. pos .. ")"
                    end
                    pos = pos + 1
                    c = byte(s, pos)
                end
                local last = pos - 1
                while last >= start and SPACE[byte(s, last)] do
                    last = last - 1
                end
                if last < start then
                    return nil, "pg: bad array literal (empty element at " .. pos .. ")"
                end
                local e = sub(s, start, last)
                if last - start == 3 and upper(e) == "NULL" then
                    v = NULL
                else
                    v, err = elem(e)
                    if v == nil then
                        return nil, err or "pg: bad array element"
                    end
                end
            end
        end
        n = n + 1
        out[n] = v
        pos = skip_space(s, pos)
        c = byte(s, pos)
        if c == B_CLOSE then
            return out, pos + 1
        elseif c ~= B_COMMA then
            return nil, "pg: bad array literal (expected ',' or '}' at " .. pos .. ")"
        end
        pos = pos + 1
    end
end

local function parse_literal(s, elem)
    if type(s) ~= "string" then
        return nil, "pg: bad array literal"
    end
    local pos = 1
    if byte(s, 1) == 91 then -- "[": explicit bounds, "[lo:hi][lo:hi]={...}"
        local dims = match(s, "^[%[%]%d:%-]+=")
        local left, count = gsub(dims or "", "%[%-?%d+:%-?%d+%]", "")
        if left ~= "=" or count > MAX_DIMS then
            return nil, "pg: bad array literal (bad dimensions)"
        end
        pos = #dims + 1
    end
    if byte(s, pos) ~= B_OPEN then
        return nil, "pg: bad array literal (no '{')"
    end
    local v, at = parse_array(s, pos, 1, elem)
    if not v then
        return nil, at
    end
    if skip_space(s, at) <= #s then
        return nil, "pg: bad array literal (text after the last '}')"
    end
    return v
end

--- Parses an array literal with `elem` (a function(text) -> value, or nil, err) for its
-- elements: for arrays whose OID is not built in (of an enum, a domain), which decoder()
-- gives as text. Returns the marked sequence, or nil and an error.
-- @usage types.parse_array("{a,b}", function(s) return s end)
_M.parse_array = parse_literal

-- -- Decoders by OID ---------------------------------------------------------------------

-- The element decoders by scalar type; any OID not named is text.
local scalar = {
    [oids.bool] = bool, [oids.int2] = integer, [oids.int4] = integer, [oids.oid] = integer,
    [oids.xid] = integer, [oids.cid] = integer, [oids.int8] = int8, [oids.float4] = float,
    [oids.float8] = float, [oids.json] = jsonv, [oids.jsonb] = jsonv, [oids.bytea] = bytea,
}

-- array OID -> element OID
local elements = {}
for name, oid in pairs(oids) do
    if sub(name, 1, 1) == "_" then
        elements[oid] = oids[sub(name, 2)]
    end
end

local function array_of(elem)
    return function(s)
        return parse_literal(s, elem)
    end
end

-- One table per choice of opts.numeric; each holds a function for every known OID.
local by_mode = {}
for _, mode in pairs({ "string", "number" }) do
    local t = {}
    for oid, f in pairs(scalar) do
        t[oid] = f
    end
    t[oids.numeric] = mode == "number" and float or text
    for aoid, eoid in pairs(elements) do
        t[aoid] = array_of(t[eoid] or text)
    end
    by_mode[mode] = t
end

--- The decoder of a column of type `oid` in text format: a function(text) that returns the
-- Lua value, or nil and an error for text that is not of its type (a malformed array literal
-- or JSON text). The caller handles NULL columns (types.NULL) itself. `opts.numeric` is
-- "string" (the default: numeric keeps every digit) or "number". An OID not known here
-- decodes as its text.
-- @usage local dec = types.decoder(23) ; dec("42") --> 42
function _M.decoder(oid, opts)
    local mode = opts and opts.numeric or "string"
    local t = by_mode[mode]
    if not t then
        error("bad option numeric (\"string\" or \"number\" expected)", 2)
    end
    return t[oid] or text
end

-- -- Encoding parameters -----------------------------------------------------------------

local json_mt = { __name = "moonserve.pg.json" }
local bytea_mt = { __name = "moonserve.pg.bytea" }

--- Wraps `v` to be sent as JSON text (jsonb): types.encode gives json.encode(v).
function _M.json(v)
    return setmetatable({ value = v }, json_mt)
end

--- Wraps the bytes `s` to be sent as bytea ("\x" and hex).
function _M.bytea(s)
    if type(s) ~= "string" then
        error("bad argument to pg.bytea (string expected, got " .. type(s) .. ")", 2)
    end
    return setmetatable({ value = s }, bytea_mt)
end

local tohex = {}
for i = 0, 255 do
    tohex[char(i)] = format("%02x", i)
end

local int64_t, uint64_t = ffi.typeof("int64_t"), ffi.typeof("uint64_t")

local function number_text(v)
    if v % 1 == 0 and v < TWO53 and v > -TWO53 then
        return format("%d", v)
    elseif v ~= v then
        return "NaN"
    elseif v == huge then
        return "Infinity"
    elseif v == -huge then
        return "-Infinity"
    end
    -- the shortest of %.15g, %.16g, %.17g that reads back the same double (0.1, not
    -- 0.10000000000000001; 17 digits always do)
    local t = format("%.15g", v)
    if tonumber(t) == v then
        return t
    end
    t = format("%.16g", v)
    if tonumber(t) == v then
        return t
    end
    return format("%.17g", v)
end

local TABLE_ERR = "pg: a table parameter must be a sequence (an array) or pg.json(t)"

local scalar_text -- forward

-- Whether `t` is a sequence 1..n without holes (an empty table is an empty array).
local function is_sequence(t)
    if getmetatable(t) == array_mt then
        return true
    end
    local n, count = #t, 0
    for _ in pairs(t) do
        count = count + 1
        if count > n then
            return false
        end
    end
    return count == n
end

-- The array literal of the sequence `t` into out[]: elements quoted (array_in accepts any
-- element quoted), NULL unquoted.
local function array_text(t, out, depth)
    if depth > MAX_DIMS then
        error("pg: an array parameter has more than " .. MAX_DIMS .. " dimensions", 0)
    end
    out[#out + 1] = "{"
    for i = 1, #t do
        if i > 1 then
            out[#out + 1] = ","
        end
        local v = t[i]
        if v == NULL then
            out[#out + 1] = "NULL"
        elseif type(v) == "table" and getmetatable(v) ~= json_mt and getmetatable(v) ~= bytea_mt
        then
            if not is_sequence(v) then
                error(TABLE_ERR, 0)
            end
            array_text(v, out, depth + 1)
        else
            out[#out + 1] = '"' .. gsub(scalar_text(v), '["\\]', "\\%0") .. '"'
        end
    end
    out[#out + 1] = "}"
end

scalar_text = function(v)
    local tv = type(v)
    if tv == "string" then
        return v
    elseif tv == "number" then
        return number_text(v)
    elseif tv == "boolean" then
        return v and "t" or "f"
    elseif tv == "table" then
        local mt = getmetatable(v)
        if mt == json_mt then
            return json_encode(v.value)
        elseif mt == bytea_mt then
            return "\\x" .. gsub(v.value, ".", tohex)
        end
    elseif tv == "cdata" and (ffi.istype(int64_t, v) or ffi.istype(uint64_t, v)) then
        return (match(tostring(v), "^(%-?%d+)"))
    end
    error("pg: a parameter cannot be a " .. tv, 0)
end

--- The text and type OID of a Bind parameter for `value`: nil for NULL (types.NULL or nil);
-- booleans "t"/"f"; integers without ".0", other numbers in the fewest digits
-- (up to %.17g) that read back the same double, NaN, Infinity; strings as
-- they are; types.bytea(s) as "\x" and hex; types.json(v) as JSON text with OID 3802
-- (jsonb); a sequence as an array literal. The OID is 0 (the server infers the type from
-- the statement) but for JSON. Raises on any other table or type.
-- @return text or nil, oid
function _M.encode(value)
    if value == nil or value == NULL then
        return nil, 0
    end
    local tv = type(value)
    if tv == "table" then
        local mt = getmetatable(value)
        if mt == json_mt then
            return json_encode(value.value), oids.jsonb
        elseif mt ~= bytea_mt then
            if not is_sequence(value) then
                error(TABLE_ERR, 2)
            end
            local out = {}
            array_text(value, out, 1)
            return concat(out), 0
        end
    end
    return scalar_text(value), 0
end

return _M
