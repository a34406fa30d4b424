--- moonserve/log.lua: the error log for apps: moonserve.log.info("user ", id, " signed in").
-- The arguments are joined with tostring, as ngx.log joins them; the line goes where the
-- server logs (--log FILE or stderr), with its time and level, and only if --log-level lets
-- that level through.
-- @module moonserve.log
local host = require "moonserve.host"

local concat, select, tostring = table.concat, select, tostring

local _M = {}

local function line(...)
    local n = select("#", ...)
    if n == 1 then
        return tostring((...))
    end
    local parts = { ... }
    for i = 1, n do
        parts[i] = tostring(parts[i])
    end
    return concat(parts, "", 1, n)
end

--- Logs at level error: the arguments joined with tostring.
-- @usage moonserve.log.error("payment failed: ", err)
function _M.error(...)
    host.log("err", line(...))
end

--- Logs at level warn: the arguments joined with tostring.
function _M.warn(...)
    host.log("warn", line(...))
end

--- Logs at level info: the arguments joined with tostring.
-- @usage moonserve.log.info("user ", id, " signed in")
function _M.info(...)
    host.log("info", line(...))
end

--- Logs at level debug (shown with --log-level debug): the arguments joined with tostring.
function _M.debug(...)
    host.log("debug", line(...))
end

return _M
