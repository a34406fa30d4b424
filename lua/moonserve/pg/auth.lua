--- moonserve/pg/auth.lua: PostgreSQL's password authentications, md5 and SCRAM-SHA-256.
-- SCRAM-SHA-256 follows RFC 5802 and RFC 7677, without channel binding ("n,,"). The
-- password's bytes are used as they are, with no SASLprep (RFC 4013): an ASCII password is
-- the same either way, and PostgreSQL itself uses the raw bytes of a password that SASLprep
-- refuses; a non-ASCII password that SASLprep would change (non-ASCII spaces, characters
-- mapped to nothing, text not in NFKC form) is refused by the server.
-- @module moonserve.pg.auth
local bit = require "bit"
local crypto = require "moonserve.crypto"

local byte, char, sub, find, match, gsub, concat = string.byte, string.char, string.sub,
    string.find, string.match, string.gsub, table.concat
local bxor = bit.bxor
local type, tonumber, error, setmetatable = type, tonumber, error, setmetatable

local _M = {}

-- RFC 7677 4: at least 4096 iterations. The upper bound keeps a hostile or broken server
-- from making one login compute for minutes on the loop (10,000,000 rounds take seconds).
_M.MIN_ITERATIONS = 4096
_M.MAX_ITERATIONS = 10000000

local NONCE_BYTES = 18 -- 24 base64 characters, as PostgreSQL's own client sends

local hex = crypto.hex

--- The answer to AuthenticationMD5Password: "md5" .. hex(md5(hex(md5(password .. user)) ..
-- salt)), where `salt` is the 4 bytes the server sent.
function _M.md5(user, password, salt)
    if type(user) ~= "string" or type(password) ~= "string" then
        error("bad user or password (strings expected)", 2)
    end
    if type(salt) ~= "string" or #salt ~= 4 then
        error("bad salt (4-byte string expected)", 2)
    end
    return "md5" .. hex(crypto.md5(hex(crypto.md5(password .. user)) .. salt))
end

-- -- base64 (RFC 4648 4, with padding), as SCRAM writes it -------------------------------

local function b64(s)
    local e = gsub(gsub(crypto.base64url_encode(s), "-", "+"), "_", "/")
    return e .. ("="):rep((4 - #e % 4) % 4)
end

-- Strict: a length that is a multiple of 4, only the alphabet, padding only at the end, and
-- unused bits zero (crypto.base64url_decode checks those).
local function unb64(s)
    if #s % 4 ~= 0 or not find(s, "^[A-Za-z0-9+/]*=?=?$") then
        return nil
    end
    return (crypto.base64url_decode((gsub(gsub(gsub(s, "=+$", ""), "%+", "-"), "/", "_"))))
end

local function xor(a, b)
    local out = {}
    for i = 1, #a do
        out[i] = char(bxor(byte(a, i), byte(b, i)))
    end
    return concat(out)
end

-- RFC 5802 5.1: a user name escapes "," and "=".
local function saslname(s)
    return (gsub(s, "[,=]", { [","] = "=2C", ["="] = "=3D" }))
end

-- -- SCRAM-SHA-256 -------------------------------------------------------------------------

local Scram = {}
Scram.__index = Scram

--- A SCRAM-SHA-256 exchange for `password`. Call first(), final(server_first) and
-- verify(server_final), in that order. The user name is sent empty: PostgreSQL takes it
-- from the startup message.
-- `test_only` is for the specs only: { nonce =, user = } to replay RFC 7677's example.
-- @usage local sc = auth.scram(pw); send(sc:first()); send(assert(sc:final(reply)))
function _M.scram(password, test_only)
    if type(password) ~= "string" then
        error("bad password (string expected)", 2)
    end
    local nonce, user = test_only and test_only.nonce, test_only and test_only.user or ""
    if not nonce then
        local bytes, err = crypto.random(NONCE_BYTES)
        if not bytes then
            error("SCRAM nonce: " .. err, 2)
        end
        nonce = b64(bytes) -- base64 never holds ",", which ends an attribute
    end
    return setmetatable({ password = password, nonce = nonce,
        first_bare = "n=" .. saslname(user) .. ",r=" .. nonce, state = "new" }, Scram)
end

--- The client-first-message (RFC 5802 7), with the GS2 header "n,,": no channel binding.
function Scram:first()
    if self.state ~= "new" then
        error("SCRAM: first() was already called", 2)
    end
    self.state = "first"
    return "n,," .. self.first_bare
end

local function fail(self, why)
    self.state = "failed"
    return nil, "SCRAM: " .. why
end

--- The client-final-message for the server-first-message, or nil and an error for one that
-- is malformed, a nonce that does not extend ours, a bad salt or an iteration count outside
-- MIN_ITERATIONS..MAX_ITERATIONS.
function Scram:final(server_first)
    if self.state ~= "first" then
        error("SCRAM: final() comes once, after first()", 2)
    end
    if type(server_first) ~= "string" then
        return fail(self, "bad server-first-message")
    end
    -- RFC 5802 7: server-first-message = [reserved-mext ","] nonce "," salt "," iteration-count
    -- ["," extensions]; a mandatory extension (m=) we do not know must fail the exchange.
    if sub(server_first, 1, 2) == "m=" then
        return fail(self, "the server asks for an extension (m=) this client does not know")
    end
    local r, s, i, rest = match(server_first, "^r=([^,]*),s=([^,]*),i=([^,]*)(.*)$")
    if not r or (rest ~= "" and sub(rest, 1, 1) ~= ",") then
        return fail(self, "bad server-first-message")
    end
    -- printable ASCII without ",", longer than ours and starting with it
    if #r <= #self.nonce or sub(r, 1, #self.nonce) ~= self.nonce
        or find(r, "[^\33-\43\45-\126]") then
        return fail(self, "the server's nonce does not extend the client's")
    end
    local salt = unb64(s)
    if not salt or salt == "" then
        return fail(self, "bad salt (not base64)")
    end
    if not find(i, "^[1-9]%d*$") or #i > 10 then
        return fail(self, "bad iteration count")
    end
    local iterations = tonumber(i)
    if iterations < _M.MIN_ITERATIONS then
        return fail(self, "iteration count " .. i .. " is below " .. _M.MIN_ITERATIONS)
    elseif iterations > _M.MAX_ITERATIONS then
        return fail(self, "iteration count " .. i .. " is above " .. _M.MAX_ITERATIONS)
    end
    local salted, err = crypto.pbkdf2_sha256(self.password, salt, iterations, 32)
    if not salted then
        return fail(self, err)
    end
    -- RFC 5802 3: ClientProof = ClientKey XOR HMAC(H(ClientKey), AuthMessage)
    local without_proof = "c=biws,r=" .. r -- biws: base64 of the GS2 header "n,,"
    local auth_message = self.first_bare .. "," .. server_first .. "," .. without_proof
    local client_key = crypto.hmac_sha256(salted, "Client Key")
    local signature = crypto.hmac_sha256(crypto.sha256(client_key), auth_message)
    self.server_signature = crypto.hmac_sha256(crypto.hmac_sha256(salted, "Server Key"),
        auth_message)
    self.state = "final"
    return without_proof .. ",p=" .. b64(xor(client_key, signature))
end

--- Checks the server-final-message: true when it proves the server knows the password, or
-- nil and an error (the server's e= error, a malformed message, a signature that differs).
function Scram:verify(server_final)
    if self.state ~= "final" then
        error("SCRAM: verify() comes once, after final()", 2)
    end
    self.state = "done"
    if type(server_final) ~= "string" then
        return nil, "SCRAM: bad server-final-message"
    end
    local e = match(server_final, "^e=([^,]*)")
    if e then
        return nil, "SCRAM: the server refused: " .. e
    end
    local v = match(server_final, "^v=([^,]*)")
    local got = v and unb64(v)
    if not got then
        return nil, "SCRAM: bad server-final-message"
    end
    -- constant time: the comparison must not tell how much of a forged signature was right
    if not crypto.equal(got, self.server_signature) then
        return nil, "SCRAM: the server's signature does not match"
    end
    return true
end

return _M
