-- spec/lua/pg_auth_spec.lua: moonserve.pg.auth (md5, SCRAM-SHA-256) and the digests under it.
describe("moonserve.pg.auth", function()
    local auth = require "moonserve.pg.auth"
    local crypto = require "moonserve.crypto"

    local function hex(s)
        return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end))
    end

    -- RFC 7677 3: the example exchange, user "user", password "pencil".
    local NONCE = "rOprNGfwEbeRWgbNEkqO"
    local SERVER_NONCE = NONCE .. "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    local SERVER_FIRST = "r=" .. SERVER_NONCE .. ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    local CLIENT_FINAL = "c=biws,r=" .. SERVER_NONCE
        .. ",p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    local SERVER_FINAL = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="

    local function rfc()
        local sc = auth.scram("pencil", { nonce = NONCE, user = "user" })
        assert.equal("n,,n=user,r=" .. NONCE, sc:first())
        return sc
    end

    describe("digests", function()
        it("computes SHA-256 and MD5 of 'abc' as FIPS 180-2 and RFC 1321 say", function()
            assert.equal("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
                hex(crypto.sha256("abc")))
            assert.equal("900150983cd24fb0d6963f7d28e17f72", hex(crypto.md5("abc")))
            assert.equal("d41d8cd98f00b204e9800998ecf8427e", hex(crypto.md5("")))
        end)

        it("derives PBKDF2-HMAC-SHA256 keys", function()
            -- RFC 7914 11, the first PBKDF2-HMAC-SHA256 vector (64 bytes)
            assert.equal("55ac046e56e3089fec1691c22544b605f94185216dde0465e68b9d57c20dacbc"
                .. "49ca9cccf179b645991664b39d77ef317c71b845b1e30bd509112041d3a19783",
                hex(crypto.pbkdf2_sha256("passwd", "salt", 1, 64)))
            assert.equal("c5e478d59288c841aa530db6845c4c8d962893a001ce4e11a4963873aa98134a",
                hex(crypto.pbkdf2_sha256("password", "salt", 4096)))
        end)

        it("raises on misuse", function()
            assert.has_error(function() crypto.sha256(1) end)
            assert.has_error(function() crypto.pbkdf2_sha256("p", "s", 0) end)
            assert.has_error(function() crypto.pbkdf2_sha256("p", "s", 1.5) end)
            assert.has_error(function() crypto.pbkdf2_sha256("p", "s", 1, 0) end)
        end)
    end)

    describe("md5", function()
        it("answers as PostgreSQL expects", function()
            -- computed independently: md5(hex(md5("md5-secret" .. "md5_user")) .. salt)
            assert.equal("md5de5f430725caf68ade3b51e052e13b54",
                auth.md5("md5_user", "md5-secret", "\1\2\3\4"))
        end)

        it("raises on a salt that is not 4 bytes", function()
            assert.has_error(function() auth.md5("u", "p", "\1\2\3") end)
            assert.has_error(function() auth.md5("u", nil, "\1\2\3\4") end)
        end)
    end)

    describe("SCRAM-SHA-256", function()
        it("replays RFC 7677's example exchange", function()
            local sc = rfc()
            assert.equal(CLIENT_FINAL, sc:final(SERVER_FIRST))
            assert.is_true(sc:verify(SERVER_FINAL))
        end)

        it("sends an empty user name and a fresh base64 nonce of 24 characters", function()
            local a, b = auth.scram("pw"):first(), auth.scram("pw"):first()
            assert.matches("^n,,n=,r=[A-Za-z0-9+/]+$", a)
            assert.equal(24, #a:match("r=(.*)"))
            assert.not_equal(a, b)
        end)

        it("escapes ',' and '=' in a user name (RFC 5802 5.1)", function()
            local sc = auth.scram("pw", { nonce = "abc", user = "a,b=c" })
            assert.equal("n,,n=a=2Cb=3Dc,r=abc", sc:first())
        end)

        it("keeps the password's bytes as they are (no SASLprep)", function()
            local sc = auth.scram("p\195\164ss", { nonce = NONCE, user = "user" })
            sc:first()
            local other = auth.scram("pa\204\136ss", { nonce = NONCE, user = "user" })
            other:first()
            -- the same text in NFC and NFD gives two proofs: the bytes are not normalized
            assert.not_equal(sc:final(SERVER_FIRST), other:final(SERVER_FIRST))
        end)

        local refusals = {
            { "a nonce that does not start with ours",
                "r=XXXX" .. SERVER_NONCE .. ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096", "nonce" },
            { "a nonce equal to ours (the server added nothing)",
                "r=" .. NONCE .. ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096", "nonce" },
            { "a nonce with a character outside printable ASCII",
                "r=" .. NONCE .. "ab\1,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096", "nonce" },
            { "an iteration count below 4096",
                "r=" .. SERVER_NONCE .. ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4095", "below 4096" },
            { "an iteration count above 10,000,000",
                "r=" .. SERVER_NONCE .. ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=10000001", "above" },
            { "an absurd iteration count",
                "r=" .. SERVER_NONCE .. ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=99999999999999999999",
                "iteration count" },
            { "an iteration count that is not a number",
                "r=" .. SERVER_NONCE .. ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096x", "iteration" },
            { "a negative iteration count",
                "r=" .. SERVER_NONCE .. ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=-4096", "iteration" },
            { "a salt that is not base64",
                "r=" .. SERVER_NONCE .. ",s=W22ZaJ0SNY7s!EsUEjb6gQ==,i=4096", "salt" },
            { "a salt with a bad length", "r=" .. SERVER_NONCE .. ",s=W22ZaJ0,i=4096", "salt" },
            { "a salt with padding inside",
                "r=" .. SERVER_NONCE .. ",s=W2=ZaJ0SNY7soEsUEjb6gQ==,i=4096", "salt" },
            { "an empty salt", "r=" .. SERVER_NONCE .. ",s=,i=4096", "salt" },
            { "attributes out of order",
                "s=W22ZaJ0SNY7soEsUEjb6gQ==,r=" .. SERVER_NONCE .. ",i=4096", "server%-first" },
            { "a missing iteration count",
                "r=" .. SERVER_NONCE .. ",s=W22ZaJ0SNY7soEsUEjb6gQ==", "server%-first" },
            { "a mandatory extension",
                "m=x,r=" .. SERVER_NONCE .. ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096", "extension" },
            { "an empty message", "", "server%-first" },
        }
        for _, case in ipairs(refusals) do
            it("refuses " .. case[1], function()
                local sc = rfc()
                local msg, err = sc:final(case[2])
                assert.is_nil(msg)
                assert.matches(case[3], err)
            end)
        end

        it("refuses a large iteration count at once, without computing", function()
            local sc = rfc()
            local t = os.clock()
            assert.is_nil(sc:final("r=" .. SERVER_NONCE .. ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i="
                .. "2000000000"))
            assert.is_true(os.clock() - t < 0.1)
        end)

        it("accepts extensions after the iteration count", function()
            local sc = rfc()
            assert.matches("^c=biws,r=", sc:final(SERVER_FIRST .. ",x=ext"))
        end)

        local bad_finals = {
            { "a wrong server signature", "v=7rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
                "does not match" },
            { "a truncated signature", "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl9",
                "does not match" },
            { "a signature that is not base64", "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4",
                "bad server%-final" },
            { "an empty signature", "v=", "does not match" },
            { "a server error", "e=invalid-proof", "refused: invalid%-proof" },
            { "a message without v=", "x=1", "bad server%-final" },
        }
        for _, case in ipairs(bad_finals) do
            it("refuses " .. case[1] .. " in the server-final-message", function()
                local sc = rfc()
                assert(sc:final(SERVER_FIRST))
                local ok, err = sc:verify(case[2])
                assert.is_nil(ok)
                assert.matches(case[3], err)
            end)
        end

        it("raises when its steps are called out of order", function()
            local sc = auth.scram("pw")
            assert.has_error(function() sc:final(SERVER_FIRST) end)
            assert.has_error(function() sc:verify(SERVER_FINAL) end)
            sc:first()
            assert.has_error(function() sc:first() end)
            assert.has_error(function() sc:verify(SERVER_FINAL) end)
            assert.has_error(function() auth.scram(nil) end)
        end)

        it("does not verify after a refused server-first-message", function()
            local sc = rfc()
            assert.is_nil(sc:final("r=x,s=y,i=1"))
            assert.has_error(function() sc:verify(SERVER_FINAL) end)
        end)
    end)
end)
