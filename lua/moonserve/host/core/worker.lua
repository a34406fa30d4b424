--- moonserve/host/core/worker.lua: which worker this is (OpenResty's ngx.worker.id and count).
-- @module moonserve.worker
local _M = {}

--- This worker's number, 0 to count() - 1; 0 in a single process; nil in the master (an
-- app file's top level runs there too) or before the app serves.
function _M.id()
    local worker = os.getenv("MOONSERVE_WORKER")
    if worker then
        return tonumber(worker)
    end
    local loaded = package.loaded["moonserve.host.core.dispatcher"]
    return loaded and loaded.attached() and 0 or nil
end

--- The number of workers the master runs (1 in a single process).
function _M.count()
    return tonumber(os.getenv("MOONSERVE_WORKER_COUNT")) or 1
end

return _M
