-- The table of limits (MS_LIMITS in core/base/settings.h) and what is made from it: the keys the
-- module takes, its defaults, `moonserve --help`, and the guide's table (docs/guide/limits.md),
-- which is checked here.
describe("limits", function()
    local core = require("moonserve.base").core
    local root = os.getenv("MOONSERVE_SRC") or "."

    -- The rows of the guide's table of limits: { key = default } and the keys in order.
    local function guide_rows()
        local f = assert(io.open(root .. "/docs/guide/limits.md", "rb"))
        local text = f:read("*a")
        f:close()
        local start = assert(text:find("\n| key | default | answer when exceeded |\n", 1, true),
            "docs/guide/limits.md has no table of limits")
        local rows, order = {}, {}
        local pos = text:find("\n", start + 1, true) + 1
        for line in text:sub(pos):gmatch("([^\n]*)\n") do
            if line:sub(1, 1) ~= "|" then
                break
            end
            local key, default = line:match("^| `([%w_]+)` | ([^|]-) |")
            if key then
                assert.is_nil(rows[key], "docs/guide/limits.md lists " .. key .. " twice")
                rows[key] = default
                order[#order + 1] = key
            else
                assert.matches("^|[-|]+|$", line, nil, "not a row of limits: " .. line)
            end
        end
        return rows, order
    end

    -- What `moonserve --help` writes.
    local function help()
        local out = {}
        local stdout = io.stdout
        io.stdout = { write = function(_, ...) -- luacheck: ignore 122 (what --help writes, caught)
            for _, s in ipairs { ... } do
                out[#out + 1] = s
            end
        end }
        local ok, rc = pcall(require("moonserve.cli").main, { "--help" })
        io.stdout = stdout -- luacheck: ignore 122
        assert(ok, rc)
        assert.equal(0, rc)
        return table.concat(out)
    end

    it("are listed by core.limits() with their defaults, units and docs", function()
        local defaults = core.default_limits()
        local seen = 0
        for _, l in ipairs(core.limits()) do
            assert.is_string(l.key)
            assert.equal(defaults[l.key], l.default, l.key)
            assert.is_number(l.default)
            assert.truthy(({ count = 1, bytes = 1, bits = 1, ["bytes/s"] = 1, s = 1 })[l.unit],
                l.key .. ": " .. tostring(l.unit))
            assert.is_true(#l.doc > 0 and #l.doc <= 62, l.key .. ": one short line of doc")
            seen = seen + 1
        end
        local n = 0
        for _ in pairs(defaults) do
            n = n + 1
        end
        assert.equal(n, seen)
        assert.equal(10, defaults.head_timeout) -- seconds, stored as milliseconds
        assert.equal(8388608, defaults.body_bytes)
        assert.equal(0, defaults.body_bytes_max)
    end)

    it("are each a row of the guide's table, with the default the core has", function()
        local rows = guide_rows()
        for _, l in ipairs(core.limits()) do
            assert.is_not_nil(rows[l.key], "docs/guide/limits.md's table has no row for " .. l.key)
            assert.equal(string.format("%.14g", l.default), rows[l.key],
                "docs/guide/limits.md's default of " .. l.key)
            rows[l.key] = nil
        end
        assert.is_nil(next(rows), "docs/guide/limits.md lists a limit the core does not have: "
            .. tostring(next(rows)))
    end)

    it("are each taken by core.server, up to what the field holds", function()
        for _, l in ipairs(core.limits()) do
            local srv = core.server { on_request = function() end, on_resume = function() end,
                limits = { [l.key] = l.default } }
            srv:close()
            local ok, err = pcall(core.server, { on_request = function() end,
                on_resume = function() end, limits = { [l.key] = -1 } })
            assert.is_false(ok, l.key)
            assert.matches("bad limit " .. l.key .. " %(out of range: 0 to [%d.e+]+%)", err)
        end
        local ok, err = pcall(core.server, { on_request = function() end,
            on_resume = function() end, limits = { head_timeout = 4294968 } })
        assert.is_false(ok) -- seconds past what milliseconds in 32 bits hold
        assert.matches("bad limit head_timeout %(out of range: 0 to 4294967.295%)", err)
        ok, err = pcall(core.server, { on_request = function() end, on_resume = function() end,
            limits = { no_such_limit = 1 } })
        assert.is_false(ok)
        assert.matches("unknown limit no_such_limit", err)
    end)

    it("are each in `moonserve --help`, with its default and doc", function()
        local text = help()
        for _, l in ipairs(core.limits()) do
            local line = l.key .. "=" .. string.format("%.14g", l.default)
            local at = text:find("\n    " .. line .. " +" .. l.doc:gsub("%p", "%%%0") .. "\n")
            assert.is_not_nil(at, "--help has no line for " .. line)
        end
        assert.matches("default " .. core.defaults().stop_timeout .. "%)", text)
        for line in text:gmatch("[^\n]+") do
            assert.is_true(#line <= 100, "a line of --help too long: " .. line)
        end
    end)

    it("share the other defaults through core.defaults()", function()
        local d = core.defaults()
        assert.equal(511, d.backlog)
        assert.equal(1024, d.static_cache_files)
        assert.equal(64 * 1024 * 1024, d.static_cache_bytes)
        assert.equal(30, d.stop_timeout)
        -- and the guide says what they are
        local text = ""
        for _, page in ipairs({ "operations", "static-files" }) do
            local f = assert(io.open(root .. "/docs/guide/" .. page .. ".md", "rb"))
            text = text .. f:read("*a")
            f:close()
        end
        assert.truthy(text:find("`--stop-timeout`, " .. d.stop_timeout .. " s", 1, true),
            "docs/guide/operations.md's stop timeout")
        assert.truthy(text:find("static_cache = { files%s+=%s+" .. d.static_cache_files
            .. ", bytes = " .. d.static_cache_bytes / 1048576 .. " %* 1024 %* 1024 }"),
            "docs/guide/static-files.md's static cache")
    end)
end)
