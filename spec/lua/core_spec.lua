-- The setup functions of the C module (modules/ms_core.c): what they refuse, and how.
describe("moonserve.core", function()
    local core = require("moonserve.base").core

    describe("log_level", function()
        after_each(function()
            core.log_level(2) -- info, the default
        end)

        it("takes the levels 0 (error) to 3 (debug)", function()
            for level = 0, 3 do
                assert.has_no.errors(function() core.log_level(level) end)
            end
        end)

        it("refuses a level outside them, or not a whole number, with the range", function()
            for _, bad in ipairs { 4, 7, -1, 1.5, 1e300, 0 / 0 } do
                local ok, err = pcall(core.log_level, bad)
                assert.is_false(ok, tostring(bad))
                assert.matches("log level 0 %(error%) to 3 %(debug%) expected, got", err)
            end
            assert.is_false((pcall(core.log_level, "loud")))
        end)

        it("holds core.log to the same levels", function()
            local ok, err = pcall(core.log, 9, "a line")
            assert.is_false(ok)
            assert.matches("log level 0 %(error%) to 3 %(debug%) expected, got 9", err)
        end)
    end)

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
