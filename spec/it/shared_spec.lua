-- spec/it/shared_spec.lua: dictionaries shared by the workers of a real server.
local helper = require "helper"
local socket = require "socket"

local children, wait_for = helper.children, helper.wait_for

local function get(port, path)
    return helper.request(port, "GET " .. path .. " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
end

-- As get(), but nil when no answer comes within a second (a request that met the worker
-- busy writing without end).
local function try_get(port, path)
    local s = socket.tcp()
    s:settimeout(1)
    if not s:connect("127.0.0.1", port) then
        return nil
    end
    s:send("GET " .. path .. " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    local res = helper.read_response(s)
    s:close()
    return res
end

-- `n` connections at once, each asking `path`; returns the bodies.
local function at_once(port, path, n)
    local conns, bodies = {}, {}
    for i = 1, n do
        conns[i] = helper.connect(port, 60)
        assert(conns[i]:send("GET " .. path .. " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"))
    end
    for i = 1, n do
        local res = helper.read_response(conns[i])
        assert.equal(200, res.status, res.body)
        bodies[i] = res.body
        conns[i]:close()
    end
    return bodies
end

describe("moonserve.shared with workers", function()
    for _, workers in ipairs({ 2, 4 }) do
        it(workers .. " workers incrementing one key 100,000 times in all end at the total", function()
            local srv = helper.spawn_server { app = "spec/fixtures/shared.lua",
                args = "--workers " .. workers }
            finally(function() srv:stop() end)
            assert.is_true(wait_for(function() return #children(srv.pid) == workers end))
            -- Rounds of `workers` requests at once, until every worker took part.
            local per, total, pids = 5000, 0, {}
            local distinct = 0
            while total < 100000 do
                for _, pid in ipairs(at_once(srv.port, "/incr?n=" .. per, workers)) do
                    if not pids[pid] then
                        pids[pid] = true
                        distinct = distinct + 1
                    end
                end
                total = total + per * workers
            end
            assert.equal(100000, total)
            assert.equal("100000", get(srv.port, "/get").body)
            assert.is_true(distinct >= 2, "the increments came from one worker only")
        end)
    end

    it("keeps its values across a reload, and refuses a reload that changes its size", function()
        local size_file = os.tmpname()
        helper.write_file(size_file, "1m\n")
        local srv = helper.spawn_server { app = "spec/fixtures/shared.lua",
            args = "--workers 2", env = { SHARED_SIZE_FILE = size_file } }
        finally(function() srv:stop() os.remove(size_file) end)
        assert.is_true(wait_for(function() return #children(srv.pid) == 2 end))
        assert.equal(200, get(srv.port, "/set?k=kept&v=across").status)
        local before = children(srv.pid)
        os.execute("kill -HUP " .. srv.pid)
        assert.is_true(wait_for(function()
            local now = children(srv.pid)
            return #now == 2 and now[1] ~= before[1] and now[1] ~= before[2]
        end))
        for _ = 1, 10 do
            assert.equal("across", get(srv.port, "/get?k=kept").body)
        end
        -- Another size: the new workers refuse to start, the old ones go on serving.
        helper.write_file(size_file, "2m\n")
        before = children(srv.pid)
        os.execute("kill -HUP " .. srv.pid)
        assert.is_true(wait_for(function()
            return srv:log():find("shared dictionary 'counters' was made with 1048576 " ..
                "bytes; the app now declares 2097152", 1, true) ~= nil
        end))
        socket.sleep(0.5)
        assert.same(before, children(srv.pid))
        assert.equal("across", get(srv.port, "/get?k=kept").body)
    end)

    it("makes only the dictionaries declared at the start: a reload that declares another "
        .. "fails, and the old workers serve on", function()
        local more_file = os.tmpname()
        helper.write_file(more_file, "added\n")
        local srv = helper.spawn_server { app = "spec/fixtures/shared.lua",
            args = "--workers 2", env = { SHARED_MORE_FILE = more_file } }
        finally(function() srv:stop() os.remove(more_file) end)
        assert.is_true(wait_for(function() return #children(srv.pid) == 2 end))
        assert.equal(200, get(srv.port, "/set?d=added&k=a&v=new").status)
        local function reload()
            local before = children(srv.pid)
            os.execute("kill -HUP " .. srv.pid)
            assert.is_true(wait_for(function()
                local now = children(srv.pid)
                return #now == 2 and now[1] ~= before[1] and now[1] ~= before[2] and
                    now[2] ~= before[1] and now[2] ~= before[2]
            end))
        end
        -- Dropped from the app, then declared again: the master kept it, values and all.
        helper.write_file(more_file, "\n")
        reload()
        assert.equal(404, get(srv.port, "/get?d=added&k=a").status)
        helper.write_file(more_file, "added\n")
        reload()
        assert.equal("new", get(srv.port, "/get?d=added&k=a").body)
        -- A name the start did not declare: the reload fails, with one line.
        helper.write_file(more_file, "other\n")
        local before = children(srv.pid)
        os.execute("kill -HUP " .. srv.pid)
        assert.is_true(wait_for(function()
            return srv:log():find("reload failed", 1, true) ~= nil
        end), srv:log())
        local _, lines = srv:log():gsub("shared dictionary 'other' was not declared when the "
            .. "server started %(a new dictionary needs a restart%)[^\n]*reload failed", "")
        assert.equal(1, lines, srv:log())
        socket.sleep(0.3)
        assert.same(before, children(srv.pid))
        assert.equal("new", get(srv.port, "/get?d=added&k=a").body)
    end)

    it("refuses a worker's ask for a zone the app never declared (no 1 GiB zones on demand)",
        function()
        local srv = helper.spawn_server { app = "spec/fixtures/worker_attack.lua",
            args = "--workers 1" }
        finally(function() srv:stop() end)
        assert.is_true(wait_for(function() return #children(srv.pid) == 1 end))
        local res = get(srv.port, "/zones")
        assert.equal("0 made; shared dictionary 'flood4' was not declared when the server "
            .. "started (a new dictionary needs a restart)", res.body)
        assert.is_nil(srv:log():find("shared dictionary 'flood", 1, true), srv:log())
    end)

    it("stays usable when a worker is killed in the middle of its writes", function()
        local srv = helper.spawn_server { app = "spec/fixtures/shared.lua", args = "--workers 2" }
        finally(function() -- (a worker left writing without end would not stop)
            os.execute("kill -STOP " .. srv.pid)
            for _, pid in ipairs(children(srv.pid)) do
                os.execute("kill -9 " .. pid)
            end
            os.execute("kill -9 " .. srv.pid .. "; kill -CONT " .. srv.pid)
        end)
        assert.is_true(wait_for(function() return #children(srv.pid) == 2 end))
        for _ = 1, 5 do
            local s = helper.connect(srv.port)
            assert(s:send("GET /hammer HTTP/1.1\r\nHost: t\r\n\r\n"))
            local pid
            assert.is_true(wait_for(function()
                local res = try_get(srv.port, "/get?k=hammer")
                pid = res and res.body ~= "nil" and res.body or nil
                return pid ~= nil
            end))
            socket.sleep(0.1)
            os.execute("kill -9 " .. pid)
            s:close()
            assert.is_true(wait_for(function()
                local now = children(srv.pid)
                return #now == 2 and now[1] ~= pid and now[2] ~= pid
            end))
            -- Every worker still reads and writes it (one killed in the middle of a change
            -- leaves it flushed, with one log line; one killed between changes, as it was).
            for _ = 1, 10 do
                assert.equal(200, get(srv.port, "/del?k=hammer").status)
                assert.equal(200, get(srv.port, "/incr?n=10").status)
                assert.matches("^%d+$", get(srv.port, "/get?k=n").body)
            end
        end
    end)
end)
