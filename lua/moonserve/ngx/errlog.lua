-- moonserve/ngx/errlog.lua: ngx.log and OpenResty's ngx.errlog module, onto moonserve's log
-- (moonserve/log.lua): nginx's nine levels map onto its four.
local host = require "moonserve.host"

local concat, select, type, tostring, error, floor = table.concat, select, type, tostring,
    error, math.floor

local _M = { version = "0.1.25" }

_M.LEVELS = { STDERR = 0, EMERG = 1, ALERT = 2, CRIT = 3, ERR = 4, WARN = 5, NOTICE = 6,
    INFO = 7, DEBUG = 8 }

-- nginx's level to moonserve's name.
local TO = { [0] = "err", "err", "err", "err", "err", "warn", "info", "info", "debug" }
-- moonserve's level (0 error .. 3 debug) to nginx's.
local FROM = { [0] = 4, 5, 7, 8 }

local null

local function piece(v, i)
    local t = type(v)
    if t == "string" then
        return v
    elseif t == "number" or t == "boolean" or t == "nil" then
        return tostring(v)
    elseif v == null then
        return "null"
    end
    local mt = getmetatable(v)
    if mt and mt.__tostring then
        return tostring(v)
    end
    error("bad argument #" .. i .. " to 'log' (expected table to have __tostring metamethod)", 4)
end

local function check_level(level, fname)
    if type(level) ~= "number" then
        error("bad argument #1 to '" .. fname .. "' (number expected, got " .. type(level) .. ")", 3)
    end
    if level < 0 or level > 8 or level ~= floor(level) then
        error("bad log level: " .. tostring(level), 3)
    end
end

function _M.log(level, ...)
    check_level(level, "log")
    local n = select("#", ...)
    local parts = {}
    for i = 1, n do
        parts[i] = piece((select(i, ...)), i + 1)
    end
    host.log(TO[level], concat(parts, "", 1, n))
end

function _M.raw_log(level, msg)
    check_level(level, "raw_log")
    if type(msg) ~= "string" then
        error("bad argument #2 to 'raw_log' (string expected, got " .. type(msg) .. ")", 2)
    end
    host.log(TO[level], msg)
end

-- The level the server logs at (--log-level), as nginx's constant.
function _M.get_sys_filter_level()
    local ok, base = pcall(require, "moonserve.host.core.base")
    local level = ok and base.core.log_level() or 2
    return FROM[level] or 7
end

function _M.set_filter_level()
    return nil, "not supported by moonserve (the server's --log-level applies)"
end

function _M.get_logs()
    return nil, "not supported by moonserve (no lua_capture_error_log buffer)"
end

function _M.init(ngx_null)
    null = ngx_null
end

return _M
