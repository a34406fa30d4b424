-- dispatch_bench.lua: keep-alive GETs through the engine and the Lua dispatch, in-process
-- over the memory transport (no socket). For callgrind (bench/instructions): two counts,
-- the difference divided. With GC=1 it prints the Lua heap bytes allocated per request.
--   luajit bench/dispatch_bench.lua N [PIPELINE] [MODE]      (or MODE=... in the environment)
-- Modes: raw (the bare dispatcher), framework (router, request and reply objects, default
-- security headers), nosec (the same without security headers), params (a :param route),
-- routes10k (the :param route among 10,000 routes), notfound (a 404 page), redirect (a
-- non-canonical path answered 308), json (res:json of a small table), jsonarr (the same in
-- a process where a table was once marked as a JSON array, as moonserve.pg's results are),
-- ngx (an app:ngx_content route answering with ngx.print), sock (a handler that makes a
-- moonserve.socket.tcp and sets its timeout, not connected), ngxsock (the same with
-- ngx.socket.tcp in an app:ngx_content route), mw (a route with two middleware that pass the
-- request on), use (the hello route under one such middleware of the app's, app:use), limit
-- (a route under moonserve.ratelimit in local mode, never reached), session (the hello under
-- moonserve.sessions, cookie store, a request with no cookie), cors (under moonserve.cors, a
-- request with no Origin).
-- METRICS=1: the metrics on, as a worker with --metrics counts. BUDGET=MS: the CPU budget
-- on, as a worker has it by default (handler_cpu_ms 2000).
-- luacheck: globals ngx (OpenResty's global, which moonserve.ngx installs for the ngx modes)
local n = tonumber(arg[1]) or 100000
local pipeline = tonumber(arg[2]) or 1
local mode = arg[3] or os.getenv("MODE") or "framework"

local moonserve = require "moonserve"
local server = require "moonserve.server"

local path = "/"
local app
if mode == "raw" then
    app = { handle = function(_, _, res) res:send("hello world") end }
else
    local opts = {}
    if mode == "nosec" then
        opts.security = false
    end
    app = moonserve.app(opts)
    app:get("/", function(_, res) res:send("hello world") end)
    app:get("/users/:id", function(req, res) res:send(req.params.id) end)
    app:get("/json", function(_, res) res:json { message = "hello world", n = 42 } end)
    if mode == "ngx" or mode == "ngxsock" or mode == "sock" then
        require "moonserve.ngx"
        app:ngx_content("/ngx", function() ngx.print("hello world") end)
        app:ngx_content("/ngxsock", function()
            local sock = ngx.socket.tcp()
            sock:settimeout(1000)
            ngx.print("hello world")
        end)
        app:get("/sock", function(_, res)
            local sock = moonserve.socket.tcp()
            sock:settimeout(1000)
            res:send("hello world")
        end)
    end
    -- (a middleware that passes the request on, as any does at its end)
    local function pass(_, _, nxt) return nxt() end
    if mode == "use" then
        app:use(pass)
    elseif mode == "session" then
        app:use(moonserve.sessions { secret = string.rep("b", 32) })
    elseif mode == "cors" then
        app:use(moonserve.cors { origins = { "https://app.example" } })
    end
    app:get("/mw", pass, pass, function(_, res) res:send("hello world") end)
    if mode == "jsonarr" then
        moonserve.json.array {}
    end
    if mode == "limit" then
        -- (the dictionary a worker would have made and mapped at its start)
        local zone = require "moonserve.host.core.shared"
        local fd = assert(zone.create("ratelimit", 16 * 1024 * 1024))
        require("moonserve.shared").register("ratelimit",
            assert(zone.attach(fd, "ratelimit", 16 * 1024 * 1024)))
        app:get("/limit", moonserve.ratelimit { limit = 65536, window = 0.25, name = "local" },
            function(_, res) res:send("hello world") end)
    end
    if mode == "routes10k" then
        for i = 1, 5000 do
            app:get("/items/" .. i, function(_, res) res:send("item") end)
            app:get("/users/:id/things/" .. i, function(_, res) res:send("thing") end)
        end
    end
    path = ({ params = "/users/42", routes10k = "/users/42", notfound = "/nothing",
        redirect = "/users//42", json = "/json", jsonarr = "/json", ngx = "/ngx",
        ngxsock = "/ngxsock", sock = "/sock", mw = "/mw", limit = "/limit" })[mode] or "/"
end

local budget = tonumber(os.getenv("BUDGET"))
local srv = server.create(app, { requests_per_connection = 1e9, handler_cpu_ms = budget })
if budget then
    require("moonserve.host.core.dispatcher").start_guards(srv)
end
if os.getenv("METRICS") == "1" and mode ~= "raw" then
    -- Counted as a worker with metrics on counts: routes numbered, a zone of its own.
    local metrics = require "moonserve.metrics"
    local names = metrics.number_routes(app)
    rawset(app, "metrics_on", true)
    local fd = assert(require("moonserve.base").core.metrics_create(1, 1024))
    assert(srv:metrics(fd, 0))
    require("moonserve.base").core.fd_close(fd)
    metrics.attach(srv, 0, names)
end
local conn = srv:memconn()
local req = "GET " .. path .. " HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: bench\r\n"
    .. "Accept: */*\r\n\r\n"
local batch = req:rep(pipeline)
local measure_gc = os.getenv("GC") == "1"
for _ = 1, 1000 do -- warm: traces compiled, pools filled
    conn:feed(req)
end
if measure_gc then
    collectgarbage()
    collectgarbage("stop")
end
local before = collectgarbage("count")
local bytes = 0
for _ = 1, n, pipeline do
    bytes = bytes + conn:feed(batch, true)
end
local allocated = (collectgarbage("count") - before) * 1024
conn:close()
if measure_gc then
    print(("%-10s %5.0f Lua heap bytes per request, %d reply bytes"):format(mode,
        allocated / n, bytes / n))
else
    print(("%d requests, %d bytes out (%s)"):format(n, bytes, mode))
end
