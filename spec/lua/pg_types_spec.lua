-- spec/lua/pg_types_spec.lua: moonserve.pg.types, the decoders of text-format values and the
-- encoder of parameters (the real server reads and writes them in spec/it/pg_types_spec.lua).
describe("moonserve.pg.types", function()
    local types = require "moonserve.pg.types"
    local json = require "moonserve.json"
    local O = types.oids
    local NULL = types.NULL

    local function dec(oid, s, opts)
        return types.decoder(oid, opts)(s)
    end

    it("has NULL, which is moonserve.json.null", function()
        assert.equal(json.null, types.NULL)
        assert.equal('[1,null]', json.encode({ 1, types.NULL }))
    end)

    describe("decoders", function()
        it("read booleans and integers", function()
            assert.equal(true, dec(O.bool, "t"))
            assert.equal(false, dec(O.bool, "f"))
            assert.equal(-32768, dec(O.int2, "-32768"))
            assert.equal(2147483647, dec(O.int4, "2147483647"))
            assert.equal(4294967295, dec(O.oid, "4294967295"))
            assert.is_nil(dec(O.bool, "yes"))
            assert.is_nil(dec(O.int4, "12a"))
        end)

        it("read int8 as a number while it is exact, else as its digits", function()
            assert.equal(9007199254740991, dec(O.int8, "9007199254740991"))
            assert.equal(-9007199254740991, dec(O.int8, "-9007199254740991"))
            assert.equal("9007199254740993", dec(O.int8, "9007199254740993"))
            assert.equal("9223372036854775807", dec(O.int8, "9223372036854775807"))
            assert.equal("-9223372036854775808", dec(O.int8, "-9223372036854775808"))
        end)

        it("read floats, NaN and the infinities", function()
            assert.equal(1.5, dec(O.float8, "1.5"))
            assert.equal(-1e+300, dec(O.float8, "-1e+300"))
            assert.equal(0.1, dec(O.float4, "0.1"))
            assert.equal(math.huge, dec(O.float8, "Infinity"))
            assert.equal(-math.huge, dec(O.float4, "-Infinity"))
            local nan = dec(O.float8, "NaN")
            assert.is_true(nan ~= nan)
        end)

        it("read numeric as its text, or as a number by choice", function()
            assert.equal("12345678901234567890.123456789", dec(O.numeric,
                "12345678901234567890.123456789"))
            assert.equal("NaN", dec(O.numeric, "NaN"))
            assert.equal(1.25, dec(O.numeric, "1.25", { numeric = "number" }))
            assert.equal(math.huge, dec(O.numeric, "Infinity", { numeric = "number" }))
            assert.has_error(function() types.decoder(O.numeric, { numeric = "float" }) end)
        end)

        it("read text-like, date and time types and unknown OIDs as the server's text", function()
            for _, oid in ipairs({ O.text, O.varchar, O.bpchar, O.name, O.uuid, O.date,
                O.timestamptz, O.interval, 99999 }) do
                assert.equal("x y", dec(oid, "x y"))
            end
        end)

        it("read json and jsonb through moonserve.json", function()
            local v = dec(O.jsonb, '{"a":[1,2],"b":null,"c":[],"d":{}}')
            assert.same({ 1, 2 }, v.a)
            assert.equal(NULL, v.b)
            assert.is_true(json.is_array(v.c))
            assert.equal('[]', json.encode(v.c))
            assert.equal(NULL, dec(O.json, "null"))
            assert.equal("s", dec(O.json, '"s"'))
            assert.is_nil(dec(O.json, "{bad"))
        end)

        it("read bytea in hex and escape output", function()
            assert.equal("\0\1\255ab", dec(O.bytea, "\\x0001ff6162"))
            assert.equal("\0\1\255ab", dec(O.bytea, "\\x0001FF6162"))
            assert.equal("", dec(O.bytea, "\\x"))
            assert.equal("a\\b\0\255c", dec(O.bytea, "a\\\\b\\000\\377c"))
            assert.is_nil(dec(O.bytea, "\\x0"))
            assert.is_nil(dec(O.bytea, "\\x0g"))
            assert.is_nil(dec(O.bytea, "a\\9"))
            assert.is_nil(dec(O.bytea, "a\\"))
            assert.is_nil(dec(O.bytea, "a\\400"))
        end)

        it("are the same function for every column of a type (no closure per call)", function()
            assert.equal(types.decoder(O._int4), types.decoder(O._int4))
            assert.equal(types.decoder(O.int4), types.decoder(O.int4, { numeric = "number" }))
        end)
    end)

    describe("arrays", function()
        local function arr(oid, s, opts)
            return types.decoder(oid, opts)(s)
        end

        it("read flat and nested arrays, marked as arrays", function()
            local v = arr(O._int4, "{1,2,3}")
            assert.same({ 1, 2, 3 }, v)
            assert.is_true(json.is_array(v))
            v = arr(O._int4, "{{1,2},{3,4}}")
            assert.same({ { 1, 2 }, { 3, 4 } }, v)
            assert.is_true(json.is_array(v[2]))
            assert.equal("[[1,2],[3,4]]", json.encode(v))
        end)

        it("read an empty array as an empty moonserve.json.array", function()
            local v = arr(O._text, "{}")
            assert.is_true(json.is_array(v))
            assert.equal("[]", json.encode(v))
            assert.equal("[]", json.encode(arr(O._int4, "{ }")))
        end)

        it("read NULL elements as NULL, and a quoted \"NULL\" as the string", function()
            assert.same({ "a", NULL, "NULL", NULL }, arr(O._text, '{a,NULL,"NULL",null}'))
            assert.same({ 1, NULL }, arr(O._int4, "{1,NULL}"))
        end)

        it("read quoting and escapes", function()
            assert.same({ 'a,b', 'say "hi"', "back\\slash", "", " sp ", "{}", "x" },
                arr(O._text, [[{"a,b","say \"hi\"","back\\slash",""," sp ","{}","\x"}]]))
        end)

        it("decode each element by the element type", function()
            assert.same({ true, false, NULL }, arr(O._bool, "{t,f,NULL}"))
            assert.same({ "9223372036854775807", 1 }, arr(O._int8, "{9223372036854775807,1}"))
            assert.same({ "1.5", "NaN" }, arr(O._numeric, "{1.5,NaN}"))
            assert.same({ 1.5 }, arr(O._numeric, "{1.5}", { numeric = "number" }))
            assert.same({ "\1\2", "" }, arr(O._bytea, [[{"\\x0102","\\x"}]]))
            local j = arr(O._jsonb, [[{"{\"a\": 1}","[]",null}]])
            assert.equal(1, j[1].a)
            assert.is_true(json.is_array(j[2]))
            assert.equal(NULL, j[3])
            local f = arr(O._float8, "{Infinity,-Infinity,NaN}")
            assert.equal(math.huge, f[1])
            assert.is_true(f[3] ~= f[3])
        end)

        it("read explicit bounds", function()
            assert.same({ 1, 2 }, arr(O._int4, "[0:1]={1,2}"))
            assert.same({ { 1 }, { 2 } }, arr(O._int4, "[-2:-1][1:1]={{1},{2}}"))
        end)

        it("read six dimensions, PostgreSQL's most", function()
            local v = arr(O._int4, "{{{{{{7}}}}}}")
            assert.equal(7, v[1][1][1][1][1][1])
        end)

        local hostile = {
            { "unbalanced braces", "{1,2" },
            { "an unopened brace", "1,2}" },
            { "a closing brace too many", "{1,2}}" },
            { "text after the array", "{1} x" },
            { "an empty element", "{1,,2}" },
            { "a trailing comma", "{1,}" },
            { "a leading comma", "{,1}" },
            { "an unterminated quote", '{"abc}' },
            { "a backslash at the end", '{"abc\\' },
            { "a backslash in an unquoted element", "{a\\b}" },
            { "a quote inside an unquoted element", '{ab"c"}' },
            { "elements mixed with sub-arrays", "{1,{2}}" },
            { "sub-arrays mixed with elements", "{{1},2}" },
            { "seven dimensions", "{{{{{{{1}}}}}}}" },
            { "ten thousand dimensions", ("{"):rep(10000) .. ("}"):rep(10000) },
            { "bad bounds", "[1:x]={1}" },
            { "bounds without an array", "[1:2]=" },
            { "an empty string", "" },
            { "a bad element for its type", "{1,x}" },
            { "text between quoted elements", '{"a"b,"c"}' },
        }
        for _, case in ipairs(hostile) do
            it("refuse " .. case[1] .. " with an error, not a value", function()
                local v, err = arr(O._int4, case[2])
                assert.is_nil(v)
                assert.matches("^pg: bad", err)
            end)
        end

        it("refuse a bad JSON or bytea element", function()
            assert.is_nil(arr(O._jsonb, '{"{bad"}'))
            assert.is_nil(arr(O._bytea, '{"\\\\x0"}'))
        end)
    end)

    describe("encode", function()
        local function enc(v)
            return types.encode(v)
        end

        it("sends nil and NULL as NULL", function()
            assert.same({ nil, 0 }, { enc(nil) })
            assert.same({ nil, 0 }, { enc(NULL) })
        end)

        it("writes scalars", function()
            assert.equal("t", enc(true))
            assert.equal("f", enc(false))
            assert.equal("42", enc(42))
            assert.equal("-7", enc(-7.0))
            assert.equal("0.1", enc(0.1))
            assert.equal("0.30000000000000004", enc(0.1 + 0.2))
            assert.equal("1e+300", enc(1e300))
            assert.equal("NaN", enc(0 / 0))
            assert.equal("Infinity", enc(math.huge))
            assert.equal("-Infinity", enc(-math.huge))
            assert.equal("9223372036854775807", enc(9223372036854775807LL))
            assert.equal("18446744073709551615", enc(18446744073709551615ULL))
            assert.equal("it's", enc("it's"))
            local s, oid = enc("x")
            assert.equal("x", s)
            assert.equal(0, oid)
        end)

        it("writes json with the jsonb OID, and bytea as hex", function()
            local s, oid = enc(types.json({ a = json.array{} }))
            assert.equal('{"a":[]}', s)
            assert.equal(3802, oid)
            assert.equal("null", (enc(types.json(NULL))))
            assert.equal("\\x00ff41", (enc(types.bytea("\0\255A"))))
            assert.equal("\\x", (enc(types.bytea(""))))
            assert.has_error(function() types.bytea(1) end)
        end)

        it("writes sequences as array literals, quoted", function()
            assert.equal('{"1","2"}', (enc({ 1, 2 })))
            assert.equal('{}', (enc({})))
            assert.equal('{}', (enc(json.array{})))
            assert.equal('{"a,b","q\\"","b\\\\s",NULL,"NULL","t"}',
                (enc({ "a,b", 'q"', "b\\s", NULL, "NULL", true })))
            assert.equal('{{"1","2"},{"3","4"}}', (enc({ { 1, 2 }, { 3, 4 } })))
            assert.equal('{"\\\\x01","{\\"a\\":1}"}',
                (enc({ types.bytea("\1"), types.json({ a = 1 }) })))
        end)

        it("raises on other tables and types", function()
            local msg = "pg: a table parameter must be a sequence (an array) or pg.json(t)"
            assert.has_error(function() enc({ a = 1 }) end, msg)
            assert.has_error(function() enc({ 1, nil, 3, x = 1 }) end, msg)
            assert.has_error(function() enc({ { a = 1 } }) end, msg)
            assert.has_error(function() enc(print) end)
            assert.has_error(function() enc({ print }) end)
            local deep = { 1 }
            for _ = 1, 7 do
                deep = { deep }
            end
            assert.has_error(function() enc(deep) end)
            local cycle = {}
            cycle[1] = cycle
            assert.has_error(function() enc(cycle) end)
        end)

        it("reads back what it writes", function()
            local values = { "a,b", 'q"', "b\\s", NULL, "NULL", "", " x ", "{}", "é" }
            assert.same(values, types.decoder(O._text)((enc(values))))
            assert.same({ { 1, 2 }, { 3, NULL } },
                types.decoder(O._int4)((enc({ { 1, 2 }, { 3, NULL } }))))
            local bytes = "\0\1\127\128\255"
            assert.equal(bytes, types.decoder(O.bytea)((enc(types.bytea(bytes)))))
        end)
    end)
end)
