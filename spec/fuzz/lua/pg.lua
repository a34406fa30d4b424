-- PostgreSQL replies as the client reads them: a session's startup (authentication: clear
-- text, MD5, SCRAM's server messages) and a query's results (row descriptions, rows decoded by
-- their columns' types, errors, notices, notifications) never raise; each gives its result,
-- or nil and an error.
local conn = require "moonserve.pg.conn"
local u = require "fuzz_util"

-- The first byte picks the exchange and the decoders' numeric option.
return function(data)
    local mode = data:byte(1) or 0
    local o = { user = "u", password = "p", database = "d", sslmode = "disable",
        numeric = mode % 4 == 1 and "string" or nil, connect_ms = 1000, timeout = 1000 }
    local c = setmetatable({ sock = u.socket(data:sub(2)), opts = o, status = "I", sent = false,
        got = false, broken = false, max_message = 1048576, notifications = {}, params = {},
        on_notice = function(n) assert(type(n) == "table", "a notice that is not a table") end },
        conn.Conn)
    if mode % 2 == 0 then
        local ok, err = u.no_raise("startup", conn.startup, c, o)
        assert(ok == true or err ~= nil, "a failed startup with no error")
        return
    end
    local results, err = u.no_raise("collect", c.collect, c, nil, nil)
    if results == nil then
        assert(type(err) == "table" or type(err) == "string", "an error of type " .. type(err))
        return
    end
    assert(type(results) == "table", "results of type " .. type(results))
end
