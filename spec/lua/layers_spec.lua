-- The core's layers, as its built objects show them: the connection layer, the request API,
-- the server and static files call no protocol by name (they go through its ms_proto_t),
-- neither protocol names the other, and the accept stage chooses from the table of protocols
-- (core/parts.c), naming none.
describe("the core's layers", function()
    local helper = require "helper"
    local lib = os.getenv("MOONSERVE_CORE_LIB")

    -- Undefined symbols of each object of the core's library: { ["conn.c.o"] = { sym, ... } }.
    local function undefined()
        assert.truthy(lib, "MOONSERVE_CORE_LIB names the core's static library")
        local p = assert(io.popen(helper.tool("nm") .. " -A -u " .. lib .. " 2>&1"))
        local out = p:read("*a")
        p:close()
        local by_object = {}
        for object, sym in out:gmatch("([%w_.]+%.o):%s+U%s+([%w_]+)") do
            by_object[object] = by_object[object] or {}
            table.insert(by_object[object], sym)
        end
        assert.truthy(by_object["engine_conn.c.o"], "nm listed the core's objects:\n" .. out)
        return by_object
    end

    local function protocol_symbols(syms, pattern)
        local found = {}
        for _, sym in ipairs(syms or {}) do
            if sym:match(pattern) then
                table.insert(found, sym)
            end
        end
        return found
    end

    it("has no protocol named outside the protocols and the accept stage", function()
        local u = undefined()
        for _, object in ipairs({ "engine_conn.c.o", "http_req.c.o", "engine_server.c.o",
            "http_static_static.c.o" }) do
            assert.same({}, protocol_symbols(u[object], "^ms__h[12]_"), object)
        end
        assert.same({}, protocol_symbols(u["http_h1.c.o"], "^ms__h2_"), "h1.c")
        assert.same({}, protocol_symbols(u["http_h2.c.o"], "^ms__h1_"), "h2.c")
    end)

    it("has the accept stage choose from the table of protocols, naming none", function()
        local syms = undefined()["engine_accept.c.o"]
        assert.same({}, protocol_symbols(syms, "^ms__h[12]_"))
        assert.same({ "ms__protos" }, protocol_symbols(syms, "^ms__protos$"))
    end)
end)
