-- spec/postgres.lua: a throwaway PostgreSQL cluster for the specs, and a small client of its
-- wire protocol. The cluster is made by initdb in a temporary directory, runs as the
-- postgres user (PostgreSQL refuses to run as root) on a loopback port, and has two users:
-- one that authenticates with SCRAM-SHA-256 (PostgreSQL 15's default) and one with md5.
-- The client (startup, both authentications through moonserve.pg.auth, simple query) works
-- over any socket with OpenResty's methods: moonserve.socket.tcp() in a handler, LuaSocket in
-- a spec.
local bit = require "bit"
local helper = require "helper"
local socket = require "socket"
local auth = require "moonserve.pg.auth"

local byte, char, sub = string.byte, string.char, string.sub

local M = {}

M.users = {
    scram = { user = "scram_user", password = "scram-secret" },
    md5 = { user = "md5_user", password = "md5-secret" },
}

-- -- The cluster -------------------------------------------------------------------------

local function sh(cmd)
    assert(helper.run(cmd), cmd)
end

-- Starts a cluster; returns { port, stop = function, restart = function }. opts.ssl: { cert =
-- PEM file, key = PEM file } for a server that also speaks TLS (ssl=on).
function M.start(opts)
    opts = opts or {}
    local dir = helper.run(helper.tool("mktemp") .. " -d"):gsub("%s+$", "")
    local as_postgres = helper.tool("setpriv")
        .. " --reuid=postgres --regid=postgres --init-groups "
    sh(helper.tool("chown") .. " postgres: " .. dir)
    sh(as_postgres .. helper.tool("initdb") .. " -D " .. dir .. "/data -U postgres -E UTF8"
        .. " --auth-local=trust --auth-host=scram-sha-256 >" .. dir .. "/initdb.log 2>&1")
    -- md5 for its user, SCRAM for everyone else, over TCP on loopback.
    helper.write_file(dir .. "/data/pg_hba.conf", table.concat({
        "local all all trust",
        "host all " .. M.users.md5.user .. " 127.0.0.1/32 md5",
        "host all all 127.0.0.1/32 scram-sha-256",
        "",
    }, "\n"))
    local extra = ""
    if opts.ssl then
        -- (the server reads its key only when the postgres user alone can)
        sh(helper.tool("install") .. " -o postgres -m 600 " .. opts.ssl.cert .. " " .. dir
            .. "/data/server.crt")
        sh(helper.tool("install") .. " -o postgres -m 600 " .. opts.ssl.key .. " " .. dir
            .. "/data/server.key")
        extra = " -c ssl=on"
    end
    local probe = socket.bind("127.0.0.1", 0)
    local _, port = probe:getsockname()
    probe:close()
    local pid
    local function launch()
        local p = io.popen(as_postgres .. helper.tool("postgres") .. " -D " .. dir .. "/data -p "
            .. port .. " -k " .. dir .. " -c listen_addresses=127.0.0.1 -c fsync=off" .. extra
            .. " >>" .. dir .. "/server.log 2>&1 & echo $!")
        pid = p:read("*l")
        p:close()
    end
    launch()
    local psql = helper.tool("psql") .. " -X -q -h " .. dir .. " -p " .. port .. " -U postgres"
    local up = helper.wait_for(function()
        return os.execute(psql .. " -c 'select 1' >/dev/null 2>&1") == 0
    end, 20)
    assert(up, "postgres did not start: " .. helper.read_file(dir .. "/server.log"))
    sh(psql .. " -c \"CREATE USER " .. M.users.scram.user .. " PASSWORD '"
        .. M.users.scram.password .. "'\" -c \"SET password_encryption = 'md5'\" -c \"CREATE USER "
        .. M.users.md5.user .. " PASSWORD '" .. M.users.md5.password .. "'\" >/dev/null")
    local pg = { port = tonumber(port), pid = pid, dir = dir }
    -- Runs `sql` as the superuser (in `database`, or postgres); returns psql's unaligned
    -- output.
    function pg.psql(sql, database)
        return (helper.run(psql .. (database and " -d " .. database or "") .. " -At -c \""
            .. sql .. "\" 2>&1"):gsub("%s+$", ""))
    end
    -- Active connections of `user`, as the server counts them.
    function pg.connections(user)
        local out = helper.run(psql .. " -At -c \"SELECT count(*) FROM pg_stat_activity WHERE "
            .. "usename = '" .. user .. "'\"")
        return tonumber(out:match("%d+"))
    end
    local function halt()
        os.execute("kill -INT " .. pid .. " 2>/dev/null") -- fast shutdown
        helper.wait_for(function() return os.execute("kill -0 " .. pid .. " 2>/dev/null") ~= 0 end)
        os.execute("kill -9 " .. pid .. " 2>/dev/null")
    end
    function pg.stop()
        halt()
        os.execute("rm -rf " .. dir)
    end
    -- Stops the server (its sessions end) and starts it again on the same port and data.
    function pg.restart()
        halt()
        launch()
        pg.pid = pid
        assert(helper.wait_for(function()
            return os.execute(psql .. " -c 'select 1' >/dev/null 2>&1") == 0
        end, 20), "postgres did not start again")
    end
    return pg
end

-- -- The wire protocol --------------------------------------------------------------------

local function int32(n)
    return char(bit.band(bit.rshift(n, 24), 255), bit.band(bit.rshift(n, 16), 255),
        bit.band(bit.rshift(n, 8), 255), bit.band(n, 255))
end

local function get32(s, at)
    local a, b, c, d = byte(s, at, at + 3)
    return bit.bor(bit.lshift(a, 24), bit.lshift(b, 16), bit.lshift(c, 8), d)
end

local function get16(s, at)
    local a, b = byte(s, at, at + 1)
    return a * 256 + b
end

local function message(kind, body)
    return kind .. int32(#body + 4) .. body
end

-- One message from the server: its type and body, or nil, err.
local function receive(sock)
    local head, err = sock:receive(5)
    if not head then
        return nil, err
    end
    local len = get32(head, 2) - 4
    local body = ""
    if len > 0 then
        body, err = sock:receive(len)
        if not body then
            return nil, err
        end
    end
    return sub(head, 1, 1), body
end

local function server_error(body)
    local fields = {}
    for code, text in body:gmatch("(%a)([^%z]*)%z") do
        fields[code] = text
    end
    return (fields.S or "ERROR") .. ": " .. (fields.M or "?")
end

-- Starts a session as `user` on `sock` (connected), its answers made by moonserve.pg.auth:
-- true and the authentication the server asked for ("md5", "scram"), or nil, err. `tamper`
-- may change the server-final-message before it is verified.
function M.login(sock, user, password, database, tamper)
    local startup = int32(196608) .. "user\0" .. user .. "\0database\0"
        .. (database or "postgres") .. "\0\0"
    sock:send(int32(#startup + 4) .. startup)
    local sc, how
    while true do
        local kind, body = receive(sock)
        if not kind then
            return nil, body
        elseif kind == "E" then
            return nil, server_error(body)
        elseif kind == "R" then
            local code = get32(body, 1)
            if code == 5 then
                how = "md5"
                sock:send(message("p", auth.md5(user, password, sub(body, 5, 8)) .. "\0"))
            elseif code == 10 then -- SASL: SCRAM-SHA-256 (RFC 7677)
                how = "scram"
                if not body:find("SCRAM-SHA-256\0", 5, true) then
                    return nil, "the server offers no SCRAM-SHA-256"
                end
                sc = auth.scram(password)
                local first = sc:first()
                sock:send(message("p", "SCRAM-SHA-256\0" .. int32(#first) .. first))
            elseif code == 11 then
                local final, err = sc:final(sub(body, 5))
                if not final then
                    return nil, err
                end
                sock:send(message("p", final))
            elseif code == 12 then
                local server_final = sub(body, 5)
                local ok, err = sc:verify(tamper and tamper(server_final) or server_final)
                if not ok then
                    return nil, err
                end
            elseif code ~= 0 then
                return nil, "authentication " .. code .. " is not spoken here"
            end
        elseif kind == "Z" then
            return true, how
        end
    end
end

-- Runs `sql` (simple query protocol): the rows of its last result, each a list of strings
-- (false for NULL), or nil, err.
function M.query(sock, sql)
    sock:send(message("Q", sql .. "\0"))
    local rows, err = {}, nil
    while true do
        local kind, body = receive(sock)
        if not kind then
            return nil, body
        elseif kind == "T" then
            rows = {}
        elseif kind == "D" then
            local row, at = {}, 3
            for c = 1, get16(body, 1) do
                local len = get32(body, at)
                if len == 0xffffffff or len == -1 then
                    row[c], at = false, at + 4
                else
                    row[c], at = sub(body, at + 4, at + 3 + len), at + 4 + len
                end
            end
            rows[#rows + 1] = row
        elseif kind == "E" then
            err = server_error(body)
        elseif kind == "Z" then
            if err then
                return nil, err
            end
            return rows
        end
    end
end

function M.terminate(sock)
    sock:send(message("X", ""))
end

return M
