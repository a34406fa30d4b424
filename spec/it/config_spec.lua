-- spec/it/config_spec.lua: settings from the environment (PORT, MOONSERVE_LISTEN,
-- MOONSERVE_WORKERS, the logs, health paths, timeouts) on real servers, the precedence
-- (a flag, then the environment, then app:run{}'s table, then the default), and a bad value
-- stopping the start with the variable's name and what it accepts; the configuration file
-- per environment and the secrets (moonserve.config, moonserve.secret): read once by the
-- master, handed to its workers, read again on a reload.
local helper = require "helper"
local socket = require "socket"
local cjson = require "cjson"

local q = helper.sh_quote
local BIN = os.getenv("MOONSERVE_BIN") or (helper.root .. "/lua/bin/moonserve")
local APP = "spec/fixtures/app.lua"

local function get(port, path, host)
    return helper.request(port, "GET " .. path .. " HTTP/1.1\r\nHost: " .. (host or "t")
        .. "\r\nConnection: close\r\n\r\n")
end

local function refused(port)
    local c = socket.connect("127.0.0.1", port)
    if c then
        c:close()
    end
    return c == nil
end

-- `moonserve ARGS` with `env` set (a table), its output and exit status.
local function moonserve(args, env)
    -- (At most 10 s: a start that went ahead would serve until stopped.)
    return helper.with_env(env, function()
        return helper.run("timeout 10 " .. BIN .. " " .. args .. " 2>&1")
    end)
end

describe("settings from the environment", function()
    it("PORT listens on MOONSERVE_HOST at that port", function()
        local port = helper.free_port()
        local srv = helper.spawn_server { app = APP, bare = true,
            env = { PORT = port, MOONSERVE_HOST = "127.0.0.1", MOONSERVE_WORKERS = 0 } }
        finally(function() srv:stop() end)
        assert.equal(port, srv.port)
        assert.equal("hello world", get(port, "/hello").body)
        assert.truthy(srv:log():find("from the environment: PORT=" .. port .. ", "
            .. "MOONSERVE_WORKERS=0", 1, true), srv:log())
    end)

    it("PORT alone means every address (0.0.0.0), as platforms that set it expect", function()
        -- (Read, not served: nothing is bound beyond loopback.)
        local read
        for _, e in ipairs(require("moonserve.server").ENV) do
            if e[1] == "PORT" then
                read = e[3]
            end
        end
        assert.is_nil(os.getenv("MOONSERVE_HOST"))
        assert.same({ "0.0.0.0:5000" }, read("5000"))
        local out, status = moonserve(q(helper.root .. "/" .. APP) .. " --check",
            { PORT = "5000", MOONSERVE_WORKERS = "0" })
        assert.equal(0, status, out)
        assert.matches("from the environment: PORT=5000, MOONSERVE_WORKERS=0\n", out)
    end)

    it("MOONSERVE_LISTEN takes a list, and wins over PORT; MOONSERVE_WORKERS starts workers",
        function()
            local a, b, c = helper.free_port(), helper.free_port(), helper.free_port()
            local srv = helper.spawn_server { app = "spec/fixtures/hooks.lua", bare = true,
                env = { MOONSERVE_LISTEN = "127.0.0.1:" .. a .. ", 127.0.0.1:" .. b,
                    PORT = c, MOONSERVE_WORKERS = 2 } }
            finally(function() srv:stop() end)
            assert.same({ a, b }, srv.ports)
            assert.matches("listening on http://127%.0%.0%.1:" .. a .. "/ %(2 workers%)",
                srv:log())
            assert.is_true(helper.wait_for(function() return #helper.children(srv.pid) == 2 end))
            assert.truthy(helper.wait_for(function()
                return get(a, "/worker").body:match("count=2")
            end))
            assert.matches("count=2", get(b, "/worker").body)
            assert.is_true(refused(c))
        end)

    it("a flag wins over its variable: --listen and --workers 0 over MOONSERVE_LISTEN and "
        .. "MOONSERVE_WORKERS", function()
        local a, b = helper.free_port(), helper.free_port()
        local srv = helper.spawn_server { app = "spec/fixtures/hooks.lua", bare = true,
            args = "--listen 127.0.0.1:" .. a .. " --workers 0",
            env = { MOONSERVE_LISTEN = "127.0.0.1:" .. b, MOONSERVE_WORKERS = 3 } }
        finally(function() srv:stop() end)
        assert.equal(a, srv.port)
        assert.is_true(refused(b))
        assert.equal(0, #helper.children(srv.pid))
        -- One process: the worker count is 1, whatever MOONSERVE_WORKERS says.
        assert.truthy(helper.wait_for(function()
            return get(a, "/worker").body:match("count=1")
        end), get(a, "/worker").body)
    end)

    it("the environment wins over app:run{}'s table", function()
        local a, b = helper.free_port(), helper.free_port()
        local file = os.tmpname()
        finally(function() os.remove(file) end)
        helper.write_file(file, ([[
local app = require("moonserve").app()
app:get("/", function() return 200, "from the table's app" end)
app:run { listen = "127.0.0.1:%d", workers = 0, log_level = "warn" }
]]):format(b))
        local log = os.tmpname()
        finally(function() os.remove(log) end)
        local pid = helper.background(("env MOONSERVE_LISTEN=127.0.0.1:%d "
            .. "MOONSERVE_LOG_LEVEL=info MOONSERVE_LOG=%s %s %s"):format(a, q(log),
            helper.tool("luajit"), q(file)))
        finally(function() helper.stop_pid(pid) end)
        helper.wait_port(a)
        assert.equal("from the table's app", get(a, "/").body)
        assert.is_true(refused(b))
        -- The level is the environment's too: the info line is there.
        assert.truthy(helper.wait_for(function()
            return helper.read_file(log):find("listening on http://127.0.0.1:" .. a, 1, true)
        end), helper.read_file(log))
    end)

    it("MOONSERVE_LOG, MOONSERVE_LOG_LEVEL and MOONSERVE_LOG_FORMAT", function()
        local log = os.tmpname()
        local srv = helper.spawn_server { app = "spec/fixtures/logged.lua", log = log,
            env = { MOONSERVE_LOG = log, MOONSERVE_LOG_LEVEL = "debug",
                MOONSERVE_LOG_FORMAT = "json" } }
        finally(function() srv:stop() end)
        get(srv.port, "/say")
        assert.truthy(helper.wait_for(function()
            return srv:log():find("debug line 1", 1, true)
        end), srv:log())
        local n = 0
        for l in srv:log():gmatch("[^\n]+") do
            local o = cjson.decode(l)
            assert.equal("number", type(o.pid))
            n = n + 1
        end
        assert.is_true(n >= 4, srv:log())
    end)

    it("MOONSERVE_ACCESS_LOG and MOONSERVE_ACCESS_LOG_FORMAT", function()
        local alog = os.tmpname()
        finally(function() os.remove(alog) end)
        local srv = helper.spawn_server { app = "spec/fixtures/logged.lua",
            env = { MOONSERVE_ACCESS_LOG = alog,
                MOONSERVE_ACCESS_LOG_FORMAT = "$method $target $status $route" } }
        finally(function() srv:stop() end)
        get(srv.port, "/hello")
        assert.truthy(helper.wait_for(function()
            return helper.read_file(alog) == "GET /hello 200 hello\n"
        end), helper.read_file(alog))
    end)

    it("MOONSERVE_LIVEZ and MOONSERVE_READYZ", function()
        local srv = helper.spawn_server { app = APP,
            env = { MOONSERVE_LIVEZ = "/alive", MOONSERVE_READYZ = "/ready" } }
        finally(function() srv:stop() end)
        assert.equal(200, get(srv.port, "/alive").status)
        assert.equal(200, get(srv.port, "/ready").status)
        assert.equal(404, get(srv.port, "/livez").status)
    end)

    it("MOONSERVE_STOP_TIMEOUT ends a request in flight at a stop that long", function()
        local srv = helper.spawn_server { app = APP, args = "--workers 1",
            env = { MOONSERVE_STOP_TIMEOUT = "0.5" } }
        local s = helper.connect(srv.port)
        assert(s:send("GET /slow?s=20 HTTP/1.1\r\nHost: t\r\n\r\n"))
        socket.sleep(0.3)
        local t0 = socket.gettime()
        assert.is_true(srv:stop(), "the server must stop")
        local took = socket.gettime() - t0
        s:close()
        assert.is_true(took < 4, "took " .. took .. " s")
    end)

    it("MOONSERVE_START_TIMEOUT fails a start whose hook passes it", function()
        local file = os.tmpname()
        finally(function() os.remove(file) end)
        helper.write_file(file, "30")
        local srv = helper.spawn_server { app = "spec/fixtures/hooks.lua", args = "--workers 1",
            env = { HOOK_SLEEP_FILE = file, MOONSERVE_START_TIMEOUT = "0.5" } }
        finally(function() srv:stop() end)
        assert.truthy(helper.wait_for(function()
            return srv:log():find("not ready after 0.5 s", 1, true)
        end, 5), srv:log())
    end)

    it("stops the start at a bad value, naming the variable and what it accepts", function()
        local cases = {
            { "PORT", "http", "a port number, 0 to 65535, expected" },
            { "PORT", "65536", "a port number, 0 to 65535, expected" },
            { "MOONSERVE_LISTEN", "localhost", "HOST:PORT, or several separated by commas" },
            { "MOONSERVE_WORKERS", "-1", "a whole number expected" },
            { "MOONSERVE_WORKERS", "four", "a whole number expected" },
            { "MOONSERVE_LOG_LEVEL", "loud", "debug, info, warn or error" },
            { "MOONSERVE_LOG_FORMAT", "xml", "text or json" },
            { "MOONSERVE_LIVEZ", "alive", "a path starting with / expected" },
            { "MOONSERVE_READYZ", "ready", "a path starting with / expected" },
            { "MOONSERVE_STOP_TIMEOUT", "0", "seconds, above 0, expected" },
            { "MOONSERVE_START_TIMEOUT", "soon", "seconds, above 0, expected" },
            { "MOONSERVE_DRAIN_DELAY", "-1", "seconds, 0 or more, expected" },
            { "MOONSERVE_AGENT_CHECK", "9200", "HOST:PORT expected" },
        }
        local app = q(helper.root .. "/" .. APP)
        for _, c in ipairs(cases) do
            local want = ("moonserve: bad environment variable %s=\"%s\" (%s"):format(c[1],
                c[2], c[3]):gsub("%p", "%%%0")
            want = "^" .. want
            -- A real start (no --check, no flag over the variable): it stops before anything
            -- listens.
            local out, status = moonserve(app, { [c[1]] = c[2] })
            assert.equal(2, status, c[1] .. ": " .. out)
            assert.matches(want, out)
            out, status = moonserve(app .. " --check", { [c[1]] = c[2] })
            assert.equal(2, status, c[1] .. ": " .. out)
            assert.matches(want, out)
        end
        -- What only opening the files finds is named with the variable too.
        local out, status = moonserve(app .. " --check",
            { MOONSERVE_ACCESS_LOG = "/nonexistent/dir/a.log" })
        assert.equal(2, status, out)
        assert.matches("^moonserve: bad access_log %(from MOONSERVE_ACCESS_LOG%) "
            .. "/nonexistent/dir/a%.log: ENOENT", out)
        out, status = moonserve(app .. " --check", { MOONSERVE_ACCESS_LOG = "-",
            MOONSERVE_ACCESS_LOG_FORMAT = "$nope" })
        assert.equal(2, status, out)
        assert.matches("from MOONSERVE_ACCESS_LOG_FORMAT%).*unknown field %(time, ", out)
        out, status = moonserve(app .. " --check", { MOONSERVE_LOG = "/nonexistent/dir/e.log" })
        assert.equal(2, status, out)
        assert.matches("^moonserve: cannot open log %(from MOONSERVE_LOG%) /nonexistent/", out)
    end)

    it("reads no variable a flag overrides, and takes an empty one as not set", function()
        local app = q(helper.root .. "/" .. APP)
        local out, status = moonserve(app .. " --check --workers 2 --log-level warn",
            { MOONSERVE_WORKERS = "many", MOONSERVE_LOG_LEVEL = "loud" })
        assert.equal(0, status, out)
        out, status = moonserve(app .. " --check --quiet", { MOONSERVE_LOG_LEVEL = "loud" })
        assert.equal(0, status, out)
        out, status = moonserve(app .. " --check", { PORT = "", MOONSERVE_WORKERS = "" })
        assert.equal(0, status, out)
        assert.falsy(out:find("from the environment", 1, true), out)
    end)
end)

-- -- The configuration file and secrets ---------------------------------------------------

-- An app that shows its settings and which worker answers, and keeps a session signed with
-- the secret "session".
local CONFIG_APP = [[
local moonserve = require "moonserve"
local app = moonserve.app()
local greeting = moonserve.config.greeting -- read at the top level, as routes are built
app:use(moonserve.sessions { secret = moonserve.secret("session") })
app:get("/config", function(req, res)
    res:json { greeting = greeting, pool = moonserve.config.pool, env = moonserve.env,
        worker = moonserve.worker.id() }
end)
app:get("/set", function(req, res)
    req.session:set("who", "ada")
    res:send("set")
end)
app:get("/who", function(req, res)
    res:send(tostring(req.session:get("who")))
end)
return app
]]

local SECRET = "a-secret-of-forty-bytes-0123456789abcdef"

-- A directory with the app and config.lua (`config`'s text); returns its path.
local function app_dir(config)
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -m 700 " .. dir) == 0)
    helper.write_file(dir .. "/app.lua", CONFIG_APP)
    helper.write_file(dir .. "/config.lua", config)
    return dir
end

-- What each worker answers at /config, by worker id, once both have answered.
local function by_worker(port)
    local seen = {}
    helper.wait_for(function()
        local r = get(port, "/config")
        if r.status == 200 then
            local t = cjson.decode(r.body)
            seen[t.worker] = t
        end
        return seen[0] and seen[1]
    end)
    return seen
end

describe("the configuration file and secrets", function()
    it("is read once by the master: every worker has its values, a worker started later too, "
        .. "and a reload reads the file again", function()
        local dir = app_dir [[return { common = { greeting = "hello", pool = 4 },
            production = { greeting = "welcome" } }]]
        finally(function() os.execute("rm -rf " .. dir) end)
        local srv = helper.spawn_server { app = dir .. "/app.lua", args = "--workers 2",
            env = { POOL = "8" } }
        finally(function() srv:stop() end)
        local seen = by_worker(srv.port)
        for w = 0, 1 do
            assert.same({ greeting = "hello", pool = 8, env = "development", worker = w },
                seen[w])
        end
        -- The file changes; a worker that dies is replaced with the master's values, not the
        -- file's.
        helper.write_file(dir .. "/config.lua",
            [[return { common = { greeting = "hi", pool = 4 } }]])
        local workers = helper.children(srv.pid)
        assert.equal(2, #workers)
        os.execute("kill -9 " .. workers[1])
        assert.truthy(helper.wait_for(function()
            local now = helper.children(srv.pid)
            return #now == 2 and now[1] ~= workers[1] and now[2] ~= workers[1]
        end))
        seen = by_worker(srv.port)
        assert.equal("hello", seen[0].greeting)
        assert.equal("hello", seen[1].greeting)
        -- A reload reads it again (the variable still over it).
        os.execute("kill -HUP " .. srv.pid)
        assert.truthy(helper.wait_for(function()
            local s = by_worker(srv.port)
            return s[0].greeting == "hi" and s[1].greeting == "hi" and s[0].pool == 8
        end))
        assert.matches("reload: environment development, configuration " .. dir:gsub("%p", "%%%0")
            .. "/config%.lua; settings from the environment: POOL", srv:log())
        -- A file that no longer loads: the reload does not happen, the workers serve on.
        helper.write_file(dir .. "/config.lua", [[return { common = { greeting = ]])
        os.execute("kill -HUP " .. srv.pid)
        assert.truthy(helper.wait_for(function()
            return srv:log():find("SIGHUP: not reloading, the old workers serve on: cannot "
                .. "read the configuration", 1, true)
        end), srv:log())
        assert.equal("hi", by_worker(srv.port)[1].greeting)
    end)

    it("keeps a development secret across a reload: a session cookie stays valid", function()
        local dir = app_dir [[return { common = { greeting = "hello" } }]]
        local jar = os.tmpname()
        finally(function() os.execute("rm -rf " .. dir) os.remove(jar) end)
        local srv = helper.spawn_server { app = dir .. "/app.lua", args = "--workers 2" }
        finally(function() srv:stop() end)
        local url = "http://127.0.0.1:" .. srv.port
        assert.equal("set", helper.curl("-c " .. q(jar) .. " " .. url .. "/set"))
        -- Every worker reads the session: they share the secret.
        for _ = 1, 10 do
            assert.equal("ada", helper.curl("-b " .. q(jar) .. " " .. url .. "/who"))
        end
        local old = helper.children(srv.pid)
        os.execute("kill -HUP " .. srv.pid)
        assert.truthy(helper.wait_for(function()
            local now = helper.children(srv.pid)
            return #now == 2 and now[1] ~= old[1] and now[1] ~= old[2] and now[2] ~= old[1]
                and now[2] ~= old[2]
        end))
        for _ = 1, 10 do
            assert.equal("ada", helper.curl("-b " .. q(jar) .. " " .. url .. "/who"))
        end
    end)

    it("in production, fails to start and --check fails without the secret, and passes with "
        .. "it in the environment or a file, never showing it", function()
        local dir = app_dir [[return { common = { greeting = "hello" },
            production = { secrets_dir = "/nonexistent/secrets" } }]]
        finally(function() os.execute("rm -rf " .. dir) end)
        local app = q(dir .. "/app.lua")
        local missing = 'secret "session" not found in the production environment: no file '
            .. "/nonexistent/secrets/session (secrets_dir), no $CREDENTIALS_DIRECTORY, no "
            .. "variable MOONSERVE_SECRET_SESSION (only development draws one at random)"
        for _, args in ipairs { " --env production --listen 127.0.0.1:0 --workers 2",
            " --env production --check" } do
            local out, status = moonserve(app .. args, {})
            assert.equal(2, status, out)
            assert.truthy(out:find(missing, 1, true), out)
        end
        -- In the environment (MOONSERVE_ENV names the environment as --env does).
        local out, status = moonserve(app .. " --check",
            { MOONSERVE_ENV = "production", MOONSERVE_SECRET_SESSION = SECRET })
        assert.equal(0, status, out)
        assert.truthy(out:find("moonserve: environment production, configuration " .. dir
            .. "/config.lua; secrets: session (the variable MOONSERVE_SECRET_SESSION)", 1, true),
            out)
        assert.falsy(out:find(SECRET, 1, true), out)
        -- Too short: named, not shown.
        out, status = moonserve(app .. " --check --env production",
            { MOONSERVE_SECRET_SESSION = "tiny-secret" })
        assert.equal(2, status, out)
        assert.truthy(out:find('secret "session" from the variable MOONSERVE_SECRET_SESSION is '
            .. "11 bytes; at least 32 expected", 1, true), out)
        assert.falsy(out:find("tiny-secret", 1, true), out)
        -- In a file: systemd's credentials directory, served by workers; the log never shows it.
        local creds = dir .. "/creds"
        assert(os.execute("mkdir -m 700 " .. creds) == 0)
        helper.write_file(creds .. "/session", SECRET .. "\n")
        assert(os.execute("chmod 600 " .. creds .. "/session") == 0)
        out, status = moonserve(app .. " --check --env production",
            { CREDENTIALS_DIRECTORY = creds })
        assert.equal(0, status, out)
        assert.truthy(out:find("secrets: session (the file " .. creds .. "/session)", 1, true), out)
        local srv = helper.spawn_server { app = dir .. "/app.lua",
            args = "--env production --workers 2", env = { CREDENTIALS_DIRECTORY = creds } }
        finally(function() srv:stop() end)
        local seen = by_worker(srv.port)
        assert.equal("production", seen[0].env)
        assert.equal("production", seen[1].env)
        assert.falsy(srv:log():find(SECRET, 1, true))
        -- Nor what `ps` shows of the master and its workers.
        local pids = helper.children(srv.pid)
        pids[#pids + 1] = srv.pid
        for _, pid in ipairs(pids) do
            local cmdline = helper.read_file("/proc/" .. pid .. "/cmdline")
            assert.truthy(cmdline:find("^moonserve: "), cmdline)
            assert.falsy(cmdline:find(SECRET, 1, true))
        end
        -- A secret file others may read is refused, as ssh refuses such a key.
        assert(os.execute("chmod 644 " .. creds .. "/session") == 0)
        out, status = moonserve(app .. " --check --env production",
            { CREDENTIALS_DIRECTORY = creds })
        assert.equal(2, status, out)
        assert.truthy(out:find('secret "session": ' .. creds .. "/session may be read by others "
            .. "(mode 0644): it is refused, as ssh refuses such a key; chmod 600 it (or 400)", 1,
            true), out)
        assert.falsy(out:find(SECRET, 1, true), out)
    end)

    it("stops at an environment the file does not name", function()
        local dir = app_dir [[return { common = {}, production = {} }]]
        finally(function() os.execute("rm -rf " .. dir) end)
        local out, status = moonserve(q(dir .. "/app.lua") .. " --env prodution --check", {})
        assert.equal(2, status, out)
        assert.truthy(out:find('moonserve: unknown environment "prodution": ' .. dir
            .. "/config.lua has production (and development)", 1, true), out)
    end)
end)
