-- spec/it/pg_types_spec.lua: moonserve.pg.auth logs in to a real PostgreSQL (a throwaway
-- cluster, spec/postgres.lua) with SCRAM-SHA-256 and md5, and moonserve.pg.types reads the
-- server's text of each type and writes parameters the server reads back equal.
local helper = require "helper"
local socket = require "socket"
local postgres = require "postgres"
local types = require "moonserve.pg.types"
local json = require "moonserve.json"

local O, NULL = types.oids, types.NULL

-- Logs in as `user` through spec/postgres.lua, whose answers are moonserve.pg.auth's: true
-- and the authentication kind ("md5", "scram"), or nil, err; `tamper` may change the
-- server-final-message before verify.
local function login(sock, user, password, tamper)
    return postgres.login(sock, user, password, nil, tamper)
end

describe("moonserve.pg.auth and moonserve.pg.types against PostgreSQL", function()
    local pg, sock
    local UTF8 = { user = "utf8_user", password = "p\195\164ssw\195\182rd" } -- "pässwörd", NFC

    local function connect()
        local s = assert(socket.tcp())
        s:settimeout(10)
        assert(s:connect("127.0.0.1", pg.port))
        return s
    end

    setup(function()
        pg = postgres.start()
        assert(helper.run(helper.tool("psql") .. " -X -q -h " .. pg.dir .. " -p " .. pg.port
            .. " -U postgres -c \"CREATE USER " .. UTF8.user .. " PASSWORD '" .. UTF8.password
            .. "'\""))
        sock = connect()
        local u = postgres.users.scram
        assert(login(sock, u.user, u.password))
        assert(postgres.query(sock, "SET TimeZone = 'UTC'"))
    end)

    teardown(function()
        if sock then
            postgres.terminate(sock)
            sock:close()
        end
        if pg then
            pg.stop()
        end
    end)

    describe("logins", function()
        for _, case in ipairs({ { "scram", postgres.users.scram }, { "md5", postgres.users.md5 },
            { "scram", UTF8, "a non-ASCII (NFC) password" } }) do
            local how, u = case[1], case[2]
            it("log in with " .. how .. (case[3] and " and " .. case[3] or ""), function()
                local s = connect()
                local ok, asked = login(s, u.user, u.password)
                assert.is_true(ok, asked)
                assert.equal(how, asked)
                assert.same({ { u.user } }, assert(postgres.query(s, "SELECT current_user")))
                postgres.terminate(s)
                s:close()
            end)

            it("are refused by the server with a wrong " .. how .. " password", function()
                local s = connect()
                local ok, err = login(s, u.user, u.password .. "x")
                assert.is_nil(ok)
                assert.matches("password authentication failed", err)
                s:close()
            end)
        end

        it("refuse a server whose final signature is forged", function()
            local s = connect()
            local u = postgres.users.scram
            local ok, err = login(s, u.user, u.password, function(final)
                local v = final:match("^v=(.*)$")
                return "v=" .. (v:sub(1, 1) == "A" and "B" or "A") .. v:sub(2)
            end)
            assert.is_nil(ok)
            assert.matches("signature does not match", err)
            s:close()
        end)
    end)

    -- The server's text of `expr` and its type OID, decoded.
    local function read_back(expr, opts)
        local rows = assert(postgres.query(sock, "SELECT (" .. expr .. "), pg_typeof("
            .. expr .. ")::oid"))
        local text, oid = rows[1][1], tonumber(rows[1][2])
        if text == false then
            return NULL, oid, text
        end
        local v, err = types.decoder(oid, opts)(text)
        assert(v ~= nil, err)
        return v, oid, text
    end

    local function nan(v)
        return v ~= v
    end

    -- { SQL expression, type name, the Lua value (or a check) [, decoder options] }
    local reads = {
        { "true", "bool", true },
        { "false", "bool", false },
        { "32767::int2", "int2", 32767 },
        { "(-2147483648)::int4", "int4", -2147483648 },
        { "4294967295::oid", "oid", 4294967295 },
        { "9007199254740991::int8", "int8", 9007199254740991 },
        { "(-9007199254740991)::int8", "int8", -9007199254740991 },
        { "9223372036854775807::int8", "int8", "9223372036854775807" },
        { "1.5::float8", "float8", 1.5 },
        { "0.1::float8", "float8", 0.1 },
        { "1e-300::float8", "float8", 1e-300 },
        { "0.5::float4", "float4", 0.5 },
        { "'NaN'::float8", "float8", nan },
        { "'Infinity'::float4", "float4", math.huge },
        { "'-Infinity'::float8", "float8", -math.huge },
        { "12345678901234567890.000000001::numeric", "numeric",
            "12345678901234567890.000000001" },
        { "'NaN'::numeric", "numeric", "NaN" },
        { "2.5::numeric", "numeric", 2.5, { numeric = "number" } },
        { "'h\195\169llo, \"world\"'::text", "text", "h\195\169llo, \"world\"" },
        { "'x'::varchar(5)", "varchar", "x" },
        { "'ab'::char(3)", "bpchar", "ab " },
        { "'pg_class'::name", "name", "pg_class" },
        { "'{\"a\": [1, []], \"b\": null, \"c\": \"\\u00e9\"}'::jsonb", "jsonb", function(v)
            return v.a[1] == 1 and json.is_array(v.a[2]) and v.b == NULL and v.c == "\195\169"
                and json.encode(v.a) == "[1,[]]"
        end },
        { "'[]'::json", "json", function(v) return json.encode(v) == "[]" end },
        { "'null'::json", "json", NULL },
        { "'\\x00ff0a'::bytea", "bytea", "\0\255\n" },
        { "''::bytea", "bytea", "" },
        { "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid", "uuid",
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11" },
        { "'2024-02-29'::date", "date", "2024-02-29" },
        { "'12:34:56.789'::time", "time", "12:34:56.789" },
        { "'2024-02-29 12:34:56.789'::timestamp", "timestamp", "2024-02-29 12:34:56.789" },
        { "'2024-02-29 12:34:56.789+02'::timestamptz", "timestamptz",
            "2024-02-29 10:34:56.789+00" },
        { "'1 day 02:03:04'::interval", "interval", "1 day 02:03:04" },
        -- arrays
        { "ARRAY[1, NULL, 3]::int4[]", "_int4", { 1, NULL, 3 } },
        { "'{{1,2},{3,4}}'::int2[]", "_int2", { { 1, 2 }, { 3, 4 } } },
        { "'{{{{{{6}}}}}}'::int4[]", "_int4", { { { { { { 6 } } } } } } },
        { "'[0:1]={7,8}'::int4[]", "_int4", { 7, 8 } },
        { "ARRAY[9223372036854775807, 1]::int8[]", "_int8", { "9223372036854775807", 1 } },
        { [=[ARRAY['a,b', 'q"', E'b\\s', 'NULL', NULL, '', ' x ', '{}', 'é']::text[]]=], "_text",
            { "a,b", 'q"', "b\\s", "NULL", NULL, "", " x ", "{}", "\195\169" } },
        { "'{}'::text[]", "_text", function(v) return json.encode(v) == "[]" end },
        { "ARRAY['a']::varchar[]", "_varchar", { "a" } },
        { "ARRAY[true, false, NULL]", "_bool", { true, false, NULL } },
        { "ARRAY[1.5, 'NaN']::numeric[]", "_numeric", { "1.5", "NaN" } },
        { "ARRAY[1.5]::numeric[]", "_numeric", { 1.5 }, { numeric = "number" } },
        { "ARRAY['Infinity', 0.25]::float8[]", "_float8", { math.huge, 0.25 } },
        { "ARRAY['\\x01'::bytea, '\\x', NULL]", "_bytea", { "\1", "", NULL } },
        { "ARRAY['{\"a\": \"x,}\\\"\"}'::jsonb, 'null', '[]']", "_jsonb", function(v)
            return v[1].a == "x,}\"" and v[2] == NULL and json.is_array(v[3])
        end },
        { "ARRAY['2024-02-29 12:00:00+00'::timestamptz]", "_timestamptz",
            { "2024-02-29 12:00:00+00" } },
        { "ARRAY['a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid]", "_uuid",
            { "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11" } },
        { "ARRAY['2024-02-29'::date]", "_date", { "2024-02-29" } },
        { "ARRAY['1 day'::interval]", "_interval", { "1 day" } },
    }
    describe("decoders", function()
        for _, case in ipairs(reads) do
            local expr, name, want, opts = case[1], case[2], case[3], case[4]
            it("read " .. expr .. (opts and " (numeric as a number)" or ""), function()
                local v, oid, text = read_back(expr, opts)
                assert.equal(O[name], oid)
                if type(want) == "function" then
                    assert.is_true(want(v), "decoded " .. tostring(text))
                else
                    assert.same(want, v)
                end
                if type(v) == "table" and v ~= NULL then
                    assert.is_true(json.is_array(v) or name == "jsonb" or name == "json")
                end
            end)
        end
    end)

    -- { Lua value, type, SQL expression the server must find it equal to }
    local writes = {
        { true, "bool", "true" },
        { false, "bool", "false" },
        { 42, "int4", "42" },
        { -7.0, "int4", "-7" },
        { 9007199254740991, "int8", "9007199254740991" },
        { 9223372036854775807LL, "int8", "9223372036854775807" },
        { 0.1, "float8", "0.1::float8" },
        { 0.1 + 0.2, "float8", "0.1::float8 + 0.2::float8" },
        { 1e300, "float8", "1e300::float8" },
        { 5e-324, "float8", "'4.9406564584124654e-324'::float8" },
        { 0 / 0, "float8", "'NaN'::float8" },
        { math.huge, "float8", "'Infinity'::float8" },
        { -math.huge, "float8", "'-Infinity'::float8" },
        { 2.5, "numeric", "2.5" },
        { "it's \"é\" $1 \\", "text", "E'it''s \"é\" $1 \\\\'" },
        { types.bytea("\0\255\1"), "bytea", "'\\x00ff01'::bytea", false },
        { types.json({ a = json.array{}, b = NULL, c = { 1, 2 }, d = "x\"y" }), "jsonb",
            [['{"a": [], "b": null, "c": [1, 2], "d": "x\"y"}'::jsonb]], false },
        { { 1, 2, NULL }, "int4[]", "ARRAY[1, 2, NULL]" },
        { { { 1, 2 }, { 3, 4 } }, "int4[]", "'{{1,2},{3,4}}'::int4[]" },
        { {}, "text[]", "'{}'::text[]" },
        { { "a,b", 'q"', "b\\s", "NULL", NULL, "", " x ", "{}", "é" }, "text[]",
            [=[ARRAY['a,b', 'q"', E'b\\s', 'NULL', NULL, '', ' x ', '{}', 'é']]=] },
        { { true, false }, "bool[]", "ARRAY[true, false]" },
        { { 0.1, 0 / 0 }, "float8[]", "ARRAY[0.1, 'NaN']::float8[]" },
        { { types.bytea("\1\2"), types.bytea("") }, "bytea[]",
            "ARRAY['\\x0102'::bytea, '\\x'::bytea]", false },
        { { types.json({ a = 1 }), types.json(NULL) }, "jsonb[]",
            [=[ARRAY['{"a": 1}'::jsonb, 'null'::jsonb]]=], false },
    }
    describe("the encoder", function()
        for _, case in ipairs(writes) do
            local value, name, expected = case[1], case[2], case[3]
            it("writes what " .. expected .. " is, as " .. name, function()
                local text = assert(types.encode(value))
                assert.is_nil(text:find("$lit$", 1, true))
                local literal = "$lit$" .. text .. "$lit$::" .. name
                -- the server reads the text as the same value (IS NOT DISTINCT FROM: NaN and
                -- NULL elements are equal), and gives back text that decodes to it
                local rows = assert(postgres.query(sock, "SELECT (" .. literal
                    .. ") IS NOT DISTINCT FROM (" .. expected .. ")"))
                assert.equal("t", rows[1][1], text)
                local back = read_back(literal)
                if case[4] == false then
                    return -- pg.json and pg.bytea wrappers: the equality above is the proof
                end
                if type(value) == "number" and value ~= value then
                    assert.is_true(back ~= back)
                elseif type(value) == "cdata" then
                    assert.equal(tostring(value):match("%-?%d+"), back)
                elseif name == "numeric" then
                    assert.equal("2.5", back) -- numeric keeps its digits as a string
                elseif name == "float8[]" then
                    assert.equal(0.1, back[1])
                    assert.is_true(back[2] ~= back[2])
                else
                    assert.same(value, back)
                end
            end)
        end

        it("sends NULL as no text", function()
            assert.is_nil((types.encode(NULL)))
            assert.is_nil((types.encode(nil)))
        end)
    end)
end)
