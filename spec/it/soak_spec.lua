-- spec/it/soak_spec.lua: CI's one-minute run of bench/soak: mixed traffic (HTTP/1.1 keep-alive
-- and new connections, h2c, HTTP/1.1 and h2 over TLS, static files, JSON bodies, Redis and
-- PostgreSQL handlers, WebSocket echoes) against two workers, with the Redis and PostgreSQL
-- servers the script starts. A minute is too short to judge growth and drift (the 30-minute
-- run and its plots are in PERFORMANCE.md): it holds the script to working, and the server
-- to losing no request and no worker.
local helper = require "helper"

describe("the soak, for a minute", function()
    it("serves every load with no failed request and no worker lost", function()
        local results = helper.sh(helper.tool("mktemp") .. " -d"):gsub("%s+$", "")
        local out, status = helper.with_env({ MOONSERVE = helper.bin, SOAK_PLOT = "0",
            SOAK_RESULTS = results }, function()
            return helper.run(helper.root .. "/bench/soak 1 5 2>&1")
        end)
        os.execute("rm -rf " .. helper.sh_quote(results))
        assert.equal(0, status, out)
        assert.matches("verdict: no worker died, no request failed", out, 1, true)
        assert.matches("workers that died: 0", out, 1, true)
        -- every load ran, and none saw a failed or broken request
        local loads = 0
        for name, total, ok, failed, errored in
            out:gmatch("| ([%w-]+) | (%d+) | (%d+) | (%d+) | (%d+) |") do
            loads = loads + 1
            assert.is_true(tonumber(total) > 0, name .. " ran no request")
            assert.equal(total, ok, name .. ": " .. failed .. " failed, " .. errored .. " errored")
        end
        assert.equal(9, loads, out)
        assert.matches("probe: 0 requests failed; WebSocket echoes: [1-9]", out)
    end)
end)
