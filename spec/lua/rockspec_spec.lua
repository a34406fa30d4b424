-- The rockspec installs every Lua module of the framework: a module missing from it works
-- in the source tree and fails once installed.
describe("the rockspec", function()
    it("lists every module under lua/moonserve", function()
        local root = os.getenv("MOONSERVE_SRC") or "."
        local f = assert(io.open(root .. "/rockspec/moonserve-scm-1.rockspec"))
        local spec = f:read("*a")
        f:close()
        -- the framework's files and those of its subdirectories (moonserve/ngx/*.lua)
        local p = io.popen("cd " .. root .. "/lua/moonserve && ls *.lua */*.lua")
        local missing = {}
        for file in p:lines() do
            local mod = file:match("^(.-)%.lua$")
            if mod then
                mod = mod:gsub("/", ".")
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
