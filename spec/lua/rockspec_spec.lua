-- The rockspec installs every Lua module of the framework: a module missing from it works
-- in the source tree and fails once installed.
describe("the rockspec", function()
    it("lists every module under lua/moonserve", function()
        local root = os.getenv("MOONSERVE_SRC") or "."
        local f = assert(io.open(root .. "/rockspec/moonserve-scm-1.rockspec"))
        local spec = f:read("*a")
        f:close()
        local p = io.popen("ls " .. root .. "/lua/moonserve")
        local missing = {}
        for file in p:lines() do
            local mod = file:match("^(.-)%.lua$")
            if mod then
                local key = mod == "init" and '["moonserve"]' or ('["moonserve.' .. mod .. '"]')
                if not spec:find(key, 1, true) then
                    missing[#missing + 1] = file
                end
            end
        end
        p:close()
        assert.same({}, missing)
    end)
end)
