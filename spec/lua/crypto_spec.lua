describe("moonserve.crypto", function()
    local crypto = require "moonserve.crypto"

    local function hex(s)
        return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end))
    end

    local function flip(s, i)
        return s:sub(1, i - 1) .. string.char(require("bit").bxor(s:byte(i), 1)) .. s:sub(i + 1)
    end

    it("computes HMAC-SHA256 as RFC 4231 test case 2 says", function()
        assert.equal("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            hex(crypto.hmac_sha256("Jefe", "what do ya want for nothing?")))
    end)

    it("computes HMAC-SHA256 with a key longer than a block, as RFC 4231 test case 6 says",
        function()
            assert.equal("60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
                hex(crypto.hmac_sha256(string.rep("\170", 131),
                    "Test Using Larger Than Block-Size Key - Hash Key First")))
        end)

    it("writes bytes as lowercase hex, two digits each", function()
        assert.equal("", crypto.hex(""))
        assert.equal("00ff0a41", crypto.hex("\0\255\n\65"))
        local all = {}
        for i = 0, 255 do
            all[#all + 1] = string.char(i)
        end
        all = table.concat(all)
        assert.equal(hex(all), crypto.hex(all))
        assert.has_error(function() crypto.hex(5) end)
    end)

    it("returns as many random bytes as asked, different each time", function()
        assert.equal(32, #crypto.random(32))
        assert.equal("", crypto.random(0))
        assert.not_equal(crypto.random(16), crypto.random(16))
    end)

    it("raises on a byte count that is not a non-negative integer", function()
        assert.has_error(function() crypto.random(-1) end)
        assert.has_error(function() crypto.random(1.5) end)
        assert.has_error(function() crypto.random("8") end)
    end)

    it("compares strings for equality", function()
        assert.is_true(crypto.equal("", ""))
        assert.is_true(crypto.equal("abc\0d", "abc\0d"))
        assert.is_false(crypto.equal("abc\0d", "abc\0e"))
        assert.is_false(crypto.equal("abc", "abcd"))
        assert.has_error(function() crypto.equal("a", nil) end)
    end)

    describe("AES-256-GCM", function()
        local key = crypto.random(32)

        it("decrypts what it encrypted, with and without aad", function()
            for _, plain in ipairs({ "", "x", "hello world", string.rep("\0\255", 5000) }) do
                assert.equal(plain, crypto.aes256gcm_decrypt(key,
                    crypto.aes256gcm_encrypt(key, plain, "aad"), "aad"))
                assert.equal(plain, crypto.aes256gcm_decrypt(key,
                    crypto.aes256gcm_encrypt(key, plain)))
            end
        end)

        it("lays out a blob as nonce, ciphertext and tag", function()
            local blob = crypto.aes256gcm_encrypt(key, "hello")
            assert.equal(12 + 5 + 16, #blob)
            assert.not_matches("hello", blob, 1, true)
        end)

        it("uses a fresh nonce each time, so equal plaintexts give different blobs", function()
            local a = crypto.aes256gcm_encrypt(key, "same")
            local b = crypto.aes256gcm_encrypt(key, "same")
            assert.not_equal(a:sub(1, 12), b:sub(1, 12))
            assert.not_equal(a, b)
        end)

        it("refuses a blob with any one byte flipped", function()
            local blob = crypto.aes256gcm_encrypt(key, "attack at dawn", "aad")
            for i = 1, #blob do
                local plain, err = crypto.aes256gcm_decrypt(key, flip(blob, i), "aad")
                assert.is_nil(plain)
                assert.equal("authentication failed", err)
            end
        end)

        it("refuses a truncated or extended blob", function()
            local blob = crypto.aes256gcm_encrypt(key, "attack at dawn")
            for n = 0, #blob - 1 do
                assert.is_nil(crypto.aes256gcm_decrypt(key, blob:sub(1, n)))
            end
            assert.is_nil(crypto.aes256gcm_decrypt(key, blob .. "\0"))
        end)

        it("refuses the wrong key or the wrong aad", function()
            local blob = crypto.aes256gcm_encrypt(key, "attack at dawn", "cookie-a")
            local plain, err = crypto.aes256gcm_decrypt(crypto.random(32), blob, "cookie-a")
            assert.is_nil(plain)
            assert.equal("authentication failed", err)
            assert.is_nil(crypto.aes256gcm_decrypt(key, blob, "cookie-b"))
            assert.is_nil(crypto.aes256gcm_decrypt(key, blob))
        end)

        it("raises on a key that is not 32 bytes", function()
            assert.has_error(function() crypto.aes256gcm_encrypt("short", "x") end)
            assert.has_error(function() crypto.aes256gcm_decrypt(string.rep("k", 33), "x") end)
            assert.has_error(function() crypto.aes256gcm_encrypt(key, nil) end)
        end)
    end)

    describe("base64url", function()
        it("encodes the RFC 4648 test vectors, without padding", function()
            local vectors = { [""] = "", f = "Zg", fo = "Zm8", foo = "Zm9v", foob = "Zm9vYg",
                fooba = "Zm9vYmE", foobar = "Zm9vYmFy" }
            for plain, encoded in pairs(vectors) do
                assert.equal(encoded, crypto.base64url_encode(plain))
                assert.equal(plain, crypto.base64url_decode(encoded))
            end
        end)

        it("uses - and _ where base64 has + and /", function()
            assert.equal("-_-_", crypto.base64url_encode("\251\255\191"))
            assert.equal("\251\255\191", crypto.base64url_decode("-_-_"))
        end)

        it("round-trips every byte value and every length up to 64", function()
            local all = {}
            for i = 0, 255 do
                all[#all + 1] = string.char(i)
            end
            all = table.concat(all)
            assert.equal(all, crypto.base64url_decode(crypto.base64url_encode(all)))
            for n = 0, 64 do
                local s = crypto.random(n)
                assert.equal(s, crypto.base64url_decode(crypto.base64url_encode(s)))
            end
        end)

        it("refuses padding, foreign characters and impossible lengths", function()
            for _, bad in ipairs({ "Zg==", "Zm9v\n", "Zm+v", "Zm/v", "Z", "Zm9vY", "Zm 9" }) do
                local s, err = crypto.base64url_decode(bad)
                assert.is_nil(s, bad)
                assert.is_string(err)
            end
        end)

        it("refuses an encoding whose unused bits are not zero", function()
            -- "Zh" and "Zm9" carry bits past the last byte: only "Zg" and "Zm8" are canonical.
            assert.is_nil(crypto.base64url_decode("Zh"))
            assert.is_nil(crypto.base64url_decode("Zm9"))
        end)
    end)
end)
