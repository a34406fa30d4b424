-- moonserve/host/core/cli.lua: the `moonserve` command.
local _M = {}

local USAGE = [[
usage: moonserve [APP.lua] [options]
       moonserve --static DIR [options]
       moonserve migrate APP.lua [--check] [--env NAME] [--config FILE]
       moonserve --profile SECONDS --metrics ADDR:PORT [--output PREFIX]

Serves APP.lua (a file that returns an app), or the files of DIR, or the bundled demo site.

options:
  --static DIR         serve the files of DIR at / from the core, with no Lua per request:
                       index.html for directories, ETag, ranges, brotli and gzip
  --listing            with --static: list directories that have no index.html
  --spa                with --static: paths with no file extension get /index.html
  --dev                with --static: reload open pages when a file under DIR changes
  --listen ADDR:PORT   where to listen (default 127.0.0.1:8080; port 0 picks one);
                       repeatable
  --listen-proxy ADDR:PORT
                       a listener whose connections start with a PROXY protocol header
                       (v1 or v2), whose address then is the client's
  --tls-cert FILE      the --listen before it serves TLS with this certificate chain (PEM);
                       give it twice for an RSA and an ECDSA certificate side by side
  --tls-key FILE       the private key (PEM) of the --tls-cert before it
  --tls-ocsp FILE      an OCSP response (DER) for the --tls-cert before it, stapled to its
                       handshakes; its chain must hold the issuer. A reload reads it again
  --tls-ciphers LIST   that listener's TLS 1.2 ciphers (OpenSSL's syntax; default: Mozilla's
                       intermediate profile)
  --tls-unknown-name POLICY
                       a server name (SNI) no certificate is for: default (answer with the
                       listener's certificate, the default) or refuse (fail the handshake)
  --tls-no-ktls        no kernel TLS on the --listen before it, where the kernel offers it
                       (the start's log line says whether it does)
  --tls-ticket-rotate S
                       seconds between new TLS session ticket keys (default 3600); the
                       two keys before the newest still resume a session
  --redirect-https PORT
                       the --listen before it answers every request with a 308 redirect to
                       the same host and path over https on PORT
  --ssl-trusted-certificate FILE
                       CA certificates (PEM) that sock:sslhandshake trusts besides the
                       system's store
  --trusted-proxy CIDR believe X-Forwarded-For from these addresses; repeatable
  --workers N          worker processes under a master (default: one per CPU);
                       0 runs a single process with no master
  --user NAME          the workers run as this user (the master starts as root: it binds,
                       reads the TLS keys and opens the logs, and hands them over)
  --group NAME         with --user: the workers' group (default: the user's own)
  --limit KEY=VALUE    set a limit; repeatable (sizes in bytes, times in seconds). The keys,
                       with their defaults:
$limits
  --log FILE           log to FILE (SIGUSR1 reopens it) instead of stderr
  --log-level LEVEL    debug, info (the default), warn or error
  --log-format FORMAT  text (the default) or json: one object per line
  --access-log FILE|-  a line per request (static files too) to FILE, or - for stdout;
                       SIGUSR1 reopens it. Off by default
  --access-log-format FORMAT
                       combined (the default), json, or a template of $fields: time,
                       time_local, client, method, target, request, status, bytes_in,
                       bytes_out, duration, protocol, tls, request_id, route, referer,
                       user_agent (e.g. '$time $client "$request" $status $duration')
  --request-id-header  replies carry x-request-id (the access log's request_id)
  --metrics ADDR:PORT  serve metrics in Prometheus' text format on a listener of their own
                       (GET /metrics; nothing of the app's answers there); off by default
  --livez PATH         answer GET PATH with 200 "ok" while the worker serves (off by default)
  --readyz PATH        answer GET PATH with 200, or 503 once the server stops (a reload
                       stays ready); off by default
  --stop-timeout S     seconds a stopping worker may take to finish (default $stop_timeout)
  --drain-delay S      on TERM or QUIT, seconds the instance keeps accepting and serving,
                       not ready (readyz 503, replies say close), before its listeners
                       close: a balancer that polls must see the 503 first. Default 5 with
                       --readyz or --agent-check, else 0
  --agent-check ADDR:PORT
                       answer HAProxy's agent-check there (the master's, so reloads do not
                       touch it): "ready", "drain" once draining, "maint" while the
                       --agent-maint file exists; off by default
  --agent-maint FILE   with --agent-check: say "maint" while FILE exists
  --start-timeout S    seconds a starting worker may take to be ready, its on_worker_start
                       hooks returned (default $start_timeout); past it the start or
                       reload fails and the old workers keep serving
  --env NAME           the configuration's environment (default: MOONSERVE_ENV, else
                       development): its settings are moonserve.config
  --config FILE        the configuration file (default: config.lua beside the app;
                       MOONSERVE_CONFIG names one too); a reload (HUP) reads it again
  --pid-file FILE      the master writes its pid to FILE once every worker is ready
                       (FILE.oldbin during an upgrade it started), removes it when it stops
  --quiet              log errors and warnings only
  --check              load the app and check it, every option, the configuration and the
                       secrets it asks for, then exit (0 when all is well), as nginx -t
                       does; nothing listens and no secret is shown

environment (a flag wins over its variable, which wins over app:run{}'s table; "" is unset):
  MOONSERVE_LISTEN     ADDR:PORT, or several separated by commas (as --listen)
  PORT                 listen on MOONSERVE_HOST (default 0.0.0.0) at this port, when
                       MOONSERVE_LISTEN is not set
  MOONSERVE_WORKERS    as --workers
  MOONSERVE_LOG, MOONSERVE_LOG_LEVEL, MOONSERVE_LOG_FORMAT
                       as --log, --log-level and --log-format
  MOONSERVE_ACCESS_LOG, MOONSERVE_ACCESS_LOG_FORMAT
                       as --access-log and --access-log-format
  MOONSERVE_LIVEZ, MOONSERVE_READYZ, MOONSERVE_STOP_TIMEOUT, MOONSERVE_START_TIMEOUT
                       as --livez, --readyz, --stop-timeout and --start-timeout
  MOONSERVE_DRAIN_DELAY, MOONSERVE_AGENT_CHECK
                       as --drain-delay and --agent-check
  MOONSERVE_USER, MOONSERVE_GROUP
                       as --user and --group
  MOONSERVE_PID_FILE   as --pid-file
  MOONSERVE_ENV, MOONSERVE_CONFIG
                       as --env and --config
  NAME, A__B           a setting the configuration declares (database_url, a.b), typed
                       as declared
  MOONSERVE_SECRET_NAME
                       moonserve.secret("name"), after a file in the secrets_dir setting
                       or in $CREDENTIALS_DIRECTORY (systemd's LoadCredential=)

profile: `moonserve --profile SECONDS --metrics ADDR:PORT [--output PREFIX]` samples a worker
of the running server whose --metrics listener is ADDR:PORT for SECONDS (its Lua functions
and the core's C functions, at each tick of its CPU clock), prints the hottest functions and
writes PREFIX.folded (folded stacks) and PREFIX.svg (a flame graph); PREFIX defaults to
moonserve-profile-DATE-TIME. The listener answers GET /profile?seconds=S and
/profile.svg?seconds=S with the same.

migrate: applies the app's migrations, migrations/NNN_name.sql (or .lua returning
function(db) ... end) beside APP.lua, in order, each once (recorded in the table
moonserve_migrations), each in a transaction of its own unless its first line is
"-- moonserve: no transaction"; under an advisory lock, so two at once apply each once. The
database: the configuration's database_url, else DATABASE_URL. Exit status 0: all applied;
1: a migration failed (rolled back; it and the ones after it are not applied); 2: cannot
run (bad file names, no database URL, cannot connect).
  --check              list the pending migrations, change nothing. Exit status 0: none is
                       pending; 1: some are; 2: cannot tell

signals (to the master): TERM or QUIT drain (readyz 503 at once, the listeners close
after --drain-delay) and stop gracefully; INT stops gracefully with no delay; HUP starts
workers with the app's code as it is now, which take over while the old ones finish (the
service stays ready); USR1 reopens the log files; USR2 upgrades: a new master (moonserve
and the app as installed now, the same command line) takes over the listening sockets and
serves beside this one. Once it is ready (its pid in --pid-file, this one's moved to
FILE.oldbin; the log says "upgrade: the new master (pid N) is ready"), QUIT the old master
to finish (its workers hand over, with no drain delay), or TERM the new one to undo it; a
new master that fails to start leaves the old one serving.
  -h, --help           this text
  -v, --version        the version, the LuaJIT it runs on and where its modules are
]]

-- USAGE with the core's limits and defaults filled in: they are defined once, in the core.
local function usage()
    local core = require("moonserve.host.core.base").core
    local lines = {}
    for i, l in ipairs(core.limits()) do
        lines[i] = string.format("    %-30s %s", l.key .. "=" .. string.format("%.14g", l.default),
            l.doc)
    end
    local fill = { limits = table.concat(lines, "\n"),
        stop_timeout = string.format("%.14g", core.defaults().stop_timeout),
        start_timeout = string.format("%.14g", core.defaults().start_timeout) }
    return (USAGE:gsub("%$([%w_]+)", fill))
end

local function die(msg)
    -- (A mistake in the configuration is the user's: no position inside moonserve's code.)
    msg = msg:gsub("^[^\n:]*moonserve/[%w_/]+%.lua:%d+: ", "")
    -- A worker that cannot start tells its master, which stops the start or fails the
    -- reload with this sentence: one line, the master's.
    if os.getenv("MOONSERVE_WORKER") then
        local ok, told = pcall(function()
            return require("moonserve.host.core.base").core.worker_failed(msg)
        end)
        if ok and told then
            return 2
        end
    end
    io.stderr:write("moonserve: ", msg, "\n")
    return 2
end

-- `moonserve migrate APP.lua [--check] [--env NAME] [--config FILE]`.
local function migrate(args)
    local app_file, check, env, config_file
    local i = 2
    while i <= #args do
        local a = args[i]
        if a == "-h" or a == "--help" then
            io.stdout:write(usage())
            return 0
        elseif a == "--check" then
            check = true
        elseif a == "--env" or a == "--config" then
            i = i + 1
            if args[i] == nil then
                return die(a .. " needs a value")
            end
            if a == "--env" then
                env = args[i]
            else
                config_file = args[i]
            end
        elseif a:sub(1, 1) == "-" then
            return die("unknown option " .. a .. " for migrate (see --help)")
        elseif app_file then
            return die("one app file at most")
        else
            app_file = a
        end
        i = i + 1
    end
    if not app_file then
        return die("migrate needs the app's file: moonserve migrate app.lua")
    end
    local config = require "moonserve.config"
    config.setup { file = config_file, env = env, app = app_file }
    local ok, settings = pcall(config.get)
    if not ok then
        return die(tostring(settings))
    end
    local url = settings.database_url
    if url == nil or url == "" then
        url = os.getenv("DATABASE_URL")
    end
    if url == nil or url == "" then
        return die("migrate: no database: set database_url in the configuration, or DATABASE_URL")
    end
    local pg = require "moonserve.pg"
    local m = require "moonserve.pg.migrate"
    local dir = (app_file:match("^(.*)/[^/]*$") or ".") .. "/migrations"
    local list, err = m.scan(dir)
    if not list then
        return die("migrate: " .. err)
    end
    local u
    u, err = pg.parse_url(url)
    if not u then
        return die("migrate: " .. err)
    end
    -- (A migration may run long, and a second run waits for the first: a day, unless the
    -- URL says otherwise.)
    ok, err = pcall(function()
        u = pg.new { url = url, timeout = u.timeout or 86400000, pool_size = 1 }
    end)
    if not ok then
        return die("migrate: " .. tostring(err))
    end
    local out = io.stdout
    local function line(s)
        out:write("moonserve: ", s, "\n")
        out:flush()
    end
    local function report(what, mig, info)
        if what == "applied" then
            line(string.format("applied %s (%.0f ms)", mig.file, info))
        elseif what == "changed" then
            line("warning: " .. mig.file .. " changed since it was applied (it is not run again)")
        elseif what == "missing" then
            line("warning: " .. mig.name .. " was applied but has no file now")
        elseif what == "waiting" then
            line("waiting for another migrate to finish")
        end
    end
    local runner = require "moonserve.host.core.runner"
    if check then
        local st
        ok, st, err = pcall(runner.once, function() return m.status(u, list) end)
        if not ok or not st then
            return die("migrate: " .. m.say(ok and err or st))
        end
        for _, c in ipairs(st.changed) do
            report("changed", c)
        end
        for _, r in ipairs(st.missing) do
            report("missing", r)
        end
        for _, p in ipairs(st.pending) do
            line("pending " .. p.file)
        end
        line(#st.pending .. " pending, " .. (#list - #st.pending) .. " applied")
        return #st.pending > 0 and 1 or 0
    end
    local n, failed
    ok, n, err, failed = pcall(runner.once, function() return m.apply(u, list,
        { report = report }) end)
    if not ok then
        return die("migrate: " .. tostring(n))
    end
    if not n then
        if failed then
            io.stderr:write("moonserve: migrate: ", failed.path, failed.transaction
                and " failed, rolled back: " or " failed: ", m.say(err), "\n")
            return 1
        end
        return die("migrate: " .. m.say(err))
    end
    line(n == 0 and "nothing to migrate" or (n .. " applied"))
    return 0
end

-- GET `path` from the server at "ADDR:PORT" (its metrics listener), waiting up to `wait`
-- seconds for the reply: status, its fields (lower-case names), body; or nil and an error.
local function fetch(addr, path, wait)
    local host, port = addr:match("^%[(.+)%]:(%d+)$")
    if not host then
        host, port = addr:match("^(.+):(%d+)$")
    end
    if not host then
        return nil, "bad address " .. addr .. " (ADDR:PORT expected)"
    end
    local socket = require "moonserve.host.core.socket"
    local s = socket.tcp()
    s:settimeouts(5000, 5000, wait * 1000)
    local ok, err = s:connect(host, tonumber(port))
    if not ok then
        return nil, "cannot reach " .. addr .. ": " .. err
    end
    ok, err = s:send("GET " .. path .. " HTTP/1.1\r\nHost: " .. addr
        .. "\r\nConnection: close\r\n\r\n")
    local reply
    if ok then
        reply, err = s:receive("*a")
    end
    s:close()
    if not reply then
        return nil, "no reply from " .. addr .. ": " .. tostring(err)
    end
    local head, body = reply:match("^(.-)\r\n\r\n(.*)$")
    local status = head and tonumber(head:match("^HTTP/1%.%d (%d%d%d)"))
    if not status then
        return nil, "not an HTTP reply from " .. addr
    end
    local fields = {}
    for name, v in head:gmatch("\r\n([^:\r\n]+):[ \t]*([^\r\n]*)") do
        fields[name:lower()] = v
    end
    return status, fields, body
end

-- `moonserve --profile SECONDS --metrics ADDR:PORT [--output PREFIX]`: samples a worker of
-- the server whose metrics listener is at ADDR:PORT, and writes PREFIX.folded and PREFIX.svg.
local function profile(args)
    local seconds, addr, prefix
    local i = 1
    while i <= #args do
        local a, v = args[i], args[i + 1]
        if a == "--profile" or a == "--metrics" or a == "--output" then
            if v == nil then
                return die(a .. " needs a value")
            end
            if a == "--profile" then
                seconds = tonumber(v)
            elseif a == "--metrics" then
                addr = v
            else
                prefix = v
            end
            i = i + 2
        else
            return die("unknown option " .. a .. " for --profile (see --help)")
        end
    end
    if not seconds or seconds <= 0 or seconds > 300 then
        return die("--profile needs SECONDS, from 0 to 300")
    end
    if not addr then
        return die("--profile needs the server's metrics listener: --metrics ADDR:PORT")
    end
    prefix = prefix or os.date("moonserve-profile-%Y%m%d-%H%M%S")
    local ok, status, fields, body = pcall(require("moonserve.host.core.runner").once,
        function() return fetch(addr, "/profile?seconds=" .. seconds, seconds + 30) end)
    if not ok or not status then
        return die("profile: " .. tostring(ok and fields or status))
    end
    if status ~= 200 then
        local why = body:gsub("%s+$", "")
        return die(string.format("profile: the server said %d: %s", status, why))
    end
    local p = require "moonserve.profile"
    local samples = p.parse_folded(body)
    local title = string.format("moonserve profile of %s: %g s, %s ms of CPU", addr, seconds,
        fields["x-profile-cpu-ms"] or "?")
    for ext, text in pairs({ folded = p.folded(samples), svg = p.svg(samples, { title = title }) })
    do
        local f, err = io.open(prefix .. "." .. ext, "w")
        if not f then
            return die("profile: " .. err)
        end
        f:write(text)
        f:close()
    end
    io.stdout:write(p.summary(samples, 10), "moonserve: wrote ", prefix, ".folded and ", prefix,
        ".svg\n")
    return 0
end

function _M.main(args)
    if args[1] == "migrate" then
        return migrate(args)
    end
    for _, a in ipairs(args) do
        if a == "--profile" then
            return profile(args)
        end
    end
    if os.getenv("MOONSERVE_WORKER") then
        -- Loading the core holds a worker's signals until it serves (ms_core.c,
        -- worker_signals): first, so that its app's top level runs with them held too.
        require("moonserve.host.core.base")
    end
    local opts = {}
    local app_file, static_dir, check, env, config_file
    local static_flags = {}
    local i = 1
    while i <= #args do
        local a = args[i]
        local function value()
            i = i + 1
            local v = args[i]
            if v == nil then
                error({ usage = a .. " needs a value" })
            end
            return v
        end
        if a == "-h" or a == "--help" then
            io.stdout:write(usage())
            return 0
        elseif a == "-v" or a == "--version" then
            -- (Which copy runs, and on what: several trees may each have one.)
            io.stdout:write("moonserve ", require("moonserve")._VERSION, " on ", jit.version,
                ", from ", package.searchpath("moonserve", package.path) or "?", "\n")
            return 0
        elseif a == "--listen" or a == "--listen-proxy" then
            opts.listen = opts.listen or {}
            opts.listen[#opts.listen + 1] = { value(), proxy_protocol = a == "--listen-proxy" }
        elseif a == "--tls-cert" or a == "--tls-key" or a == "--tls-ciphers"
                or a == "--tls-unknown-name" or a == "--tls-ocsp" then
            local l = opts.listen and opts.listen[#opts.listen]
            if not l then
                return die(a .. " goes after the --listen it is for")
            end
            local v = value()
            l.tls = l.tls or { cert = {}, key = {} }
            if a == "--tls-cert" then
                table.insert(l.tls.cert, v)
            elseif a == "--tls-key" then
                table.insert(l.tls.key, v)
            elseif a == "--tls-ciphers" then
                l.tls.ciphers = v
            elseif a == "--tls-ocsp" then
                if #l.tls.cert == 0 then
                    return die(a .. " goes after the --tls-cert it is for")
                end
                l.tls.ocsp = l.tls.ocsp or {}
                for k = #l.tls.ocsp + 1, #l.tls.cert - 1 do
                    l.tls.ocsp[k] = false
                end
                l.tls.ocsp[#l.tls.cert] = v
            else
                if v ~= "default" and v ~= "refuse" then
                    return die("--tls-unknown-name needs default or refuse")
                end
                l.tls.unknown_name = v
            end
        elseif a == "--tls-no-ktls" then
            local l = opts.listen and opts.listen[#opts.listen]
            if not l then
                return die(a .. " goes after the --listen it is for")
            end
            l.tls = l.tls or { cert = {}, key = {} }
            l.tls.ktls = false
        elseif a == "--redirect-https" then
            local l = opts.listen and opts.listen[#opts.listen]
            local port = tonumber(value())
            if not l then
                return die(a .. " goes after the --listen it is for")
            elseif not port then
                return die(a .. " needs a port")
            end
            l.redirect_https = port
        elseif a == "--ssl-trusted-certificate" then
            opts.ssl_trusted_certificate = value()
        elseif a == "--trusted-proxy" then
            opts.trusted_proxies = opts.trusted_proxies or {}
            opts.trusted_proxies[#opts.trusted_proxies + 1] = value()
        elseif a == "--workers" then
            local n = tonumber(value())
            if not n or n < 0 or n % 1 ~= 0 then
                return die("--workers needs a whole number")
            end
            opts.workers = n
        elseif a == "--user" or a == "--group" then
            opts[a:sub(3)] = value()
        elseif a == "--limit" then
            local k, v = value():match("^([%w_]+)=(.+)$")
            if not k or not tonumber(v) then
                return die("--limit needs KEY=NUMBER")
            end
            opts.limits = opts.limits or {}
            opts.limits[k] = tonumber(v)
        elseif a == "--log" then
            opts.log = value()
        elseif a == "--pid-file" then
            opts.pid_file = value()
        elseif a == "--log-level" then
            local v = value()
            if v ~= "debug" and v ~= "info" and v ~= "warn" and v ~= "error" then
                return die("--log-level needs debug, info, warn or error")
            end
            opts.log_level = v
        elseif a == "--log-format" then
            local v = value()
            if v ~= "text" and v ~= "json" then
                return die("--log-format needs text or json")
            end
            opts.log_format = v
        elseif a == "--access-log" then
            opts.access_log = value()
        elseif a == "--access-log-format" or a == "--access-format" then
            opts.access_log_format = value()
        elseif a == "--metrics" then
            local v = value()
            if not v:match("^%[?[%w%.:]*%]?:%d+$") then
                return die("--metrics needs ADDR:PORT")
            end
            opts.metrics = v
        elseif a == "--request-id-header" then
            opts.request_id_header = true
        elseif a == "--livez" or a == "--readyz" then
            local path = value()
            if path:sub(1, 1) ~= "/" then
                return die(a .. " needs a path starting with /")
            end
            opts[a:sub(3)] = path
        elseif a == "--drain-delay" then
            opts.drain_delay = tonumber(value())
            if not opts.drain_delay or opts.drain_delay < 0 then
                return die("--drain-delay needs a number of seconds (0 or more)")
            end
        elseif a == "--agent-check" then
            local v = value()
            if not v:match("^%[?[%w%.:]*%]?:%d+$") then
                return die("--agent-check needs ADDR:PORT")
            end
            opts.agent_check = v
        elseif a == "--agent-maint" then
            opts.agent_maint = value()
        elseif a == "--stop-timeout" then
            opts.stop_timeout = tonumber(value())
            if not opts.stop_timeout then
                return die("--stop-timeout needs a number of seconds")
            end
        elseif a == "--tls-ticket-rotate" then
            opts.tls_ticket_rotate = tonumber(value())
            if not opts.tls_ticket_rotate then
                return die("--tls-ticket-rotate needs a number of seconds")
            end
        elseif a == "--start-timeout" then
            opts.start_timeout = tonumber(value())
            if not opts.start_timeout then
                return die("--start-timeout needs a number of seconds")
            end
        elseif a == "--env" then
            env = value()
            if not env:match("^[%w_%-]+$") then
                return die("--env needs an environment's name (letters, digits, _ and -)")
            end
        elseif a == "--config" then
            config_file = value()
        elseif a == "--quiet" then
            opts.quiet = true
        elseif a == "--check" then
            check = true
        elseif a == "--static" then
            static_dir = value()
        elseif a == "--listing" or a == "--spa" or a == "--dev" then
            static_flags[a:sub(3)] = true
        elseif a:sub(1, 1) == "-" then
            return die("unknown option " .. a .. " (see --help)")
        elseif app_file then
            return die("one app file at most")
        else
            app_file = a
        end
        i = i + 1
    end
    for _, l in ipairs(opts.listen or {}) do
        if l.tls and (#l.tls.cert == 0 or #l.tls.cert ~= #l.tls.key) then
            return die("--listen " .. l[1] .. ": each --tls-cert needs its --tls-key")
        end
    end
    -- The configuration beside the app, read at its first use: the app's top level may read it.
    require("moonserve.config").setup { file = config_file, env = env, app = app_file }
    local app
    if static_dir then
        if app_file then
            return die("--static serves a directory: no app file with it")
        end
        local ok, err = pcall(function()
            app = require("moonserve.app").new()
            app:static("/", static_dir, { listing = static_flags.listing, spa = static_flags.spa,
                live_reload = static_flags.dev, cache_control = static_flags.dev and "no-cache"
                or nil })
        end)
        if not ok then
            return die(tostring(err))
        end
    elseif next(static_flags) then
        return die("--listing, --spa and --dev go with --static")
    elseif app_file then
        local chunk, err = loadfile(app_file)
        if not chunk then
            return die(err)
        end
        local ok
        ok, app = pcall(chunk)
        if not ok then
            return die(tostring(app))
        end
        if type(app) ~= "table" or type(app.handle) ~= "function" then
            return die(app_file .. " must return an app (moonserve.app())")
        end
        -- (For the master's process title: "moonserve: master app.lua".)
        require("moonserve.host.core.runner").app_path = app_file
    else
        -- MOONSERVE_DEMO names the demo's file in a source tree (the tests set it), so a
        -- stale installed copy is not what gets run there.
        local file = os.getenv("MOONSERVE_DEMO")
        local ok, demo
        if file and file ~= "" then
            ok, demo = pcall(dofile, file)
        else
            ok, demo = pcall(require, "moonserve.demo")
        end
        if not ok then
            return die("the demo site is not installed: " .. tostring(demo))
        end
        app = demo
    end
    if opts.quiet then
        require("moonserve.host.core.base").core.log_level(1)
    end
    -- What the command line set, the environment does not override (--quiet: the level).
    local flags = {}
    for k in pairs(opts) do
        flags[k] = true
    end
    flags.log_level = flags.log_level or flags.quiet
    require("moonserve.host.core.runner").given(opts, flags)
    if check then
        local ok, err, from_env, ktls = pcall(require("moonserve.host.core.runner").check, app,
            opts)
        if not ok then
            return die(tostring(err))
        end
        if from_env then
            io.stdout:write("moonserve: from the environment: ", from_env, "\n")
        end
        io.stdout:write("moonserve: ", require("moonserve.host.core.runner").config_line(), "\n")
        if ktls then
            io.stdout:write("moonserve: ", ktls, "\n")
        end
        io.stdout:write("moonserve: ", app_file or static_dir or "the demo site",
            ": the app and its options are valid\n")
        return 0
    end
    local ok, err = pcall(app.run, app, opts)
    if not ok then
        return die(tostring(err))
    end
    return 0
end

return _M
