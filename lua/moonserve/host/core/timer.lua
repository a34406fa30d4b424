--- moonserve/host/core/timer.lua: timers, as OpenResty's ngx.timer: each run in a coroutine of its own
-- with the whole non-blocking API, fn(premature, ...), premature = true when the worker
-- stops. The machinery (slots, caps, the stop) is the dispatcher's.
-- @module moonserve.timer
local dispatcher = require "moonserve.host.core.dispatcher"

local _M = {}

--- Runs fn(false, ...) in `delay` seconds. Returns a handle (handle:cancel()), or nil and
-- "too many pending timers" (the timers_pending limit) or "process exiting".
-- @function at
-- @tparam number delay seconds
-- @tparam function fn fn(premature, ...)
-- @param ... passed on to fn
-- @usage moonserve.timer.at(5, function(premature, who) moonserve.log.info("hi ", who) end, "ada")
_M.at = dispatcher.timer_at

--- Runs fn(false, ...) every `interval` seconds until cancelled or the worker stops.
-- @function every
-- @tparam number interval seconds
-- @tparam function fn fn(premature, ...)
-- @param ... passed on to fn
_M.every = dispatcher.timer_every

--- How many timers wait to run, and how many runs are under way, in this worker.
function _M.counts()
    return dispatcher.timer_counts()
end

return _M
