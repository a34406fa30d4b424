-- moonserve.validate: schemas checked at definition, every field's error collected by path,
-- text coerced to the field's type, hostile input refused without error.
describe("moonserve.validate", function()
    local validate = require "moonserve.validate"
    local json = require "moonserve.json"

    it("keeps the declared fields only and coerces query text", function()
        local v = validate{ page = { "integer", min = 1, default = 1 }, q = "string",
            ratio = "number", on = "boolean", tag = { "array", of = "string" } }
        local data, errors = v{ page = "12", q = "x", ratio = "0.5", on = "true",
            tag = "a", extra = "dropped" }
        assert.is_nil(errors)
        assert.same({ page = 12, q = "x", ratio = 0.5, on = true, tag = { "a" } }, data)
        data = v{}
        assert.same({ page = 1 }, data)
        data = v{ tag = { "a", "b" }, on = "0" }
        assert.same({ "a", "b" }, data.tag)
        assert.equal(false, data.on)
    end)

    it("collects every field's error, keyed by path", function()
        local v = validate{
            title = { "string", required = true, max_len = 5 },
            tags = { "array", of = { "string", min_len = 2 }, max = 3 },
            author = { "table", required = true, fields = { name = { "string", required = true },
                age = { "integer", min = 0, max = 150 } } },
            kind = { "string", enum = { "note", "link" } },
            items = { "array", of = { "table", fields = { n = { "integer", required = true } } } },
        }
        local data, errors = v{ title = "too long", tags = { "ok", "x", "fine" },
            author = { age = 200 }, kind = "other", items = { { n = 1 }, { n = "x" } } }
        assert.is_table(data)
        assert.same({
            title = "at most 5 characters",
            ["tags[2]"] = "at least 2 characters",
            ["author.name"] = "required",
            ["author.age"] = "at most 150",
            kind = "one of: note, link",
            ["items[2].n"] = "integer expected",
        }, errors)
        local _, e2 = v{}
        assert.same({ title = "required", author = "required" }, e2)
    end)

    it("checks types, ranges, lengths, patterns and custom checks", function()
        local v = validate{
            s = { "string", min_len = 2, pattern = "^%a+$" },
            i = { "integer", min = -5, max = 5 },
            n = { "number", min = 0.5 },
            a = { "array", min = 1, max = 2 },
            c = { "string", check = function(x) return x ~= "bad", "is bad" end },
            d = { "string", check = function(x) return x ~= "bad" end },
        }
        local cases = {
            { { s = 12 }, "s", "string expected" },
            { { s = "a" }, "s", "at least 2 characters" },
            { { s = "a1" }, "s", "does not match the expected format" },
            { { i = 1.5 }, "i", "integer expected" },
            { { i = "1.5" }, "i", "integer expected" },
            { { i = "0x10" }, "i", "integer expected" },
            { { i = "nan" }, "i", "integer expected" },
            { { i = 2 ^ 60 }, "i", "integer expected" },
            { { i = true }, "i", "integer expected" },
            { { i = -6 }, "i", "at least -5" },
            { { i = "6" }, "i", "at most 5" },
            { { n = "inf" }, "n", "number expected" },
            { { n = math.huge }, "n", "number expected" },
            { { n = 0 / 0 }, "n", "number expected" },
            { { n = 0.4 }, "n", "at least 0.5" },
            { { a = {} }, "a", "at least 1 items" },
            { { a = { 1, 2, 3 } }, "a", "at most 2 items" },
            { { a = { x = 1 } }, "a", "array expected" },
            { { a = { 1, nil, 3 } }, "a", "array expected" },
            { { a = 5 }, "a", "array expected" },
            { { c = "bad" }, "c", "is bad" },
            { { d = "bad" }, "d", "invalid" },
        }
        for _, case in ipairs(cases) do
            local _, errors = v(case[1])
            assert.same({ [case[2]] = case[3] }, errors, case[2] .. " " .. case[3])
        end
        local data, errors = v{ s = "ok", i = "-5", n = "1e2", a = { 1 }, c = "good" }
        assert.is_nil(errors)
        assert.same({ s = "ok", i = -5, n = 100, a = { 1 }, c = "good" }, data)
    end)

    it("counts string lengths in UTF-8 characters", function()
        local v = validate{ s = { "string", max_len = 3 } }
        assert.is_nil(select(2, v{ s = "été" }))
        assert.same({ s = "at most 3 characters" }, select(2, v{ s = "étés" }))
    end)

    it("treats null as absent, or keeps it when nullable", function()
        local v = validate{ a = { "string", required = true }, b = { "string", nullable = true },
            c = "string" }
        local data, errors = v{ a = json.null, b = json.null, c = json.null }
        assert.same({ a = "required" }, errors)
        assert.equal(json.null, data.b)
        assert.is_nil(data.c)
    end)

    it("refuses input that is not an object", function()
        local v = validate{ a = "string" }
        for _, bad in ipairs { "text", 12, true, { 1, 2 }, json.null } do
            local data, errors = v(bad)
            assert.is_nil(data)
            assert.same({ _ = "object expected" }, errors)
        end
        assert.same({ _ = "object expected" }, select(2, v(nil)))
        local _, errors = validate{ t = { "table", fields = { a = "string" } } }{ t = { 1, 2 } }
        assert.same({ t = "object expected" }, errors)
    end)

    it("raises at definition for an unknown type or option, or a bad one", function()
        local bad = {
            { t = "strnig" }, { t = { "string", maxlen = 3 } }, { t = { "integer", max_len = 3 } },
            { t = { "string", pattern = "[" } }, { t = { "string", min_len = "3" } },
            { t = { "array", of = "nope" } }, { t = { "table", fields = { x = "bad" } } },
            { t = { "string", check = "no" } }, { [1] = "string" }, { t = 5 },
        }
        for _, schema in ipairs(bad) do
            assert.has_error(function() validate(schema) end)
        end
        local ok, err = pcall(validate, { title = { "string", maxlen = 3 } })
        assert.is_false(ok)
        assert.matches("unknown option maxlen for title", err, 1, true)
        assert.has_error(function() validate("string") end)
    end)

    it("bounds hostile input: deep nesting, huge arrays, many errors", function()
        -- nesting deeper than the schema is not walked
        local deep = {}
        local node = deep
        for _ = 1, 100000 do
            node.x = {}
            node = node.x
        end
        local v = validate{ x = { "table", fields = { x = "table" } } }
        local data, errors = v(deep)
        assert.is_nil(errors)
        -- a table without fields is kept as it came
        assert.equal(deep.x.x, data.x.x)
        -- a huge array: each item checked, errors capped
        local big = {}
        for i = 1, 200000 do
            big[i] = i % 2 == 0 and "s" or i
        end
        local va = validate{ a = { "array", of = "string" } }
        local _, e = va{ a = big }
        local n = 0
        for _ in pairs(e) do
            n = n + 1
        end
        assert.equal(101, n)
        assert.equal("string expected", e["a[1]"])
        assert.equal("more errors left out", e._more)
        local vm = validate({ a = { "array", of = "string", max = 10 } }, { max_errors = 3 })
        assert.same({ a = "at most 10 items" }, select(2, vm{ a = big }))
    end)

    it("is moonserve.validate", function()
        local v = require("moonserve").validate{ a = "integer" }
        assert.same({ a = 3 }, (v{ a = "3" }))
    end)
end)
