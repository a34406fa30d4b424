--- moonserve/shared.lua: what the framework knows of the dictionaries shared by the workers
-- (app:shared_dict, moonserve.shared.NAME), whichever host serves them: sizes, names, and the
-- table behind moonserve.shared, which shows the dictionaries the host attached (the core's:
-- moonserve/host/core/shared.lua) or provides (OpenResty's lua_shared_dict zones:
-- moonserve/host/openresty/services.lua). No part of the core is loaded here.
-- @module moonserve.shared
local type, tonumber, error, setmetatable, pairs = type, tonumber, error, setmetatable, pairs

local NAME_MAX, MIN_SIZE = 63, 16 * 1024 -- core/process/shdict.h's limits

local _M = {}

--- A size as an app writes it: bytes, or "512k", "10m", "1g". Returns bytes, or nil, err.
function _M.parse_size(size)
    local n, unit
    if type(size) == "number" then
        n, unit = size, ""
    elseif type(size) == "string" then
        local digits
        digits, unit = size:match("^(%d+)([kKmMgG]?)$")
        n = tonumber(digits)
    end
    if not n or n % 1 ~= 0 then
        return nil, "bad size (bytes, or a number with k, m or g: \"10m\")"
    end
    n = n * (({ k = 1024, m = 1024 ^ 2, g = 1024 ^ 3 })[unit:lower()] or 1)
    if n < MIN_SIZE or n > 4 * 1024 ^ 3 - 65536 then
        return nil, "bad size (16k to 4g expected)"
    end
    return n
end

--- Checks a dictionary's name as app:shared_dict takes it. Returns the name, or nil, err.
-- @local
function _M.check_name(name)
    if type(name) ~= "string" or not name:match("^[%w_-]+$") or #name > NAME_MAX then
        return nil, "bad shared dictionary name (1 to 63 letters, digits, '_' or '-')"
    end
    return name
end

-- The dictionaries of this process, by name (what moonserve.shared shows): those the core's
-- host attached (register); a host other than the core provides its own (provide).
local dicts = {}
local provider
_M.dicts = setmetatable({}, {
    __index = function(_, name)
        local d = dicts[name]
        if d == nil and provider then
            return provider(name)
        end
        return d
    end,
    __newindex = function()
        error("moonserve.shared is read-only: declare a dictionary with app:shared_dict", 2)
    end,
})

--- Makes fn(name) the source of the dictionaries this process has not attached: another
-- host's.
-- @local
function _M.provide(fn)
    provider = fn
end

-- Dictionaries parts of the framework need (moonserve.ratelimit's): name -> bytes.
local wanted = {}

--- Asks for dictionary `name` of `bytes` for a part of the framework: the host declares it
-- at start when the app did not (a size the app declared wins).
-- @local
function _M.want(name, bytes)
    if not wanted[name] or wanted[name] < bytes then
        wanted[name] = bytes
    end
end

--- Adds the dictionaries asked for with want() to `decl` (name -> bytes: the app's
-- declarations) where the app declared none of that name. Returns decl.
-- @local
function _M.declare_wanted(decl)
    for name, bytes in pairs(wanted) do
        if decl[name] == nil then
            decl[name] = bytes
        end
    end
    return decl
end

--- Records `d` as dictionary `name` of this process (the core's host, once it mapped it).
-- @local
function _M.register(name, d)
    dicts[name] = d
end

--- Whether this process has dictionary `name` of its own (attached, not provided).
-- @local
function _M.registered(name)
    return dicts[name] ~= nil
end

return _M
