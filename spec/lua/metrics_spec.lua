-- spec/lua/metrics_spec.lua: the metrics API (names, labels, buckets, duplicates), the text
-- it renders (escaping, numbers, cumulative buckets), the route numbering and the options.
describe("moonserve.metrics", function()
    local metrics = require "moonserve.metrics"
    local helper = require "helper"
    before_each(function()
        metrics.reset()
    end)

    it("takes names and label names by Prometheus' rules, and refuses the rest", function()
        assert.has_no.errors(function()
            metrics.counter("jobs_done_total", "Jobs.", { "queue", "_kind" })
            metrics.gauge("ns:queue_depth", "Depth.")
        end)
        for _, bad in ipairs({ "9lives", "has-dash", "", "sp ace", "__reserved" }) do
            assert.has_error(function() metrics.counter(bad, "x") end)
        end
        assert.has_error(function() metrics.counter("a_total", "x", { "bad-label" }) end)
        assert.has_error(function() metrics.counter("b_total", "x", { "__x" }) end)
        assert.has_error(function() metrics.counter("c_total", "x", { "k", "k" }) end)
        assert.has_error(function() metrics.histogram("d", "x", { "le" }) end)
        assert.has_error(function() metrics.counter("moonserve_mine", "x") end,
            "metric name moonserve_mine is moonserve's own (moonserve_*)")
    end)

    it("refuses a name declared twice, naming it", function()
        metrics.counter("twice_total", "x")
        assert.has_error(function() metrics.gauge("twice_total", "y") end,
            "metric twice_total is declared twice")
    end)

    it("refuses buckets that do not increase", function()
        assert.has_error(function() metrics.histogram("h1", "x", nil, { 1, 1 }) end)
        assert.has_error(function() metrics.histogram("h2", "x", nil, { 2, 1 }) end)
        assert.has_error(function() metrics.histogram("h3", "x", nil, {}) end)
        assert.has_no.errors(function() metrics.histogram("h4", "x", nil, { 0.1, 1, math.huge }) end)
    end)

    it("checks label values and their number, and that counters only go up", function()
        local c = metrics.counter("req_total", "x", { "a", "b" })
        assert.has_error(function() c:inc(1, "only one") end,
            "metric req_total takes 2 label values (a, b), not 1")
        assert.has_error(function() c:inc(1, "x", {}) end)
        assert.has_error(function() c:inc(-1, "x", "y") end)
        assert.has_error(function() c:set(1, "x", "y") end)
        assert.has_error(function() c:observe(1, "x", "y") end)
    end)

    it("renders counters, gauges and cumulative histograms", function()
        local c = metrics.counter("hits_total", "Hits\nwith a \\ in help.", { "path" })
        local g = metrics.gauge("temp", "Temperature.")
        local h = metrics.histogram("size", "Sizes.", {}, { 1, 10 })
        c:inc(nil, "/a")
        c:inc(2, "/a")
        c:inc(1, 'q"u\\o\nte')
        g:set(21.5)
        g:dec(0.5)
        for _, v in ipairs({ 0.5, 1, 5, 50 }) do
            h:observe(v)
        end
        local text = metrics.text()
        assert.truthy(text:find("# HELP hits_total Hits\\nwith a \\\\ in help.\n", 1, true))
        assert.truthy(text:find("# TYPE hits_total counter\n", 1, true))
        assert.truthy(text:find('hits_total{path="/a"} 3\n', 1, true))
        assert.truthy(text:find('hits_total{path="q\\"u\\\\o\\nte"} 1\n', 1, true))
        assert.truthy(text:find("temp 21\n", 1, true))
        assert.truthy(text:find('size_bucket{le="1"} 2\nsize_bucket{le="10"} 3\n'
            .. 'size_bucket{le="+Inf"} 4\nsize_sum 56.5\nsize_count 4\n', 1, true))
    end)

    it("shows a series with no labels at 0 from its declaration on", function()
        metrics.counter("none_yet_total", "x")
        assert.truthy(metrics.text():find("\nnone_yet_total 0\n", 1, true))
    end)

    it("writes numbers as the format reads them", function()
        assert.equal("3", metrics.number(3))
        assert.equal("0.1", metrics.number(0.1))
        assert.equal("0.0005", metrics.number(500 / 1e6))
        assert.equal("+Inf", metrics.number(math.huge))
        assert.equal("NaN", metrics.number(0 / 0))
    end)

    it("numbers the routes of an app and its sites by label, the same in every worker", function()
        local app = require("moonserve").app()
        app:get("/b", function() end)
        app:get("named", "/x/:id", function() end)
        app:post("/b", function() end)
        app:site("example.org"):get("/a", function() end)
        local names = metrics.number_routes(app)
        assert.same({ "/a", "/b", "named" }, names)
        local names2 = metrics.number_routes(app)
        assert.same(names, names2)
    end)

    it("turns the core's metrics on for an app that mounts the handler", function()
        local server = require "moonserve.server"
        local app = require("moonserve").app()
        app:get("/hello", function() end)
        assert.is_nil(server.metrics_spec({}, app))
        app:get("/metrics", metrics.handler)
        assert.same({ app_bytes = metrics.DICT_BYTES }, server.metrics_spec({}, app))
        assert.same({ listen = "127.0.0.1:9145", app_bytes = metrics.DICT_BYTES },
            server.metrics_spec({ metrics = "127.0.0.1:9145" }, app))
        assert.has_error(function() server.metrics_spec({ metrics = 5 }, app) end)
        assert.has_error(function() server.metrics_spec({ metrics = "nowhere" }, app) end)
        assert.has_error(function() server.metrics_spec({ metrics = { port = 1 } }, app) end,
            "unknown metrics option port (accepted: listen, app_bytes)")
        assert.same({ app_bytes = 1024 * 1024 },
            server.metrics_spec({ metrics = { app_bytes = "1m" } }, app))
    end)

    it("answers the scrape from a route with the format's content type", function()
        metrics.counter("seen_total", "x"):inc()
        local app = require("moonserve").app()
        app:get("/metrics", metrics.handler)
        local status, headers, body = helper.simulate(app, "GET", "/metrics")
        assert.equal(200, status)
        assert.equal("text/plain; version=0.0.4; charset=utf-8", headers["content-type"])
        assert.truthy(body:find("seen_total 1\n", 1, true))
    end)

    it("keeps inc and observe on trace", function()
        -- inc's look-up of its labels and observe's search of the buckets are loops of their
        -- own. Which loop becomes the root trace, theirs or the spec's, depends on the JIT's
        -- hot counters, which are shared by hashed bytecode address: any may. So: traces were
        -- made, and nothing aborted one but the shapes of nested loops (a root trace in an
        -- inner loop cannot return to the outer).
        local function on_trace(log)
            assert.matches("TRACE +%d+ ", log)
            for reason in log:gmatch("TRACE %-%-%- [^\n]- %-%- ([^\n]-) at ") do
                assert.is_truthy(reason == "inner loop in root trace"
                    or reason == "leaving loop in root trace"
                    or reason == "loop unroll limit reached"
                    or reason == "NYI: return to lower frame", reason)
            end
        end
        local c = metrics.counter("fast_total", "x", { "k" })
        on_trace(helper.jit_log(function()
            for _ = 1, 300 do
                c:inc(1, "v")
            end
        end))
        local h = metrics.histogram("fast_seconds", "x", { "k" })
        on_trace(helper.jit_log(function()
            for i = 1, 300 do
                h:observe(i / 100, "v")
            end
        end))
    end)
end)
