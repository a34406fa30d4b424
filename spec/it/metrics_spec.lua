-- spec/it/metrics_spec.lua: the scrape of a real server with two workers, read with
-- prometheus_client's own text parser: exact counts summed across the workers, cumulative
-- buckets, the app's metrics, escaped label values, and the listener kept apart.
local helper = require "helper"
local cjson = require "cjson"

local function q(s)
    return "'" .. s:gsub("'", "'\\''") .. "'"
end

-- One request on a connection of its own (so that the kernel spreads them over the
-- workers); returns the response.
local function request(port, method, path, extra)
    local s = helper.connect(port)
    assert(s:send(method .. " " .. path .. " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
        .. (extra or "") .. "\r\n"))
    local res = assert(helper.read_response(s, method == "HEAD"))
    s:close()
    return res
end

-- The scrape at port/path, parsed: the raw text and the samples.
local function scrape(port, path)
    local res = request(port, "GET", path or "/metrics")
    assert.equal(200, res.status)
    assert.equal("text/plain; version=0.0.4; charset=utf-8", res.headers["content-type"])
    local file = os.tmpname()
    local f = assert(io.open(file, "wb"))
    f:write(res.body)
    f:close()
    local out, status = helper.run(helper.tool("prometheus_client") .. " "
        .. q(helper.root .. "/spec/fixtures/prom_parse.py") .. " <" .. q(file) .. " 2>&1")
    os.remove(file)
    assert(status == 0, "the parser refused the scrape: " .. out .. "\n" .. res.body)
    return res.body, cjson.decode(out)
end

-- The value of the sample `name` whose labels include `labels`, or nil.
local function value(samples, name, labels)
    for _, s in ipairs(samples) do
        if s.name == name then
            local ok = true
            for k, v in pairs(labels or {}) do
                ok = ok and s.labels[k] == v
            end
            if ok then
                return s.value
            end
        end
    end
    return nil
end

local function all(samples, name)
    local t = {}
    for _, s in ipairs(samples) do
        if s.name == name then
            t[#t + 1] = s
        end
    end
    return t
end

describe("metrics", function()
    local srv, mport
    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/metrics.lua",
            args = "--workers 2 --metrics 127.0.0.1:0" }
        mport = srv.ports[2]
    end)
    teardown(function()
        srv:stop()
    end)

    it("count every request exactly, summed across the workers", function()
        local _, before = scrape(mport)
        local h0 = value(before, "moonserve_http_requests_total",
            { route = "hello", method = "GET", status = "2xx" }) or 0
        local n = 60
        for i = 1, n do
            assert.equal(200, request(srv.port, "GET", "/hello").status)
            if i % 3 == 0 then
                assert.equal(200, request(srv.port, "GET", "/users/" .. i).status)
            end
        end
        assert.equal(404, request(srv.port, "GET", "/nowhere").status)
        assert.equal(500, request(srv.port, "GET", "/fail").status)
        local _, s = scrape(mport)
        assert.equal(h0 + n, value(s, "moonserve_http_requests_total",
            { route = "hello", method = "GET", status = "2xx" }))
        assert.equal(n / 3, value(s, "moonserve_http_requests_total",
            { route = "/users/:id", method = "GET", status = "2xx" }))
        assert.equal(1, value(s, "moonserve_http_requests_total",
            { route = "/fail", method = "GET", status = "5xx" }))
        assert.is_true(value(s, "moonserve_http_requests_total",
            { route = "", method = "GET", status = "4xx" }) >= 1)
        -- Both workers served some, and the sum is theirs.
        local per = all(s, "moonserve_worker_requests_total")
        assert.equal(2, #per)
        local sum = 0
        for _, w in ipairs(per) do
            assert.is_true(w.value > 0, "worker " .. w.labels.worker .. " served none")
            sum = sum + w.value
        end
        assert.equal(value(s, "moonserve_requests_total"), sum)
        -- The app's counter, incremented in both workers, is one sum.
        assert.equal(value(before, "app_hits_total", { kind = "plain" }) or 0,
            value(s, "app_hits_total", { kind = "plain" }) - n)
        -- Bytes in and out grew; the scrape's own connection is open now.
        assert.is_true(value(s, "moonserve_http_request_bytes_total") >
            value(before, "moonserve_http_request_bytes_total"))
        assert.is_true(value(s, "moonserve_http_response_bytes_total") >=
            value(before, "moonserve_http_response_bytes_total") + n * 6)
        assert.is_true(value(s, "moonserve_connections", { protocol = "http/1.1" }) >= 1)
        -- (An accept that found nothing, the other worker having taken the connection, is
        -- neither accepted nor closed.)
        for _, w in ipairs(all(s, "moonserve_worker_connections_closed_total")) do
            assert.is_true(w.value < value(s, "moonserve_worker_connections_accepted_total",
                { worker = w.labels.worker }) + 1, "worker " .. w.labels.worker
                .. " closed more connections than it accepted")
        end
        assert.equal(0, value(s, "moonserve_connections", { protocol = "h2" }))
        assert.is_true(value(s, "moonserve_lua_memory_bytes") > 0)
        assert.is_true(value(s, "moonserve_shared_dict_capacity_bytes",
            { dict = "moonserve_metrics" }) > 0)
    end)

    it("give a page their main numbers, summed over the workers (metrics.totals)", function()
        local _, before = scrape(mport)
        local res = request(srv.port, "GET", "/totals")
        assert.equal(200, res.status)
        local t = cjson.decode(res.body)
        local _, after = scrape(mport)
        for name, key in pairs { moonserve_requests_total = "requests",
            moonserve_connections_accepted_total = "accepted",
            moonserve_http_response_bytes_total = "bytes_out" } do
            assert.is_true(value(before, name) <= t[key] and t[key] <= value(after, name),
                key .. " " .. t[key] .. " is not between two scrapes")
        end
        assert.equal(2, t.workers)
        assert.is_true(t.connections >= 1)      -- its own
        assert.is_true(t.in_flight >= 1)
    end)

    it("have cumulative latency buckets whose count is the requests'", function()
        for _ = 1, 10 do
            request(srv.port, "GET", "/hello")
        end
        local _, s = scrape(mport)
        local buckets = all(s, "moonserve_http_request_duration_seconds_bucket")
        assert.equal(15, #buckets)
        local prev = 0
        for _, b in ipairs(buckets) do
            assert.is_true(b.value >= prev, "bucket le=" .. b.labels.le .. " fell")
            prev = b.value
        end
        assert.equal("+Inf", buckets[#buckets].labels.le)
        assert.equal(prev, value(s, "moonserve_http_request_duration_seconds_count"))
        assert.is_true(value(s, "moonserve_http_request_duration_seconds_sum") > 0)
        -- Every request the routes counted is in the histogram, and no other.
        local routed = 0
        for _, r in ipairs(all(s, "moonserve_http_requests_total")) do
            routed = routed + r.value
        end
        assert.equal(routed, prev)
    end)

    it("sum the app's histograms and gauges across the workers", function()
        for _, v in ipairs({ 5, 50, 50, 500, 5000 }) do
            assert.equal(201, request(srv.port, "POST", "/size/" .. v, "Content-Length: 0\r\n")
                .status)
        end
        assert.equal(200, request(srv.port, "GET", "/level/7").status)
        local _, s = scrape(mport)
        assert.equal(1, value(s, "app_size_bytes_bucket", { le = "10" }))
        assert.equal(3, value(s, "app_size_bytes_bucket", { le = "100" }))
        assert.equal(4, value(s, "app_size_bytes_bucket", { le = "1000" }))
        assert.equal(5, value(s, "app_size_bytes_bucket", { le = "+Inf" }))
        assert.equal(5, value(s, "app_size_bytes_count"))
        assert.equal(5605, value(s, "app_size_bytes_sum"))
        assert.equal(7, value(s, "app_level"))
        assert.equal(5, value(s, "moonserve_http_requests_total",
            { route = "size", method = "POST", status = "2xx" }))
    end)

    it("count static files, which never enter Lua, and the file cache's hits and misses",
        function()
        local _, before = scrape(mport)
        for _ = 1, 6 do
            assert.equal(200, request(srv.port, "GET", "/files/form.html").status)
        end
        local _, s = scrape(mport)
        local function grew(name)
            return value(s, name) - value(before, name)
        end
        assert.equal(6, grew("moonserve_static_cache_hits_total")
            + grew("moonserve_static_cache_misses_total"))
        assert.is_true(grew("moonserve_static_cache_hits_total") >= 4) -- a miss per worker at most
        -- Counted with no route: the six files, and the scrape before (which ended after it
        -- was written).
        local none = { route = "", method = "GET", status = "2xx" }
        assert.equal(7, value(s, "moonserve_http_requests_total", none)
            - value(before, "moonserve_http_requests_total", none))
    end)

    it("escape label values", function()
        local kind = 'a"b\\c'
        local esc = kind:gsub("[^%w]", function(c) return string.format("%%%02X", c:byte()) end)
        assert.equal(200, request(srv.port, "GET", "/hello?kind=" .. esc .. "%0Ad").status)
        local text, s = scrape(mport)
        assert.equal(1, value(s, "app_hits_total", { kind = kind .. "\nd" }))
        assert.truthy(text:find('app_hits_total{kind="a\\"b\\\\c\\nd"} 1', 1, true))
    end)

    it("count refusals by the status the core answers with", function()
        local _, before = scrape(mport)
        local res = request(srv.port, "GET", "/hello", "Expect: a-miracle\r\n")
        assert.equal(417, res.status)
        local _, s = scrape(mport)
        assert.equal((value(before, "moonserve_refused_requests_total", { status = "417" })) + 1,
            value(s, "moonserve_refused_requests_total", { status = "417" }))
        assert.equal(1, value(s, "moonserve_http_requests_total",
            { route = "", method = "GET", status = "4xx" }) - value(before,
            "moonserve_http_requests_total", { route = "", method = "GET", status = "4xx" }))
    end)

    it("never fall at a reload, and count the new workers on from the old", function()
        for _ = 1, 20 do
            request(srv.port, "GET", "/hello")
        end
        local _, before = scrape(mport)
        local hello = value(before, "moonserve_http_requests_total",
            { route = "hello", method = "GET", status = "2xx" })
        local took = select(2, srv:log():gsub("took over", ""))
        os.execute("kill -HUP " .. srv.pid)
        assert.truthy(helper.wait_for(function()
            return select(2, srv:log():gsub("took over", "")) >= took + 2
                and select(2, srv:log():gsub("finished draining", "")) >= took + 2
        end), "the new workers did not take over:\n" .. srv:log())
        for _ = 1, 10 do
            request(srv.port, "GET", "/hello")
        end
        local _, s = scrape(mport)
        assert.equal(hello + 10, value(s, "moonserve_http_requests_total",
            { route = "hello", method = "GET", status = "2xx" }))
        assert.is_true(value(s, "moonserve_requests_total") >=
            value(before, "moonserve_requests_total") + 10)
        assert.equal(2, #all(s, "moonserve_worker_requests_total"))
        -- The old workers are gone: only the scrape's connection is open, and no request but
        -- the scrape is in flight.
        assert.equal(1, value(s, "moonserve_connections", { protocol = "http/1.1" }))
        assert.equal(1, value(s, "moonserve_requests_in_flight"))
    end)

    it("are served on their own listener only, and by a route the app mounts", function()
        assert.equal(404, request(srv.port, "GET", "/metrics").status)
        assert.equal(404, request(mport, "GET", "/hello").status)
        local text = scrape(srv.port, "/scrape")
        assert.truthy(text:find("moonserve_http_requests_total", 1, true))
    end)
end)

describe("metrics in one process", function()
    it("are on with a route that mounts the handler, and off without", function()
        local srv = helper.spawn_server { app = "spec/fixtures/metrics.lua" }
        local plain
        finally(function()
            srv:stop()
            if plain then plain:stop() end
        end)
        for _ = 1, 3 do
            request(srv.port, "GET", "/hello")
        end
        local _, s = scrape(srv.port, "/scrape")
        assert.equal(3, value(s, "moonserve_http_requests_total",
            { route = "hello", method = "GET", status = "2xx" }))
        assert.equal(1, #all(s, "moonserve_worker_requests_total"))
        plain = helper.spawn_server { app = "spec/fixtures/app.lua" }
        assert.equal(404, request(plain.port, "GET", "/metrics").status)
    end)

    it("count open connections by protocol: HTTP/2 ones, and TLS ones besides", function()
        local dir = os.tmpname()
        os.remove(dir)
        helper.sh("mkdir -p " .. q(dir))
        helper.sh(string.format("%s req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
            .. "-keyout %s -out %s -days 2 -subj /CN=localhost 2>&1", helper.tool("openssl"),
            q(dir .. "/m.key"), q(dir .. "/m.pem")))
        local srv = helper.spawn_server { app = "spec/fixtures/metrics.lua", args = string.format(
            "--listen 127.0.0.1:0 --tls-cert %s --tls-key %s", q(dir .. "/m.pem"),
            q(dir .. "/m.key")) }
        local h2c, held
        finally(function()
            if h2c then h2c:close() end
            if held then helper.stop_pid(held) end
            srv:stop()
            helper.sh("rm -rf " .. q(dir))
        end)
        -- An HTTP/2 connection by prior knowledge (the preface and empty SETTINGS), held open.
        h2c = helper.connect(srv.port)
        assert(h2c:send("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\4\0\0\0\0\0"))
        assert(h2c:receive(9)) -- the server's SETTINGS: the session is made
        -- A TLS connection that agreed on h2 and sent its preface, held open by a client
        -- that waits.
        held = helper.background(string.format("(printf 'PRI * HTTP/2.0\\r\\n\\r\\nSM"
            .. "\\r\\n\\r\\n\\0\\0\\0\\4\\0\\0\\0\\0\\0'; sleep 5) | %s s_client "
            .. "-connect 127.0.0.1:%d -alpn h2 -quiet", helper.tool("openssl"), srv.ports[2]))
        local s
        assert.truthy(helper.wait_for(function()
            s = select(2, scrape(srv.port, "/scrape"))
            return value(s, "moonserve_connections", { protocol = "tls" }) == 1
                and value(s, "moonserve_connections", { protocol = "h2" }) == 2
        end, 5), "h2 and tls connections: " .. tostring(s and value(s, "moonserve_connections",
            { protocol = "h2" })) .. ", " .. tostring(s and value(s, "moonserve_connections",
            { protocol = "tls" })))
        assert.equal(1, value(s, "moonserve_connections", { protocol = "http/1.1" })) -- the scrape
    end)
end)

local BIN = os.getenv("MOONSERVE_BIN") or (helper.root .. "/lua/bin/moonserve")

describe("metrics options", function()
    local function moonserve(args)
        return helper.run(BIN .. " " .. q(helper.root .. "/spec/fixtures/metrics.lua") .. " "
            .. args .. " 2>&1")
    end

    it("are checked by --check, and a mistake is named", function()
        local out, status = moonserve("--check --metrics 127.0.0.1:9145")
        assert.equal(0, status, out)
        out, status = moonserve("--check --metrics nowhere")
        assert.equal(2, status, out)
        assert.matches("^moonserve: %-%-metrics needs ADDR:PORT", out)
        local app = require("moonserve").app()
        local ok, err = pcall(app.run, app, { metrics = { lissen = "127.0.0.1:0" }, workers = 0 })
        assert.is_false(ok)
        assert.matches("unknown metrics option lissen %(accepted: listen, app_bytes%)", err)
        ok, err = pcall(app.run, app, { metrics = { app_bytes = "lots" }, workers = 0 })
        assert.is_false(ok)
        assert.matches("bad metrics.app_bytes: ", err)
    end)
end)
