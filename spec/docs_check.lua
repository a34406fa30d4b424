-- spec/docs_check.lua: what keeps the docs honest. Every public function of the modules
-- config.ld lists has a doc comment (a block starting with `---` right above it, or an
-- `@function NAME` tag for one the file does not define by name); every relative link of
-- the docs' own pages reaches a file, and a heading when it names one. Used by
-- spec/lua/docs_spec.lua; `luajit spec/docs_check.lua` from the top of the tree prints the
-- problems and fails when there are any.
local _M = {}

local function read(path)
    local f = io.open(path, "rb")
    if not f then
        return nil
    end
    local s = f:read("*a")
    f:close()
    return s
end

local function lines_of(text)
    local t = {}
    for line in (text .. "\n"):gmatch("([^\n]*)\n") do
        t[#t + 1] = line
    end
    return t
end

-- The source files config.ld lists (its `file` table), read as Lua.
function _M.ldoc_files(root)
    local text = assert(read(root .. "/config.ld"), "no config.ld")
    local env = {}
    local chunk = assert(loadstring(text, "config.ld"))
    setfenv(chunk, env)
    chunk()
    return env.file
end

-- True when the comment block right above line `i` of `lines` starts with `---` (a block
-- ends, going up, at a section line "-- -- Name ----").
local function documented_at(lines, i)
    local j = i - 1
    local first
    while j >= 1 and lines[j]:match("^%s*%-%-") and not lines[j]:match("^%-%- %-%- ") do
        first = lines[j]
        j = j - 1
    end
    return first ~= nil and first:match("^%s*%-%-%-") ~= nil
end

local LITERAL = { ["true"] = true, ["false"] = true, ["nil"] = true }

-- The problems of one module file: public functions with no doc comment. `mod` is the
-- module's table (its exported functions are checked too), or nil.
function _M.check_module(path, text, mod)
    local lines = lines_of(text)
    local problems, seen, tagged = {}, {}, {}
    for _, line in ipairs(lines) do
        local name = line:match("^%s*%-%-.-@function%s+([%w_.:]+)")
        if name then
            tagged[name:match("([%w_]+)$")] = true
        end
    end
    local function need(i, owner, name)
        seen[owner .. "." .. name] = true
        if name:sub(1, 1) == "_" or tagged[name] then
            return
        end
        if not documented_at(lines, i) then
            problems[#problems + 1] = string.format("%s:%d: %s%s%s has no doc comment (---)",
                path, i, owner == "_M" and "" or owner, owner == "_M" and "" or ":", name)
        end
    end
    for i, line in ipairs(lines) do
        -- function _M.name(...), function Class:name(...), function Class.name(...)
        local owner, name = line:match("^function%s+([%w_]+)[.:]([%w_]+)%s*%(")
        if owner and (owner == "_M" or owner:match("^%u")) then
            need(i, owner, name)
        else
            -- _M.name = value (a function, by the module's table), Class.name = value
            local rhs
            owner, name, rhs = line:match("^([%w_]+)%.([%w_]+)%s*=%s*(.*)$")
            if owner == "_M" then
                if mod and type(mod[name]) == "function" then
                    need(i, owner, name)
                end
            elseif owner and owner:match("^%u") and not rhs:match("^[\"'%d{]")
                and not LITERAL[rhs] and rhs ~= owner then
                need(i, owner, name)
            end
        end
    end
    -- A function the table exports that no line above defines by its name (made in a loop,
    -- or copied from another module) needs an @function tag.
    if mod then
        for name, v in pairs(mod) do
            if type(v) == "function" and not seen["_M." .. name] and not tagged[name]
                and name:sub(1, 1) ~= "_" then
                problems[#problems + 1] = string.format(
                    "%s: %s is exported but not defined by name in the file: document it "
                        .. "with a --- block holding @function %s", path, name, name)
            end
        end
    end
    return problems
end

-- The module name of a file under lua/: lua/moonserve/app.lua is moonserve.app.
local function module_name(path)
    local m = path:match("lua/(.-)%.lua$"):gsub("/init$", ""):gsub("/", ".")
    return m
end

-- Modules that load only inside nginx (they run on its Lua module's ngx): checked from
-- their text alone.
local NGINX_ONLY = { ["moonserve.host.openresty"] = true }

-- Every public function of every file config.ld lists.
function _M.check_api(root)
    local problems = {}
    for _, file in ipairs(_M.ldoc_files(root)) do
        local text = read(root .. "/" .. file)
        if not text then
            problems[#problems + 1] = file .. ": listed in config.ld but missing"
        else
            local name = module_name(file)
            local ok, mod = true, nil
            if not NGINX_ONLY[name] then
                ok, mod = pcall(require, name)
            end
            if not ok then
                problems[#problems + 1] = file .. ": does not load: " .. tostring(mod)
                mod = nil
            elseif type(mod) ~= "table" then
                mod = nil
            end
            for _, p in ipairs(_M.check_module(file, text, mod)) do
                problems[#problems + 1] = p
            end
        end
    end
    return problems
end

-- GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces
-- made `-`; a repeated one gets -1, -2, ...
local function anchor(heading, used)
    local a = heading:gsub("`", ""):gsub("%b<>", ""):lower()
    a = a:gsub("[^%w%s%-_\128-\255]", ""):gsub("%s", "-")
    local n = used[a]
    used[a] = (n or -1) + 1
    if n then
        a = a .. "-" .. (n + 1)
    end
    return a
end

-- The anchors of a Markdown file's headings (outside fenced code).
function _M.anchors(text)
    local set, used, fence = {}, {}, false
    for _, line in ipairs(lines_of(text)) do
        if line:match("^%s*```") then
            fence = not fence
        elseif not fence then
            local h = line:match("^#+%s+(.-)%s*#*%s*$")
            if h then
                set[anchor(h, used)] = true
            end
        end
    end
    return set
end

-- The relative links of a Markdown file, outside fenced code and inline code:
-- { { line = n, target = "x.md#y" }, ... }.
function _M.links(text)
    local out, fence = {}, false
    for n, line in ipairs(lines_of(text)) do
        if line:match("^%s*```") then
            fence = not fence
        elseif not fence then
            local plain = line:gsub("``.-``", ""):gsub("`[^`]*`", "")
            for target in plain:gmatch("%]%(([^)%s]+)[^)]*%)") do
                if not target:match("^%a[%w+.-]*:") then -- http:, https:, mailto:
                    out[#out + 1] = { line = n, target = target }
                end
            end
        end
    end
    return out
end

local function dirname(path)
    return path:match("^(.*)/[^/]*$") or "."
end

-- Collapses "a/b/../c" and "./" in a relative path.
local function normalize(path)
    local parts = {}
    for seg in path:gmatch("[^/]+") do
        if seg == ".." and #parts > 0 and parts[#parts] ~= ".." then
            parts[#parts] = nil
        elseif seg ~= "." then
            parts[#parts + 1] = seg
        end
    end
    return table.concat(parts, "/")
end

local function exists(path)
    local f = io.open(path, "rb")
    if f then
        f:close()
        return true
    end
    return false
end

-- The problems of the links of `files` (paths relative to root).
function _M.check_links(root, files)
    local problems, anchors_of = {}, {}
    for _, file in ipairs(files) do
        local text = read(root .. "/" .. file)
        if not text then
            problems[#problems + 1] = file .. ": missing"
        else
            for _, l in ipairs(_M.links(text)) do
                local path, frag = l.target:match("^([^#]*)#?(.*)$")
                local target = path == "" and file or normalize(dirname(file) .. "/" .. path)
                if path ~= "" and not exists(root .. "/" .. target) then
                    problems[#problems + 1] = string.format("%s:%d: link to %s: no such file",
                        file, l.line, l.target)
                elseif frag ~= "" and target:match("%.md$") then
                    if not anchors_of[target] then
                        anchors_of[target] = _M.anchors(read(root .. "/" .. target) or "")
                    end
                    if not anchors_of[target][frag] then
                        problems[#problems + 1] = string.format(
                            "%s:%d: link to %s: %s has no heading #%s", file, l.line, l.target,
                            target, frag)
                    end
                end
            end
        end
    end
    return problems
end

-- The pages whose links are checked: the top-level ones, the example app's, and everything
-- under docs/.
function _M.pages(root)
    local files = { "README.md", "ARCHITECTURE.md", "PERFORMANCE.md", "CHANGELOG.md",
        "bench/README.md", "examples/board/README.md" }
    local lfs = require "lfs"
    local function walk(dir)
        local names = {}
        for name in lfs.dir(root .. "/" .. dir) do
            if name:sub(1, 1) ~= "." then
                names[#names + 1] = name
            end
        end
        table.sort(names)
        for _, name in ipairs(names) do
            local path = dir .. "/" .. name
            if lfs.attributes(root .. "/" .. path, "mode") == "directory" then
                walk(path)
            elseif name:match("%.md$") then
                files[#files + 1] = path
            end
        end
    end
    walk("docs")
    return files
end

if not pcall(debug.getlocal, 4, 1) then -- run as a script, not required
    local root = os.getenv("MOONSERVE_SRC") or "."
    local problems = _M.check_api(root)
    for _, p in ipairs(_M.check_links(root, _M.pages(root))) do
        problems[#problems + 1] = p
    end
    for _, p in ipairs(problems) do
        io.stderr:write(p, "\n")
    end
    os.exit(#problems == 0 and 0 or 1)
end

return _M
