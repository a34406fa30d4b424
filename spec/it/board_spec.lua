-- spec/it/board_spec.lua: the example app examples/board against a real PostgreSQL (a
-- throwaway cluster, spec/postgres.lua): its own specs run by plain busted in its directory,
-- its migrations applied by the real `moonserve migrate`, then the app served by two workers
-- over TLS and HTTP/2, checked with curl and in headless Chromium (spec/it/board_browser.py):
-- sign up, log out and in, post a note, and see it appear live on a second page.
local helper = require "helper"
local postgres = require "postgres"
local cjson = require "cjson"

local q = helper.sh_quote
local BOARD = helper.root .. "/examples/board"
local BIN = os.getenv("MOONSERVE_BIN") or (helper.root .. "/lua/bin/moonserve")

describe("the board example", function()
    local pg, server_url, dir

    setup(function()
        pg = postgres.start()
        -- the specs' user makes a database of its own for each run of the app's specs
        pg.psql("ALTER USER " .. postgres.users.scram.user .. " CREATEDB")
        pg.psql("CREATE DATABASE board OWNER " .. postgres.users.scram.user)
        server_url = ("postgres://%s:%s@127.0.0.1:%d/"):format(postgres.users.scram.user,
            postgres.users.scram.password, pg.port)
        dir = helper.run(helper.tool("mktemp") .. " -d"):gsub("%s+$", "")
    end)

    teardown(function()
        if pg then
            pg.stop()
        end
        if dir then
            os.execute("rm -rf " .. q(dir))
        end
    end)

    it("passes its own specs, run by plain busted in its directory", function()
        -- (busted from PATH, as a user runs it; LUA_PATH and MOONSERVE_CORE make this tree
        -- the installed moonserve, MOONSERVE_BIN its command)
        local out = helper.run("cd " .. q(BOARD) .. " && DATABASE_URL=" .. q(server_url
            .. "postgres") .. " MOONSERVE_BIN=" .. q(BIN) .. " " .. helper.tool("busted")
            .. " -o TAP 2>&1")
        assert(out:find("\n1%.%.%d+"), out)
        assert(not out:find("not ok", 1, true), out)
        assert.matches("ok %d+ %- the board the live list", out)
        -- (and the database it made is gone)
        assert.equal("1", pg.psql("SELECT count(*) FROM pg_database WHERE datname LIKE "
            .. "'board%'"))
    end)

    it("passes --check in production only with its database URL and session secret",
        function()
            local function check(env)
                return helper.run("unset DATABASE_URL MOONSERVE_SECRET_SESSION; " .. env .. " "
                    .. BIN .. " " .. q(BOARD .. "/app.lua") .. " --env production --check 2>&1; "
                    .. "echo \"exit $?\"")
            end
            local secret = "MOONSERVE_SECRET_SESSION=" .. string.rep("k", 40)
            local out = check("DATABASE_URL=" .. q(server_url .. "board"))
            assert.matches('secret "session" not found in the production environment', out)
            assert.matches("exit 2\n$", out)
            out = check(secret)
            assert.matches("database_url is not set in the production environment", out)
            assert.matches("exit 2\n$", out)
            out = check(secret .. " DATABASE_URL=" .. q(server_url .. "board"))
            assert.matches("settings from the environment: DATABASE_URL", out)
            assert.not_matches("kkkk", out) -- (never the secret)
            assert.matches("exit 0\n$", out)
        end)

    describe("served over TLS and HTTP/2", function()
        local srv, url, db_url

        local function migrate(args)
            return helper.run("DATABASE_URL=" .. q(db_url) .. " " .. BIN .. " migrate "
                .. q(BOARD .. "/app.lua") .. " --env production " .. (args or "")
                .. " 2>&1; echo \"exit $?\"")
        end

        setup(function()
            db_url = server_url .. "board"
            helper.sh(string.format("%s req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
                .. "-nodes -keyout %s -out %s -days 2 -subj /CN=localhost "
                .. "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 2>&1",
                helper.tool("openssl"), q(dir .. "/board.key"), q(dir .. "/board.pem")))
        end)

        teardown(function()
            if srv then
                srv:stop()
            end
        end)

        it("has its migrations applied once by moonserve migrate", function()
            local out = migrate("--check")
            assert.matches("pending 001_users.sql", out, 1, true)
            assert.matches("exit 1\n$", out)
            out = migrate()
            assert.matches("exit 0\n$", out)
            assert.equal("1,2,3", pg.psql("SELECT string_agg(version::text, ',' ORDER BY "
                .. "version) FROM moonserve_migrations", "board"))
            out = migrate("--check")
            assert.matches("exit 0\n$", out)
        end)

        it("serves its pages and API over HTTP/2 with the production configuration", function()
            srv = helper.spawn_server { app = BOARD .. "/app.lua",
                args = string.format("--workers 2 --listen 127.0.0.1:0 --tls-cert %s "
                    .. "--tls-key %s --env production", q(dir .. "/board.pem"),
                    q(dir .. "/board.key")),
                env = { DATABASE_URL = db_url,
                    MOONSERVE_SECRET_SESSION = string.rep("k", 48) } }
            url = "https://127.0.0.1:" .. srv.ports[2]
            local out = helper.curl("-k --http2 -w '\\n%{http_version} %{http_code}' "
                .. q(url .. "/api/notes?per_page=5"))
            local body, version, code = out:match("^(.*)\n(%S+) (%d+)$")
            assert.equal("2", version, out)
            assert.equal("200", code, out)
            assert.same({ notes = {}, page = 1, per_page = 5, total = 0, pages = 1,
                next = cjson.null }, cjson.decode(body))
            out = helper.curl("-k --http2 -H 'accept: application/json' -w '\\n%{http_code}' "
                .. q(url .. "/api/nowhere"))
            assert.matches('^{"error":{.*"status":404.*}}\n404$', out)
            -- a CORS preflight from the production configuration's origin
            out = helper.curl("-k --http2 -si -X OPTIONS -H 'origin: https://app.example' "
                .. "-H 'access-control-request-method: POST' " .. q(url .. "/api/notes"))
            assert.matches("^HTTP/2 204", out)
            assert.matches("access%-control%-allow%-origin: https://app%.example", out)
        end)

        it("sends a note posted through the API to the event streams of both workers",
            function()
                -- streams on connections of their own, one at a time until both workers
                -- hold one and there are six: which worker takes a connection is the
                -- kernel's pick (a burst at once may all go to the first one awake)
                local streams, workers = {}, {}
                for i = 1, 24 do
                    streams[i] = dir .. "/stream" .. i
                    os.execute(helper.tool("curl") .. " -sSk --http2 -N --max-time 8 "
                        .. q(url .. "/events") .. " >" .. q(streams[i]) .. " 2>&1 &")
                    local worker
                    assert.truthy(helper.wait_for(function()
                        worker = helper.read_file(streams[i]):match(": worker (%d)")
                        return worker ~= nil
                    end, 5), helper.read_file(streams[i]))
                    workers[worker] = true
                    if i >= 6 and workers["0"] and workers["1"] then
                        break
                    end
                end
                assert.truthy(workers["0"] and workers["1"], "one worker had every stream")
                -- a member of the API: the session cookie and its token, as a script keeps them
                local jar = q(dir .. "/jar")
                local token = cjson.decode(helper.curl("-k -c " .. jar .. " " .. q(url
                    .. "/api/csrf"))).csrf_token
                helper.curl("-k -b " .. jar .. " -c " .. jar .. " -H " .. q("x-csrf-token: "
                    .. token) .. " --data 'name=grace_hopper&password=correct+horse' "
                    .. q(url .. "/signup"))
                token = cjson.decode(helper.curl("-k -b " .. jar .. " " .. q(url
                    .. "/api/csrf"))).csrf_token
                local out = helper.curl("-k -b " .. jar .. " -H " .. q("x-csrf-token: " .. token)
                    .. " -H 'content-type: application/json' -w '\\n%{http_code}' --data "
                    .. q('{"body":"to every worker"}') .. " " .. q(url .. "/api/notes"))
                assert.matches("\n201$", out)
                finally(function()
                    os.execute(helper.tool("curl") .. " -sSk -b " .. jar .. " -X DELETE -H "
                        .. q("x-csrf-token: " .. token) .. " " .. q(url .. "/api/notes/"
                        .. cjson.decode(out:match("^(.*)\n")).note.id) .. " >/dev/null")
                end)
                assert.truthy(helper.wait_for(function()
                    for _, f in ipairs(streams) do
                        if not helper.read_file(f):find("to every worker", 1, true) then
                            return false
                        end
                    end
                    return true
                end, 5), helper.read_file(streams[1]))
                for _, f in ipairs(streams) do
                    assert.matches('id: %d+\ndata: {"note":{.-"body":"to every worker"',
                        helper.read_file(f))
                end
            end)

        it("signs up, logs in, and shows a note live on a second page in Chromium", function()
            assert.truthy(srv, "the server of the spec before")
            local out = helper.run(q(helper.tool("websockets")) .. " "
                .. q(helper.root .. "/spec/it/board_browser.py") .. " "
                .. q(helper.tool("chromium")) .. " " .. url .. " ada_lovelace 2>&1")
            local facts, errors = {}, {}
            for k, v in out:gmatch("([%w_]+)=([^\n]*)") do
                if k == "console_error" then
                    errors[#errors + 1] = v
                else
                    facts[k] = v
                end
            end
            assert.equal("True", facts.signup_loaded, out)
            assert.equal("/ Welcome, ada_lovelace!", facts.after_signup, out)
            assert.equal("h2", facts.protocol, out)
            assert.equal("Logged out.", facts.after_logout, out)
            assert.equal("Welcome back, ada_lovelace. ada_lovelace", facts.after_login, out)
            assert.equal("True", facts.second_live, out)
            assert.equal("hello from the first tab", facts.first_shows, out)
            assert.equal("hello from the first tab", facts.second_shows, out)
            assert.equal("1", facts.second_received, out)
            assert.equal("ada_lovelace", facts.second_author, out)
            assert.equal("0", facts.console_errors, table.concat(errors, "\n"))
            -- the note is in the database, by its author
            assert.equal("ada_lovelace|hello from the first tab", pg.psql("SELECT u.name || "
                .. "'|' || n.body FROM notes n JOIN users u ON u.id = n.author", "board"))
        end)
    end)
end)
