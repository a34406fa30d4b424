--- moonserve/host/core/semaphore.lua: semaphores, as OpenResty's ngx.semaphore, between the handlers,
-- light threads, timers and hooks of one worker.
--
-- `Semaphore`: A semaphore (moonserve.semaphore(n)).
-- @module moonserve.semaphore
local dispatcher = require "moonserve.host.core.dispatcher"

local waiter, park, wake = dispatcher.waiter, dispatcher.park, dispatcher.wake
local type, error = type, error

local Semaphore = {}
Semaphore.__index = Semaphore

local _M = {}

--- A semaphore holding `n` resources (default 0).
function _M.new(n)
    n = n or 0
    if type(n) ~= "number" or n < 0 or n % 1 ~= 0 then
        error("bad argument #1 to 'semaphore' (a whole number expected)", 2)
    end
    return setmetatable({ n = n, queue = {}, head = 1, tail = 0 }, Semaphore)
end

--- Adds `n` resources (default 1); each wakes one waiter, first come first served, on the
-- next turn of the loop.
function Semaphore:post(n)
    n = n or 1
    if type(n) ~= "number" or n < 1 or n % 1 ~= 0 then
        error("bad argument #1 to 'post' (a positive whole number expected)", 2)
    end
    self.n = self.n + n
    local q = self.queue
    while self.n > 0 and self.head <= self.tail do
        local w = q[self.head]
        q[self.head] = nil
        self.head = self.head + 1
        if wake(w) then -- (false: it timed out, or its thread was killed)
            self.n = self.n - 1
            w.granted = true
        end
    end
end

--- Takes a resource, waiting up to `timeout` seconds (default 0: no wait) for one. Returns
-- true, or nil and "timeout".
-- @usage local sema = moonserve.semaphore(0)
-- local ok, err = sema:wait(5)      -- another coroutine calls sema:post()
function Semaphore:wait(timeout)
    timeout = timeout or 0
    if type(timeout) ~= "number" or timeout < 0 then
        error("bad argument #1 to 'wait' (a non-negative number of seconds expected)", 2)
    end
    if self.n > 0 and self.head > self.tail then
        self.n = self.n - 1
        return true
    end
    if timeout == 0 then
        return nil, "timeout"
    end
    local w = waiter("semaphore:wait")
    self.tail = self.tail + 1
    self.queue[self.tail] = w
    park(w, timeout)
    if w.granted then
        return true
    end
    w.woken = true
    return nil, "timeout"
end

--- Resources held now; negative: that many waiters.
function Semaphore:count()
    if self.n > 0 then
        return self.n
    end
    local waiting = 0
    for i = self.head, self.tail do
        local w = self.queue[i]
        if w and not w.woken then
            waiting = waiting + 1
        end
    end
    return -waiting
end

return _M
