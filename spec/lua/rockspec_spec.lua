-- The rockspec installs every Lua module of the framework: a module missing from it works
-- in the source tree and fails once installed.
describe("the rockspec", function()
    local lfs = require "lfs"

    -- Every .lua file under lua/DIR, as paths relative to lua/.
    local function lua_files(root, dir, out)
        for name in lfs.dir(root .. "/" .. dir) do
            local rel = dir .. "/" .. name
            if name ~= "." and name ~= ".." then
                if lfs.attributes(root .. "/" .. rel, "mode") == "directory" then
                    lua_files(root, rel, out)
                elseif name:match("%.lua$") then
                    out[#out + 1] = rel
                end
            end
        end
        return out
    end

    for _, name in ipairs { "moonserve-scm-1.rockspec", "moonserve-0.2.0-1.rockspec" } do
        it(name .. " lists every module under lua/moonserve, in subdirectories too", function()
            local root = os.getenv("MOONSERVE_SRC") or "."
            local f = assert(io.open(root .. "/rockspec/" .. name))
            local spec = f:read("*a")
            f:close()
            local missing = {}
            for _, file in ipairs(lua_files(root .. "/lua", "moonserve", {})) do
                local mod = file:gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", ".")
                if not spec:find('["' .. mod .. '"] = "lua/' .. file .. '"', 1, true) then
                    missing[#missing + 1] = file
                end
            end
            table.sort(missing)
            assert.same({}, missing)
        end)
    end
end)
