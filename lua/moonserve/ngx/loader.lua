-- moonserve/ngx/loader.lua: what `require` finds for code written for OpenResty. Debian's
-- lua-resty-core puts resty/core/*.lua and ngx/*.lua on LuaJIT's default path; they declare
-- nginx's C functions and fail outside nginx. A searcher ahead of the path answers for those
-- names first: resty.core and its parts succeed, ngx.semaphore, ngx.errlog, ngx.process,
-- ngx.base64, ngx.resp and ngx.re are moonserve's, the others say they are not supported. And
-- `require "resty.X"` loads Debian's nginx.X (lua-nginx-redis installs nginx/redis.lua) when
-- no resty/X.lua is installed.
-- luacheck: globals ngx (installed by moonserve.ngx before any of this runs)
local _M = {}

local RESTY_CORE_VERSION = "0.1.25"

local function new_tab()
    return {}
end
pcall(function() new_tab = require "table.new" end)
local clear_tab = function(t)
    for k in pairs(t) do
        t[k] = nil
    end
end
pcall(function() clear_tab = require "table.clear" end)

-- resty.core.base: the helpers libraries take from it; nginx's FFI status codes.
local function core_base()
    local ffi = require "ffi"
    local str_buf_size, str_buf = 4096, nil
    local size_ptr
    return {
        version = RESTY_CORE_VERSION,
        new_tab = new_tab,
        clear_tab = clear_tab,
        FFI_OK = 0, FFI_NO_REQ_CTX = -100, FFI_BAD_CONTEXT = -101, FFI_ERROR = -1,
        FFI_AGAIN = -2, FFI_BUSY = -3, FFI_DONE = -4, FFI_DECLINED = -5,
        get_string_buf = function(size, must_alloc)
            if size > str_buf_size or must_alloc then
                return ffi.new("unsigned char[?]", size)
            end
            str_buf = str_buf or ffi.new("unsigned char[?]", str_buf_size)
            return str_buf
        end,
        get_string_buf_size = function() return str_buf_size end,
        get_size_ptr = function()
            size_ptr = size_ptr or ffi.new("size_t[1]")
            return size_ptr
        end,
        get_request = function() return nil end,
        ref_in_table = function(tb, key)
            local n = #tb + 1
            tb[n] = key
            return n
        end,
    }
end

-- What moonserve answers for a name, or nil to leave it to the path.
local modules = {
    ["resty.core"] = function() return { version = RESTY_CORE_VERSION } end,
    ["resty.core.base"] = core_base,
    ["ngx.semaphore"] = function()
        local sema = require "moonserve.host.core.semaphore"
        return { version = RESTY_CORE_VERSION, new = function(n) return sema.new(n) end }
    end,
    ["ngx.errlog"] = function() return require "moonserve.ngx.errlog" end,
    ["ngx.ssl"] = function() return require "moonserve.ngx.ssl" end,
    ["ngx.process"] = function() return require "moonserve.ngx.process" end,
    ["ngx.re"] = function() return require "moonserve.ngx.re" end,
    ["ngx.base64"] = function()
        local crypto = require "moonserve.crypto"
        return { version = RESTY_CORE_VERSION, encode_base64url = crypto.base64url_encode,
            decode_base64url = function(s)
                if type(s) ~= "string" then
                    error("string argument only", 2)
                end
                return crypto.base64url_decode(s)
            end }
    end,
    ["ngx.resp"] = function()
        return { version = RESTY_CORE_VERSION, add_header = function(name, value)
            local header = ngx.header
            local old = header[name]
            if old == nil then
                header[name] = value
            else
                local list = type(old) == "table" and old or { old }
                list[#list + 1] = value
                header[name] = list
            end
        end }
    end,
}

-- Debian's ngx.* modules that moonserve has no answer for.
local UNSUPPORTED = { ["ngx.balancer"] = true, ["ngx.ocsp"] = true, ["ngx.pipe"] = true,
    ["ngx.req"] = true, ["ngx.ssl.session"] = true,
    ["ngx.ssl.clienthello"] = true }

local function loader_for(make)
    return function()
        return make()
    end
end

local function searcher(name)
    local make = modules[name]
    if make then
        return loader_for(make)
    end
    if name:sub(1, 11) == "resty.core." then
        -- resty.core's parts patch ngx.* with nginx's FFI: here they are moonserve's already.
        return function() return true end
    end
    if UNSUPPORTED[name] then
        return function()
            error("module '" .. name .. "' is not supported by moonserve", 3)
        end
    end
    local rest = name:match("^resty%.(.+)$")
    if rest and not package.searchpath(name, package.path)
            and not package.searchpath(name, package.cpath) then
        local alt = "nginx." .. rest
        if package.searchpath(alt, package.path) then
            return function() return require(alt) end -- one copy under both names
        end
        return "\n\tno module '" .. alt .. "' (moonserve looks for resty.X as nginx.X too)"
    end
    return nil
end
_M.searcher = searcher

-- Installs the searcher right after package.preload's (once, even if this module reloads).
function _M.install()
    local loaders = package.loaders
    local registry = debug.getregistry()
    for i = 1, #loaders do
        if loaders[i] == registry["moonserve.ngx.searcher"] then
            table.remove(loaders, i)
            break
        end
    end
    registry["moonserve.ngx.searcher"] = searcher
    table.insert(loaders, 2, searcher)
end

return _M
