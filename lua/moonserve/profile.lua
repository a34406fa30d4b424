--- moonserve/profile.lua: the sampling profiler's samples, and the files made of them: folded
-- stacks (one line a stack, `frame;frame;frame count`, as flame graph tools read) and a flame
-- graph (SVG). `moonserve --profile` and the metrics listener's GET /profile use it; a handler
-- or a timer may too.
--
-- The worker is sampled at each millisecond of its CPU, as the kernel's timer allows (it may
-- be coarser: Debian's kernels count CPU time in steps of 4 ms). A sample's stack is the Lua
-- frames that ran, outermost first (`module/file.lua:function`), and, when a handler had
-- called into C, that C function; or `[core]` and the C function the core was in, outside any
-- Lua. `[gc]` and `[jit compiler]` are LuaJIT's collector and compiler.
-- @module moonserve.profile
local _M = {}

local concat, sort = table.concat, table.sort
local format, gsub, sub, find = string.format, string.gsub, string.sub, string.find
local floor, max = math.floor, math.max

-- The directories Lua modules load from (package.path's, the working directory), longest
-- first: a frame's file is named from there ("moonserve/app.lua", not its whole path).
local function prefixes()
    local seen, list = {}, {}
    for template in package.path:gmatch("[^;]+") do
        local dir = template:match("^(.*/)%?")
        if dir and dir ~= "./" and not seen[dir] then
            seen[dir] = true
            list[#list + 1] = dir
        end
    end
    local cwd = os.getenv("PWD")
    if cwd and cwd ~= "" then
        list[#list + 1] = cwd:sub(-1) == "/" and cwd or cwd .. "/"
    end
    list[#list + 1] = "./"
    sort(list, function(a, b) return #a > #b end)
    return list
end

local function shorten_frame(frame, dirs)
    for i = 1, #dirs do
        local d = dirs[i]
        if sub(frame, 1, #d) == d then
            return sub(frame, #d + 1)
        end
    end
    return frame
end

--- Samples this worker for `seconds` (default 10, at most 300): the caller waits meanwhile
-- and the worker serves on. On moonserve's own server only.
-- @number[opt=10] seconds
-- @treturn table {[folded stack] = samples}, or nil and an error
-- @treturn number the samples in all
-- @treturn number the CPU seconds the worker used meanwhile
function _M.run(seconds)
    seconds = seconds or 10
    if type(seconds) ~= "number" or seconds <= 0 or seconds > 300 then
        error("bad seconds (a number from 0 to 300 expected)", 2)
    end
    local host = require "moonserve.host"
    local d = host.module("dispatcher")
    if type(d.profile) ~= "function" then
        return nil, "the profiler runs on moonserve's own server only"
    end
    local samples, total, cpu = d.profile(seconds)
    if not samples then
        return nil, total
    end
    local dirs, short = prefixes(), {}
    for stack, n in pairs(samples) do
        local s = gsub(stack, "[^;]+", function(f) return shorten_frame(f, dirs) end)
        short[s] = (short[s] or 0) + n
    end
    return short, total, cpu
end

--- The samples as folded stacks: a line a stack, its count after a space, sorted.
-- @tab samples {[stack] = count}
-- @treturn string
function _M.folded(samples)
    local lines = {}
    for stack, n in pairs(samples) do
        lines[#lines + 1] = format("%s %d", stack, n)
    end
    sort(lines)
    lines[#lines + 1] = ""
    return concat(lines, "\n")
end

--- Reads folded stacks (as _M.folded writes them, or another tool) back into samples.
-- @string text
-- @treturn table {[stack] = count}
function _M.parse_folded(text)
    local samples = {}
    for line in text:gmatch("[^\n]+") do
        local stack, n = line:match("^(.-) (%d+)$")
        if stack then
            samples[stack] = (samples[stack] or 0) + tonumber(n)
        end
    end
    return samples
end

--- The `n` hottest functions, as text: each one's share of the samples in itself (self) and
-- in it and what it called (total), the hottest first.
-- @tab samples {[stack] = count}
-- @int[opt=10] n
-- @treturn string
function _M.summary(samples, n)
    local self, all, sum = {}, {}, 0
    for stack, count in pairs(samples) do
        sum = sum + count
        local seen, leaf = {}, nil
        for frame in stack:gmatch("[^;]+") do
            if not seen[frame] then
                seen[frame] = true
                all[frame] = (all[frame] or 0) + count
            end
            leaf = frame
        end
        if leaf then
            self[leaf] = (self[leaf] or 0) + count
        end
    end
    local names = {}
    for name in pairs(self) do
        names[#names + 1] = name
    end
    sort(names, function(a, b)
        if self[a] ~= self[b] then
            return self[a] > self[b]
        end
        return a < b
    end)
    local out = { format("%d samples\n  self  total  function\n", sum) }
    for i = 1, math.min(n or 10, #names) do
        local name = names[i]
        out[#out + 1] = format("%5.1f%% %5.1f%%  %s\n", 100 * self[name] / sum,
            100 * all[name] / sum, name)
    end
    return concat(out)
end

-- -- The flame graph ----------------------------------------------------------------------

local WIDTH, ROW, TOP, PAD = 1200, 16, 36, 10
local CHAR = 7 -- px a character takes at the font's size, about

local function escape(s)
    return (gsub(s, "[&<>\"]", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;",
        ['"'] = "&quot;" }))
end

-- A frame's colour: Lua frames warm, C frames cool, LuaJIT's own and the totals grey; the
-- shade from the name, so that one function keeps its colour across graphs.
local function colour(name)
    local h = 0
    for i = 1, #name do
        h = (h * 31 + name:byte(i)) % 997
    end
    local t = h / 997
    if find(name, "^%[") or name == "all" then
        return format("rgb(%d,%d,%d)", 170 + floor(t * 30), 170 + floor(t * 30), 170)
    elseif find(name, "%.lua:") then
        return format("rgb(%d,%d,%d)", 225 + floor(t * 30), 90 + floor(t * 110), 40)
    end
    return format("rgb(%d,%d,%d)", 70 + floor(t * 50), 140 + floor(t * 70), 210)
end

-- The samples as a tree of frames: {name, n, kids = {name = node}}.
local function tree(samples)
    local root = { name = "all", n = 0, kids = {} }
    for stack, n in pairs(samples) do
        root.n = root.n + n
        local node = root
        for frame in stack:gmatch("[^;]+") do
            local kid = node.kids[frame]
            if not kid then
                kid = { name = frame, n = 0, kids = {} }
                node.kids[frame] = kid
            end
            kid.n = kid.n + n
            node = kid
        end
    end
    return root
end

local function depth_of(node)
    local d = 0
    for _, kid in pairs(node.kids) do
        d = max(d, depth_of(kid))
    end
    return d + 1
end

--- The samples as a flame graph: an SVG, the outermost frame at the bottom, each frame as wide
-- as its share of the samples; a frame's tooltip gives its name, samples and share.
-- @tab samples {[stack] = count}
-- @tparam[opt] table opts `title`: the graph's title
-- @treturn string
function _M.svg(samples, opts)
    local root = tree(samples)
    local depth = depth_of(root)
    local height = TOP + depth * ROW + PAD
    local scale = root.n > 0 and (WIDTH - 2 * PAD) / root.n or 0
    local out = {
        format('<?xml version="1.0" standalone="no"?>\n<svg version="1.1" width="%d" '
            .. 'height="%d" viewBox="0 0 %d %d" xmlns="http://www.w3.org/2000/svg">\n',
            WIDTH, height, WIDTH, height),
        '<style>text { font-family: monospace; font-size: 12px; fill: #000; } '
            .. 'rect { stroke: #fff; stroke-width: 0.5; } g:hover rect { stroke: #000; }</style>\n',
        format('<rect x="0" y="0" width="%d" height="%d" fill="#f8f8f4"/>\n', WIDTH, height),
        format('<text x="%d" y="22" style="font-size: 15px">%s</text>\n', PAD,
            escape((opts and opts.title or "moonserve profile") .. format(" (%d samples)",
                root.n))),
    }
    local function draw(node, x, level)
        local w = node.n * scale
        if w < 0.3 then
            return
        end
        local y = height - PAD - (level + 1) * ROW
        local share = 100 * node.n / root.n
        out[#out + 1] = format('<g><title>%s: %d samples, %.2f%%</title><rect x="%.1f" '
            .. 'y="%d" width="%.1f" height="%d" fill="%s"/>', escape(node.name), node.n,
            share, x, y, w, ROW - 1, colour(node.name))
        local fits = floor((w - 4) / CHAR)
        if fits >= 3 then
            local label = #node.name <= fits and node.name or sub(node.name, 1, fits - 2) .. ".."
            out[#out + 1] = format('<text x="%.1f" y="%d">%s</text>', x + 3, y + ROW - 4,
                escape(label))
        end
        out[#out + 1] = "</g>\n"
        local names = {}
        for name in pairs(node.kids) do
            names[#names + 1] = name
        end
        sort(names)
        for _, name in ipairs(names) do
            local kid = node.kids[name]
            draw(kid, x, level + 1)
            x = x + kid.n * scale
        end
    end
    if root.n > 0 then
        draw(root, PAD, 0)
    end
    out[#out + 1] = "</svg>\n"
    return concat(out)
end

return _M
