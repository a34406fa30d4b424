-- Templates compiled from strings, and engines over template files in a temporary directory.
describe("moonserve.template", function()
    local template = require "moonserve.template"
    local lfs = require "lfs"

    local function render(source, vars)
        return table.concat(assert(template.compile(source, "t"))(vars))
    end

    -- The temporary tree: everything made under it is removed, newest first.
    local root, made = nil, {}
    setup(function()
        root = os.tmpname()
        os.remove(root)   -- a fresh unique name, made a directory
        assert(lfs.mkdir(root))
    end)
    teardown(function()
        for i = #made, 1, -1 do
            os.remove(made[i])
        end
        assert(os.remove(root))
    end)

    local function write(name, text)
        local dir = root
        for part in name:gmatch("([^/]+)/") do
            dir = dir .. "/" .. part
            if lfs.attributes(dir, "mode") ~= "directory" then
                assert(lfs.mkdir(dir))
                made[#made + 1] = dir
            end
        end
        local f = assert(io.open(root .. "/" .. name, "wb"))
        f:write(text)
        f:close()
        made[#made + 1] = root .. "/" .. name
    end

    -- Counts the files under the temporary tree that are opened while `fn` runs.
    local function count_opens(fn)
        local open = spy.on(io, "open")
        local ok, err = pcall(fn)
        open:revert()
        assert(ok, err)
        local n = 0
        for _, call in ipairs(open.calls) do
            if call.vals[1]:find(root, 1, true) == 1 then
                n = n + 1
            end
        end
        return n
    end

    it("escapes output by default, quotes in attributes included", function()
        local out = render([[<a title="{{ t }}">{{ t }}</a>]], { t = [[<b>"Tom" & 'Jerry'</b>]] })
        local e = "&lt;b&gt;&quot;Tom&quot; &amp; &#39;Jerry&#39;&lt;/b&gt;"
        assert.equal('<a title="' .. e .. '">' .. e .. "</a>", out)
    end)

    it("prints raw output with {{! }} and values marked with raw()", function()
        local out = render([[{{! html }} {{ raw("<i>") }}]], { html = "<b>x</b>" })
        assert.equal("<b>x</b> <i>", out)
    end)

    it("prints nothing for nil, and numbers and booleans as text", function()
        assert.equal("[] 3.5 false true", render("[{{ missing }}] {{ n }} {{ f }} {{ t }}",
            { n = 3.5, f = false, t = true }))
    end)

    it("runs Lua control flow between tags", function()
        local src = "{% for i, x in ipairs(items) do %}{% if i > 1 then %},{% end %}{{ x }}"
            .. "{% end %}{% if #items > 2 then %} and more{% else %} only{% end %}"
        assert.equal("a,b only", render(src, { items = { "a", "b" } }))
        assert.equal("a,b,c and more", render(src, { items = { "a", "b", "c" } }))
    end)

    it("trims whitespace and newlines on the side of a dash", function()
        local src = "<ul>\n  {%- for _, x in ipairs(items) do -%}\n  <li>{{- x -}}  </li>\n"
            .. "  {%- end %}\n</ul>"
        assert.equal("<ul><li>a</li><li>b</li>\n</ul>", render(src, { items = { "a", "b" } }))
        assert.equal("a  b", render("a {{ nil }} b"))
        assert.equal("ab", render("a \n{{- nil -}}\n b"))
    end)

    it("drops comments, also across lines", function()
        assert.equal("a b", render("a {# one #}b"))
        assert.equal("ab", render("a {#- two\nlines -#} b"))
    end)

    it("names the template and line of an unclosed tag", function()
        local fn, err = template.compile("<p>\n{{ name }}\n{% if x then\n</p>", "users/show")
        assert.is_nil(fn)
        assert.equal("users/show:3: unclosed {% (no %} after it)", err)
    end)

    it("maps a Lua syntax error back to the template line", function()
        local _, err = template.compile("<p>\n\n  {{ a + }}\n</p>", "page")
        assert.equal("page:3: unexpected symbol near ')'", err)
        _, err = template.compile("{% if x then %}\n<p>\n", "page")
        assert.equal("page:3: 'end' expected by the end of the template", err)
        _, err = template.compile("<p>\n{% if x %}\n<b>{% end %}", "page")
        assert.equal("page:2: 'then' expected before the next text or tag", err)
        _, err = template.compile("<p>\n{% end %}</p>", "page")
        assert.equal("page:2: one 'end' too many", err)
    end)

    it("reports an error raised while rendering at the template line", function()
        local fn = assert(template.compile("<p>\n{# a\ncomment #}\n{{ user.name }}</p>", "page"))
        local ok, err = pcall(fn, {})
        assert.is_false(ok)
        assert.equal("page:4: attempt to index global 'user' (a nil value)", err)
    end)

    it("keeps templates away from real globals", function()
        _G.template_spec_secret = "s3cret"
        finally(function() _G.template_spec_secret, _G.template_spec_set = nil, nil end)
        local vars = { a = 1 }
        local out = render("[{{ template_spec_secret }}][{{ type(_G) }}][{{ type(os) }}]"
            .. "{% template_spec_set = 1; a = 2; string = nil %}{{ a }}", vars)
        assert.equal("[][nil][nil]2", out)
        assert.is_nil(_G.template_spec_set)
        assert.is_table(string)
        assert.equal(1, vars.a)
    end)

    it("lets an engine hand globals in on purpose", function()
        _G.template_spec_secret = "s3cret"
        finally(function() _G.template_spec_secret = nil end)
        write("globals.html", "{{ template_spec_secret }}")
        assert.equal("", template.new{ root = root }:render_string("globals"))
        local views = template.new{ root = root, globals = _G }
        assert.equal("s3cret", views:render_string("globals"))
    end)

    it("offers escape and raw, and helpers an engine adds", function()
        write("helpers.html",
            [[{{ upper("a<b") }} {{ shout("x") }} {{! escape("<") }} {{ raw("<br>") }}]])
        local views = template.new{ root = root, helpers = { shout = string.upper } }
        views.helpers.upper = string.upper
        assert.equal("A&lt;B X &lt; <br>", views:render_string("helpers"))
        assert.is_nil(template.new{ root = root }.helpers.upper)
        assert.is_nil(template.helpers.upper)
    end)

    describe("url()", function()
        local function link(u)
            return render([[<a href="{{ url(u) }}">]], { u = u })
        end

        it("prints http, https, mailto and relative URLs, escaped for a quoted attribute", function()
            assert.equal([[<a href="https://example.org/a?b=1&amp;c=2">]],
                link("https://example.org/a?b=1&c=2"))
            assert.equal([[<a href="HTTP://example.org/">]], link("HTTP://example.org/"))
            assert.equal([[<a href="mailto:ada@example.org">]], link("mailto:ada@example.org"))
            assert.equal([[<a href="/users/7?tab=&quot;x&quot;">]], link('/users/7?tab="x"'))
            assert.equal([[<a href="page.html#top">]], link("page.html#top"))
            assert.equal([[<a href="?q=javascript:x">]], link("?q=javascript:x"))
            assert.equal([[<a href="//cdn.example.org/x.js">]], link("//cdn.example.org/x.js"))
            assert.equal([[<a href="&#39; onmouseover=&#39;x">]], link("' onmouseover='x"))
            assert.equal([[<a href="">]], link(nil))
        end)

        it("refuses javascript: and every other scheme, however it is spelled", function()
            for _, u in ipairs({ "javascript:alert(1)", "JavaScript:alert(1)",
                " \1javascript:alert(1)", "java\tscript:alert(1)", "java\nscript:x",
                "data:text/html,<script>alert(1)</script>", "vbscript:x", "file:///etc/passwd",
                "foo:bar" }) do
                assert.equal([[<a href="about:invalid#refused">]], link(u), u)
            end
        end)
    end)

    describe("json()", function()
        local function script(v)
            return render([[<script>var d = {{ json(d) }};</script>]], { d = v })
        end

        it("prints JSON that cannot end or change the script element", function()
            local out = script({ name = "</script><script>alert(1)</script><!--" })
            assert.equal([[<script>var d = {"name":"\u003c\/script\u003e\u003cscript\u003e]]
                .. [[alert(1)\u003c\/script\u003e\u003c!--"};</script>]], out)
            assert.equal(1, select(2, out:gsub("</script>", "")))
            assert.equal([[<script>var d = "a\u0026b \u2028 \u2029 é";</script>]],
                script("a&b \226\128\168 \226\128\169 é"))
            assert.equal([[<script>var d = [1,true,"x"];</script>]], script({ 1, true, "x" }))
        end)

        it("gives back what it was given once parsed", function()
            local cjson = require "cjson"
            local v = { s = "<&>\226\128\168'\"", n = 1.5, list = { "a", "b" } }
            local text = render([[{{ json(v) }}]], { v = v })
            assert.same(v, cjson.decode(text))
        end)
    end)

    it("gives csrf_token() from the vars or from the engine option", function()
        write("form.html", [[<input name="csrf" value="{{ csrf_token() }}">]])
        local views = template.new{ root = root }
        assert.equal([[<input name="csrf" value="t&amp;1">]],
            views:render_string("form", { csrf_token = "t&1" }))
        local _, err = views:render_string("form")
        assert.matches("no token", err)
        local function token(vars) return "tok-" .. vars.sid end
        views = template.new{ root = root, csrf_token = token }
        assert.equal([[<input name="csrf" value="tok-7">]],
            views:render_string("form", { sid = 7 }))
    end)

    it("renders a page into nested layouts that see the page's variables", function()
        write("layouts/base.html", "<html><title>{{ title }}</title>\n{{! content }}</html>")
        write("layouts/main.html", "{% layout('layouts/base') -%}\n<main>{{! content }}</main>\n")
        write("home.html",
            "{% layout('layouts/main') %}{% title = 'Home & more' -%}\n<p>{{ msg }}</p>")
        local views = template.new{ root = root }
        assert.equal("<html><title>Home &amp; more</title>\n<main><p>hi</p></main>\n</html>",
            views:render_string("home", { msg = "hi" }))
    end)

    it("renders partials with their own vars over the caller's", function()
        write("partials/nav.html",
            [[<nav class="{{ active }}">{{ user }}</nav>{% user = "changed" %}]])
        write("with_nav.html",
            [[{{! include("partials/nav", { active = "home" }) }}|{{ active }}|{{ user }}]])
        local views = template.new{ root = root }
        assert.equal([[<nav class="home">ann</nav>|none|ann]],
            views:render_string("with_nav", { user = "ann", active = "none" }))
    end)

    it("lets a partial include itself, and stops a loop with a clear error", function()
        write("tree.html", "{{ node.name }}{% for _, c in ipairs(node.children or {}) do %}"
            .. "({{ include('tree', { node = c }) }}){% end %}")
        write("loop.html", "x{{! include('loop') }}")
        local views = template.new{ root = root }
        local tree = { name = "a", children = { { name = "b", children = { { name = "c" } } },
            { name = "<d>" } } }
        assert.equal("a(b(c))(&lt;d&gt;)", views:render_string("tree", { node = tree }))
        local out, err = views:render_string("loop")
        assert.is_nil(out)
        assert.equal("loop: templates nested more than 32 deep (does an include or layout loop?)",
            err)
    end)

    it("gives nil and an error for missing, broken and failing templates and bad names", function()
        write("broken.html", "<p>\n{{ x + }}</p>")
        write("partials/bad.html", "\n{{ x.y }}")
        write("uses_bad.html", "<p>{{! include('partials/bad') }}</p>")
        local views = template.new{ root = root }
        local out, err = views:render("nope")
        assert.is_nil(out)
        assert.matches("^template nope not found", err)
        assert.equal("broken:2: unexpected symbol near ')'", select(2, views:render("broken")))
        assert.equal("partials/bad:2: attempt to index global 'x' (a nil value)",
            select(2, views:render("uses_bad")))
        assert.matches("not allowed", select(2, views:render("../secret")))
        assert.has_error(function() views:render(42) end, "bad template name (string expected)")
    end)

    it("loads a name that has an extension as given", function()
        write("feed.xml", "<feed>{{ t }}</feed>")
        local views = template.new{ root = root }
        assert.equal("<feed>a&amp;b</feed>", views:render_string("feed.xml", { t = "a&b" }))
    end)

    it("reads and compiles a template once while caching", function()
        write("cached.html", "v1 {{! include('partials/cached') }}")
        write("partials/cached.html", "p1")
        local views = template.new{ root = root }
        local opens = count_opens(function()
            for _ = 1, 3 do
                assert.equal("v1 p1", views:render_string("cached"))
            end
        end)
        assert.equal(2, opens)
        write("cached.html", "v2")
        assert.equal("v1 p1", views:render_string("cached"))
    end)

    it("recompiles on every render without the cache", function()
        write("fresh.html", "v1")
        local views = template.new{ root = root, cache = false }
        assert.equal(1, count_opens(function()
            assert.equal("v1", views:render_string("fresh"))
        end))
        write("fresh.html", "v2")
        assert.equal(1, count_opens(function()
            assert.equal("v2", views:render_string("fresh"))
        end))
    end)

    it("renders into a table of pieces, long static text as a single piece", function()
        local long = "<p>" .. string.rep("static text ", 500) .. "</p>\n"
        write("pieces.html", long .. "<h1>{{ title }}</h1>{{! include('partials/piece') }}")
        write("partials/piece.html", "<i>{{ 1 + 1 }}</i>")
        local buf = template.new{ root = root }:render("pieces", { title = "Hi & bye" })
        assert.is_table(buf)
        assert.same({ long .. "<h1>", "Hi &amp; bye", "</h1>", "<i>", "2", "</i>" }, buf)
        assert.equal(long .. "<h1>Hi &amp; bye</h1><i>2</i>", table.concat(buf))
    end)

    it("renders the same template in coroutines that yield midway", function()
        write("yields.html", "{{ who }}{{ wait() }}{{ who }}")
        local views = template.new{ root = root, helpers = { wait = coroutine.yield } }
        local a = coroutine.wrap(function() return views:render_string("yields", { who = "a" }) end)
        local b = coroutine.wrap(function() return views:render_string("yields", { who = "b" }) end)
        a()
        b()
        assert.equal("aa", a())
        assert.equal("bb", b())
    end)

    it("raises when a template without an engine uses include or layout", function()
        local _, err = pcall(assert(template.compile("<p>\n{{! include('x') }}", "lonely")))
        assert.equal("lonely:2: include() needs an engine (template.new)", err)
        _, err = pcall(assert(template.compile("{% layout('x') %}", "lonely")))
        assert.equal("lonely:1: layout() needs an engine (template.new)", err)
    end)
end)
