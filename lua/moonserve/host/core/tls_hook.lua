-- moonserve/host/core/tls_hook.lua: the certificate hook of TLS handshakes (app:ssl_certificate) in the
-- core's host: runs the app's hook for each handshake the core pauses (core/transport/tls.c's
-- ms_tls_hook_*), and what the hook may do to its handshake (server_name, set_der_cert ...),
-- with the certificate and key conversions that work anywhere. The ngx layer's ngx.ssl is
-- these under OpenResty's names.
local ffi = require "ffi"
local base = require "moonserve.host.core.base"
local dispatcher = require "moonserve.host.core.dispatcher"

local C = base.C
local traceback = debug.traceback

if not pcall(ffi.typeof, "ms_tls_hook_t") then
    ffi.cdef [[
typedef struct ms_tls_hook_s ms_tls_hook_t;
const char *ms_ffi_tls_error(void);
long ms_ffi_tls_cert_pem_to_der(const char *pem, size_t len, unsigned char *out, size_t cap);
long ms_ffi_tls_key_pem_to_der(const char *pem, size_t len, unsigned char *out, size_t cap);
void *ms_ffi_tls_parse_chain(const char *pem, size_t len);
void *ms_ffi_tls_parse_key(const char *pem, size_t len);
void ms_ffi_tls_chain_free(void *chain);
void ms_ffi_tls_key_free(void *key);
ms_tls_hook_t *ms_ffi_tls_hook_next(ms_server_t *s);
void ms_ffi_tls_hook_done(ms_tls_hook_t *h, int ok);
int ms_ffi_tls_hook_server_name(ms_tls_hook_t *h, char *buf, size_t len);
int ms_ffi_tls_hook_peer(ms_tls_hook_t *h, char *buf, size_t len);
int ms_ffi_tls_hook_version(ms_tls_hook_t *h);
int ms_ffi_tls_hook_clear_certs(ms_tls_hook_t *h);
int ms_ffi_tls_hook_set_der_cert(ms_tls_hook_t *h, const unsigned char *der, size_t len);
int ms_ffi_tls_hook_set_der_key(ms_tls_hook_t *h, const unsigned char *der, size_t len);
int ms_ffi_tls_hook_set_chain(ms_tls_hook_t *h, void *chain);
int ms_ffi_tls_hook_set_key(ms_tls_hook_t *h, void *key);
]]
end

local _M = {}

local function err()
    return nil, ffi.string(C.ms_ffi_tls_error())
end

-- -- Running the hook ---------------------------------------------------------------------

-- The slot the core wakes for each handshake of `srv` (core.server) that waits for `fn`;
-- one for the server, made at its first TLS settings.
local slots = setmetatable({}, { __mode = "k" })

function _M.slot(srv, fn)
    local s = slots[srv]
    if s then
        s.fn = fn
        return s.slot
    end
    local ptr = ffi.cast("ms_server_t *", srv:pointer())
    s = { fn = fn }
    -- Each wake: every handshake waiting, its hook run in a task of its own (waits work;
    -- the handshake goes on when it returns).
    function s._wake()
        while true do
            local h = C.ms_ffi_tls_hook_next(ptr)
            if h == nil then
                return
            end
            local st = { tls_hook = h }
            dispatcher.run_as("ssl_certificate", st, function()
                local ok, e = xpcall(s.fn, traceback)
                st.tls_hook = nil
                if not ok then
                    base.log(base.LOG_ERR, "ssl_certificate hook failed: " .. tostring(e))
                end
                C.ms_ffi_tls_hook_done(h, ok and 1 or 0)
            end)
        end
    end
    s.slot = dispatcher.slot_for(s)
    slots[srv] = s
    return s.slot
end

-- The handshake of the running hook (also from its light threads), or nil.
local function current()
    local root, kind = dispatcher.context()
    local st = kind == "hook" and root and root.ngx
    return st and st.tls_hook or nil
end

-- Whether code runs in a certificate hook.
function _M.in_hook()
    return current() ~= nil
end

local function hook()
    local h = current()
    if h == nil then
        return nil, "not in a certificate hook (app:ssl_certificate)"
    end
    return h
end

-- -- What a hook does ---------------------------------------------------------------------

local namebuf = ffi.new("char[256]")

-- fn(h, ...) on the running hook's handshake h: its result (0 or more), or nil, err outside
-- a hook or when it fails (the core's negative answer).
local function call(fn, ...)
    local h, e = hook()
    if not h then
        return nil, e
    end
    local n = fn(h, ...)
    if n < 0 then
        return err()
    end
    return n
end

-- The same for what changes the handshake: true, or nil, err.
local function change(fn, ...)
    local n, e = call(fn, ...)
    return n and true, e
end

-- The server name the client sent (SNI), or nil for none; nil, err outside a hook.
function _M.server_name()
    local n, e = call(C.ms_ffi_tls_hook_server_name, namebuf, 256)
    if not n then
        return nil, e
    end
    return n > 0 and ffi.string(namebuf, n) or nil
end

-- The client's address as text ("127.0.0.1:5000", "[::1]:5000").
function _M.peer()
    local n, e = call(C.ms_ffi_tls_hook_peer, namebuf, 256)
    if not n then
        return nil, e
    end
    return ffi.string(namebuf, n)
end

-- The protocol version being agreed: 0x0303 for TLS 1.2, 0x0304 for TLS 1.3.
function _M.version()
    return call(C.ms_ffi_tls_hook_version)
end

-- Drops the certificates and key the handshake would send (the listener's).
function _M.clear_certs()
    return change(C.ms_ffi_tls_hook_clear_certs)
end

-- fn(der, #der) for a DER string.
local function set_der(fn, der)
    if type(der) ~= "string" then
        return nil, "a string expected"
    end
    return change(fn, der, #der)
end

-- fn(v) for what parse_pem_cert or parse_pem_priv_key made (`what` names it).
local function set_parsed(fn, v, what)
    if type(v) ~= "cdata" then
        return nil, "a parsed " .. what .. " expected"
    end
    return change(fn, v)
end

-- The leaf and its chain, DER one after another (cert_pem_to_der's form).
function _M.set_der_cert(der)
    return set_der(C.ms_ffi_tls_hook_set_der_cert, der)
end

function _M.set_der_priv_key(der)
    return set_der(C.ms_ffi_tls_hook_set_der_key, der)
end

-- A chain parsed by parse_pem_cert, a key by parse_pem_priv_key.
function _M.set_cert(chain)
    return set_parsed(C.ms_ffi_tls_hook_set_chain, chain, "certificate chain")
end

function _M.set_priv_key(key)
    return set_parsed(C.ms_ffi_tls_hook_set_key, key, "private key")
end

-- -- Conversions (anywhere) ---------------------------------------------------------------

local function to_der(fn, pem)
    if type(pem) ~= "string" then
        return nil, "a string expected"
    end
    local cap = #pem -- (DER is shorter than its base64; else the length it needs comes back)
    local out = ffi.new("unsigned char[?]", cap)
    local n = tonumber(fn(pem, #pem, out, cap))
    if n > cap then
        cap = n
        out = ffi.new("unsigned char[?]", cap)
        n = tonumber(fn(pem, #pem, out, cap))
    end
    if n < 0 then
        return err()
    end
    return ffi.string(out, n)
end

function _M.cert_pem_to_der(pem)
    return to_der(C.ms_ffi_tls_cert_pem_to_der, pem)
end

function _M.priv_key_pem_to_der(pem)
    return to_der(C.ms_ffi_tls_key_pem_to_der, pem)
end

-- The chain as an opaque cdata for set_cert, freed by the collector.
function _M.parse_pem_cert(pem)
    if type(pem) ~= "string" then
        return nil, "a string expected"
    end
    local p = C.ms_ffi_tls_parse_chain(pem, #pem)
    if p == nil then
        return err()
    end
    return ffi.gc(p, C.ms_ffi_tls_chain_free)
end

function _M.parse_pem_priv_key(pem)
    if type(pem) ~= "string" then
        return nil, "a string expected"
    end
    local p = C.ms_ffi_tls_parse_key(pem, #pem)
    if p == nil then
        return err()
    end
    return ffi.gc(p, C.ms_ffi_tls_key_free)
end

return _M
