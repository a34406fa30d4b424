--- moonserve/reconnect.lua: how the background tasks that hold a connection to a server
-- (Redis pub/sub in moonserve.fanout, LISTEN in moonserve.pg.listen) try again: waits that
-- double from 0.1 s to 5 s between failures, back to 0.1 s after a session that lasted
-- 10 s (a new outage rather than the same one going on).
-- @module moonserve.reconnect
local host = require "moonserve.host"

local _M = { MIN = 0.1, MAX = 5, LASTED = 10 }

local Backoff = {}
Backoff.__index = Backoff

--- A backoff: b:wait() sleeps and doubles the next wait, up to MAX; b:reset().
function _M.backoff()
    return setmetatable({ next = _M.MIN }, Backoff)
end

function Backoff:wait()
    host.sleep(self.next)
    self.next = self.next * 2 > _M.MAX and _M.MAX or self.next * 2
end

function Backoff:reset()
    self.next = _M.MIN
end

--- Runs session() again and again until it returns nil (it is done) or stopping() is true.
-- A session that fails returns its error: on_down(err) runs (false ends the loop), then the
-- backoff waits.
function _M.loop(session, on_down, stopping)
    local backoff = _M.backoff()
    while not stopping() do
        local t0 = host.now()
        local err = session()
        if err == nil or stopping() then
            return
        end
        if host.now() - t0 > _M.LASTED then
            backoff:reset()
        end
        if on_down(err) == false then
            return
        end
        backoff:wait()
    end
end

return _M
