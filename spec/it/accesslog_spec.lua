-- spec/it/accesslog_spec.lua: the access log, request ids and the error log's format, on a
-- real server with real clients (sockets, curl, nghttp).
local helper = require "helper"
local socket = require "socket"
local cjson = require "cjson"

local q, sh, read_file = helper.sh_quote, helper.sh, helper.read_file

local tmp
local function path(name)
    return tmp .. "/" .. name
end

-- The lines of `file` once `n` of them are there (the log writes within 100 ms).
local function lines_of(file, n, timeout)
    local deadline = socket.gettime() + (timeout or 5)
    local t
    repeat
        t = {}
        for l in read_file(file):gmatch("[^\n]+") do
            t[#t + 1] = l
        end
        if #t >= n then
            return t
        end
        socket.sleep(0.05)
    until socket.gettime() > deadline
    error("expected " .. n .. " lines in " .. file .. ", got " .. #t .. ":\n" .. read_file(file), 2)
end

local function wait_for(fn, what)
    for _ = 1, 100 do
        if fn() then
            return
        end
        socket.sleep(0.05)
    end
    error("timed out waiting for " .. what, 2)
end

local function get(port, target, fields)
    return helper.request(port, "GET " .. target .. " HTTP/1.1\r\nHost: t\r\n" .. (fields or "")
        .. "\r\n")
end

setup(function()
    tmp = helper.sh("mktemp -d"):gsub("%s+$", "")
    sh("mkdir -p " .. q(path("files")))
    helper.write_file(path("files/a.txt"), "static bytes\n")
    helper.tool("curl")
end)

teardown(function()
    sh("rm -rf " .. q(tmp))
end)

describe("the access log", function()
    local srv, log
    setup(function()
        log = path("combined.log")
        srv = helper.spawn_server { app = "spec/fixtures/logged.lua",
            args = "--access-log " .. q(log), env = { LOGGED_DIR = tmp } }
    end)
    teardown(function()
        assert.is_true(srv:stop())
    end)

    it("writes a combined line for a Lua route, a static file and a 404", function()
        assert.equal(200, get(srv.port, "/n/7", "Referer: http://r.test/\r\nUser-Agent: ua 1\r\n").status)
        assert.equal(200, get(srv.port, "/files/a.txt").status)
        assert.equal(404, get(srv.port, "/nothing?x=1").status)
        local lines = lines_of(log, 3)
        local pat = '^127%.0%.0%.1 %- %- %[(%d%d/%a%a%a/%d%d%d%d:%d%d:%d%d:%d%d [+-]%d%d%d%d)%] '
            .. '"([^"]*)" (%d+) (%d+) "([^"]*)" "([^"]*)"$'
        local t, req, status, bytes, ref, ua = lines[#lines - 2]:match(pat)
        assert.truthy(t, lines[#lines - 2])
        assert.same({ "GET /n/7 HTTP/1.1", "200", "3", "http://r.test/", "ua 1" },
            { req, status, bytes, ref, ua })
        t, req, status, bytes, ref, ua = lines[#lines - 1]:match(pat)
        assert.truthy(t, lines[#lines - 1])
        assert.same({ "GET /files/a.txt HTTP/1.1", "200", "13", "-", "-" },
            { req, status, bytes, ref, ua })
        t, req, status = lines[#lines]:match(pat)
        assert.truthy(t, lines[#lines])
        assert.same({ "GET /nothing?x=1 HTTP/1.1", "404" }, { req, status })
    end)

    it("escapes quotes, backslashes and bytes outside ASCII in a combined line", function()
        local before = #lines_of(log, 0)
        get(srv.port, "/hello", 'User-Agent: a"b\\c\255\r\n')
        local l = lines_of(log, before + 1)[before + 1]
        assert.truthy(l:find('"a\\x22b\\x5cc\\xff"$'), l)
    end)

    it("writes the line of an HTTP/2 request with its protocol", function()
        local before = #lines_of(log, 0)
        helper.curl("--http2-prior-knowledge -o /dev/null http://127.0.0.1:" .. srv.port .. "/hello")
        local l = lines_of(log, before + 1)[before + 1]
        assert.truthy(l:find('"GET /hello HTTP/2" 200 11 ', 1, true), l)
    end)

    it("reopens its file on USR1: after a rename, new lines go to a new file", function()
        get(srv.port, "/hello")
        lines_of(log, 1)
        socket.sleep(0.2)
        assert(os.rename(log, log .. ".1"))
        os.execute("kill -USR1 " .. srv.pid)
        socket.sleep(0.2)
        get(srv.port, "/n/after")
        local l = lines_of(log, 1)
        assert.equal(1, #l)
        assert.truthy(l[1]:find("GET /n/after", 1, true))
        assert.falsy(read_file(log .. ".1"):find("/n/after", 1, true))
    end)
end)

describe("the access log as JSON", function()
    local srv, log
    setup(function()
        log = path("json.log")
        srv = helper.spawn_server { app = "spec/fixtures/logged.lua",
            args = "--access-log " .. q(log) .. " --access-log-format json --limit body_bytes=10",
            env = { LOGGED_DIR = tmp } }
        helper.tool("nghttp")
    end)
    teardown(function()
        assert.is_true(srv:stop())
    end)

    local function last(n)
        local lines = lines_of(log, n)
        return cjson.decode(lines[n])
    end

    it("writes one object per line, every field named, escaped so cjson reads it", function()
        get(srv.port, "/n/3", 'User-Agent: q"\\\t\255é\r\nReferer: r\r\n')
        local o = last(1)
        assert.equal("GET", o.method)
        assert.equal("/n/3", o.target)
        assert.equal(200, o.status)
        assert.equal("127.0.0.1", o.client)
        assert.equal("HTTP/1.1", o.protocol)
        assert.equal("/n/:i", o.route)
        assert.equal("r", o.referer)
        assert.equal('q"\\\t\195\191é', o.user_agent) -- 0xff as U+00FF, é kept
        assert.equal(3, o.bytes_out)
        assert.is_true(o.bytes_in > 40)
        assert.equal(cjson.null, o.tls)
        assert.is_true(o.duration >= 0 and o.duration < 1000)
        assert.matches("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d%d%d[+-]%d%d:%d%d$", o.time)
        assert.matches("^%x+$", o.request_id)
        assert.equal(24, #o.request_id)
    end)

    it("logs the refusals the core answers, on HTTP/1.1 and HTTP/2", function()
        local n = #lines_of(log, 0)
        -- 400: a field line without a colon; 413: a declared body over body_bytes; 431: a
        -- head over head_bytes (32 KiB).
        assert.equal(400, get(srv.port, "/hello", "Bad Header\r\n").status)
        assert.equal(413, helper.request(srv.port,
            "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n").status)
        assert.equal(431, get(srv.port, "/hello", "X-Big: " .. ("b"):rep(40000) .. "\r\n").status)
        local base = "http://127.0.0.1:" .. srv.port
        helper.run(helper.tool("nghttp") .. " -H 'x-big: " .. ("b"):rep(40000) .. "' " .. base
            .. "/hello")
        helper.curl("--http2-prior-knowledge -o /dev/null -d 0123456789abcdef " .. base .. "/echo")
        local lines = lines_of(log, n + 5)
        local got = {}
        for i = n + 1, n + 5 do
            local o = cjson.decode(lines[i])
            got[#got + 1] = o.status .. " " .. o.protocol
        end
        table.sort(got)
        assert.same({ "400 HTTP/1.1", "413 HTTP/1.1", "413 HTTP/2", "431 HTTP/1.1", "431 HTTP/2" },
            got)
    end)

    it("logs a handler's 500 with the reference the page shows, which is the request id", function()
        local n = #lines_of(log, 0)
        local res = get(srv.port, "/error")
        assert.equal(500, res.status)
        local ref = res.body:match("reference: (%x+)")
        local o = cjson.decode(lines_of(log, n + 1)[n + 1])
        assert.equal(500, o.status)
        assert.equal(ref, o.request_id)
        local _, count = srv:log():gsub("%[" .. ref .. "%]", "")
        assert.equal(1, count, "the error is logged once")
    end)
end)

describe("an access log template", function()
    it("writes the named fields, and per-site logs go to their own file or nowhere", function()
        local log = path("tpl.log")
        local srv = helper.spawn_server { app = "spec/fixtures/logged.lua",
            args = "--access-log " .. q(log) .. " --access-log-format "
                .. q("$method|$target|$status|$route|$protocol|$duration|$tls|${request_id}$$"),
            env = { LOGGED_DIR = tmp } }
        get(srv.port, "/hello")
        helper.request(srv.port, "GET /mine HTTP/1.1\r\nHost: own.test\r\n\r\n")
        helper.request(srv.port, "GET /hush HTTP/1.1\r\nHost: quiet.test\r\n\r\n")
        get(srv.port, "/files/a.txt")
        lines_of(log, 2)
        socket.sleep(0.2)
        local lines = lines_of(log, 2)
        assert.equal(2, #lines, table.concat(lines, "\n"))
        assert.matches("^GET|/hello|200|hello|HTTP/1%.1|%d+%.%d%d%d|%-|%x+%$$", lines[1])
        assert.matches("^GET|/files/a%.txt|200|%-|HTTP/1%.1|", lines[2])
        assert.same({ "/mine 200" }, lines_of(path("own.log"), 1))
        assert.is_true(srv:stop())
    end)

    it("refuses an unknown field at start, naming it", function()
        local ok, err = pcall(helper.spawn_server, { app = "spec/fixtures/logged.lua",
            args = "--access-log " .. q(path("x.log")) .. " --access-log-format '$nope'" })
        assert.is_false(ok)
        assert.truthy(tostring(err):find("unknown field", 1, true), err)
    end)
end)

describe("request ids", function()
    it("are 24 hex digits, unique across 2 workers and a HUP", function()
        local srv = helper.spawn_server { app = "spec/fixtures/logged.lua", args = "--workers 2" }
        local seen, n = {}, 0
        local function take(count)
            for _ = 1, count do
                local res = get(srv.port, "/id")
                assert.equal(200, res.status)
                assert.matches("^%x+$", res.body)
                assert.equal(24, #res.body)
                assert.is_nil(seen[res.body], "id " .. res.body .. " seen twice")
                seen[res.body] = true
                n = n + 1
            end
        end
        take(40)
        local prefixes = {}
        for id in pairs(seen) do
            prefixes[id:sub(1, 16)] = true
        end
        assert.equal(2, select(2, next(prefixes)) and (function()
            local k = 0
            for _ in pairs(prefixes) do k = k + 1 end
            return k
        end)(), "two workers, two prefixes")
        os.execute("kill -HUP " .. srv.pid)
        socket.sleep(1)
        take(40)
        assert.equal(80, n)
        assert.is_true(srv:stop())
    end)

    it("are a trusted proxy's X-Request-Id, and only a trusted proxy's", function()
        local srv = helper.spawn_server { app = "spec/fixtures/logged.lua",
            args = "--trusted-proxy 127.0.0.1 --request-id-header" }
        local other = helper.spawn_server { app = "spec/fixtures/logged.lua" }
        local res = get(srv.port, "/id", "X-Request-Id: abc-123.def\r\n")
        assert.equal("abc-123.def", res.body)
        assert.equal("abc-123.def", res.headers["x-request-id"])
        res = get(srv.port, "/id", "X-Request-Id: bad id\r\n")
        assert.matches("^%x+$", res.body)
        res = get(srv.port, "/id", "X-Request-Id: " .. ("a"):rep(65) .. "\r\n")
        assert.equal(24, #res.body)
        res = get(other.port, "/id", "X-Request-Id: abc-123.def\r\n")
        assert.equal(24, #res.body)
        assert.is_nil(res.headers["x-request-id"], "the header is opt-in")
        assert.is_true(srv:stop())
        assert.is_true(other:stop())
    end)
end)

describe("an access log on a full disk", function()
    it("drops lines, says so once, keeps serving, and says how many when it writes again",
        function()
            local mnt = path("tiny")
            sh("mkdir -p " .. q(mnt) .. " && " .. helper.tool("mount") .. " -t tmpfs -o size=64k tmpfs "
                .. q(mnt))
            local ok, err = pcall(function()
                helper.run("dd if=/dev/zero of=" .. q(mnt .. "/fill") .. " bs=4k 2>/dev/null")
                local errlog = path("full-err.log")
                local srv = helper.spawn_server { app = "spec/fixtures/logged.lua",
                    args = "--access-log " .. q(mnt .. "/access.log") .. " --log " .. q(errlog),
                    log = errlog }
                for _ = 1, 30 do
                    assert.equal(200, get(srv.port, "/hello").status)
                    socket.sleep(0.01)
                end
                wait_for(function() return srv:log():find("lines are dropped", 1, true) end,
                    "the drop to be logged")
                socket.sleep(0.3)
                local _, told = srv:log():gsub("lines are dropped", "")
                assert.equal(1, told, srv:log())
                os.remove(mnt .. "/fill")
                get(srv.port, "/n/again")
                wait_for(function() return srv:log():find("writing again", 1, true) end,
                    "writing to resume")
                local dropped = tonumber(srv:log():match("writing again; (%d+) lines were dropped"))
                assert.is_true(dropped >= 30, srv:log())
                assert.truthy(lines_of(mnt .. "/access.log", 1)[1]:find("/n/again", 1, true))
                assert.is_true(srv:stop())
            end)
            os.execute(helper.tool("umount") .. " " .. q(mnt))
            assert(ok, err)
        end)
end)

describe("the error log", function()
    -- A server whose log may not say where it listens (--log-level warn): on a port found free.
    local function spawn_on_port(args)
        local probe = assert(socket.bind("127.0.0.1", 0))
        local _, port = probe:getsockname()
        probe:close()
        local log = os.tmpname()
        local pid = helper.run(string.format("%s spec/fixtures/logged.lua --workers 0 --listen "
            .. "127.0.0.1:%d %s >%s 2>&1 & echo $!", q(helper.root .. "/lua/bin/moonserve"), port,
            args, q(log))):match("%d+")
        wait_for(function()
            local c = socket.connect("127.0.0.1", port)
            if c then c:close() end
            return c ~= nil
        end, "the server to listen")
        return { port = tonumber(port), pid = pid, log = function() return read_file(log) end,
            stop = function()
                os.execute("kill -TERM " .. pid)
                wait_for(function() return os.execute("kill -0 " .. pid .. " 2>/dev/null") ~= 0 end,
                    "the server to stop")
                os.remove(log)
                return true
            end }
    end

    it("stamps every line with an ISO 8601 time and a level name, filtered by --log-level",
        function()
            local srv = spawn_on_port("--log-level warn")
            get(srv.port, "/say")
            wait_for(function() return srv:log():find("error line nil", 1, true) end, "the lines")
            local text = srv:log()
            for l in text:gmatch("[^\n]+") do
                if not l:find("^%s") and not l:find("^stack") then
                    assert.matches("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d%d%d[+-]%d%d:%d%d "
                        .. "moonserve%[%d+%] %a+: ", l)
                end
            end
            assert.truthy(text:find("warn: warn line true", 1, true), text)
            assert.truthy(text:find("error: error line nil", 1, true), text)
            assert.falsy(text:find("info line", 1, true), text)
            assert.falsy(text:find("debug line", 1, true), text)
            assert.is_true(srv:stop())
        end)

    it("writes a message as one text line: control bytes and the backslash escaped",
        function()
            local srv = helper.spawn_server { app = "spec/fixtures/logged.lua" }
            -- a forged line, a bare CR, a NUL, an escape, a tab, a backslash and UTF-8
            get(srv.port, "/forge?m=a%0A2000-01-01T00:00:00.000%2B00:00%20moonserve%5B1%5D%20"
                .. "error:%20forged%0Db%00c%1B%5B2Jd%09e%5Cx0a%C3%A9")
            wait_for(function() return srv:log():find("asked for", 1, true) end, "the line")
            local text = srv:log()
            local line = text:match("[^\n]*asked for [^\n]*")
            assert.truthy(line, text)
            assert.equal("asked for a\\n2000-01-01T00:00:00.000+00:00 moonserve[1] error: forged"
                .. "\\rb\\x00c\\x1b[2Jd\\te\\\\x0a\195\169", line:match("asked for .*$"))
            for l in text:gmatch("[^\n]+") do
                assert.falsy(l:find("forged", 1, true) and not l:find("asked for", 1, true), l)
            end
            assert.is_true(srv:stop())
        end)

    it("writes JSON lines with --log-format json, and debug lines at --log-level debug",
        function()
            local srv = helper.spawn_server { app = "spec/fixtures/logged.lua",
                args = "--log-format json --log-level debug" }
            get(srv.port, "/say")
            get(srv.port, "/error")
            wait_for(function() return srv:log():find("boom in handler", 1, true) end, "the lines")
            local levels = {}
            for l in srv:log():gmatch("[^\n]+") do
                local o = cjson.decode(l)
                assert.matches("^%d%d%d%d%-%d%d%-%d%dT", o.time)
                assert.equal("number", type(o.pid))
                levels[o.msg:match("^(%a+) line") or o.msg] = o.level
                if o.msg:find("boom", 1, true) then
                    assert.truthy(o.msg:find("stack traceback:\n", 1, true))
                end
            end
            assert.equal("debug", levels.debug)
            assert.equal("info", levels.info)
            assert.equal("warn", levels.warn)
            assert.equal("error", levels.error)
            assert.is_true(srv:stop())
        end)

    it("refuses a level it does not know", function()
        local out = helper.run(q(helper.root .. "/lua/bin/moonserve")
            .. " spec/fixtures/logged.lua --log-level loud 2>&1")
        assert.truthy(out:find("--log-level needs debug, info, warn or error", 1, true), out)
    end)
end)
