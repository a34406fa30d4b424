-- moonserve/host/core/config.lua: what a worker inherits of the configuration: the bytes its
-- master read once (moonserve/config.lua's snapshot), over the master's channel.
local _M = {}

--- The master's configuration for this worker, or nil in a process without a master (which
-- reads its own). Raises when the master cannot hand it over: a worker never reads a file
-- that may have changed since its master did.
function _M.inherited()
    if not os.getenv("MOONSERVE_WORKER") then
        return nil
    end
    local bytes, err = require("moonserve.host.core.base").core.master_config()
    if not bytes then
        error("cannot take the configuration from the master: " .. err, 0)
    end
    return bytes
end

return _M
