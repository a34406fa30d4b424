-- spec/it/ngx_diff_spec.lua: the same OpenResty handlers (spec/fixtures/ngx_cases.lua) on
-- moonserve and on Debian's nginx with the lua module; the status, the body and the fields
-- each case names must be the same (not Server, Date, framing, or moonserve's security
-- fields).
local helper = require "helper"
local socket = require "socket"

local free_port = helper.free_port

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
    { path = "/capture" },
    -- the phases (spec/fixtures/ngx_phase_cases.lua): access, header and body filters
    { path = "/phase/ok", fields = { "x-filtered" } },
    { path = "/phase/printed", fields = { "x-filtered" } },
    { path = "/phase/exit200" },
    { path = "/phase/deny", fields = { "x-kept", "x-filtered" }, body = false },
    { path = "/phase/status", fields = { "x-filtered" } },
    { path = "/phase/disabled", fields = { "x-sleep", "x-say", "x-sock", "x-cap", "x-arg" } },
    { path = "/phase/upper" },
    { path = "/phase/trunc" },
    { path = "/phase/static/public.txt" },
    { path = "/phase/static/secret.txt", fields = { "x-kept" }, body = false },
}

describe("OpenResty handlers on moonserve and on nginx with the lua module", function()
    local srv, nginx_pid, nport, work

    setup(function()
        local nginx = helper.tool("nginx")
        local lua_mod = helper.tool("ngx_http_lua_module")
        local ndk = helper.tool("ndk_http_module")
        nport = free_port()
        work = helper.sh(helper.tool("mktemp") .. " -d"):gsub("%s+$", "")
        helper.sh(helper.tool("mkdir") .. " " .. helper.sh_quote(work .. "/static"))
        helper.write_file(work .. "/static/public.txt", "public\n")
        helper.write_file(work .. "/static/secret.txt", "secret\n")
        srv = helper.spawn_server { app = "spec/fixtures/ngx_diff.lua",
            env = { STATIC_DIR = work .. "/static" } }
        local conf = string.format([[
load_module %s;
load_module %s;
worker_processes 1;
master_process off;
daemon off;
pid %s/nginx.pid;
error_log %s/error.log;
events { worker_connections 64; }
http {
    access_log off;
    default_type text/plain;
    lua_package_path "%s/spec/fixtures/?.lua;/usr/share/lua/5.1/?.lua;;";
    server {
        listen 127.0.0.1:%d;
        location / {
            content_by_lua_block { require("ngx_cases")[ngx.var.uri:sub(2)]() }
        }
        location /phase/ {
            access_by_lua_block { require("ngx_phase_cases").access() }
            header_filter_by_lua_block { require("ngx_phase_cases").header_filter() }
            body_filter_by_lua_block { require("ngx_phase_cases").body_filter() }
            content_by_lua_block { require("ngx_phase_cases").content() }
        }
        location /phase/static/ {
            access_by_lua_block { require("ngx_phase_cases").access() }
            alias %s/static/;
        }
    }
}
]], ndk, lua_mod, work, work, helper.root, nport, work)
        helper.write_file(work .. "/nginx.conf", conf)
        local p = io.popen(string.format("%s -p %s -c %s/nginx.conf >%s/out.log 2>&1 & echo $!",
            nginx, work, work, work))
        nginx_pid = p:read("*l")
        p:close()
        assert(helper.wait_for(function()
            local c = socket.connect("127.0.0.1", nport)
            if c then
                c:close()
                return true
            end
        end), "nginx did not start: " .. helper.read_file(work .. "/error.log"))
    end)

    teardown(function()
        if srv then srv:stop() end
        if nginx_pid then
            os.execute("kill " .. nginx_pid .. " 2>/dev/null")
        end
        if work then
            os.execute("rm -rf " .. helper.sh_quote(work))
        end
    end)

    local function fetch(port, case)
        local raw = "GET " .. case.path .. " HTTP/1.1\r\nHost: diff.test\r\n" .. (case.head or "")
            .. "\r\n"
        return assert(helper.request(port, raw))
    end

    for _, case in ipairs(CASES) do
        it("answers " .. case.path .. " as nginx does", function()
            local want = fetch(nport, case)
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
