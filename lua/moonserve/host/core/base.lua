-- moonserve/host/core/base.lua: the core's FFI binding: finds the core, declares its FFI surface once and
-- checks it. Only the core's host uses it (dispatcher, server, request, response, host.lua's
-- core_host); the framework reaches the host through moonserve/host/init.lua.
local ffi = require "ffi"

local _M = {}

-- `require` loads C modules with RTLD_LOCAL, so ffi.C cannot see them: load the same file
-- again through the FFI (dlopen hands back the same handle).
-- MOONSERVE_CORE names a core module to use instead of the installed one (a build tree).
local dev = os.getenv("MOONSERVE_CORE")
if dev and dev ~= "" and not package.loaded["moonserve.core"] then
    package.preload["moonserve.core"] = assert(package.loadlib(dev, "luaopen_moonserve_core"))
end
local core = require "moonserve.core"
_M.core = core
_M.C = ffi.load(core.path or assert(package.searchpath("moonserve.core", package.cpath)))

if not pcall(ffi.typeof, "ms_req_view_t") then
    ffi.cdef [[
typedef struct ms_str_s { const char *base; size_t len; } ms_str_t;
typedef struct ms_header_s { ms_str_t name, value; } ms_header_t;
typedef struct ms_req_view_s {
    ms_str_t method, target, path, query;
    uint32_t id;
    uint16_t version;
    uint16_t status;
    int32_t handler;
    int32_t wait;
    int32_t nheaders;
    uint32_t flags;
    int64_t content_length;
} ms_req_view_t;
typedef struct ms_server_s ms_server_t;
extern ms_req_view_t *ms_ffi_current;
extern ms_server_t *ms_ffi_server;
int ms_ffi_wake_after(ms_server_t *s, int32_t slot, double seconds, int status);
void ms_ffi_wake_cancel(ms_server_t *s, int32_t slot);
ms_server_t *ms_ffi_req_server(ms_req_view_t *r);

const char *ms_ffi_req_header(ms_req_view_t *r, const char *name, size_t len, size_t *vlen);
int ms_ffi_req_headers(ms_req_view_t *r, ms_header_t *out, int n);
int ms_ffi_req_trailers(ms_req_view_t *r, ms_header_t *out, int n);
int ms_ffi_path_plain(const char *p, size_t n);
int ms_ffi_url_check(const char *p, size_t n);
int ms_ffi_req_client_ip(ms_req_view_t *r, char *buf, size_t len);
int ms_ffi_req_address(ms_req_view_t *r, int local, char *buf, size_t len);
int ms_ffi_res_header(ms_req_view_t *r, const char *name, size_t nlen, const char *value, size_t vlen);
int ms_ffi_res_reset(ms_req_view_t *r);
int ms_ffi_res_trailer(ms_req_view_t *r, const char *name, size_t nlen, const char *value, size_t vlen);
int ms_ffi_res_fields(ms_req_view_t *r, const char *lines, size_t len);
int ms_ffi_res_fields_checked(ms_req_view_t *r, const char *lines, size_t len);
int ms_ffi_fields_check(const char *lines, size_t len);
int ms_ffi_req_peer_trusted(ms_req_view_t *r);
int ms_ffi_req_refused(ms_req_view_t *r);
int ms_ffi_req_tls(ms_req_view_t *r, char *buf, size_t len);
int ms_ffi_req_id(ms_req_view_t *r, char *buf, size_t len);
void ms_ffi_req_access(ms_req_view_t *r, int log, const char *route, size_t len);
void ms_ffi_req_metric(ms_req_view_t *r, uint32_t ix);
int ms_ffi_res_send(ms_req_view_t *r, const char *body, size_t len, int text);
int ms_ffi_res_begin(ms_req_view_t *r, double total, int text);
int ms_ffi_res_piece(ms_req_view_t *r, const char *p, size_t len);
int ms_ffi_res_end(ms_req_view_t *r);
int ms_ffi_res_close(ms_req_view_t *r);
int ms_ffi_res_write(ms_req_view_t *r, const char *chunk, size_t len, int text);
int ms_ffi_res_congested(ms_req_view_t *r);
int ms_ffi_anchor_drain(ms_req_view_t *r, int32_t *out, int n);
int64_t ms_ffi_req_body_take(ms_req_view_t *r, const char **out);
int ms_ffi_req_wait_body(ms_req_view_t *r);
int ms_ffi_req_body_limit(ms_req_view_t *r, double bytes);
extern volatile uint32_t ms_ffi_resume;
extern volatile uint32_t ms_ffi_budget_ms;
extern volatile int ms_ffi_stop;
int ms_ffi_stop_settle(void);
const char *ms_ffi_stop_where(void);
int ms_ffi_req_sleep(ms_req_view_t *r, double seconds);
int ms_ffi_req_wait_drain(ms_req_view_t *r, int all);
void ms_ffi_req_park(ms_req_view_t *r);
void ms_ffi_req_finish(ms_req_view_t *r);
void ms_ffi_req_fail(ms_req_view_t *r);
const char *ms_ffi_err_name(int err);
const char *ms_ffi_strerror(int err);
void ms_ffi_log(int level, const char *msg, size_t len);
int ms_ffi_static_serve(ms_req_view_t *r, int id);
int ms_ffi_static_file(ms_req_view_t *r, const char *path, size_t len, int typed);
double ms_ffi_static_generation(ms_req_view_t *r);
int ms_ffi_server_stopping(ms_req_view_t *r);
]]
end

local C = _M.C
local ffi_string = ffi.string
local format, ipairs, pairs, tostring = string.format, ipairs, pairs, tostring

-- -- The boundary, checked -------------------------------------------------------------
-- The core exports what this file must agree with (modules/ms_ffi.c, ms_ffi_abi): the
-- layout of the types declared above, the request flags, wait states, error codes and log
-- levels. The layouts are checked against the cdef here, and the constants are taken from
-- the core, so a core and a framework from different builds fail at load with a message
-- instead of reading the wrong bytes of a request.
if not pcall(ffi.typeof, "ms_ffi_abi_t") then
    ffi.cdef [[
typedef struct ms_ffi_abi_s { const char *name; int64_t value; } ms_ffi_abi_t;
const ms_ffi_abi_t *ms_ffi_abi(int *n);
]]
end

-- The fields of each mirrored type that Lua reads, in order.
local LAYOUT = {
    { "ms_str_t", { "base", "len" } },
    { "ms_header_t", { "name", "value" } },
    { "ms_req_view_t", { "method", "target", "path", "query", "id", "version", "status",
        "handler", "wait", "nheaders", "flags", "content_length" } },
}

-- The constants taken from the core, by the name they have here (MS_ dropped).
local CONSTANTS = {
    "REQ_HEAD_SENT", "REQ_DONE", "REQ_ABORTED", "REQ_BODY_DONE", "REQ_HAS_BODY", "REQ_EXPECT",
    "REQ_CHUNKED_OUT", "REQ_IS_HEAD", "REQ_CLOSE", "REQ_PARKED", "REQ_IN_HANDLER",
    "REQ_BODY_ERROR", "REQ_STATIC_DIR", "REQ_METRICS", "REQ_PEER_EOF",
    "WAIT_NONE", "WAIT_BODY", "WAIT_TIMER", "WAIT_DRAIN",
    "LOG_ERR", "LOG_WARN", "LOG_INFO", "LOG_DEBUG",
    "EAGAIN", -- libuv's, which is the platform's errno negated: "nothing yet, wait"
    "EBADREQ", "EBADHEADER", "ERESERVED", "ESENT", "ECLOSED", "ETOOBIG", "EBUSY", "ESTATE",
}

local function disagree(what, in_core, here)
    error(format("moonserve.core and lua/moonserve/host/core/base.lua disagree on %s (core: %s, Lua: %s):"
        .. " rebuild/reinstall them together", what, tostring(in_core), tostring(here)), 0)
end

-- The core's table as { name = value }; a core too old to have one is a mismatch too.
local function read_abi()
    local n = ffi.new("int[1]")
    local ok, p = pcall(function() return C.ms_ffi_abi(n) end)
    if not ok then
        disagree("ms_ffi_abi", "missing", "required")
    end
    local t = {}
    for i = 0, n[0] - 1 do
        t[ffi_string(p[i].name)] = tonumber(p[i].value)
    end
    return t
end

-- Checks `abi` (the core's table, or one a test makes) against this file's cdef and
-- constants; raises with the first disagreement. Returns the constants, by name.
function _M.check_abi(abi)
    for _, ty in ipairs(LAYOUT) do
        local name, fields = ty[1], ty[2]
        local what = "sizeof(" .. name .. ")"
        if abi[what] ~= ffi.sizeof(name) then
            disagree(what, abi[what], ffi.sizeof(name))
        end
        for _, f in ipairs(fields) do
            what = "offsetof(" .. name .. ", " .. f .. ")"
            local here = ffi.offsetof(name, f)
            if abi[what] ~= here then
                disagree(what, abi[what], here)
            end
        end
    end
    local k = {}
    for _, name in ipairs(CONSTANTS) do
        if abi[name] == nil then
            disagree(name, "missing", "required")
        end
        k[name] = abi[name]
    end
    return k
end

_M.abi = read_abi()
for name, v in pairs(_M.check_abi(_M.abi)) do
    _M[name] = v
end

-- nil, "ENAME: message", "ENAME" for a negative core code: the Lua failure convention.
function _M.fail(code)
    local name = ffi_string(C.ms_ffi_err_name(code))
    return nil, name .. ": " .. ffi_string(C.ms_ffi_strerror(code)), name
end

function _M.log(level, msg)
    C.ms_ffi_log(level, msg, #msg)
end

local ok, new_tab = pcall(require, "table.new")
_M.new_tab = ok and new_tab or function() return {} end

-- Lua strings the core still writes from, by anchor slot; see core/moonserve.h.
_M.anchors = {}

return _M
