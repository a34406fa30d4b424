-- The setup functions of the C module (modules/ms_core.c): what they refuse, and how.
describe("moonserve.core", function()
    local core = require("moonserve.base").core

    describe("limits", function()
        -- Makes a server with `limits` and closes it again.
        local function server(limits)
            local srv = core.server { on_request = function() end, on_resume = function() end,
                limits = limits }
            srv:close()
            return true
        end

        it("count IPv6 sources by /64 unless told", function()
            assert.equal(64, core.default_limits().source_ipv6_prefix)
            assert.is_true(server { source_ipv6_prefix = 128 })
            assert.is_true(server { source_ipv6_prefix = 0 })
        end)

        it("refuse a prefix longer than an address", function()
            local ok, err = pcall(server, { source_ipv6_prefix = 129 })
            assert.is_false(ok)
            assert.matches("bad limit source_ipv6_prefix %(out of range: 0 to 128%)", err)
        end)
    end)
end)
