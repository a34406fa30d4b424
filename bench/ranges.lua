-- ranges.lua: wrk script for compare's static2m-parts case: a file fetched in pieces.
-- Each request asks for the next of RANGE_PIECES (default 8) byte ranges of RANGE_PIECE
-- bytes (default 262144), in turn, so every piece of the 2 MiB file is asked for as often.
local piece = tonumber(os.getenv("RANGE_PIECE")) or 262144
local pieces = tonumber(os.getenv("RANGE_PIECES")) or 8
local reqs = {}
local n = 0

function init(args)
    for i = 0, pieces - 1 do
        local range = string.format("bytes=%d-%d", i * piece, (i + 1) * piece - 1)
        reqs[i + 1] = wrk.format(nil, nil, { Range = range })
    end
end

function request()
    n = n % pieces + 1
    return reqs[n]
end
