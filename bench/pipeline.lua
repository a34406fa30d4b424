-- pipeline.lua: wrk script that writes PIPELINE_DEPTH (default 16) requests at once.
-- wrk counts the requests in the returned string and waits for that many replies
-- before it writes the next batch, so each connection keeps 16 requests in flight.
local depth = tonumber(os.getenv("PIPELINE_DEPTH")) or 16
local batch

function init(args)
    local reqs = {}
    for i = 1, depth do
        reqs[i] = wrk.format()
    end
    batch = table.concat(reqs)
end

function request()
    return batch
end
