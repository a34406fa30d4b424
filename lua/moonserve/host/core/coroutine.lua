-- moonserve/host/core/coroutine.lua: the coroutine functions handler code sees, so that a wait
-- reaches the dispatcher through the handler's own coroutines and a plain yield does not.
--
-- A handler runs in a coroutine the dispatcher resumes. A wait (moonserve.sleep, req:body,
-- a congested res:write) arms the core and yields PARK. When that happens in a coroutine
-- of the handler's own, the coroutine.resume below that resumed it sees PARK, yields PARK
-- in turn to its own resumer, and so on up to the dispatcher; when the dispatcher resumes
-- the handler, each of them resumes its child with what it was given, down to the wait.
-- Any other yield goes back to the resumer as in plain Lua (coroutine.yield is LuaJIT's
-- own; one in the handler itself reaches the dispatcher, which lets the worker serve others
-- and resumes the handler, with nothing, on the next turn of the loop). EXIT goes up too, but
-- nobody is resumed again: the dispatcher finishes the request and drops the coroutines,
-- and pcall never sees it, since it is a yield and not an error. Plain Lua: the core is not
-- needed to load it (moonserve does, before any app is defined).

local type, error = type, error

-- The functions as LuaJIT made them, kept where a reload of this module finds them (test
-- runners unload modules between files; the global table keeps our wrappers).
local registry = debug.getregistry()
local raw = registry["moonserve.coroutine.raw"]
if not raw then
    raw = { create = coroutine.create, resume = coroutine.resume, yield = coroutine.yield,
        status = coroutine.status, wrap = coroutine.wrap, running = coroutine.running,
        isyieldable = coroutine.isyieldable }
    registry["moonserve.coroutine.raw"] = raw
end
local co_resume, co_yield, co_status = raw.resume, raw.yield, raw.status
local co_create, co_running, co_isyieldable = raw.create, raw.running, raw.isyieldable

-- The signal a handler's coroutine yields when it parks; the dispatcher resumes it later.
local PARK = setmetatable({}, { __tostring = function() return "moonserve.PARK" end })
local EXIT = setmetatable({}, { __tostring = function() return "moonserve.EXIT" end })

local weak = { __mode = "k" }
local handlers = setmetatable({}, weak) -- the dispatcher's coroutines
-- What handler code may not resume: the dispatcher's coroutines, and those a wait (or an
-- exit) passes through, which are suspended only as far as the core is concerned.
local held = setmetatable({}, weak)
-- Who resumed a coroutine that is running or normal now: its parent coroutine, or MAIN
-- (the main thread: no handler), or CCALL (a resume from a place that cannot yield).
local up = setmetatable({}, weak)
local MAIN, CCALL = {}, {}

local _M = { raw = raw, PARK = PARK, EXIT = EXIT }

local C_CALL = "inside a C call (string.gsub callback, table.sort comparator, FFI callback "
    .. "or require)"

-- Raises unless the running code can yield all the way up to the dispatcher. `what` names
-- the caller, `doing` the deed ("moonserve.sleep: cannot wait here: ..."); `level` is
-- error()'s, counted from the caller of check. Returns what the dispatcher marked the
-- coroutine at the bottom of the chain with (_M.handler's `kind`).
function _M.check(what, doing, level)
    level = level + 1
    local co, main = co_running()
    if co == nil or main then
        error(what .. ": not inside a handler", level)
    end
    if not co_isyieldable() then
        error(what .. ": cannot " .. doing .. " here: " .. C_CALL, level)
    end
    while not handlers[co] do
        local parent = up[co]
        if parent == nil then
            error(what .. ": cannot " .. doing .. " here: in a coroutine resumed by something "
                .. "other than coroutine.resume or coroutine.wrap", level)
        elseif parent == MAIN then
            error(what .. ": not inside a handler", level)
        elseif parent == CCALL then
            error(what .. ": cannot " .. doing .. " here: " .. C_CALL, level)
        end
        co = parent
    end
    return handlers[co]
end

-- As check, for a wait on the request itself (its body, its reply draining): only the
-- request's handler may, not a light thread, timer or hook.
function _M.check_request(what, doing, level)
    if _M.check(what, doing, level + 1) == "task" then
        error(what .. ": cannot " .. doing .. " here: only the request's handler waits for its "
            .. "request, not a light thread, timer or hook", level + 1)
    end
end

-- Parks the running handler until the core resumes it: the core's wait is armed already.
-- Call check() before arming it. Returns what the dispatcher resumed it with (nothing).
function _M.park()
    return co_yield(PARK)
end

-- Ends the running handler at once (after check()): the reply as it stands goes out, and
-- no code of the handler runs again, whatever pcall or coroutine it sits in.
function _M.exit()
    co_yield(EXIT)
    error("moonserve.exit: resumed after the handler ended") -- the dispatcher never does
end

-- The dispatcher's coroutines are not the handler's to resume. `kind`: true for a request's
-- handler (the default), "task" for a timer's run, a hook or a light thread.
function _M.handler(co, kind)
    handlers[co], held[co] = kind or true, true
    return co
end

-- -- What handler code sees as coroutine.* ------------------------------------------------

local pass

-- The child was resumed after a wait: it is no longer held.
local function continue(co, ...)
    held[co] = nil
    return pass(co, co_resume(co, ...))
end

-- What a child's resume gave: a wait or an exit goes on up; anything else is the caller's.
function pass(co, ok, sig, ...)
    if sig == PARK and ok then
        held[co] = true
        return continue(co, co_yield(PARK))
    elseif sig == EXIT and ok then
        -- For good: the dispatcher drops the whole chain. Forget the parent too, or the
        -- entry (a strong value under a weak key) would keep the dropped chain alive.
        held[co], up[co] = true, nil
        co_yield(EXIT)
    end
    up[co] = nil
    return ok, sig, ...
end

local function resume(co, ...)
    if type(co) ~= "thread" then
        error("bad argument #1 to 'resume' (coroutine expected)", 2)
    end
    if held[co] then
        return false, "cannot resume non-suspended coroutine"
    end
    if up[co] ~= nil then
        return co_resume(co, ...) -- running or normal: plain Lua's answer
    end
    local parent, main = co_running()
    if parent == nil or main then
        parent = MAIN
    elseif not co_isyieldable() then
        parent = CCALL
    end
    up[co] = parent
    return pass(co, co_resume(co, ...))
end

-- A coroutine a wait passes through is active: it is "normal", as a resumer is.
local function status(co)
    if type(co) ~= "thread" then
        error("bad argument #1 to 'status' (coroutine expected)", 2)
    end
    local s = co_status(co)
    if s == "suspended" and held[co] then
        return "normal"
    end
    return s
end

local function wrapped(ok, ...)
    if ok then
        return ...
    end
    local err = ...
    -- as plain wrap does: a string error gets the caller's position
    error(err, type(err) == "string" and 2 or 0)
end

local function wrap(f)
    if type(f) ~= "function" then
        error("bad argument #1 to 'wrap' (function expected, got " .. type(f) .. ")", 2)
    end
    local co = co_create(f)
    return function(...)
        return wrapped(resume(co, ...))
    end
end

_M.resume, _M.status, _M.wrap = resume, status, wrap

-- -- A phase: where an exit stops ----------------------------------------------------------

local phase_step

local function phase_continue(co, ...)
    held[co] = nil
    return phase_step(co, co_resume(co, ...))
end

function phase_step(co, ok, sig, ...)
    if ok and sig == PARK then
        held[co] = true
        return phase_continue(co, co_yield(PARK))
    elseif ok and sig == EXIT then
        held[co], up[co] = true, nil -- dropped: nobody resumes it again
        return false
    end
    if not ok then
        up[co] = nil
        error(sig, 0)
    end
    if co_status(co) == "dead" then -- fn came back: sig is xpcall's verdict
        up[co] = nil
        if sig then
            return true, ...
        end
        error((...), 0)
    end
    -- a plain yield at fn's own level goes up as the handler's own would
    return phase_continue(co, co_yield(sig, ...))
end

local traceback = debug.traceback

-- Runs fn(...) in a coroutine of its own, through which waits pass up to the dispatcher as
-- they do through the handler's own coroutines, but where an exit (_M.exit) ends fn alone:
-- returns true and fn's results, or false when fn exited. An error in fn raises here again,
-- with fn's traceback. Call it only where check() passes (in a handler or task).
function _M.phase(fn, ...)
    local co = co_create(function(...)
        return xpcall(fn, traceback, ...)
    end)
    up[co] = co_running()
    return phase_step(co, co_resume(co, ...))
end

-- Handler code uses the global table: the one every module sees, from here on. A module
-- that keeps its own copy of coroutine.resume from before cannot wait in what it resumes.
coroutine.resume, coroutine.status, coroutine.wrap = resume, status, wrap -- luacheck: ignore 122
coroutine.yield = co_yield -- luacheck: ignore 122 -- a reload puts back LuaJIT's own over an older version's

return _M
