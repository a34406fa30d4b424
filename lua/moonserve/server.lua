-- moonserve/server.lua: the dispatcher the core calls once per request, and running a server.
-- Each request runs in a coroutine from a pool; one that parks (waits for its body, a timer,
-- a slow reader) is resumed by the core when its wait is over. Waits reach here through the
-- handler's own coroutines too (moonserve/coroutine.lua).
local ffi = require "ffi"
local bit = require "bit"
local base = require "moonserve.base"
local request = require "moonserve.request"
local response = require "moonserve.response"
local coro = require "moonserve.coroutine"

local C, core = base.C, base.core
local band = bit.band
local co_create, co_resume, co_yield = coro.raw.create, coro.raw.resume, coro.raw.yield
local traceback, format, type = debug.traceback, string.format, type
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

math.randomseed(os.time() + math.floor(os.clock() * 1e6))

-- A short id that ties an error page to its log line.
local function reference(r)
    return format("%06x%04x", math.random(0, 0xffffff), tonumber(r.id) % 0x10000)
end

local function fail(r, req, res, err)
    local ref = reference(r)
    local ok, method, path = pcall(function() return req.method, req.path end)
    if not ok then
        method, path = "?", "?"
    end
    base.log(base.LOG_ERR, format("[%s] %s %s: %s", ref, method, path, tostring(err)))
    local page_app = rawget(req, "_app") or app
    -- error handlers first (the site's, then its app's); one that answers ends it
    local a = page_app
    while a and band(r.flags, HEAD_SENT) == 0 do
        for _, fn in ipairs(a.error_handlers or {}) do
            local ok, herr = pcall(fn, req, res, err, ref)
            if not ok then
                base.log(base.LOG_ERR, format("[%s] error handler failed: %s", ref, tostring(herr)))
            end
            if band(r.flags, HEAD_SENT) ~= 0 then
                break
            end
        end
        a = a.parent
    end
    if band(r.flags, HEAD_SENT) == 0 then
        C.ms_ffi_res_reset(r)
        res.has_type = false
        local shown = type(page_app.error) == "function" and pcall(function()
            if page_app.secure_reply then
                page_app:secure_reply(req, res)
            end
            page_app:error(req, res, { status = 500, ref = ref, trace = tostring(err) })
        end)
        if not shown and band(r.flags, HEAD_SENT) == 0 then
            C.ms_ffi_res_reset(r)
            r.status = 500
            res.has_type = false
            res:send("500 Internal Server Error\nreference: " .. ref .. "\n")
        end
    else
        C.ms_ffi_req_fail(r) -- part of the reply is out: cut it off
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
        body, status = status, nil -- return "text" means 200 "text"
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

-- Makes the core server for `the_app` in this process.
function _M.create(the_app, limits)
    app = the_app
    local srv = core.server { on_request = on_request, on_resume = on_resume, limits = limits }
    -- The app's static mounts, served by the core from here on.
    if type(the_app.static_mounts) == "function" then
        for _, m in ipairs(the_app:static_mounts()) do
            local id, err = srv:static(m.prefix == "" and "/" or m.prefix, m.dir, m.opts)
            if not id then
                error("cannot serve " .. m.dir .. " at " .. m.prefix .. "/: " .. err, 4)
            end
            m.mount.id = id
        end
    end
    return srv
end

-- The limits for the core, which checks keys and values. A route may allow a larger body
-- than body_bytes; the core then lets declared lengths up to the largest through to the
-- router, which holds each request to its route's limit.
local function parse_limits(t, the_app)
    if t ~= nil and type(t) ~= "table" then
        error("bad limits (table expected)", 3)
    end
    local limits = {}
    for k, v in pairs(t or {}) do
        limits[k] = v
    end
    if type(the_app.max_body_bytes) == "function" and limits.body_bytes_max == nil then
        local default = limits.body_bytes or core.default_limits().body_bytes
        local max = the_app:max_body_bytes(default)
        if max > default then
            limits.body_bytes_max = max
        end
    end
    return limits
end

-- The command line that started this program, to start workers with: the interpreter
-- and its options (arg's negative indexes), the script, its arguments.
local function command_line()
    if type(arg) ~= "table" or arg[0] == nil then
        error("workers > 0 need the program's command line (run the app with luajit or "
            .. "moonserve), or use workers = 0", 3)
    end
    local lo = 0
    while arg[lo - 1] ~= nil do
        lo = lo - 1
    end
    local argv = {}
    for i = lo, #arg do
        argv[#argv + 1] = arg[i]
    end
    return argv
end

-- Listeners as { addr = "HOST:PORT", proxy_protocol = bool }, from "HOST:PORT", a table
-- { "HOST:PORT", proxy_protocol = true }, or a list of those.
local function listen_list(listen)
    if listen == nil then
        listen = "127.0.0.1:8080"
    end
    if type(listen) == "string" or (type(listen) == "table" and type(listen[1]) == "string"
            and listen.proxy_protocol ~= nil) then
        listen = { listen }
    end
    if type(listen) ~= "table" or #listen == 0 then
        error("bad listen (\"HOST:PORT\" or a list of them expected)", 3)
    end
    local out = {}
    for i, l in ipairs(listen) do
        if type(l) == "string" then
            out[i] = { addr = l, proxy_protocol = false }
        elseif type(l) == "table" and type(l[1]) == "string" then
            out[i] = { addr = l[1], proxy_protocol = l.proxy_protocol == true }
        else
            error("bad listen entry " .. i, 3)
        end
    end
    return out
end

local function addresses(listen)
    local t = {}
    for i, l in ipairs(listen) do
        t[i] = l.addr
    end
    return t
end

-- Makes the core server with the options every mode shares.
local function make(the_app, opts, limits)
    local srv = _M.create(the_app, limits)
    local cache = opts.static_cache
    if cache then
        srv:static_cache(cache.files, cache.bytes) -- nil: the core's defaults
    end
    for _, cidr in ipairs(opts.trusted_proxies or {}) do
        local ok, err = srv:trust(cidr)
        if not ok then
            error("bad trusted proxy " .. tostring(cidr) .. ": " .. err, 3)
        end
    end
    return srv
end

local function serve(srv)
    srv:run()
    base.log(base.LOG_INFO, "stopped")
    srv:close()
    return true
end

-- Serves `the_app`. opts.listen: "HOST:PORT", { "HOST:PORT", proxy_protocol = true }, or a
-- list of those (default "127.0.0.1:8080"); opts.trusted_proxies: address ranges whose
-- X-Forwarded-For is believed;
-- opts.workers: worker processes under a master (default: one per CPU), 0 for a single
-- process; opts.limits (core.limits()); opts.static_cache: { files = n, bytes = n }, the
-- cache of static files per worker; opts.log: a log file instead of stderr;
-- opts.stop_timeout: seconds a stopping worker may take; opts.on_listen(port) in
-- single-process mode. The defaults are the core's: core.defaults().
function _M.run(the_app, opts)
    opts = opts or {}
    if opts.log then
        local ok, err = core.log_open(opts.log)
        if not ok then
            error("cannot open log " .. opts.log .. ": " .. err, 2)
        end
    end
    local limits = parse_limits(opts.limits, the_app)
    local listen = listen_list(opts.listen)

    if os.getenv("MOONSERVE_WORKER") then
        -- A worker: the master bound the sockets, in the order of `listen`, from fd 4 on.
        local srv = make(the_app, opts, limits)
        for i = 1, tonumber(os.getenv("MOONSERVE_LISTEN_FDS")) or 1 do
            assert(srv:listen_fd(3 + i, listen[i] and listen[i].proxy_protocol))
        end
        assert(core.worker_ready())
        return serve(srv)
    end

    local workers = opts.workers or core.cpus()
    if type(workers) ~= "number" or workers < 0 or workers % 1 ~= 0 then
        error("bad workers (a whole number expected)", 2)
    end
    if workers > 0 then
        local ok, err = core.master { argv = command_line(), listen = addresses(listen),
            workers = workers, stop_timeout = opts.stop_timeout }
        if not ok then
            error("cannot listen on " .. table.concat(addresses(listen), ", ") .. ": " .. err, 2)
        end
        base.log(base.LOG_INFO, "stopped")
        return true
    end

    local srv = make(the_app, opts, limits)
    for _, l in ipairs(listen) do
        local addr = l.addr
        local port, err = srv:listen(addr, nil, l.proxy_protocol)
        if not port then
            error("cannot listen on " .. addr .. ": " .. err, 2)
        end
        local host = addr:match("^(.*):%d+$")
        base.log(base.LOG_INFO, format("listening on http://%s:%d/",
            host ~= "" and host or "0.0.0.0", port))
        if opts.on_listen then
            opts.on_listen(port)
        end
    end
    return serve(srv)
end

return _M
