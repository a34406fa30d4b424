-- The core's folders are its layers (ARCHITECTURE.md, "The core's folders"): a file includes,
-- and its object calls, only its own folder and the folders below it. Two views, so that
-- neither a header that declares too much nor a call without an include slips through:
-- the `#include` lines of the sources, and the symbols of the built objects.
describe("the core's folders", function()
    local helper = require "helper"
    local root = os.getenv("MOONSERVE_SRC") or "."
    local lib = os.getenv("MOONSERVE_CORE_LIB")

    -- What each folder may use besides itself. client/ sits beside http/ and tunnel/: an
    -- outbound socket is no request, and no request handling needs one.
    local below = {
        base = {},
        process = { base = true },
        engine = { base = true, process = true },
        transport = { base = true, process = true, engine = true },
        http = { base = true, process = true, engine = true, transport = true },
        tunnel = { base = true, process = true, engine = true, transport = true, http = true },
        client = { base = true, process = true, engine = true, transport = true },
    }

    -- A file at the top of core/ is in no folder: moonserve.h (the public API, declarations
    -- only) may be included anywhere, and parts.c, the table that names every part, is above
    -- them all; the engine reads that table and nothing else of it.
    local from_top = { ["moonserve.h"] = true }
    local tables = { ms__parts = true, ms__protos = true }

    local function may(from, to)
        return from == to or below[from][to] == true
    end

    local function read(path)
        local f = assert(io.open(path, "rb"))
        local s = f:read("*a")
        f:close()
        return s
    end

    -- Every source under core/, by path relative to core/.
    local function sources()
        local lfs = require "lfs"
        local found = {}
        local function walk(dir, rel)
            for name in lfs.dir(dir) do
                if name:sub(1, 1) ~= "." then
                    local path, r = dir .. "/" .. name, rel .. name
                    if lfs.attributes(path, "mode") == "directory" then
                        walk(path, r .. "/")
                    elseif name:match("%.[ch]$") then
                        found[#found + 1] = r
                    end
                end
            end
        end
        walk(root .. "/core", "")
        table.sort(found)
        return found
    end

    local function folder(rel)
        return rel:match("^([%w_]+)/")
    end

    -- The violations in `text`, the source `rel`, as "file -> include" lines.
    local function bad_includes(rel, text)
        local bad = {}
        local from = folder(rel)
        for inc in text:gmatch('#include "([^"]+)"') do
            local to = folder(inc)
            if from and to and below[to] and not may(from, to) then
                bad[#bad + 1] = rel .. " -> " .. inc
            elseif from and not to and not from_top[inc] then
                bad[#bad + 1] = rel .. " -> " .. inc .. " (a file at the top of core/)"
            end
        end
        return bad
    end

    it("knows each folder of core/", function()
        for _, rel in ipairs(sources()) do
            local f = folder(rel)
            assert.truthy(f == nil or below[f], "a folder this spec does not know: " .. rel)
        end
    end)

    it("has every #include point down", function()
        local bad = {}
        for _, rel in ipairs(sources()) do
            for _, b in ipairs(bad_includes(rel, read(root .. "/core/" .. rel))) do
                bad[#bad + 1] = b
            end
        end
        assert.same({}, bad)
    end)

    it("would see an #include that points up", function()
        assert.same({ "base/mem.c -> engine/engine.h" },
            bad_includes("base/mem.c", '#include "engine/engine.h"\n'))
        assert.same({ "http/h1.c -> client/sock.h" },
            bad_includes("http/h1.c", '#include "client/sock.h"\n'))
        assert.same({}, bad_includes("tunnel/ws.c", '#include "http/http.h"\n'))
    end)

    -- { object = folder } and { symbol = folder that defines it } from the core's library.
    local function objects()
        assert.truthy(lib, "MOONSERVE_CORE_LIB names the core's static library")
        local p = assert(io.popen(helper.tool("nm") .. " -A " .. lib .. " 2>&1"))
        local out = p:read("*a")
        p:close()
        local uses, defined = {}, {}
        -- An object is named after its path: engine/conn.c builds engine_conn.c.o.
        for object, kind, sym in out:gmatch("([%w_.]+%.o):[%x ]*%s(%a)%s+([%w_.]+)\n") do
            local f = object:match("^([%a]+)_")
            if kind == "U" then
                uses[#uses + 1] = { object = object, folder = f, sym = sym }
            elseif kind:match("[TDRB]") then
                defined[sym] = below[f] and f or "top"
            end
        end
        assert.truthy(#uses > 100, "nm listed the core's objects:\n" .. out)
        return uses, defined
    end

    it("has every call and every datum used point down", function()
        local uses, defined = objects()
        local bad = {}
        for _, u in ipairs(uses) do
            local to = defined[u.sym]
            if u.folder and below[u.folder] and to then
                local ok = may(u.folder, to) or (to == "top" and tables[u.sym])
                if not ok then
                    bad[#bad + 1] = u.object .. " uses " .. u.sym .. " of " .. to .. "/"
                end
            end
        end
        table.sort(bad)
        assert.same({}, bad)
    end)
end)
