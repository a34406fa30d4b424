--- moonserve/host/core/thread_runner.lua: what a thread pool's thread runs for each job (in its own
-- LuaJIT state, modules/ms_thread_ffi.c), and the encoding of plain values both sides share:
-- nil, booleans, numbers, strings and tables of those; anything else is refused with an error.
-- @module moonserve.host.core.thread_runner
local type, tostring, tonumber, pairs, select, error, pcall, require = type, tostring, tonumber,
    pairs, select, error, pcall, require
local concat = table.concat
local sub, find, format = string.sub, string.find, string.format

local _M = {}

-- Nested tables deeper than this are refused (a cycle too ends here).
local MAX_DEPTH = 100

local function put(out, v, depth)
    local t = type(v)
    if t == "nil" then
        out[#out + 1] = "n"
    elseif t == "boolean" then
        out[#out + 1] = v and "t" or "f"
    elseif t == "number" then
        if v ~= v then
            out[#out + 1] = "N"
        elseif v == 1 / 0 then
            out[#out + 1] = "I"
        elseif v == -1 / 0 then
            out[#out + 1] = "i"
        else
            out[#out + 1] = "d" .. format("%.17g", v) .. ";"
        end
    elseif t == "string" then
        out[#out + 1] = "s" .. #v .. ":"
        out[#out + 1] = v
    elseif t == "table" then
        if depth >= MAX_DEPTH then
            error("table nested too deep (or a cycle)", 0)
        end
        out[#out + 1] = "T"
        for k, x in pairs(v) do
            local kt = type(k)
            if kt ~= "string" and kt ~= "number" and kt ~= "boolean" then
                error(kt .. " as a table key cannot go to or from a thread", 0)
            end
            put(out, k, depth + 1)
            put(out, x, depth + 1)
        end
        out[#out + 1] = "e"
    else
        error(t .. " value cannot go to or from a thread (plain values only: nil, booleans, "
            .. "numbers, strings, tables of those)", 0)
    end
end

--- The values encoded in one string. Raises (with a message, level 0) for values that are not
-- plain.
function _M.encode(...)
    local out = {}
    local n = select("#", ...)
    out[1] = n .. ";"
    for i = 1, n do
        put(out, (select(i, ...)), 0)
    end
    return concat(out)
end

local get
get = function(s, i)
    local c = sub(s, i, i)
    if c == "n" then
        return nil, i + 1
    elseif c == "t" then
        return true, i + 1
    elseif c == "f" then
        return false, i + 1
    elseif c == "N" then
        return 0 / 0, i + 1
    elseif c == "I" then
        return 1 / 0, i + 1
    elseif c == "i" then
        return -1 / 0, i + 1
    elseif c == "d" then
        local e = find(s, ";", i + 1, true)
        return tonumber(sub(s, i + 1, e - 1)), e + 1
    elseif c == "s" then
        local e = find(s, ":", i + 1, true)
        local n = tonumber(sub(s, i + 1, e - 1))
        return sub(s, e + 1, e + n), e + n + 1
    elseif c == "T" then
        local t = {}
        i = i + 1
        while sub(s, i, i) ~= "e" do
            local k, v
            k, i = get(s, i)
            v, i = get(s, i)
            t[k] = v
        end
        return t, i + 1
    end
    error("bad encoding at byte " .. i)
end

local function unpack_from(s, i, k, n)
    if k > n then
        return
    end
    local v
    v, i = get(s, i)
    return v, unpack_from(s, i, k + 1, n)
end

--- The values encode() put in `s`.
function _M.decode(s)
    local e = find(s, ";", 1, true)
    return unpack_from(s, e + 1, 1, tonumber(sub(s, 1, e - 1)))
end

local function finish(limit, ok, ...)
    if not ok then
        return false, tostring((...))
    end
    local eok, s = pcall(_M.encode, ...)
    if not eok then
        return false, "bad result: " .. tostring(s)
    end
    if #s > limit then
        return false, "results too large (" .. #s .. " bytes encoded; thread_job_bytes is "
            .. limit .. ")"
    end
    return true, s
end

--- Runs one job: `job` is encode(limit, module, function, args...). Returns true and the
-- encoded results, or false and an error's text.
function _M.run(job)
    local function go(limit, mod, fname, ...)
        local ok, m = pcall(require, mod)
        if not ok then
            return false, "module '" .. tostring(mod) .. "' cannot be loaded: " .. tostring(m)
        end
        local fn = type(m) == "table" and m[fname]
        if type(fn) ~= "function" then
            return false, "module '" .. mod .. "' has no function '" .. fname .. "'"
        end
        return finish(limit, pcall(fn, ...))
    end
    return go(_M.decode(job))
end

return _M
