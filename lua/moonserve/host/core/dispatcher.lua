-- moonserve/host/core/dispatcher.lua: the coroutine dispatcher the core calls once per request, and
-- for every wake. Each request runs in a coroutine from a pool; one that parks (waits for its
-- body, a timer, a slow reader) is resumed by the core when its wait is over. Waits reach
-- here through the handler's own coroutines too (moonserve/host/core/coroutine.lua). What a request's
-- error means (the log line, error pages) is the app's: app:handle_error.
--
-- Slots. Every coroutine the dispatcher parks has a slot: parked[slot] is the coroutine,
-- owners[slot] what it runs for: the request (cdata) of a handler, or a task (a table: a
-- timer's run, a worker hook, a light thread), or a pending timer (no coroutine yet). A
-- request's own waits (body, sleep, drain) come back through on_resume, at the slot the
-- request names (r.handler); every other wait is armed on the slot itself (core/engine/wake.c:
-- ms_ffi_wake_after, or what a socket arms next) and comes back through on_event(slot,
-- status), which resumes whatever is parked there with the status. Lua wakes a slot the same
-- way, on the next turn of the loop (wake: a semaphore's post, a thread's end), so a resume
-- never nests inside the code that caused it.
local bit = require "bit"
local base = require "moonserve.host.core.base"
local request = require "moonserve.host.core.request"
local response = require "moonserve.host.core.response"
local coro = require "moonserve.host.core.coroutine"

local C = base.C
local band = bit.band
local co_create, co_resume, co_yield = coro.raw.create, coro.raw.resume, coro.raw.yield
local co_status, co_running = coro.raw.status, coro.raw.running
local traceback, type, pcall, tostring = debug.traceback, type, pcall, tostring
local PARK, EXIT = coro.PARK, coro.EXIT
local HEAD_SENT, REQ_IN_HANDLER = base.REQ_HEAD_SENT, base.REQ_IN_HANDLER
local ETIMEDOUT, WAKE_STOP = base.abi.ETIMEDOUT, base.abi.WAKE_STOP
local coro_park = coro.park
local ffi = require "ffi"
local unpack, select, format = unpack, select, string.format


local _M = {}

local DONE = setmetatable({}, { __tostring = function() return "moonserve.DONE" end })
local POOL_MAX = 256

local app          -- the application this worker serves
local current      -- the request whose handler (or light thread) runs right now
local task         -- the task that runs right now (nil: a handler, or nothing)
local current_co   -- the coroutine the dispatcher resumed last, at the bottom of the chain
local pool, npool = {}, 0
local parked, owners, free_slots, nfree = {}, {}, {}, 0
local roots = {}   -- by a handler's slot: what its light threads are, once it spawned one
local nroots = 0
local home         -- the server this process serves (ms_server_t *), once attach() ran
local home_obj     -- the same, as the core's server object (its in-process connections)
local limits = { timers_pending = 1024, timers_running = 256, thread_job_bytes = 16777216,
    fanout_queue = 10000, handler_cpu_ms = 0, lua_memory = 0 }
_M.limits = limits
local owned, nowned = {}, 0 -- by a handler's slot: what its request made (sockets), once it made one
-- By handler coroutine: its frame, { req, res } of the request it runs now, where a layer
-- above (the ngx layer) keeps what it holds per request. Weak: a coroutine an exit dropped
-- takes its frame along.
local frames = setmetatable({}, { __mode = "k" })
local stopping = false

local function slot_new(co, owner)
    local slot
    if nfree > 0 then
        slot = free_slots[nfree]
        nfree = nfree - 1
    else
        slot = #parked + 1
    end
    parked[slot], owners[slot], owned[slot] = co or false, owner, false
    return slot
end

local function slot_free(slot)
    parked[slot], owners[slot] = false, false
    nfree = nfree + 1
    free_slots[nfree] = slot
end

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

-- The `return status, body, headers` form of a handler (the framework's, for every host).
local reply_with = require("moonserve.app").reply_with

local scrape_listener = false -- a metrics listener is on: its requests get the scrape
local REQ_METRICS = base.REQ_METRICS

-- GET /profile?seconds=S (folded stacks) or /profile.svg?seconds=S (a flame graph): this
-- worker sampled for S seconds (default 10).
local function profile(req, res, svg)
    local seconds = tonumber(req.query.seconds or 10)
    if not seconds or seconds <= 0 or seconds > 300 then
        return res:status(400):send("seconds: a number from 0 to 300\n")
    end
    local p = require "moonserve.profile"
    local samples, total, cpu = p.run(seconds)
    if not samples then
        return res:status(409):send(total .. "\n") -- (`total` is the error then)
    end
    res:header("x-profile-samples", format("%d", total))
    res:header("x-profile-cpu-ms", format("%.0f", cpu * 1000))
    local title = format("moonserve worker %d, %g s, %.0f ms of CPU",
        require("moonserve.host.core.worker").id(), seconds, cpu * 1000)
    if svg then
        res:header("content-type", "image/svg+xml")
        return res:send(p.svg(samples, { title = title }))
    end
    res:header("content-type", "text/plain; charset=utf-8")
    return res:send(p.folded(samples))
end

local function scrape(req, res)
    local p = req.path
    if p == "/profile" or p == "/profile.svg" then
        return profile(req, res, p == "/profile.svg")
    end
    if p ~= "/metrics" and p ~= "/" then
        return res:status(404):send("not found\n")
    end
    return require("moonserve.host.core.metrics").handler(req, res)
end

local function handle(req, res, frame)
    if scrape_listener and band(req.r.flags, REQ_METRICS) ~= 0 then
        return scrape(req, res)
    end
    local status, body, headers = app:handle(req, res)
    local returned = frame.returned -- the ngx layer's: its buffered output goes out now
    if returned then
        frame.returned = false
        local r = req.r
        returned(frame, status ~= nil, nroots > 0 and r.handler >= 0 and roots[r.handler] ~= nil)
    end
    if status ~= nil then
        reply_with(res, status, body, headers)
    end
    -- A trace barrier (coroutine.running is not compiled: the trace stops here and a new one
    -- starts after it). A trace that began deeper, in a side exit of the handler's code or of
    -- the lines above, would otherwise run on to the return into xpcall below its start,
    -- which LuaJIT cannot compile ("NYI: return to lower frame"): it aborts, and after a few
    -- tries its side exit is left to the interpreter for good. That is OpenResty code's
    -- (a driver's side exits, through the ngx layer, which gave the request its frame.ngx);
    -- on other requests the barrier would cost some 1,200 instructions for nothing.
    if frame.ngx then
        co_running()
    end
end

-- What an owner (a request's table in `owned`, or a root task) made is done with when it
-- ends: each object's _release() closes it. The first is held apart from the rest, so that
-- the common owner of one socket needs no loop (a loop here would keep the request's trace
-- from being compiled) and no set.
local function release(o, code)
    local first = o.owned1
    if first then
        o.owned1 = nil
        first:_release(code)
    end
    local objs = o.owned
    if objs then
        o.owned = nil
        for obj in pairs(objs) do
            obj:_release(code)
        end
    end
end

-- `code`: a WebSocket the request held closes with it (1011 when its handler was stopped).
local function release_request(slot, code)
    local o = owned[slot]
    if o then
        owned[slot] = false -- (false, as in parked: the key stays, and no store inserts it)
        nowned = nowned - 1
        release(o, code)
    end
end

-- A layer's last word on the request (the ngx phases), once: frame.finish(frame, ok).
local function finish_layer(frame, ok)
    local finish = frame.finish
    if finish then
        frame.finish = false
        local fok, ferr = pcall(finish, frame, ok)
        if not fok then
            base.log(base.LOG_ERR, "after the handler: " .. tostring(ferr))
        end
    end
end

-- The body of every pooled coroutine: one request per turn, then back to the pool.
-- ended() reads `req` and `res` by name from this frame.
local join, kill_all

local function worker(r)
    -- Every key the frame takes, false until set: a compiled trace that stores nil under a
    -- key the table lacks inserts the key (NEWREF), and past the table's size rehashes it,
    -- on every request.
    local frame = { req = false, res = false, ngx = false, returned = false, finish = false,
        cpu_ms = false }
    frames[co_running()] = frame
    while true do
        local req, res = request.new(r), response.new(r)
        frame.req, frame.res = req, res
        local ok, err = xpcall(handle, traceback, req, res, frame)
        if not ok then
            fail(r, req, res, err)
        end
        local root = nroots > 0 and r.handler >= 0 and roots[r.handler]
        if root then
            -- The request is done when its light threads are; after an error, they are killed.
            if not ok then
                kill_all(root)
            end
            join(root)
            roots[r.handler] = nil
            nroots = nroots - 1
        end
        finish_layer(frame, ok)
        if nowned > 0 and r.handler >= 0 then
            release_request(r.handler)
        end
        req.r, res.r = false, false -- the core reuses the request once finished
        frame.req, frame.res, frame.ngx, frame.returned = false, false, false, false
        frame.cpu_ms = false
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

local seeded = false
local function reference()
    if not seeded then
        seeded = true
        math.randomseed(os.time() + math.floor(os.clock() * 1e6))
    end
    return format("%08x", math.random(0, 0x7fffffff))
end

local function log_error(what, err)
    local ref = reference()
    base.log(base.LOG_ERR, format("[%s] %s: %s", ref, what, tostring(err)))
    return ref
end

-- -- Runaway code (modules/ms_guard.c) ----------------------------------------------------
-- Each resume of a handler, a timer's run or a light thread has limits.handler_cpu_ms of CPU
-- (a route's own with req:cpu_budget) until it yields; past it, the code is stopped with an
-- error at its next instruction, compiled loops included. An allocation that would take the
-- Lua heap past limits.lua_memory fails, and stops the code alike. Per resume this costs two
-- stores and a load; the clock runs in the core's SIGPROF handler.
local guard_on = false -- resumes are numbered: a CPU budget or a memory cap is on
local guard_run = 0
local default_ms = 0x7fffffff -- a resume's budget: limits.handler_cpu_ms, or none
local replace_asked = false

local function guard_begin(ms)
    guard_run = guard_run < 0x7fffffff and guard_run + 1 or 1
    C.ms_ffi_budget_ms = ms
    C.ms_ffi_resume = guard_run
end

-- After a resume: "cpu" or "memory" when the guard stopped it (the hook is off again then).
local STOPS = { "cpu", "memory" }
local STOP_ERRORS = { cpu = "CPU budget exceeded (limits.handler_cpu_ms)",
    memory = "not enough memory (limits.lua_memory)" }
local function guard_end()
    C.ms_ffi_resume = 0
    if C.ms_ffi_stop ~= 0 then
        return STOPS[C.ms_ffi_stop_settle()]
    end
end

-- The log line of a stop: what ran out, where it was (a traceback).
local function stop_log(what, why, ms)
    local where = ffi.string(C.ms_ffi_stop_where())
    if why == "memory" then
        return log_error(format("%s ran out of memory (the Lua heap reached limits.lua_memory, "
            .. "%d bytes)", what, limits.lua_memory), where)
    end
    return log_error(format("%s ran out of its CPU budget (%d ms without yielding; "
        .. "limits.handler_cpu_ms)", what, ms), where)
end

-- After a memory stop: a full collection, and a worker whose heap stays past three quarters
-- of the cap asks its master for a replacement (it drains meanwhile; what is in flight ends).
local function after_memory_stop()
    collectgarbage()
    local heap = collectgarbage("count") * 1024
    if heap <= limits.lua_memory * 0.75 or replace_asked then
        return
    end
    replace_asked = true
    local why = format("its Lua heap stays at %d bytes after a collection, past three quarters "
        .. "of limits.lua_memory", heap)
    local ok, err = base.core.worker_replace(why)
    base.log(base.LOG_WARN, why .. (ok and ": it asks the master for a replacement"
        or ": no master to replace it (" .. tostring(err) .. ")"))
end

--- Starts the guards in the process that serves `srv` (runner.lua): the CPU budget's clock
-- when limits.handler_cpu_ms or a route asks for one, the memory cap when limits.lua_memory
-- (and the heap's allocator in any case).
function _M.start_guards(srv)
    -- The Lua heap goes through the guard's allocator with no cap too (2^52 bytes): it keeps
    -- the small blocks the VM frees for its next allocations of their sizes, cheaper than
    -- LuaJIT's allocator (PERFORMANCE.md).
    local capped = limits.lua_memory > 0
    local ok, err = srv:memory_cap(capped and limits.lua_memory or 2 ^ 52)
    if ok then
        guard_on = guard_on or capped
    elseif capped then
        base.log(base.LOG_WARN, "the Lua heap has no cap: " .. tostring(err))
    end
    if limits.handler_cpu_ms == 0 and not (app and app.has_cpu_budgets and app:has_cpu_budgets())
    then
        return
    end
    ok, err = srv:cpu_budget()
    if not ok then
        base.log(base.LOG_WARN, "handlers run with no CPU budget: " .. tostring(err))
        return
    end
    default_ms = limits.handler_cpu_ms > 0 and limits.handler_cpu_ms or 0x7fffffff
    guard_on = true
end

--- Sets the running handler's budget (ms of CPU between two waits), from now on: a route's
-- own limits.handler_cpu_ms (app.lua). 0: none.
function _M.cpu_budget(ms)
    local frame = current_co and frames[current_co]
    if frame and guard_on then
        frame.cpu_ms = ms
        C.ms_ffi_budget_ms = ms > 0 and ms or 0x7fffffff
    end
end

--- Samples this worker for `seconds` of wall time (the caller sleeps meanwhile; the worker
-- serves on): Lua frames and the core's C functions, at each tick of its CPU clock (modules/
-- ms_profile.c). Returns {[folded stack] = samples}, the samples in all and the CPU seconds
-- the process used meanwhile; or nil and an error (a profile runs already). From a handler
-- or a timer.
function _M.profile(seconds)
    if home_obj == nil then
        return nil, "no server runs in this process"
    end
    local ok, err, code = home_obj:profile(true)
    if not ok then
        return nil, code == "EALREADY" and "a profile runs already" or err
    end
    -- (resumes are numbered while it runs: a tick in C is then the handler's or the core's)
    local was_on = guard_on
    guard_on = true
    local cpu = os.clock()
    local slept, why = pcall(_M.sleep, seconds)
    cpu = os.clock() - cpu
    guard_on = was_on
    local samples, total = home_obj:profile(false)
    if not slept then
        error(why, 0)
    end
    return samples, total, cpu
end

-- The budget of a resume of handler coroutine `co`.
local function handler_budget(co)
    local frame = frames[co]
    local ms = frame and frame.cpu_ms or limits.handler_cpu_ms
    return ms > 0 and ms or 0x7fffffff
end

-- A handler's coroutine that ended without finishing its request (an exit, or the budget
-- stopped it): its reply goes out as it stands, and the coroutine, with any of the handler's
-- own that the exit passed through, is dropped; its light threads are killed, what it owns
-- released (a WebSocket closed with `code`). Returns the request's objects.
local function abandon(co, r, code)
    local root = r.handler >= 0 and roots[r.handler]
    if root then
        kill_all(root)
        roots[r.handler] = nil
        nroots = nroots - 1
    end
    local frame = frames[co]
    if frame then
        finish_layer(frame, true)
    end
    if nowned > 0 and r.handler >= 0 then
        release_request(r.handler, code)
    end
    return ended(co)
end

-- The guard stopped handler coroutine `co` of request `r` (why: "cpu", "memory"): one log
-- line, and 503 through the app's error page when no byte of the reply left yet (else the
-- reply is cut off).
local function stopped(co, r, why)
    local frame = frames[co]
    local req, res = frame and frame.req, frame and frame.res
    abandon(co, r, 1011)
    local what = "request"
    if req then
        local route = rawget(req, "_route")
        what = format("%s %s (route %s)", tostring(req.method), tostring(req.path),
            route and tostring(route.name or route.path) or "none")
    end
    local ref = stop_log(what, why, frame and frame.cpu_ms or limits.handler_cpu_ms)
    if band(r.flags, REQ_IN_HANDLER) ~= 0 then
        if band(r.flags, HEAD_SENT) == 0 and req and res then
            res:_reset()
            local ok, err = pcall(app.error, app, req, res, { status = 503, ref = ref })
            if not ok then
                base.log(base.LOG_ERR, "error page failed: " .. tostring(err))
            end
            if band(r.flags, HEAD_SENT) == 0 then
                r.status = 503
                res:send("503 Service Unavailable\nreference: " .. ref .. "\n")
            end
        else
            C.ms_ffi_req_fail(r)
        end
    end
    if req then
        req.r = false
    end
    if res then
        res.r = false
    end
    C.ms_ffi_req_finish(r)
end

-- After a resume of handler coroutine `co` of request `r` (`ok`: what the resume said):
-- whether the guard stopped it. (A memory error that the code caught, and that it yielded
-- after before the stop took effect, leaves it going.)
local function guard_stopped(co, r, ok)
    local why = guard_end()
    if not why then
        return false
    end
    if not ok then
        stopped(co, r, why)
    end
    if why == "memory" then
        after_memory_stop()
    end
    return not ok
end

-- After a resume: back to the pool, or parked until the core resumes it (returns true).
local function settle(co, r, ok, sig)
    if not ok then
        -- An error outside the handler's protection: a bug in the dispatcher itself.
        base.log(base.LOG_ERR, "handler coroutine died: " .. traceback(co, tostring(sig)))
        if nowned > 0 and r.handler >= 0 then
            release_request(r.handler)
        end
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
        -- The handler ended early (ngx.exit and the like).
        local req, res = abandon(co, r)
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
        r.handler = slot_new(co, r)
    end
    return true
end

-- The running handler's slot, taken now for a wait that is armed on it (or a root of
-- light threads).
local function handler_slot(r)
    if r.handler < 0 then
        C.ms_ffi_req_park(r)
        r.handler = slot_new(current_co, r)
    end
    return r.handler
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
    -- (The core calls in from its loop, never while Lua runs: no task runs now, and what
    -- current_co was is no one's any more.)
    local prev = current
    current, current_co = r, co
    if guard_on then
        guard_begin(default_ms)
        local ok, sig = co_resume(co, r)
        current = prev
        if guard_stopped(co, r, ok) then
            return
        end
        return settle(co, r, ok, sig)
    end
    local ok, sig = co_resume(co, r)
    current = prev
    settle(co, r, ok, sig)
end

local function resume_handler(r, slot, status)
    local co = parked[slot]
    if not co then -- cannot happen unless the core and the dispatcher disagree: say so
        base.log(base.LOG_ERR, "resume of request " .. tostring(r.id) .. " with no parked handler")
        return
    end
    local prev, prev_task, prev_co = current, task, current_co
    current, task, current_co = r, nil, co
    if guard_on then
        guard_begin(handler_budget(co))
    end
    local ok, sig = co_resume(co, status)
    current, task, current_co = prev, prev_task, prev_co
    if guard_on and guard_stopped(co, r, ok) then
        return slot_free(slot)
    end
    if not settle(co, r, ok, sig) then
        slot_free(slot)
    end
end

local function on_resume()
    local r = C.ms_ffi_current
    resume_handler(r, r.handler)
end

-- -- Tasks: timer runs, worker hooks, light threads --------------------------------------
-- A task is a table: kind ("run", "hook", "thread"), co, slot (its own, for its life), srv
-- (the server its waits are armed on), r (the request of a light thread, else nil), root
-- (who a light thread belongs to: a handler's root or a root task), dead, results.

local function wake_slot(srv, slot, status)
    C.ms_ffi_wake_after(srv, slot, 0, status or 0)
end

local function pack(...)
    return { n = select("#", ...), ... }
end

local settle_task, finish

local function run_task(t, ...)
    local prev, prev_task, prev_co = current, task, current_co
    current, task, current_co = t.r, t, t.co
    if guard_on then
        guard_begin(default_ms)
    end
    local ok, sig, res = co_resume(t.co, ...)
    current, task, current_co = prev, prev_task, prev_co
    local why = guard_on and guard_end()
    if why and not ok then
        stop_log(t.what or (t.kind == "thread" and "light thread") or t.kind, why,
            limits.handler_cpu_ms)
        if t.threads then
            kill_all(t)
        end
        if (t.owned1 or t.owned) and not t.root then
            release(t, 1011) -- (a WebSocket it runs for closes with 1011)
        end
        finish(t, { n = 2, false, STOP_ERRORS[why] })
    else
        settle_task(t, ok, sig, res)
    end
    if why == "memory" then
        after_memory_stop()
    end
end

-- The body of a task's coroutine: fn under xpcall, then (a root) its light threads.
local function task_body(t, fn, ...)
    local trace
    local res = pack(xpcall(fn, function(e)
        trace = traceback(e, 2)
        return e
    end, ...))
    if not res[1] then
        t.trace = trace
    end
    if t.threads then
        join(t)
    end
    return DONE, res
end

local function new_task(kind, srv, r, root)
    local t = { kind = kind, srv = srv, r = r, root = root }
    t.co = coro.handler(co_create(task_body), "task")
    t.slot = slot_new(t.co, t)
    return t
end

-- A task is over: its waiters hear it, its root counts it out, its slot is free again.
function finish(t, res)
    t.dead, t.results = true, res
    local cancel = t.cancel -- a wait under way that is not the dispatcher's (a socket's)
    if cancel then
        t.cancel = nil
        cancel()
    end
    if (t.owned1 or t.owned) and not t.root then
        release(t)
    end
    C.ms_ffi_wake_cancel(t.srv, t.slot)
    slot_free(t.slot)
    t.co = nil
    local root = t.root
    if root then
        root.threads[t] = nil
        root.nthreads = root.nthreads - 1
        if root.nthreads == 0 and root.joining then
            wake_slot(root.srv, root.slot)
        end
    end
    local waiters = t.waiters
    if waiters then
        for i = 1, #waiters do
            local w = waiters[i]
            if not w.woken then
                w.woken, w.first = true, t
                wake_slot(w.srv, w.slot)
            end
        end
        t.waiters = nil
    end
    if t.on_done then
        t.on_done(t)
    end
end

function settle_task(t, ok, sig, res)
    if not ok then
        -- An error outside the task's own protection: a bug here; the task is dropped.
        local err = traceback(t.co, tostring(sig))
        log_error("task coroutine died", err)
        return finish(t, { n = 2, false, tostring(sig) })
    end
    if sig == DONE then
        if not res[1] and t.kind ~= "thread" then
            log_error(t.what or t.kind, t.trace or res[2])
        elseif not res[1] then
            log_error("light thread", t.trace or res[2])
        end
        return finish(t, res)
    end
    if sig ~= PARK then
        -- coroutine.yield at the task's own level: serve others, go on at the next turn
        wake_slot(t.srv, t.slot)
    end
end

-- The server a new task's waits are armed on: the one of the call under way, else the one
-- this process serves.
local function server_now(what)
    local srv = C.ms_ffi_server
    if srv ~= nil then
        return srv
    end
    if home == nil then
        error(what .. ": no server runs in this process (an app file's top level runs in "
            .. "the master too: use app:on_worker_start)", 3)
    end
    return home
end

-- A waiter: what the running code (a handler or a task) parks on. Used once: park(w).
local function waiter(what)
    coro.check(what, "wait", 3)
    if task then
        return { slot = task.slot, srv = task.srv, task = task, woken = false }
    end
    local r = current
    return { slot = handler_slot(r), srv = server_now(what), r = r, woken = false }
end
_M.waiter = waiter

-- The owner of what the running code makes (a socket): a table with `srv` (the server its
-- waits are armed on) and `owned` (a set the maker may fill: each object's _release() runs
-- when the owner ends). A request's handler and its light threads share the request's; a
-- timer's run or a hook, and their light threads, the root task. Raises outside them, naming
-- the caller `prefix .. what` (the prefix is joined only then: a string made on every call
-- costs its hashing).
function _M.owner(what, level, prefix)
    level = (level or 2) + 1
    local t = task
    if t and not t.r then -- (a request's light thread has the request's, below)
        return t.root or t
    end
    local r = current
    if r == nil then
        error((prefix or "") .. what .. ": not inside a request, timer or hook (an app file's "
            .. "top level is none: use app:on_worker_start or a timer)", level)
    end
    local slot = handler_slot(r)
    local o = owned[slot]
    if not o then
        o = { srv = server_now(what), owned1 = false, owned = false } -- (keys made at once)
        owned[slot] = o
        nowned = nowned + 1
    end
    return o
end

-- `obj` is the owner's `o` (from _M.owner) until the owner ends, when its _release() runs.
function _M.adopt(o, obj)
    if not o.owned1 then
        o.owned1 = obj
        return
    end
    local objs = o.owned
    if not objs then
        objs = {}
        o.owned = objs
    end
    objs[obj] = true
end

-- Runs fn(...) in a root task of its own, apart from the running request, which may
-- finish while the task goes on (a WebSocket handler that outlives its request). It runs at
-- once, until it first waits; what it makes (owner) is released when it ends, and an error
-- it raises is logged with `what`.
function _M.detach(what, fn, ...)
    local t = new_task("detached", server_now(what), nil, nil)
    t.what = what
    run_task(t, t, fn, ...)
    return t
end

-- The context the running code is in: for a request's handler, its coroutines and its light
-- threads, the handler's frame ({ req, res }: "request"); for a timer's run, a hook and
-- their light threads, the root task ("timer" or "hook", and the hook's name; a detached
-- task, such as a WebSocket handler that outlived its request, is a "timer"); else nil.
-- The ngx layer keeps its per-context state in the table it gets.
function _M.context()
    local t = task
    if t then
        if t.hco then
            return frames[t.hco], "request"
        elseif t.r then
            return nil, "request" -- (a thread whose handler is gone)
        end
        local root = t.root or t
        local kind = root.kind
        return root, (kind == "run" or kind == "detached") and "timer" or "hook", root.what
    end
    if current ~= nil then
        return frames[current_co], "request"
    end
    return nil
end

-- Parks the running code on `w` until wake(w), or `seconds` (nil: no limit). Returns true,
-- or nil, "timeout". A wake and the timeout are one timer of the slot's: only one comes.
local function park(w, seconds)
    if seconds then
        local rc = C.ms_ffi_wake_after(w.srv, w.slot, seconds, ETIMEDOUT)
        if rc < 0 then
            return base.fail(rc)
        end
    end
    local status = coro_park()
    w.woken = true -- a late wake is no longer this waiter's
    if status == ETIMEDOUT then
        return nil, "timeout"
    end
    return true
end
_M.park = park

-- Wakes the code parked on `w` at the next turn of the loop; false if it is gone.
function _M.wake(w)
    if w.woken or (w.task and w.task.dead) then
        return false
    end
    w.woken = true
    wake_slot(w.srv, w.slot)
    return true
end

-- Waits until `root` has no light threads left.
function join(root)
    root.joining = true
    while root.nthreads > 0 do
        local w = waiter("waiting for light threads")
        root.slot, root.srv = w.slot, w.srv
        coro_park()
    end
    root.joining = false
end

local function kill(t)
    if t.dead then
        return
    end
    local res = { n = 2, false, "killed" }
    finish(t, res)
end

function kill_all(root)
    for t in pairs(root.threads) do
        kill(t)
    end
end

-- -- Light threads ------------------------------------------------------------------------

local Thread = {}
Thread.__index = Thread
Thread.__tostring = function(t)
    return "moonserve.thread (" .. (t.dead and "dead" or "running") .. ")"
end

-- The root the running code spawns into: its task's root, its root task, or its request's.
local function root_now(what)
    coro.check(what, "spawn a thread", 3)
    if task then
        if task.root then
            return task.root
        end
        if not task.threads then
            task.threads, task.nthreads = {}, 0
        end
        return task
    end
    local r = current
    local slot = handler_slot(r)
    local root = roots[slot]
    if not root then
        root = { threads = {}, nthreads = 0 }
        roots[slot] = root
        nroots = nroots + 1
    end
    return root
end

function _M.spawn(fn, ...)
    if type(fn) ~= "function" then
        error("bad argument #1 to 'spawn' (function expected)", 2)
    end
    local root = root_now("moonserve.spawn")
    local t = setmetatable(new_task("thread", task and task.srv or server_now("moonserve.spawn"),
        current, root), Thread)
    t.hco = task and task.hco or (not task and current_co) or nil -- a request's: its handler
    root.threads[t] = true
    root.nthreads = root.nthreads + 1
    run_task(t, t, fn, ...)
    return t
end

local function results(t)
    t.waited = true
    local res = t.results
    if res[1] then
        return true, unpack(res, 2, res.n)
    end
    return false, res[2]
end

local function check_thread(t, i, fname)
    if getmetatable(t) ~= Thread then
        error("bad argument #" .. i .. " to '" .. fname .. "' (a light thread expected)", 3)
    end
end

-- The first of the threads to finish: true and its results, or false and its error.
function _M.wait(...)
    local n = select("#", ...)
    if n == 0 then
        error("bad argument #1 to 'wait' (a light thread expected)", 2)
    end
    for i = 1, n do
        local t = select(i, ...)
        check_thread(t, i, "wait")
        if t == task then
            error("moonserve.wait: a thread cannot wait for itself", 2)
        end
    end
    -- As OpenResty's: a finished thread gives its results to one wait; one already waited
    -- for is passed over, but errors when it is the last argument.
    for i = 1, n do
        local t = select(i, ...)
        if t.dead then
            if not t.waited then
                return results(t)
            elseif i == n then
                return nil, "already waited or killed"
            end
        end
    end
    local w = waiter("moonserve.wait")
    for i = 1, n do
        local t = select(i, ...)
        t.waiters = t.waiters or {}
        t.waiters[#t.waiters + 1] = w
    end
    coro_park()
    return results(w.first)
end

-- Kills a light thread of the running request or task: true, or nil and why not.
function _M.kill(t)
    check_thread(t, 1, "kill")
    if t == task then
        error("moonserve.kill: a thread cannot kill itself (return from it)", 2)
    end
    if t.dead then
        return nil, "already finished"
    end
    if co_status(t.co) ~= "suspended" then
        error("moonserve.kill: the thread is running (it resumed this code)", 2)
    end
    local root = task and (task.root or task) or (current and roots[current.handler])
    if root ~= t.root then
        error("moonserve.kill: not a thread of this request or timer", 2)
    end
    kill(t)
    return true
end

-- Sleeps in a task, on its own slot.
local function task_sleep(seconds)
    coro.check("moonserve.sleep", "wait", 4)
    local rc = C.ms_ffi_wake_after(task.srv, task.slot, seconds, 0)
    if rc < 0 then
        return base.fail(rc)
    end
    coro_park()
    return true
end

-- -- Timers -------------------------------------------------------------------------------

local Timer = {}
Timer.__index = Timer
local pending, npending, nrunning = {}, 0, 0

local function run_timer(h, premature)
    if nrunning >= limits.timers_running and not premature then
        base.log(base.LOG_WARN, format("%d timers_running are not enough: a run of a timer is "
            .. "skipped", limits.timers_running))
        return
    end
    nrunning = nrunning + 1
    local t = new_task("run", h.srv, nil, nil)
    t.what = "timer"
    t.on_done = function()
        nrunning = nrunning - 1
    end
    run_task(t, t, h.fn, premature, unpack(h.args, 1, h.args.n))
end

local function unarm(h)
    pending[h] = nil
    npending = npending - 1
    C.ms_ffi_wake_cancel(h.srv, h.slot)
    slot_free(h.slot)
    h.slot = nil
end

local function fire(h)
    if h.interval and not stopping then
        C.ms_ffi_wake_after(h.srv, h.slot, h.interval, 0)
    else
        unarm(h)
    end
    run_timer(h, false)
end

local function timer_new(what, delay, fn, interval, ...)
    if type(delay) ~= "number" or delay < 0 or delay ~= delay then
        error("bad argument #1 to '" .. what .. "' (a non-negative number of seconds expected)", 3)
    end
    if type(fn) ~= "function" then
        error("bad argument #2 to '" .. what .. "' (function expected)", 3)
    end
    local srv = server_now("moonserve.timer." .. what)
    if stopping then
        return nil, "process exiting"
    end
    if npending >= limits.timers_pending then
        return nil, "too many pending timers"
    end
    local h = setmetatable({ kind = "timer", fn = fn, args = pack(...), interval = interval,
        srv = srv }, Timer)
    h.slot = slot_new(nil, h)
    local rc = C.ms_ffi_wake_after(srv, h.slot, delay, 0)
    if rc < 0 then
        slot_free(h.slot)
        return base.fail(rc)
    end
    pending[h] = true
    npending = npending + 1
    return h
end

function _M.timer_at(delay, fn, ...)
    return timer_new("at", delay, fn, nil, ...)
end

function _M.timer_every(interval, fn, ...)
    if type(interval) == "number" and interval <= 0 then
        error("bad argument #1 to 'every' (a positive number of seconds expected)", 2)
    end
    return timer_new("every", interval, fn, interval, ...)
end

-- Cancels a timer that has not run yet (or, for every, its next runs): true, or nil, why not.
function Timer:cancel()
    if not pending[self] then
        return nil, "not pending"
    end
    unarm(self)
    return true
end

function Timer:pending()
    return pending[self] == true
end

function _M.timer_counts()
    return npending, nrunning
end

--- What the dispatcher holds now, counted: slots in use (parked coroutines, tasks, pending
-- timers, waits of the core's objects), requests that own objects, roots of light threads,
-- pooled coroutines, pending and running timers. For checks that nothing is left behind
-- (bench/resets, the soak): each returns to its idle value once the traffic has ended.
function _M.census()
    return { slots = #parked - nfree, owning = nowned, roots = nroots, pool = npool,
        timers_pending = npending, timers_running = nrunning }
end

-- -- Worker hooks and the stop --------------------------------------------------------------

-- Runs `hooks` one after another in a task (errors are logged and the next runs), then
-- done() if given.
local function run_hooks(srv, what, hooks, done)
    local t = new_task("hook", srv, nil, nil)
    t.what = what
    t.on_done = done
    run_task(t, t, function()
        for _, fn in ipairs(hooks) do
            local ok, err = xpcall(fn, traceback)
            if not ok then
                log_error(what .. " hook failed", err)
            end
        end
    end)
end

local stop_hooks

-- The worker stops: pending timers run now with premature = true, then the stop hooks.
local function on_stop()
    if stopping then
        return
    end
    stopping = true
    local list = {}
    for h in pairs(pending) do
        list[#list + 1] = h
    end
    for _, h in ipairs(list) do
        unarm(h)
        run_timer(h, true)
    end
    if stop_hooks and #stop_hooks > 0 and home ~= nil then
        run_hooks(home, "on_worker_stop", stop_hooks)
    end
end

local function on_event(slot, status)
    if slot == WAKE_STOP then
        return on_stop()
    end
    local who = owners[slot]
    if not who then
        return -- cancelled, or its task is gone
    end
    if type(who) == "cdata" then
        return resume_handler(who, slot, status)
    end
    local kind = who.kind
    if kind == "timer" then
        return fire(who)
    elseif kind == nil and who._wake then
        return who:_wake(status) -- a slot_for's object
    elseif kind == "call" then
        slot_free(slot)
        local ok, err = xpcall(who.fn, traceback, status)
        if not ok then
            log_error(who.what, err)
        end
        return
    end
    if not who.dead then
        run_task(who, status)
    end
end

-- -- Calls from the loop -------------------------------------------------------------------
-- Work that must not run inside the code that asks for it (feeding an in-process request to
-- the engine, which dispatches it; the log phase, once the reply has left) runs from the
-- loop, with no handler or task of Lua's under way.

-- A slot whose wake (by the core, or _M.soon) calls fn(status) from the loop, once; `what`
-- names it in the log if fn raises.
function _M.on_wake(what, fn)
    return slot_new(nil, { kind = "call", what = what, fn = fn })
end

-- A slot of `obj`'s for as long as it keeps it: each wake calls obj:_wake(status) from the
-- loop (a WebSocket with callbacks, which parks no coroutine). slot_drop gives it back.
function _M.slot_for(obj)
    return slot_new(nil, obj)
end

function _M.slot_drop(slot)
    local srv = home
    if srv ~= nil then
        C.ms_ffi_wake_cancel(srv, slot)
    end
    slot_free(slot)
end

-- Calls fn() from the loop at its next turn.
function _M.soon(what, fn)
    local srv = server_now(what)
    wake_slot(srv, _M.on_wake(what, fn))
end

-- Runs fn() now in a task of its own (a hook's: waits work, errors are logged), whose
-- context (_M.context) is a table with `ngx` = st: the state a layer above made for it.
function _M.run_as(what, st, fn)
    local t = new_task("hook", server_now(what), nil, nil)
    t.what, t.ngx = what, st
    run_task(t, t, fn)
end

-- An in-process connection to the server this process serves (core server:memconn): its
-- requests report `tag`, and slot `slot` is woken once the engine ends it. From the loop
-- only (_M.on_wake, _M.soon): not from a handler's coroutine.
function _M.memconn(tag, slot)
    if home_obj == nil then
        error("no server runs in this process", 2)
    end
    return home_obj:memconn(tag, slot)
end

-- Whether a metrics listener is on (its requests are answered with the scrape).
function _M.metrics_listener(on)
    scrape_listener = on
end

-- The core's callbacks for serving `the_app`: on_request, on_resume, on_event.
function _M.serve(the_app)
    app = the_app
    return on_request, on_resume, on_event
end

-- The server `srv` (core.server) is the one this process serves, with `lims` (the limits
-- table given to it; the core's defaults for the keys it lacks).
function _M.attach(srv, lims)
    home = ffi.cast("ms_server_t *", srv:pointer())
    home_obj = srv
    local defaults = base.core.default_limits()
    limits.timers_pending = lims and lims.timers_pending or defaults.timers_pending
    limits.timers_running = lims and lims.timers_running or defaults.timers_running
    limits.thread_job_bytes = lims and lims.thread_job_bytes or defaults.thread_job_bytes
    limits.fanout_queue = lims and lims.fanout_queue or defaults.fanout_queue
    limits.handler_cpu_ms = lims and lims.handler_cpu_ms or defaults.handler_cpu_ms
    limits.lua_memory = lims and lims.lua_memory or defaults.lua_memory
    -- (the Redis shared dictionaries hold their keys and values to these)
    local redis_limits = require("moonserve.redis.dict").limits
    for _, k in ipairs({ "redis_key_bytes", "redis_value_bytes" }) do
        redis_limits[k] = lims and lims[k] or defaults[k]
    end
    stopping = false
end

-- Runs the app's on_worker_start hooks, then ready() (the worker listens and says so);
-- keeps its on_worker_stop hooks for the stop.
function _M.start_worker(srv, starts, stops, ready)
    stop_hooks = stops
    local p = ffi.cast("ms_server_t *", srv:pointer())
    if starts and #starts > 0 then
        run_hooks(p, "on_worker_start", starts, ready and function() ready() end)
    elseif ready then
        ready()
    end
end

function _M.attached()
    return home ~= nil
end

-- Whether the worker is stopping (its pending timers have run early).
function _M.stopping()
    return stopping
end

-- Parks the running handler for `seconds`; other requests are served meanwhile. Works in
-- the handler's own coroutines and inside pcall; raises where LuaJIT cannot yield.
function _M.sleep(seconds)
    local r = current
    if type(seconds) ~= "number" or seconds < 0 then
        error("bad seconds (non-negative number expected)", 2)
    end
    if task then
        return task_sleep(seconds)
    end
    if r == nil then
        error("moonserve.sleep: not inside a handler", 2)
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
    if task then
        error("moonserve.exit: not in a request's handler (in a " .. (task.kind == "thread"
            and "light thread" or task.kind == "run" and "timer" or "hook") .. ")", 2)
    end
    if current == nil then
        error("moonserve.exit: not inside a handler", 2)
    end
    coro.check("moonserve.exit", "end the handler", 2)
    coro.exit()
end

return _M
