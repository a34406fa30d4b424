-- spec/it/ngx_diff_spec.lua: the same OpenResty handlers (spec/fixtures/ngx_cases.lua) on
-- moonserve and on Debian's nginx with the lua module; the status, the body and the fields
-- each case names must be the same (not Server, Date, framing, or moonserve's security
-- fields).
local helper = require "helper"

local CASES = {
    { path = "/say" }, -- (no type set: nginx's default_type against moonserve's text/plain; charset=utf-8)
    { path = "/header", fields = { "content-type", "x-multi", "x-single", "x-gone", "x-replaced" } },
    { path = "/request?a=1&flag&r=1&r=2&e=x%20y", head = "X-Diff: d\r\nX-Multi: 1\r\nX-Multi: 2\r\n" },
    { path = "/var?a=1%202&b", head = "X-Diff: d\r\nCookie: c1=v1; c2=v%202\r\n" },
    { path = "/codecs" },
    { path = "/exit_forbidden", fields = { "x-kept" }, body = false }, -- each its error page
    { path = "/exit_after_output" },
    { path = "/exit_ok" },
    { path = "/redirect", fields = { "location" }, body = false },
    { path = "/ctx" },
}

describe("OpenResty handlers on moonserve and on nginx with the lua module", function()
    local srv, nginx

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/ngx_diff.lua" }
        nginx = helper.nginx_lua [[
    server {
        listen 127.0.0.1:%d;
        location / {
            content_by_lua_block { require("ngx_cases")[ngx.var.uri:sub(2)]() }
        }
    }]]
    end)

    teardown(function()
        if srv then srv:stop() end
        if nginx then nginx.stop() end
    end)

    local function fetch(port, case)
        local raw = "GET " .. case.path .. " HTTP/1.1\r\nHost: diff.test\r\n" .. (case.head or "")
            .. "\r\n"
        return assert(helper.request(port, raw))
    end

    for _, case in ipairs(CASES) do
        it("answers " .. case.path .. " as nginx does", function()
            local want = fetch(nginx.port, case)
            local got = fetch(srv.port, case)
            assert.equal(want.status, got.status)
            if case.body ~= false then
                assert.equal(want.body, got.body)
            end
            for _, f in ipairs(case.fields or {}) do
                assert.equal(want.headers[f], got.headers[f], f)
            end
        end)
    end
end)
