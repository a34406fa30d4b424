-- hello_hook.lua: bench/apps/hello.lua with a certificate hook (app:ssl_certificate) that
-- chooses, by the name the client sent, the certificate BENCH_CERT / BENCH_KEY parsed at load:
-- what bench/tls_hook measures against the same app without it.
require "moonserve.ngx"
local ssl = require "ngx.ssl"
local app = dofile((os.getenv("MOONSERVE_SRC") or ".") .. "/bench/apps/hello.lua")

local function read(path)
    local f = assert(io.open(path, "rb"))
    local s = f:read("*a")
    f:close()
    return s
end

local chain = assert(ssl.parse_pem_cert(read(assert(os.getenv("BENCH_CERT")))))
local key = assert(ssl.parse_pem_priv_key(read(assert(os.getenv("BENCH_KEY")))))

app:ssl_certificate(function()
    if ssl.server_name() == "localhost" then
        assert(ssl.clear_certs())
        assert(ssl.set_cert(chain))
        assert(ssl.set_priv_key(key))
    end
end)

return app
