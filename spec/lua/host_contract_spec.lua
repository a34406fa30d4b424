-- Both hosts' request and reply objects have every name of the written contract
-- (moonserve/host/contract.lua). OpenResty's load only where a global ngx is nginx's, so
-- they are checked in a fresh LuaJIT with a stand-in for it.
describe("the host contract", function()
    local helper = require "helper"
    local contract = require "moonserve.host.contract"

    -- The names of `lists` (the contract's) that the modules req_mod and res_mod lack, as
    -- a child process sees them after `prelude`.
    local function missing(prelude, req_mod, res_mod)
        local file = os.tmpname()
        helper.write_file(file, prelude .. [[
local contract = require "moonserve.host.contract"
local req, res = require("]] .. req_mod .. [["), require("]] .. res_mod .. [[")
local out = {}
local function check(list, t, what)
    for _, name in ipairs(list) do
        if t[name] == nil then
            out[#out + 1] = what .. "." .. name
        end
    end
end
check(contract.request_fields, req.getters, "request field")
check(contract.request_methods, req.methods, "request")
check(contract.response_methods, res.methods, "response")
io.write("missing:", table.concat(out, " "), "\n")
]])
        local out = helper.run(helper.tool("luajit") .. " " .. helper.sh_quote(file) .. " 2>&1")
        os.remove(file)
        local names = out:match("missing:([^\n]*)\n")
        assert.truthy(names, out)
        return names
    end

    it("lists names, each once", function()
        for _, list in ipairs({ contract.request_fields, contract.request_methods,
                contract.response_methods }) do
            local seen = {}
            assert.truthy(#list > 5)
            for _, name in ipairs(list) do
                assert.is_nil(seen[name], name)
                seen[name] = true
            end
        end
    end)

    it("holds on the core's host", function()
        assert.equal("", missing("", "moonserve.host.core.request",
            "moonserve.host.core.response"))
    end)

    it("holds on OpenResty's host", function()
        local stand_in = 'ngx = { var = {}, req = {}, header = {}, config = { ngx_lua_version = 1 } }\n'
        assert.equal("", missing(stand_in, "moonserve.host.openresty.request",
            "moonserve.host.openresty.response"))
    end)

    it("fails a host that lacks a name", function()
        local prelude = 'require("moonserve.host.core.response").methods.redirect = nil\n'
        assert.equal("response.redirect", missing(prelude, "moonserve.host.core.request",
            "moonserve.host.core.response"))
    end)
end)
