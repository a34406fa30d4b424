-- spec/it/user_spec.lua: --user and --group: the master starts as root, binds, reads the TLS
-- key and opens the logs; its workers run as the user and get those files from it. (Run as
-- root; as anyone else these are pending.)
local ffi = require "ffi"
local helper = require "helper"
local socket = require "socket"

local children, wait_for, q = helper.children, helper.wait_for, helper.sh_quote

ffi.cdef "unsigned int getuid(void);"

local BIN = os.getenv("MOONSERVE_BIN") or (helper.root .. "/lua/bin/moonserve")

local function root()
    return ffi.C.getuid() == 0
end

-- The ids of `name` from the user or group database ("passwd", "group"), or nil.
local function ids(db, name)
    local line = helper.run("getent " .. db .. " " .. q(name))
    return tonumber(line:match("^[^:]*:[^:]*:(%d+):"))
end

-- The Uid, Gid and Groups lines of /proc/PID/status.
local function creds(pid)
    local status = helper.read_file("/proc/" .. pid .. "/status")
    return status:match("\nUid:%s*([%d%s]-)\n"), status:match("\nGid:%s*([%d%s]-)\n"),
        status:match("\nGroups:([^\n]*)")
end

-- A directory only root may enter, with a certificate and its key (mode 0600) for localhost.
local function private_dir()
    local dir = helper.run("mktemp -d"):match("%S+")
    helper.run("chmod 700 " .. q(dir))
    helper.run(string.format("%s req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
        .. "-keyout %s -out %s -days 2 -subj /CN=localhost 2>&1", helper.tool("openssl"),
        q(dir .. "/key.pem"), q(dir .. "/cert.pem")))
    helper.run("chmod 600 " .. q(dir .. "/key.pem") .. " " .. q(dir .. "/cert.pem"))
    return dir
end

-- The workers load the framework, the core and the app once they are nobody: from a copy
-- in a directory anyone may enter, so that the tree may be where nobody reads (a clone in
-- /root, whose mode is 0700). Returns the directory, the spawn_server env, and the path of
-- the fixture `name` in the copy.
local function readable_copy(name)
    local dir = helper.run("mktemp -d"):match("%S+")
    local core = os.getenv("MOONSERVE_CORE") or (helper.root .. "/build/modules/core.so")
    helper.run(string.format("chmod 755 %s && cp -r %s %s && cp %s %s/core.so && cp %s %s "
        .. "&& chmod -R a+rX %s", q(dir), q(helper.root .. "/lua"), q(dir), q(core), q(dir),
        q(helper.root .. "/spec/fixtures/" .. name), q(dir), q(dir)))
    local env = { LUA_PATH = dir .. "/lua/?.lua;" .. dir .. "/lua/?/init.lua;;",
        MOONSERVE_CORE = dir .. "/core.so" }
    return dir, env, dir .. "/" .. name
end

local function https(port, path, host)
    return helper.curl(string.format("-k --resolve %s:%d:127.0.0.1 https://%s:%d%s",
        host or "localhost", port, host or "localhost", port, path))
end

describe("moonserve --user and --group", function()
    local nobody, nogroup = ids("passwd", "nobody"), ids("group", "nogroup")
    local run = (root() and nobody and nogroup) and it or pending

    run("runs the workers as the user and group, which serve TLS from a key only root reads, "
        .. "write the access log in a directory only root enters, and reload on HUP", function()
        local dir = private_dir()
        local copy, env, app = readable_copy("app.lua")
        local access, log = dir .. "/access.log", dir .. "/error.log"
        local srv = helper.spawn_server { app = app, env = env, bare = true, log = log,
            args = string.format("--listen 127.0.0.1:0 --tls-cert %s --tls-key %s --workers 2 "
                .. "--user nobody --group nogroup --access-log %s --log %s",
                q(dir .. "/cert.pem"), q(dir .. "/key.pem"), q(access), q(log)) }
        finally(function()
            srv:stop()
            helper.run("rm -rf " .. q(dir) .. " " .. q(copy))
        end)
        local function check_workers()
            local workers = children(srv.pid)
            assert.equal(2, #workers)
            for _, pid in ipairs(workers) do
                local uid, gid, groups = creds(pid)
                assert.equal(string.format("%d\t%d\t%d\t%d", nobody, nobody, nobody, nobody), uid)
                assert.equal(string.format("%d\t%d\t%d\t%d", nogroup, nogroup, nogroup, nogroup),
                    gid)
                assert.equal("", groups:match("^%s*(.-)%s*$")) -- no supplementary group
            end
            assert.equal("0", creds(srv.pid):match("^%d+")) -- the master stays root
            return workers
        end
        local before = check_workers()
        assert.equal("hello world", https(srv.port, "/hello"))
        assert.truthy(wait_for(function()
            return helper.read_file(access):find("\"GET /hello HTTP/", 1, true)
        end))
        os.execute("kill -HUP " .. srv.pid)
        assert.truthy(wait_for(function()
            local now = children(srv.pid)
            return #now == 2 and now[1] ~= before[1] and now[2] ~= before[2]
                and srv:log():find("took over", 1, true)
                and select(2, srv:log():gsub("took over", "")) >= 2
        end))
        check_workers()
        assert.equal("hello world", https(srv.port, "/hello?after-reload"))
        assert.truthy(wait_for(function()
            return helper.read_file(access):find("\"GET /hello?after-reload HTTP/", 1, true)
        end))
        -- USR1 reopens the logs: the workers get the new files from the master.
        os.rename(access, access .. ".1")
        os.execute("kill -USR1 " .. srv.pid)
        assert.truthy(wait_for(function()
            https(srv.port, "/hello?after-reopen")
            return helper.read_file(access):find("\"GET /hello?after-reopen HTTP/", 1, true)
        end))
        assert.is_nil(srv:log():find("reload failed", 1, true))
    end)

    run("opens for a worker only the files named at the start: a reload that names another "
        .. "log the user may not write fails, and the old workers serve on", function()
        local dir = private_dir()
        local name = os.tmpname()
        helper.run("chmod 644 " .. q(name))
        local function site_log(path)
            local f = assert(io.open(name, "wb"))
            f:write(path, "\n")
            f:close()
        end
        site_log(dir .. "/site.log")
        local copy, env, app = readable_copy("site_log.lua")
        env.SITE_LOG_NAME = name
        local srv = helper.spawn_server { app = app, env = env, bare = true,
            args = "--listen 127.0.0.1:0 --workers 1 --user nobody" }
        finally(function()
            srv:stop()
            os.remove(name)
            helper.run("rm -rf " .. q(dir) .. " " .. q(copy))
        end)
        local function get(path)
            return helper.curl(string.format("--resolve logs.test:%d:127.0.0.1 http://logs.test:%d%s",
                srv.port, srv.port, path))
        end
        assert.equal("site", get("/"))
        assert.truthy(wait_for(function()
            return helper.read_file(dir .. "/site.log"):find("\"GET / HTTP/1.1\"", 1, true)
        end))
        local before = children(srv.pid)
        site_log(dir .. "/elsewhere.log")
        os.execute("kill -HUP " .. srv.pid)
        assert.truthy(wait_for(function()
            return srv:log():find("reload failed", 1, true)
        end))
        assert.truthy(srv:log():find("not a log file the server was started with", 1, true))
        assert.is_nil(io.open(dir .. "/elsewhere.log"))
        assert.same(before, children(srv.pid))
        assert.equal("site", get("/?still"))
    end)

    run("opens no file but the named ones for a worker: an access log it replaced by a link "
        .. "into a directory only root enters makes no file there, on its own USR1 or on the "
        .. "operator's", function()
        local private = private_dir() -- where the link points: root's alone
        local logs = helper.run("mktemp -d"):match("%S+")
        helper.run("chown nobody " .. q(logs)) -- a log directory the workers' user may write
        local copy, env, app = readable_copy("worker_attack.lua")
        local access, target = logs .. "/access.log", private .. "/owned.log"
        env.TRAP_LOG, env.TRAP_TARGET = access, target
        local srv = helper.spawn_server { app = app, env = env, bare = true,
            args = string.format("--listen 127.0.0.1:0 --workers 1 --user nobody "
                .. "--access-log %s", q(access)) }
        finally(function()
            srv:stop()
            helper.run("rm -rf " .. q(private) .. " " .. q(logs) .. " " .. q(copy))
        end)
        local function get(path)
            return helper.curl(string.format("http://127.0.0.1:%d%s", srv.port, path))
        end
        assert.equal("hello world", get("/hello"))
        -- The worker swaps the log for a link and has the logs reopened: it gets the file the
        -- master opened, not a new one where the link points.
        assert.equal("set", get("/trap"))
        assert.equal("hello world", get("/hello?after-trap"))
        socket.sleep(0.3)
        assert.is_nil(io.open(target), "the master made " .. target)
        -- The operator's USR1 meets the link: refused, one line; the old file serves on.
        os.execute("kill -USR1 " .. srv.pid)
        assert.truthy(wait_for(function()
            return srv:log():find("a symbolic link in a directory the workers' user may write",
                1, true)
        end), srv:log())
        assert.equal("hello world", get("/hello?after-usr1"))
        socket.sleep(0.3)
        assert.is_nil(io.open(target), "the master made " .. target)
        local _, lines = srv:log():gsub("cannot open the log [^\n]*writing to the old file", "")
        assert.equal(1, lines, srv:log())
    end)

    run("reads for a worker no file but the named TLS files: a key it replaced by a link to "
        .. "root's secret is refused", function()
        local private = private_dir()
        helper.write_file(private .. "/secret", "root's secret\n")
        local tls = private_dir() -- the TLS files, in a directory the workers' user owns
        helper.run("chown nobody " .. q(tls))
        local copy, env, app = readable_copy("worker_attack.lua")
        env.STEAL_KEY, env.STEAL_TARGET = tls .. "/key.pem", private .. "/secret"
        local srv = helper.spawn_server { app = app, env = env, bare = true,
            args = string.format("--listen 127.0.0.1:0 --workers 1 --user nobody --tls-cert %s "
                .. "--tls-key %s", q(tls .. "/cert.pem"), q(tls .. "/key.pem")) }
        finally(function()
            srv:stop()
            helper.run("rm -rf " .. q(private) .. " " .. q(tls) .. " " .. q(copy))
        end)
        local out = https(srv.port, "/steal")
        assert.is_nil(out:find("root's secret", 1, true), out)
        assert.truthy(out:find("a symbolic link in a directory the workers' user may write", 1,
            true), out)
    end)

    it("names a user or group that does not exist, at the start and with --check", function()
        local app = q(helper.root .. "/spec/fixtures/app.lua")
        for _, case in ipairs({
            { "--user no-such-user-x", "moonserve: bad user: unknown user no-such-user-x " },
            { "--user nobody --group no-such-group-x",
                "moonserve: bad group: unknown group no-such-group-x " },
            { "--group nogroup", "moonserve: group goes with user" },
        }) do
            for _, check in ipairs({ "", " --check" }) do
                local out, status = helper.run(string.format("%s %s --listen 127.0.0.1:0 "
                    .. "--workers 1 %s%s 2>&1", BIN, app, case[1], check))
                assert.equal(2, status)
                assert.equal(case[2], out:sub(1, #case[2]))
            end
        end
        local out, status = helper.run(string.format("MOONSERVE_USER=no-such-user-x %s %s --check "
            .. "2>&1", BIN, app))
        assert.equal(2, status)
        assert.truthy(out:find("bad user (from MOONSERVE_USER): unknown user no-such-user-x", 1,
            true))
        out, status = helper.run(string.format("%s %s --check --user nobody 2>&1", BIN,
            app))
        assert.equal(0, status, out)
    end)

    it("needs workers: a single process runs as the user that starts it", function()
        local out, status = helper.run(string.format("%s %s --listen 127.0.0.1:0 --workers 0 "
            .. "--user nobody 2>&1", BIN, q(helper.root .. "/spec/fixtures/app.lua")))
        assert.equal(2, status)
        assert.truthy(out:find("user needs workers under a master", 1, true), out)
    end)
end)
