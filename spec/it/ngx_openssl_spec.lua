-- spec/it/ngx_openssl_spec.lua: OpenSSL and nginx's own C functions through ffi.C in a
-- moonserve worker, as OpenResty libraries call them inside nginx: Debian's lua-nginx-string
-- unchanged (digests, random bytes, AES, to_hex, atoi), every OpenSSL function that
-- lua-resty-string, lua-resty-hmac, lua-resty-openssl and lua-resty-jwt declare
-- (spec/fixtures/openssl_ffi_names.txt), and ngx_hex_dump, ngx_atoi and nginx's base64
-- functions answering as Debian's nginx does on the same inputs.
local helper = require "helper"

local function get(port, path)
    local res = assert(helper.request(port, "GET " .. path
        .. " HTTP/1.1\r\nHost: openssl.test\r\nConnection: close\r\n\r\n"))
    return res
end

describe("OpenSSL and nginx's C functions through ffi.C", function()
    local srv

    setup(function()
        helper.tool("nginx.string")
        srv = helper.spawn_server { app = "spec/fixtures/ngx_openssl.lua", args = "--workers 1" }
    end)

    teardown(function()
        if srv then srv:stop() end
    end)

    it("runs lua-resty-string's digests and to_hex, loaded at the app file's top level",
        function()
            local res = get(srv.port, "/digest?s=abc")
            assert.equal(200, res.status, srv:log())
            -- FIPS 180 and RFC 1321's values for "abc".
            assert.equal("md5 900150983cd24fb0d6963f7d28e17f72\n"
                .. "sha1 a9993e364706816aba3e25717850c26c9cd0d89d\n"
                .. "sha224 23097d223405d8228642a477bda255b32aadbce4bda0b3f7e36c9da7\n"
                .. "sha256 ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n"
                .. "sha384 cb00753f45a35e8bb5a03d699ac65007272c32ab0eded1631a8b605a43ff5bed"
                .. "8086072ba1e7cc2358baeca134c825a7\n"
                .. "sha512 ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a"
                .. "2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f\n"
                .. "atoi -1\n", res.body)
            assert.matches("atoi 2024\n$", get(srv.port, "/digest?s=2024").body)
        end)

    it("gives random bytes, strong and not", function()
        local res = get(srv.port, "/random")
        assert.equal(200, res.status, srv:log())
        assert.equal("16 32 true\n16 32 true\n", res.body)
    end)

    it("encrypts with resty.aes as the openssl command does, and decrypts", function()
        local res = get(srv.port, "/aes?s=hello")
        assert.equal(200, res.status, srv:log())
        local want = helper.sh("printf hello | " .. helper.tool("openssl")
            .. " enc -aes-128-cbc -nosalt -md md5 -pass pass:secret 2>/dev/null | "
            .. helper.tool("od") .. " -An -tx1 | " .. helper.tool("tr") .. " -d ' \\n'")
        assert.equal(32, #want)
        assert.equal(want .. " hello\n", res.body)
    end)

    it("finds every OpenSSL function the libraries declare, and not those OpenSSL 3 lacks",
        function()
            -- A server of its own: the look-up declares what no library here has declared.
            local names = helper.spawn_server { app = "spec/fixtures/ngx_openssl.lua",
                args = "--workers 1" }
            local res = get(names.port, "/names")
            names:stop()
            assert.equal(200, res.status)
            local sections = 0
            for line in res.body:gmatch("[^\n]+") do
                sections = sections + 1
                assert.matches("^lua%-resty%-[%w%-]+ [%w.]+[ %a]*: %d+ names, wrong: $", line)
            end
            assert.equal(8, sections)
            assert.matches("lua%-resty%-openssl 1%.9%.0: 5%d%d names", res.body)
        end)

    describe("answers as nginx does", function()
        local nginx
        setup(function()
            nginx = helper.nginx_lua [[
    server {
        listen 127.0.0.1:%d;
        location /cfunc/ {
            content_by_lua_block { require("ngx_cfunc_cases")[ngx.var.uri:match("[^/]+$")]() }
        }
    }]]
        end)
        teardown(function()
            if nginx then nginx.stop() end
        end)

        for _, name in ipairs { "hex_dump", "atoi", "encode_base64", "encode_base64url",
            "decode_base64", "decode_base64url" } do
            it("ngx_" .. name, function()
                local want = get(nginx.port, "/cfunc/" .. name)
                local got = get(srv.port, "/cfunc/" .. name)
                assert.equal(200, want.status, nginx.log())
                assert.equal(200, got.status, srv:log())
                assert.equal(want.body, got.body)
            end)
        end

        it("with the values nginx documents", function()
            local function has(path, line)
                local body = get(srv.port, "/cfunc/" .. path).body
                assert.truthy(("\n" .. body):find("\n" .. line .. "\n", 1, true), body)
            end
            has("hex_dump", "8 00010f107f80feff 16")
            has("atoi", '"123" 123LL')
            has("atoi", '"-1" -1LL')
            has("encode_base64", "666f6f626172 Zm9vYmFy 8")
            has("encode_base64", "66 Zg== 4")
            has("encode_base64url", "66 Zg 2")
            has("encode_base64url", "fbff -_8 3")
            has("decode_base64", '"Zg==" 0 66')
            has("decode_base64", '"Z" -1')
            has("decode_base64url", '"__8" 0 ffff')
        end)
    end)
end)
