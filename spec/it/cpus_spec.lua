-- spec/it/cpus_spec.lua: the default number of workers honours the CPU quota of the cgroup
-- the server runs in (as a container's limit is).
local helper = require "helper"

-- The cgroup directory of the CPU controller that this machine mounts, v2 or v1, if any.
local function cpu_controller()
    local f = io.open("/sys/fs/cgroup/cgroup.controllers")
    if f then
        local ctl = f:read("*a")
        f:close()
        return ctl:find("%f[%w]cpu%f[^%w]") and "/sys/fs/cgroup" or nil, "v2"
    end
    for _, dir in ipairs({ "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct" }) do
        f = io.open(dir .. "/cpu.cfs_quota_us")
        if f then
            f:close()
            return dir, "v1"
        end
    end
end

local function cpus_in(group)
    local cmd = string.format("sh -c 'echo $$ > %s/cgroup.procs && exec %s -e " ..
        "\"print(require([[moonserve.base]]).core.cpus())\"'", group, helper.tool("luajit"))
    return tonumber((helper.sh(cmd)))
end

describe("the worker count", function()
    it("is no more than the cgroup's CPU quota, rounded up", function()
        local root, version = cpu_controller()
        local group = root and root .. "/moonserve-spec-" .. helper.sh("echo $$"):match("%d+")
        if not root or os.execute("mkdir " .. group .. " 2>/dev/null") ~= 0 then
            pending("no writable cgroup CPU controller here")
            return
        end
        finally(function() os.execute("rmdir " .. group) end)
        local function quota(q, period)
            if version == "v2" then
                helper.write_file(group .. "/cpu.max", (q or "max") .. " " .. period .. "\n")
            else
                helper.write_file(group .. "/cpu.cfs_period_us", period .. "\n")
                helper.write_file(group .. "/cpu.cfs_quota_us", (q or -1) .. "\n")
            end
        end
        local all = cpus_in(group)
        quota(50000, 100000) -- half a CPU: one worker
        assert.equal(1, cpus_in(group))
        quota(150000, 100000) -- one and a half: two, if the machine has two
        assert.equal(math.min(2, all), cpus_in(group))
        quota(nil, 100000)
        assert.equal(all, cpus_in(group))
    end)
end)
