-- moonserve/ngx/ssl.lua: OpenResty's ngx.ssl over the core's host (moonserve/host/core/tls_hook.lua):
-- the conversions anywhere, and in a certificate hook (app:ssl_certificate, where
-- OpenResty has ssl_certificate_by_lua) what chooses this handshake's certificate.
local ffi = require "ffi"
local hook = require "moonserve.host.core.tls_hook"

pcall(ffi.cdef, "int inet_pton(int af, const char *src, void *dst);") -- (declared once)

local _M = {
    version = "0.1.25",
    SSL3_VERSION = 0x0300, TLS1_VERSION = 0x0301, TLS1_1_VERSION = 0x0302,
    TLS1_2_VERSION = 0x0303, TLS1_3_VERSION = 0x0304,
    server_name = hook.server_name,
    clear_certs = hook.clear_certs,
    set_der_cert = hook.set_der_cert,
    set_der_priv_key = hook.set_der_priv_key,
    set_cert = hook.set_cert,
    set_priv_key = hook.set_priv_key,
    cert_pem_to_der = hook.cert_pem_to_der,
    priv_key_pem_to_der = hook.priv_key_pem_to_der,
    parse_pem_cert = hook.parse_pem_cert,
    parse_pem_priv_key = hook.parse_pem_priv_key,
    get_tls1_version = hook.version,
}

local names = { [0x0300] = "SSLv3", [0x0301] = "TLSv1", [0x0302] = "TLSv1.1",
    [0x0303] = "TLSv1.2", [0x0304] = "TLSv1.3" }

function _M.get_tls1_version_str()
    local v, err = hook.version()
    if not v then
        return nil, err
    end
    return names[v] or nil, names[v] == nil and "unknown version" or nil
end

local addr = ffi.new("uint8_t[16]")

-- The client's address as bytes (4 or 16) and its family, "inet" or "inet6"; "unix" with the
-- path for a unix socket.
function _M.raw_client_addr()
    local text, err = hook.peer()
    if not text then
        return nil, err
    end
    local v6 = text:match("^%[(.-)%]")
    if v6 or (text:find(":", 1, true) and not text:match("^%d+%.%d+%.%d+%.%d+")) then
        v6 = v6 or text
        if ffi.C.inet_pton(10, v6, addr) == 1 then
            return ffi.string(addr, 16), "inet6"
        end
    end
    local v4 = text:match("^(%d+%.%d+%.%d+%.%d+)")
    if v4 and ffi.C.inet_pton(2, v4, addr) == 1 then
        return ffi.string(addr, 4), "inet"
    end
    return text, "unix"
end

return _M
