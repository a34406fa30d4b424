-- A query string or a urlencoded body: parse_form never raises, keeps to its bound of
-- fields, and gives string keys with strings or lists of strings.
local codec = require "moonserve.codec"
local u = require "fuzz_util"

return function(data)
    local t = u.no_raise("codec.parse_form", codec.parse_form, data, 50)
    local n = 0
    for k, v in pairs(t) do
        assert(type(k) == "string", "a non-string key")
        if type(v) == "table" then
            for _, e in ipairs(v) do
                assert(type(e) == "string", "a non-string value in a list")
                n = n + 1
            end
        else
            assert(type(v) == "string", "a non-string value")
            n = n + 1
        end
    end
    assert(n <= 50, "more fields than the bound")
end
