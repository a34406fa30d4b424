-- Redis replies as the client reads them: resp.read never raises, gives values of RESP's
-- kinds, and says "bad reply" or a socket error for what is not one.
local resp = require "moonserve.redis.resp"
local u = require "fuzz_util"

local function check(v, depth)
    local t = type(v)
    assert(depth < 20, "nesting past the bound")
    if t == "table" and not resp.is_error(v) and v ~= resp.null then
        for _, e in ipairs(v) do
            check(e, depth + 1)
        end
    else
        assert(t == "string" or t == "number" or t == "table" or v == resp.null, "a " .. t)
    end
end

return function(data)
    local sock = u.socket(data)
    for _ = 1, 64 do
        local v, err = u.no_raise("resp.read", resp.read, sock)
        if v == nil then
            assert(type(err) == "string", "no error")
            return
        end
        check(v, 0)
    end
end
