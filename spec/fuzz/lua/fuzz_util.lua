-- The Lua fuzz targets' helpers (spec/fuzz/lua_fuzz.c runs them).
local M = {}

-- Calls fn(...) and passes on what it returned; a raise is a finding, named `what`.
function M.no_raise(what, fn, ...)
    local out = { pcall(fn, ...) }
    if not out[1] then
        error(what .. " raised: " .. tostring(out[2]), 0)
    end
    return unpack(out, 2, table.maxn(out))
end

-- A socket that hands out `data` as the host's sockets do: receive() a line without its
-- CRLF, receive(n) n bytes, nil and "closed" (with what was left) at the end.
function M.socket(data)
    local at = 1
    return {
        receive = function(_, pat)
            if at > #data then
                return nil, "closed", ""
            end
            if pat == nil or pat == "*l" then
                local e = data:find("\r\n", at, true)
                if not e then
                    local rest = data:sub(at)
                    at = #data + 1
                    return nil, "closed", rest
                end
                local line = data:sub(at, e - 1)
                at = e + 2
                return line
            end
            if at + pat - 1 > #data then
                local rest = data:sub(at)
                at = #data + 1
                return nil, "closed", rest
            end
            local s = data:sub(at, at + pat - 1)
            at = at + pat
            return s
        end,
        send = function(_, s)
            return #s
        end,
        settimeouts = function() end,
        close = function() return true end,
    }
end

return M
