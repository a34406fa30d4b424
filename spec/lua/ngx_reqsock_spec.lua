-- spec/lua/ngx_reqsock_spec.lua: ngx.req.socket's reader (moonserve/ngx/reqsock.lua) in
-- memory: its receiveuntil pieces through the core's matcher, and on trace.
-- luacheck: globals ngx (OpenResty's global, which moonserve.ngx installs)
local helper = require "helper"

describe("moonserve.ngx.reqsock", function()
    local moonserve = require "moonserve"
    require "moonserve.ngx"

    -- Serves `fn` on POST / with `body`; returns the reply's body.
    local function serve(body, fn)
        local app = moonserve.app()
        app:ngx_content("/", fn)
        local status, _, out = helper.simulate(app, "POST", "/", { body = body })
        assert.equal(200, status)
        return out
    end

    it("reads a body up to a pattern in sized pieces, the last one short, then nil", function()
        local out = serve("abcdefg\r\n--bhij", function()
            local sock = assert(ngx.req.socket())
            local it = sock:receiveuntil("\r\n--b")
            for _ = 1, 4 do
                ngx.say(tostring((it(3))))
            end
            ngx.say(sock:receive(3))
        end)
        assert.equal("abc\ndef\ng\nnil\nhij\n", out)
    end)

    it("keeps a loop over a sized receiveuntil's pieces on trace", function()
        local log, n
        local out = serve(("x"):rep(20000) .. "\r\n--b" .. "tail", function()
            local sock = assert(ngx.req.socket())
            -- (Made before the log: making the iterator makes a closure, which LuaJIT does
            -- not compile, and a trace may start at the logged function's entry when its
            -- hot counter is one a hot loop shares.)
            local it = sock:receiveuntil("\r\n--b")
            log = helper.jit_log(function()
                n = 0
                while true do
                    local data = it(16)
                    if not data then
                        break
                    end
                    n = n + #data
                end
            end)
            ngx.say(n)
        end)
        assert.equal("20000\n", out)
        assert.matches("TRACE%s+%d+ ", log)
        assert.not_matches("NYI", log)
        -- (Where traces start depends on the hot counters, hashed by address: the caller's
        -- loop, or the iterator's returns into it. A trace may give up once on the
        -- iterator's inner loop, when the iteration it records is one that waits for more
        -- bytes; what matters is that nothing in the way is not compiled, and that the
        -- caller's loop is not given up on: at most one abort there, for that loop.)
        local aborts = {}
        for why in log:gmatch("%-%-%- ngx_reqsock_spec%.lua:%d+ %-%- ([^\n]*)") do
            aborts[#aborts + 1] = why
        end
        assert.is_true(#aborts <= 1, log)
        if aborts[1] then
            assert.matches("^inner loop in root trace at reqsock%.lua", aborts[1])
        end
    end)
end)
