-- spec/lua/profile_spec.lua: moonserve.profile's files, from samples made up here: folded
-- stacks written and read back, the summary's shares, and the flame graph's frames (widths
-- from the samples, the outermost at the bottom, names escaped).
local profile = require "moonserve.profile"

local samples = {
    ["app.lua:handle;app.lua:hot"] = 60,
    ["app.lua:handle;app.lua:cold"] = 10,
    ["app.lua:handle"] = 10,
    ["[core];__write"] = 20,
}

describe("moonserve.profile", function()
    it("writes folded stacks, sorted, and reads them back", function()
        local text = profile.folded(samples)
        assert.equal("[core];__write 20\napp.lua:handle 10\napp.lua:handle;app.lua:cold 10\n"
            .. "app.lua:handle;app.lua:hot 60\n", text)
        assert.same(samples, profile.parse_folded(text))
        -- another tool's lines, a stack repeated: summed; a line with no count: skipped
        assert.same({ ["a;b"] = 3, c = 1 }, profile.parse_folded("a;b 1\nc 1\na;b 2\nnonsense\n"))
    end)

    it("sums up the hottest functions, by their own samples and by all under them", function()
        local text = profile.summary(samples, 4)
        assert.equal("100 samples\n  self  total  function\n"
            .. " 60.0%  60.0%  app.lua:hot\n"
            .. " 20.0%  20.0%  __write\n"
            .. " 10.0%  10.0%  app.lua:cold\n" -- (a tie: in name order)
            .. " 10.0%  80.0%  app.lua:handle\n", text)
        -- a recursive function counts once in each stack's total
        assert.equal("4 samples\n  self  total  function\n100.0% 100.0%  f\n",
            profile.summary({ ["f;f"] = 4 }))
    end)

    it("draws each frame as wide as its share, the outermost at the bottom", function()
        local svg = profile.svg(samples, { title = "a <test>" })
        assert.matches("^<%?xml", svg)
        assert.matches("</svg>\n$", svg)
        assert.matches("a &lt;test&gt; %(100 samples%)", svg)
        local frames = {}
        for name, n, x, y, w in svg:gmatch('<title>([^<]-): (%d+) samples, [%d.]+%%</title>'
            .. '<rect x="([%d.]+)" y="(%d+)" width="([%d.]+)"') do
            frames[name] = { n = tonumber(n), x = tonumber(x), y = tonumber(y), w = tonumber(w) }
        end
        assert.equal(100, frames.all.n)
        assert.equal(80, frames["app.lua:handle"].n)
        assert.near(frames.all.w * 0.6, frames["app.lua:hot"].w, 0.2)
        assert.near(frames.all.w * 0.2, frames["[core]"].w, 0.2)
        -- each level one row above the one below it
        assert.is_true(frames["app.lua:hot"].y < frames["app.lua:handle"].y)
        assert.is_true(frames["app.lua:handle"].y < frames.all.y)
        -- siblings side by side, in name order: [core] first, then app.lua:handle
        assert.near(frames.all.x, frames["[core]"].x, 0.01)
        assert.near(frames["[core]"].x + frames["[core]"].w, frames["app.lua:handle"].x, 0.2)
        -- a name of a C++ template or an anonymous chunk is escaped
        local odd = profile.svg({ ["f<int>&\"x\""] = 1 })
        assert.matches("f&lt;int&gt;&amp;&quot;x&quot;", odd, nil, true)
        assert.is_nil(odd:find("f<int>", 1, true))
    end)

    it("draws nothing but its title for no samples", function()
        local svg = profile.svg({})
        assert.matches("%(0 samples%)", svg)
        assert.is_nil(svg:find("<g>", 1, true))
    end)

    it("refuses seconds out of range before any sampling", function()
        assert.has_error(function() profile.run(0) end,
            "bad seconds (a number from 0 to 300 expected)")
        assert.has_error(function() profile.run(301) end)
        assert.has_error(function() profile.run("10") end)
    end)
end)
