-- spec/rock/rock_spec.lua: the versioned rock as a user gets it. The rockspec is packed from
-- a git+file:// copy of this checkout (its working tree as it is, at the rockspec's tag),
-- the packed rock is installed offline into a tree of its own, and the installed `moonserve`
-- checks an example app with that tree's modules and core, on the LuaJIT the documented
-- rule finds; luarocks lint passes on the rockspecs.
local helper = require "helper"

local q = helper.sh_quote
local ROOT = helper.root
local ROCKSPEC = "moonserve-0.2.0-1.rockspec"

local function sh(cmd)
    local out, status = helper.run(cmd .. " 2>&1")
    assert(status == 0, cmd .. ":\n" .. out)
    return out
end

-- The environment of this suite (a source tree's paths and core) is not a user's.
local CLEAN = "unset LUA_PATH LUA_CPATH MOONSERVE_CORE MOONSERVE_DEMO; "

describe("the rock", function()
    local tmp, tree, bin

    setup(function()
        tmp = sh("mktemp -d"):match("[^\n]+")
        tree = tmp .. "/tree"
        bin = tree .. "/bin/moonserve" -- (a shell script: run as `sh BIN`, as its #! says)
        local git = helper.tool("git")
        -- The working tree as a commit (untracked files too, what .gitignore leaves), made
        -- with an index of its own: the checkout's index and branches are not touched.
        local index = q(tmp .. "/index")
        local head = sh(git .. " -C " .. q(ROOT) .. " rev-parse HEAD"):match("%x+")
        sh("GIT_INDEX_FILE=" .. index .. " " .. git .. " -C " .. q(ROOT) .. " read-tree HEAD")
        sh("GIT_INDEX_FILE=" .. index .. " " .. git .. " -C " .. q(ROOT) .. " add -A")
        local t = sh("GIT_INDEX_FILE=" .. index .. " " .. git .. " -C " .. q(ROOT)
            .. " write-tree"):match("%x+")
        local commit = sh(git .. " -C " .. q(ROOT) .. " -c user.name=spec -c user.email=spec@"
            .. "localhost commit-tree " .. t .. " -p " .. head .. " -m 'the working tree'")
            :match("%x+")
        sh(git .. " clone -q --shared " .. q(ROOT) .. " " .. q(tmp .. "/repo"))
        local text = helper.read_file(ROOT .. "/rockspec/" .. ROCKSPEC)
        local tag = assert(text:match('\n   tag = "([^"]+)"'), "the rockspec names a tag")
        sh(git .. " -C " .. q(tmp .. "/repo") .. " tag -f " .. tag .. " " .. commit)
        local copy, n = text:gsub('\n   url = "git%+https://[^"]+"',
            '\n   url = "git+file://' .. tmp .. '/repo"')
        assert(n == 1, "the rockspec's source.url is a git+https URL")
        helper.write_file(tmp .. "/" .. ROCKSPEC, copy)
    end)

    teardown(function()
        if tmp and tmp:match("^/tmp/") then
            os.execute("rm -rf " .. q(tmp))
        end
    end)

    it("packs from git+file:// and installs offline into a tree, with --deps-mode=none",
        function()
            local luarocks = CLEAN .. helper.tool("luarocks")
            sh("cd " .. q(tmp) .. " && " .. luarocks .. " pack " .. ROCKSPEC)
            local rock = tmp .. "/moonserve-0.2.0-1.src.rock"
            assert.truthy(io.open(rock), "no " .. rock)
            sh("cd " .. q(tmp) .. " && " .. luarocks .. " install --tree " .. q(tree)
                .. " --deps-mode=none " .. q(rock))
            assert.truthy(io.open(tree .. "/lib/lua/5.1/moonserve/core.so"))
            assert.truthy(io.open(tree .. "/share/lua/5.1/moonserve/cli.lua"))
            -- the demo's template and static files, beside it
            for _, file in ipairs { "static/demo.css", "static/demo.js", "static/moon.svg",
                "views/index.html", "views/layout.html", "views/slow.html" } do
                assert.truthy(io.open(tree .. "/share/lua/5.1/moonserve/demo/" .. file), file)
            end
        end)

    it("runs moonserve --check from the tree, on its own modules and core", function()
        local out = sh(CLEAN .. "sh " .. q(bin) .. " --version")
        assert.matches("^moonserve 0%.2%.0 on LuaJIT 2%.1[^,]*, from "
            .. (tree .. "/share/lua/5.1/moonserve"):gsub("%p", "%%%0"), out)
        out = sh(CLEAN .. "sh " .. q(bin) .. " " .. q(ROOT .. "/examples/demo.lua") .. " --check")
        assert.matches("demo.lua: the app and its options are valid\n$", out)
        out = sh(CLEAN .. "sh " .. q(bin) .. " --check") -- the demo site the rock installed
        assert.matches("the demo site: the app and its options are valid\n$", out)
    end)

    it("finds LuaJIT by its rule: MOONSERVE_LUAJIT, then the tree's, then PATH's", function()
        local luajit = helper.tool("luajit")
        -- A LuaJIT that says it ran, before running the real one.
        local function marked(path, mark)
            helper.write_file(path, "#!/bin/sh\necho " .. mark .. " >&2\nexec " .. q(luajit)
                .. ' "$@"\n')
            sh("chmod +x " .. q(path))
        end
        marked(tree .. "/bin/luajit", "the-trees")
        marked(tmp .. "/explicit", "the-explicit-one")
        local out = sh(CLEAN .. "sh " .. q(bin) .. " --version")
        assert.matches("^the%-trees\nmoonserve 0%.2%.0", out)
        out = sh(CLEAN .. "MOONSERVE_LUAJIT=" .. q(tmp .. "/explicit") .. " sh " .. q(bin)
            .. " --version")
        assert.matches("^the%-explicit%-one\nmoonserve 0%.2%.0", out)
        os.remove(tree .. "/bin/luajit")
        out = sh(CLEAN .. "sh " .. q(bin) .. " --version")
        assert.matches("^moonserve 0%.2%.0", out)
        out = helper.run(CLEAN .. "MOONSERVE_LUAJIT=" .. q(tmp .. "/none") .. " sh " .. q(bin)
            .. " --version 2>&1")
        assert.matches("MOONSERVE_LUAJIT=.*/none: no such program", out)
    end)

    it("refuses PUC Lua with a message that says what to do", function()
        local out, status = helper.run(CLEAN .. "MOONSERVE_LUAJIT=" .. q(helper.tool("lua5.1"))
            .. " sh " .. q(bin) .. " --check 2>&1")
        assert.equal(2, status, out)
        assert.matches("^moonserve: [^\n]*lua5%.1 is Lua 5%.1, not LuaJIT: moonserve needs "
            .. "LuaJIT 2%.1 %(its FFI%)%. Set MOONSERVE_LUAJIT to a LuaJIT", out)
    end)

    it("serves an app to its own spec, under plain busted in its directory, with no socket",
        function()
            local dir = tmp .. "/app"
            sh("mkdir -p " .. q(dir .. "/spec"))
            helper.write_file(dir .. "/app.lua", [[
local moonserve = require "moonserve"
local app = moonserve.app()
app:post("/login", function(req, res)
    res:cookie("user", req:form().user)
    res:redirect("/me", 303)
end)
app:get("/me", function(req, res) res:send("hello " .. (req.cookies.user or "nobody")) end)
return app
]])
            helper.write_file(dir .. "/spec/app_spec.lua", [[
local app = dofile("app.lua")
describe("the app", function()
    it("logs in", function()
        local t = app:test()
        assert.equal(303, t:post("/login", { form = { user = "ada" } }).status)
        assert.equal("hello ada", t:get("/me").body)
        t:close()
    end)
end)
]])
            helper.write_file(dir .. "/.busted", 'return { default = { lua = "luajit" } }\n')
            -- The tree's modules and core, as `luarocks path` gives them to a user's shell.
            local paths = sh(CLEAN .. helper.tool("luarocks") .. " path --lr-path --tree "
                .. q(tree)):match("[^\n]+")
            local cpaths = sh(CLEAN .. helper.tool("luarocks") .. " path --lr-cpath --tree "
                .. q(tree)):match("[^\n]+")
            local out = sh(CLEAN .. "cd " .. q(dir) .. " && LUA_PATH=" .. q(paths .. ";;")
                .. " LUA_CPATH=" .. q(cpaths .. ";;") .. " " .. helper.tool("busted") .. " -o TAP")
            assert.matches("ok 1 %- the app logs in", out)
            -- (and the module it used is the tree's)
            helper.write_file(dir .. "/where.lua",
                'io.write(package.searchpath("moonserve.test", package.path))')
            local where = sh(CLEAN .. "LUA_PATH=" .. q(paths .. ";;") .. " "
                .. helper.tool("luajit") .. " " .. q(dir .. "/where.lua"))
            assert.equal(tree .. "/share/lua/5.1/moonserve/test.lua", where)
        end)

    it("passes luarocks lint", function()
        local luarocks = CLEAN .. helper.tool("luarocks")
        for _, spec in ipairs { ROCKSPEC, "moonserve-scm-1.rockspec" } do
            local out, status = helper.run(luarocks .. " lint " .. q(ROOT .. "/rockspec/" .. spec)
                .. " 2>&1")
            assert.equal(0, status, spec .. ": " .. out)
        end
    end)
end)
