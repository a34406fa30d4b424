--- moonserve/host/core/shared.lua: dictionaries shared by the workers of one server, OpenResty's
-- ngx.shared.DICT: `moonserve.shared.NAME` once the app declared it with
-- app:shared_dict(NAME, SIZE). Each is a zone of shared memory made when the server starts
-- (by the master, which hands it to every worker and keeps it across a reload; in a single
-- process, by that process); the core does every operation atomically across the workers
-- (core/process/shdict.c, docs/shared-dicts.md). Values are strings, numbers, booleans and tables
-- (tables are encoded with LuaJIT's string.buffer, so they come back as copies).
--
-- `Dict`: A shared dictionary (moonserve.shared.NAME), as OpenResty's ngx.shared.DICT.
-- @module moonserve.shared
local ffi = require "ffi"
local buffer = require "string.buffer"

local ffi_new, ffi_str, ffi_cast = ffi.new, ffi.string, ffi.cast
local type, tonumber, error, setmetatable = type, tonumber, error, setmetatable
local encode, decode = buffer.encode, buffer.decode

ffi.cdef [[
typedef struct ms_shdict_s ms_shdict_t;
typedef struct ms_shdict_val_s {
    int type; int stale; uint32_t flags; double num; size_t len;
} ms_shdict_val_t;
const char *ms_shdict_strerror(int err);
int ms_shdict_create(const char *name, size_t size);
int ms_shdict_attach(int fd, const char *name, size_t size, ms_shdict_t **out);
size_t ms_shdict_capacity(ms_shdict_t *d);
size_t ms_shdict_free_space(ms_shdict_t *d);
long ms_shdict_get(ms_shdict_t *d, const char *key, size_t klen, char *buf, size_t cap,
                   int stale, ms_shdict_val_t *v);
int ms_shdict_store(ms_shdict_t *d, int op, const char *key, size_t klen, int type,
                    const char *str, size_t len, double num, double exptime, uint32_t flags,
                    int *forcible);
int ms_shdict_incr(ms_shdict_t *d, const char *key, size_t klen, double n, int has_init,
                   double init, double init_ttl, double *out, int *forcible);
int ms_shdict_delete(ms_shdict_t *d, const char *key, size_t klen);
int ms_shdict_ttl(ms_shdict_t *d, const char *key, size_t klen, double *ttl);
int ms_shdict_expire(ms_shdict_t *d, const char *key, size_t klen, double exptime);
int ms_shdict_flush_all(ms_shdict_t *d);
int ms_shdict_flush_expired(ms_shdict_t *d, int max);
int ms_shdict_get_keys(ms_shdict_t *d, int max, char *buf, size_t cap, size_t *needed);
long ms_shdict_push(ms_shdict_t *d, const char *key, size_t klen, int left, int type,
                    const char *str, size_t len, double num);
long ms_shdict_pop(ms_shdict_t *d, const char *key, size_t klen, int left, char *buf,
                   size_t cap, ms_shdict_val_t *v);
long ms_shdict_llen(ms_shdict_t *d, const char *key, size_t klen);
int ms_shdict_window_take(ms_shdict_t *d, const char *key, size_t klen, uint32_t limit,
                          int64_t window_ms, uint32_t *left, int64_t *wait_ms);
]]

-- core/process/shdict.h's value types, store flavours and the codes Lua turns into nil.
local NIL, STRING, NUMBER, BOOLEAN, TABLE = 0, 1, 2, 3, 4
local SET, SAFE_SET, ADD, SAFE_ADD, REPLACE = 0, 1, 2, 3, 4
local ENOTFOUND, ESIZE, ENAME = -10101, -10111, -10112

local C -- the core's library, loaded when the first dictionary is opened
local val = ffi_new("ms_shdict_val_t")
local num_out, forcible_out = ffi_new("double[1]"), ffi_new("int[1]")
local needed_out = ffi_new("size_t[1]")
local left_out, wait_out = ffi_new("uint32_t[1]"), ffi_new("int64_t[1]")
local buf_cap = 4096
local buf = ffi_new("char[?]", buf_cap)

local function grow(n)
    if n > buf_cap then
        buf_cap = n
        buf = ffi_new("char[?]", buf_cap)
    end
end

local function strerror(rc)
    return ffi_str(C.ms_shdict_strerror(rc))
end

local Dict = {}
Dict.__index = Dict

local function check_key(key)
    if type(key) == "number" then
        key = tostring(key)
    elseif type(key) ~= "string" then
        error("bad key (string expected, got " .. type(key) .. ")", 3)
    end
    return key
end

local function check_time(t, what)
    if t == nil then
        return 0
    end
    if type(t) ~= "number" or t < 0 then
        error("bad " .. what .. " (a number of seconds, 0 or more, expected)", 3)
    end
    return t
end

-- The value as the core stores it: its type, bytes and number.
local function encode_value(value)
    local t = type(value)
    if t == "string" then
        return STRING, value, 0
    elseif t == "number" then
        return NUMBER, nil, value
    elseif t == "boolean" then
        return BOOLEAN, nil, value and 1 or 0
    elseif t == "table" then
        return TABLE, encode(value), 0
    elseif t == "nil" then
        return NIL, nil, 0
    end
    error("bad value type (string, number, boolean, table or nil expected, got " .. t .. ")", 3)
end

-- What a read found, as Lua: the value (or nil), then its flags (nil when 0, as OpenResty).
local function decode_value(rc)
    local t = val.type
    local v
    if t == STRING then
        v = ffi_str(buf, rc)
    elseif t == NUMBER then
        v = val.num
    elseif t == BOOLEAN then
        v = val.num ~= 0
    elseif t == TABLE then
        v = decode(ffi_str(buf, rc))
    end
    local flags = val.flags
    return v, flags ~= 0 and flags or nil
end

local function read(self, key, stale)
    key = check_key(key)
    local d = self.d
    local rc = C.ms_shdict_get(d, key, #key, buf, buf_cap, stale, val)
    if rc > buf_cap then -- (the value did not fit: nothing was copied)
        grow(tonumber(rc))
        rc = C.ms_shdict_get(d, key, #key, buf, buf_cap, stale, val)
    end
    if rc == ENOTFOUND then
        return nil
    elseif rc < 0 then
        return nil, strerror(rc)
    end
    return decode_value(tonumber(rc))
end

--- value, flags | nil | nil, err
-- @usage local v, flags = moonserve.shared.cache:get("k")
function Dict:get(key)
    return read(self, key, 0)
end

--- value, flags, stale | nil | nil, err: an expired value not yet freed, too.
function Dict:get_stale(key)
    local v, flags = read(self, key, 1)
    if v == nil then
        return v, flags
    end
    return v, flags, val.stale ~= 0
end

local function store(self, op, key, value, exptime, flags)
    key = check_key(key)
    exptime = check_time(exptime, "exptime")
    if flags ~= nil and (type(flags) ~= "number" or flags < 0 or flags % 1 ~= 0) then
        error("bad flags (an unsigned integer expected)", 3)
    end
    local t, s, n = encode_value(value)
    forcible_out[0] = 0
    local rc = C.ms_shdict_store(self.d, op, key, #key, t, s, s and #s or 0, n, exptime,
        flags or 0, forcible_out)
    local forcible = forcible_out[0] ~= 0
    if rc < 0 then
        return false, strerror(rc), forcible
    end
    return true, nil, forcible
end

--- Stores `value` under `key` for `exptime` seconds (0 or nil: no expiry), with `flags`.
-- Evicts the least recently used entries when the dictionary is full.
-- @function Dict:set
-- @tparam string key
-- @param value a string, number, boolean or table
-- @tparam[opt] number exptime
-- @tparam[opt] integer flags
-- @return ok, err, forcible (forcible: live entries were evicted to make room)

--- As set, but fails with "no memory" instead of evicting live entries.
-- @function Dict:safe_set

--- As set, only when `key` is not there (else false, "exists").
-- @function Dict:add

--- As add, but fails with "no memory" instead of evicting live entries.
-- @function Dict:safe_add

--- As set, only when `key` is there (else false, "not found").
-- @function Dict:replace

-- set, safe_set, add, safe_add, replace: ok, err, forcible (forcible: live entries were
-- evicted to make room; the safe_ ones never do, and fail with "no memory" instead).
for name, op in pairs({ set = SET, safe_set = SAFE_SET, add = ADD, safe_add = SAFE_ADD,
    replace = REPLACE }) do
    Dict[name] = function(self, key, value, exptime, flags)
        return store(self, op, key, value, exptime, flags)
    end
end

--- newval, err, forcible: `init` makes a missing key (with `init_ttl`), else "not found".
-- @usage local hits = moonserve.shared.stats:incr("hits", 1, 0)
function Dict:incr(key, n, init, init_ttl)
    key = check_key(key)
    if type(n) ~= "number" then
        error("bad increment (number expected)", 2)
    end
    if init ~= nil and type(init) ~= "number" then
        error("bad init (number expected)", 2)
    end
    init_ttl = check_time(init_ttl, "init_ttl")
    forcible_out[0] = 0
    local rc = C.ms_shdict_incr(self.d, key, #key, n, init ~= nil and 1 or 0, init or 0, init_ttl,
        num_out, forcible_out)
    if rc < 0 then
        return nil, strerror(rc)
    end
    return num_out[0], nil, forcible_out[0] ~= 0
end

--- A sliding log for rate limits (not one of OpenResty's methods): admits when fewer than
-- `limit` (1 to 65536) admissions were recorded under `key` in the last `window` seconds
-- (to the millisecond), recording this one; check and record are one step for all the
-- workers. The key holds 8 + 8 * limit bytes; anything else under it is replaced.
-- @return true or false, the admissions left, and the seconds until the oldest one counted
-- leaves the window; or nil and an error
function Dict:window_take(key, limit, window)
    key = check_key(key)
    if type(limit) ~= "number" or limit < 1 or limit > 65536 or limit % 1 ~= 0 then
        error("bad limit (a whole number from 1 to 65536 expected)", 2)
    end
    if type(window) ~= "number" or window ~= window or window < 0.001 then
        error("bad window (seconds, at least 0.001, expected)", 2)
    end
    local rc = C.ms_shdict_window_take(self.d, key, #key, limit, window * 1000, left_out, wait_out)
    if rc < 0 then
        return nil, strerror(rc)
    end
    return rc == 1, tonumber(left_out[0]), tonumber(wait_out[0]) / 1000
end

--- Removes `key`.
-- @return true
function Dict:delete(key)
    key = check_key(key)
    C.ms_shdict_delete(self.d, key, #key)
    return true
end

--- seconds left (0: never expires) | nil, "not found"
function Dict:ttl(key)
    key = check_key(key)
    local rc = C.ms_shdict_ttl(self.d, key, #key, num_out)
    if rc < 0 then
        return nil, strerror(rc)
    end
    return num_out[0]
end

--- Gives `key` a new time to live, in seconds (0: none).
-- @return true, or nil and "not found"
function Dict:expire(key, exptime)
    key = check_key(key)
    exptime = check_time(exptime, "exptime")
    local rc = C.ms_shdict_expire(self.d, key, #key, exptime)
    if rc < 0 then
        return nil, strerror(rc)
    end
    return true
end

--- Marks every entry expired (flush_expired frees them).
function Dict:flush_all()
    C.ms_shdict_flush_all(self.d)
end

--- Frees expired entries, at most `max` of them (0 or nil: all).
-- @return how many were freed
function Dict:flush_expired(max)
    return C.ms_shdict_flush_expired(self.d, max or 0)
end

--- Up to `max` live keys (default 1024, as OpenResty; 0: all).
function Dict:get_keys(max)
    max = max or 1024
    local n = C.ms_shdict_get_keys(self.d, max, buf, buf_cap, needed_out)
    if needed_out[0] > buf_cap then
        grow(tonumber(needed_out[0]))
        n = C.ms_shdict_get_keys(self.d, max, buf, buf_cap, needed_out)
    end
    local keys, at = {}, 0
    local p = ffi_cast("const uint8_t *", buf)
    for i = 1, n do
        local len = ffi_cast("const uint16_t *", p + at)[0] -- (x86 and arm64 take it unaligned)
        keys[i] = ffi_str(p + at + 2, len)
        at = at + 2 + len
    end
    return keys
end

local function push(self, left, key, value)
    key = check_key(key)
    local t = type(value)
    if t ~= "string" and t ~= "number" then
        return nil, "bad value type"
    end
    local rc = C.ms_shdict_push(self.d, key, #key, left, t == "string" and STRING or NUMBER,
        t == "string" and value or nil, t == "string" and #value or 0,
        t == "number" and value or 0)
    if rc < 0 then
        return nil, strerror(rc)
    end
    return tonumber(rc)
end

local function pop(self, left, key)
    key = check_key(key)
    local d = self.d
    local rc = C.ms_shdict_pop(d, key, #key, left, buf, buf_cap, val)
    if rc > buf_cap then
        grow(tonumber(rc))
        rc = C.ms_shdict_pop(d, key, #key, left, buf, buf_cap, val)
    end
    if rc == ENOTFOUND then
        return nil
    elseif rc < 0 then
        return nil, strerror(rc)
    end
    return (decode_value(tonumber(rc)))
end

--- length | nil, err
function Dict:lpush(key, value)
    return push(self, 1, key, value)
end

--- Appends `value` to the list at `key`.
-- @return the list's length, or nil and an error
function Dict:rpush(key, value)
    return push(self, 0, key, value)
end

--- Removes and returns the first value of the list at `key` (nil when empty).
function Dict:lpop(key)
    return pop(self, 1, key)
end

--- Removes and returns the last value of the list at `key` (nil when empty).
function Dict:rpop(key)
    return pop(self, 0, key)
end

--- The length of the list at `key` (0 when missing).
function Dict:llen(key)
    key = check_key(key)
    local rc = C.ms_shdict_llen(self.d, key, #key)
    if rc < 0 then
        return nil, strerror(rc)
    end
    return tonumber(rc)
end

--- The dictionary's size in bytes, as declared.
function Dict:capacity()
    return tonumber(C.ms_shdict_capacity(self.d))
end

--- The bytes of free pages left.
function Dict:free_space()
    return tonumber(C.ms_shdict_free_space(self.d))
end

-- -- Zones -------------------------------------------------------------------------------

local _M = {}

-- What the framework knows of the dictionaries: sizes, names, the table behind
-- moonserve.shared, where each dictionary mapped here is recorded.
local zones = require "moonserve.shared"

local function load_core()
    if not C then
        C = require("moonserve.host.core.base").C
    end
end

--- Maps the zone of `fd` as dictionary `name` of `size` bytes. Returns the dictionary, or
-- nil, err (a size or name other than the zone's: a reload cannot change them).
-- @local
function _M.attach(fd, name, size)
    load_core()
    local out = ffi_new("ms_shdict_t *[1]")
    local rc = C.ms_shdict_attach(fd, name, size, out)
    if rc == ESIZE then
        return nil, "shared dictionary '" .. name .. "' was made with another size; the app " ..
            "now declares " .. size .. " bytes (its size can change only with a restart)"
    elseif rc == ENAME or rc < 0 then
        return nil, "shared dictionary '" .. name .. "': " .. strerror(rc)
    end
    local d = setmetatable({ d = ffi.gc(out[0], nil), name = name }, Dict)
    zones.register(name, d)
    return d
end

--- Makes the zone of dictionary `name` (`size` bytes). Returns its fd, or nil, err.
-- @local
function _M.create(name, size)
    load_core()
    local fd = C.ms_shdict_create(name, size)
    if fd < 0 then
        return nil, "shared dictionary '" .. name .. "': " .. strerror(fd)
    end
    return fd
end

--- Makes and maps, in this process, every dictionary of `decl` ({ name = bytes }) that it
-- has not got: a server with no master. Returns true, or nil, err.
-- @local
function _M.open(decl)
    for name, size in pairs(decl) do
        if not zones.registered(name) then
            local fd, err = _M.create(name, size)
            if not fd then
                return nil, err
            end
            local _, aerr = _M.attach(fd, name, size)
            if aerr then
                return nil, aerr
            end
        end
    end
    return true
end

return _M
