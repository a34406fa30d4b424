-- The docs: every public function of the modules config.ld lists has a doc comment, LDoc
-- builds the API reference from them with no warning, and every relative link of the docs'
-- own pages (README, ARCHITECTURE, PERFORMANCE, CHANGELOG, docs/) reaches its file and
-- heading. Each check is also shown failing on a case made to fail.
describe("the docs", function()
    local helper = require "helper"
    local check = require "docs_check"
    local root = helper.root

    local function tmpdir()
        local out = helper.run(helper.tool("mktemp") .. " -d")
        return (out:gsub("%s+$", ""))
    end

    describe("doc comments", function()
        it("cover every public function of the modules config.ld lists", function()
            assert.same({}, check.check_api(root))
        end)

        it("are required of a module function, a method and an exported alias", function()
            local text = table.concat({
                "local _M = {}",
                "local Thing = {}",
                "--- Documented.",
                "function _M.good() end",
                "-- A plain comment is not a doc comment.",
                "function _M.plain() end",
                "function Thing:method() end",
                "local function helper() end",
                "_M.alias = helper",
                "function _M._private() end",
                "return _M",
            }, "\n")
            local mod = { good = function() end, plain = function() end,
                alias = function() end, made = function() end }
            local problems = table.concat(check.check_module("m.lua", text, mod), "\n")
            assert.not_matches("good", problems)
            assert.matches("m.lua:6: plain has no doc comment", problems, 1, true)
            assert.matches("m.lua:7: Thing:method has no doc comment", problems, 1, true)
            assert.matches("m.lua:9: alias has no doc comment", problems, 1, true)
            assert.not_matches("_private", problems)
            -- A function the table exports that the file does not define by name.
            assert.matches("made is exported but not defined by name", problems, 1, true)
        end)

        it("catch a real module's function whose doc comment is taken away", function()
            local path = "lua/moonserve/app.lua"
            local text = helper.read_file(root .. "/" .. path)
            local broken, n = text:gsub("%-%-%- Adds middleware: function%(req, res, next%)%.",
                "-- Adds middleware: function(req, res, next).")
            assert.equal(1, n)
            local problems = check.check_module(path, broken, require "moonserve.app")
            assert.equal(1, #problems)
            assert.matches("App:use has no doc comment", problems[1], 1, true)
        end)
    end)

    describe("the API reference", function()
        it("is built by LDoc from config.ld with no warning", function()
            local dir = tmpdir()
            local out, status = helper.run("cd " .. helper.sh_quote(root) .. " && "
                .. helper.tool("ldoc") .. " --fatalwarnings -d " .. dir .. " . 2>&1")
            assert.equal(0, status, out)
            local app = helper.read_file(dir .. "/modules/moonserve.app.html")
            assert.matches("App:use", app, 1, true)
            assert.matches("App:run", app, 1, true)
            assert.truthy(helper.read_file(dir .. "/index.html"):find("moonserve.socket", 1, true))
            helper.run(helper.tool("rm") .. " -rf " .. dir)
        end)

        it("fails the build on a doc comment LDoc cannot read", function()
            local dir = tmpdir()
            helper.write_file(dir .. "/m.lua", table.concat({
                "--- A module.", "-- @module m", "local _M = {}",
                "--- Does x.", "-- @param y not the argument's name",
                "function _M.x(a) return a end", "return _M", "" }, "\n"))
            local out, status = helper.run("cd " .. dir .. " && " .. helper.tool("ldoc")
                .. " --fatalwarnings -d " .. dir .. "/out m.lua 2>&1")
            assert.not_equal(0, status)
            assert.matches("param and formal argument name mismatch", out, 1, true)
            helper.run(helper.tool("rm") .. " -rf " .. dir)
        end)
    end)

    describe("links", function()
        it("between the docs' own pages reach their file and heading", function()
            local pages = check.pages(root)
            assert.truthy(#pages > 8)
            assert.same({}, check.check_links(root, pages))
        end)

        it("to a missing file or a missing heading are caught", function()
            local dir = tmpdir()
            helper.run(helper.tool("mkdir") .. " -p " .. dir .. "/docs/guide")
            helper.write_file(dir .. "/README.md", table.concat({
                "# Top", "## Set-up: two commands", "## Set-up: two commands",
                "[ok](docs/guide/a.md#the-part) [ok](#set-up-two-commands-1)",
                "[gone](docs/guide/none.md) [no heading](docs/guide/a.md#nowhere)",
                "`[not a link](x.md)` [out](https://example.org/x.md)",
                "```", "[in code](y.md)", "```", "" }, "\n"))
            helper.write_file(dir .. "/docs/guide/a.md",
                "# A\n## The `part`\n[up](../../README.md#top) [bad](../README.md)\n")
            local problems = check.check_links(dir, { "README.md", "docs/guide/a.md" })
            table.sort(problems)
            assert.same({
                "README.md:5: link to docs/guide/a.md#nowhere: docs/guide/a.md has no heading "
                    .. "#nowhere",
                "README.md:5: link to docs/guide/none.md: no such file",
                "docs/guide/a.md:3: link to ../README.md: no such file",
            }, problems)
            helper.run(helper.tool("rm") .. " -rf " .. dir)
        end)
    end)
end)
