-- spec/it/ngx_phases_spec.lua: OpenResty's phases as app hooks (app:ngx_access,
-- ngx_header_filter, ngx_body_filter, ngx_log) and ngx.location.capture on a real server
-- (spec/fixtures/ngx_phases.lua), checked against OpenResty's documented behaviour.
local helper = require "helper"
local socket = require "socket"

describe("OpenResty's phases and subrequests", function()
    local srv, dir

    setup(function()
        dir = helper.sh(helper.tool("mktemp") .. " -d"):gsub("%s+$", "")
        helper.write_file(dir .. "/public.txt", "public\n")
        helper.write_file(dir .. "/secret.txt", "secret\n")
        srv = helper.spawn_server { app = "spec/fixtures/ngx_phases.lua",
            env = { STATIC_DIR = dir } }
    end)

    teardown(function()
        if srv then srv:stop() end
        if dir then
            os.execute("rm -rf " .. helper.sh_quote(dir))
        end
    end)

    local twice = helper.twice(it)

    local function get(path, extra)
        return assert(helper.request(srv.port, "GET " .. path .. " HTTP/1.1\r\nHost: phases.test\r\n"
            .. (extra or "") .. "\r\n"))
    end

    describe("ngx_access", function()
        twice("runs before the content in the access phase; ngx.exit(ngx.OK) goes on to it "
            .. "and ends the hook there, sharing ngx.ctx", function()
            local res = get("/ok")
            assert.equal(200, res.status)
            assert.equal("content set access content\n", res.body)
        end)

        twice("may wait (ngx.sleep) before the content runs", function()
            assert.equal("content waited\n", get("/wait").body)
        end)

        twice("ends the request with a status of 300 or more: the error page, with the fields "
            .. "ngx.header set, and the content never runs", function()
            local res = get("/deny")
            assert.equal(403, res.status)
            assert.equal("k", res.headers["x-kept"])
            assert.equal("403 Forbidden\n", res.body)
        end)

        twice("ends the request with what it printed, as OpenResty does", function()
            local res = get("/printed")
            assert.equal(200, res.status)
            assert.equal("from access\n", res.body)
        end)

        twice("ends the request on ngx.exit(200), with an empty body", function()
            local res = get("/exit200")
            assert.equal(200, res.status)
            assert.equal("", res.body)
        end)

        twice("redirects with ngx.redirect", function()
            local res = get("/redirect")
            assert.equal(302, res.status)
            assert.equal("/elsewhere", res.headers["location"])
        end)

        twice("is not stopped by a pcall around ngx.exit", function()
            local res = get("/in_pcall")
            assert.equal(403, res.status)
            assert.is_nil(res.headers["x-reached"])
        end)

        twice("guards plain moonserve routes too", function()
            assert.equal("plain access\n", get("/plain").body)
        end)

        twice("guards the core's static mounts: a file under it is served after the hook, or "
            .. "refused by it", function()
            local res = get("/static/public.txt")
            assert.equal(200, res.status)
            assert.equal("public\n", res.body)
            res = get("/static/secret.txt")
            assert.equal(403, res.status)
            assert.equal("k", res.headers["x-kept"])
            assert.equal("403 Forbidden\n", res.body)
        end)
    end)

    describe("ngx_header_filter", function()
        twice("sees and changes the reply's fields as ngx.header, in the header_filter phase, "
            .. "where the APIs that write or wait raise OpenResty's errors", function()
            local res = get("/hf_disabled")
            assert.equal(200, res.status)
            assert.equal("body\n", res.body)
            local h = res.headers
            assert.equal("header_filter 200", h["x-filtered"])
            local disabled = "API disabled in the context of header_filter_by_lua*"
            assert.equal(disabled, h["x-sleep"])
            assert.equal(disabled, h["x-say"])
            assert.equal(disabled, h["x-sock"])
            assert.equal(disabled, h["x-cap"])
            assert.equal("API disabled in the current context", h["x-arg"])
            assert.equal("text/plain; charset=utf-8", h["x-ct"])
            assert.equal("p", h["x-plain-seen"]) -- a field the handler set with res:header
        end)

        twice("may set ngx.status and remove a field", function()
            local res = get("/hf_status")
            assert.equal(201, res.status)
            assert.is_nil(res.headers["x-plain"])
            assert.equal("body\n", res.body)
        end)

        twice("ends with ngx.exit(ngx.OK); ngx.exit(403) replaces the reply", function()
            local res = get("/hf_exit_ok")
            assert.equal(200, res.status)
            assert.equal("1", res.headers["x-a"])
            assert.is_nil(res.headers["x-b"])
            res = get("/hf_exit")
            assert.equal(403, res.status)
            assert.equal("403 Forbidden\n", res.body)
        end)

        twice("runs on error pages, and not on static files the core sends", function()
            assert.equal("header_filter 403", get("/deny").headers["x-filtered"])
            assert.is_nil(get("/static/public.txt").headers["x-filtered"])
        end)
    end)

    describe("ngx_body_filter", function()
        local disabled = "API disabled in the context of body_filter_by_lua*"
        local tail = "body_filter|" .. disabled .. "|" .. disabled .. "|" .. disabled .. "\n"

        twice("changes ngx.arg[1], and sees ngx.arg[2] on the last piece, of a buffered reply",
            function()
                local res = get("/upper")
                assert.equal(200, res.status)
                assert.equal("HELLO\nWORLD\n" .. tail, res.body)
                assert.equal(tostring(#res.body), res.headers["content-length"])
            end)

        twice("runs on each piece of a streamed reply, and once more at its end", function()
            local res = get("/upper_stream")
            assert.equal("ONE TWO THREE\n" .. tail, res.body)
        end)

        twice("ends the body early when it sets ngx.arg[2]", function()
            local res = get("/trunc")
            assert.equal(200, res.status)
            assert.equal("ONE\n", res.body)
        end)
    end)

    describe("ngx_log", function()
        local disabled = "API disabled in the context of log_by_lua*"

        local function logged(path)
            local line
            assert(helper.wait_for(function()
                line = get("/logged?u=" .. path).body
                return line ~= "nil\n"
            end), "no log line for " .. path)
            return line
        end

        twice("runs after the reply in the log phase, with ngx.var.status, request_time, the "
            .. "arguments, the request's and the reply's fields and ngx.ctx", function()
            get("/ok?x=7", "X-Mark: m1\r\n")
            get("/deny", "X-Mark: m2\r\n")
            assert.equal("log|200|true|7|m1|header_filter 200|access|" .. disabled .. "|"
                .. disabled .. "|" .. disabled .. "\n", logged("/ok"))
            assert.equal("log|403|true|-|m2|header_filter 403|access|" .. disabled .. "|"
                .. disabled .. "|" .. disabled .. "\n", logged("/deny"))
        end)

        twice("runs after a handler that ended with ngx.exit", function()
            get("/gone", "X-Mark: m5\r\n")
            assert.matches("^log|410|true|%-|m5|header_filter 410|access|", logged("/gone"))
        end)

        twice("runs for the static files an access hook guards", function()
            get("/static/public.txt", "X-Mark: m3\r\n")
            assert.matches("^log|200|true|%-|m3|nil|access|", logged("/static/public.txt"))
        end)

        it("does not hold the reply up", function()
            local c = helper.connect(srv.port)
            local t0 = socket.gettime()
            assert(c:send("GET /slowlog HTTP/1.1\r\nHost: phases.test\r\n\r\n"))
            local res = assert(helper.read_response(c))
            local took = socket.gettime() - t0
            c:close()
            assert.equal("quick\n", res.body)
            assert.is_true(took < 0.4, "the reply took " .. took .. " s") -- the hook holds 0.6 s
            socket.sleep(0.7)
        end)
    end)

    describe("ngx.location.capture", function()
        twice("runs a subrequest through the app's routes: method, args, body, the parent's "
            .. "fields and address; res.status, header (any case, lists) and body", function()
            local res = get("/cap", "X-Mark: m4\r\n")
            assert.equal(200, res.status)
            assert.equal("200 sub a=1 POST bb true /sub m4 127.0.0.1 nil false s s table "
                .. "header_filter 200\n"
                .. "200 sub x=1 GET nil true /sub m4 127.0.0.1 nil 404 []\n", res.body)
        end)

        twice("runs the subrequests of capture_multi side by side", function()
            local res = get("/cap_multi")
            assert.equal("slept 0.3\nslept 0.3\nslept 0.3\ntrue\n", res.body)
        end)

        twice("gives the subrequest the ctx option, the parent's variables with share_all_vars, "
            .. "and the vars option", function()
            assert.equal("ctx yes var parent's\nsub from sub ctx nil var option\nnil\n",
                get("/cap_ctx").body)
        end)

        twice("serves static mounts and plain routes, with no access phase, and HEAD with no "
            .. "body", function()
            assert.equal("200 secret\n200 plain nil\n200 []\n", get("/cap_static").body)
        end)

        twice("raises on a bad URI, method or list", function()
            assert.equal("bad argument #1 to 'capture' (a URI that starts with / and has no "
                .. "control characters expected)\nunsupported HTTP "
                .. "method: 3\n"
                .. "at least one subrequest should be specified\n", get("/cap_errors").body)
        end)

        it("stops subrequests nested 50 deep", function()
            assert.equal("stopped at 50: subrequests cycle while processing "
                .. "\"/cap_deep?d=51\"\n", get("/cap_deep").body)
        end)
    end)
end)
