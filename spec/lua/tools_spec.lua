-- spec/lua/tools_spec.lua: the list of what the tests need (spec/tools.txt), helper.tool, and
-- the lint that checks every command the specs run against the list, fed fake specs.
local helper = require "helper"
local tools = require "tools"

local LIST = assert(tools.parse([[
base     rm        coreutils
base     timeout   coreutils
command  curl      curl
command  wrk       wrk
python   h2        python3-h2
]]))

-- The problems the lint finds in one fake file.
local function lint(text, shell)
    local path = shell and "spec/fake-run" or "spec/it/fake_spec.lua"
    local result = tools.lint({ { path = path, text = text, shell = shell },
        { path = "spec/helper.lua", text = helper.read_file(helper.root .. "/spec/helper.lua"),
            context = true } }, LIST, helper.root)
    return result[path]
end

describe("spec/tools.txt", function()
    it("reads as KIND NAME PACKAGE [PATH], and says which line is wrong", function()
        local list = assert(tools.read(helper.root .. "/spec/tools.txt"))
        assert.equal("nghttp2-client", list.by_name.nghttp.package)
        assert.equal("nghttp2-client", list.by_name.h2load.package)
        local ok, why = tools.parse("base rm coreutils\n\ncommand curl\n")
        assert.is_nil(ok)
        assert.matches("^3: expected KIND NAME PACKAGE", why)
        ok, why = tools.parse("tool rm coreutils\n")
        assert.is_nil(ok)
        assert.matches("^1: ", why)
        ok, why = tools.parse("base rm coreutils\nbase rm coreutils\n")
        assert.is_nil(ok)
        assert.matches("rm is listed twice", why)
    end)

    it("is what rockspec/install-deps installs for the tests", function()
        local out, status = helper.run(helper.root .. "/rockspec/install-deps --list")
        assert.equal(0, status, out)
        local pkgs = {}
        for p in out:gmatch("%S+") do
            pkgs[p] = true
        end
        for _, e in ipairs(assert(tools.read(helper.root .. "/spec/tools.txt")).entries) do
            assert.is_true(pkgs[e.package], e.name .. ": " .. e.package .. " is not installed")
        end
        assert.is_true(pkgs["nghttp2-client"])
        out = helper.run(helper.root .. "/rockspec/install-deps --run-only --list")
        assert.is_nil(out:find("nghttp2-client", 1, true))
    end)
end)

describe("helper.tool", function()
    it("returns the path of a listed program", function()
        local curl = helper.tool("curl")
        assert.matches("/curl$", curl)
        assert.equal(0, select(2, helper.run(helper.sh_quote(curl) .. " --version >/dev/null")))
    end)

    it("fails naming the package when a listed program is missing", function()
        local found, why = tools.find { kind = "command", name = "moonserve-no-such-tool",
            package = "moonserve-no-such-package" }
        assert.is_nil(found)
        assert.matches("moonserve%-no%-such%-tool is missing: install the Debian package "
            .. "moonserve%-no%-such%-package", why)
        found, why = tools.find { kind = "service", name = "moonserve-no-such-server",
            package = "moonserve-server-package", path = "/nonexistent/*/bin/server" }
        assert.is_nil(found)
        assert.matches("install the Debian package moonserve%-server%-package", why)
    end)

    it("checks a Python module with Debian's python3, not the first on PATH", function()
        local found, why = tools.find { kind = "python", name = "moonserve_no_such_module",
            package = "python3-moonserve-fake" }
        assert.is_nil(found)
        assert.matches("Python module moonserve_no_such_module %(for /usr/bin/python3%) is "
            .. "missing: install the Debian package python3%-moonserve%-fake", why)
        assert.equal("/usr/bin/python3", tools.find { kind = "python", name = "os",
            package = "python3" })
    end)

    it("fails for a program that is not listed", function()
        local ok, err = pcall(helper.tool, "moonserve-unlisted")
        assert.is_false(ok)
        assert.matches("moonserve%-unlisted is not in spec/tools.txt", err)
    end)
end)

describe("the tools lint", function()
    it("names the file, the line and the command that is not listed", function()
        local problems = lint([[
local helper = require "helper"
helper.run("rm -rf /tmp/x")
os.execute("frobnicate --now")
]])
        assert.same({ "3: frobnicate is not in spec/tools.txt: add it there with the Debian "
            .. "package that brings it" }, problems)
    end)

    it("follows pipes, timeout, format strings, locals and the command-running helpers", function()
        local problems = lint([[
local helper = require "helper"
local write, sh = helper.write_file, helper.sh
local function background(cmd)
    io.popen(("( %s ) >/dev/null 2>&1 &"):format(cmd))
end
helper.sh("rm -f x | frob1 -x")
sh("timeout 10 frob2 && rm x")
io.popen(("%s -c 1 http://127.0.0.1:%d/"):format("frob3", 80))
local cmd = "frob4 " .. "-v"
os.execute(cmd)
background("frob5 --all")
local p = io.popen("echo $(frob6 -n) 2>&1")
]])
        local named = {}
        for _, p in ipairs(problems) do
            named[#named + 1] = p:match("^(%d+: %S+)")
        end
        assert.same({ "6: frob1", "7: frob2", "8: frob3", "10: frob4", "11: frob5",
            "12: frob6" }, named)
    end)

    it("asks for helper.tool when a listed program is run by its name", function()
        local problems = lint([[
local helper = require "helper"
local wrk = io.popen(("wrk -c 8 http://127.0.0.1:%d/"):format(80))
helper.run(helper.tool("wrk") .. " -c 8 http://127.0.0.1/")
helper.run(helper.tool("frob") .. " -c 8")
]])
        assert.equal(2, #problems)
        assert.matches("^2: wrk is run by its name: run it as helper.tool%(\"wrk\"%), which names "
            .. "its package %(wrk%)", problems[1])
        assert.matches("^4: helper.tool%(\"frob\"%): frob is not in spec/tools.txt", problems[2])
    end)

    it("lets base programs, builtins, helper.tool and project scripts through", function()
        assert.same({}, lint([[
local helper = require "helper"
local BIN = os.getenv("MOONSERVE_BIN") or (helper.root .. "/lua/bin/moonserve")
os.execute("kill -0 1 2>/dev/null; rm -f /tmp/none")
helper.run(helper.tool("curl") .. " -sS http://127.0.0.1/ 2>&1")
helper.run("timeout 5 " .. helper.tool("h2") .. " -c 'import h2'")
io.popen(BIN .. " --version")
helper.run(helper.root .. "/spec/run --help")
]]))
    end)

    it("flags a command it cannot read", function()
        local problems = lint([[
local helper = require "helper"
local t = { cmd = "frob" }
helper.run(t.cmd .. " -x")
]])
        assert.equal(1, #problems)
        assert.matches("^3: a command whose program the source does not spell out %(t.cmd%)",
            problems[1])
    end)

    it("checks the commands of a shell script", function()
        local problems = lint([[
#!/usr/bin/env bash
cd "$(dirname "$0")/.."
log=$(mktemp)
run() {
    rm -f "$1" && frob7 "$1" || { wrk -c 1 "$1"; return 1; }
}
run x 2>&1 | tee -a "$log"
passed=$(frob8 -c '^ok ' "$log")
UBSAN_OPTIONS=halt_on_error=1 \
    frob9 build
]], true)
        local named = {}
        for _, p in ipairs(problems) do
            named[#named + 1] = p:match("^(%d+: %S+)")
        end
        assert.same({ "2: dirname", "3: mktemp", "5: frob7", "7: tee", "8: frob8", "9: frob9" },
            named)
    end)

    it("runs as spec/lint-tools, printing TAP and failing on a fake spec", function()
        local dir = os.tmpname()
        os.remove(dir)
        assert(os.execute("mkdir -p " .. helper.sh_quote(dir)) == 0)
        helper.write_file(dir .. "/tools.txt", "base rm coreutils\n")
        helper.write_file(dir .. "/fake_spec.lua", 'os.execute("rm -f x")\nos.execute("frob -x")\n')
        local out, status = helper.run(helper.root .. "/spec/lint-tools " .. helper.sh_quote(dir
            .. "/tools.txt") .. " " .. helper.sh_quote(dir .. "/fake_spec.lua") .. " 2>&1")
        os.execute("rm -rf " .. helper.sh_quote(dir))
        assert.equal(1, status, out)
        assert.matches("\nnot ok 2 %- tools: every command [^\n]*fake_spec.lua runs", out)
        assert.matches("#   [^\n]*fake_spec.lua:2: frob is not in spec/tools.txt", out)
    end)
end)
