-- pg_types_bench.lua: the cost of decoding a row of 10 mixed columns (text format) with
-- moonserve.pg.types, as the client does per row: the decoders looked up once, by type
-- OID, then called per value, each row a new table keyed by column name. Prints ns/row.
--   luajit bench/pg_types_bench.lua [ROWS] [MODE]
-- Modes: mixed (default: int4, int8, text, bool, float8, numeric, timestamptz, uuid, jsonb,
-- int4[]), scalars (the same with a varchar and an int2 for jsonb and int4[]).
local types = require "moonserve.pg.types"
local O = types.oids

local rows = tonumber(arg[1]) or 1000000
local mode = arg[2] or "mixed"

local columns = {
    { "id", O.int4, "123456" },
    { "big", O.int8, "9007199254740000" },
    { "name", O.text, "a note's title" },
    { "done", O.bool, "t" },
    { "score", O.float8, "3.14159" },
    { "price", O.numeric, "1234.50" },
    { "at", O.timestamptz, "2024-02-29 12:34:56.789+00" },
    { "uid", O.uuid, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11" },
    { "meta", O.jsonb, '{"tags": ["a", "b"], "n": 1}' },
    { "ids", O._int4, "{1,2,3,4}" },
}
if mode == "scalars" then
    columns[9] = { "meta", O.varchar, "plain text" }
    columns[10] = { "ids", O.int2, "42" }
elseif mode ~= "mixed" then
    error("unknown mode " .. mode)
end

local n = #columns
local names, decoders, values = {}, {}, {}
for i, c in ipairs(columns) do
    names[i], decoders[i], values[i] = c[1], types.decoder(c[2]), c[3]
end

local function decode_row(texts)
    local row = {}
    for i = 1, n do
        row[names[i]] = decoders[i](texts[i])
    end
    return row
end

-- warm up (and let the JIT compile the loop)
local sink
for _ = 1, 10000 do
    sink = decode_row(values)
end

local t0 = os.clock()
for _ = 1, rows do
    sink = decode_row(values)
end
local elapsed = os.clock() - t0
assert(sink.id == 123456 and sink.done == true)
print(string.format("%s: %d rows of %d columns, %.0f ns/row (%.1f ns/value)", mode, rows, n,
    elapsed * 1e9 / rows, elapsed * 1e9 / rows / n))
