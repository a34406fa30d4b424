-- spec/it/ratelimit_spec.lua: moonserve.ratelimit on a real server: what each key kind admits
-- and refuses, exactly; the draft's fields; a window that slides; the count shared by two
-- workers; and bad options refused at start and by --check.
local helper = require "spec.helper"
local socket = require "socket"
local cjson = require "cjson"

local BIN = os.getenv("MOONSERVE_BIN") or (helper.root .. "/lua/bin/moonserve")

local function get(port, path, headers, host)
    local raw = { "GET ", path, " HTTP/1.1\r\nHost: ", host or "rl.test", "\r\n" }
    for k, v in pairs(headers or {}) do
        raw[#raw + 1] = k .. ": " .. v .. "\r\n"
    end
    raw[#raw + 1] = "\r\n"
    return assert(helper.request(port, table.concat(raw)))
end

-- The statuses of `n` requests, in order, as a string: "200 200 429".
local function statuses(port, n, path, headers, host)
    local out = {}
    for i = 1, n do
        out[i] = tostring(get(port, path, headers, host).status)
    end
    return table.concat(out, " ")
end

describe("moonserve.ratelimit, local", function()
    local srv

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/ratelimit.lua",
            env = { LIMIT = "3", WINDOW = "1" } }
    end)

    teardown(function()
        if srv then srv:stop() end
    end)

    it("admits limit requests by address, then answers 429 with Retry-After and the fields",
        function()
            socket.sleep(1.05) -- (a fresh window)
            local first = get(srv.port, "/ip")
            assert.equal(200, first.status)
            assert.equal('"ip";q=3;w=1', first.headers["ratelimit-policy"])
            assert.equal('"ip";r=2;t=1', first.headers["ratelimit"])
            assert.equal("200 200", statuses(srv.port, 2, "/ip"))
            local refused = get(srv.port, "/ip", { Accept = "application/json" })
            assert.equal(429, refused.status)
            assert.equal("1", refused.headers["retry-after"])
            assert.equal('"ip";q=3;w=1', refused.headers["ratelimit-policy"])
            assert.matches('^"ip";r=0;t=1$', refused.headers["ratelimit"])
            -- The app's default error page, in the shape the client asked for.
            assert.matches("application/json", refused.headers["content-type"])
            assert.matches("Too Many Requests", refused.body)
            local html = get(srv.port, "/ip", { Accept = "text/html" })
            assert.equal(429, html.status)
            assert.matches("<h1>429 Too Many Requests</h1>", html.body)
            -- Other paths are not limited.
            assert.equal("200 200 200 200", statuses(srv.port, 4, "/free"))
        end)

    it("slides the window: a request passes when the oldest one counted leaves it", function()
        socket.sleep(1.05)
        local t0 = socket.gettime()
        assert.equal("200", statuses(srv.port, 1, "/ip"))
        socket.sleep(0.6 - (socket.gettime() - t0))
        assert.equal("200 200 429", statuses(srv.port, 3, "/ip"))
        -- At 1.05 s the first has left, the two of 0.6 s have not: one passes, not three (a
        -- fixed window of one second would have opened afresh).
        socket.sleep(1.05 - (socket.gettime() - t0))
        assert.equal("200 429", statuses(srv.port, 2, "/ip"))
        local r = get(srv.port, "/ip")
        assert.equal(429, r.status)
        assert.equal("1", r.headers["retry-after"])
    end)

    it("counts by user, and requests without one by address", function()
        assert.equal("200 200 429", statuses(srv.port, 3, "/user", { ["X-User"] = "ada" }))
        assert.equal("200 200 429", statuses(srv.port, 3, "/user", { ["X-User"] = "bob" }))
        assert.equal("200 200 429", statuses(srv.port, 3, "/user"))
        assert.equal("429", statuses(srv.port, 1, "/user", { ["X-User"] = "ada" }))
    end)

    it("counts by route: each route its own count, every path of a :param route one", function()
        assert.equal("200 200 429", statuses(srv.port, 3, "/route/a"))
        assert.equal("200 200 429", statuses(srv.port, 3, "/route/b"))
        assert.equal(200, get(srv.port, "/route/1").status)
        assert.equal(200, get(srv.port, "/route/2").status)
        assert.equal(429, get(srv.port, "/route/3").status)
    end)

    it("counts by the app's key, and lets a request without one through", function()
        assert.equal("200 429", statuses(srv.port, 2, "/fn", { ["X-Key"] = "k1" }))
        assert.equal("200 429", statuses(srv.port, 2, "/fn", { ["X-Key"] = "k2" }))
        assert.equal("200 200 200", statuses(srv.port, 3, "/fn"))
    end)

    it("gives handlers a limiter: take(key) says yes or no, and how long to wait", function()
        local function login(user)
            return assert(helper.request(srv.port, "POST /login?user=" .. user
                .. " HTTP/1.1\r\nHost: rl.test\r\nContent-Length: 0\r\n\r\n"))
        end
        local r = login("ada")
        assert.equal(200, r.status)
        assert.same({ ok = true, remaining = 1 }, cjson.decode(r.body))
        assert.equal(200, login("ada").status)
        r = login("ada")
        assert.equal(429, r.status)
        assert.same({ error = "too many tries", retry_after = 60 }, cjson.decode(r.body))
        assert.equal("60", r.headers["retry-after"])
        assert.equal('"login";r=0;t=60', r.headers["ratelimit"])
        assert.equal(200, login("bob").status)
    end)

    it("answers a refusal through the site's error page for 429", function()
        assert.equal(200, get(srv.port, "/", nil, "api.test").status)
        local r = get(srv.port, "/", nil, "api.test")
        assert.equal(429, r.status)
        assert.equal('{"error":"slow down"}', r.body)
        assert.equal("60", r.headers["retry-after"])
    end)
end)

describe("moonserve.ratelimit across the workers of an instance", function()
    it("admits limit requests in all from two workers", function()
        local srv = helper.spawn_server { app = "spec/fixtures/ratelimit.lua",
            args = "--workers 2", env = { LIMIT = "20", WINDOW = "60" } }
        local ok, err = pcall(function()
            local admitted, workers = 0, {}
            for _ = 1, 60 do
                local r = get(srv.port, "/ip")
                if r.status == 200 then
                    admitted = admitted + 1
                    workers[r.headers["x-worker"]] = true
                else
                    assert.equal(429, r.status)
                end
            end
            assert.equal(20, admitted)
            local n = 0
            for _ in pairs(workers) do
                n = n + 1
            end
            assert.equal(2, n, "both workers answered admitted requests")
        end)
        srv:stop()
        assert(ok, err)
    end)
end)

describe("moonserve.ratelimit's options", function()
    local function check(src)
        local file = os.tmpname() .. ".lua"
        helper.write_file(file, "local moonserve = require 'moonserve'\nlocal app = moonserve.app()\n"
            .. src .. "\nreturn app\n")
        local out, status = helper.run(BIN .. " --check " .. helper.sh_quote(file) .. " 2>&1")
        os.remove(file)
        return out, status
    end

    it("are refused by --check with one clear line", function()
        local cases = {
            { "app:use(moonserve.ratelimit{ limit = 0, window = 60 })", "ratelimit: bad limit 0" },
            { "app:use(moonserve.ratelimit{ limit = 5 })", "ratelimit: bad window nil" },
            { "app:use(moonserve.ratelimit{ limit = 5, window = 1, key = 'ip' })",
                "ratelimit: bad key ip" },
            { "app:use(moonserve.ratelimit{ limit = 5, window = 1, on_error = 'maybe' })",
                "ratelimit: bad on_error maybe" },
            { "app:use(moonserve.ratelimit{ limit = 5, window = 1, per = 1 })",
                "ratelimit: unknown option per" },
            { "app:use(moonserve.ratelimit{ limit = 100000, window = 1 })",
                "ratelimit: limit 100000 is more than a local limit keeps" },
            { "app:use(moonserve.ratelimit{ limit = 5, window = 1, fleet = 42 })",
                "ratelimit: bad fleet" },
            { "app:use(moonserve.ratelimit{ limit = 5, window = 1, fleet = 'http://127.0.0.1' })",
                "ratelimit: bad fleet: redis: " },
            { "app:use(moonserve.sessions{ secret = string.rep('s', 32), store = "
                .. "require('moonserve.session').redis_store('redis://127.0.0.1:notaport') })",
                "bad session store: redis: " },
        }
        for _, c in ipairs(cases) do
            local out, status = check(c[1])
            assert.not_equal(0, status, c[1])
            assert.matches(c[2], out, 1, true)
        end
        local out, status = check("app:use(moonserve.ratelimit{ limit = 5, window = 1 })")
        assert.equal(0, status, out)
    end)

    it("stop a start with the same line", function()
        local file = os.tmpname() .. ".lua"
        helper.write_file(file, "local moonserve = require 'moonserve'\nlocal app = moonserve.app()\n"
            .. "app:use(moonserve.ratelimit{ limit = 5, window = -1 })\nreturn app\n")
        local ok, err = pcall(helper.spawn_server, { app = file })
        os.remove(file)
        assert.is_false(ok)
        assert.matches("ratelimit: bad window %-1", err)
    end)
end)
