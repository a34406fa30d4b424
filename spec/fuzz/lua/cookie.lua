-- A Cookie field: parse never raises on a string, keeps to its bound of pairs, and gives
-- string names and values.
local cookie = require "moonserve.cookie"
local u = require "fuzz_util"

return function(data)
    local t = u.no_raise("cookie.parse", cookie.parse, data, 10)
    local n = 0
    for k, v in pairs(t) do
        n = n + 1
        assert(type(k) == "string" and type(v) == "string", "a non-string pair")
    end
    assert(n <= 10, "more pairs than the bound")
end
