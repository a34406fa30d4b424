-- A multipart body, fed in pieces whose size the input's first byte chooses: next() never
-- raises, gives events of the known kinds, keeps to its bound of parts, and ends with "end"
-- or an error once the body is over.
local multipart = require "moonserve.multipart"
local u = require "fuzz_util"

local KINDS = { part = true, data = true, part_end = true, ["end"] = true }

return function(data)
    local step = (data:byte(1) or 1) % 64 + 1
    local body = data:sub(2)
    local p = multipart.parser("b0undary", { max_header_bytes = 512, max_parts = 8 })
    local parts, at, finished = 0, 1, false
    for _ = 1, 100000 do
        local ev, err = u.no_raise("parser:next", p.next, p)
        if ev then
            assert(KINDS[ev.type], "an unknown event")
            if ev.type == "part" then
                parts = parts + 1
                assert(parts <= 8, "more parts than the bound")
            elseif ev.type == "end" then
                return
            end
        elseif err then
            assert(type(err) == "string", "an error that is not a string")
            return
        elseif at <= #body then
            u.no_raise("parser:feed", p.feed, p, body:sub(at, at + step - 1))
            at = at + step
        else
            assert(not finished, "no event, no error, after the body's end")
            u.no_raise("parser:finish", p.finish, p)
            finished = true
        end
    end
    error("no end after 100000 steps")
end
