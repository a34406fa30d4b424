-- A JSON body (req:json): decode never raises on a string; it gives a value or nil and an
-- error, and what it gives encodes again.
local json = require "moonserve.json"
local u = require "fuzz_util"

return function(data)
    local v, err = u.no_raise("json.decode", json.decode, data)
    if v == nil and err ~= nil then
        assert(type(err) == "string", "an error that is not a string")
        return
    end
    u.no_raise("json.encode", json.encode, v)
end
