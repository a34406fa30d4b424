--- moonserve/config.lua: the environment's settings (moonserve.config) and secrets
-- (moonserve.secret): a configuration file per environment beside the app, overlaid by
-- environment variables, read once by the master and handed to its workers.
-- `require("moonserve.config").get()` is `moonserve.config`, as lapis' `config.get()`.
-- @module moonserve.config
local ffi = require "ffi"
local bit = require "bit"
local host = require "moonserve.host"

local type, pairs, tostring, format = type, pairs, tostring, string.format

local _M = {}

-- The environments an app has when it has no configuration file.
local DEFAULT_ENVS = { development = true, test = true, production = true }

-- The least a secret may hold, in bytes: what an HMAC-SHA256 key for sessions and CSRF
-- tokens needs (RFC 2104 section 3: a key shorter than the hash's output weakens it).
_M.MIN_BYTES = 32

-- Variables of the process's own environment, set by the login or the shell, which are never
-- read as settings: a setting named `user` or `path` would otherwise change with who runs it.
local NOT_SETTINGS = { HOME = true, PATH = true, USER = true, LOGNAME = true, SHELL = true,
    PWD = true, OLDPWD = true, TERM = true, LANG = true, TMPDIR = true, HOSTNAME = true,
    SHLVL = true, MAIL = true, ["_"] = true }

-- What setup() was given (the command line's --config and --env, the app's path), and the
-- state read from it: nil until the first use.
local given = {}
local state

--- Where the configuration comes from, before its first use: `file` (a path; default
-- config.lua beside `app`), `env` (the environment's name; default MOONSERVE_ENV, else
-- "development"), `app` (the app file's path). Drops what was read, so the next use reads
-- again. The `moonserve` command calls it with --config, --env and the app file.
function _M.setup(opts)
    if opts ~= nil and type(opts) ~= "table" then
        error("bad options (table expected)", 2)
    end
    given = opts or {}
    state = nil
end

local function getenv(name)
    local v = os.getenv(name)
    if v == "" then
        return nil
    end
    return v
end

-- The configuration file: given, named by MOONSERVE_CONFIG, or config.lua beside the app
-- (the app given, or the script this process runs when it is a .lua file). Returns the path
-- and whether it was named (a named file must exist).
local function config_path()
    if given.file then
        return given.file, true
    end
    local named = getenv("MOONSERVE_CONFIG")
    if named then
        return named, true
    end
    local app = given.app
    if not app and type(arg) == "table" and type(arg[0]) == "string"
            and arg[0]:match("%.lua$") then
        app = arg[0]
    end
    if not app then
        return nil
    end
    local path = (app:match("^(.*/)[^/]*$") or "") .. "config.lua"
    -- (An app beside this module, the installed demo, is not configured by it.)
    if path == package.searchpath("moonserve.config", package.path) then
        return nil
    end
    return path, false
end

-- Whether `t` holds only what can be handed to a worker: strings, numbers, booleans and
-- tables of those, with string or number keys. Raises naming the first that is not.
local function check_plain(t, where, seen)
    seen = seen or {}
    if seen[t] then
        error(where .. " appears twice (settings are a tree, not a graph)", 0)
    end
    seen[t] = true
    for k, v in pairs(t) do
        local kt = type(k)
        if kt ~= "string" and kt ~= "number" then
            error(where .. " has a " .. kt .. " key (string or number keys expected)", 0)
        end
        local name = where .. "." .. tostring(k)
        local vt = type(v)
        if vt == "table" then
            check_plain(v, name, seen)
        elseif vt ~= "string" and vt ~= "number" and vt ~= "boolean" then
            error(name .. " is a " .. vt .. " (settings are strings, numbers, booleans and "
                .. "tables of those)", 0)
        end
    end
end

local function copy(t)
    local out = {}
    for k, v in pairs(t) do
        out[k] = type(v) == "table" and copy(v) or v
    end
    return out
end

-- `over` merged into `base` (a copy): tables key by key, anything else replaced.
local function merge(base, over)
    local out = copy(base)
    for k, v in pairs(over) do
        if type(v) == "table" and type(out[k]) == "table" then
            out[k] = merge(out[k], v)
        else
            out[k] = type(v) == "table" and copy(v) or v
        end
    end
    return out
end

-- Reads the file at `path`: a Lua chunk returning { common = {...}, NAME = {...}, ... }.
-- Returns the table of environments, or raises with a sentence naming the file.
local function read_file(path)
    local chunk, err = loadfile(path)
    if not chunk then
        error("cannot read the configuration: " .. err, 0)
    end
    local ok, envs = pcall(chunk)
    if not ok then
        error("the configuration " .. path .. " failed: " .. tostring(envs), 0)
    end
    if type(envs) ~= "table" then
        error("the configuration " .. path .. " must return a table: { common = { ... }, "
            .. "development = { ... }, production = { ... } }", 0)
    end
    for name, t in pairs(envs) do
        if type(name) ~= "string" or not name:match("^[%w_%-]+$") or type(t) ~= "table" then
            error("the configuration " .. path .. ": " .. tostring(name) .. " is not an "
                .. "environment (each key names one, or is common, and holds a table)", 0)
        end
        check_plain(t, path .. ": " .. name)
    end
    return envs
end

-- The names of `envs` besides common, sorted, for a message.
local function names_of(envs)
    local list = {}
    for name in pairs(envs) do
        if name ~= "common" then
            list[#list + 1] = name
        end
    end
    table.sort(list)
    return table.concat(list, ", ")
end

-- A setting's text from the environment read as its declared value's type: a number stays a
-- number, a boolean a boolean. Returns the value, or nil and what was expected.
local TRUE = { ["true"] = true, ["1"] = true, yes = true, on = true }
local FALSE = { ["false"] = true, ["0"] = true, no = true, off = true }
function _M.typed(text, declared)
    local t = type(declared)
    if t == "number" then
        local n = tonumber(text)
        if not n then
            return nil, "a number expected"
        end
        return n
    elseif t == "boolean" then
        local l = text:lower()
        if TRUE[l] then
            return true
        elseif FALSE[l] then
            return false
        end
        return nil, "true or false (1, 0, yes, no, on, off) expected"
    end
    return text
end

--- The variable that sets a setting, from its path: { "database_url" } -> DATABASE_URL,
-- { "redis", "pool_size" } -> REDIS__POOL_SIZE; nil for a path it cannot name.
function _M.variable(path)
    local parts = {}
    for i, k in ipairs(path) do
        if type(k) ~= "string" or not k:match("^[%a_][%w_]*$") then
            return nil
        end
        parts[i] = k:upper()
    end
    local name = table.concat(parts, "__")
    if NOT_SETTINGS[name] then
        return nil
    end
    return name
end

-- Sets every declared setting of `t` whose variable is in the environment, typed as
-- declared; `from` gets the variables used. Raises on a value of the wrong type.
local function overlay(t, path, from)
    for k, v in pairs(t) do
        path[#path + 1] = k
        if type(v) == "table" then
            overlay(v, path, from)
        else
            local var = _M.variable(path)
            local text = var and getenv(var)
            if text then
                local value, expected = _M.typed(text, v)
                if value == nil then
                    error(format("%s: %s (the setting %s is a %s)", var, expected,
                        table.concat(path, "."), type(v)), 0)
                end
                t[k] = value
                from[#from + 1] = var
            end
        end
        path[#path] = nil
    end
end

-- Reads the settings of the environment `env` from the file (if any) and the variables.
-- Returns settings, the file's path (or nil), the variables used.
local function read_settings(env)
    local path, named = config_path()
    local envs
    if path then
        local f = io.open(path, "rb")
        if f then
            f:close()
            envs = read_file(path)
        elseif named then
            error("cannot read the configuration " .. path .. ": no such file", 0)
        else
            path = nil
        end
    end
    if envs then
        if env ~= "development" and envs[env] == nil then
            local names = names_of(envs)
            error(format("unknown environment %q: %s has %s", env, path,
                names ~= "" and names .. " (and development)" or "development alone"), 0)
        end
    elseif not DEFAULT_ENVS[env] then
        error(format("unknown environment %q (no configuration file: development, test or "
            .. "production)", env), 0)
    end
    envs = envs or {}
    local settings = merge(envs.common or {}, envs[env] or {})
    local from = {}
    overlay(settings, {}, from)
    table.sort(from)
    return settings, path, from
end

-- -- Secrets ---------------------------------------------------------------------------

-- Files are read with the C library's calls, so that the mode checked is the one of the file
-- read (fstat of the open descriptor, not a path that may change between the two).
if not pcall(ffi.typeof, "struct ms_statx") then
    ffi.cdef [[
    struct ms_statx {
        uint32_t stx_mask, stx_blksize;
        uint64_t stx_attributes;
        uint32_t stx_nlink, stx_uid, stx_gid;
        uint16_t stx_mode, spare0;
        uint64_t rest[29];
    };
    int statx(int dirfd, const char *path, int flags, unsigned int mask, struct ms_statx *buf);
    int open(const char *path, int flags, ...);
    long read(int fd, void *buf, size_t n);
    int close(int fd);
    char *strerror(int errnum);
    ]]
end
local O_RDONLY, O_CLOEXEC = 0, 0x80000
local AT_EMPTY_PATH, STATX_MODE = 0x1000, 0x2
local S_IFMT, S_IFREG = 0xF000, 0x8000
local SECRET_MAX = 64 * 1024

-- The bytes of the secret file at `path`: the bytes, or nil when there is none, or raises
-- for one that is there but may not serve (readable by others, not a file, unreadable).
local function read_secret_file(name, path)
    local C = ffi.C
    local fd = C.open(path, O_RDONLY + O_CLOEXEC)
    if fd < 0 then
        local errno = ffi.errno()
        if errno == 2 or errno == 20 then -- ENOENT, ENOTDIR: not there
            return nil
        end
        error(format("secret %q: cannot open %s: %s", name, path, ffi.string(C.strerror(errno))),
            0)
    end
    local st = ffi.new("struct ms_statx")
    if C.statx(fd, "", AT_EMPTY_PATH, STATX_MODE, st) < 0 then
        local errno = ffi.errno()
        C.close(fd)
        error(format("secret %q: cannot stat %s: %s", name, path, ffi.string(C.strerror(errno))),
            0)
    end
    local mode = st.stx_mode
    if bit.band(mode, S_IFMT) ~= S_IFREG then
        C.close(fd)
        error(format("secret %q: %s is not a regular file", name, path), 0)
    end
    if bit.band(mode, 63) ~= 0 then -- 077: group and others
        C.close(fd)
        error(format("secret %q: %s may be read by others (mode %04o): it is refused, as ssh "
            .. "refuses such a key; chmod 600 it (or 400)", name, path, bit.band(mode, 4095)), 0)
    end
    local buf = ffi.new("char[?]", SECRET_MAX + 1)
    local total = 0
    local n = tonumber(C.read(fd, buf, SECRET_MAX + 1))
    while n > 0 and total + n <= SECRET_MAX do
        total = total + n
        n = tonumber(C.read(fd, buf + total, SECRET_MAX + 1 - total))
    end
    if n > 0 then
        total = total + n
    end
    local errno = ffi.errno()
    C.close(fd)
    if n < 0 then
        error(format("secret %q: cannot read %s: %s", name, path, ffi.string(C.strerror(errno))),
            0)
    elseif total > SECRET_MAX then
        error(format("secret %q: %s is over %d bytes", name, path, SECRET_MAX), 0)
    end
    -- (One newline at the end is dropped: `echo x > file` writes one.)
    local bytes = ffi.string(buf, total)
    return (bytes:gsub("\r?\n$", ""))
end

--- The variable a secret may come from: MOONSERVE_SECRET_ and its name in upper case, every
-- byte but letters and digits as `_` (session -> MOONSERVE_SECRET_SESSION).
function _M.secret_variable(name)
    return "MOONSERVE_SECRET_" .. name:upper():gsub("[^%w]", "_")
end

-- A development secret: `n` bytes from HMAC-SHA256 of the process tree's seed, so every
-- worker derives the same bytes for a name, even one first asked for in a worker.
local function derived(seed, name, n)
    local crypto = require "moonserve.crypto"
    local out, i = {}, 0
    local len = 0
    while len < n do
        i = i + 1
        out[i] = assert(crypto.hmac_sha256(seed, "moonserve secret " .. name .. " " .. i))
        len = len + 32
    end
    return table.concat(out):sub(1, n)
end

-- Finds the secret `name` in `st`'s sources. Returns the bytes and where they came from,
-- or raises naming every place it looked.
local function resolve(st, name, min_bytes)
    local looked = {}
    local dir = st.settings.secrets_dir
    if dir ~= nil and type(dir) ~= "string" then
        error("bad secrets_dir setting (a directory's path expected)", 0)
    end
    local places = { { dir, "secrets_dir", "no secrets_dir setting" },
        { getenv("CREDENTIALS_DIRECTORY"), "$CREDENTIALS_DIRECTORY",
            "no $CREDENTIALS_DIRECTORY" } }
    for _, p in ipairs(places) do
        if p[1] then
            local path = p[1]:gsub("/$", "") .. "/" .. name
            local bytes = read_secret_file(name, path)
            if bytes then
                return bytes, "the file " .. path
            end
            looked[#looked + 1] = "no file " .. path .. " (" .. p[2] .. ")"
        else
            looked[#looked + 1] = p[3]
        end
    end
    local var = _M.secret_variable(name)
    local bytes = getenv(var)
    if bytes then
        return bytes, "the variable " .. var
    end
    looked[#looked + 1] = "no variable " .. var
    if st.env == "development" then
        return derived(st.seed, name, min_bytes), "drawn at random, in development"
    end
    error(format("secret %q not found in the %s environment: %s (only development draws one "
        .. "at random)", name, st.env, table.concat(looked, ", ")), 0)
end

-- The secret `name` from `st`, resolved now if it was not, held to `min_bytes`.
local function secret_of(st, name, min_bytes)
    local bytes, origin = st.secrets[name], st.origins[name]
    if bytes == nil then
        bytes, origin = resolve(st, name, min_bytes)
        st.secrets[name], st.origins[name] = bytes, origin
    end
    if #bytes < min_bytes then
        error(format("secret %q from %s is %d bytes; at least %d expected", name, origin, #bytes,
            min_bytes), 0)
    end
    st.asked[name] = math.max(st.asked[name] or 0, min_bytes)
    return bytes
end

-- -- State -------------------------------------------------------------------------------

local buffer = require "string.buffer"

-- A fresh state read in this process: the environment's name, its settings, no secrets yet,
-- and the seed of development secrets (drawn here, or kept from `seed`).
local function read_state(env, seed)
    local settings, path, from = read_settings(env)
    if not seed then
        seed = assert(require("moonserve.crypto").random(32))
    end
    return { env = env, settings = settings, file = path, from = from, seed = seed,
        secrets = {}, origins = {}, asked = {} }
end

-- The state this process runs with: inherited from its master when it has one (the host's
-- config module), else read here.
local function current()
    if state then
        return state
    end
    local inherited = host.module("config").inherited()
    if inherited then
        return _M.adopt(inherited)
    end
    local env = given.env or getenv("MOONSERVE_ENV") or "development"
    if type(env) ~= "string" or not env:match("^[%w_%-]+$") then
        error("bad environment name " .. tostring(env), 0)
    end
    state = read_state(env)
    return state
end

--- Takes `bytes`, a snapshot, as this process's configuration: what a worker does with its
-- master's. Returns the state.
function _M.adopt(bytes)
    state = buffer.decode(bytes)
    return state
end

--- The settings of the environment this process runs in (moonserve.config): a table; a key
-- the configuration does not declare is nil.
function _M.get()
    return current().settings
end

--- The environment's name ("development" unless --env or MOONSERVE_ENV say otherwise).
function _M.env()
    return current().env
end

--- The secret `name`'s bytes (moonserve.secret): from the file `name` in the secrets_dir
-- setting's directory, then in systemd's $CREDENTIALS_DIRECTORY (LoadCredential=), then the
-- variable MOONSERVE_SECRET_<NAME>; in development only, drawn at random once for the whole
-- server (every worker, and the workers after a reload, get the same bytes). Raises when
-- there is none, or it holds fewer than opts.min_bytes bytes (default 32), never showing it.
-- @usage app:use(moonserve.sessions{ secret = moonserve.secret("session") })
function _M.secret(name, opts)
    if type(name) ~= "string" or not name:match("^[%w][%w_.%-]*$") then
        error("bad secret name (letters, digits, _ . - expected)", 2)
    end
    if opts ~= nil and type(opts) ~= "table" then
        error("bad options (table expected)", 2)
    end
    local min = opts and opts.min_bytes or _M.MIN_BYTES
    if type(min) ~= "number" or min < 1 or min % 1 ~= 0 then
        error("bad min_bytes (a whole number above 0 expected)", 2)
    end
    local ok, bytes = pcall(secret_of, current(), name, min)
    if not ok then
        error(bytes, 2)
    end
    return bytes
end

--- What a worker is handed: the state as bytes (string.buffer's encoding), its secrets too.
function _M.snapshot()
    return buffer.encode(current())
end

--- Reads the configuration again, as a reload does (the master, on SIGHUP): the same
-- environment, the file and variables as they are now, every secret asked for so far
-- resolved again, the development seed kept. Returns the new snapshot, or nil and why (and
-- the state stays as it was).
function _M.reload()
    local old = current()
    local ok, st = pcall(read_state, old.env, old.seed)
    if ok then
        for name, min in pairs(old.asked) do
            local found, err = pcall(secret_of, st, name, min)
            if not found then
                return nil, err
            end
        end
        state = st
        return buffer.encode(st)
    end
    return nil, st
end

--- For --check and the start's log line: the environment, the file, the variables that set
-- settings, and each secret with where it came from (never its bytes).
function _M.describe()
    local st = current()
    local secrets = {}
    for name, origin in pairs(st.origins) do
        secrets[#secrets + 1] = name .. " (" .. origin .. ")"
    end
    table.sort(secrets)
    return { env = st.env, file = st.file, from = st.from, secrets = secrets }
end

--- For tests: forget what was read and given.
function _M.reset()
    given, state = {}, nil
end

return _M
