-- bench/validate_bench.lua: what moonserve.validate and moonserve.json cost, in process:
-- a 2-field and a 1,000-field validation of query text, and JSON encoding of a ~20-field
-- object by lua-cjson alone, by moonserve.json before and after any table was marked as an
-- array, and of a value holding an empty array.
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" luajit bench/validate_bench.lua [N]
local json = require "moonserve.json"
local cjson = require "cjson"
local validate = require("moonserve.validate").new

local N = tonumber(arg[1]) or 200000
local clock = os.clock

local function per_call(n, f, ...)
    local t = clock()
    for _ = 1, n do
        f(...)
    end
    return (clock() - t) / n
end

local small = validate{ t = { "string", max_len = 10 }, n = { "integer", min = 0 } }
print(("2-field validation          %8.0f ns"):format(per_call(N, small, { t = "abc", n = "12" }) * 1e9))

local fields, query = {}, {}
for i = 1, 1000 do
    fields["f" .. i] = { "integer", min = 0 }
    query["f" .. i] = tostring(i)
end
local big = validate(fields)
print(("1,000-field validation      %8.1f us"):format(per_call(N / 200, big, query) * 1e6))

local v = { id = 7, title = "hello", tags = { "a", "b", "c" }, author = { name = "Ada", id = 3 },
    items = {} }
for i = 1, 10 do
    v.items[i] = { n = i, s = "x" .. i }
end
print(("cjson.encode                %8.0f ns"):format(per_call(N, cjson.encode, v) * 1e9))
print(("json.encode, nothing marked %8.0f ns"):format(per_call(N, json.encode, v) * 1e9))
json.array()
print(("json.encode, after a mark   %8.0f ns"):format(per_call(N, json.encode, v) * 1e9))
v.empty = json.array()
print(("json.encode, holding []     %8.0f ns"):format(per_call(N, json.encode, v) * 1e9))
