-- moonserve.json: arrays that stay arrays (an empty one is []), null as a value, and the
-- text's empty arrays found outside strings only.
describe("moonserve.json", function()
    local json = require "moonserve.json"
    local cjson = require "cjson"

    it("encodes a marked array as an array, an empty one as []", function()
        assert.equal("[]", json.encode(json.array{}))
        assert.equal("[]", json.encode(json.array()))
        assert.equal('{"a":[]}', json.encode{ a = json.array() })
        assert.equal('[1,[],{"b":[]}]', json.encode{ 1, json.array(), { b = json.array() } })
        assert.equal('{"a":{}}', json.encode{ a = {} })
        assert.equal('[1,2]', json.encode(json.array{ 1, 2 }))
        assert.has_error(function() json.array(5) end)
    end)

    it("encodes null, and decodes null to the same value", function()
        assert.equal(cjson.null, json.null)
        assert.equal('{"a":null}', json.encode{ a = json.null })
        assert.equal('[null,[]]', json.encode{ json.null, json.array() })
        local v = json.decode('{"a":null,"b":[1,null]}')
        assert.equal(json.null, v.a)
        assert.equal(json.null, v.b[2])
    end)

    it("round-trips empty arrays, leaving strings alone", function()
        local text = '{"a":[],"b":{},"s":"[ ]","e":"x\\"[]","c":[1,[ ],{"x":[]}]}'
        local v = assert(json.decode(text))
        assert.is_true(json.is_array(v.a))
        assert.is_false(json.is_array(v.b))
        assert.equal("[ ]", v.s)
        assert.equal('x"[]', v.e)
        assert.equal(1, v.c[1])
        assert.is_true(json.is_array(v.c[2]))
        assert.same(v, json.decode(json.encode(v)))
        assert.equal("[]", json.encode(json.decode("[ ]")))
        assert.equal('[[[]]]', json.encode(json.decode("[[[]]]")))
        assert.equal('{"a":{}}', json.encode(json.decode('{"a":{}}')))
    end)

    it("mends only text with an empty table once an array was marked", function()
        json.array() -- (from here on, encode looks for empty arrays)
        assert.equal('{"s":"{}"}', json.encode{ s = "{}" })
        assert.equal('[1,"{}",[]]', json.encode{ 1, "{}", json.array() })
        assert.equal('{"a":[1,2]}', json.encode{ a = json.array{ 1, 2 } })
        assert.equal('[{},[]]', json.encode{ {}, json.array() })
        -- lua-cjson refuses an excessively sparse array; one with an empty array to mend in
        -- it is written by the walk, as an object
        assert.has_error(function() json.encode{ [1] = 1, [30] = 1 } end)
        local text = json.encode{ [1] = json.array(), [30] = 1 }
        assert.is_true(text == '{"1":[],"30":1}' or text == '{"30":1,"1":[]}', text)
    end)

    it("refuses what JSON cannot hold, with or without marked arrays", function()
        assert.has_error(function() json.encode{ f = print } end)
        assert.has_error(function() json.encode{ f = print, a = json.array() } end)
        assert.has_error(function() json.encode{ [true] = 1, a = json.array() } end)
        local cyc = { a = json.array() }
        cyc.self = cyc
        assert.has_error(function() json.encode(cyc) end)
        local v, err = json.decode("{nope")
        assert.is_nil(v)
        assert.is_string(err)
        assert.is_nil((json.decode(12)))
        assert.is_nil((json.decode("[[] ")))
    end)

    it("refuses numbers JSON has not (nan, inf, hex) and those past a double, found by fuzzing",
        function()
        for _, text in ipairs { "nan", "inf", "-inf", "[NaN]", "0x10", "1e400", "[-1E+999]",
            '{"a":' .. string.rep("9", 400) .. "}" } do
            local v, err = json.decode(text)
            assert.is_nil(v, text)
            assert.is_string(err, text)
        end
        -- what is decoded encodes again
        for _, text in ipairs { "1e308", "[-1.5e-300]", '{"n":123456789012}', "0" } do
            local v = assert(json.decode(text), text)
            assert.is_string(json.encode(v))
        end
    end)

    it("decodes deep nesting without crashing", function()
        local v = json.decode(string.rep("[", 100000) .. string.rep("]", 100000))
        assert.is_nil(v)
        local ok = pcall(json.decode, string.rep("[", 500) .. string.rep("]", 500))
        assert.is_true(ok)
    end)
end)
