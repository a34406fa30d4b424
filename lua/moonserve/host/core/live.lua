-- moonserve/host/core/live.lua: live reload for development. Pages from a static mount with
-- live_reload carry a small script that listens on /.moonserve/live; this handler sends it
-- an event when a file under a watched directory changes, and the page reloads.
-- It reads the core's static generation: the core is loaded at its first request, not when
-- an app with a live_reload mount is defined.
local sleep = require("moonserve").sleep

local _M = {}

-- How often the handler looks at the change count, and how often it says it is alive.
local POLL, PING = 0.25, 15

function _M.stream(_, res)
    local base = require "moonserve.host.core.base"
    local C = base.C
    local r = res.r
    local seen = C.ms_ffi_static_generation(r)
    res:header("content-type", "text/event-stream")
    res:header("cache-control", "no-store")
    if not res:write("retry: 1000\n\n") then
        return
    end
    local quiet = 0
    -- Until the page goes away, or the server stops (which must not wait for a page).
    while not res:gone() and C.ms_ffi_server_stopping(r) == 0 do
        sleep(POLL)
        local now = C.ms_ffi_static_generation(r)
        local msg
        if now ~= seen then
            seen, quiet = now, 0
            msg = "data: reload\n\n"
        else
            quiet = quiet + POLL
            if quiet >= PING then
                quiet, msg = 0, ": ping\n\n"
            end
        end
        if msg and not res:write(msg) then
            return -- the page went away
        end
    end
end

return _M
