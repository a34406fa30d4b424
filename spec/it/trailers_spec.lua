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
