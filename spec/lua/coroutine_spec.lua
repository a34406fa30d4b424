-- Waits inside the handler's own coroutines and pcall, the early end, and plain coroutine
-- semantics, through the real engine and dispatch, in-process.
describe("moonserve.host.core.coroutine", function()
    local moonserve = require "moonserve"
    local helper = require "helper"
    local server = require "moonserve.server"
    local core = require("moonserve.base").core

    -- Runs the loop for `seconds` on `conn`, collecting what it writes.
    local function pump(conn, out, seconds)
        local deadline = core.now() + seconds
        repeat
            core.run_once()
            out[#out + 1] = (conn:take())
        until core.now() >= deadline
    end

    -- Sends the raw request in pieces, running the loop `gap` seconds after each; returns
    -- the body of the reply (Content-Length framed) and its status.
    local function in_pieces(app, pieces, gap)
        local srv = server.create(app)
        local conn = srv:memconn()
        local out = {}
        for _, p in ipairs(pieces) do
            out[#out + 1] = (conn:feed(p))
            pump(conn, out, gap)
        end
        conn:close()
        local raw = table.concat(out)
        return raw:match("\r\n\r\n(.*)$"), tonumber(raw:match("^HTTP/1%.1 (%d+)"))
    end

    local function get(app, path, wait)
        local status, _, body = helper.simulate(app, "GET", path, { wait = wait or 0.15 })
        return body, status
    end

    describe("a wait", function()
        it("works inside a coroutine.wrap iterator of the handler", function()
            local app = moonserve.app()
            app:get("/", function(_, res)
                local out = {}
                local t0 = core.now()
                for v in coroutine.wrap(function()
                    for i = 1, 3 do
                        assert(moonserve.sleep(0.01) == true)
                        coroutine.yield(i)
                    end
                end) do
                    out[#out + 1] = tostring(v)
                end
                res:send(table.concat(out, ",") .. (core.now() - t0 >= 0.025 and " slept" or " early"))
            end)
            assert.equal("1,2,3 slept", get(app, "/"))
        end)

        it("works in coroutines nested three deep, each yielding to its own resumer", function()
            local app = moonserve.app()
            app:get("/", function(_, res)
                local inner = coroutine.wrap(function(a)
                    moonserve.sleep(0.005)
                    local b = coroutine.yield(a + 1)
                    moonserve.sleep(0.005)
                    return b * 2
                end)
                local middle = coroutine.create(function(x)
                    local y = inner(x)          -- 2
                    moonserve.sleep(0.005)
                    local z = coroutine.yield("m" .. y)
                    return inner(z) + 1         -- 21
                end)
                local _, first = coroutine.resume(middle, 1)
                local ok, last = coroutine.resume(middle, 10)
                res:send(table.concat({ first, tostring(ok), tostring(last),
                    coroutine.status(middle) }, " "))
            end)
            assert.equal("m2 true 21 dead", get(app, "/"))
        end)

        it("gives a user coroutine's yields to its resumer, and the resume's values to the yield", function()
            local app = moonserve.app()
            app:get("/", function(_, res)
                local co = coroutine.create(function(...)
                    local got = { ... }
                    moonserve.sleep(0.005)
                    local a, b, c = coroutine.yield(1, nil, "three")
                    got[#got + 1] = table.concat({ tostring(a), tostring(b), tostring(c) }, "+")
                    moonserve.sleep(0.005)
                    return table.concat(got, ",")
                end)
                local function pack(...) return { n = select("#", ...), ... } end
                local r1 = pack(coroutine.resume(co, "x", "y"))
                local r2 = pack(coroutine.resume(co, "p", nil, "q"))
                res:send(table.concat({ r1.n .. " values",
                    tostring(r1[1]), tostring(r1[2]), tostring(r1[3]), tostring(r1[4]),
                    tostring(r2[2]) }, " "))
            end)
            assert.equal("4 values true 1 nil three x,y,p+nil+q", get(app, "/"))
        end)

        it("works inside pcall and xpcall, in the handler and in its coroutines", function()
            local app = moonserve.app()
            app:get("/", function(_, res)
                local a = { pcall(moonserve.sleep, 0.005) }
                local b = { xpcall(function() return moonserve.sleep(0.005), "after" end,
                    debug.traceback) }
                local c = coroutine.wrap(function()
                    return pcall(function()
                        moonserve.sleep(0.005)
                        error("late", 0)
                    end)
                end)
                local ok, err = c()
                res:send(table.concat({ tostring(a[1]), tostring(a[2]), tostring(b[1]),
                    tostring(b[2]), tostring(b[3]), tostring(ok), err }, " "))
            end)
            assert.equal("true true true true after false late", get(app, "/"))
        end)

        it("reads the body in a nested coroutine while the body arrives later", function()
            local app = moonserve.app()
            app:post("/", function(req, res)
                local outer = coroutine.wrap(function()
                    local inner = coroutine.wrap(function()
                        coroutine.yield("ready")
                        return req:body()
                    end)
                    local first = inner()
                    return first .. ":" .. inner()
                end)
                res:send(outer())
            end)
            local head = "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n"
            local body, status = in_pieces(app, { head, "hello", "world" }, 0.02)
            assert.equal(200, status)
            assert.equal("ready:helloworld", body)
        end)

        it("keeps the whole chain busy: another request cannot resume a waiting coroutine", function()
            local app = moonserve.app()
            local shared
            app:get("/wait", function(_, res)
                shared = coroutine.create(function()
                    moonserve.sleep(0.05)
                    return "woke"
                end)
                local _, v = coroutine.resume(shared)
                res:send(v)
            end)
            app:get("/poke", function(_, res)
                local st = coroutine.status(shared)
                local ok, err = coroutine.resume(shared)
                res:send(st .. " " .. tostring(ok) .. " " .. err)
            end)
            local srv = server.create(app)
            local a, b = srv:memconn(), srv:memconn()
            local out_a = { (a:feed("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")) }
            local poke = b:feed("GET /poke HTTP/1.1\r\nHost: t\r\n\r\n")
            pump(a, out_a, 0.15)
            a:close()
            b:close()
            assert.matches("\r\n\r\nnormal false cannot resume non%-suspended coroutine$", poke)
            assert.matches("\r\n\r\nwoke$", table.concat(out_a))
        end)

        it("lets a coroutine.yield in the handler itself serve others and go on", function()
            local app = moonserve.app()
            app:get("/", function(_, res)
                local got = { coroutine.yield("dropped") }
                res:send("went on with " .. #got)
            end)
            local body, status = get(app, "/")
            assert.equal(200, status)
            assert.equal("went on with 0", body)
        end)
    end)

    describe("a wait where LuaJIT cannot yield", function()
        local C_CALL = "inside a C call (string.gsub callback, table.sort comparator, FFI "
            .. "callback or require)"

        local function caught(fn)
            local app = moonserve.app()
            app:post("/", function(req, res)
                local ok, err = pcall(fn, req, res)
                res:send(ok and "no error" or tostring(err))
            end)
            local head = "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n"
            local body = in_pieces(app, { head, "ok" }, 0.02)
            return body
        end

        it("raises a clear error in a string.gsub callback", function()
            local err = caught(function()
                string.gsub("a", "a", function() moonserve.sleep(0.01) end)
            end)
            assert.truthy(err:find("moonserve.sleep: cannot wait here: " .. C_CALL, 1, true), err)
        end)

        it("raises a clear error in a table.sort comparator, for the body too", function()
            local err = caught(function(req)
                table.sort({ 3, 1, 2 }, function(x, y)
                    req:body()
                    return x < y
                end)
            end)
            assert.truthy(err:find("req:body: cannot wait here: " .. C_CALL, 1, true), err)
        end)

        it("raises a clear error in a coroutine resumed from a gsub callback", function()
            local err = caught(function()
                local co = coroutine.wrap(function() moonserve.sleep(0.01) end)
                string.gsub("a", "a", function() co() end)
            end)
            assert.truthy(err:find("moonserve.sleep: cannot wait here: " .. C_CALL, 1, true), err)
        end)

        it("raises a clear error in an FFI callback and in a module's top level", function()
            local ffi = require "ffi"
            local err = caught(function()
                local cb = ffi.cast("int (*)(int)", function(x)
                    moonserve.sleep(0.01)
                    return x
                end)
                local _, e = pcall(cb, 1)
                cb:free()
                error(e, 0)
            end)
            assert.truthy(err:find("cannot wait here: " .. C_CALL, 1, true), err)
            package.preload["spec_sleeps_at_load"] = function() moonserve.sleep(0.01) end
            err = caught(function() require "spec_sleeps_at_load" end)
            package.preload["spec_sleeps_at_load"] = nil
            assert.truthy(err:find("moonserve.sleep: cannot wait here: " .. C_CALL, 1, true), err)
        end)

        it("leaves nothing armed: the handler can wait afterwards", function()
            local app = moonserve.app()
            app:get("/", function(_, res)
                local ok = pcall(string.gsub, "a", "a", function() moonserve.sleep(0.01) end)
                res:send(tostring(ok) .. " " .. tostring(moonserve.sleep(0.01)))
            end)
            assert.equal("false true", get(app, "/"))
        end)

        it("refuses a coroutine resumed by a resume kept from before moonserve loaded", function()
            local raw_resume = require("moonserve.host.core.coroutine").raw.resume
            local err = caught(function()
                local co = coroutine.create(function() return moonserve.sleep(0.01) end)
                local _, e = raw_resume(co)
                error(e, 0)
            end)
            assert.truthy(err:find("moonserve.sleep: cannot wait here: in a coroutine resumed "
                .. "by something other than coroutine.resume or coroutine.wrap", 1, true), err)
        end)
    end)

    describe("an error inside the handler's coroutines", function()
        it("surfaces with its message, after a wait, through resume and wrap", function()
            local app = moonserve.app()
            app:get("/", function(_, res)
                local co = coroutine.create(function()
                    moonserve.sleep(0.005)
                    error("boom")
                end)
                local ok, err = coroutine.resume(co)
                local tb = debug.traceback(co)
                local w = coroutine.wrap(function()
                    moonserve.sleep(0.005)
                    error({ code = 7 })
                end)
                local ok2, obj = pcall(w)
                res:send(table.concat({ tostring(ok), err, coroutine.status(co),
                    tostring(tb:find("stack traceback", 1, true) ~= nil), tostring(ok2),
                    tostring(obj.code) }, "|"))
            end)
            local body = get(app, "/")
            assert.matches("^false|[^|]*coroutine_spec.lua:%d+: boom|dead|true|false|7$", body)
        end)

        it("gives xpcall's traceback through a wrap that failed after a wait", function()
            local app = moonserve.app()
            app:get("/", function(_, res)
                local w = coroutine.wrap(function()
                    moonserve.sleep(0.005)
                    error("in the iterator")
                end)
                local ok, tb = xpcall(w, debug.traceback)
                res:send(tostring(ok) .. "\n" .. tb)
            end)
            local body = get(app, "/")
            assert.matches("^false\n[^\n]*coroutine_spec.lua:%d+: in the iterator\nstack traceback:", body)
        end)

        it("becomes a 500 with the message logged when nobody catches it", function()
            local app = moonserve.app()
            local seen
            app:on_error(function(_, res, err)
                seen = err
                res:status(500):send("caught")
            end)
            app:get("/", function()
                local w = coroutine.wrap(function()
                    moonserve.sleep(0.005)
                    error("deep trouble")
                end)
                w()
            end)
            local body, status = get(app, "/")
            assert.equal(500, status)
            assert.equal("caught", body)
            assert.matches("coroutine_spec.lua:%d+: [^\n]*coroutine_spec.lua:%d+: deep trouble", seen)
        end)
    end)

    describe("the early end", function()
        it("passes through pcall and a user coroutine: the reply goes out, nothing after runs", function()
            local app = moonserve.app()
            local ran = {}
            local stale
            app:get("/end", function(req, res)
                stale = req
                local co = coroutine.wrap(function()
                    local ok = pcall(function()
                        moonserve.sleep(0.005)
                        res:status(202):send("ended")
                        server.exit()
                        ran[#ran + 1] = "after exit"
                    end)
                    ran[#ran + 1] = "after pcall " .. tostring(ok)
                end)
                xpcall(co, debug.traceback)
                ran[#ran + 1] = "after the coroutine"
                res:send("not this")
            end)
            app:get("/next", function(_, res) res:send("next") end)
            local body, status = get(app, "/end")
            assert.equal(202, status)
            assert.equal("ended", body)
            assert.same({}, ran)
            assert.has_error(function() return stale:header("host") end,
                "request is finished: its fields can no longer be read")
            assert.equal("next", (get(app, "/next", 0)))
        end)

        it("sends an empty 200 when nothing was sent", function()
            local app = moonserve.app()
            app:get("/", function(_, res)
                res:header("x-before", "yes")
                pcall(server.exit)
                res:send("not this")
            end)
            local status, headers, body = helper.simulate(app, "GET", "/")
            assert.equal(200, status)
            assert.equal("yes", headers["x-before"])
            assert.equal("", body)
        end)

        it("cannot be called where LuaJIT cannot yield", function()
            local app = moonserve.app()
            app:get("/", function(_, res)
                local ok, err = pcall(string.gsub, "a", "a", function() server.exit() end)
                res:send(tostring(ok) .. " " .. err)
            end)
            local body = get(app, "/")
            assert.truthy(body:find("false .*moonserve.exit: cannot end the handler here: inside a C call"),
                body)
        end)
    end)

    describe("plain coroutine semantics", function()
        -- The same checks outside a handler and inside one.
        local function semantics()
            local out = {}
            local function say(x) out[#out + 1] = tostring(x) end
            local co
            co = coroutine.create(function(a)
                say(coroutine.status(co))             -- running
                say(coroutine.running() == co)
                say(coroutine.isyieldable())
                local inner = coroutine.create(function()
                    say(coroutine.status(co))         -- normal
                    coroutine.yield()
                end)
                coroutine.resume(inner)
                say(coroutine.status(inner))          -- suspended
                return coroutine.yield(a * 2)
            end)
            say(coroutine.status(co))                 -- suspended
            say(select(2, coroutine.resume(co, 21)))  -- 42
            say(select(2, coroutine.resume(co, "back")))
            say(coroutine.status(co))                 -- dead
            say(select(2, coroutine.resume(co)))
            local _, e = pcall(("a").gsub, "a", "a", function() coroutine.yield() end)
            say(e:match("attempt to yield across C%-call boundary"))
            -- an error's message, its positions in this file written as "L: "
            local function raised(fn)
                local _, err = pcall(fn)
                return (err:gsub("[^:]*coroutine_spec.lua:%d+: ", "L: "))
            end
            local w = coroutine.wrap(function() error("wrapped") end)
            say(raised(function() w() end))
            say(raised(function() w() end))
            local t = coroutine.wrap(function() error({ "table" }) end)
            say(select(2, pcall(t))[1])
            say(raised(function() coroutine.resume(1) end))
            say(raised(function() coroutine.wrap(1) end))
            say(raised(function() coroutine.status({}) end))
            return table.concat(out, "\n")
        end
        local EXPECTED = table.concat({ "suspended", "running", "true", "true", "normal",
            "suspended", "42", "back", "dead", "cannot resume dead coroutine",
            "attempt to yield across C-call boundary", "L: L: wrapped",
            "L: cannot resume dead coroutine", "table",
            "L: bad argument #1 to 'resume' (coroutine expected)",
            "L: bad argument #1 to 'wrap' (function expected, got number)",
            "L: bad argument #1 to 'status' (coroutine expected)" }, "\n")

        it("holds outside a handler", function()
            assert.equal(EXPECTED, semantics())
            assert.is_false(coroutine.isyieldable())
            assert.has_error(function() coroutine.yield() end)
            assert.has_error(function() moonserve.sleep(0) end, "moonserve.sleep: not inside a handler")
        end)

        it("holds inside a handler", function()
            local app = moonserve.app()
            app:get("/", function(_, res)
                local ok, out = pcall(semantics)
                res:send(ok and out or "error: " .. tostring(out))
            end)
            assert.equal(EXPECTED, get(app, "/", 0))
        end)

        it("is LuaJIT's own", function()
            local raw = require("moonserve.host.core.coroutine").raw
            local mine = { resume = coroutine.resume, yield = coroutine.yield,
                status = coroutine.status, wrap = coroutine.wrap }
            -- luacheck: push ignore 122 (LuaJIT's own put back for the run, then moonserve's)
            coroutine.resume, coroutine.yield = raw.resume, raw.yield
            coroutine.status, coroutine.wrap = raw.status, raw.wrap
            local ok, out = pcall(semantics)
            coroutine.resume, coroutine.yield = mine.resume, mine.yield
            coroutine.status, coroutine.wrap = mine.status, mine.wrap
            -- luacheck: pop
            assert.is_true(ok, out)
            assert.equal(EXPECTED, out)
        end)
    end)
end)
