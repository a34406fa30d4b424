-- Trailer fields after a streamed reply, over HTTP/1.1 (chunked) and HTTP/2 (a HEADERS frame).
local helper = require "helper"

describe("moonserve reply trailers", function()
    local srv, dir

    setup(function()
        dir = os.tmpname()
        os.remove(dir)
        helper.sh("mkdir -p " .. dir)
        helper.write_file(dir .. "/app.lua", [[
local moonserve = require "moonserve"
local app = moonserve.app()
app:get("/trail", function(req, res)
    res:write("part one ")
    res:trailer("x-checksum", "c0ffee")
    res:write("part two")
end)
app:get("/framing", function(req, res)
    local ok, err = pcall(res.trailer, res, "content-length", "1")
    local ok2, err2 = pcall(res.trailer, res, "x-bad", "a\r\nb")
    return tostring(ok) .. " " .. tostring(err):match("ERESERVED") .. " " ..
        tostring(ok2) .. " " .. tostring(err2):match("EBADHEADER")
end)
return app
]])
        srv = helper.spawn_server { app = dir .. "/app.lua" }
    end)

    teardown(function()
        srv:stop()
        os.execute("rm -rf " .. dir)
    end)

    it("sends them after the last chunk over HTTP/1.1", function()
        local s = helper.connect(srv.port, 3)
        assert(s:send("GET /trail HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"))
        local all = s:receive("*a")
        s:close()
        assert.matches("transfer%-encoding: chunked\r\n", all)
        assert.matches("\r\n\r\n9\r\npart one \r\n8\r\npart two\r\n0\r\nx%-checksum: c0ffee\r\n\r\n$",
            all)
    end)

    it("sends them in a HEADERS frame that ends the stream over HTTP/2", function()
        local out = helper.sh("timeout 10 " .. helper.tool("nghttp") .. " -v http://127.0.0.1:"
            .. srv.port .. "/trail 2>&1")
        assert.matches("part one part two", out)
        -- the trailer comes after the DATA, in a HEADERS frame with END_STREAM
        local data = out:find("recv DATA frame", 1, true)
        local trailer = out:find("recv %(stream_id=%d+%) x%-checksum: c0ffee")
        local last = out:find("recv HEADERS frame <length=%d+, flags=0x05")
        assert.truthy(data and trailer and last, out)
        assert.is_true(data < trailer and trailer < last, out)
    end)

    it("refuses fields that frame the message, and split values", function()
        local res = helper.curl("http://127.0.0.1:" .. srv.port .. "/framing")
        assert.matches("false ERESERVED false EBADHEADER", res)
    end)
end)

-- Request trailers: kept apart from the headers and copied when they arrive, so a handler that
-- waits after reading the body sees its own fields, never another client's bytes.
describe("moonserve request trailers", function()
    local srv, dir

    setup(function()
        dir = os.tmpname()
        os.remove(dir)
        helper.sh("mkdir -p " .. dir)
        helper.write_file(dir .. "/app.lua", [[
local moonserve = require "moonserve"
local app = moonserve.app()
app:post("/late", function(req, res)
    local body = assert(req:body())
    moonserve.sleep(0.3) -- other connections use the worker's read buffer meanwhile
    local out = { "body=" .. body, "ip=" .. req.client_ip }
    for k, v in pairs(req:headers()) do out[#out + 1] = "h:" .. k .. "=" .. v end
    for k, v in pairs(req:trailers()) do out[#out + 1] = "t:" .. k .. "=" .. v end
    table.sort(out)
    return table.concat(out, "\n")
end)
app:get("/", function() return "ok" end)
return app
]])
        srv = helper.spawn_server { app = dir .. "/app.lua", args = "--trusted-proxy 127.0.0.1/32" }
    end)

    teardown(function()
        srv:stop()
        os.execute("rm -rf " .. dir)
    end)

    it("are never headers and never another client's bytes", function()
        local a = helper.connect(srv.port, 5)
        assert(a:send("POST /late HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" ..
            "5\r\nhello\r\n0\r\nX-Forwarded-For: 6.6.6.6\r\nX-Sum: 99\r\n\r\n"))
        -- while the first handler sleeps, another client's fields pass through the buffer
        for _ = 1, 5 do
            local v = helper.connect(srv.port, 5)
            assert(v:send("GET / HTTP/1.1\r\nHost: t\r\nCookie: session=victim-secret\r\n" ..
                "Authorization: Bearer victim-token\r\nX-Pad: " .. ("v"):rep(200) .. "\r\n\r\n"))
            assert.equal(200, helper.read_response(v).status)
            v:close()
        end
        local r = helper.read_response(a)
        a:close()
        assert.equal(200, r.status)
        assert.equal(table.concat({
            "body=hello", "h:host=t", "h:transfer-encoding=chunked", "ip=127.0.0.1",
            "t:x-forwarded-for=6.6.6.6", "t:x-sum=99" }, "\n"), r.body)
        assert.not_matches("victim", r.body)
    end)
end)
