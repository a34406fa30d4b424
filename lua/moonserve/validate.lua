--- moonserve/validate.lua: schemas for params, queries and JSON bodies. A schema gives a
-- validator, v(input) -> data, errors: data holds the declared fields only (text coerced to
-- the field's type), errors every field's message, keyed by path ("tags[2]", "author.name").
-- @module moonserve.validate
-- @usage local v = moonserve.validate{ title = { "string", required = true, max_len = 200 } }
-- local data, errors = v(req:json()); if errors then return res:invalid(errors) end
local json = require "moonserve.json"

local setmetatable, type, pairs, tonumber, tostring, error, pcall, find, gsub, concat, huge =
    setmetatable, type, pairs, tonumber, tostring, error, pcall, string.find, string.gsub, table.concat,
    math.huge

local null = json.null

local _M = {}

-- The options each type takes (every type takes those of ANY).
local ANY = { [1] = true, required = true, default = true, check = true, nullable = true,
    enum = true }
local OPTIONS = {
    string = { min_len = true, max_len = true, pattern = true },
    integer = { min = true, max = true },
    number = { min = true, max = true },
    boolean = {},
    array = { min = true, max = true, of = true },
    table = { fields = true },
    object = { fields = true },
}

-- What each option must be.
local KINDS = { required = "boolean", check = "function", nullable = "boolean", enum = "table",
    min_len = "number", max_len = "number", pattern = "string", min = "number",
    max = "number", fields = "table" }

local compile

-- A field's spec, checked: a type name alone ("string") or { "type", option = ... }.
local function compile_field(spec, where)
    if type(spec) == "string" then
        spec = { spec }
    end
    if type(spec) ~= "table" then
        error("moonserve.validate: bad spec for " .. where .. " (table or type name expected)", 0)
    end
    local t = spec[1]
    local own = OPTIONS[t]
    if not own then
        error("moonserve.validate: unknown type " .. tostring(t) .. " for " .. where, 0)
    end
    local f = { type = t == "object" and "table" or t }
    for k, v in pairs(spec) do
        if not ANY[k] and not own[k] then
            error("moonserve.validate: unknown option " .. tostring(k) .. " for " .. where ..
                " (a " .. t .. ")", 0)
        end
        local kind = KINDS[k]
        if kind and type(v) ~= kind then
            error("moonserve.validate: bad option " .. k .. " for " .. where .. " (" .. kind ..
                " expected)", 0)
        end
        if k ~= 1 then
            f[k] = v
        end
    end
    if f.pattern and not pcall(find, "", f.pattern) then
        error("moonserve.validate: bad pattern for " .. where .. ": " .. f.pattern, 0)
    end
    if f.enum then
        local set, list = {}, {}
        for i, x in pairs(f.enum) do
            set[x] = true
            list[#list + 1] = tostring(f.enum[i])
        end
        f.enum_set, f.enum_text = set, "one of: " .. concat(list, ", ")
    end
    if f.fields then
        f.fields = compile(f.fields, where .. ".")
    end
    if spec.of ~= nil then
        f.of = compile_field(spec.of, where .. "[]")
    end
    return f
end

-- A schema's fields, checked, as a list of { name, field }.
function compile(schema, prefix)
    if type(schema) ~= "table" then
        error("moonserve.validate: bad schema (table expected, got " .. type(schema) .. ")", 0)
    end
    local list = {}
    for name, spec in pairs(schema) do
        if type(name) ~= "string" then
            error("moonserve.validate: bad field name " .. tostring(name) .. " (string expected)",
                0)
        end
        list[#list + 1] = { name, compile_field(spec, prefix .. name) }
    end
    table.sort(list, function(a, b) return a[1] < b[1] end)
    return list
end

-- UTF-8 characters in s (its bytes but the continuation ones).
local function chars(s)
    local _, cont = gsub(s, "[\128-\191]", "")
    return #s - cont
end

-- Whether t is a list 1..n (an empty table is one).
local function is_list(t)
    local n = #t
    local count = 0
    for _ in pairs(t) do
        count = count + 1
        if count > n then
            return false
        end
    end
    return count == n
end

local check_value

-- Text of a query or path as a number, or nil: decimal only (no hex, no "inf", no "nan").
local function text_number(s)
    if find(s, "^%s*-?%d+%.?%d*[eE]?[-+]?%d*%s*$") or find(s, "^%s*-?%.%d+%s*$") then
        local n = tonumber(s)
        if n and n == n and n ~= huge and n ~= -huge then
            return n
        end
    end
    return nil
end

local function check_table(fields, input, path, st)
    local data = {}
    for i = 1, #fields do
        local name, f = fields[i][1], fields[i][2]
        local v = check_value(f, input[name], path .. name, st)
        if v ~= nil then
            data[name] = v
        end
    end
    return data
end

-- The value v checked against field f: the value to keep (nil for none); errors go to st.
function check_value(f, v, path, st)
    if v == nil or v == null then
        if v == null and f.nullable then
            return null
        end
        if f.default ~= nil then
            return f.default
        end
        if f.required then
            st.fail(path, "required")
        end
        return nil
    end
    local t, tv = f.type, type(v)
    if t == "string" then
        if tv ~= "string" then
            return st.fail(path, "string expected")
        end
        if f.min_len or f.max_len then
            local n = chars(v)
            if f.min_len and n < f.min_len then
                return st.fail(path, "at least " .. f.min_len .. " characters")
            elseif f.max_len and n > f.max_len then
                return st.fail(path, "at most " .. f.max_len .. " characters")
            end
        end
        if f.pattern and not find(v, f.pattern) then
            return st.fail(path, "does not match the expected format")
        end
    elseif t == "integer" or t == "number" then
        if tv == "string" then
            v = text_number(v)
        elseif tv ~= "number" or v ~= v or v == huge or v == -huge then
            v = nil
        end
        if v == nil or (t == "integer" and (v % 1 ~= 0 or v > 2 ^ 53 or v < -2 ^ 53)) then
            return st.fail(path, t == "integer" and "integer expected" or "number expected")
        end
        if f.min and v < f.min then
            return st.fail(path, "at least " .. tostring(f.min))
        elseif f.max and v > f.max then
            return st.fail(path, "at most " .. tostring(f.max))
        end
    elseif t == "boolean" then
        if tv == "string" then
            if v == "true" or v == "1" then
                v = true
            elseif v == "false" or v == "0" then
                v = false
            end
        end
        if type(v) ~= "boolean" then
            return st.fail(path, "boolean expected")
        end
    elseif t == "array" then
        if tv == "string" then
            v = { v } -- one value of a query parameter that may repeat
        elseif tv ~= "table" or not is_list(v) then
            return st.fail(path, "array expected")
        end
        local n = #v
        if f.min and n < f.min then
            return st.fail(path, "at least " .. f.min .. " items")
        elseif f.max and n > f.max then
            return st.fail(path, "at most " .. f.max .. " items")
        end
        local out = n == 0 and json.array() or {}
        if f.of then
            for i = 1, n do
                local x = check_value(f.of, v[i], path .. "[" .. i .. "]", st)
                out[i] = x == nil and null or x
            end
        else
            for i = 1, n do
                out[i] = v[i]
            end
        end
        v = out
    else -- table
        if tv ~= "table" or #v > 0 or json.is_array(v) then
            return st.fail(path, "object expected")
        end
        if f.fields then
            v = check_table(f.fields, v, path .. ".", st)
        end
    end
    if f.enum_set and not f.enum_set[v] then
        return st.fail(path, f.enum_text)
    end
    if f.check then
        local ok, msg = f.check(v)
        if not ok then
            return st.fail(path, msg ~= nil and tostring(msg) or "invalid")
        end
    end
    return v
end

--- A validator for `schema`: { name = spec, ... }, where a spec is a type name or
-- { "type", option = value, ... }. Types: string, integer, number, boolean, array, table
-- (or object). Options: required, default, nullable, enum, check (all types); min_len,
-- max_len (characters), pattern (a Lua pattern) for strings; min, max for numbers and (items)
-- for arrays; of (the items' spec) for arrays; fields (a schema) for tables. An unknown
-- type or option raises here.
-- @tparam table schema
-- @tparam[opt] table opts max_errors: errors collected at most (100), then "_more"
-- @treturn function v(input) -> data, errors (nil, or { path = message })
function _M.new(schema, opts)
    local fields = compile(schema, "")
    local max_errors = opts and opts.max_errors or 100
    return function(input)
        local errors, n = nil, 0
        local st = {}
        function st.fail(path, msg)
            if n < max_errors then
                errors = errors or {}
                errors[path] = msg
                n = n + 1
            elseif n == max_errors then
                errors._more = "more errors left out"
                n = n + 1
            end
            return nil
        end
        if type(input) ~= "table" or (#input > 0) then
            st.fail("_", "object expected")
            return nil, errors
        end
        local data = check_table(fields, input, "", st)
        return data, errors
    end
end

-- moonserve.validate(schema) is validate.new(schema).
return setmetatable(_M, { __call = function(_, ...) return _M.new(...) end })
