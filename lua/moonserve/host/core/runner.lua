-- moonserve/host/core/runner.lua: running a server in this process: the core server with the
-- dispatcher (moonserve/host/core/dispatcher.lua) as its Lua side, listeners, worker processes under
-- a master, and the run loop.
local ffi = require "ffi"
local base = require "moonserve.host.core.base"
local dispatcher = require "moonserve.host.core.dispatcher"

local core = base.core
local format, type = string.format, type

local _M = {}

-- The dispatcher's, as they were here before it had a module of its own.
_M.sleep, _M.exit = dispatcher.sleep, dispatcher.exit

-- A request's trace (the dispatcher, the framework, the handler, and the ngx layer or a
-- socket's calls) holds more constants than LuaJIT's default limit of 500 (maxirconst): past
-- it the trace aborts ("trace too long") and the request runs in the interpreter, some 40%
-- more instructions. Raised once, where a server is made (not inside nginx).
local jit_tuned = false
local function tune_jit()
    if not jit_tuned then
        jit_tuned = true
        jit.opt.start("maxirconst=1000")
    end
end

-- Makes the core server for `the_app` in this process.
function _M.create(the_app, limits)
    tune_jit()
    local on_request, on_resume, on_event = dispatcher.serve(the_app)
    local srv = core.server { on_request = on_request, on_resume = on_resume,
        on_event = on_event, limits = limits }
    dispatcher.attach(srv, limits)
    -- The app's static mounts, served by the core from here on.
    if type(the_app.static_mounts) == "function" then
        for _, m in ipairs(the_app:static_mounts()) do
            local id, err = srv:static(m.prefix == "" and "/" or m.prefix, m.dir, m.opts)
            if not id then
                error("cannot serve " .. m.dir .. " at " .. m.prefix .. "/: " .. err, 4)
            end
            m.mount.id = id
        end
    end
    -- The app's bodies for the core's refusals, which the core answers without Lua.
    if type(the_app.refusal_bodies_of) == "function" then
        for status, set in pairs(the_app:refusal_bodies_of()) do
            for kind, body in pairs(set) do
                local ok, err = srv:refusal_body(status, kind, body)
                if not ok then
                    error("bad refusal body for " .. status .. " (" .. kind .. "): " .. err, 4)
                end
            end
        end
    end
    return srv
end

-- The limits for the core, which checks keys and values. A route may allow a larger body
-- than body_bytes; the core then lets declared lengths up to the largest through to the
-- router, which holds each request to its route's limit.
local function parse_limits(t, the_app)
    if t ~= nil and type(t) ~= "table" then
        error("bad limits (table expected)", 3)
    end
    local limits = {}
    for k, v in pairs(t or {}) do
        limits[k] = v
    end
    if type(the_app.max_body_bytes) == "function" and limits.body_bytes_max == nil then
        local default = limits.body_bytes or core.default_limits().body_bytes
        local max = the_app:max_body_bytes(default)
        if max > default then
            limits.body_bytes_max = max
        end
    end
    return limits
end
_M.parse_limits = parse_limits -- (an app served in-process: moonserve/host/core/inprocess.lua)

-- The command line that started this program, to start workers with: the interpreter
-- and its options (arg's negative indexes), the script, its arguments.
local function command_line()
    if type(arg) ~= "table" or arg[0] == nil then
        error("workers > 0 need the program's command line (run the app with luajit or "
            .. "moonserve), or use workers = 0", 3)
    end
    local lo = 0
    while arg[lo - 1] ~= nil do
        lo = lo - 1
    end
    local argv = {}
    for i = lo, #arg do
        argv[#argv + 1] = arg[i]
    end
    return argv
end

-- A listener's or a site's tls table, checked: cert and key (paths, or lists of paths of the
-- same length: an RSA and an ECDSA certificate side by side), ocsp (the path of an OCSP
-- response to staple, or a list of them beside cert, false for none), ciphers,
-- ciphersuites, groups, unknown_name ("default" or "refuse"), ktls (false: no kernel TLS on
-- this listener where the kernel offers it). Returns the list of
-- { cert, key, ocsp } pairs.
local function tls_pairs(t, what, level)
    if type(t) ~= "table" then
        error("bad " .. what .. " (a table with cert and key expected)", level + 1)
    end
    local certs = type(t.cert) == "table" and t.cert or { t.cert }
    local keys = type(t.key) == "table" and t.key or { t.key }
    if #certs == 0 or #certs ~= #keys then
        error("bad " .. what .. " (as many keys as certificates expected)", level + 1)
    end
    local ocsp = type(t.ocsp) == "table" and t.ocsp or { t.ocsp }
    local out = {}
    for i = 1, #certs do
        if type(certs[i]) ~= "string" or type(keys[i]) ~= "string" then
            error("bad " .. what .. " (cert and key paths expected)", level + 1)
        end
        if ocsp[i] and type(ocsp[i]) ~= "string" then
            error("bad " .. what .. ".ocsp (the path of an OCSP response expected)", level + 1)
        end
        out[i] = { cert = certs[i], key = keys[i], ocsp = ocsp[i] or nil }
    end
    if t.unknown_name ~= nil and t.unknown_name ~= "default" and t.unknown_name ~= "refuse" then
        error("bad " .. what .. ".unknown_name (\"default\" or \"refuse\" expected)", level + 1)
    end
    if t.ktls ~= nil and type(t.ktls) ~= "boolean" then
        error("bad " .. what .. ".ktls (a boolean expected)", level + 1)
    end
    return out
end
_M.tls_pairs = tls_pairs

-- Listeners as { addr = "HOST:PORT", proxy_protocol = bool, tls = table or nil,
-- redirect_https = port or nil }, from "HOST:PORT", a table { "HOST:PORT", proxy_protocol =
-- true, tls = { cert =, key = } } ({ "HOST:PORT", redirect_https = 443 }: a plain listener
-- that answers every request with a redirect to https on that port), or a list of those.
local function listen_list(listen)
    if listen == nil then
        listen = "127.0.0.1:8080"
    end
    if type(listen) == "string" or (type(listen) == "table" and type(listen[1]) == "string"
            and (listen.proxy_protocol ~= nil or listen.tls ~= nil
                or listen.redirect_https ~= nil)) then
        listen = { listen }
    end
    if type(listen) ~= "table" or #listen == 0 then
        error("bad listen (\"HOST:PORT\" or a list of them expected)", 3)
    end
    local out = {}
    for i, l in ipairs(listen) do
        if type(l) == "string" then
            out[i] = { addr = l, proxy_protocol = false }
        elseif type(l) == "table" and type(l[1]) == "string" then
            out[i] = { addr = l[1], proxy_protocol = l.proxy_protocol == true, tls = l.tls,
                redirect_https = l.redirect_https }
            local r = l.redirect_https
            if r ~= nil and (type(r) ~= "number" or r % 1 ~= 0 or r < 1 or r > 65535
                    or l.tls ~= nil) then
                error("bad redirect_https of listen entry " .. i .. " (the https port of a "
                    .. "plain listener expected)", 3)
            end
            if l.tls ~= nil then
                tls_pairs(l.tls, "tls of listen entry " .. i, 3)
                if l.proxy_protocol then
                    error("listen entry " .. i .. ": proxy_protocol with tls is not supported", 3)
                end
            end
        else
            error("bad listen entry " .. i, 3)
        end
    end
    return out
end

-- The PEM bytes of a certificate chain and of its private key, and the DER bytes of an OCSP
-- response when `ocsp_path` is given. Every certificate the server loads is read here, and
-- nowhere else: a worker under a master has the master open the files (core.master_file: its
-- channel), so that a key only the master's user may read serves; a single process reads
-- them itself. A reload reads them anew.
function _M.tls_material(cert_path, key_path, ocsp_path)
    local function slurp(path, what)
        if os.getenv("MOONSERVE_WORKER") then
            local text, err = core.master_file(path)
            if not text then
                return nil, "cannot read the TLS " .. what .. ": " .. err
            end
            return text
        end
        local f, err = io.open(path, "rb")
        if not f then
            return nil, "cannot read the TLS " .. what .. ": " .. err
        end
        local text = f:read("*a")
        f:close()
        return text
    end
    local cert, err = slurp(cert_path, "certificate")
    if not cert then
        return nil, err
    end
    local key
    key, err = slurp(key_path, "key")
    if not key then
        return nil, err
    end
    local ocsp
    if ocsp_path then
        ocsp, err = slurp(ocsp_path, "OCSP response")
        if not ocsp then
            return nil, err
        end
    end
    return cert, key, ocsp
end

local function add_certs(srv, id, name, t)
    for _, p in ipairs(tls_pairs(t, "tls", 4)) do
        local cert, key, ocsp = _M.tls_material(p.cert, p.key, p.ocsp)
        if not cert then
            error(key, 0)
        end
        local ok, err = srv:tls_cert(id, name, cert, key)
        if not ok then
            error("cannot use the TLS certificate " .. p.cert .. " with the key " .. p.key
                .. (name and " for " .. name or "") .. ": " .. err, 0)
        end
        if ocsp then
            ok, err = srv:tls_staple(id, cert, ocsp)
            if not ok then
                error("cannot staple the OCSP response " .. p.ocsp .. " to " .. p.cert .. ": "
                    .. err, 0)
            end
        end
    end
end

-- The TLS settings of a listener in this process's server: its certificates are the default
-- ones, and each site's own (app:site(host, { tls = ... })) answer for its name (SNI).
local function make_tls(srv, the_app, t)
    local id, err = srv:tls { ciphers = t.ciphers, ciphersuites = t.ciphersuites,
        groups = t.groups, refuse_unknown = t.unknown_name == "refuse", no_ktls = t.ktls == false }
    if not id then
        error("bad tls settings: " .. err, 0)
    end
    add_certs(srv, id, nil, t)
    local hook = type(the_app) == "table" and rawget(the_app, "ssl_certificate_hook")
    if hook then
        srv:tls_hook(id, require("moonserve.host.core.tls_hook").slot(srv, hook))
    end
    for host, site in pairs(type(the_app) == "table" and rawget(the_app, "sites") or {}) do
        local st = rawget(site, "tls")
        if st then
            add_certs(srv, id, host, st)
        end
    end
    return id
end

-- The TLS settings of each TLS listener, by index in `listen`. Under a master, session tickets are encrypted with
-- the master's keys, which every worker shares (so a session resumes on any of them, and
-- after a reload); a single process makes its own.
local function tls_ids(srv, the_app, listen, opts)
    local ids = {}
    for i, l in ipairs(listen) do
        if l.tls and not next(ids) then
            if os.getenv("MOONSERVE_WORKER") then
                local ok, err = core.master_tickets()
                if not ok then
                    error(err, 4)
                end
            elseif opts.tls_ticket_rotate then
                core.tls_ticket_rotate(opts.tls_ticket_rotate)
            end
        end
        if l.tls then
            ids[i] = make_tls(srv, the_app, l.tls)
        end
    end
    return ids
end

-- The line a start logs about kernel TLS, and --check prints: whether the kernel encrypts
-- for the TLS listeners (core.tls_kernel: tried once per process, and not at all when every
-- listener has it off), or nil for none.
function _M.kernel_tls(listen)
    local on, off = 0, {}
    for _, l in ipairs(listen) do
        if l.tls and l.tls.ktls == false then
            off[#off + 1] = l.addr
        elseif l.tls then
            on = on + 1
        end
    end
    if on + #off == 0 then
        return nil
    elseif on == 0 then
        return "kernel TLS: off (tls.ktls = false); TLS records are written by moonserve"
    end
    local offered, why = core.tls_kernel()
    if not offered then
        return "kernel TLS: " .. why .. "; TLS records are written by moonserve"
    end
    return "kernel TLS: on: the kernel encrypts TLS records once a handshake is done, and "
        .. "static files go out with sendfile" .. (#off > 0 and " (off on " .. table.concat(off, ", ")
        .. ": tls.ktls = false)" or "")
end

local function addresses(listen)
    local t = {}
    for i, l in ipairs(listen) do
        t[i] = l.addr
    end
    return t
end

-- -- The environment ---------------------------------------------------------------
-- Each setting an operator may give in the environment: the variable, the key of app:run{}
-- it sets, and its reading (the value, or nil and what is accepted). The precedence, one
-- rule for every key: a command-line flag, then the environment, then app:run{}'s table,
-- then the default. A variable set to "" counts as not set.

local function listen_address(s)
    local port = s:match("^%[?[%w%.:]*%]?:(%d+)$")
    return port and tonumber(port) <= 65535
end

local function env_listen(v)
    local list = {}
    for addr in v:gmatch("[^,%s]+") do
        if not listen_address(addr) then
            return nil, "HOST:PORT, or several separated by commas, expected"
        end
        list[#list + 1] = addr
    end
    if #list == 0 then
        return nil, "HOST:PORT, or several separated by commas, expected"
    end
    return list
end

local function env_port(v)
    local port = tonumber(v:match("^%d+$"))
    if not port or port > 65535 then
        return nil, "a port number, 0 to 65535, expected"
    end
    local host = os.getenv("MOONSERVE_HOST")
    if host == nil or host == "" then
        host = "0.0.0.0"
    elseif not listen_address(host .. ":0") then
        return nil, "MOONSERVE_HOST: an address expected"
    end
    return { host .. ":" .. port }
end

local function env_whole(v)
    local n = tonumber(v:match("^%d+$"))
    if not n then
        return nil, "a whole number expected: 0 for a single process, N for N workers"
    end
    return n
end

local function env_seconds(v)
    local n = tonumber(v)
    if not n or n <= 0 then
        return nil, "seconds, above 0, expected"
    end
    return n
end

local function env_delay(v)
    local n = tonumber(v)
    if not n or n < 0 then
        return nil, "seconds, 0 or more, expected"
    end
    return n
end

local function env_addr(v)
    if not v:match("^%[?[%w%.:]*%]?:%d+$") then
        return nil, "HOST:PORT expected"
    end
    return v
end

local function env_one_of(...)
    local set, names = {}, { ... }
    for _, s in ipairs(names) do
        set[s] = true
    end
    local accepted = table.concat(names, ", ", 1, #names - 1) .. " or " .. names[#names]
    return function(v)
        if set[v] then
            return v
        end
        return nil, accepted
    end
end

local function env_path(v)
    if v:sub(1, 1) ~= "/" then
        return nil, "a path starting with / expected"
    end
    return v
end

local function env_string(v)
    return v
end

-- (MOONSERVE_LISTEN before PORT: when both are set, PORT is not read.)
local ENV = {
    { "MOONSERVE_LISTEN", "listen", env_listen },
    { "PORT", "listen", env_port },
    { "MOONSERVE_WORKERS", "workers", env_whole },
    { "MOONSERVE_LOG", "log", env_string },
    { "MOONSERVE_LOG_LEVEL", "log_level", env_one_of("debug", "info", "warn", "error") },
    { "MOONSERVE_LOG_FORMAT", "log_format", env_one_of("text", "json") },
    { "MOONSERVE_ACCESS_LOG", "access_log", env_string },
    { "MOONSERVE_ACCESS_LOG_FORMAT", "access_log_format", env_string },
    { "MOONSERVE_LIVEZ", "livez", env_path },
    { "MOONSERVE_READYZ", "readyz", env_path },
    { "MOONSERVE_STOP_TIMEOUT", "stop_timeout", env_seconds },
    { "MOONSERVE_DRAIN_DELAY", "drain_delay", env_delay },
    { "MOONSERVE_AGENT_CHECK", "agent_check", env_addr },
    { "MOONSERVE_START_TIMEOUT", "start_timeout", env_seconds },
    { "MOONSERVE_USER", "user", env_string },
    { "MOONSERVE_GROUP", "group", env_string },
    { "MOONSERVE_PID_FILE", "pid_file", env_string },
}
_M.ENV = ENV

-- The keys of an options table its command line set (given[opts][key]), which the
-- environment does not override; and where each key of a merged table came from.
local given = setmetatable({}, { __mode = "k" })
local origin = setmetatable({}, { __mode = "k" })

-- Marks the keys of `opts` that the command line gave (a set): moonserve's CLI calls this,
-- so that a flag wins over the environment.
function _M.given(opts, keys)
    given[opts] = keys
    return opts
end

-- `key`, and the variable it came from when the environment gave it: for messages.
local function label(opts, key)
    local var = origin[opts] and origin[opts][key]
    return var and key .. " (from " .. var .. ")" or key
end

-- opts with the environment's settings over app:run{}'s and under the command line's, as
-- a new table; a variable whose value is not accepted stops here, naming it.
local function environment(opts)
    if type(opts) ~= "table" then
        return opts
    end
    local flags = given[opts] or {}
    local out, from = {}, {}
    for k, v in pairs(opts) do
        out[k] = v
    end
    for _, e in ipairs(ENV) do
        local name, key, read = e[1], e[2], e[3]
        local v = os.getenv(name)
        if v ~= nil and v ~= "" and not flags[key] and not from[key] then
            local value, accepted = read(v)
            if value == nil then
                error(format("bad environment variable %s=%q (%s)", name, v, accepted), 0)
            end
            out[key], from[key] = value, name
        end
    end
    origin[out] = from
    return out
end

-- The variables that gave settings, in ENV's order, as "NAME=value, ...", or nil.
local function from_environment(opts)
    local from, list = origin[opts] or {}, {}
    for _, e in ipairs(ENV) do
        if from[e[2]] == e[1] then
            list[#list + 1] = e[1] .. "=" .. os.getenv(e[1])
        end
    end
    return #list > 0 and table.concat(list, ", ") or nil
end

-- An access log of the core's for `spec`: a path, or { path = FILE or "-", format = ... }.
local function add_log(srv, spec, fmt, what)
    if type(spec) == "string" then
        spec = { path = spec }
    end
    if type(spec) ~= "table" or type(spec.path) ~= "string" then
        error("bad " .. what .. " (a path or { path = ..., format = ... } expected)", 4)
    end
    local id, err = srv:access_log(spec.path, spec.format or fmt)
    if not id then
        error("bad " .. what .. " " .. spec.path .. ": " .. err, 4)
    end
    return id
end

-- The access logs: opts.access_log (every request's, static files' too) and the sites' own
-- (site opts.access_log: a file of their own, or false for none). The framework tells the
-- core which site and route took each request (App:handle, access_tags).
local function access_logs(srv, the_app, opts)
    local any = false
    if opts.access_log then
        local what = label(opts, "access_log")
        if opts.access_log_format and label(opts, "access_log_format") ~= "access_log_format" then
            what = what .. " with " .. label(opts, "access_log_format")
        end
        srv:access_default(add_log(srv, opts.access_log, opts.access_log_format, what))
        any = true
    end
    for host, site in pairs(type(the_app) == "table" and rawget(the_app, "sites") or {}) do
        local spec = rawget(site, "access_log")
        if spec == false then
            site.access_log_id = -1
        elseif spec then
            site.access_log_id = add_log(srv, spec, nil, "access_log of site " .. host)
            any = true
        end
    end
    if any and type(the_app) == "table" then
        the_app.access_tags = true
    end
    for _, key in ipairs({ "livez", "readyz" }) do
        local path = opts[key]
        if path ~= nil and (type(path) ~= "string" or path:sub(1, 1) ~= "/") then
            error("bad " .. key .. " (a path starting with / expected)", 3)
        end
    end
    if opts.livez or opts.readyz then
        srv:health(opts.livez, opts.readyz)
    end
    srv:drain_delay(_M.drain_delay(opts))
    if opts.request_id_header then
        srv:request_id_header(true)
    end
end

local LEVELS = { error = 0, warn = 1, info = 2, debug = 3 }

-- opts.log_level ("debug", "info", "warn", "error") and opts.log_format ("text", "json").
local function log_options(opts)
    local level = opts.log_level
    if level ~= nil then
        if LEVELS[level] == nil then
            error("bad log_level " .. tostring(level) .. " (debug, info, warn or error)", 3)
        end
        core.log_level(LEVELS[level])
    end
    local fmt = opts.log_format
    if fmt ~= nil then
        if fmt ~= "text" and fmt ~= "json" then
            error("bad log_format " .. tostring(fmt) .. " (text or json)", 3)
        end
        core.log_format(fmt)
    end
end

-- The drain delay (TERM and QUIT keep accepting, not ready, this long before the listeners
-- close): opts.drain_delay, else 5 s when a balancer has something to poll (readyz or the
-- agent-check), else none, as nothing would see it.
function _M.drain_delay(opts)
    if opts.drain_delay then
        return opts.drain_delay
    end
    return (opts.readyz or opts.agent_check) and 5 or 0
end

-- Makes the core server with the options every mode shares.
local function make(the_app, opts, limits)
    local srv = _M.create(the_app, limits)
    access_logs(srv, the_app, opts)
    local cache = opts.static_cache
    if cache then
        srv:static_cache(cache.files, cache.bytes) -- nil: the core's defaults
    end
    for _, cidr in ipairs(opts.trusted_proxies or {}) do
        local ok, err = srv:trust(cidr)
        if not ok then
            error("bad trusted proxy " .. tostring(cidr) .. ": " .. err, 3)
        end
    end
    local ca = opts.ssl_trusted_certificate
    if ca ~= nil then
        if type(ca) ~= "string" then
            error("bad ssl_trusted_certificate (a file name expected)", 3)
        end
        local ok, err = require("moonserve.host.core.socket").trust(
            ffi.cast("ms_server_t *", srv:pointer()), ca)
        if not ok then
            error("bad ssl_trusted_certificate: " .. err, 3)
        end
    end
    return srv
end

local function serve(srv)
    dispatcher.start_guards(srv)
    srv:run()
    -- Thread pools: running jobs are waited for, the threads joined, before the loop closes.
    local threads = package.loaded["moonserve.host.core.threads"]
    if threads then
        threads.stop_all(ffi.cast("ms_server_t *", srv:pointer()))
    end
    base.log(base.LOG_INFO, "stopped")
    srv:close()
    return true
end

-- A worker maps the zones of the app's shared dictionaries, which it asks of the master: the
-- master makes one the first time it is asked for and keeps it, so the values survive a
-- reload. It makes only those the app declared when it started, with their sizes: another
-- name or size fails the worker before it is ready (a reload then fails and the old workers
-- stay).
local function attach_shared(the_app)
    local shared = require "moonserve.host.core.shared"
    local names = {}
    for name in pairs(the_app.shared_decl or {}) do
        names[#names + 1] = name
    end
    table.sort(names) -- the same order in every worker, for the master's log
    for _, name in ipairs(names) do
        local size = the_app.shared_decl[name]
        local fd, err = core.master_zone(name, size)
        if not fd then
            return nil, err
        end
        local _, aerr = shared.attach(fd, name, size)
        core.fd_close(fd) -- the mapping stays; the master keeps the zone's descriptor
        if aerr then
            return nil, aerr
        end
    end
    return true
end

-- Whether any of the app's routes (its sites' too) answers with the metrics' handler.
local function mounts_metrics(the_app, handler)
    local function any(a)
        local r = type(a) == "table" and rawget(a, "router")
        for _, route in ipairs(r and r.all or {}) do
            local v = route.value
            if v == handler or (type(v) == "table" and v.handler == handler) then
                return true
            end
        end
        return false
    end
    if any(the_app) then
        return true
    end
    for _, site in pairs(type(the_app) == "table" and rawget(the_app, "sites") or {}) do
        if any(site) then
            return true
        end
    end
    return false
end

-- opts.metrics: "HOST:PORT" (a listener of its own that answers the scrape and nothing
-- else), true (on, for a route of the app's with moonserve.metrics.handler), or { listen =
-- "HOST:PORT", app_bytes = size of the app's metrics' dictionary }. Off when absent, unless
-- the app mounts the handler or declares metrics of its own. Returns nil or
-- { listen = addr | nil, app_bytes = n }.
local function metrics_spec(opts, the_app)
    local m = opts.metrics
    local metrics = require "moonserve.host.core.metrics"
    local spec
    if type(m) == "string" then
        spec = { listen = m }
    elseif m == true then
        spec = {}
    elseif type(m) == "table" then
        for k in pairs(m) do
            if k ~= "listen" and k ~= "app_bytes" then
                error("unknown metrics option " .. tostring(k) .. " (accepted: listen, app_bytes)", 3)
            end
        end
        if m.listen ~= nil and type(m.listen) ~= "string" then
            error("bad metrics.listen (\"HOST:PORT\" expected)", 3)
        end
        spec = { listen = m.listen, app_bytes = m.app_bytes }
    elseif m ~= nil and m ~= false then
        error("bad metrics (\"HOST:PORT\", true or { listen = ..., app_bytes = ... } expected)", 3)
    elseif mounts_metrics(the_app, metrics.handler) or metrics.declared() then
        spec = {}
    else
        return nil
    end
    if spec.listen and not spec.listen:match("^%[?[%w%.:]*%]?:%d+$") then
        error("bad metrics listen address " .. spec.listen .. " (HOST:PORT expected)", 3)
    end
    local bytes, err = require("moonserve.shared").parse_size(spec.app_bytes or metrics.DICT_BYTES)
    if not bytes then
        error("bad metrics.app_bytes: " .. err, 3)
    end
    spec.app_bytes = bytes
    return spec
end
_M.metrics_spec = metrics_spec

-- Turns metrics on for `the_app`: its routes are numbered, its metrics get their dictionary,
-- and a metrics listener joins `listen` (the last). Returns the route names, or nil when off.
local function metrics_setup(the_app, opts, listen)
    local spec = metrics_spec(opts, the_app)
    if not spec then
        return nil
    end
    local metrics = require "moonserve.host.core.metrics"
    rawset(the_app, "metrics_on", true)
    local decl = rawget(the_app, "shared_decl") or {}
    rawset(the_app, "shared_decl", decl)
    decl[metrics.DICT] = decl[metrics.DICT] or spec.app_bytes
    metrics.dict_names = decl
    if spec.listen then
        listen[#listen + 1] = { addr = spec.listen, proxy_protocol = false, metrics = true }
    end
    return metrics.number_routes(the_app), spec
end

-- This process's server counts into slot `slot` of the metrics zone of `fd`.
local function metrics_attach(srv, fd, slot, names)
    local ok, err = srv:metrics(fd, slot)
    core.fd_close(fd)
    if not ok then
        error("metrics: " .. err, 0)
    end
    local metrics = require "moonserve.host.core.metrics"
    metrics.attach(srv, slot, names)
    dispatcher.metrics_listener(true)
    dispatcher.timer_every(1, function(premature)
        if not premature then
            metrics.update_lua()
        end
    end)
end

-- What app:run{} takes (the command line's flags set the same keys): any other key is a
-- mistake, named at start with the accepted ones.
local OPTIONS = { "access_log", "access_log_format", "agent_check", "agent_maint",
    "drain_delay", "group", "limits", "listen", "livez",
    "log", "log_format", "log_level", "metrics", "on_listen", "pid_file", "quiet", "readyz",
    "request_id_header", "ssl_trusted_certificate", "start_timeout", "static_cache",
    "stop_timeout", "tls_ticket_rotate", "trusted_proxies", "user", "workers" }
local OPTION_SET = {}
for _, k in ipairs(OPTIONS) do
    OPTION_SET[k] = true
end

local function check_options(opts)
    if type(opts) ~= "table" then
        error("bad options (a table expected)", 3)
    end
    for k in pairs(opts) do
        if not OPTION_SET[k] then
            error("unknown option " .. tostring(k) .. " (accepted: " .. table.concat(OPTIONS, ", ")
                .. ")", 3)
        end
    end
    local workers = opts.workers
    if workers ~= nil and (type(workers) ~= "number" or workers < 0 or workers % 1 ~= 0) then
        error("bad workers (a whole number expected)", 3)
    end
    for _, key in ipairs({ "stop_timeout", "start_timeout", "tls_ticket_rotate" }) do
        local v = opts[key]
        if v ~= nil and (type(v) ~= "number" or v <= 0) then
            error("bad " .. key .. " (seconds, above 0, expected)", 3)
        end
    end
    local delay = opts.drain_delay
    if delay ~= nil and (type(delay) ~= "number" or delay < 0 or delay > 86400) then
        error("bad " .. label(opts, "drain_delay") .. " (seconds, 0 to 86400, expected)", 3)
    end
    local agent = opts.agent_check
    if agent ~= nil and (type(agent) ~= "string" or not agent:match("^%[?[%w%.:]*%]?:%d+$")) then
        error("bad " .. label(opts, "agent_check") .. " (ADDR:PORT expected)", 3)
    end
    if opts.agent_maint ~= nil and (type(opts.agent_maint) ~= "string" or not agent) then
        error("bad agent_maint (a file name, with agent_check)", 3)
    end
    for _, key in ipairs({ "user", "group", "pid_file" }) do
        local v = opts[key]
        if v ~= nil and (type(v) ~= "string" or v == "") then
            error("bad " .. label(opts, key) .. " (a name expected)", 3)
        end
    end
    if opts.group and not opts.user then
        error(label(opts, "group") .. " goes with user: the group the workers' user runs in", 3)
    end
end

-- -- The workers' user ------------------------------------------------------------------
-- opts.user and opts.group: the master starts as root, binds, reads the TLS files and opens
-- the logs; its workers run as the user, in the group (default: the user's own).

-- The ids of opts.user and opts.group, or nil when no user is given; an unknown one raises.
local function user_ids(opts)
    if not opts.user then
        return nil
    end
    local uid, gid = core.user_ids(opts.user, opts.group)
    if not uid then
        error("bad " .. label(opts, opts.group and gid:match("^unknown group") and "group"
            or "user") .. ": " .. gid, 0)
    end
    if uid == 0 then
        error("bad " .. label(opts, "user") .. " " .. opts.user .. ": the workers would run as "
            .. "root (leave user out, or name an unprivileged one)", 0)
    end
    return uid, gid
end

-- The files the operator named that a worker may not be able to open as its user, which the
-- master then opens for it: the TLS files (read) and the logs (appended to).
local function named_files(the_app, opts, listen)
    local files, logs = {}, {}
    local function tls(t)
        for _, p in ipairs(tls_pairs(t, "tls", 4)) do
            files[#files + 1] = p.cert
            files[#files + 1] = p.key
            files[#files + 1] = p.ocsp
        end
    end
    local function log(spec)
        local path = type(spec) == "table" and spec.path or spec
        if type(path) == "string" and path ~= "-" then
            logs[#logs + 1] = path
        end
    end
    for _, l in ipairs(listen) do
        if l.tls then
            tls(l.tls)
        end
    end
    log(opts.log)
    log(opts.access_log)
    for _, site in pairs(type(the_app) == "table" and rawget(the_app, "sites") or {}) do
        if rawget(site, "tls") then
            tls(rawget(site, "tls"))
        end
        log(rawget(site, "access_log"))
    end
    return files, logs
end

-- A worker started with a user: it must run as that user and group alone, never as root.
local function check_worker_user(opts)
    if not opts.user then
        return
    end
    local uid, gid = user_ids(opts)
    if core.uid() == 0 then
        error("refusing to serve as root: the worker did not become user " .. opts.user, 0)
    end
    if os.getenv("MOONSERVE_WORKER_IDS") then -- the master dropped its privileges for it
        local ok, err = core.user_check(uid, gid)
        if not ok then
            error("refusing to serve: the worker should run as user " .. opts.user .. " but "
                .. err, 0)
        end
    end
end

-- The line a start logs and --check prints about the configuration: the environment, the file,
-- the variables that set settings, the secrets and where each came from (never a value).
function _M.config_line()
    local d = require("moonserve.config").describe()
    local parts = { "environment " .. d.env .. ", " .. (d.file and "configuration " .. d.file
        or "no configuration file") }
    if #d.from > 0 then
        parts[#parts + 1] = "settings from the environment: " .. table.concat(d.from, ", ")
    end
    if #d.secrets > 0 then
        parts[#parts + 1] = "secrets: " .. table.concat(d.secrets, ", ")
    end
    return table.concat(parts, "; ")
end

--- Runs fn() on this process's loop with nothing listening and no worker (the command line's
-- `moonserve migrate`): in a task of its own, as an on_worker_start hook runs, so that its
-- sockets and timers wait without blocking. Returns what fn returned, or raises its error.
function _M.once(fn)
    local the_app = require("moonserve.app").new()
    local srv = _M.create(the_app, parse_limits(nil, the_app))
    local result, done = nil, false
    dispatcher.start_worker(srv, { function()
        result = { xpcall(fn, debug.traceback) }
    end }, nil, function()
        done = true
    end)
    while not done do
        core.run_once(1)
    end
    srv:close()
    if not result[1] then
        error(result[2], 0)
    end
    return unpack(result, 2, table.maxn(result))
end

-- Checks everything `run` would, as `moonserve --check` does: the options, the limits, the
-- listeners' addresses, the log and access log files, the static mounts' directories, the
-- trusted proxies; nothing listens and no worker starts. Returns true or raises.
function _M.check(the_app, opts)
    require("moonserve.config").get() -- (the configuration and its environment's name)
    opts = environment(opts or {})
    check_options(opts)
    log_options(opts)
    if opts.log then
        local f, err = io.open(opts.log, "a")
        if not f then
            error("cannot open " .. label(opts, "log") .. " " .. opts.log .. ": " .. err, 2)
        end
        f:close()
    end
    for _, l in ipairs(listen_list(opts.listen)) do
        if not l.addr:match("^%[?[%w%.:]*%]?:%d+$") then
            error("bad listen address " .. l.addr .. " (HOST:PORT expected)", 2)
        end
    end
    metrics_spec(opts, the_app)
    user_ids(opts)
    make(the_app, opts, parse_limits(opts.limits, the_app)):close()
    return true, from_environment(opts), _M.kernel_tls(listen_list(opts.listen))
end

-- Serves `the_app`. opts.listen: "HOST:PORT", { "HOST:PORT", proxy_protocol = true }, or
-- { "HOST:PORT", tls = { cert = FILE, key = FILE, ... } } (see tls_pairs), or a list of
-- those (default "127.0.0.1:8080"); opts.trusted_proxies: address ranges whose
-- X-Forwarded-For is believed;
-- opts.workers: worker processes under a master (default: one per CPU), 0 for a single
-- process; opts.limits (core.limits()); opts.static_cache: { files = n, bytes = n }, the
-- cache of static files per worker; opts.log: a log file instead of stderr;
-- opts.stop_timeout: seconds a stopping worker may take; opts.start_timeout: seconds a
-- starting worker may take to be ready (its on_worker_start hooks); opts.tls_ticket_rotate:
-- seconds between new TLS session ticket keys (default 3600); opts.access_log: FILE or
-- "-", or { path = ..., format = "combined" | "json" | "$template" } (opts.access_log_format:
-- the format of a path given alone); opts.request_id_header: replies carry x-request-id;
-- opts.log_level: "debug", "info", "warn" or "error"; opts.log_format: "text" or "json";
-- opts.livez, opts.readyz: health paths answered by the core (readyz 503 once stopping);
-- opts.drain_delay: seconds TERM and QUIT keep accepting, not ready, before the listeners
-- close (_M.drain_delay); opts.agent_check: "ADDR:PORT" of HAProxy's agent-check responder,
-- opts.agent_maint: a file whose presence makes it say "maint";
-- opts.ssl_trusted_certificate: a PEM file of CA certificates that sock:sslhandshake trusts
-- besides the system's store;
-- opts.metrics: "HOST:PORT", true or { listen =, app_bytes = } (metrics_spec);
-- opts.pid_file: the master writes its pid there once every worker is ready (FILE.oldbin
-- while an upgrade it started, SIGUSR2, is under way) and removes it when it stops;
-- opts.user, opts.group: the workers run as this user, in this group (default: the user's
-- own), the master as root (it binds, reads the TLS files and opens the logs for them);
-- opts.on_listen(port) in
-- single-process mode. The environment's settings (ENV) go over opts, except the keys the
-- command line gave (_M.given). The defaults are the core's: core.defaults().
function _M.run(the_app, opts)
    opts = environment(opts or {})
    check_options(opts)
    log_options(opts)
    if os.getenv("MOONSERVE_WORKER") then
        -- What `ps` shows (as nginx's "nginx: worker process"); a failure changes nothing else.
        core.proctitle("moonserve: worker " .. os.getenv("MOONSERVE_WORKER"))
        -- (First: a worker's files, the log's too, may need its master; and a worker that
        -- should have dropped its privileges and has not runs nothing.)
        assert(core.worker_init())
        check_worker_user(opts)
    end
    if opts.log then
        local ok, err = core.log_open(opts.log)
        if not ok then
            error("cannot open " .. label(opts, "log") .. " " .. opts.log .. ": " .. err, 2)
        end
    end
    local env = from_environment(opts)
    if env and not os.getenv("MOONSERVE_WORKER") then
        base.log(base.LOG_INFO, "from the environment: " .. env)
    end
    local limits = parse_limits(opts.limits, the_app)
    local listen = listen_list(opts.listen)
    local route_names = metrics_setup(the_app, opts, listen)
    -- (dictionaries the framework's parts asked for: a local rate limit's)
    rawset(the_app, "shared_decl",
        require("moonserve.shared").declare_wanted(rawget(the_app, "shared_decl") or {}))
    -- Fan-out across instances (channels with redis, moonserve.broadcast): its dictionary and
    -- its subscriptions at each worker's start.
    local fanout = package.loaded["moonserve.fanout"]
    if fanout then
        fanout.prepare(the_app)
    end

    if os.getenv("MOONSERVE_WORKER") then
        -- A worker: the master bound the sockets, in the order of `listen`, from fd 4 on.
        -- It listens and says it is ready once the app's on_worker_start hooks have
        -- returned.
        local nlisten = tonumber(os.getenv("MOONSERVE_LISTEN_FDS")) or 1
        local ok, err = attach_shared(the_app)
        if not ok then
            error(err, 2) -- before it says it is ready: a reload fails, the old workers stay
        end
        local srv = make(the_app, opts, limits)
        if route_names then
            local fd, slot = core.master_metrics(#route_names)
            if not fd then
                error("metrics: " .. slot, 2)
            end
            metrics_attach(srv, fd, slot, route_names)
        end
        local tls = tls_ids(srv, the_app, listen, opts) -- (before it is ready: a bad one fails it)
        dispatcher.start_worker(srv, rawget(the_app, "worker_start_hooks"),
            rawget(the_app, "worker_stop_hooks"), function()
                for i = 1, nlisten do
                    assert(srv:listen_fd(3 + i, listen[i] and listen[i].proxy_protocol, tls[i],
                        listen[i] and listen[i].redirect_https, listen[i] and listen[i].metrics))
                end
                -- (Waits for the master's word to serve, the loop and its accepts held
                -- meanwhile: in a reload, every new worker of it must be ready first.)
                assert(core.worker_ready((opts.start_timeout or 10) + 10))
            end)
        return serve(srv)
    end

    local ktls = _M.kernel_tls(listen)
    if ktls then
        base.log(base.LOG_INFO, ktls)
    end
    -- Read here, once: a master hands its workers these bytes (settings and secrets), and
    -- reads them again on a reload (HUP), as nginx does its configuration.
    local config = require "moonserve.config"
    local config_bytes = config.snapshot()
    local workers = opts.workers or core.cpus()
    local uid, gid = user_ids(opts) -- (a bad user is the start's one line, before any other)
    base.log(base.LOG_INFO, _M.config_line())
    if uid and workers == 0 then
        error(label(opts, "user") .. " needs workers under a master (a single process runs as "
            .. "the user that starts it)", 2)
    end
    if opts.pid_file and workers == 0 then
        error(label(opts, "pid_file") .. " needs workers under a master (the master writes it)", 2)
    end
    if uid and core.uid() ~= 0 then
        if uid ~= core.uid() then
            error(label(opts, "user") .. " " .. opts.user .. ": the master must start as root to "
                .. "run its workers as another user", 2)
        end
        uid, gid = nil, nil -- (it runs as that user already)
    end
    if workers > 0 then
        local files, logs = named_files(the_app, opts, listen)
        local https, metrics_at = {}, nil
        for i, l in ipairs(listen) do
            https[i] = l.tls ~= nil
            metrics_at = l.metrics and i or metrics_at
        end
        -- (zones: the dictionaries declared now, the only ones the master will make.)
        local argv = command_line()
        -- What `ps` shows: "moonserve: master" and the app's path, as nginx's "nginx: master
        -- process /usr/sbin/nginx" (after command_line(), which copied argv's strings).
        core.proctitle("moonserve: master" .. (_M.app_path and " " .. _M.app_path or ""))
        local ok, err, whole = core.master { argv = argv, listen = addresses(listen),
            https = https, metrics = metrics_at, workers = workers,
            stop_timeout = opts.stop_timeout, start_timeout = opts.start_timeout,
            drain_delay = _M.drain_delay(opts), agent_check = opts.agent_check,
            agent_maint = opts.agent_maint,
            ticket_rotate = opts.tls_ticket_rotate, uid = uid, gid = gid, files = files,
            logs = logs, zones = the_app.shared_decl, config = config_bytes,
            pid_file = opts.pid_file,
            on_reload = function()
                local bytes, why = config.reload()
                if bytes then
                    base.log(base.LOG_INFO, "reload: " .. _M.config_line())
                end
                return bytes, why
            end }
        if not ok then
            error(whole == true and err
                or "cannot listen on " .. table.concat(addresses(listen), ", ") .. ": " .. err, 2)
        end
        base.log(base.LOG_INFO, "stopped")
        return true
    end

    local opened, why = require("moonserve.host.core.shared").open(the_app.shared_decl or {})
    if not opened then
        error(why, 2)
    end
    local srv = make(the_app, opts, limits)
    if route_names then
        local n = #route_names * 2 < 1024 and 1024 or #route_names * 2
        local fd, err = core.metrics_create(1, math.min(n, 100000))
        if not fd then
            error("metrics: " .. err, 2)
        end
        metrics_attach(srv, fd, 0, route_names)
    end
    local tls = tls_ids(srv, the_app, listen, opts)
    if opts.agent_check then
        local ok, err = srv:agent_check(opts.agent_check, opts.agent_maint)
        if not ok then
            error("cannot listen on " .. opts.agent_check .. " for the agent-check: " .. err, 2)
        end
    end
    for i, l in ipairs(listen) do
        local addr = l.addr
        local port, err = srv:listen(addr, nil, l.proxy_protocol, tls[i], l.redirect_https,
            l.metrics)
        if not port then
            error("cannot listen on " .. addr .. ": " .. err, 2)
        end
        local host = addr:match("^(.*):%d+$")
        base.log(base.LOG_INFO, format("%s on %s://%s:%d/", l.metrics and "metrics listening"
            or "listening", tls[i] and "https" or "http", host ~= "" and host or "0.0.0.0", port))
        if opts.on_listen and not l.metrics then
            opts.on_listen(port)
        end
    end
    -- One process: it serves while the on_worker_start hooks run.
    dispatcher.start_worker(srv, rawget(the_app, "worker_start_hooks"),
        rawget(the_app, "worker_stop_hooks"))
    return serve(srv)
end

return _M
