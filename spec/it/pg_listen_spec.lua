-- spec/it/pg_listen_spec.lua: LISTEN/NOTIFY through moonserve.pg in an app served by two
-- workers (spec/fixtures/pg_listen.lua), against a throwaway PostgreSQL cluster.
local helper = require "helper"
local socket = require "socket"
local postgres = require "postgres"

describe("moonserve.pg notifications", function()
    local pg, srv
    local open = {}

    setup(function()
        pg = postgres.start()
        srv = helper.spawn_server { app = "spec/fixtures/pg_listen.lua", env = { PG_PORT = pg.port },
            bare = true, args = "--listen 127.0.0.1:0 --workers 2" }
    end)

    teardown(function()
        for s in pairs(open) do
            s.sock:close()
        end
        if srv then
            srv:stop()
        end
        if pg then
            pg.stop()
        end
    end)

    -- An event stream from GET `path`: st:expect(pattern, seconds) -> the captures of the
    -- first match in what came (consumed up to it), or nil.
    local function stream(path, port)
        local s = socket.tcp()
        s:settimeout(5)
        assert(s:connect("127.0.0.1", port or srv.port))
        assert(s:send("GET " .. path .. " HTTP/1.1\r\nHost: t\r\n\r\n"))
        local st = { sock = s, buf = "" }
        open[st] = true
        function st:expect(pattern, seconds)
            local deadline = socket.gettime() + (seconds or 5)
            while true do
                local from, to = self.buf:find(pattern)
                if from then
                    local caps = { self.buf:match(pattern) }
                    self.buf = self.buf:sub(to + 1)
                    return unpack(caps)
                end
                if socket.gettime() > deadline then
                    return nil
                end
                s:settimeout(0.1)
                local data, err, partial = s:receive(65536)
                self.buf = self.buf .. (data or partial or "")
                if err == "closed" then
                    return nil
                end
            end
        end
        function st:close()
            open[self] = nil
            s:close()
        end
        return st
    end

    -- Streams until every worker has one; returns them by worker ("0", "1") and the list.
    local function on_every_worker(path)
        local by, all = {}, {}
        for _ = 1, 30 do
            local st = stream(path)
            local w = st:expect("event: ready\ndata: (%d)\n")
            assert(w, "no ready event: " .. st.buf)
            all[#all + 1] = st
            by[w] = by[w] or st
            if by["0"] and by["1"] then
                return by, all
            end
        end
        error("the streams did not reach both workers")
    end

    local function close_all(list)
        for _, st in ipairs(list) do
            st:close()
        end
    end

    local function listeners()
        return tonumber(pg.psql("SELECT count(*) FROM pg_stat_activity WHERE usename = "
            .. "'scram_user' AND query LIKE 'LISTEN%'"))
    end

    it("delivers a NOTIFY from psql to a subscriber on every worker, over one connection each",
        function()
        local by, all = on_every_worker("/sse?ch=notes")
        pg.psql("NOTIFY notes, 'hello'")
        -- every stream got it, and the streams share one connection per worker
        for _, st in ipairs(all) do
            assert.equal("hello", st:expect("data: %d notes ([^\n]*)\n"), st.buf)
        end
        assert.truthy(by["0"] and by["1"])
        assert.equal(2, listeners())
        -- and the app's own notify, with a channel that needs quoting
        local weird = stream("/sse?ch=" .. "we%22ird%20ch")
        assert.truthy(weird:expect("event: ready"))
        local out = helper.curl("'http://127.0.0.1:" .. srv.port .. "/notify?ch=we%22ird%20ch"
            .. "&payload=x%27y'")
        assert.equal("true", out)
        assert.equal("x'y", weird:expect("data: %d we\"ird ch ([^\n]*)\n"))
        weird:close()
        close_all(all)
    end)

    it("holds no pooled connection: a query runs with a pool of one while streams wait",
        function()
        local _, all = on_every_worker("/sse?ch=busy")
        for _ = 1, 4 do
            all[#all + 1] = stream("/sse?ch=busy")
        end
        for _ = 1, 6 do
            assert.equal("7", helper.curl("http://127.0.0.1:" .. srv.port .. "/query"))
        end
        -- two listeners (one a worker) and at most one pooled connection a worker
        assert.equal(2, listeners())
        assert.is_true(pg.connections("scram_user") <= 4)
        close_all(all)
        -- the channel's last subscriber gone, the worker sends UNLISTEN
        assert.truthy(helper.wait_for(function()
            return pg.psql("SELECT count(*) FROM pg_stat_activity WHERE usename = 'scram_user' "
                .. "AND query LIKE 'UNLISTEN%'") == "2"
        end, 5))
    end)

    it("lets go of a subscription its handler dropped unclosed: collected, then UNLISTEN",
        function()
        -- (one process, so that every request reaches the worker that leaked)
        local one = helper.spawn_server { app = "spec/fixtures/pg_listen.lua",
            env = { PG_PORT = pg.port } }
        local base = "http://127.0.0.1:" .. one.port
        local ok, err = pcall(function()
            assert.equal("500", helper.curl("-o /dev/null -w '%{http_code}' " .. base .. "/leak"))
            assert.equal("true", helper.curl(base .. "/listening?ch=leaky"))
            assert.truthy(helper.wait_for(function()
                return helper.curl(base .. "/listening?ch=leaky") == "false"
            end, 5))
        end)
        one:stop()
        assert(ok, err)
    end)

    it("drops a slow reader's oldest notifications past its queue, and says how many", function()
        local st = stream("/sse?ch=slow&queue=3&slow=1.5")
        assert.truthy(st:expect("event: ready"))
        local sql = {}
        for i = 1, 10 do
            sql[#sql + 1] = "NOTIFY slow, 'm" .. i .. "';"
        end
        pg.psql(table.concat(sql, " "))
        assert.equal("7", st:expect("event: lost\ndata: (%d+)\n", 5), st.buf)
        for i = 8, 10 do
            assert.equal("m" .. i, st:expect("data: %d slow ([^\n]*)\n"), st.buf)
        end
        st:close()
    end)

    it("reconnects after the server restarts, listens again, and tells the subscribers",
        function()
        local by, all = on_every_worker("/sse?ch=again")
        pg.restart()
        for w, st in pairs(by) do
            assert.equal("nil", st:expect("event: lost\ndata: ([^\n]*)\n", 10), "worker " .. w
                .. ": " .. st.buf)
        end
        -- delivery resumes once the workers have listened again
        assert.truthy(helper.wait_for(function() return listeners() == 2 end, 10))
        pg.psql("NOTIFY again, 'back'")
        for w, st in pairs(by) do
            assert.equal("back", st:expect("data: " .. w .. " again ([^\n]*)\n", 5), st.buf)
        end
        local log = srv:log()
        assert.matches("pg: notifications: the connection to the server was lost", log)
        assert.matches("pg: notifications: connected again after [%d.]+ s; LISTEN again on 1 "
            .. "channel", log)
        close_all(all)
    end)

    it("works inside nginx (moonserve.openresty): the listener is a timer's", function()
        local ngx_srv = helper.with_env({ PG_PORT = pg.port }, function()
            return helper.nginx_app { app = "spec/fixtures/pg_listen.lua" }
        end)
        local ok, err = pcall(function()
            local a = stream("/sse?ch=inngx", ngx_srv.port)
            local b = stream("/sse?ch=inngx", ngx_srv.port)
            assert(a:expect("event: ready"), "not ready: " .. a.buf)
            assert.truthy(b:expect("event: ready"), b.buf)
            pg.psql("NOTIFY inngx, 'from psql'")
            assert.equal("from psql", a:expect("data: %d inngx ([^\n]*)\n"), a.buf)
            assert.equal("from psql", b:expect("data: %d inngx ([^\n]*)\n"), b.buf)
            assert.equal("7", helper.curl("http://127.0.0.1:" .. ngx_srv.port .. "/query"))
            a:close()
            b:close()
            socket.sleep(1.5) -- (idle: the listener's waits go on without a word)
        end)
        local log = ngx_srv.log()
        ngx_srv.stop()
        assert(ok, tostring(err) .. "\n" .. log)
        assert.not_matches("%[error%]", log) -- (an idle listener logs nothing)
    end)

    it("ends the subscriptions and the listener's task when the worker stops: a stop is quick",
        function()
        local _, all = on_every_worker("/sse?ch=last")
        local t0 = socket.gettime()
        local logfile = srv.logfile
        local stopped = srv:stop()
        assert.is_true(stopped, helper.read_file(logfile))
        srv = nil
        assert.is_true(socket.gettime() - t0 < 4)
        close_all(all)
    end)
end)
