-- ARCHITECTURE.md names files, functions, fields and constants: each must exist in the tree,
-- so the page can be trusted as a map (a rename that forgets it fails here).
describe("ARCHITECTURE.md", function()
    local root = os.getenv("MOONSERVE_SRC") or "."

    local function read(path)
        local f = io.open(path, "rb")
        if not f then
            return nil
        end
        local s = f:read("*a")
        f:close()
        return s
    end

    -- Every source file's text, joined: what a name must appear in; and the core's and the
    -- binding's files by their base name (h1.c is core/http/h1.c).
    local by_name = {}
    local function sources()
        local lfs = require "lfs"
        local parts = {}
        local function walk(dir)
            for name in lfs.dir(dir) do
                local path = dir .. "/" .. name
                if name:sub(1, 1) ~= "." then
                    local mode = lfs.attributes(path, "mode")
                    if mode == "directory" then
                        walk(path)
                    elseif name:match("%.[ch]$") or name:match("%.lua$") then
                        parts[#parts + 1] = read(path)
                        if path:find("/core/", 1, true) or path:find("/modules/", 1, true) then
                            by_name[name] = true
                        end
                    end
                end
            end
        end
        for _, dir in ipairs({ "core", "modules", "lua", "spec", "bench" }) do
            walk(root .. "/" .. dir)
        end
        return table.concat(parts, "\n")
    end

    it("names only files and identifiers that exist", function()
        local page = assert(read(root .. "/ARCHITECTURE.md"))
        local text = sources()
        local missing = {}
        local elsewhere = { content_by_lua = true, ["lua.h"] = true } -- not ours
        -- Whether a name in backquotes is there: a core or binding file by its name (h1.c),
        -- a path (spec/lua/layers_spec.lua), or an identifier with an underscore (a function,
        -- field, constant or type); anything else is prose.
        local function exists(code)
            if elsewhere[code] then
                return true
            elseif code:match("^[%w_]+%.[ch]$") then
                return by_name[code]
            elseif code:match("^[%w_/]+%.[%a]+$") and code:find("/") then
                return read(root .. "/" .. code)
            elseif code:match("^[%a_][%w_]*$") and code:find("_") then
                return text:find(code, 1, true)
            end
            return true
        end
        for code in page:gmatch("`([^`\n]+)`") do
            if not exists(code) then
                missing[#missing + 1] = code
            end
        end
        assert.same({}, missing)
    end)
end)

-- lua/moonserve/ by folder (ARCHITECTURE.md, "The Lua layers"): every module a file names,
-- by require at its top or inside a function (require "x", require("x" .. name),
-- pcall(require, "x")) or as a module's name in a string (package.loaded["x"], a lazy
-- loader's "x"), goes only where its folder may go.
describe("the Lua layers", function()
    local lfs = require "lfs"
    local root = (os.getenv("MOONSERVE_SRC") or ".") .. "/lua/"

    local function read(path)
        local f = assert(io.open(path, "rb"))
        local s = f:read("*a")
        f:close()
        return s
    end

    -- Every Lua file under lua/moonserve: { [module name] = path relative to lua/ }.
    local function modules()
        local out = {}
        local function walk(dir)
            for name in lfs.dir(root .. dir) do
                local rel = dir .. "/" .. name
                if name:sub(1, 1) ~= "." then
                    if lfs.attributes(root .. rel, "mode") == "directory" then
                        walk(rel)
                    elseif name:match("%.lua$") then
                        out[rel:gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", ".")] = rel
                    end
                end
            end
        end
        walk("moonserve")
        return out
    end

    -- The code of a Lua file without its comments, and its string literals (short ones; a
    -- long string is an FFI declaration or a template, never a module's name).
    local function code_and_strings(text)
        local code, strings, i, n = {}, {}, 1, #text
        while i <= n do
            local c = text:sub(i, i)
            local long = text:match("^%[(=*)%[", i)
            if text:sub(i, i + 1) == "--" then
                local eq = text:match("^%-%-%[(=*)%[", i)
                local stop = eq and text:find("]" .. eq .. "]", i, true) or text:find("\n", i)
                i = (stop or n) + (eq and #eq + 2 or 1)
            elseif long then
                local stop = text:find("]" .. long .. "]", i, true) or n
                code[#code + 1] = "[[]]"
                i = stop + #long + 2
            elseif c == '"' or c == "'" then
                local j, s = i + 1, {}
                while j <= n and text:sub(j, j) ~= c do
                    if text:sub(j, j) == "\\" then
                        j = j + 1
                    end
                    s[#s + 1] = text:sub(j, j)
                    j = j + 1
                end
                strings[#strings + 1] = table.concat(s)
                -- in the code, without the quotes it holds: a require in a message is prose
                code[#code + 1] = c .. table.concat(s):gsub("[\"']", "") .. c
                i = j + 1
            else
                code[#code + 1] = c
                i = i + 1
            end
        end
        return table.concat(code), strings
    end

    -- The modules of lua/moonserve that `text` names (a prefix given to require with `..`
    -- names each module under it), and whether it reaches the core's FFI surface.
    local function named(text, all)
        local code, strings = code_and_strings(text)
        local found = {}
        for _, s in ipairs(strings) do
            if all[s] then
                found[s] = true
            end
        end
        for prefix in code:gmatch("require%s*%(?%s*[\"']([%w_.]+)[\"']%s*%.%.") do
            for m in pairs(all) do
                if m:sub(1, #prefix) == prefix then
                    found[m] = true
                end
            end
        end
        for m in code:gmatch("require%s*%(?%s*[\"']([%w_.]*[%w_])[\"']") do
            found[m] = true
        end
        for m in code:gmatch("pcall%(%s*require%s*,%s*[\"']([%w_.]+)[\"']") do
            found[m] = true
        end
        -- The core's library and its functions: moonserve.core, its ms_* symbols through
        -- ffi.C or the C of moonserve/host/core/base.lua, loading it by hand.
        local ffi = found["moonserve.core"] or code:find("%f[%w_]C%.ms_")
            or code:find("luaopen_moonserve") or code:find("package%.loadlib")
        return found, ffi and true or false
    end

    -- The folder a module sits in: "framework" (lua/moonserve/*.lua, pg/ and redis/), "alias"
    -- (a public name that is one `return require "..."` over the module it names), "host" (the
    -- interface), "core", "openresty", "ngx".
    local function folder(path, text)
        if path:match("^moonserve/pg/[%w_]+%.lua$") or path:match("^moonserve/redis/[%w_]+%.lua$")
            then
            return "framework" -- the PostgreSQL and Redis clients, host-free like their parent
        end
        if path:match("^moonserve/[%w_]+%.lua$") then
            local code = code_and_strings(text)
            if code:match("^%s*return require \"moonserve%.host%.[%w_.]+\"%s*$") then
                return "alias"
            end
            return "framework"
        end
        return path:match("^moonserve/host/core/") and "core"
            or path:match("^moonserve/host/openresty/") and "openresty"
            or path:match("^moonserve/host/[%w_]+%.lua$") and "host"
            or path:match("^moonserve/ngx/") and "ngx"
    end

    -- What the tree breaks of the rules: a list of "file: why".
    local function violations()
        local all, kinds, texts = modules(), {}, {}
        for m, path in pairs(all) do
            texts[m] = read(root .. path)
            kinds[m] = folder(path, texts[m])
        end
        local out = {}
        for m, path in pairs(all) do
            local kind = kinds[m]
            local deps, ffi = named(texts[m], all)
            if kind == nil then
                out[#out + 1] = path .. ": in no folder of the layers"
            end
            if ffi and kind ~= "core" and kind ~= "ngx" then
                out[#out + 1] = path .. ": reaches the core's FFI surface outside host/core/ and ngx/"
            end
            for dep in pairs(deps) do
                local to = kinds[dep]
                if dep ~= m and dep:match("^moonserve") then
                    if kind == "framework" and dep ~= "moonserve" and dep ~= "moonserve.host"
                            and to ~= "framework" then
                        out[#out + 1] = path .. ": the framework requires " .. dep
                    end
                    if dep:match("^moonserve%.ngx") and kind ~= "ngx" then
                        out[#out + 1] = path .. ": outside ngx/, requires " .. dep
                    end
                    if kind == "openresty" and (to == "core" or to == "ngx") then
                        out[#out + 1] = path .. ": the OpenResty host requires " .. dep
                    end
                    if to == "alias" then
                        out[#out + 1] = path .. ": requires the public name " .. dep
                            .. " (for apps) instead of its module"
                    end
                end
            end
        end
        table.sort(out)
        return out
    end

    it("hold: the framework requires only its siblings and moonserve.host, only host/core/ "
        .. "and ngx/ reach the core's FFI, only ngx/ requires moonserve.ngx*", function()
        assert.same({}, violations())
    end)

    it("see a require inside a function, by prefix, with pcall and by name in a string",
        function()
        local all = { ["moonserve.host.core.a"] = "", ["moonserve.ngx.b"] = "",
            ["moonserve.host.core.c"] = "", ["moonserve.host.core.d"] = "" }
        local deps, ffi = named([[
local function f() return require("moonserve.host.core." .. name) end
local ok = pcall(require, "moonserve.ngx.b") -- require "moonserve.host.core.x" in a comment
local m = package.loaded["moonserve.host.core.d"]
ffi.cdef [[ int ms_x(void); ]] .. "]]" .. [[
]], all)
        assert.same({ ["moonserve.host.core.a"] = true, ["moonserve.host.core.c"] = true,
            ["moonserve.host.core.d"] = true, ["moonserve.ngx.b"] = true }, deps)
        assert.is_false(ffi)
        assert.is_true(select(2, named("local x = C.ms_ffi_now()", all)))
        assert.is_true(select(2, named('local core = require "moonserve.core"', all)))
    end)
end)
