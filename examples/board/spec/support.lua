-- The board's specs' database: a database of their own, made fresh and migrated, on the
-- server DATABASE_URL names (its user may create databases), or else in a throwaway cluster
-- started here by initdb (PostgreSQL's server packages; as root, the cluster runs as the
-- postgres user, since PostgreSQL refuses to run as root). Dropped, or stopped, at the end.
local M = {}

local function q(s)
    return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- Runs a shell command: whether it exited 0, and its output (LuaJIT's popen close does not
-- say how the command ended, so the shell prints it last).
local function run(cmd)
    local p = io.popen("{ " .. cmd .. "; } 2>&1; echo \"exit $?\"")
    local out = p:read("*a")
    p:close()
    local code = tonumber(out:match("exit (%d+)\n?$"))
    return code == 0, (out:gsub("exit %d+\n?$", ""))
end

local function must(cmd)
    local ok, out = run(cmd)
    assert(ok, cmd .. "\n" .. out)
    return out
end

-- A PostgreSQL server program: on PATH, or in Debian's /usr/lib/postgresql/N/bin.
local function server_program(name)
    local ok, out = run("command -v " .. name .. " || ls -d /usr/lib/postgresql/*/bin/" .. name
        .. " | sort -V | tail -n 1")
    local path = ok and out:match("[^\n]+")
    assert(path and path ~= "", name .. " not found: install postgresql, or set DATABASE_URL")
    return path
end

local function free_port()
    local socket = require "socket"
    local probe = assert(socket.bind("127.0.0.1", 0))
    local _, port = probe:getsockname()
    probe:close()
    return port
end

-- A throwaway cluster on a loopback port, trusting local logins: { url, stop }.
local function cluster()
    local dir = must("mktemp -d"):match("[^\n]+")
    local as = ""
    if must("id -u"):match("^0") then
        must("chown postgres: " .. q(dir))
        as = "setpriv --reuid=postgres --regid=postgres --init-groups "
    end
    must(as .. q(server_program("initdb")) .. " -D " .. q(dir .. "/data")
        .. " -U postgres -E UTF8 --auth=trust")
    local port = free_port()
    local p = io.popen(as .. q(server_program("postgres")) .. " -D " .. q(dir .. "/data")
        .. " -p " .. port .. " -k " .. q(dir) .. " -c listen_addresses=127.0.0.1 -c fsync=off"
        .. " >" .. q(dir .. "/server.log") .. " 2>&1 & echo $!")
    local pid = p:read("*l")
    p:close()
    local url = "postgres://postgres@127.0.0.1:" .. port .. "/postgres"
    for _ = 1, 200 do
        if run("psql -X -q " .. q(url) .. " -c 'select 1'") then
            break
        end
        os.execute("sleep 0.05")
    end
    must("psql -X -q " .. q(url) .. " -c 'select 1'")
    return { url = url, stop = function()
        os.execute("kill -INT " .. pid .. " 2>/dev/null")
        for _ = 1, 100 do
            if os.execute("kill -0 " .. pid .. " 2>/dev/null") ~= 0 then
                break
            end
            os.execute("sleep 0.05")
        end
        os.execute("kill -9 " .. pid .. " 2>/dev/null; rm -rf " .. q(dir))
    end }
end

-- `url` with its database replaced by `name`.
local function with_database(url, name)
    local base, query = url:match("^([^?]*)(.*)$")
    local head = base:match("^(postgres[%w]*://[^/]*)") or base
    return head .. "/" .. name .. query
end

-- Makes a fresh database with the board's migrations applied by `moonserve migrate` (the
-- command on PATH, or MOONSERVE_BIN) and returns its URL, and a function that drops it (and
-- stops the cluster).
function M.database(app_file)
    local given = os.getenv("DATABASE_URL")
    local server = given and { url = given, stop = function() end } or cluster()
    local name = ("board_spec_%d_%d"):format(os.time(), math.random(1e6))
    local ok, out = run("psql -X -q " .. q(server.url) .. " -c 'CREATE DATABASE " .. name .. "'")
    if not ok then
        server.stop()
        error("cannot make a database on DATABASE_URL's server: " .. out)
    end
    local url = with_database(server.url, name)
    ok, out = run("DATABASE_URL=" .. q(url) .. " " .. q(os.getenv("MOONSERVE_BIN") or "moonserve")
        .. " migrate " .. q(app_file) .. " --env test")
    if not ok then
        server.stop()
        error("moonserve migrate failed: " .. out)
    end
    return url, function()
        run("psql -X -q " .. q(server.url) .. " -c 'DROP DATABASE IF EXISTS " .. name
            .. " WITH (FORCE)'")
        server.stop()
    end
end

return M
