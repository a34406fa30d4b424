-- The framework reaches its host only through moonserve/host/init.lua: defining an app loads no
-- part of the core, and another host can serve it. Each case runs in a fresh LuaJIT, since
-- the specs before it have loaded the core into this one.
describe("moonserve.host", function()
    local helper = require "helper"

    -- Runs `script` in a new LuaJIT with this run's LUA_PATH and core; returns its output.
    local function run(script)
        local file = os.tmpname()
        helper.write_file(file, script)
        local out = helper.run(helper.tool("luajit") .. " " .. helper.sh_quote(file) .. " 2>&1")
        os.remove(file)
        return out
    end

    -- What the child says of the core: the moonserve modules it loaded, and whether the core's
    -- shared object is mapped into the process (whoever opened it: require or ffi.load).
    local REPORT = [[
local function report(when)
    local mods = {}
    for name in pairs(package.loaded) do
        if name:find("^moonserve") then
            mods[#mods + 1] = name
        end
    end
    table.sort(mods)
    local f = assert(io.open("/proc/self/maps"))
    local maps = f:read("*a")
    f:close()
    local so = os.getenv("MOONSERVE_CORE")
    so = (so and so ~= "") and so or "/core.so"
    io.write(when, ": ", table.concat(mods, " "), "\n", when, ": core ",
        maps:find(so, 1, true) and "mapped" or "not mapped", "\n")
end
]]

    it("loads no part of the core for require and an app's definition", function()
        local out = run(REPORT .. [[
local moonserve = require "moonserve"
report("required")
local app = moonserve.app { dev = true, trailing_slash = "strip" }
app:use(function(_, _, nxt) return nxt() end)
app:use(moonserve.sessions { secret = string.rep("s", 32) })
app:use(moonserve.csrf { secret = string.rep("t", 32) })
app:get("/", function(_, res) res:send("home") end)
app:post("user", "/users/:id", function(_, res) res:send("ok") end, { body_bytes = 1e6 })
app:group("/admin", function(g)
    g:use(function(_, _, nxt) return nxt() end)
    g:get("/", function() return "admin" end)
end)
app:error_page(404, function(_, res) return res:status(404):send("none") end)
app:on_error(function() end)
app:views { root = "views" }
app:static("/assets", "/tmp")
local inner = moonserve.app()
inner:get("/", function() return "inner" end)
app:mount("/inner", inner)
local site = app:site("docs.example", { base = "/docs", dev = false })
site:use(function(_, _, nxt) return nxt() end)
site:get("/", function() return "docs" end)
assert(app:url_for("user", { id = 3 }) == "/users/3")
report("defined")
require("moonserve.server").create(app)
report("served")
]])
        -- what each stage loaded, as the child reported it
        local function at(when)
            return out:match(when .. ": ([^\n]*)\n"), out:match(when .. ": core ([^\n]*)\n")
        end
        for _, when in ipairs({ "required", "defined" }) do
            local mods, core = at(when)
            assert.truthy(mods, out)
            assert.equal("not mapped", core, out)
            for _, m in ipairs({ "moonserve.core", "moonserve.host.core.base",
                    "moonserve.host.core.dispatcher", "moonserve.host.core.runner",
                    "moonserve.host.core.request", "moonserve.host.core.response" }) do
                assert.falsy((" " .. mods .. " "):find(" " .. m .. " ", 1, true), m .. " loaded "
                    .. when .. ": " .. mods)
            end
        end
        local mods, core = at("served")
        assert.equal("mapped", core, out)
        assert.truthy(mods:find("moonserve.core", 1, true), mods)
    end)

    it("lets another host serve an app, with no part of the core loaded", function()
        local out = run(REPORT .. [[
local host = require "moonserve.host"
local logged, served = {}, nil
host.use {
    name = "test",
    path_plain = function(p) return not p:find("[^%w%-%._~!$&'()*+,;=:@/%%]") end,
    fields_ok = function(lines) return not lines:find("[%z\1-\8\11\12\14-\31\127]") end,
    log = function(level, msg) logged[#logged + 1] = level .. " " .. msg end,
    now = os.time,
    sleep = function() error("no waits here") end,
    run = function(app, opts) served = { app = app, listen = opts.listen } return true end,
    module = function(name) error("no " .. name .. " here") end,
}
local moonserve = require "moonserve"
local app = moonserve.app()
app:get("/hello/:name", function(req, res) res:send("hello " .. req.params.name) end)
app:get("/boom", function() error("kaboom") end)
app:post("/form", function() return "posted" end)

-- The request and reply objects this host makes: what app:handle uses of them.
local function serve(method, path, fields)
    fields = fields or {}
    local req = setmetatable({ method = method, path = path, target = path, query_string = "",
        id = 7 }, { __index = {
            header = function(_, name) return fields[name] end,
            _static_dir = function() return false end,
        } })
    local res = { code = 200, lines = {} }
    function res:status(c) self.code = c return self end
    function res:header(n, v) self.lines[#self.lines + 1] = n .. ": " .. v .. "\r\n" return self end
    function res:_fields_checked(l) self.lines[#self.lines + 1] = l return self end
    function res:send(b) self.body = b or "" return true end
    function res:sent() return self.body ~= nil end
    function res:_reset() self.lines, self.code = {}, 200 return true end
    function res:redirect(url, c) self.code, self.location, self.body = c, url, "" return true end
    local ok, err = xpcall(function() return app:handle(req, res) end, debug.traceback)
    if not ok then
        app:handle_error(req, res, err)
    end
    return res
end

local function say(name, res)
    io.write(name, ": ", res.code, " ", tostring(res.location or res.body), " | ",
        table.concat(res.lines):gsub("\r\n", "; "), "\n")
end
say("hello", serve("GET", "/hello/ada"))
say("redirect", serve("GET", "/hello//ada"))
say("missing", serve("GET", "/nothing"))
say("boom", serve("GET", "/boom"))
say("cross", serve("POST", "/form", { host = "a.test", origin = "http://evil.test" }))
io.write("log: ", table.concat(logged, " / "):gsub("\n", " "), "\n")
app:run { listen = "here:1" }
io.write("run: ", tostring(served and served.app == app and served.listen), "\n")
report("done")
]])
        assert.matches("hello: 200 hello ada | [^\n]*x%-content%-type%-options: nosniff", out)
        assert.matches("redirect: 308 /hello/ada |", out)
        assert.matches("missing: 404 404 Not Found\n", out)
        local ref = out:match("boom: 500 500 Internal Server Error\nreference: (%x+)")
        assert.truthy(ref, out)
        assert.matches("cross: 403 ", out)
        assert.truthy(out:find("log: [^\n]*err %[" .. ref .. "%] GET /boom: [^\n]*kaboom"), out)
        assert.truthy(out:find("log: [^\n]*warn refused 1 cross%-origin"), out)
        assert.matches("run: here:1\n", out)
        assert.matches("done: core not mapped\n", out)
        assert.falsy(out:match("done: [^\n]*moonserve%.host%.core%.base"), out)
        assert.falsy(out:match("done: [^\n]*moonserve%.core"), out)
    end)

    it("serves app:ngx_content only once the ngx layer has installed itself", function()
        local out = run(REPORT .. [[
local moonserve = require "moonserve"
local app = moonserve.app()
local ok, err = pcall(app.ngx_content, app, "/x", function() end)
io.write("without: ", tostring(ok), " ", tostring(err), "\n")
ok, err = pcall(app.ngx_access, app, function() end)
io.write("hook without: ", tostring(ok), " ", tostring(err), "\n")
report("refused")
require "moonserve.ngx"
ok, err = pcall(app.ngx_content, app, "/x", function() end)
io.write("with: ", tostring(ok), " ", tostring(err), "\n")
]])
        assert.matches('without: false [^\n]*app:ngx_content runs OpenResty code, which needs the '
            .. 'ngx layer: require "moonserve.ngx"', out)
        assert.matches('hook without: false [^\n]*ngx_access runs OpenResty code[^\n]*'
            .. 'require "moonserve.ngx"', out)
        assert.falsy(out:match("refused: [^\n]*moonserve%.ngx"), out)
        assert.matches("with: true ", out)
    end)

    it("refuses a host without every function of the interface", function()
        local host = require "moonserve.host"
        assert.has_error(function() host.use { path_plain = function() end } end,
            "bad host: no function fields_ok")
        assert.has_error(function() host.use("core") end, "bad host (table expected)")
    end)
end)
