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
