-- moonserve: a Lua-scriptable HTTP server on a C core.
local _M = { _VERSION = "0.1.0" }

-- A new application; see app.lua.
function _M.app(opts)
    return require("moonserve.app").new(opts)
end

-- Parks the running handler for `seconds` while the worker serves others.
function _M.sleep(seconds)
    return require("moonserve.server").sleep(seconds)
end

return _M
