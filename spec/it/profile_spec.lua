-- spec/it/profile_spec.lua: the sampling profiler on a real server of one worker
-- (spec/fixtures/profiled.lua) under load from wrk: a handler whose time goes to one function
-- shows it at the top, through the metrics listener (folded stacks, a flame graph) and through
-- `moonserve --profile`; a route with next to no Lua shows the core's C functions; one profile
-- at a time; bad input gets 400; and the CPU budget, which shares the profiler's clock, still
-- stops a runaway once a profile is over.
local helper = require "helper"
local profile = require "moonserve.profile"

local BIN = os.getenv("MOONSERVE_BIN") or (helper.root .. "/lua/bin/moonserve")

local function get(port, path)
    return helper.request(port, "GET " .. path .. " HTTP/1.1\r\nHost: p\r\n"
        .. "Connection: close\r\n\r\n")
end

-- The frame with the most samples of its own, and its share.
local function hottest(samples)
    local self, sum = {}, 0
    for stack, n in pairs(samples) do
        sum = sum + n
        local leaf = stack:match("([^;]+)$")
        self[leaf] = (self[leaf] or 0) + n
    end
    local best, most = nil, 0
    for leaf, n in pairs(self) do
        if n > most then
            best, most = leaf, n
        end
    end
    return best, sum > 0 and most / sum or 0, sum
end

describe("the profiler", function()
    local srv, mport, load

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/profiled.lua",
            args = "--workers 1 --metrics 127.0.0.1:0 --limit handler_cpu_ms=300" }
        mport = srv.ports[2]
    end)

    teardown(function()
        srv:stop()
    end)

    -- wrk on `path` for `seconds`, in the background.
    local function start_load(path, seconds)
        load = helper.background(string.format("%s -t1 -c4 -d%ds http://127.0.0.1:%d%s",
            helper.tool("wrk"), seconds, srv.port, path))
    end

    after_each(function()
        helper.stop_pid(load)
        load = nil
    end)

    it("shows a handler's hot function at the top of its folded stacks", function()
        start_load("/hot", 4)
        local res = get(mport, "/profile?seconds=2")
        assert.equal(200, res.status, res.body)
        assert.matches("^text/plain", res.headers["content-type"])
        local samples = profile.parse_folded(res.body)
        local leaf, share, sum = hottest(samples)
        assert.equal(sum, tonumber(res.headers["x-profile-samples"]))
        assert.is_true(tonumber(res.headers["x-profile-cpu-ms"]) > 0)
        assert.matches("profiled%.lua:hot_spin$", leaf)
        assert.is_true(share > 0.5, "hot_spin's share: " .. share)
        -- below the handler that called it, below the dispatcher's frames
        local under = false
        for stack in pairs(samples) do
            under = under or stack:find("profiled%.lua:%w+;[%w/]*profiled%.lua:hot_spin$") ~= nil
        end
        assert.is_true(under, res.body)
    end)

    it("shows the core's C functions where the time is the core's", function()
        start_load("/hello", 4)
        local res = get(mport, "/profile?seconds=2")
        assert.equal(200, res.status, res.body)
        local core = 0
        for stack, n in pairs(profile.parse_folded(res.body)) do
            if stack:find("^%[core%];[%w_.+]+$") then
                core = core + n
            end
        end
        assert.is_true(core > 0, res.body)
        -- named: the core's own functions, its libraries' (the kernel's time shows in the
        -- system call's wrapper)
        assert.matches("%[core%];[%a_][%w_]*", res.body)
    end)

    it("draws a flame graph", function()
        start_load("/hot", 3)
        local res = get(mport, "/profile.svg?seconds=1")
        assert.equal(200, res.status, res.body)
        assert.equal("image/svg+xml", res.headers["content-type"])
        assert.matches("^<%?xml", res.body)
        assert.matches("</svg>\n$", res.body)
        assert.matches("<title>[^<]*profiled%.lua:hot_spin: %d+ samples", res.body)
    end)

    it("runs one profile at a time, and refuses bad seconds", function()
        local first = helper.connect(mport)
        assert(first:send("GET /profile?seconds=1 HTTP/1.1\r\nHost: p\r\n\r\n"))
        require("socket").sleep(0.2)
        local res = get(mport, "/profile?seconds=1")
        assert.equal(409, res.status)
        assert.equal("a profile runs already\n", res.body)
        assert.equal(200, helper.read_response(first).status)
        first:close()
        for _, bad in ipairs({ "0", "301", "x" }) do
            assert.equal(400, get(mport, "/profile?seconds=" .. bad).status)
        end
        assert.equal(404, get(mport, "/profiles").status)
    end)

    it("is what `moonserve --profile` writes: folded stacks, a flame graph, a summary",
        function()
            start_load("/hot", 4)
            local dir = os.tmpname()
            os.remove(dir)
            assert(os.execute("mkdir " .. dir) == 0)
            local out, status = helper.run(string.format("%s --profile 2 --metrics "
                .. "127.0.0.1:%d --output %s/p 2>&1", BIN, mport, dir))
            finally(function() os.execute("rm -rf " .. dir) end)
            assert.equal(0, status, out)
            assert.matches("%d+ samples\n  self  total  function\n%s*[%d.]+%%%s+[%d.]+%%  "
                .. "[%w/]*profiled%.lua:hot_spin\n", out)
            assert.matches("wrote " .. dir:gsub("%p", "%%%0") .. "/p%.folded and", out)
            local f = assert(io.open(dir .. "/p.folded"))
            local leaf = hottest(profile.parse_folded(f:read("*a")))
            f:close()
            assert.matches("hot_spin$", leaf)
            f = assert(io.open(dir .. "/p.svg"))
            assert.matches("hot_spin", f:read("*a"))
            f:close()
        end)

    it("says what is wrong on its command line", function()
        local out, status = helper.run(BIN .. " --profile 2 2>&1")
        assert.equal(2, status)
        assert.matches("needs the server's metrics listener: %-%-metrics ADDR:PORT", out)
        out, status = helper.run(BIN .. " --profile 0 --metrics 127.0.0.1:1 2>&1")
        assert.equal(2, status)
        assert.matches("needs SECONDS", out)
        out, status = helper.run(string.format("%s --profile 1 --metrics 127.0.0.1:%d 2>&1",
            BIN, helper.free_port()))
        assert.equal(2, status)
        assert.matches("cannot reach 127%.0%.0%.1:%d+", out)
    end)

    it("leaves the CPU budget stopping a runaway", function()
        assert.equal(200, get(srv.port, "/hello").status)
        local res = get(srv.port, "/spin")
        assert.equal(503, res.status, res.body)
        assert.equal(200, get(srv.port, "/hello").status)
        assert.is_true(srv:alive())
    end)
end)
