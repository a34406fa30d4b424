-- The FFI boundary: base.lua checks its cdef and constants against what the core exports.
describe("moonserve.base and the core's ABI", function()
    local ffi = require "ffi"
    local base = require "moonserve.base"
    local helper = require "helper"

    local function copy(t)
        local c = {}
        for k, v in pairs(t) do
            c[k] = v
        end
        return c
    end

    local function failure(abi)
        local ok, err = pcall(base.check_abi, abi)
        assert.is_false(ok)
        return err
    end

    it("takes the flags, error codes and levels from the core", function()
        local abi = base.abi
        assert.equal(abi.REQ_IN_HANDLER, base.REQ_IN_HANDLER)
        assert.equal(abi.REQ_STATIC_DIR, base.REQ_STATIC_DIR)
        assert.equal(abi.EAGAIN, base.EAGAIN)
        assert.equal(abi.ECLOSED, base.ECLOSED)
        assert.equal(abi.LOG_DEBUG, base.LOG_DEBUG)
        -- What the core names them must match: a code the core returns is the one Lua expects.
        assert.equal("EAGAIN", ffi.string(base.C.ms_ffi_err_name(base.EAGAIN)))
        assert.equal("ECLOSED", ffi.string(base.C.ms_ffi_err_name(base.ECLOSED)))
        assert.equal(ffi.sizeof("ms_req_view_t"), abi["sizeof(ms_req_view_t)"])
        assert.equal(ffi.offsetof("ms_req_view_t", "flags"), abi["offsetof(ms_req_view_t, flags)"])
        assert.equal(ffi.sizeof("ms_header_t"), abi["sizeof(ms_header_t)"])
        assert.is_table(base.check_abi(abi))
    end)

    it("fails with a clear message when a field's offset differs", function()
        local abi = copy(base.abi)
        abi["offsetof(ms_req_view_t, flags)"] = abi["offsetof(ms_req_view_t, flags)"] + 4
        local err = failure(abi)
        assert.matches("moonserve.core and lua/moonserve/host/core/base.lua disagree on "
            .. "offsetof%(ms_req_view_t, flags%)", err)
        assert.matches("rebuild/reinstall", err)
    end)

    it("fails when a size differs, or the core lacks a constant", function()
        local abi = copy(base.abi)
        abi["sizeof(ms_str_t)"] = 8
        assert.matches("disagree on sizeof%(ms_str_t%) %(core: 8, Lua: 16%)", failure(abi))
        abi = copy(base.abi)
        abi.REQ_IN_HANDLER = nil
        assert.matches("disagree on REQ_IN_HANDLER %(core: missing", failure(abi))
    end)

    it("refuses to load over a cdef that does not match the core", function()
        -- A fresh LuaJIT whose view lacks a field, as a base.lua of another build would have.
        local script = os.tmpname()
        local f = assert(io.open(script, "w"))
        f:write([[
local ffi = require "ffi"
ffi.cdef [=[
typedef struct ms_str_s { const char *base; size_t len; } ms_str_t;
typedef struct ms_header_s { ms_str_t name, value; } ms_header_t;
typedef struct ms_req_view_s {
    ms_str_t method, target, path, query;
    uint32_t id;
    uint16_t version;
    uint16_t status;
    int32_t handler;
    int32_t nheaders;
    uint32_t flags;
    int64_t content_length;
} ms_req_view_t;
]=]
local ok, err = pcall(require, "moonserve.base")
io.write(ok and "loaded" or err)
]])
        f:close()
        local out = helper.run(helper.tool("luajit") .. " " .. script .. " 2>&1")
        os.remove(script)
        assert.matches("moonserve.core and lua/moonserve/host/core/base.lua disagree on "
            .. "offsetof%(ms_req_view_t, wait%)", out)
        assert.matches("rebuild/reinstall", out)
    end)
end)
