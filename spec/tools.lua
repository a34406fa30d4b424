-- spec/tools.lua: what the tests need from the system (spec/tools.txt), finding it, and the
-- lint that checks every command the specs and spec/run run against that list.
local M = {}

M.PYTHON = "/usr/bin/python3" -- Debian's, whose modules the python entries name
M.SBIN = { "/usr/local/sbin", "/usr/sbin", "/sbin" } -- where a service may be, off PATH

local KINDS = { base = true, command = true, service = true, python = true, lua = true,
    file = true }

-- -- The list ------------------------------------------------------------------------------

-- Parses the text of a list: { entries = { {kind, name, package, path, line} ... },
-- by_name = { name = entry } }, or nil and "LINE: why".
function M.parse(text)
    local list = { entries = {}, by_name = {} }
    local n = 0
    for line in (text .. "\n"):gmatch("([^\n]*)\n") do
        n = n + 1
        local f = {}
        for w in line:gsub("#.*", ""):gmatch("%S+") do
            f[#f + 1] = w
        end
        if #f > 0 then
            if #f < 3 or #f > 4 or not KINDS[f[1]] then
                return nil, n .. ": expected KIND NAME PACKAGE [PATH], KIND one of base, "
                    .. "command, service, python, lua, file: " .. line
            end
            if list.by_name[f[2]] then
                return nil, n .. ": " .. f[2] .. " is listed twice"
            end
            local e = { kind = f[1], name = f[2], package = f[3], path = f[4], line = n }
            list.entries[#list.entries + 1] = e
            list.by_name[e.name] = e
        end
    end
    return list
end

function M.read(path)
    local f, err = io.open(path, "rb")
    if not f then
        return nil, err
    end
    local text = f:read("*a")
    f:close()
    local list, why = M.parse(text)
    if not list then
        return nil, path .. ":" .. why
    end
    return list
end

-- -- Finding a tool ------------------------------------------------------------------------

local function is_file(path)
    local f = io.open(path, "rb")
    if not f then
        return false
    end
    local ok = f:read(0) ~= nil or f:seek("end") == 0 -- a directory opens but cannot be read
    f:close()
    return ok
end

local function executable(path)
    local ok, lfs = pcall(require, "lfs")
    if ok then
        local perm = lfs.attributes(path, "permissions")
        return perm ~= nil and perm:find("x", 1, true) ~= nil
            and lfs.attributes(path, "mode") == "file"
    end
    return is_file(path)
end

local function sh_quote(s)
    return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- The last match of a glob, in ls order (the highest version of a versioned directory).
local function glob_last(pattern)
    if not pattern:find("[*?[]") then
        return executable(pattern) and pattern or nil
    end
    local p = io.popen("ls -d " .. pattern:gsub("[^%w%*%?%[%]/._-]", "\\%0") .. " 2>/dev/null")
    local found
    for line in p:lines() do
        if executable(line) then
            found = line
        end
    end
    p:close()
    return found
end

local function on_path(name, extra)
    local dirs = {}
    for d in (os.getenv("PATH") or ""):gmatch("[^:]+") do
        dirs[#dirs + 1] = d
    end
    for _, d in ipairs(extra or {}) do
        dirs[#dirs + 1] = d
    end
    for _, d in ipairs(dirs) do
        if executable(d .. "/" .. name) then
            return d .. "/" .. name
        end
    end
end

-- Finds a listed entry on this machine. Returns what to run (a path; for a lua entry, its
-- file, or the module when it has none), or nil and why, naming the package that brings it.
function M.find(entry)
    local found
    if entry.kind == "python" then
        local cmd = sh_quote(M.PYTHON) .. " -c " .. sh_quote("import " .. entry.name)
            .. " >/dev/null 2>&1"
        local rc = os.execute(cmd)
        found = (rc == 0 or rc == true) and M.PYTHON or nil
    elseif entry.kind == "lua" then
        -- Found on the path without loading it: a driver for OpenResty (nginx.redis) needs
        -- the global ngx that only the server's process has.
        found = package.searchpath(entry.name, package.path)
            or package.searchpath(entry.name, package.cpath)
        if not found then
            local ok, mod = pcall(require, entry.name)
            found = ok and mod or nil
        end
    elseif entry.kind == "file" then
        found = is_file(entry.path or entry.name) and (entry.path or entry.name) or nil
    elseif entry.path then
        found = glob_last(entry.path)
    else
        found = on_path(entry.name, entry.kind == "service" and M.SBIN or nil)
    end
    if found == nil then
        local what = entry.kind == "python" and ("Python module " .. entry.name .. " (for "
            .. M.PYTHON .. ")") or entry.kind == "lua" and ("Lua module " .. entry.name)
            or entry.name
        return nil, what .. " is missing: install the Debian package " .. entry.package
            .. " (rockspec/install-deps installs what spec/tools.txt lists)"
    end
    return found
end

-- -- Shell text ----------------------------------------------------------------------------

-- Words that start or shape a shell command without being a program of their own.
local KEYWORDS = { ["if"] = true, ["then"] = true, ["else"] = true, ["elif"] = true,
    ["fi"] = true, ["do"] = true, ["done"] = true, ["while"] = true, ["until"] = true,
    ["{"] = true, ["}"] = true, ["!"] = true, ["esac"] = true, ["[["] = true, ["time"] = true }
-- Segments that run no program at their first word.
local SKIP = { ["for"] = true, ["case"] = true, ["select"] = true, ["function"] = true }
-- Shell builtins (dash and bash): no package brings them.
M.BUILTINS = {}
for w in ([[cd echo printf kill command exec set shift return local trap test [ true false
    wait read export unset eval exit : . umask ulimit type declare readonly]]):gmatch("%S+") do
    M.BUILTINS[w] = true
end

-- Splits shell text into simple commands (at ; & && | || newlines, subshell parentheses and
-- $( ... ), also inside double quotes), each a list of words with their quotes removed.
-- Text between \1 and \2 is a placeholder the caller made, kept whole.
function M.shell_commands(text)
    local cmds, words, word = {}, {}, nil
    local squote, dquote, stack = false, false, {}
    local function end_word()
        if word then
            words[#words + 1] = word
            word = nil
        end
    end
    local function end_cmd()
        end_word()
        if #words > 0 then
            cmds[#cmds + 1] = words
        end
        words = {}
    end
    local function add(c)
        word = (word or "") .. c
    end
    local i, n = 1, #text
    while i <= n do
        local c = text:sub(i, i)
        if c == "\1" then
            local j = text:find("\2", i, true) or n
            add(text:sub(i, j))
            i = j
        elseif squote then
            if c == "'" then squote = false else add(c) end
        elseif c == "\\" then
            local nx = text:sub(i + 1, i + 1)
            if nx == "\n" then
                end_word()
            else
                add(nx)
            end
            i = i + 1
        elseif text:sub(i, i + 1) == "$(" then
            -- The command inside runs first; the word it stands in goes on after the ")".
            stack[#stack + 1] = { dquote = dquote, words = words, word = word }
            words, word, dquote = {}, nil, false
            i = i + 1
        elseif dquote then
            if c == '"' then dquote = false else add(c) end
        elseif c == "'" then
            squote = true
            word = word or ""
        elseif c == '"' then
            dquote = true
            word = word or ""
        elseif c == "#" and not word then
            -- A comment runs to the end of the line.
            i = (text:find("\n", i, true) or n + 1) - 1
        elseif c == "&" and (text:sub(i - 1, i - 1):match("[<>]")
                or text:sub(i + 1, i + 1) == ">") then
            add(c) -- 2>&1, &>file: a redirection
        elseif c == ";" or c == "&" or c == "|" or c == "\n" or c == "(" then
            end_cmd()
        elseif c == ")" then
            end_cmd()
            if #stack > 0 then
                local outer = table.remove(stack)
                words, dquote = outer.words, outer.dquote
                word = (outer.word or "") .. "$()"
            end
        elseif c:match("%s") then
            end_word()
        else
            add(c)
        end
        i = i + 1
    end
    end_cmd()
    return cmds
end

-- The program a simple command runs, past assignments, redirections and keywords; and for
-- commands that run another (timeout 10 nghttp ...), that one too. Returns a list of words.
function M.programs(words)
    local out, i = {}, 1
    while words[i] do
        local w = words[i]
        if w:match("^%d*[<>]") or w:match("^&>") then
            i = i + ((w:match("^%d*[<>]+&?$") or w == "&>") and 2 or 1) -- ">" FILE
        elseif w:match("^[%a_][%w_]*=") then
            i = i + 1
        elseif SKIP[w] then
            return out
        elseif KEYWORDS[w] then
            i = i + 1
        elseif w == "[" or w == "test" then
            out[#out + 1] = w
            return out
        else
            out[#out + 1] = w
            if w == "timeout" then
                i = i + 1
                while words[i] and words[i]:match("^%-") do
                    i = i + ((words[i] == "-s" or words[i] == "-k") and 2 or 1)
                end
                i = i + 1 -- the duration
            elseif w == "exec" or w == "nohup" or w == "env" then
                i = i + 1
                while w == "env" and words[i] and words[i]:match("^[%a_][%w_]*=") do
                    i = i + 1
                end
            else
                return out
            end
        end
    end
    return out
end

-- -- Lua source ----------------------------------------------------------------------------

-- Tokens of Lua source: { t = "str" | "name" | "num" | "op", v = value, line = n }.
local function tokenize(src)
    local toks, i, n, line = {}, 1, #src, 1
    local function push(t, v)
        toks[#toks + 1] = { t = t, v = v, line = line }
    end
    local ESC = { n = "\n", t = "\t", r = "\r", ["\\"] = "\\", ['"'] = '"', ["'"] = "'",
        a = "\a", b = "\b", f = "\f", v = "\v", ["\n"] = "\n" }
    while i <= n do
        local c = src:sub(i, i)
        if c == "\n" then
            line = line + 1
            i = i + 1
        elseif c:match("%s") then
            i = i + 1
        elseif src:sub(i, i + 1) == "--" then
            local eq = src:match("^%-%-%[(=*)%[", i)
            local j
            if eq then
                j = select(2, src:find("]" .. eq .. "]", i, true)) or n
            else
                j = (src:find("\n", i, true) or n + 1) - 1
            end
            local _, lines = src:sub(i, j):gsub("\n", "")
            line = line + lines
            i = j + 1
        elseif src:match("^%[=*%[", i) then
            local eq = src:match("^%[(=*)%[", i)
            local s = i + #eq + 2
            local e = src:find("]" .. eq .. "]", s, true) or n
            local body = src:sub(s, e - 1):gsub("^\n", "")
            push("str", body)
            local _, lines = src:sub(i, e):gsub("\n", "")
            line = line + lines
            i = e + #eq + 2
        elseif c == '"' or c == "'" then
            local parts, j = {}, i + 1
            while j <= n and src:sub(j, j) ~= c do
                local d = src:sub(j, j)
                if d == "\\" then
                    local e = src:sub(j + 1, j + 1)
                    if e:match("%d") then
                        local digits = src:match("^%d%d?%d?", j + 1)
                        parts[#parts + 1] = string.char(tonumber(digits) % 256)
                        j = j + #digits
                    else
                        parts[#parts + 1] = ESC[e] or e
                        j = j + 1
                    end
                else
                    parts[#parts + 1] = d
                end
                j = j + 1
            end
            push("str", table.concat(parts))
            i = j + 1
        elseif c:match("[%a_]") then
            local w = src:match("^[%w_]+", i)
            push("name", w)
            i = i + #w
        elseif c:match("%d") then
            local w = src:match("^0[xX]%x+", i) or src:match("^%d+%.?%d*[eE]?[-+]?%d*", i)
            push("num", w)
            i = i + #w
        else
            local op = src:match("^%.%.%.", i) or src:match("^[=~<>]=", i) or src:match("^%.%.", i)
                or c
            push("op", op)
            i = i + #op
        end
    end
    return toks
end

local function is_op(tok, v)
    return tok and tok.t == "op" and tok.v == v
end

-- A dotted name starting at toks[i] ("helper.run", "srv:stop"): the name and the index after.
local function dotted(toks, i)
    if not (toks[i] and toks[i].t == "name") then
        return nil, i
    end
    local name, j = toks[i].v, i + 1
    while (is_op(toks[j], ".") or is_op(toks[j], ":")) and toks[j + 1]
            and toks[j + 1].t == "name" do
        name = name .. toks[j].v .. toks[j + 1].v
        j = j + 2
    end
    return name, j
end

local OPEN = { ["("] = ")", ["["] = "]", ["{"] = "}" }
local STOP = { ["local"] = true, ["return"] = true, ["end"] = true, ["if"] = true,
    ["then"] = true, ["else"] = true, ["elseif"] = true, ["do"] = true, ["for"] = true,
    ["while"] = true, ["until"] = true, ["repeat"] = true, ["in"] = true, ["break"] = true,
    ["function"] = true, ["and"] = true, ["or"] = true, ["not"] = true }

-- Skips one balanced bracket group starting at toks[i] (an opening bracket); the index after.
local function skip_group(toks, i)
    local depth = 0
    repeat
        local t = toks[i]
        if not t then
            return i
        end
        if t.t == "op" and OPEN[t.v] then
            depth = depth + 1
        elseif t.t == "op" and (t.v == ")" or t.v == "]" or t.v == "}") then
            depth = depth - 1
        end
        i = i + 1
    until depth == 0
    return i
end

-- Pieces of a command string: { text = "..." }, { tool = NAME } (helper.tool), or
-- { hole = NAME-or-false, at = token index } for a value the source does not spell out.
local parse_expr

local QUOTERS = { sh_quote = true, q = true, ["helper.sh_quote"] = true, tostring = true }
local FORMATS = { ["string.format"] = true }

-- Applies a format string's directives to the pieces of its arguments.
local function apply_format(fmt, args)
    local out, k = {}, 1
    for _, p in ipairs(fmt) do
        if p.text then
            local s = p.text
            local pos = 1
            while true do
                local a, b, spec = s:find("%%([-+ #0]*%d*%.?%d*[a-zA-Z%%])", pos)
                if not a then
                    out[#out + 1] = { text = s:sub(pos) }
                    break
                end
                out[#out + 1] = { text = s:sub(pos, a - 1) }
                if spec == "%" then
                    out[#out + 1] = { text = "%" }
                elseif spec:sub(-1) == "s" or spec:sub(-1) == "q" then
                    for _, ap in ipairs(args[k] or { { hole = false } }) do
                        out[#out + 1] = ap
                    end
                    k = k + 1
                else
                    out[#out + 1] = { text = "0" } -- a number
                    k = k + 1
                end
                pos = b + 1
            end
        else
            out[#out + 1] = p
        end
    end
    return out
end

-- Parses a call's arguments at toks[i] ("(" ...), a string or a table); returns a list of
-- argument piece lists and the index after.
local function parse_args(toks, i)
    local args = {}
    if toks[i] and toks[i].t == "str" then
        return { { { text = toks[i].v } } }, i + 1
    end
    if is_op(toks[i], "{") then
        return { { { hole = false, at = i } } }, skip_group(toks, i)
    end
    i = i + 1 -- "("
    if is_op(toks[i], ")") then
        return args, i + 1
    end
    while toks[i] do
        local pieces
        pieces, i = parse_expr(toks, i)
        args[#args + 1] = pieces
        if is_op(toks[i], ",") then
            i = i + 1
        else
            break
        end
    end
    if is_op(toks[i], ")") then
        i = i + 1
    end
    return args, i
end

local function is_call(toks, i)
    return is_op(toks[i], "(") or (toks[i] and toks[i].t == "str") or is_op(toks[i], "{")
end

-- One operand of "..": a string, a parenthesised expression with :format, a call, a name.
local function parse_term(toks, i)
    local t = toks[i]
    if not t then
        return { { hole = false } }, i
    end
    if t.t == "str" then
        return { { text = t.v } }, i + 1
    end
    if t.t == "num" then
        return { { text = t.v } }, i + 1
    end
    local pieces
    if is_op(t, "(") then
        pieces, i = parse_expr(toks, i + 1)
        if is_op(toks[i], ")") then
            i = i + 1
        end
    elseif t.t == "name" and not STOP[t.v] then
        local name, j = dotted(toks, i)
        if is_call(toks, j) then
            local args
            args, j = parse_args(toks, j)
            local base = name:gsub("^helper%.", "")
            if (base == "tool") and args[1] and #args[1] == 1 and args[1][1].text then
                pieces = { { tool = args[1][1].text, at = i } }
            elseif QUOTERS[name] and args[1] then
                pieces = args[1]
            elseif FORMATS[name] and args[1] then
                pieces = apply_format(args[1], { select(2, unpack(args)) })
            elseif name == "os.getenv" then
                pieces = { { hole = false, getenv = true, at = i } }
            else
                pieces = { { hole = false, at = i } }
            end
        else
            pieces = { { hole = (name:find("[.:]") and false or name), dotted = name, at = i } }
        end
        i = j
    else
        return { { hole = false } }, i
    end
    -- Suffixes: ("..."):format(...), x.y, x[...], f(...).
    while toks[i] do
        local method = is_op(toks[i], ":") and toks[i + 1] and toks[i + 1].t == "name"
            and is_call(toks, i + 2) and toks[i + 1].v
        if method == "format" then
            local args
            args, i = parse_args(toks, i + 2)
            pieces = apply_format(pieces, args)
        elseif method then
            local _
            _, i = parse_args(toks, i + 2)
            pieces = { { hole = false, at = i } }
        elseif is_op(toks[i], ".") and toks[i + 1] and toks[i + 1].t == "name" then
            i = i + 2
            pieces = { { hole = false, at = i } }
        elseif is_op(toks[i], "[") then
            i = skip_group(toks, i)
            pieces = { { hole = false, at = i } }
        elseif is_op(toks[i], "(") then
            i = skip_group(toks, i)
            pieces = { { hole = false, at = i } }
        else
            break
        end
    end
    return pieces, i
end

-- An expression: terms joined by "..". "os.getenv(X) or DEFAULT" is DEFAULT (the default is
-- what a plain run uses, and what gets checked); other operators leave an unknown value.
function parse_expr(toks, i)
    local pieces
    if toks[i] and toks[i].t == "name" and toks[i].v == "not" then
        i = i + 1
    end
    pieces, i = parse_term(toks, i)
    while true do
        local t = toks[i]
        if is_op(t, "..") then
            local more
            more, i = parse_term(toks, i + 1)
            for _, p in ipairs(more) do
                pieces[#pieces + 1] = p
            end
        elseif t and t.t == "name" and (t.v == "or" or t.v == "and") then
            local more
            more, i = parse_term(toks, i + 1)
            if t.v == "or" and #pieces == 1 and pieces[1].getenv then
                pieces = more
            else
                pieces = { { hole = false, at = i } }
            end
        elseif t and t.t == "op" and (t.v == "==" or t.v == "~=" or t.v == "<" or t.v == ">"
                or t.v == "<=" or t.v == ">=" or t.v == "+" or t.v == "-" or t.v == "*"
                or t.v == "/" or t.v == "%") then
            local _
            _, i = parse_term(toks, i + 1)
            pieces = { { hole = false, at = i } }
        else
            return pieces, i
        end
    end
end

-- The functions of a file, with their parameters and token ranges, and its local names.
local OPENERS = { ["function"] = true, ["do"] = true, ["if"] = true, ["repeat"] = true }
local CLOSERS = { ["end"] = true, ["until"] = true }

local function scan(toks)
    local funcs, locals, stack = {}, {}, {}
    local i = 1
    while toks[i] do
        local t = toks[i]
        if t.t == "name" and OPENERS[t.v] and not is_op(toks[i - 1], ".") then
            if t.v == "function" then
                local name, j = dotted(toks, i + 1)
                if not name then
                    -- function(...): named by "x = function" or "local x = function".
                    if is_op(toks[i - 1], "=") and toks[i - 2] and toks[i - 2].t == "name" then
                        name = dotted(toks, i - 2)
                    end
                    j = i + 1
                end
                local f = { name = name, params = {}, first = i }
                if is_op(toks[j], "(") then
                    j = j + 1
                    while toks[j] and not is_op(toks[j], ")") do
                        if toks[j].t == "name" then
                            f.params[#f.params + 1] = toks[j].v
                        end
                        j = j + 1
                    end
                end
                funcs[#funcs + 1] = f
                stack[#stack + 1] = f
                i = j
            else
                stack[#stack + 1] = false
            end
        elseif t.t == "name" and CLOSERS[t.v] then
            local f = table.remove(stack)
            if f then
                f.last = i
            end
        elseif t.t == "name" and t.v == "local" then
            -- local a, b = x, y: each name's value expression starts where the parser finds it.
            local names, j = {}, i + 1
            if toks[j] and toks[j].v == "function" then
                locals[#locals + 1] = { name = toks[j + 1].v, at = i, func = true }
            else
                while toks[j] and toks[j].t == "name" do
                    names[#names + 1] = toks[j].v
                    if is_op(toks[j + 1], ",") then j = j + 2 else j = j + 1 break end
                end
                local values = {}
                if is_op(toks[j], "=") then
                    j = j + 1
                    for k = 1, #names do
                        values[k] = j
                        local _
                        _, j = parse_expr(toks, j)
                        if k < #names and is_op(toks[j], ",") then j = j + 1 else break end
                    end
                end
                for k, nm in ipairs(names) do
                    locals[#locals + 1] = { name = nm, at = i, value = values[k],
                        alias = values[k] and dotted(toks, values[k]) }
                end
            end
        end
        i = i + 1
    end
    for _, f in ipairs(funcs) do
        f.last = f.last or #toks
    end
    return funcs, locals
end

-- What a bare name at token index `at` is: a parameter of an enclosing function, or a local.
local function resolve(file, name, at)
    local fn, param
    for _, f in ipairs(file.funcs) do
        if f.first < at and at <= f.last and (not fn or f.first > fn.first) then
            for k, p in ipairs(f.params) do
                if p == name then
                    fn, param = f, k
                end
            end
        end
    end
    local loc
    for _, l in ipairs(file.locals) do
        if l.name == name and l.at < at and (not loc or l.at > loc.at) then
            loc = l
        end
    end
    if loc and (not fn or loc.at > fn.first) then
        return nil, loc
    end
    return fn and { func = fn, index = param }
end

-- Replaces holes naming locals by their values, a few levels deep.
local function expand(file, pieces, depth)
    local out = {}
    for _, p in ipairs(pieces) do
        local done = false
        if p.hole and (depth or 0) < 6 then
            local par, loc = resolve(file, p.hole, p.at or 0)
            if loc and loc.value then
                local value = parse_expr(file.toks, loc.value)
                for _, q in ipairs(expand(file, value, (depth or 0) + 1)) do
                    out[#out + 1] = q
                end
                done = true
            elseif par then
                out[#out + 1] = { hole = p.hole, at = p.at, param = par }
                done = true
            end
        end
        if not done then
            out[#out + 1] = p
        end
    end
    return out
end

-- Command-running calls in a file: { line, name, pieces, at } for each call of a sink.
-- sinks: name -> argument index holding the command.
local function sink_calls(file, sinks)
    local calls, toks = {}, file.toks
    local aliases = {}
    for _, l in ipairs(file.locals) do
        if l.alias and sinks[l.alias] then
            aliases[l.name] = sinks[l.alias]
        end
    end
    local i = 1
    while toks[i] do
        if toks[i].t == "name" and not is_op(toks[i - 1], ".") and not is_op(toks[i - 1], ":")
                and not (toks[i - 1] and toks[i - 1].v == "function") then
            local name, j = dotted(toks, i)
            local index = sinks[name] or aliases[name]
            if index and is_call(toks, j) then
                local args = parse_args(toks, j)
                calls[#calls + 1] = { line = toks[i].line, name = name, at = i,
                    pieces = expand(file, args[index] or { { hole = false } }) }
            end
            i = j
        else
            i = i + 1
        end
    end
    return calls
end

-- Turns pieces into shell text with placeholders: \1Tn\2 for tools, \1Hn\2 for holes.
local function placeholder_text(pieces)
    local parts = {}
    for k, p in ipairs(pieces) do
        if p.text then
            parts[#parts + 1] = p.text
        elseif p.tool then
            parts[#parts + 1] = "\1T" .. k .. "\2"
        else
            parts[#parts + 1] = "\1H" .. k .. "\2"
        end
    end
    return table.concat(parts)
end

local function exists_in_tree(root, path)
    path = path:gsub("^%./", ""):gsub("^/", "")
    return path ~= "" and executable(root .. "/" .. path)
end

-- Checks one program word; returns nil if fine, or why not. `pieces` gives placeholders
-- their meaning; on_param(piece) judges a command that came in as a parameter. by_name: a
-- shell script, which runs listed tools by their names (it has no helper.tool).
local function check_word(word, pieces, list, root, on_param, by_name)
    local k = word:match("^\1T(%d+)\2")
    if k then
        local name = pieces[tonumber(k)].tool
        local e = list.by_name[name]
        if not e then
            return "helper.tool(\"" .. name .. "\"): " .. name .. " is not in spec/tools.txt: "
                .. "add it there with the Debian package that brings it"
        end
        return nil
    end
    k = word:match("^\1H(%d+)\2")
    if k then
        local rest = word:gsub("^\1H%d+\2", "")
        local p = pieces[tonumber(k)]
        if rest == "" and p.param then
            return on_param(p)
        end
        if rest:match("^/") and not rest:find("\1", 1, true) and exists_in_tree(root, rest) then
            return nil -- ROOT .. "/spec/run": a project script
        end
        return "a command whose program the source does not spell out ("
            .. (p.dotted or p.hole or "an expression") .. "): name a listed tool with "
            .. "helper.tool(NAME), or a project script"
    end
    if word:find("/", 1, true) then
        if not word:find("\1", 1, true) and exists_in_tree(root, word) then
            return nil
        end
        return word .. " is a path outside the project: run a listed tool as helper.tool(NAME)"
    end
    if M.BUILTINS[word] then
        return nil
    end
    local e = list.by_name[word]
    if not e then
        return word .. " is not in spec/tools.txt: add it there with the Debian package "
            .. "that brings it"
    end
    if e.kind ~= "base" and not by_name then
        return word .. " is run by its name: run it as helper.tool(\"" .. word .. "\"), which "
            .. "names its package (" .. e.package .. ") when it is missing"
    end
    return nil
end

local function check_text(text, pieces, list, root, on_param)
    local problems = {}
    for _, words in ipairs(M.shell_commands(text)) do
        for _, w in ipairs(M.programs(words)) do
            local why = check_word(w, pieces, list, root, on_param)
            if why then
                problems[#problems + 1] = why
            end
        end
    end
    return problems
end

-- -- The lint ------------------------------------------------------------------------------

-- The calls that run a shell command, and which argument holds it. Functions that pass one
-- of their parameters on as the start of a command join them (helper.run, helper.sh, ...).
M.SINKS = { ["os.execute"] = 1, ["io.popen"] = 1 }

local function load_lua(path, text)
    local toks = tokenize(text)
    local file = { path = path, toks = toks }
    file.funcs, file.locals = scan(toks)
    return file
end

-- lint(files, list, root): files is a list of { path = shown name, text = source, shell =
-- true for a shell script, context = true for a file read only for the functions it defines
-- that run commands (spec/helper.lua, when linting one spec) }. Returns { [path] = {
-- "LINE: why", ... } } for every file but the context ones.
function M.lint(files, list, root)
    local result, luas = {}, {}
    for _, f in ipairs(files) do
        result[f.path] = {}
        if not f.shell then
            luas[#luas + 1] = load_lua(f.path, f.text)
            luas[#luas].context = f.context
        end
    end
    -- Functions that run a command they are given: global ones (helper.run) for every
    -- file, local ones for their own file. Found until no more turn up.
    local global = {}
    for k, v in pairs(M.SINKS) do
        global[k] = v
    end
    local locals = {}
    local changed = true
    while changed do
        changed = false
        for _, file in ipairs(luas) do
            local sinks = setmetatable({}, { __index = function(_, k)
                return global[k] or (locals[file.path] or {})[k]
            end })
            for _, call in ipairs(sink_calls(file, sinks)) do
                local text = placeholder_text(call.pieces)
                check_text(text, call.pieces, list, root, function(p)
                    local name = p.param.func.name
                    if name then
                        local scope = name:find("[.:]") and global or locals[file.path]
                        if not scope then
                            locals[file.path] = {}
                            scope = locals[file.path]
                        end
                        if not scope[name] then
                            scope[name] = p.param.index
                            changed = true
                        end
                    end
                end)
            end
        end
    end
    for _, file in ipairs(luas) do
        local sinks = setmetatable({}, { __index = function(_, k)
            return global[k] or (locals[file.path] or {})[k]
        end })
        for _, call in ipairs(file.context and {} or sink_calls(file, sinks)) do
            local text = placeholder_text(call.pieces)
            local problems = check_text(text, call.pieces, list, root, function(p)
                if not p.param.func.name then
                    return "runs a command given to an unnamed function: name it, so that "
                        .. "its callers are checked"
                end
            end)
            for _, why in ipairs(problems) do
                table.insert(result[file.path], call.line .. ": " .. why)
            end
        end
    end
    for _, f in ipairs(files) do
        if f.context then
            result[f.path] = nil
        elseif f.shell then
            -- Functions the script defines are its own commands.
            local defined = {}
            for name in ("\n" .. f.text):gmatch("\n%s*([%w_]+)%(%)%s*{") do
                defined[name] = true
            end
            -- Line by line, a line ending in a backslash joined to the next.
            local n, first, pending = 0, nil, ""
            for line in (f.text .. "\n"):gmatch("([^\n]*)\n") do
                n = n + 1
                first = first or n
                if line:match("\\$") then
                    pending = pending .. line:sub(1, -2) .. " "
                else
                    local text = (pending .. line):gsub("^%s*[%w_]+%(%)%s*{", "{")
                    for _, words in ipairs(M.shell_commands(text)) do
                        for _, w in ipairs(M.programs(words)) do
                            local why = not defined[w]
                                and check_word(w, {}, list, root, function() end, true)
                            if why then
                                table.insert(result[f.path], first .. ": " .. why)
                            end
                        end
                    end
                    first, pending = nil, ""
                end
            end
        end
    end
    return result
end

return M
