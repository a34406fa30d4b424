-- moonserve/base.lua: finds the core, declares its FFI surface once, and shared helpers.
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

const char *ms_ffi_req_header(ms_req_view_t *r, const char *name, size_t len, size_t *vlen);
int ms_ffi_req_headers(ms_req_view_t *r, ms_header_t *out, int n);
int ms_ffi_req_trailers(ms_req_view_t *r, ms_header_t *out, int n);
int ms_ffi_path_plain(const char *p, size_t n);
int ms_ffi_url_plain(const char *p, size_t n);
int ms_ffi_req_client_ip(ms_req_view_t *r, char *buf, size_t len);
int ms_ffi_res_header(ms_req_view_t *r, const char *name, size_t nlen, const char *value, size_t vlen);
int ms_ffi_res_reset(ms_req_view_t *r);
int ms_ffi_res_trailer(ms_req_view_t *r, const char *name, size_t nlen, const char *value, size_t vlen);
int ms_ffi_res_fields(ms_req_view_t *r, const char *lines, size_t len);
int ms_ffi_res_fields_checked(ms_req_view_t *r, const char *lines, size_t len);
int ms_ffi_fields_check(const char *lines, size_t len);
int ms_ffi_req_peer_trusted(ms_req_view_t *r);
int ms_ffi_res_send(ms_req_view_t *r, const char *body, size_t len, int text);
int ms_ffi_res_begin(ms_req_view_t *r, double total, int text);
int ms_ffi_res_piece(ms_req_view_t *r, const char *p, size_t len);
int ms_ffi_res_end(ms_req_view_t *r);
int ms_ffi_res_write(ms_req_view_t *r, const char *chunk, size_t len, int text);
int ms_ffi_res_congested(ms_req_view_t *r);
int ms_ffi_anchor_drain(ms_req_view_t *r, int32_t *out, int n);
int64_t ms_ffi_req_body_take(ms_req_view_t *r, const char **out);
int ms_ffi_req_wait_body(ms_req_view_t *r);
int ms_ffi_req_body_limit(ms_req_view_t *r, double bytes);
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

-- Request flags (core/moonserve.h, MS_REQ_*).
_M.REQ_HEAD_SENT = 0x001
_M.REQ_DONE = 0x002
_M.REQ_ABORTED = 0x004
_M.REQ_BODY_DONE = 0x008
_M.REQ_HAS_BODY = 0x010
_M.REQ_STATIC_DIR = 0x1000

-- libuv's EAGAIN: "nothing yet, wait".
_M.EAGAIN = -11

_M.LOG_ERR, _M.LOG_WARN, _M.LOG_INFO, _M.LOG_DEBUG = 0, 1, 2, 3

local C = _M.C
local ffi_string = ffi.string

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

-- The signal a handler's coroutine yields when it parks; the dispatcher resumes it later.
_M.PARK = setmetatable({}, { __tostring = function() return "moonserve.PARK" end })

return _M
