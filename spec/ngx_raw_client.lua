-- The client side of spec/fixtures/ngx_socket_cases.lua's sock_raw, for the specs that run it
-- against moonserve and nginx: what the server sent after its 101, and the 101's head.
local helper = require "helper"

local _M = {}

function _M.exchange(port)
    local s = helper.connect(port, 5)
    assert(s:send("GET /sock_raw HTTP/1.1\r\nHost: raw.test\r\nUpgrade: x-echo\r\n"
        .. "Connection: upgrade\r\n\r\n"))
    local head = assert(helper.read_response(s, true))
    local out = {}
    local function lines(n)
        for _ = 1, n do
            out[#out + 1] = assert(s:receive("*l"))
        end
    end
    lines(4)                    -- methods, again, body, say
    assert(s:send("abcdef"))    -- read as 4 bytes, then 4 more of which 2 come: a timeout
    lines(2)
    assert(s:send("a line\r\n"))
    lines(1)
    out[#out + 1] = assert(s:receive(3)) -- the table sent: "ab1"
    lines(1)
    assert(s:send("rest"))
    s:shutdown("send")          -- the client ends its side after a partial line
    local rest, err, partial = s:receive("*a")
    out[#out + 1] = rest or partial
    s:close()
    return table.concat(out, "\n"), head, err
end

return _M
