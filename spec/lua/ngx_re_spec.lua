-- OpenResty's documented examples (lua-nginx-module's README for ngx.re.*, lua-resty-core's
-- ngx/re.md for split) and the corner cases around them, run through moonserve.ngx.re.
local helper = require "helper"

describe("moonserve.ngx.re", function()
    local re = require "moonserve.ngx.re"

    -- A fresh copy of the module, with its own cache and settings.
    local function fresh()
        package.loaded["moonserve.ngx.re"] = nil
        local m = require "moonserve.ngx.re"
        package.loaded["moonserve.ngx.re"] = re
        return m
    end

    describe("match", function()
        it("returns the whole match at [0] and the groups by number", function()
            assert.same({ [0] = "1234" }, re.match("hello, 1234", "[0-9]+"))
            assert.same({ [0] = "1234", "1" }, re.match("hello, 1234", "([0-9])[0-9]+"))
        end)

        it("puts named groups under their names and their numbers", function()
            local m = re.match("hello, 1234", "([0-9])(?<remaining>[0-9]+)")
            assert.same({ [0] = "1234", "1", "234", remaining = "234" }, m)
        end)

        it("gives false for groups that took no part in the match", function()
            local m = re.match("hello, world", "(world)|(hello)|(?<named>howdy)")
            assert.same({ [0] = "hello", false, "hello", false, named = false }, m)
            assert.same({ [0] = "a", "a", false, false }, re.match("a", "(a)(b)?(c)?"))
        end)

        it("returns nil without a match, and nil and the message for a bad pattern", function()
            assert.equal(1, select("#", re.match("abc", "[0-9]")))
            assert.is_nil(re.match("abc", "[0-9]"))
            local m, err = re.match("hello", "(")
            assert.is_nil(m)
            assert.equal('pcre2_compile() failed: missing closing parenthesis in "("', err)
            m, err = re.match("hello", "a{2,1}b")
            assert.is_nil(m)
            assert.equal('pcre2_compile() failed: numbers out of order in {} quantifier in '
                .. '"a{2,1}b" at "}b"', err)
        end)

        it("cuts a long compile error at 127 bytes, as OpenResty's buffer does", function()
            local _, err = re.match("x", ("a"):rep(200) .. "(")
            assert.equal(127, #err)
            assert.equal('pcre2_compile() failed: missing closing parenthesis in "aaa',
                err:sub(1, 59))
        end)

        it("raises for an unknown option letter, naming it and the options", function()
            assert.has_error(function() re.match("a", "a", "iz") end,
                'unknown flag "z" (flags "iz")')
            local ok, err = pcall(re.match, "a", "a", "ozo")
            assert.is_false(ok)
            assert.matches('unknown flag "z" %(flags "ozo"%)$', err)
        end)

        it("starts at ctx.pos and leaves ctx.pos after the match", function()
            local ctx = {}
            assert.same({ [0] = "1234" }, re.match("1234, hello", "[0-9]+", "", ctx))
            assert.equal(5, ctx.pos)
            ctx = { pos = 2 }
            assert.same({ [0] = "234" }, re.match("1234, hello", "[0-9]+", "", ctx))
            assert.equal(5, ctx.pos)
            ctx = { pos = 6 }
            assert.is_nil(re.match("1234, hello", "[0-9]+", "", ctx))
            assert.equal(6, ctx.pos)
            for _, opts in ipairs({ "", "j", "jo", "d" }) do
                local _, err = re.match("abc", "a", opts, { pos = 10 })
                assert.equal("pcre_exec() failed: -33", err)
            end
            assert.same({ [0] = "" }, re.match("abc", "$", "jo", { pos = 4 }))
        end)

        it("fills the res table it is given", function()
            local res = {}
            assert.equal(res, re.match("hello, 1234", "([0-9])([0-9]+)", "o", nil, res))
            assert.same({ [0] = "1234", "1", "234" }, res)
        end)

        it("takes the option letters i, x, s, m and a", function()
            assert.same({ [0] = "hello" }, re.match("hello, 1234", "HELLO", "i"))
            assert.same({ [0] = "hello" }, re.match("hello, world", "HEL LO", "ix"))
            assert.same({ [0] = "a\nb" }, re.match("a\nb", "a.b", "s"))
            assert.is_nil(re.match("a\nb", "a.b"))
            assert.same({ [0] = "b" }, re.match("a\nb", "^b", "m"))
            assert.is_nil(re.match("a\nb", "^b"))
            assert.is_nil(re.match("xhello", "hello", "a"))
            assert.same({ [0] = "hello" }, re.match("xhello", "hello", "a", { pos = 2 }))
        end)

        it("finds the longest match with d, and reports no groups", function()
            assert.same({ [0] = "hello" }, re.match("hello", "he|hell|hello", "d"))
            assert.same({ [0] = "he" }, re.match("hello", "he|hell|hello"))
            assert.same({ [0] = "he" }, re.match("hello", "(h)(e)", "d"))
        end)

        it("collects duplicate names into lists with D", function()
            local m = re.match("hello, world", "(?<named>\\w+), (?<named>\\w+)", "D")
            assert.same({ "hello", "world" }, m.named)
            m = re.match("b", "(?<n>a)|(?<n>b)", "D")
            assert.same({ [0] = "b", false, "b", n = { "b" } }, m)
            assert.is_nil(re.match("c", "(?<n>a)?c|(?<n>b)", "D").n)
            -- Without D, the last group of a duplicated name wins, matched or not.
            assert.is_false(re.match("a", "(?J)(?<n>a)|(?<n>b)").n)
        end)

        it("reads the JavaScript forms with J", function()
            assert.same({ [0] = "a" }, re.match("a", "\\u0061", "J"))
            assert.same({ [0] = "b", false }, re.match("b", "(a)?\\1b", "J"))
            assert.is_nil(re.match("b", "(a)?\\1b"))
        end)

        it("matches characters rather than bytes with u, and checks the subject", function()
            assert.same({ [0] = "日" }, re.match("日本語", "^.", "u"))
            assert.same({ [0] = "\xe6" }, re.match("日本語", "^."))
            assert.same({ [0] = "ÄÖ" }, re.match("ÄÖ", "äö", "ui"))
            local ctx = {}
            re.match("日本語", "本", "u", ctx)
            assert.equal(7, ctx.pos) -- positions stay in bytes
            local m, err = re.match("\xff", ".", "u")
            assert.is_nil(m)
            assert.equal("pcre_exec() failed: -23", err)
            assert.same({ [0] = "日本" }, re.match("日本語", "^..", "U"))
        end)

        it("compiles with j, and caches with o", function()
            assert.same({ [0] = "1234", "1234" }, re.match("hello, 1234", "([0-9]+)", "j"))
            for _ = 1, 3 do
                assert.same({ [0] = "22", "22" }, re.match("b22", "([0-9]+)", "jo"))
            end
        end)

        it("turns a number subject into a string", function()
            assert.same({ [0] = "23", "3" }, re.match(1234, "2(3)"))
        end)
    end)

    describe("find", function()
        it("returns the byte positions of the match, or of group nth", function()
            assert.same({ 8, 11 }, { re.find("hello, 1234", "([0-9]+)", "jo") })
            assert.same({ 9, 11 }, { re.find("hello, 1234", "([0-9])([0-9]+)", "jo", nil, 2) })
            assert.same({ 1, 0 }, { re.find("abc", "x*") })
        end)

        it("answers nil, nil for an unmatched group and an error past the groups", function()
            local a, b, c = re.find("hello", "(h)|(x)", "", nil, 2)
            assert.is_nil(a)
            assert.is_nil(b)
            assert.is_nil(c)
            a, b, c = re.find("hello, 1234", "([0-9])([0-9]+)", "jo", nil, 3)
            assert.is_nil(a)
            assert.is_nil(b)
            assert.equal("nth out of bound", c)
        end)

        it("moves ctx.pos as match does", function()
            local ctx = { pos = 3 }
            assert.same({ 4, 4 }, { re.find("a1b2c3", "[0-9]", "", ctx) })
            assert.equal(5, ctx.pos)
        end)
    end)

    describe("gmatch", function()
        it("iterates over the matches, then answers nil", function()
            local it = re.gmatch("hello, world!", "([a-z]+)", "i")
            assert.same({ [0] = "hello", "hello" }, it())
            assert.same({ [0] = "world", "world" }, it())
            assert.is_nil(it())
            assert.is_nil(it())
        end)

        it("works in a for loop", function()
            local out = {}
            for m in re.gmatch("hello, world!", "([a-z]+)", "i") do
                out[#out + 1] = m[0]
            end
            assert.same({ "hello", "world" }, out)
        end)

        it("steps over empty matches, a character at a time with u", function()
            local out = {}
            for m in re.gmatch("abc d", "\\w*") do
                out[#out + 1] = m[0]
            end
            assert.same({ "abc", "", "d", "" }, out)
            out = {}
            for m in re.gmatch("日本", "x*", "u") do
                out[#out + 1] = m[0]
            end
            assert.same({ "", "", "" }, out)
        end)

        it("returns nil and the message for a bad pattern", function()
            local it, err = re.gmatch("a", "a{2,1}")
            assert.is_nil(it)
            assert.matches("^pcre2_compile%(%) failed: numbers out of order", err)
        end)
    end)

    describe("sub and gsub", function()
        it("expand $0, $N, ${N} and $$ in a template", function()
            assert.same({ "hello, [12][1]34", 1 },
                { re.sub("hello, 1234", "([0-9])[0-9]", "[$0][$1]") })
            assert.same({ "hello, 100234", 1 }, { re.sub("hello, 1234", "[0-9]", "${0}00") })
            assert.same({ "hello, $234", 1 }, { re.sub("hello, 1234", "[0-9]", "$$") })
            assert.same({ "[hello,h], [world,w]", 2 },
                { re.gsub("hello, world", "([a-z])[a-z]+", "[$0,$1]", "i") })
        end)

        it("expand a group that did not match, or does not exist, to nothing", function()
            assert.same({ "[]ello", 1 }, { re.sub("hello", "(x)?h", "[$1]") })
            assert.same({ "|aa|a0b", 1 }, { re.gsub("ab", "(a)", "$10|$1a|${1}0") })
        end)

        it("expand ${name} to a named group", function()
            assert.same({ "<a>b", 1 }, { re.gsub("ab", "(?<x>a)", "<${x}>") })
        end)

        it("refuse the templates nginx refuses", function()
            for _, t in ipairs({ "$", "$x", "${", "${1", "${}", "${1a}", "a$-b", "${nope}" }) do
                local s, n, err = re.gsub("abc", "b", t)
                assert.is_nil(s)
                assert.is_nil(n)
                assert.equal("failed to compile the replacement template", err)
            end
        end)

        it("call a function with the captures and use what it returns", function()
            local func = function(m) return "[" .. m[0] .. "][" .. m[1] .. "]" end
            assert.same({ "hello, [12][1]34", 1 },
                { re.sub("hello, 1234", "( [0-9] ) [0-9]", func, "x") })
            local seen = {}
            local s, n = re.gsub("ab", "(?<x>a)|(?<y>b)", function(m)
                seen[#seen + 1] = m
                return "."
            end)
            assert.same({ "..", 2 }, { s, n })
            assert.same({ [0] = "b", false, "b", x = false, y = "b" }, seen[2])
            local k = 0
            assert.same({ "7bnil", 2 }, { re.gsub("abc", "[ac]", function()
                k = k + 1
                return k == 1 and 7 or nil
            end) })
        end)

        it("let a replacement function call gsub again", function()
            assert.same({ "<aa>-<bb>", 2 }, { re.gsub("a-b", "\\w", function(m)
                return (re.gsub(m[0], "(.)", "<$1$1>", "o"))
            end, "o") })
        end)

        it("return the subject and 0 without a match", function()
            assert.same({ "hello", 0 }, { re.sub("hello", "[0-9]", "x") })
        end)

        it("replace empty matches between characters", function()
            assert.same({ "-a-b-c-", 4 }, { re.gsub("abc", "x*", "-") })
            assert.same({ "-a--c-", 4 }, { re.gsub("abc", "b*", "-") })
            assert.same({ "-日-本-", 3 }, { re.gsub("日本", "x*", "-", "u") })
        end)

        it("return nil, nil and the message for a bad pattern", function()
            assert.same({ nil, nil, 'pcre2_compile() failed: unmatched closing parenthesis in '
                .. '"a)" at ")"' }, { re.gsub("a", "a)", "b") })
        end)
    end)

    describe("split", function()
        it("cuts at each match, putting the first group between the pieces", function()
            assert.same({ "a", "b", "c", "d" }, re.split("a,b,c,d", ","))
            assert.same({ "a", ",", "b", ",", "c", ",", "d" }, re.split("a,b,c,d", "(,)"))
        end)

        it("starts at ctx.pos", function()
            assert.same({ "c", "d" }, re.split("a,b,c,d", ",", nil, { pos = 5 }))
            assert.same({}, re.split("abc", ",", nil, { pos = 4 }))
        end)

        it("makes at most max pieces, the last holding the rest", function()
            assert.same({ "a", "b,c,d" }, re.split("a,b,c,d", ",", nil, nil, 2))
            assert.same({ "a,b,c,d" }, re.split("a,b,c,d", ",", nil, nil, 1))
            assert.same({ "", "a", "", "b", "", "" }, re.split(",a,,b,,", ",", nil, nil, 10))
        end)

        it("drops trailing empty pieces without max", function()
            assert.same({ "", "a", "", "b" }, re.split(",a,,b,,", ","))
            assert.same({}, re.split(",,,", ","))
        end)

        it("cuts between characters on an empty match", function()
            assert.same({ "a", "b", "c", "d" }, re.split("abcd", ""))
            assert.same({ "a", "bcd" }, re.split("abcd", "", nil, nil, 2))
            assert.same({ "日", "本" }, re.split("日本", "", "u"))
        end)

        it("fills the res table it is given, ending it with nil", function()
            local mine = { "hello world", "x", "y", "z" }
            assert.equal(mine, re.split("a,b", ",", nil, nil, nil, mine))
            assert.same({ "a", "b", nil, "z" }, mine)
            assert.has_error(function() re.split("a,b", ",", nil, nil, nil, "x") end,
                "res is not a table")
        end)

        it("returns nil and the message for a bad pattern", function()
            assert.same({ nil, 'pcre2_compile() failed: missing closing parenthesis in "("' },
                { re.split("a,b", "(") })
        end)
    end)

    describe("opt and limits", function()
        it("refuses unknown options", function()
            assert.has_error(function() re.opt("nope", 1) end, "unrecognized option name")
        end)

        it("stops a runaway match at the match limit", function()
            local m = fresh()
            local subj, pat = ("a"):rep(24) .. "!", "^(\\w+\\s?)*$"
            m.opt("match_limit", 1000)
            assert.same({ nil, "pcre_exec() failed: -47" }, { m.match(subj, pat) })
            assert.same({ nil, "pcre_exec() failed: -47" }, { m.match(subj, pat, "j") })
            m.opt("match_limit", 0)
            assert.is_nil((m.match("aaaa!", pat)))
        end)

        it("grows the JIT stack with jit_stack_size, before anything is cached", function()
            local m = fresh()
            local subj, pat = ("a"):rep(200000), "^(?:(a)|b)*$"
            assert.same({ nil, "pcre_exec() failed: -46" }, { m.match(subj, pat, "j") })
            m.opt("jit_stack_size", 16 * 1024 * 1024)
            assert.equal(200000, #m.match(subj, pat, "j")[0])
            m.match("a", "a", "o")
            assert.has_error(function() m.opt("jit_stack_size", 1024 * 1024) end,
                "changing jit stack size is not allowed when some regexs have already been "
                .. "compiled and cached")
        end)

        it("keeps at most cache_max_entries patterns, 1024 by default", function()
            local m = fresh()
            local _, max = m.cache_size()
            assert.equal(1024, max)
            for k = 1, 1100 do
                assert.same({ [0] = "x" .. k }, m.match("x" .. k, "x" .. k, "jo"))
            end
            assert.equal(1024, (m.cache_size()))
            m.opt("cache_max_entries", 3)
            assert.equal(3, (m.cache_size()))
            for k = 1, 10 do
                assert.same({ "a" .. k .. "b", 1 }, { m.gsub("a_b", "_", tostring(k), "o") })
            end
            assert.equal(3, (m.cache_size()))
            m.opt("cache_max_entries", 0)
            assert.same({ [0] = "b" }, m.match("ab", "b", "o"))
            assert.equal(0, (m.cache_size()))
        end)
    end)

    it("keeps match with jo on trace", function()
        local log = helper.jit_log(function()
            local n = 0
            for _ = 1, 1000 do
                local m = re.match("hello, 1234", "([0-9]+)", "jo")
                n = n + #m[1]
            end
            assert.equal(4000, n)
        end)
        -- Which loop becomes the root trace depends on the JIT's hot counters, which are
        -- shared by hashed bytecode address: the spec's loop may be a side trace of the
        -- captures loop. So: traces were made, and nothing aborted one but the shape of
        -- nested loops.
        assert.matches("TRACE +%d+ ", log)
        assert.not_matches("NYI", log)
        for reason in log:gmatch("TRACE %-%-%- [^\n]- %-%- ([^\n]-) at ") do
            assert.is_truthy(reason == "inner loop in root trace"
                or reason == "leaving loop in root trace"
                or reason == "loop unroll limit reached", reason)
        end
    end)
end)

describe("moonserve.ngx.re's library", function()
    it("stays loaded when the module is dropped, for the patterns that outlive it", function()
        -- In a process of its own (nothing else holding the module): an iterator keeps its
        -- compiled pattern, whose finalizer is PCRE2's, past a collection of the module.
        local script = [[
            local re = require "moonserve.ngx.re"
            local it = re.gmatch("a1b2", "\\d")
            assert(it()[0] == "1")
            re = nil
            package.loaded["moonserve.ngx.re"] = nil
            for _ = 1, 4 do collectgarbage() end
            assert(it()[0] == "2")
            it = nil
            for _ = 1, 4 do collectgarbage() end
            print("survived")
        ]]
        local file = os.tmpname()
        finally(function() os.remove(file) end)
        helper.write_file(file, script)
        local out = helper.run(helper.tool("luajit") .. " " .. file .. " 2>&1")
        assert.equal("survived\n", out)
    end)
end)
