-- spec/postgres.lua: a throwaway PostgreSQL cluster for the specs, and a small client of its
-- wire protocol. The cluster is made by initdb in a temporary directory, runs as the
-- postgres user (PostgreSQL refuses to run as root) on a loopback port, and has two users:
-- one that authenticates with SCRAM-SHA-256 (PostgreSQL 15's default) and one with md5.
-- The client (startup, both authentications, simple query) works over any socket with
-- OpenResty's methods: moonserve.socket.tcp() in a handler, LuaSocket in a spec.
local ffi = require "ffi"
local bit = require "bit"
local helper = require "helper"
local socket = require "socket"
local crypto = require "moonserve.crypto"

local byte, char, sub, concat = string.byte, string.char, string.sub, table.concat

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

-- -- Digests (libcrypto) ------------------------------------------------------------------

pcall(ffi.cdef, [[
typedef struct evp_md_st EVP_MD;
const EVP_MD *EVP_md5(void);
const EVP_MD *EVP_sha256(void);
int EVP_Digest(const void *data, size_t count, unsigned char *md, unsigned int *size,
               const EVP_MD *type, void *impl);
int PKCS5_PBKDF2_HMAC(const char *pass, int passlen, const unsigned char *salt, int saltlen,
                      int iter, const EVP_MD *digest, int keylen, unsigned char *out);
]])
local ok, C = pcall(ffi.load, "libcrypto.so.3")
if not ok then
    C = ffi.load("crypto")
end
local md = ffi.new("unsigned char[64]")

local function digest(kind, s)
    local n = kind == "md5" and 16 or 32
    assert(C.EVP_Digest(s, #s, md, nil, kind == "md5" and C.EVP_md5() or C.EVP_sha256(), nil) == 1)
    return ffi.string(md, n)
end

local function hex(s)
    return (s:gsub(".", function(c) return string.format("%02x", byte(c)) end))
end

local function xor(a, b)
    local out = {}
    for i = 1, #a do
        out[i] = char(bit.bxor(byte(a, i), byte(b, i)))
    end
    return concat(out)
end

local function b64(s)
    local e = crypto.base64url_encode(s):gsub("-", "+"):gsub("_", "/")
    return e .. ("="):rep((4 - #e % 4) % 4)
end

local function unb64(s)
    return crypto.base64url_decode((s:gsub("=", ""):gsub("+", "-"):gsub("/", "_")))
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

-- SCRAM-SHA-256 (RFC 7677) on a connection whose server asked for SASL.
local function scram(sock, password)
    local nonce = b64(crypto.random(18))
    local first_bare = "n=,r=" .. nonce
    local first = "n,," .. first_bare
    sock:send(message("p", "SCRAM-SHA-256\0" .. int32(#first) .. first))
    local kind, body = receive(sock)
    if kind ~= "R" or get32(body, 1) ~= 11 then
        return nil, kind == "E" and server_error(body) or "no SASL continue"
    end
    local server_first = sub(body, 5)
    local r, s, i = server_first:match("r=([^,]+),s=([^,]+),i=(%d+)")
    if not r or sub(r, 1, #nonce) ~= nonce then
        return nil, "bad server-first message"
    end
    local salted = ffi.new("unsigned char[32]")
    local salt = unb64(s)
    assert(C.PKCS5_PBKDF2_HMAC(password, #password, salt, #salt, tonumber(i), C.EVP_sha256(), 32,
        salted) == 1)
    salted = ffi.string(salted, 32)
    local client_key = crypto.hmac_sha256(salted, "Client Key")
    local final_bare = "c=biws,r=" .. r
    local auth = first_bare .. "," .. server_first .. "," .. final_bare
    local proof = xor(client_key, crypto.hmac_sha256(digest("sha256", client_key), auth))
    sock:send(message("p", final_bare .. ",p=" .. b64(proof)))
    kind, body = receive(sock)
    if kind ~= "R" or get32(body, 1) ~= 12 then
        return nil, kind == "E" and server_error(body) or "no SASL final"
    end
    local want = b64(crypto.hmac_sha256(crypto.hmac_sha256(salted, "Server Key"), auth))
    if sub(body, 5):match("v=([^,]+)") ~= want then
        return nil, "the server's signature does not match"
    end
    return true
end

-- Starts a session as `user` on `sock` (connected): true, or nil, err.
function M.login(sock, user, password, database)
    sock:send(int32(8 + #user + 1 + 9 + #(database or "postgres") + 2 + 5) .. int32(196608)
        .. "user\0" .. user .. "\0database\0" .. (database or "postgres") .. "\0\0")
    while true do
        local kind, body = receive(sock)
        if not kind then
            return nil, body
        elseif kind == "E" then
            return nil, server_error(body)
        elseif kind == "R" then
            local code = get32(body, 1)
            if code == 5 then
                local inner = hex(digest("md5", password .. user))
                sock:send(message("p", "md5" .. hex(digest("md5", inner .. sub(body, 5, 8))) .. "\0"))
            elseif code == 10 then
                local done, err = scram(sock, password)
                if not done then
                    return nil, err
                end
            elseif code ~= 0 then
                return nil, "authentication " .. code .. " is not spoken here"
            end
        elseif kind == "Z" then
            return true
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
