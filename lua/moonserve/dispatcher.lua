-- moonserve/dispatcher.lua: the coroutine dispatcher the core calls once per request.
-- Each request runs in a coroutine from a pool; one that parks (waits for its body, a timer,
-- a slow reader) is resumed by the core when its wait is over. Waits reach here through the
-- handler's own coroutines too (moonserve/coroutine.lua). What a request's error means
-- (the log line, error pages) is the app's: app:handle_error.
local bit = require "bit"
local base = require "moonserve.base"
local request = require "moonserve.request"
local response = require "moonserve.response"
local coro = require "moonserve.coroutine"

local C = base.C
local band = bit.band
local co_create, co_resume, co_yield = coro.raw.create, coro.raw.resume, coro.raw.yield
local traceback, type, pcall, tostring = debug.traceback, type, pcall, tostring
local PARK, EXIT = coro.PARK, coro.EXIT
local HEAD_SENT, REQ_IN_HANDLER = base.REQ_HEAD_SENT, base.REQ_IN_HANDLER
local coro_park = coro.park

local _M = {}

local DONE = setmetatable({}, { __tostring = function() return "moonserve.DONE" end })
local POOL_MAX = 256

local app          -- the application this worker serves
local current      -- the request whose handler runs right now
local pool, npool = {}, 0
local parked, free_slots, nfree = {}, {}, 0

-- A handler raised `err` (its message and traceback). The app says what that means
-- (app:handle_error: log it, answer with an error page); what is left here is the state
-- of the reply. One whose head left before the error, or that nothing answered, is cut off
-- or answered with a bare 500.
local function fail(r, req, res, err)
    local out = band(r.flags, HEAD_SENT) ~= 0
    local policy = app.handle_error
    if type(policy) == "function" then
        local ok, perr = pcall(policy, app, req, res, err)
        if not ok then
            base.log(base.LOG_ERR, "handle_error failed: " .. tostring(perr)
                .. "; the handler's error: " .. tostring(err))
            out = out or band(r.flags, HEAD_SENT) ~= 0
        end
    else
        base.log(base.LOG_ERR, tostring(err))
    end
    if out then
        C.ms_ffi_req_fail(r) -- part of the reply is out: cut it off
    elseif band(r.flags, HEAD_SENT) == 0 then
        res:_reset()
        r.status = 500
        res:send("500 Internal Server Error\n")
    end
end

-- Applies the `return status, body, headers` form of a handler.
local function reply_with(res, status, body, headers)
    if res:sent() then
        return
    end
    if type(status) == "number" then
        res:status(status)
    elseif body == nil then
        body = status -- return "text" means 200 "text"
    end
    if headers then
        for k, v in pairs(headers) do
            res:header(k, v)
        end
    end
    if type(body) == "table" then
        return res:json(body)
    end
    return res:send(body)
end

local function handle(req, res)
    local status, body, headers = app:handle(req, res)
    if status ~= nil then
        reply_with(res, status, body, headers)
    end
end

-- The body of every pooled coroutine: one request per turn, then back to the pool.
-- ended() reads `req` and `res` by name from this frame.
local function worker(r)
    while true do
        local req, res = request.new(r), response.new(r)
        local ok, err = xpcall(handle, traceback, req, res)
        if not ok then
            fail(r, req, res, err)
        end
        req.r, res.r = false, false -- the core reuses the request once finished
        C.ms_ffi_req_finish(r)
        r = co_yield(DONE)
    end
end

-- The request objects of a handler coroutine that ended early (exit), from its worker frame
-- at the bottom of its stack: looked up only then, so that no request pays for it.
local function ended(co)
    local req, res
    local level = 0
    while true do
        local info = debug.getinfo(co, level, "f")
        if not info then
            return req, res
        end
        if info.func == worker then
            for i = 1, 32 do
                local name, v = debug.getlocal(co, level, i)
                if name == nil then
                    break
                elseif name == "req" then
                    req = v
                elseif name == "res" then
                    res = v
                end
            end
        end
        level = level + 1
    end
end

-- After a resume: back to the pool, or parked until the core resumes it (returns true).
local function settle(co, r, ok, sig)
    if not ok then
        -- An error outside the handler's protection: a bug in the dispatcher itself.
        base.log(base.LOG_ERR, "handler coroutine died: " .. traceback(co, tostring(sig)))
        if band(r.flags, REQ_IN_HANDLER) ~= 0 then
            C.ms_ffi_req_finish(r)
        end
        return
    end
    if sig == DONE then
        if npool < POOL_MAX then
            npool = npool + 1
            pool[npool] = co
        end
        return
    end
    if sig == EXIT then
        -- The handler ended early: its reply goes out as it stands, and the coroutine, with
        -- any of the handler's own that the exit passed through, is dropped.
        local req, res = ended(co)
        if req then
            req.r = false
        end
        if res then
            res.r = false
        end
        C.ms_ffi_req_finish(r)
        return
    end
    if sig ~= PARK then
        -- coroutine.yield in the handler itself, not in a coroutine of its own: nobody of
        -- the handler's resumes it, so serve others and go on at the next turn of the loop
        local rc = C.ms_ffi_req_sleep(r, 0)
        if rc < 0 then -- a wait already armed: cannot happen, since the handler was running
            base.log(base.LOG_ERR, "handler yielded while waiting; request aborted")
            C.ms_ffi_req_fail(r)
            C.ms_ffi_req_finish(r)
            return
        end
    end
    if r.handler < 0 then
        C.ms_ffi_req_park(r) -- the head leaves the shared read buffer
        local slot
        if nfree > 0 then
            slot = free_slots[nfree]
            nfree = nfree - 1
        else
            slot = #parked + 1
        end
        parked[slot] = co
        r.handler = slot
    end
    return true
end

local function on_request()
    local r = C.ms_ffi_current
    response.drain(r)
    local co
    if npool > 0 then
        co = pool[npool]
        pool[npool] = nil
        npool = npool - 1
    else
        co = coro.handler(co_create(worker))
    end
    local prev = current
    current = r
    local ok, sig = co_resume(co, r)
    current = prev
    settle(co, r, ok, sig)
end

local function on_resume()
    local r = C.ms_ffi_current
    local slot = r.handler
    local co = parked[slot]
    if not co then -- cannot happen unless the core and the dispatcher disagree: say so
        base.log(base.LOG_ERR, "resume of request " .. tostring(r.id) .. " with no parked handler")
        return
    end
    local prev = current
    current = r
    local ok, sig = co_resume(co)
    current = prev
    if not settle(co, r, ok, sig) then
        parked[slot] = false
        nfree = nfree + 1
        free_slots[nfree] = slot
    end
end

-- The core's callbacks for serving `the_app`: on_request, on_resume.
function _M.serve(the_app)
    app = the_app
    return on_request, on_resume
end

-- Parks the running handler for `seconds`; other requests are served meanwhile. Works in
-- the handler's own coroutines and inside pcall; raises where LuaJIT cannot yield.
function _M.sleep(seconds)
    local r = current
    if r == nil then
        error("moonserve.sleep: not inside a handler", 2)
    end
    if type(seconds) ~= "number" or seconds < 0 then
        error("bad seconds (non-negative number expected)", 2)
    end
    coro.check("moonserve.sleep", "wait", 2)
    local rc = C.ms_ffi_req_sleep(r, seconds)
    if rc < 0 then
        return base.fail(rc)
    end
    coro_park()
    return true
end

-- Ends the running handler now: the reply as it stands goes out (200 with an empty body if
-- nothing was sent), and no more of the handler runs: not the code after a pcall around it,
-- nor the rest of a coroutine of its own. The mechanism behind an OpenResty-style exit.
function _M.exit()
    if current == nil then
        error("moonserve.exit: not inside a handler", 2)
    end
    coro.check("moonserve.exit", "end the handler", 2)
    coro.exit()
end

return _M
