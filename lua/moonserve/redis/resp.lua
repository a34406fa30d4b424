--- moonserve/redis/resp.lua: RESP2, the Redis serialization protocol: commands as arrays of
-- bulk strings, replies read from a host socket.
-- @module moonserve.redis.resp
local json = require "moonserve.json"

local byte, sub, format = string.byte, string.sub, string.format
local type, tonumber, setmetatable, getmetatable, error = type, tonumber, setmetatable,
    getmetatable, error
local huge = math.huge

local _M = {}

--- A nil bulk or multi-bulk reply: the same value as moonserve.json.null.
_M.null = json.null

-- An error reply, kept as a value where it sits in a pipeline or an array (EXEC).
local Err = { __name = "moonserve.redis.error" }
Err.__index = Err
Err.__tostring = function(e) return e.error end
_M.Err = Err

function _M.is_error(v)
    return type(v) == "table" and getmetatable(v) == Err
end

-- The longest bulk reply read (Redis' own proto-max-bulk-len default): a reply claiming
-- more is a broken stream, not data.
local MAX_BULK = 512 * 1024 * 1024
-- The deepest nesting of arrays read: replies of Redis' commands nest a few levels.
local MAX_DEPTH = 16

local function arg_text(v, i)
    local t = type(v)
    if t == "string" then
        return v
    elseif t == "number" then
        if v % 1 == 0 and v > -2 ^ 53 and v < 2 ^ 53 then
            return format("%d", v)
        elseif v ~= v or v == huge or v == -huge then
            error("bad argument #" .. i .. " to a Redis command (a finite number expected)", 4)
        end
        return format("%.17g", v)
    end
    error("bad argument #" .. i .. " to a Redis command (string or number expected, got "
        .. t .. ")", 4)
end

--- Appends one command (a list of strings and numbers) to `parts` from index n + 1, as an
-- array of bulk strings; returns the new count.
-- The heads of arrays and bulk strings up to these sizes, made once: most commands and
-- their arguments are short, and a head made per argument was most of a call's strings.
local ARRAY_HEADS, BULK_HEADS = {}, {}
for i = 0, 64 do
    ARRAY_HEADS[i] = "*" .. i .. "\r\n"
end
for i = 0, 1024 do
    BULK_HEADS[i] = "$" .. i .. "\r\n"
end

function _M.encode(cmd, parts, n)
    if type(cmd) ~= "table" or cmd[1] == nil then
        error("bad command (a list of strings expected)", 3)
    end
    local count = #cmd
    n = n + 1
    parts[n] = ARRAY_HEADS[count] or ("*" .. count .. "\r\n")
    for i = 1, count do
        local s = cmd[i]
        if type(s) ~= "string" then
            s = arg_text(s, i)
        end
        local len = #s
        parts[n + 1] = BULK_HEADS[len] or ("$" .. len .. "\r\n")
        parts[n + 2] = s
        parts[n + 3] = "\r\n"
        n = n + 3
    end
    return n
end

local read

-- One reply: the value (a string, a number, a table, null or an Err), or nil and the error
-- of the stream and whether any byte of the reply had come ("closed", "timeout", "bad reply").
read = function(sock, depth, line)
    local err
    if not line then
        line, err = sock:receive()
        if not line then
            return nil, err, false
        end
    end
    local kind = byte(line)
    if kind == 36 then -- '$' bulk string
        local n = tonumber(sub(line, 2))
        -- (-1 is the one null length; RESP2 has no other negative one)
        if not n or n % 1 ~= 0 or n > MAX_BULK or n < -1 then
            return nil, "bad reply", true
        end
        if n < 0 then
            return _M.null
        end
        local data
        data, err = sock:receive(n + 2)
        if not data then
            return nil, err, true
        end
        return sub(data, 1, n)
    elseif kind == 43 then -- '+' simple string
        return sub(line, 2)
    elseif kind == 58 then -- ':' integer
        local n = tonumber(sub(line, 2))
        if not n then
            return nil, "bad reply", true
        end
        return n
    elseif kind == 45 then -- '-' error
        return setmetatable({ error = sub(line, 2) }, Err)
    elseif kind == 42 then -- '*' array
        local n = tonumber(sub(line, 2))
        if not n or n % 1 ~= 0 or n > MAX_BULK or n < -1 or depth >= MAX_DEPTH then
            return nil, "bad reply", true
        end
        if n < 0 then
            return _M.null
        end
        local t = {}
        for i = 1, n do
            local v
            v, err = read(sock, depth + 1)
            if v == nil then
                return nil, err, true
            end
            t[i] = v
        end
        return t
    end
    return nil, "bad reply", true
end

--- Reads one reply from `sock`: the value, or nil, an error and whether part of it came.
-- `line`: its first line when the caller has read it already.
function _M.read(sock, line)
    return read(sock, 0, line)
end

return _M
