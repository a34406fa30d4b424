-- spec/it/ngx_trace_spec.lua: the handler of bench/redis_compare with lua-resty-redis (Debian's
-- nginx.redis on the ngx layer: a pooled GET a request) stays on LuaJIT's traces. It runs in
-- this process, against a real Redis, over an in-process connection, with the trace log on.
-- Which trace starts where depends on hot counters that are shared by hashed bytecode
-- address, so the checks are about reasons, not shapes: a nested loop's abort is anyone's.
-- luacheck: globals ngx (OpenResty's global, which moonserve.ngx installs)
local helper = require "helper"

describe("the lua-resty-redis handler under the JIT", function()
    local rpid, rport

    setup(function()
        helper.tool("nginx.redis")
        rport = helper.free_port()
        rpid = helper.background(string.format("%s --port %d --bind 127.0.0.1 --save '' "
            .. "--appendonly no --daemonize no", helper.tool("redis-server"), rport))
        helper.wait_port(rport)
        assert.equal("+OK", helper.redis_cmd(rport, "SET key value-0123456789"))
    end)

    teardown(function()
        if rpid then helper.stop_pid(rpid) end
    end)

    it("makes traces, and none of moonserve's aborts for a finaliser, its bytecode, its "
        .. "length or a tail call",
        function()
            local moonserve = require "moonserve"
            require "moonserve.ngx"
            local core = require("moonserve.base").core
            local socket = require "socket"
            local app = moonserve.app()
            app:ngx_content("/redis", function()
                local redis = require "nginx.redis"
                local red = redis:new()
                red:set_timeout(1000)
                assert(red:connect("127.0.0.1", rport))
                local value = assert(red:get("key"))
                red:set_keepalive(10000, 32)
                ngx.print(value)
            end)
            local srv = require("moonserve.server").create(app)
            local req = "GET /redis HTTP/1.1\r\nHost: t\r\n\r\n"
            local served = 0
            local function serve(n) -- 100 keep-alive requests a connection
                local deadline = socket.gettime() + 30
                local conn
                for i = 1, n do
                    if i % 100 == 1 then
                        if conn then conn:close() end
                        conn = srv:memconn()
                    end
                    local out = conn:feed(req)
                    while not out:find("value-0123456789", 1, true) do
                        assert(socket.gettime() < deadline, "no reply: " .. out)
                        core.run_once()
                        out = out .. conn:take()
                    end
                    served = served + 1
                end
                conn:close()
            end
            serve(10)
            -- Garbage of earlier specs with finalisers goes first: a finaliser that runs while
            -- a trace records aborts it, as every socket's did when it had one.
            collectgarbage()
            collectgarbage()
            local log = helper.jit_log(function() serve(3000) end)
            assert.equal(3010, served)
            assert.matches("TRACE +%d+ [^\n]*socket%.lua:", log)
            assert.matches("TRACE +%d+ [^\n]*dispatcher%.lua:", log)
            for line in log:gmatch("[^\n]+") do
                local start, reason = line:match("^%[TRACE %-%-%- ([^\n]-) %-%- ([^\n]-)%]$")
                local ours = start and not start:find("redis%.lua:") -- (the driver's are its own)
                if reason then
                    assert.is_falsy(reason:find("error thrown or hook called", 1, true), line)
                end
                if ours then
                    assert.is_falsy(reason:find("NYI: bytecode", 1, true), line)
                    -- the request's path is one trace: it fits the constants a server allows
                    -- (maxirconst), and returns from no built-in's tail call
                    assert.is_falsy(reason:find("trace too long", 1, true), line)
                    assert.is_falsy(reason:find("leaving loop in root trace at setmetatable", 1,
                        true), line)
                    assert.is_falsy(reason:find("leaving loop in root trace at ffi.string", 1,
                        true), line)
                end
            end
        end)

    -- A request's path is one trace whose IR constants pass LuaJIT's default maxirconst
    -- (500): a server raises it where it is made, or this trace aborts, "trace too long",
    -- and each request runs in the interpreter. bench/dispatch_bench.lua's `ngx` case (an
    -- app:ngx_content route answering with ngx.print, over the memory transport) in a
    -- process of its own, where no other spec's traces stand in the way.
    it("keeps an app:ngx_content route's request in one trace (the server's JIT limit)",
        function()
            local root = os.getenv("MOONSERVE_SRC") or "."
            local log = os.tmpname()
            helper.sh(string.format("cd '%s' && %s -jv='%s' bench/dispatch_bench.lua 3000 1 ngx "
                .. ">/dev/null", root, helper.tool("luajit"), log))
            local f = assert(io.open(log))
            local text = f:read("*a")
            f:close()
            os.remove(log)
            assert.matches("TRACE +%d+ [^\n]*dispatcher%.lua:", text)
            for line in text:gmatch("[^\n]+") do
                local reason = line:match("^%[TRACE %-%-%- [^\n]- %-%- ([^\n]-)%]$")
                if reason then
                    assert.is_falsy(reason:find("trace too long", 1, true), line)
                end
            end
        end)
end)
