-- spec/it/refusals_spec.lua: the app's bodies for the core's refusals, and a handler that
-- goes on after the core refused its request (an upload over the route's limit), through a
-- real server and curl.
local helper = require "helper"

local function curl(args)
    local out = helper.run(helper.tool("curl") .. " -s -o - -w '\\n%{http_code} %{content_type}' "
        .. args)
    local body, status, ctype = out:match("^(.*)\n(%d+) ([^\n]*)$")
    return tonumber(status), ctype, body
end

describe("the app's refusal bodies", function()
    local srv, big

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/refusals.lua" }
        big = os.tmpname()
        local f = assert(io.open(big, "wb"))
        f:write(string.rep("x", 100000))
        f:close()
    end)

    teardown(function()
        srv:stop()
        os.remove(big)
    end)

    local function url(path)
        return ("http://127.0.0.1:%d%s"):format(srv.port, path)
    end

    it("answers an upload over the limit with the app's JSON body; the handler goes on quietly",
        function()
        local log_before = #srv:log()
        local status, ctype, body = curl(("-H 'Accept: application/json' -F file=@%s %s")
            :format(big, url("/upload")))
        assert.equal(413, status)
        assert.equal("application/json", ctype)
        assert.equal('{"error":"too large"}', body)
        assert.truthy(helper.wait_for(function()
            return srv:log():find("after the refusal", log_before, true)
        end, 5))
        local log = srv:log():sub(log_before + 1)
        -- one line for the refusal, one from the handler; no error, no traceback
        assert.equal(1, select(2, log:gsub("413 Content Too Large", "")), log)
        assert.falsy(log:find("traceback", 1, true), log)
        assert.falsy(log:find("error", 1, true), log)
        assert.truthy(log:find("refused=413 parts=0 body=nil/", 1, true), log)
        assert.truthy(log:find("json=nil/", 1, true), log)
        assert.truthy(log:find("json_reply=nil/ESENT: the core answered 413 in the handler's place",
            1, true), log)
        assert.truthy(log:find("parts_again=nil", 1, true), log)
    end)

    it("chooses HTML for a browser, and the first given without Accept, on HTTP/2 too", function()
        local status, ctype, body = curl(("-H 'Accept: text/html,*/*;q=0.8' -F file=@%s %s")
            :format(big, url("/upload")))
        assert.equal(413, status)
        assert.equal("text/html; charset=utf-8", ctype)
        assert.equal("<h1>Too large</h1>", body)
        status, ctype, body = curl(("--http2-prior-knowledge -H 'Accept:' --data-binary @%s %s")
            :format(big, url("/upload")))
        assert.equal(413, status)
        assert.equal("application/json", ctype)
        assert.equal('{"error":"too large"}', body)
    end)

    it("answers a head over head_bytes with the app's text", function()
        local status, ctype, body = curl(("-H 'X-Big: %s' %s"):format(string.rep("a", 70000),
            url("/upload")))
        assert.equal(431, status)
        assert.equal("text/plain; charset=utf-8", ctype)
        assert.equal("head too large\n", body)
    end)
end)
