-- moonserve/ngx/re.lua: OpenResty's ngx.re (match, find, gmatch, sub, gsub) and the
-- ngx.re module's split and opt, on PCRE2 through the FFI.
--
-- Arguments, return values and error strings follow lua-nginx-module 0.10.23 with
-- lua-resty-core as built on PCRE2 (OpenResty 1.21+); docs/ngx-re.md lists where that
-- differs from Debian's module, which is built on PCRE1. Patterns compiled with "o" are
-- kept per worker in one LRU cache (lua_regex_cache_max_entries: 1024 by default), each
-- with its own match data, so a warm call allocates only the strings and the table it
-- returns.
local ffi = require "ffi"
local bit = require "bit"
local buffer = require "string.buffer"

local band, bor = bit.band, bit.bor
local byte, sub, find = string.byte, string.sub, string.find
local tostring, tonumber, type, error = tostring, tonumber, type, error
local setmetatable = setmetatable
local ffi_string, ffi_gc, ffi_cast = ffi.string, ffi.gc, ffi.cast

local ok_new, new_tab = pcall(require, "table.new")
if not ok_new then
    new_tab = function() return {} end
end

if not pcall(ffi.typeof, "pcre2_code_8") then
    ffi.cdef [[
typedef struct pcre2_real_code_8 pcre2_code_8;
typedef struct pcre2_real_match_data_8 pcre2_match_data_8;
typedef struct pcre2_real_match_context_8 pcre2_match_context_8;
typedef struct pcre2_real_jit_stack_8 pcre2_jit_stack_8;

pcre2_code_8 *pcre2_compile_8(const char *pattern, size_t length, uint32_t options,
    int *errorcode, size_t *erroroffset, void *ccontext);
void pcre2_code_free_8(pcre2_code_8 *code);
int pcre2_pattern_info_8(const pcre2_code_8 *code, uint32_t what, void *where);
int pcre2_jit_compile_8(pcre2_code_8 *code, uint32_t options);
int pcre2_get_error_message_8(int errorcode, unsigned char *buffer, size_t bufflen);
int pcre2_config_8(uint32_t what, void *where);

pcre2_match_data_8 *pcre2_match_data_create_from_pattern_8(const pcre2_code_8 *code,
    void *gcontext);
void pcre2_match_data_free_8(pcre2_match_data_8 *match_data);
size_t *pcre2_get_ovector_pointer_8(pcre2_match_data_8 *match_data);

int pcre2_match_8(const pcre2_code_8 *code, const char *subject, size_t length,
    size_t startoffset, uint32_t options, pcre2_match_data_8 *match_data,
    pcre2_match_context_8 *mcontext);
int pcre2_jit_match_8(const pcre2_code_8 *code, const char *subject, size_t length,
    size_t startoffset, uint32_t options, pcre2_match_data_8 *match_data,
    pcre2_match_context_8 *mcontext);
int pcre2_dfa_match_8(const pcre2_code_8 *code, const char *subject, size_t length,
    size_t startoffset, uint32_t options, pcre2_match_data_8 *match_data,
    pcre2_match_context_8 *mcontext, int *workspace, size_t wscount);

pcre2_match_context_8 *pcre2_match_context_create_8(void *gcontext);
int pcre2_set_match_limit_8(pcre2_match_context_8 *mcontext, uint32_t value);
pcre2_jit_stack_8 *pcre2_jit_stack_create_8(size_t startsize, size_t maxsize,
    void *gcontext);
void pcre2_jit_stack_assign_8(pcre2_match_context_8 *mcontext, void *callback, void *data);
void pcre2_jit_stack_free_8(pcre2_jit_stack_8 *jit_stack);
]]
end

-- Debian's libpcre2-8-0 has only the versioned name; libpcre2-dev adds the plain one.
local P
do
    local ok, lib = pcall(ffi.load, "pcre2-8")
    if not ok then
        ok, lib = pcall(ffi.load, "libpcre2-8.so.0")
    end
    if not ok then
        error("moonserve.ngx.re needs PCRE2's libpcre2-8 (Debian: libpcre2-8-0): " .. lib, 2)
    end
    P = lib
    -- The library stays loaded for as long as the process runs: the finalizers of compiled
    -- patterns and match data are its functions, and would call into unmapped memory if
    -- this namespace were collected (and the library closed) before them, as it is when
    -- this module is dropped from package.loaded and loaded again.
    debug.getregistry()["moonserve.ngx.re: libpcre2-8"] = lib
end

-- pcre2.h
local PCRE2_CASELESS = 0x00000008
local PCRE2_MULTILINE = 0x00000400
local PCRE2_DOTALL = 0x00000020
local PCRE2_EXTENDED = 0x00000080
local PCRE2_ANCHORED = 0x80000000
local PCRE2_UTF = 0x00080000
local PCRE2_DUPNAMES = 0x00000040
local PCRE2_NO_UTF_CHECK = 0x40000000
-- PCRE2 has no PCRE_JAVASCRIPT_COMPAT; these three are what it changed.
local PCRE2_JS_COMPAT = bor(0x00000002, 0x00000200, 0x00000001) -- ALT_BSUX,
--                                     MATCH_UNSET_BACKREF, ALLOW_EMPTY_CLASS
local PCRE2_JIT_COMPLETE = 0x1
local PCRE2_INFO_CAPTURECOUNT = 4
local PCRE2_INFO_NAMECOUNT = 17
local PCRE2_INFO_NAMEENTRYSIZE = 18
local PCRE2_INFO_NAMETABLE = 19
local PCRE2_CONFIG_VERSION = 11
local PCRE2_ERROR_NOMATCH = -1
local PCRE2_ERROR_BADOFFSET = -33

-- What the option letters ask of this module (lua-resty-core's numbering).
local F_ONCE = 0x01
local F_DFA = 0x02
local F_JIT = 0x04
local F_DUPNAMES = 0x08
local F_NO_UTF_CHECK = 0x10
local F_UTF = 0x20

local MAX_ERR_MSG_LEN = 128         -- lua-resty-core's error buffer, NUL included
local DFA_WORKSPACE = 100           -- ints, as NGX_LUA_RE_DFA_MODE_WORKSPACE_COUNT
local MIN_JIT_STACK = 32 * 1024     -- as NGX_LUA_RE_MIN_JIT_STACK_SIZE
local TEMPLATES_PER_PATTERN = 64    -- parsed sub/gsub templates kept on a cached pattern

local ov_t = ffi.typeof("int64_t *")  -- PCRE2_UNSET reads as -1
local char_p = ffi.typeof("const char *")
local errcode = ffi.new("int[1]")
local erroff = ffi.new("size_t[1]")
local u32 = ffi.new("uint32_t[1]")
local ptr = ffi.new("const unsigned char *[1]")
local errbuf = ffi.new("unsigned char[256]")
local dfa_ws = ffi.new("int[?]", DFA_WORKSPACE)

local mctx = assert(P.pcre2_match_context_create_8(nil), "pcre2_match_context_create() failed")
-- Set by opt("jit_stack_size"): the match context points at it, and this keeps it alive.
local jit_stack -- luacheck: ignore 231

local _M = { version = "0.1.25" }

-- -- Options -------------------------------------------------------------------------

local opt_flags, opt_copts = {}, {}
local OPT_LETTERS = {
    [byte "o"] = { F_ONCE, 0 },
    [byte "j"] = { F_JIT, 0 },
    [byte "i"] = { 0, PCRE2_CASELESS },
    [byte "s"] = { 0, PCRE2_DOTALL },
    [byte "m"] = { 0, PCRE2_MULTILINE },
    [byte "u"] = { F_UTF, PCRE2_UTF },
    [byte "U"] = { bor(F_UTF, F_NO_UTF_CHECK), PCRE2_UTF },
    [byte "x"] = { 0, PCRE2_EXTENDED },
    [byte "d"] = { F_DFA, 0 },
    [byte "a"] = { 0, PCRE2_ANCHORED },
    [byte "D"] = { F_DUPNAMES, PCRE2_DUPNAMES },
    [byte "J"] = { 0, PCRE2_JS_COMPAT },
}

-- Raises at the caller of the ngx.re function (level 3 from here), as OpenResty raises.
local function parse_opts(opts)
    local flags, copts = 0, 0
    for i = 1, #opts do
        local l = OPT_LETTERS[byte(opts, i)]
        if not l then
            error(('unknown flag "%s" (flags "%s")'):format(sub(opts, i, i), opts), 4)
        end
        flags, copts = bor(flags, l[1]), bor(copts, l[2])
    end
    opt_flags[opts], opt_copts[opts] = flags, copts
    return flags
end

-- -- The cache of compiled patterns ----------------------------------------------------
-- by_opts[opts][regex] is an entry; entries also form a list, most recently used first,
-- so that the least recently used one leaves when the cache is full. Eviction only drops
-- references: a call still using an entry keeps it alive, and the GC frees it after.

local by_opts = {}
local head, tail
local cached, cache_max = 0, 1024
local ever_cached = false

local function unlink(e)
    local p, n = e.prev, e.next
    if p then p.next = n else head = n end
    if n then n.prev = p else tail = p end
    e.prev, e.next = nil, nil
end

local function push_front(e)
    e.next = head
    if head then head.prev = e else tail = e end
    head = e
end

local function evict_to(max)
    while cached > max and tail do
        local e = tail
        unlink(e)
        by_opts[e.opts][e.regex] = nil
        cached = cached - 1
    end
end

-- -- Compiling -----------------------------------------------------------------------

local function compile_error(regex)
    local n = P.pcre2_get_error_message_8(errcode[0], errbuf, 256)
    local why = n > 0 and ffi_string(errbuf, n) or ("error " .. errcode[0])
    local off = tonumber(erroff[0])
    local msg
    if off == #regex then
        msg = 'pcre2_compile() failed: ' .. why .. ' in "' .. regex .. '"'
    else
        -- The rest of the pattern is printed as a C string: up to a NUL.
        local rest = sub(regex, off + 1)
        local z = find(rest, "\0", 1, true)
        if z then rest = sub(rest, 1, z - 1) end
        msg = 'pcre2_compile() failed: ' .. why .. ' in "' .. regex .. '" at "' .. rest .. '"'
    end
    return sub(msg, 1, MAX_ERR_MSG_LEN - 1)
end

local function info(code, what, out)
    local rc = P.pcre2_pattern_info_8(code, what, out)
    assert(rc == 0, "pcre2_pattern_info() failed")
end

-- Returns a new entry (not yet cached), or nil and the message.
local function new_entry(regex, opts, flags, copts)
    local code = P.pcre2_compile_8(regex, #regex, copts, errcode, erroff, nil)
    if code == nil then
        return nil, compile_error(regex)
    end
    code = ffi_gc(code, P.pcre2_code_free_8)
    -- Without the JIT (a pattern it cannot take, or a build without it) the interpreter
    -- runs the pattern, as in OpenResty.
    local jitted = band(flags, F_JIT) ~= 0
        and P.pcre2_jit_compile_8(code, PCRE2_JIT_COMPLETE) == 0
    local md = P.pcre2_match_data_create_from_pattern_8(code, nil)
    assert(md ~= nil, "pcre2_match_data_create() failed: no memory")
    md = ffi_gc(md, P.pcre2_match_data_free_8)
    info(code, PCRE2_INFO_CAPTURECOUNT, u32)
    local ncap = tonumber(u32[0])
    local dfa = band(flags, F_DFA) ~= 0
    local utf_check = band(flags, F_UTF) ~= 0 and band(flags, F_NO_UTF_CHECK) == 0
    local names = false
    info(code, PCRE2_INFO_NAMECOUNT, u32)
    local nnames = tonumber(u32[0])
    if nnames > 0 then
        info(code, PCRE2_INFO_NAMEENTRYSIZE, u32)
        local size = tonumber(u32[0])
        info(code, PCRE2_INFO_NAMETABLE, ptr)
        local t = ptr[0]
        -- Each entry: the group number (big-endian 16 bits), then the name and a NUL, in
        -- the order of the names; duplicates in the order of their groups.
        names = new_tab(nnames * 2, 0)
        for k = 0, nnames - 1 do
            local at = t + k * size
            names[2 * k + 1] = at[0] * 256 + at[1]
            names[2 * k + 2] = ffi_string(at + 2)
        end
    end
    return {
        code = code,
        md = md,
        ov = ffi_cast(ov_t, P.pcre2_get_ovector_pointer_8(md)),
        -- DFA mode reports only the whole match, so a DFA entry has no groups (as OpenResty).
        ncap = dfa and 0 or ncap,
        names = (not dfa) and names or false,
        nnames = dfa and 0 or nnames,
        dfa = dfa,
        -- pcre2_jit_match skips pcre2_match's checks of the arguments, the UTF-8 check
        -- among them: only for JIT code that is not to check its subject.
        fast = jitted and not dfa and not utf_check,
        utf = band(flags, F_UTF) ~= 0,
        dupnames = band(flags, F_DUPNAMES) ~= 0,
        mopts = band(flags, F_NO_UTF_CHECK) ~= 0 and PCRE2_NO_UTF_CHECK or 0,
        once = false,
        opts = opts,
        regex = regex,
        templates = false,
        ntemplates = 0,
        prev = nil,
        next = nil,
    }
end

-- The entry for (regex, opts): from the cache with "o", else compiled for this call.
-- Raises on a bad option letter; returns nil and the message for a bad pattern.
local function compile(regex, opts)
    if opts == nil then
        opts = ""
    elseif type(opts) ~= "string" then
        opts = tostring(opts)
    end
    if type(regex) ~= "string" then
        if type(regex) ~= "number" then
            error("bad argument #2 (string expected, got " .. type(regex) .. ")", 3)
        end
        regex = tostring(regex)
    end
    local flags = opt_flags[opts] or parse_opts(opts)
    local once = band(flags, F_ONCE) ~= 0 and cache_max > 0
    local sub_cache
    if once then
        sub_cache = by_opts[opts]
        if sub_cache then
            local e = sub_cache[regex]
            if e then
                if e ~= head then
                    unlink(e)
                    push_front(e)
                end
                return e
            end
        else
            sub_cache = {}
            by_opts[opts] = sub_cache
        end
    end
    local e, err = new_entry(regex, opts, flags, opt_copts[opts])
    if not e then
        return nil, err
    end
    if once then
        e.once = true
        sub_cache[regex] = e
        push_front(e)
        cached = cached + 1
        ever_cached = true
        evict_to(cache_max)
    end
    return e
end

-- An entry compiled for one call is freed at once rather than at the next GC cycle.
local function release(e)
    if not e.once then
        P.pcre2_match_data_free_8(ffi_gc(e.md, nil))
        P.pcre2_code_free_8(ffi_gc(e.code, nil))
        e.md, e.code, e.ov = nil, nil, nil
    end
end

-- -- Matching ------------------------------------------------------------------------

local function exec(e, subj, len, pos)
    if e.fast then
        if pos > len then return PCRE2_ERROR_BADOFFSET end
        return P.pcre2_jit_match_8(e.code, subj, len, pos, e.mopts, e.md, mctx)
    elseif e.dfa then
        local rc = P.pcre2_dfa_match_8(e.code, subj, len, pos, e.mopts, e.md, mctx, dfa_ws,
            DFA_WORKSPACE)
        -- 0: more matches than the ovector holds; the first, the longest, is there.
        if rc == 0 then return 1 end
        return rc
    end
    return P.pcre2_match_8(e.code, subj, len, pos, e.mopts, e.md, mctx)
end

local function exec_error(rc)
    if rc == 0 then
        return "capture size too small"
    end
    return "pcre_exec() failed: " .. rc
end

-- Where to look after an empty match at `at` (0-based): one byte on, or with "u" and "U"
-- one character on, so that a search never starts inside a UTF-8 sequence.
local function step(e, subj, len, at)
    at = at + 1
    if e.utf then
        while at < len do
            local c = byte(subj, at + 1)
            if c < 0x80 or c >= 0xc0 then break end
            at = at + 1
        end
    end
    return at
end

-- Fills res with the groups of the last match (rc from exec) and the named groups.
local function collect(e, rc, subj, res)
    local ncap = e.ncap
    if not res then
        res = new_tab(ncap, e.nnames)
    end
    local ov = e.ov
    for i = 0, ncap do
        if i < rc then
            local from = tonumber(ov[2 * i])
            if from >= 0 then
                res[i] = sub(subj, from + 1, tonumber(ov[2 * i + 1]))
            else
                res[i] = false
            end
        else
            res[i] = false
        end
    end
    local names = e.names
    if names then
        if e.dupnames then
            -- "D": every matched group of a name, in group order; a name none matched
            -- stays absent.
            for k = 1, #names, 2 do
                res[names[k + 1]] = nil
            end
            for k = 1, #names, 2 do
                local cap = res[names[k]]
                if cap then
                    local name = names[k + 1]
                    local list = res[name]
                    if list then
                        list[#list + 1] = cap
                    else
                        res[name] = { cap }
                    end
                end
            end
        else
            for k = 1, #names, 2 do
                res[names[k + 1]] = res[names[k]]
            end
        end
    end
    return res
end

function _M.match(subj, regex, opts, ctx, res)
    subj = tostring(subj)
    local e, err = compile(regex, opts)
    if not e then
        return nil, err
    end
    local pos = 0
    if ctx then
        local p = ctx.pos
        if p and p > 0 then pos = p - 1 end
    end
    local rc = exec(e, subj, #subj, pos)
    if rc <= 0 then
        release(e)
        if rc == PCRE2_ERROR_NOMATCH then return nil end
        return nil, exec_error(rc)
    end
    if ctx then
        ctx.pos = tonumber(e.ov[1]) + 1
    end
    res = collect(e, rc, subj, res)
    release(e)
    return res
end

function _M.find(subj, regex, opts, ctx, nth)
    subj = tostring(subj)
    local e, err = compile(regex, opts)
    if not e then
        return nil, nil, err
    end
    local pos = 0
    if ctx then
        local p = ctx.pos
        if p and p > 0 then pos = p - 1 end
    end
    local rc = exec(e, subj, #subj, pos)
    if rc <= 0 then
        release(e)
        if rc == PCRE2_ERROR_NOMATCH then return nil end
        return nil, nil, exec_error(rc)
    end
    local ov = e.ov
    if ctx then
        ctx.pos = tonumber(ov[1]) + 1
    end
    if not nth or nth < 0 then
        nth = 0
    end
    if nth > e.ncap then
        release(e)
        return nil, nil, "nth out of bound"
    end
    local from, to = -1, -1
    if nth < rc then
        from, to = tonumber(ov[2 * nth]), tonumber(ov[2 * nth + 1])
    end
    release(e)
    if from < 0 or to < 0 then
        return nil, nil
    end
    return from + 1, to
end

-- -- gmatch --------------------------------------------------------------------------

local function gmatch_done(it)
    local e = it.e
    it.e, it.pos, it.subj = nil, nil, nil
    if e then release(e) end
end

local function gmatch_next(it)
    local pos = it.pos
    if not pos then
        return nil
    end
    local e, subj, len = it.e, it.subj, it.len
    local rc = exec(e, subj, len, pos)
    if rc <= 0 then
        gmatch_done(it)
        if rc == PCRE2_ERROR_NOMATCH then return nil end
        return nil, exec_error(rc)
    end
    local ov = e.ov
    local from, to = tonumber(ov[0]), tonumber(ov[1])
    local res = collect(e, rc, subj)
    if to == from then
        to = step(e, subj, len, to)
        if to > len then
            gmatch_done(it)
            return res
        end
    end
    it.pos = to
    return res
end

local gmatch_mt = { __call = gmatch_next }

function _M.gmatch(subj, regex, opts)
    subj = tostring(subj)
    local e, err = compile(regex, opts)
    if not e then
        return nil, err
    end
    return setmetatable({ e = e, subj = subj, len = #subj, pos = 0 }, gmatch_mt)
end

-- -- sub and gsub --------------------------------------------------------------------
-- A template is a list: strings are copied, a number n is group n of the match (empty
-- when the group did not take part), and a table is the groups of a name (the first that
-- matched). nginx's template grammar: $$ is "$", $N and ${N} are group N, and anything
-- else after a "$" fails; moonserve also takes ${name} for a named group.

local function template_digits(s, i, n)
    local v = 0
    while i <= n do
        local c = byte(s, i)
        if c < 48 or c > 57 then break end
        v = v * 10 + c - 48
        i = i + 1
    end
    return v, i
end

local function is_name_byte(c)
    return (c >= 48 and c <= 57) or (c >= 65 and c <= 90) or (c >= 97 and c <= 122) or c == 95
end

-- Returns the parsed template, or nil when nginx would refuse it.
local function parse_template(e, s)
    local t, lit = {}, {}
    local i, n = 1, #s
    local function flush()
        if #lit > 0 then
            t[#t + 1] = table.concat(lit)
            lit = {}
        end
    end
    while i <= n do
        local c = byte(s, i)
        if c ~= 36 then -- "$"
            local j = find(s, "$", i, true) or n + 1
            lit[#lit + 1] = sub(s, i, j - 1)
            i = j
        else
            i = i + 1
            if i > n then return nil end
            c = byte(s, i)
            if c == 36 then
                lit[#lit + 1] = "$"
                i = i + 1
            elseif c >= 48 and c <= 57 then
                flush()
                t[#t + 1], i = template_digits(s, i, n)
            elseif c == 123 then -- "{"
                i = i + 1
                if i > n then return nil end
                c = byte(s, i)
                if c >= 48 and c <= 57 then
                    local v
                    v, i = template_digits(s, i, n)
                    if byte(s, i) ~= 125 then return nil end
                    flush()
                    t[#t + 1] = v
                else
                    local j = i
                    while j <= n and is_name_byte(byte(s, j)) do j = j + 1 end
                    if j == i or byte(s, j) ~= 125 then return nil end
                    local name = sub(s, i, j - 1)
                    local groups = {}
                    local names = e.names
                    if names then
                        for k = 1, #names, 2 do
                            if names[k + 1] == name then groups[#groups + 1] = names[k] end
                        end
                    end
                    if #groups == 0 then return nil end
                    flush()
                    t[#t + 1] = groups
                    i = j
                end
                i = i + 1
            else
                return nil -- $name (named groups take braces) or a lone "$"
            end
        end
    end
    flush()
    return t
end

local function template(e, s)
    local tpls = e.templates
    if tpls then
        local t = tpls[s]
        if t then return t end
    end
    local t = parse_template(e, s)
    if t and e.once then
        if not tpls or e.ntemplates >= TEMPLATES_PER_PATTERN then
            tpls = {}
            e.templates, e.ntemplates = tpls, 0
        end
        tpls[s] = t
        e.ntemplates = e.ntemplates + 1
    end
    return t
end

local function put_group(buf, base, ov, g, rc)
    if g < rc then
        local from = tonumber(ov[2 * g])
        if from >= 0 then
            buf:putcdata(base + from, tonumber(ov[2 * g + 1]) - from)
            return true
        end
    end
    return false
end

local function expand(buf, t, base, ov, rc)
    for k = 1, #t do
        local v = t[k]
        local kind = type(v)
        if kind == "string" then
            buf:put(v)
        elseif kind == "number" then
            put_group(buf, base, ov, v, rc)
        else
            for g = 1, #v do
                if put_group(buf, base, ov, v[g], rc) then break end
            end
        end
    end
end

local tpl_buf = buffer.new()   -- string templates run no Lua of the caller's: one will do

local function substitute(subj, regex, replace, opts, global)
    local func = type(replace) == "function"
    if not func and type(replace) ~= "string" then
        replace = tostring(replace)
    end
    local e, err = compile(regex, opts)
    if not e then
        return nil, nil, err
    end
    local tpl
    if not func then
        tpl = template(e, replace)
        if not tpl then
            release(e)
            return nil, nil, "failed to compile the replacement template"
        end
    end
    subj = tostring(subj)
    local len = #subj
    local base = ffi_cast(char_p, subj)
    -- A replacement function may call sub or gsub itself: it gets a buffer of its own.
    local buf = func and buffer.new() or tpl_buf:reset()
    local count, pos, copied = 0, 0, 0
    while true do
        local rc = exec(e, subj, len, pos)
        if rc <= 0 then
            if rc == PCRE2_ERROR_NOMATCH then break end
            release(e)
            if not func then buf:reset() end
            return nil, nil, exec_error(rc)
        end
        count = count + 1
        local ov = e.ov
        local from, to = tonumber(ov[0]), tonumber(ov[1])
        buf:putcdata(base + copied, from - copied)
        if func then
            buf:put(tostring(replace(collect(e, rc, subj))))
        else
            expand(buf, tpl, base, ov, rc)
        end
        copied, pos = to, to
        if to == from then
            pos = step(e, subj, len, to)
            if pos > len then break end
        end
        if not global then break end
    end
    release(e)
    if count == 0 then
        buf:reset()
        return subj, 0
    end
    buf:putcdata(base + copied, len - copied)
    local out = buf:tostring()
    buf:reset()
    return out, count
end

function _M.sub(subj, regex, replace, opts)
    return substitute(subj, regex, replace, opts, false)
end

function _M.gsub(subj, regex, replace, opts)
    return substitute(subj, regex, replace, opts, true)
end

-- -- split (the ngx.re module) -------------------------------------------------------

local split_ctx = {}

-- One match from ctx.pos (0-based here): the match's 1-based from and to (to one past the
-- end), the first group when it took part in the match, or an error in the fourth place.
local function split_next(e, subj, len, ctx)
    local pos = ctx.pos
    if pos < 0 then pos = 0 end
    local rc = exec(e, subj, len, pos)
    if rc <= 0 then
        if rc == PCRE2_ERROR_NOMATCH then return nil end
        return nil, nil, nil, exec_error(rc)
    end
    local ov = e.ov
    local from, to = tonumber(ov[0]), tonumber(ov[1])
    if from == to then
        ctx.pos = step(e, subj, len, to)
    else
        ctx.pos = to
    end
    if e.ncap > 0 and rc > 1 then
        return from + 1, to + 1, sub(subj, tonumber(ov[2]) + 1, tonumber(ov[3]))
    end
    return from + 1, to + 1
end

function _M.split(subj, regex, opts, ctx, max, res)
    subj = tostring(subj)
    if not ctx then
        ctx = split_ctx
        ctx.pos = 1
    elseif not ctx.pos then
        ctx.pos = 1
    end
    max = max or 0
    if not res then
        res = new_tab((max > 0 and max < 4) and max or 4, 0)
    elseif type(res) ~= "table" then
        error("res is not a table", 2)
    end
    local len = #subj
    if ctx.pos > len then
        res[1] = nil
        return res
    end
    local e, err = compile(regex, opts)
    if not e then
        return nil, err
    end
    local piece_from = ctx.pos  -- 1-based start of the piece being cut
    local n = 0
    local last_empty
    local pieces = 1
    ctx.pos = piece_from - 1
    while max <= 0 or pieces < max do
        local from, to, group, xerr = split_next(e, subj, len, ctx)
        if xerr then
            release(e)
            return nil, xerr
        end
        if not from then break end
        if last_empty then
            piece_from = last_empty
        end
        if from == to then
            last_empty = from
        end
        -- An empty match right where the piece starts cuts nothing.
        if from > piece_from or not last_empty then
            pieces = pieces + 1
            n = n + 1
            res[n] = sub(subj, piece_from, from - 1)
            if group then
                n = n + 1
                res[n] = group
            end
            piece_from = to
            if piece_from > len then break end
        end
    end
    release(e)
    if max <= 0 and piece_from > len then
        -- Without a max, trailing empty pieces are dropped.
        for k = n, 1, -1 do
            if res[k] ~= "" then
                n = k
                break
            end
            res[k] = nil
        end
    else
        n = n + 1
        res[n] = sub(subj, piece_from)
    end
    res[n + 1] = nil
    return res
end

-- -- Settings ------------------------------------------------------------------------

local function set_match_limit(n)
    -- 0 restores PCRE2's default, which pcre2_config reports.
    if n == 0 then
        P.pcre2_config_8(4, u32)   -- PCRE2_CONFIG_MATCHLIMIT
        n = u32[0]
    end
    P.pcre2_set_match_limit_8(mctx, n)
end

-- opt("jit_stack_size", bytes) as in OpenResty. moonserve also takes the two settings
-- nginx.conf holds: opt("match_limit", n) (lua_regex_match_limit; 0 is PCRE2's default)
-- and opt("cache_max_entries", n) (lua_regex_cache_max_entries; 0 turns "o" off).
function _M.opt(option, value)
    if option == "jit_stack_size" then
        if ever_cached then
            error("changing jit stack size is not allowed when some regexs have already "
                .. "been compiled and cached", 2)
        end
        local size = tonumber(value) or 0
        if size < MIN_JIT_STACK then size = MIN_JIT_STACK end
        local stack = P.pcre2_jit_stack_create_8(MIN_JIT_STACK, size, nil)
        if stack == nil then
            error("pcre jit stack allocation failed", 2)
        end
        stack = ffi_gc(stack, P.pcre2_jit_stack_free_8)
        P.pcre2_jit_stack_assign_8(mctx, nil, stack)
        jit_stack = stack
        return
    elseif option == "match_limit" then
        local n = tonumber(value)
        if not n or n < 0 then error("bad match_limit (a number >= 0 expected)", 2) end
        set_match_limit(n)
        return
    elseif option == "cache_max_entries" then
        local n = tonumber(value)
        if not n or n < 0 then error("bad cache_max_entries (a number >= 0 expected)", 2) end
        cache_max = n
        evict_to(n)
        return
    end
    error("unrecognized option name", 2)
end

-- moonserve: the number of patterns cached and the bound.
function _M.cache_size()
    return cached, cache_max
end

-- moonserve: the PCRE2 version string, as ngx_http_lua_ffi_pcre_version gives it.
function _M.pcre_version()
    local buf = ffi.new("char[64]")
    P.pcre2_config_8(PCRE2_CONFIG_VERSION, buf)
    return ffi_string(buf)
end

return _M
