-- spec/it/ngx_diff_spec.lua: the same OpenResty handlers (spec/fixtures/ngx_cases.lua) on
-- moonserve and on Debian's nginx with the lua module; the status, the body and the fields
-- each case names must be the same (not Server, Date, framing, or moonserve's security
-- fields).
local helper = require "helper"
local raw_client = require "ngx_raw_client"

local q = helper.sh_quote

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
    { path = "/protocol_text", fields = { "x-a", "x-c", "set-cookie" } },
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
    -- ngx.req.socket (spec/fixtures/ngx_socket_cases.lua)
    { path = "/sock_body", send = "hello world\nline2\r\nrest" },
    { path = "/sock_body", name = "a chunked body", head = "Transfer-Encoding: chunked\r\n",
      raw_body = "5\r\nhello\r\n0\r\n\r\n" },
    { path = "/sock_body", name = "no body", method = "POST" },
    { path = "/sock_until", send = "abc--defgh--tail" },
    { path = "/sock_until", name = "a pattern at the end", send = "abc--defgh--tail--" },
    { path = "/sock_slow", head = "Content-Length: 6\r\n", raw_body = "x" },
    { path = "/sock_until_sized", send = "ab--c--\r\nxy==rest" },
    { path = "/upload", head = "Content-Type: multipart/form-data; boundary=up-b0undary\r\n",
      send = (dofile((os.getenv("MOONSERVE_SRC") or ".") .. "/spec/fixtures/multipart_body.lua")
          .body("up-b0undary", 40000)) },
    { path = "/upload_tcp?n=40000" },
    { path = "/sock_read_first", send = "x" },
}

describe("OpenResty handlers on moonserve and on nginx with the lua module", function()
    local srv, nginx, static

    setup(function()
        helper.tool("nginx.websocket.server") -- (lua-nginx-websocket, for resty_echo)
        local work = helper.sh(helper.tool("mktemp") .. " -d"):gsub("%s+$", "")
        static = work .. "/static"
        helper.sh(helper.tool("mkdir") .. " " .. helper.sh_quote(static))
        helper.write_file(static .. "/public.txt", "public\n")
        helper.write_file(static .. "/secret.txt", "secret\n")
        srv = helper.spawn_server { app = "spec/fixtures/ngx_diff.lua",
            env = { STATIC_DIR = static } }
        nginx = helper.nginx_lua([[
    server {
        listen 127.0.0.1:%d;
        location / {
            content_by_lua_block {
                local name = ngx.var.uri:sub(2)
                local fn = require("ngx_cases")[name] or require("ngx_socket_cases")[name]
                fn()
            }
        }
        location /phase/ {
            access_by_lua_block { require("ngx_phase_cases").access() }
            header_filter_by_lua_block { require("ngx_phase_cases").header_filter() }
            body_filter_by_lua_block { require("ngx_phase_cases").body_filter() }
            content_by_lua_block { require("ngx_phase_cases").content() }
        }
        location /phase/static/ {
            access_by_lua_block { require("ngx_phase_cases").access() }
            alias %s/;
        }
    }]], static)
    end)

    teardown(function()
        if srv then srv:stop() end
        if nginx then nginx.stop() end
        if static then
            os.execute("rm -rf " .. helper.sh_quote(static:match("^(.*)/static$")))
        end
    end)

    local function fetch(port, case)
        local method = case.method or (case.send or case.raw_body) and "POST" or "GET"
        local raw = method .. " " .. case.path .. " HTTP/1.1\r\nHost: diff.test\r\n"
            .. (case.head or "")
        if case.send then
            raw = raw .. "Content-Length: " .. #case.send .. "\r\n\r\n" .. case.send
        else
            raw = raw .. "\r\n" .. (case.raw_body or "")
        end
        return assert(helper.request(port, raw))
    end

    for _, case in ipairs(CASES) do
        it("answers " .. case.path .. (case.name and " (" .. case.name .. ")" or "")
            .. " as nginx does", function()
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

    it("hands the same raw connection after a 101 (ngx.req.socket(true)) as nginx does",
        function()
            local want, want_head = raw_client.exchange(nginx.port)
            local got, got_head = raw_client.exchange(srv.port)
            assert.equal(101, want_head.status)
            assert.equal(want_head.status, got_head.status)
            assert.equal(want_head.headers.upgrade, got_head.headers.upgrade)
            assert.equal(want_head.headers.connection:lower(), got_head.headers.connection)
            assert.equal(want, got)
        end)

    it("echoes python3-websockets' messages through resty.websocket.server as nginx does",
        function()
            local function run(port)
                return (helper.run(q(helper.tool("websockets")) .. " "
                    .. q(helper.root .. "/spec/it/ws_client.py") .. " " .. port
                    .. " resty_echo 2>&1"))
            end
            local want = run(nginx.port)
            assert.matches("close_code=4000", want, 1, true)
            assert.equal(want, run(srv.port))
        end)
end)
