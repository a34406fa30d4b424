-- The test client (moonserve.test) against the world: a handler that talks to a real server
-- over a socket while the client waits, and an app's own spec run by plain `busted` in the
-- app's directory.
local helper = require "helper"
local moonserve = require "moonserve"

local q = helper.sh_quote

describe("the test client", function()
    it("turns the loop for a handler's socket to a real server", function()
        local peer = helper.spawn_server { app = "spec/fixtures/app.lua" }
        local app = moonserve.app()
        app:get("/fetch", function(_, res)
            local s = moonserve.socket.tcp()
            s:settimeout(2000)
            assert(s:connect("127.0.0.1", peer.port))
            assert(s:send("GET /hello HTTP/1.1\r\nHost: peer\r\nConnection: close\r\n\r\n"))
            local reply = assert(s:receive("*a"))
            s:close()
            res:send(reply:match("\r\n\r\n(.*)$"))
        end)
        local t = app:test()
        local ok, r = pcall(t.get, t, "/fetch")
        t:close()
        peer:stop()
        assert(ok, r)
        assert.equal(200, r.status)
        assert.equal("hello world", r.body)
    end)

    it("runs an app's own spec under plain busted in the app's directory", function()
        local dir = helper.sh("mktemp -d"):match("[^\n]+")
        helper.write_file(dir .. "/app.lua", [[
local moonserve = require "moonserve"
local app = moonserve.app()
app:get("/", function(_, res) res:send("hello") end)
app:post("/double", function(req, res) res:json({ n = req:json().n * 2 }) end)
return app
]])
        helper.sh("mkdir " .. q(dir .. "/spec"))
        helper.write_file(dir .. "/spec/app_spec.lua", [[
local app = dofile("app.lua")
describe("the app", function()
    it("answers", function()
        local t = app:test()
        assert.equal("hello", t:get("/").body)
        assert.same({ n = 4 }, t:post("/double", { json = { n = 2 } }):json())
        assert.equal(404, t:get("/nowhere").status)
        t:close()
    end)
    it("can fail", function()
        assert.equal("bye", app:test():get("/").body)
    end)
end)
]])
        helper.write_file(dir .. "/.busted", 'return { default = { lua = "luajit" } }\n')
        -- (busted from PATH, as a user runs it; LUA_PATH and MOONSERVE_CORE make this tree
        -- the installed moonserve)
        local out = helper.run("cd " .. q(dir) .. " && " .. helper.tool("busted")
            .. " -o TAP 2>&1")
        os.execute("rm -rf " .. q(dir))
        assert.matches("ok 1 %- the app answers", out)
        assert.matches("not ok 2 %- the app can fail", out)
        assert.matches("Expected objects to be equal", out)
    end)
end)
