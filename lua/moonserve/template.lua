--- moonserve/template.lua: HTML templates, compiled once to Lua, rendered into string pieces.
--
--   {{ expr }}      the value, HTML-escaped (& < > " '); nil prints nothing, numbers and
--                   booleans print through tostring. Safe in element content and in
--                   quoted attribute values only: not in unquoted attributes, in URLs
--                   (href, src: use url()), in event handler attributes, or inside
--                   <script> (use json()) or <style>.
--   {{! expr }}     the value as it is
--   {% code %}      Lua statements: {% for _, u in ipairs(users) do %} ... {% end %}
--   {# comment #}   nothing
--
-- A "-" just inside a delimiter ({%- -%}, {{- -}}, {{-! }}, {#- -#}) removes all the
-- whitespace, newlines included, on that side of the tag. A tag ends at the first closing
-- delimiter, even one inside a Lua string, as in etlua and lua-resty-template.
--
-- A template sees its variables as globals. A name they lack falls back to the helpers
-- (below), never to _G: a template cannot read a real global by mistake, and what it
-- assigns stays in its own render. Globals go in on purpose, as variables or with
-- template.new{ globals = _G }. Names starting with "__" are reserved, and so are
-- `include` and `layout`.
--
-- Helpers: escape(s) (a string, for building strings in code), raw(s) (marks s as safe, so
-- {{ }} prints it unescaped), url(s) (for a quoted href or src: http, https, mailto and
-- relative URLs, escaped; any other scheme, javascript: above all, prints
-- "about:invalid#refused"), json(v) (JSON for inside <script>: "</script>" and "<!--"
-- cannot end or change the element), csrf_token(), include(name, vars), layout(name,
-- vars), and ipairs, pairs, next, select, type, tostring, tonumber, unpack, string,
-- table, math.
-- An engine's helpers table extends them: views.helpers.upper = string.upper.
--
--   local views = template.new{ root = "views" }       -- cache = true by default
--   local html, err = views:render_string("home", { user = user })   -- views/home.html
--
-- Inside a template, {{! include("partials/nav", { active = "home" }) }} renders another
-- template with its own vars over the caller's, and {% layout("layouts/main") %} puts this
-- template's output into a layout, which prints it with {{! content }}. The layout sees the
-- page's variables, including those the page set ({% title = "Home" %}), and may have a
-- layout of its own.
--
-- Compiling reads the file with io.open, which blocks the worker. With cache = true (the
-- default) each file is read and compiled once per engine; cache = false recompiles on
-- every render, which is for development only.
--
-- `Ctx`: A render in progress: what include() and layout() in a template call.
-- `Engine`: A template engine over a directory of templates (app:views), each compiled once.
-- @module moonserve.template
local codec = require "moonserve.codec"

local byte, find, format, gsub, lower, match, rep, sub = string.byte, string.find,
    string.format, string.gsub, string.lower, string.match, string.rep, string.sub
local concat = table.concat
local escape_html = codec.escape_html
local getmetatable, setmetatable, setfenv = getmetatable, setmetatable, setfenv
local loadstring, pairs, tostring, type = loadstring, pairs, tostring, type

-- Includes and layouts nested deeper than this are a loop, not a design.
local MAX_DEPTH = 32

local _M = {}

-- -- Safe values ----------------------------------------------------------------------------

-- A list of string pieces printed without escaping: what raw() returns, and the output
-- of include() and of a layout's content.
local Safe = {}
Safe.__tostring = function(self)
    return concat(self)
end

local function is_safe(v)
    return type(v) == "table" and getmetatable(v) == Safe
end

-- Copies the pieces by reference: a partial's output joins the page without concatenation.
local function put_pieces(b, n, pieces)
    for i = 1, #pieces do
        b[n + i] = pieces[i]
    end
    return n + #pieces
end

-- Appends v to b[1..n], made a string by `conv`, and returns the new n. Safe pieces go in
-- as they are; nil adds nothing.
local function put_with(b, n, v, conv)
    if v == nil then
        return n
    end
    if is_safe(v) then
        return put_pieces(b, n, v)
    end
    b[n + 1] = conv(v)
    return n + 1
end

-- {{ v }}: escaped.
local function put(b, n, v)
    return put_with(b, n, v, escape_html)
end

-- {{! v }}: as it is.
local function put_raw(b, n, v)
    return put_with(b, n, v, tostring)
end

-- -- Helpers --------------------------------------------------------------------------------

local function safe(s)
    return setmetatable({ s }, Safe)
end

-- Schemes url() lets through; a URL without one is relative (to the page, or "//host").
local URL_SCHEMES = { http = true, https = true, mailto = true }
local REFUSED_URL = safe("about:invalid#refused")

-- A URL for a quoted attribute (a string, or what tostring makes one). Its scheme is read as
-- browsers read it: after leading spaces and control characters, and with tabs and
-- newlines anywhere taken out ("java\tscript:" is javascript:).
local function url(s)
    if s == nil then
        return nil
    end
    s = is_safe(s) and concat(s) or tostring(s)
    local seen = gsub((gsub(s, "^[%z\1- ]+", "")), "[\t\n\r]", "")
    local scheme = match(seen, "^([%a][%w+.%-]*):")
    if scheme and not URL_SCHEMES[lower(scheme)] then
        return REFUSED_URL
    end
    return safe(escape_html(s))
end

-- What JSON may hold that ends or changes a <script> element ("</script>", "<!--"), or
-- that older engines take for a line end inside a string (U+2028, U+2029).
local JS_ESCAPES = { ["<"] = "\\u003c", [">"] = "\\u003e", ["&"] = "\\u0026",
    ["\226\128\168"] = "\\u2028", ["\226\128\169"] = "\\u2029" }
local cjson

-- JSON for inside <script> (lua-cjson's encoding; raises on what JSON cannot hold).
local function json(v)
    cjson = cjson or require "cjson"
    local text = gsub(cjson.encode(v), "[<>&]", JS_ESCAPES)
    if find(text, "\226\128[\168\169]") then
        text = gsub(text, "\226\128[\168\169]", JS_ESCAPES)
    end
    return safe(text)
end

_M.helpers = {
    escape = function(s)
        if s == nil then
            return ""
        end
        return is_safe(s) and concat(s) or escape_html(s)
    end,
    raw = function(s)
        if s == nil or is_safe(s) then
            return s
        end
        return safe(tostring(s))
    end,
    url = url,
    json = json,
    csrf_token = function()
        error("csrf_token(): no token (pass vars.csrf_token or the engine option csrf_token)", 2)
    end,
    ipairs = ipairs, pairs = pairs, next = next, select = select, type = type,
    tostring = tostring, tonumber = tonumber, unpack = unpack,
    string = string, table = table, math = math,
}

-- -- Compiling ------------------------------------------------------------------------------

local CLOSE = { ["{"] = "}}", ["%"] = "%}", ["#"] = "#}" }

local function newlines(s)
    local _, n = gsub(s, "\n", "")
    return n
end

local function ltrim(s)
    local i = find(s, "%S")
    return i and sub(s, i) or ""
end

-- A byte loop: a pattern anchored at the end backtracks over every run of whitespace.
local function rtrim(s)
    local i = #s
    while i > 0 do
        local c = byte(s, i)
        if c ~= 32 and (c < 9 or c > 13) then
            break
        end
        i = i - 1
    end
    return sub(s, 1, i)
end

-- A string literal on one line: %q writes a newline as a backslash and a real newline.
local function quote(s)
    return (gsub(format("%q", s), "\\\n", "\\n"))
end

-- The first generated line holds the wrapper, so a template's line N is the generated
-- line N: Lua's own messages, compile-time and runtime, then name the right line. Static
-- text is one constant piece per run of text, allocated once with the function.
local PROLOGUE = "local __put, __raw = ... return function(__b, __n, __ctx) "
    .. "local function include(name, vars) local r = __ctx:include(name, vars) return r end "
    .. "local function layout(name, vars) __ctx:layout(name, vars) end "

-- Template source to Lua source, or nil and an error naming the template and line.
local function translate(src, name)
    local out = { PROLOGUE }
    local gline, tline = 1, 1     -- the generated line being written, the template's line
    local pos, trim_next, after_code = 1, false, false

    local function emit(s)
        out[#out + 1] = s
        gline = gline + newlines(s)
    end
    -- Brings the generated line down to the template line. Lines can only fall behind, or
    -- run ahead after a code tag that needed a newline of its own (see below).
    local function sync()
        if gline < tline then
            emit(rep("\n", tline - gline))
        end
    end

    while true do
        local s = find(src, "{[{%%#]", pos)
        local text = sub(src, pos, s and s - 1 or #src)
        local trim_left = s and sub(src, s + 2, s + 2) == "-"
        local t = text
        if trim_next then
            t = ltrim(t)
        end
        if trim_left then
            t = rtrim(t)
        end
        if t ~= "" then
            sync()
            emit("__n=__n+1 __b[__n]=" .. quote(t) .. "; ")
            after_code = false
        end
        tline = tline + newlines(text)
        if not s then
            break
        end

        local open = sub(src, s + 1, s + 1)
        local close = CLOSE[open]
        local i = s + 2 + (trim_left and 1 or 0)
        local raw = open == "{" and sub(src, i, i) == "!"
        if raw then
            i = i + 1
        end
        local e = find(src, close, i, true)
        if not e then
            return nil, format("%s:%d: unclosed %s (no %s after it)", name, tline,
                sub(src, s, i - 1), close)
        end
        local body = sub(src, i, e - 1)
        trim_next = sub(body, -1) == "-"
        if trim_next then
            body = sub(body, 1, -2)
        end
        -- A "--" comment would swallow whatever follows on its line, so such a tag ends with
        -- a newline of its own (the "--" may also be in a string: no harm). Until the next
        -- newline in the text, messages then name a line one too far.
        local eol = find(body, "--", 1, true) and "\n" or ""
        if open == "%" then
            sync()
            -- After code, "(" would continue the previous statement as a call; on a new
            -- line Lua reports the ambiguity instead of running the wrong thing.
            if after_code and find(body, "^%s*%(") then
                emit("\n")
            end
            emit(body .. (eol ~= "" and eol or " "))
            after_code = true
        elseif open == "{" then
            sync()
            emit((raw and "__n=__raw(__b,__n,(" or "__n=__put(__b,__n,(") .. body .. eol .. ")); ")
            after_code = false
        end
        tline = tline + newlines(sub(src, s, e + 1))
        pos = e + 2
    end
    sync()   -- so that "near <eof>" names the last line
    emit(" end")
    return concat(out)
end

-- Lua's syntax errors speak of the wrapper function; these say what it means for a template.
local function syntax_error(err, name)
    local line, msg = err:match(":(%d+): (.*)$")
    if not line then
        return name .. ": " .. err
    end
    msg = gsub(msg, " %(to close 'function' at line 1%)", "")
    msg = gsub(msg, "'end' expected near '<eof>'", "'end' expected by the end of the template")
    msg = gsub(msg, "'<eof>' expected near '[^']*'", "one 'end' too many")
    msg = gsub(msg, "near '__n'", "before the next text or tag")   -- the next statement is ours
    return name .. ":" .. line .. ": " .. msg
end

-- Source to a factory: calling it returns a fresh render function, or nil and an error.
local function compile_factory(source, name)
    local code, err = translate(source, name)
    if not code then
        return nil, err
    end
    local chunk
    chunk, err = loadstring(code, "=" .. name)
    if not chunk then
        return nil, syntax_error(err, name)
    end
    return setfenv(chunk, {})   -- the factory itself touches no globals
end

-- -- Rendering ------------------------------------------------------------------------------

local default_meta = { __index = _M.helpers }

-- A render's globals: the caller's (for a partial or layout) overlaid with its vars, falling
-- back to the helpers. A copy, so whatever the template assigns stays in this render.
local function new_env(meta, csrf_option, base, vars)
    local env = {}
    if base then
        for k, v in pairs(base) do
            env[k] = v
        end
    end
    if vars then
        for k, v in pairs(vars) do
            env[k] = v
        end
    end
    -- Templates always call csrf_token(): a token given as a string becomes a function, and
    -- the engine's function option gets this render's variables.
    local tok = env.csrf_token
    if type(tok) == "string" then
        env.csrf_token = function() return tok end
    elseif tok == nil and csrf_option ~= nil then
        if type(csrf_option) == "string" then
            env.csrf_token = function() return csrf_option end
        else
            env.csrf_token = function() return csrf_option(env) end
        end
    end
    return setmetatable(env, meta)
end

local Ctx = {}
Ctx.__index = Ctx

local load_template   -- engine, name -> factory; below

-- Renders one template and, if it asked for one, its layout. Returns a table of pieces.
local function run(engine, name, factory, base, vars, depth)
    if depth > MAX_DEPTH then
        error(format("%s: templates nested more than %d deep (does an include or layout loop?)",
            name, MAX_DEPTH), 0)
    end
    local env = new_env(engine and engine.meta or default_meta, engine and engine.csrf_token,
        base, vars)
    local ctx = setmetatable({ engine = engine, env = env, depth = depth }, Ctx)
    local buf = {}
    -- A fresh function per render, with its own environment: one shared function whose
    -- environment we swapped would break when a helper yields mid-render (a handler is a
    -- coroutine) and another request renders the same template meanwhile.
    setfenv(factory(put, put_raw), env)(buf, 0, ctx)
    local layout = ctx.layout_name
    if layout then
        env.content = setmetatable(buf, Safe)
        return run(engine, layout, load_template(engine, layout), env, ctx.layout_vars, depth + 1)
    end
    return buf
end

-- Level 4 is the template's line: check_call, the method, the template's local function
-- (which calls the method without a tail call, so the frame stays), then the template.
local function check_call(self, what, name)
    if not self.engine then
        error(what .. "() needs an engine (template.new)", 4)
    end
    if type(name) ~= "string" then
        error("bad " .. what .. " name (string expected)", 4)
    end
end

--- In a template: renders the partial `name` here, with `vars` added to the current ones.
function Ctx:include(name, vars)
    check_call(self, "include", name)
    local buf = run(self.engine, name, load_template(self.engine, name), self.env, vars,
        self.depth + 1)
    return setmetatable(buf, Safe)
end

--- In a template: renders this one inside the layout `name`, which prints it with
-- `{{! content }}`.
function Ctx:layout(name, vars)
    check_call(self, "layout", name)
    self.layout_name, self.layout_vars = name, vars
end

--- Compiles template source. Returns render(vars), or nil and an error naming the template
-- (`name`, default "template") and line. render returns the output as a table of string
-- pieces and raises what the template raises. Such a template has no engine, so its
-- include() and layout() raise.
function _M.compile(source, name)
    if type(source) ~= "string" then
        error("bad template source (string expected)", 2)
    end
    name = name or "template"
    local factory, err = compile_factory(source, name)
    if not factory then
        return nil, err
    end
    return function(vars)
        return run(nil, name, factory, nil, vars, 0)
    end
end

-- -- Engines --------------------------------------------------------------------------------

local Engine = {}
Engine.__index = Engine

-- Where a name's file is: the name as given if it has an extension, else with ".html".
-- A ".." segment is refused, so a name built from request data stays under the root.
local function path_of(engine, name)
    if find("/" .. name .. "/", "/%.%./") then
        error(format("bad template name %q (\"..\" not allowed)", name), 0)
    end
    local file = find(name, "%.[^/]*$") and name or name .. ".html"
    return engine.root == "" and file or engine.root .. "/" .. file
end

function load_template(engine, name)
    local factory = engine.compiled[name]
    if factory then
        return factory
    end
    local path = path_of(engine, name)
    local f, err = io.open(path, "rb")
    if not f then
        error(format("template %s not found (%s)", name, err), 0)
    end
    local source = f:read("*a")
    f:close()
    factory, err = compile_factory(source, name)
    if not factory then
        error(err, 0)
    end
    if engine.cache then
        engine.compiled[name] = factory
    end
    return factory
end

--- opts: root (default "views"), cache (default true), helpers (a table of extra helpers),
-- globals (a table consulted after the helpers, e.g. _G), csrf_token (a string, or a
-- function given the render's variables).
function _M.new(opts)
    opts = opts or {}
    local globals = opts.globals
    local helpers = setmetatable({}, { __index = function(_, k)
        local v = _M.helpers[k]
        if v == nil and globals then
            v = globals[k]
        end
        return v
    end })
    for k, v in pairs(opts.helpers or {}) do
        helpers[k] = v
    end
    return setmetatable({
        root = opts.root or "views",
        cache = opts.cache ~= false,
        helpers = helpers,
        csrf_token = opts.csrf_token,
        meta = { __index = helpers },
        compiled = {},   -- name -> factory
    }, Engine)
end

local function render_name(engine, name, vars)
    return run(engine, name, load_template(engine, name), nil, vars, 0)
end

--- Renders the template `name` with `vars`. Returns the output as a table of string pieces,
-- or nil and an error: a missing or broken template, or an error raised while rendering,
-- each naming the template and, where there is one, the line.
function Engine:render(name, vars)
    if type(name) ~= "string" then
        error("bad template name (string expected)", 2)
    end
    local ok, res = pcall(render_name, self, name, vars)
    if not ok then
        return nil, res
    end
    return res
end

--- The same, as one string.
function Engine:render_string(name, vars)
    local buf, err = self:render(name, vars)
    if not buf then
        return nil, err
    end
    return concat(buf)
end

return _M
