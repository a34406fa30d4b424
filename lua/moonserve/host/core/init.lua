-- moonserve/host/core/init.lua: the core's host, the table moonserve.host installs (its
-- functions in moonserve/host/init.lua): the FFI (moonserve/host/core/base.lua), the
-- dispatcher and the process runner. Loaded at the first call of one of its functions.
local base = require "moonserve.host.core.base"
local dispatcher = require "moonserve.host.core.dispatcher"

local C = base.C
local LEVELS = { err = base.LOG_ERR, warn = base.LOG_WARN, info = base.LOG_INFO,
    debug = base.LOG_DEBUG }

-- The modules behind module(name) (moonserve/host/core/NAME.lua). Cached: a require per
-- call (moonserve.socket.tcp(), spawn, timers) made a string and called a C function, whose
-- trace stitch left the rest of the handler to the interpreter, some 6,000 instructions a
-- request.
local modules = {}

return {
    name = "core",
    path_plain = function(path)
        return C.ms_ffi_path_plain(path, #path) ~= 0
    end,
    fields_ok = function(lines)
        return C.ms_ffi_fields_check(lines, #lines) == 0
    end,
    log = function(level, msg)
        base.log(LEVELS[level] or base.LOG_ERR, msg)
    end,
    now = base.core.now,
    sleep = dispatcher.sleep,
    run = require("moonserve.host.core.runner").run,
    module = function(name)
        local m = modules[name]
        if m == nil then
            m = require("moonserve.host.core." .. name)
            modules[name] = m
        end
        return m
    end,
}
