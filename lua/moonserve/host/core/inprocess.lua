-- moonserve/host/core/inprocess.lua: an app served in this process without a socket, for its
-- own specs (moonserve.test): the core server the runner makes, fed requests over in-memory
-- connections (server:memconn), with this process's loop turned while a reply is under way.
local base = require "moonserve.host.core.base"
local dispatcher = require "moonserve.host.core.dispatcher"
local runner = require "moonserve.host.core.runner"

local core = base.core
local error = error

local _M = {}

local Server = {}
Server.__index = Server

local active -- the Server whose app the dispatcher serves now: one app a process at a time

-- The dispatcher serves one app, on one server, at a time: a spec with two clients has each
-- take it over for its own requests.
local function activate(s)
    if active ~= s then
        dispatcher.serve(s.app)
        dispatcher.attach(s.srv, s.limits)
        core.log_quiet(s.quiet)
        if s.stops then
            dispatcher.start_worker(s.srv, nil, s.stops) -- (its stop hooks, nothing to start)
        end
        active = s
    end
end

-- Turns the loop until `done()` or `seconds` have gone by (whichever first); whether done.
local function turn_until(done, seconds)
    local deadline = core.now() + seconds
    while not done() do
        local left = deadline - core.now()
        if left <= 0 then
            return false
        end
        core.run_once(left < 0.25 and left or 0.25)
    end
    return true
end

--- Serves `app` in this process. opts: limits (as app:run's), start_hooks (false: the app's
-- on_worker_start hooks are not run; they run by default, as in a worker), start_timeout
-- (seconds for them, 10), quiet (true: the log's lines reach the replies' `log` only, not
-- the log). Returns the server.
function _M.open(app, opts)
    opts = opts or {}
    rawset(app, "shared_decl",
        require("moonserve.shared").declare_wanted(rawget(app, "shared_decl") or {}))
    local opened, why = require("moonserve.host.core.shared").open(app.shared_decl)
    if not opened then
        error(why, 3)
    end
    local limits = runner.parse_limits(opts.limits, app)
    local s = setmetatable({ app = app, limits = limits, quiet = opts.quiet == true }, Server)
    s.srv = runner.create(app, limits)
    active = nil
    activate(s)
    core.log_tap(true) -- (and left on: another client may be open)
    local starts = opts.start_hooks ~= false and rawget(app, "worker_start_hooks") or nil
    local ready = false
    -- The stop hooks, then one of ours that says they have run (close() waits for it).
    local stops = {}
    for i, fn in ipairs(rawget(app, "worker_stop_hooks") or {}) do
        stops[i] = fn
    end
    stops[#stops + 1] = function()
        s.stopped = true
    end
    s.stops = stops
    dispatcher.start_worker(s.srv, starts, stops, function()
        ready = true
    end)
    if not turn_until(function() return ready end, opts.start_timeout or 10) then
        error("the app's on_worker_start hooks did not return within "
            .. (opts.start_timeout or 10) .. " s", 3)
    end
    s.start_log = core.log_taken()
    return s
end

--- Sends `bytes` over a new in-memory connection and turns the loop until `complete(out,
-- closed)` says the answer is whole (out: what the server wrote so far, closed: whether it
-- ended the connection) and the server has ended the connection (or `grace` seconds more
-- went by), or `seconds` went by. Returns what the server wrote, whether it was complete,
-- whether the server closed, and the log lines of the while ({ "error: ...", ... }).
function Server:exchange(bytes, complete, seconds, grace)
    if self.srv == nil then
        error("the test client is closed", 3)
    end
    activate(self)
    core.log_taken() -- (what came before is no reply's)
    local conn = self.srv:memconn()
    local out, closed = conn:feed(bytes)
    local parts = { out }
    local whole = false
    local function check()
        local more, c = conn:take()
        if more ~= "" then
            parts[#parts + 1] = more
        end
        closed = closed or c
        local text = table.concat(parts)
        parts = { text }
        whole = whole or complete(text, closed)
        return whole or closed
    end
    turn_until(check, seconds)
    if whole and not closed then
        -- The reply is whole; the handler may still be running after it (it said
        -- connection: close, so the server ends the connection once the handler returns).
        turn_until(function() return check() and closed end, grace)
    end
    check()
    conn:close()
    local log = core.log_taken()
    return parts[1], whole, closed, log
end

local Conn = {}
Conn.__index = Conn

--- A connection kept open (a WebSocket after its handshake): conn:send(bytes),
-- conn:wait(done, seconds), conn:close(); conn.buf holds what the server wrote and no one
-- took yet, conn.closed whether the server ended it.
function Server:connect()
    if self.srv == nil then
        error("the test client is closed", 3)
    end
    activate(self)
    return setmetatable({ server = self, conn = self.srv:memconn(), buf = "", closed = false },
        Conn)
end

local function take(c, out, closed)
    if out ~= "" then
        c.buf = c.buf .. out
    end
    c.closed = c.closed or closed
end

--- Sends `bytes` to the server.
function Conn:send(bytes)
    activate(self.server)
    take(self, self.conn:feed(bytes))
end

--- Turns the loop until `done(conn)` returns a value (returned), the server ends the
-- connection (nil) or `seconds` go by (nil); with the log's lines of the while.
function Conn:wait(done, seconds)
    activate(self.server)
    local v
    turn_until(function()
        take(self, self.conn:take())
        v = done(self)
        return v ~= nil or self.closed
    end, seconds)
    return v, core.log_taken()
end

function Conn:close()
    self.conn:close()
    self.closed = true
end

--- Turns the loop for `seconds`: timers, light threads and other background work of the
-- app's run meanwhile.
function Server:turn(seconds)
    activate(self)
    turn_until(function() return false end, seconds)
    return core.log_taken()
end

--- Ends the server: its on_worker_stop hooks run, and its in-process connections go.
function Server:close()
    if self.srv == nil then
        return
    end
    activate(self)
    self.srv:stop() -- pending timers run early, then the on_worker_stop hooks
    turn_until(function() return self.stopped end, 5)
    -- The thread pools are the process's and go on; a job still in one wakes no one now.
    local threads = package.loaded["moonserve.host.core.threads"]
    if threads then
        threads.server_gone(self.srv:pointer())
    end
    self.srv:close()
    self.srv = nil
    active = nil
    core.log_quiet(false)
end

return _M
