-- moonserve/ngx/time.lua: OpenResty's clock and date functions: ngx.now, time, today,
-- localtime, utctime, update_time, http_time, cookie_time, parse_http_time. The wall clock
-- is read on every call (nginx caches it per turn of its loop: update_time is a no-op here).
local ffi = require "ffi"

local floor, format, date, tonumber, type, error = math.floor, string.format, os.date,
    tonumber, type, error

if not pcall(ffi.typeof, "ms_ngx_timeval_t") then
    ffi.cdef [[
typedef struct { long tv_sec; long tv_usec; } ms_ngx_timeval_t;
int gettimeofday(ms_ngx_timeval_t *tv, void *tz);
]]
end
local tv = ffi.new("ms_ngx_timeval_t")
local C = ffi.C

local _M = {}

-- Seconds since the epoch, to the millisecond, as ngx.now.
function _M.now()
    C.gettimeofday(tv, nil)
    return tonumber(tv.tv_sec) + floor(tonumber(tv.tv_usec) / 1000) / 1000
end

function _M.time()
    C.gettimeofday(tv, nil)
    return tonumber(tv.tv_sec)
end

function _M.update_time()
end

function _M.today()
    return date("%Y-%m-%d", _M.time())
end

function _M.localtime()
    return date("%Y-%m-%d %H:%M:%S", _M.time())
end

function _M.utctime()
    return date("!%Y-%m-%d %H:%M:%S", _M.time())
end

local DAYS = { "Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat" }
local MONTHS = { "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
    "Dec" }
local MONTH = {}
for i, m in ipairs(MONTHS) do
    MONTH[m] = i
end

local function seconds(sec, fname)
    if type(sec) ~= "number" then
        error("bad argument #1 to '" .. fname .. "' (number expected, got " .. type(sec) .. ")", 3)
    end
    return floor(sec)
end

-- "Thu, 18 Nov 2010 11:27:35 GMT"
function _M.http_time(sec)
    local t = date("!*t", seconds(sec, "http_time"))
    return format("%s, %02d %s %d %02d:%02d:%02d GMT", DAYS[t.wday], t.day, MONTHS[t.month],
        t.year, t.hour, t.min, t.sec)
end

-- "Thu, 18-Nov-10 11:27:35 GMT": two digits of the year, as nginx writes it, up to 2037.
function _M.cookie_time(sec)
    local t = date("!*t", seconds(sec, "cookie_time"))
    return format("%s, %02d-%s-%02d %02d:%02d:%02d GMT", DAYS[t.wday], t.day, MONTHS[t.month],
        t.year > 2037 and t.year or t.year % 100, t.hour, t.min, t.sec)
end

-- Days from 1970-01-01 to y-m-d (proleptic Gregorian).
local function days_from_civil(y, m, d)
    if m <= 2 then
        y = y - 1
    end
    local era = floor(y / 400)
    local yoe = y - era * 400
    local mp = (m + 9) % 12
    local doy = floor((153 * mp + 2) / 5) + d - 1
    local doe = yoe * 365 + floor(yoe / 4) - floor(yoe / 100) + doy
    return era * 146097 + doe - 719468
end

local function epoch(y, mon, d, h, mi, s)
    local m = MONTH[mon]
    y, d, h, mi, s = tonumber(y), tonumber(d), tonumber(h), tonumber(mi), tonumber(s)
    if not m or d < 1 or d > 31 or h > 23 or mi > 59 or s > 59 then
        return nil
    end
    return days_from_civil(y, m, d) * 86400 + h * 3600 + mi * 60 + s
end

-- Seconds for an HTTP date (RFC 1123, RFC 850 or asctime), or nil.
function _M.parse_http_time(s)
    if type(s) ~= "string" then
        error("bad argument #1 to 'parse_http_time' (string expected, got " .. type(s) .. ")", 2)
    end
    local d, mon, y, h, mi, sec = s:match(
        "^%a+, (%d%d?) (%a%a%a) (%d%d%d%d) (%d%d):(%d%d):(%d%d) GMT$")
    if d then
        return epoch(y, mon, d, h, mi, sec)
    end
    d, mon, y, h, mi, sec = s:match("^%a+, (%d%d)%-(%a%a%a)%-(%d%d) (%d%d):(%d%d):(%d%d) GMT$")
    if d then
        y = tonumber(y)
        return epoch(y < 70 and 2000 + y or 1900 + y, mon, d, h, mi, sec)
    end
    mon, d, h, mi, sec, y = s:match("^%a+ (%a%a%a) +(%d%d?) (%d%d):(%d%d):(%d%d) (%d%d%d%d)$")
    if mon then
        return epoch(y, mon, d, h, mi, sec)
    end
    return nil
end

return _M
