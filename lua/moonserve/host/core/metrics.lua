--- moonserve/host/core/metrics.lua: metrics in Prometheus' text format (0.0.4): the core's counters,
-- which every worker keeps in its slot of a shared-memory zone (core/process/metrics.h), summed over
-- the workers by whichever answers the scrape; and the app's own counters, gauges and
-- histograms, kept in a shared dictionary so that they too are the whole server's.
--
-- `Metric`: A counter, gauge or histogram of the app's (metrics.counter, gauge, histogram).
-- @module moonserve.metrics
local ffi = require "ffi"

local C -- the core, loaded on first use: the app's metrics are declared before it is needed
local concat, format, sort = table.concat, string.format, table.sort
local find, gsub, tostring, type = string.find, string.gsub, tostring, type

local _M = {}

-- The dictionary that holds the app's metrics, and its size unless metrics.app_bytes says.
_M.DICT = "moonserve_metrics"
_M.DICT_BYTES = 4 * 1024 * 1024

local GENERATIONS = 4 -- MS_METRICS_GENERATIONS
local NBUCKETS = 14   -- MS_METRICS_NBUCKETS
local METHODS = { "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "other" }
local NMETHODS, NCLASSES = 8, 5
local REFUSALS = { "400", "405", "408", "413", "414", "417", "431", "501", "505", "other" }

local function load_core()
    if C then
        return
    end
    C = require("moonserve.host.core.base").C
    if not pcall(ffi.typeof, "ms_metrics_block_t") then
        ffi.cdef [[
typedef struct ms_metrics_block_s {
    uint64_t accepted, closed, requests, bad_requests, refused_conns, refused_busy, timeouts;
    uint64_t conns, in_flight;
    uint64_t pid;
    uint64_t conns_proto[3];
    uint64_t bytes_in, bytes_out;
    uint64_t refused[10];
    uint64_t static_hits, static_misses;
    uint64_t pool_idle;
    uint64_t lua_bytes;
    uint64_t latency[15];
    uint64_t latency_sum_us;
    uint64_t nroutes, names_len;
} ms_metrics_block_t;
typedef struct ms_metrics_zone_s {
    uint64_t magic, version, nslots, routes_max, slot_size, names_off, counts_off;
} ms_metrics_zone_t;
ms_metrics_zone_t *ms_server_metrics_zone(ms_server_t *s);
ms_metrics_block_t *ms_metrics_slot(ms_metrics_zone_t *z, int i);
uint64_t *ms_metrics_counts(ms_metrics_zone_t *z, int i);
const uint32_t *ms_metrics_buckets(void);
]]
    end
end

-- -- Text -------------------------------------------------------------------------------

-- A label value as the format has it: backslash, double quote and line feed escaped.
local ESC = { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }
local function escape(v)
    return (gsub(tostring(v), '[\\"\n]', ESC))
end
--- A label value escaped for the text format (`\\`, `\"`, `\n`).
-- @local
_M.escape = escape

-- HELP text escapes backslash and line feed only.
local function help_text(s)
    return (gsub(s, "[\\\n]", ESC))
end

-- A number as the format has it: integers without a fraction, +Inf, NaN.
local function num(v)
    if v ~= v then
        return "NaN"
    elseif v == math.huge then
        return "+Inf"
    elseif v == -math.huge then
        return "-Inf"
    elseif v % 1 == 0 and v > -2 ^ 53 and v < 2 ^ 53 then
        return format("%d", v)
    end
    for digits = 15, 16 do -- the shortest text that reads back as the same number
        local t = format("%." .. digits .. "g", v)
        if tonumber(t) == v then
            return t
        end
    end
    return format("%.17g", v)
end
--- A sample value as the text format writes it (`+Inf`, `NaN`, integers without `.0`).
-- @local
_M.number = num

local function family(out, name, kind, help)
    out[#out + 1] = "# HELP " .. name .. " " .. help_text(help) .. "\n# TYPE " .. name .. " "
        .. kind .. "\n"
end

local function sample(out, name, labels, v)
    out[#out + 1] = name .. (labels ~= "" and "{" .. labels .. "}" or "") .. " " .. num(v) .. "\n"
end

-- -- The app's metrics ------------------------------------------------------------------

local registry = {} -- by name: the metric objects, in the order declared
local order = {}
local local_store = {} -- where values go when no dictionary is attached (one process, tests)

local NAME = "^[a-zA-Z_:][a-zA-Z0-9_:]*$"
local LABEL = "^[a-zA-Z_][a-zA-Z0-9_]*$"

-- The core's own families, which the app may not take.
local RESERVED = "^moonserve_"

local dicts -- moonserve.shared's dictionaries, once loaded
local function store()
    if not dicts then
        dicts = require("moonserve.shared").dicts
    end
    return dicts[_M.DICT]
end

local function store_incr(key, v)
    local d = store()
    if d then
        local _, err = d:incr(key, v, 0)
        if err then
            return nil, err
        end
        return true
    end
    local_store[key] = (local_store[key] or 0) + v
    return true
end

local function store_set(key, v)
    local d = store()
    if d then
        return d:set(key, v)
    end
    local_store[key] = v
    return true
end

-- Every (key, value) of the store.
local function store_items()
    local d = store()
    local items = {}
    if d then
        for _, k in ipairs(d:get_keys(0)) do
            local v = d:get(k)
            if type(v) == "number" then
                items[k] = v
            end
        end
    else
        for k, v in pairs(local_store) do
            items[k] = v
        end
    end
    return items
end

local Metric = {}
Metric.__index = Metric

-- The key of one series: the name, then each label value, each followed by a byte 1 (which
-- no name has, and a value may not have).
local function series_key(self, level, ...)
    local n = select("#", ...)
    local nl = #self.labels
    if n ~= nl then
        error(format("metric %s takes %d label value%s (%s), not %d", self.name, nl,
            nl == 1 and "" or "s", concat(self.labels, ", "), n), level + 1)
    end
    local parts = { self.name }
    for i = 1, n do
        local v = select(i, ...)
        if type(v) ~= "string" and type(v) ~= "number" then
            error(format("bad value of label %s of %s (a string or number expected)",
                self.labels[i], self.name), level + 1)
        end
        v = tostring(v)
        if find(v, "\1", 1, true) then
            error(format("bad value of label %s of %s (a byte 1 in it)", self.labels[i],
                self.name), level + 1)
        end
        parts[i + 1] = v
    end
    return concat(parts, "\1") .. "\1"
end

local function check_value(self, v, level)
    if type(v) ~= "number" or v ~= v then
        error("bad value for " .. self.name .. " (a number expected)", level + 1)
    end
end

--- counter:inc([v, ] label values...): adds v (default 1, never negative).
function Metric:inc(v, ...)
    if self.kind == "histogram" then
        error("a histogram is observed, not incremented: " .. self.name, 2)
    end
    if v == nil then
        v = 1
    end
    check_value(self, v, 2)
    if self.kind == "counter" and v < 0 then
        error("a counter only goes up: " .. self.name .. ":inc(" .. v .. ")", 2)
    end
    return store_incr(series_key(self, 2, ...), v)
end

--- gauge:dec([v, ] label values...)
function Metric:dec(v, ...)
    if self.kind ~= "gauge" then
        error("only a gauge goes down: " .. self.name, 2)
    end
    v = v == nil and 1 or v
    check_value(self, v, 2)
    return store_incr(series_key(self, 2, ...), -v)
end

--- gauge:set(v, label values...): the last set of any worker wins.
function Metric:set(v, ...)
    if self.kind ~= "gauge" then
        error("only a gauge is set: " .. self.name, 2)
    end
    check_value(self, v, 2)
    return store_set(series_key(self, 2, ...), v)
end

--- histogram:observe(v, label values...)
function Metric:observe(v, ...)
    if self.kind ~= "histogram" then
        error("only a histogram observes: " .. self.name, 2)
    end
    check_value(self, v, 2)
    local key = series_key(self, 2, ...)
    local b = self.buckets
    local k = #b + 1
    for i = 1, #b do
        if v <= b[i] then
            k = i
            break
        end
    end
    -- Per bucket, not cumulative: one increment an observation; the scrape adds them up.
    local ok, err = store_incr(key .. "b" .. k, 1)
    if not ok then
        return nil, err
    end
    store_incr(key .. "sum", v)
    return store_incr(key .. "count", 1)
end

local function declare(kind, name, help, label_names, buckets, level)
    if type(name) ~= "string" or not name:match(NAME) or name:match("^__") then
        error("bad metric name " .. tostring(name)
            .. " (letters, digits, '_' and ':', not starting with a digit)", level + 1)
    end
    if name:match(RESERVED) then
        error("metric name " .. name .. " is moonserve's own (moonserve_*)", level + 1)
    end
    if registry[name] then
        error("metric " .. name .. " is declared twice", level + 1)
    end
    if type(help) ~= "string" then
        error("bad help of metric " .. name .. " (a string expected)", level + 1)
    end
    local labels = {}
    if label_names ~= nil and type(label_names) ~= "table" then
        error("bad label names of metric " .. name .. " (a list expected)", level + 1)
    end
    local seen = {}
    for i, l in ipairs(label_names or {}) do
        if type(l) ~= "string" or not l:match(LABEL) or l:match("^__") then
            error("bad label name " .. tostring(l) .. " of metric " .. name
                .. " (letters, digits and '_', not starting with a digit or '__')", level + 1)
        end
        if kind == "histogram" and l == "le" then
            error("a histogram's label cannot be named le: " .. name, level + 1)
        end
        if seen[l] then
            error("label " .. l .. " appears twice in metric " .. name, level + 1)
        end
        seen[l] = true
        labels[i] = l
    end
    local m = setmetatable({ kind = kind, name = name, help = help, labels = labels }, Metric)
    if kind == "histogram" then
        buckets = buckets or { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10 }
        if type(buckets) ~= "table" or #buckets == 0 then
            error("bad buckets of histogram " .. name .. " (a list of numbers expected)", level + 1)
        end
        for i, b in ipairs(buckets) do
            if type(b) ~= "number" or b ~= b or (i > 1 and b <= buckets[i - 1]) then
                error("bad buckets of histogram " .. name .. " (increasing numbers expected)",
                    level + 1)
            end
        end
        m.buckets = {}
        for i, b in ipairs(buckets) do
            m.buckets[i] = b
        end
        if m.buckets[#m.buckets] == math.huge then
            m.buckets[#m.buckets] = nil -- (+Inf is always there)
        end
    end
    registry[name] = m
    order[#order + 1] = name
    return m
end

--- A counter: name, help, { label names }. Returns the metric: m:inc([v, ] values...).
-- @usage local signups = moonserve.metrics.counter("app_signups_total", "Sign-ups.", { "plan" })
-- signups:inc(1, "free")
function _M.counter(name, help, label_names)
    return declare("counter", name, help, label_names, nil, 2)
end

--- A gauge: m:set(v, values...), m:inc([v, ] values...), m:dec([v, ] values...).
function _M.gauge(name, help, label_names)
    return declare("gauge", name, help, label_names, nil, 2)
end

--- A histogram with `buckets` (upper bounds, increasing; default from 5 ms to 10 s):
-- m:observe(v, values...).
-- @usage local h = moonserve.metrics.histogram("app_query_seconds", "Query time.", { "table" })
-- h:observe(0.012, "users")
function _M.histogram(name, help, label_names, buckets)
    return declare("histogram", name, help, label_names, buckets, 2)
end

--- Whether the app declared any metric of its own.
-- @local
function _M.declared()
    return #order > 0
end

--- Forgets every declared metric and value of this process (for tests).
-- @local
function _M.reset()
    registry, order, local_store = {}, {}, {}
end

local function split_key(k)
    local parts = {}
    for p in k:gmatch("([^\1]*)\1") do
        parts[#parts + 1] = p
    end
    return parts, k:match("\1([^\1]*)$")
end

local function label_text(names, values, extra)
    local t = {}
    for i, n in ipairs(names) do
        t[i] = n .. '="' .. escape(values[i]) .. '"'
    end
    if extra then
        t[#t + 1] = extra
    end
    return concat(t, ",")
end

local function app_text(out)
    local items = store_items()
    local by_name = {}
    for k, v in pairs(items) do
        local parts, tail = split_key(k)
        local m = registry[parts[1]]
        if m and #parts == #m.labels + 1 then
            local s = by_name[m.name] or {}
            by_name[m.name] = s
            local lkey = concat(parts, "\1", 2)
            local e = s[lkey]
            if not e then
                e = { values = { select(2, unpack(parts)) }, b = {}, sum = 0, count = 0, v = 0 }
                s[lkey] = e
            end
            if m.kind ~= "histogram" then
                e.v = v
            elseif tail == "sum" then
                e.sum = v
            elseif tail == "count" then
                e.count = v
            elseif tail:match("^b%d+$") then
                e.b[tonumber(tail:sub(2))] = v
            end
        end
    end
    for _, name in ipairs(order) do
        local m = registry[name]
        family(out, name, m.kind, m.help)
        local s = by_name[name] or {}
        local keys = {}
        for k in pairs(s) do
            keys[#keys + 1] = k
        end
        sort(keys)
        if #keys == 0 and #m.labels == 0 then
            -- A series with no labels exists from its declaration on, at 0.
            s[""] = { values = {}, b = {}, sum = 0, count = 0, v = 0 }
            keys[1] = ""
        end
        for _, k in ipairs(keys) do
            local e = s[k]
            if m.kind == "histogram" then
                local acc = 0
                for i = 1, #m.buckets + 1 do
                    acc = acc + (e.b[i] or 0)
                    local le = i <= #m.buckets and num(m.buckets[i]) or "+Inf"
                    sample(out, name .. "_bucket", label_text(m.labels, e.values,
                        'le="' .. le .. '"'), acc)
                end
                sample(out, name .. "_sum", label_text(m.labels, e.values), e.sum)
                sample(out, name .. "_count", label_text(m.labels, e.values), acc)
            else
                sample(out, name, label_text(m.labels, e.values), e.v)
            end
        end
    end
end

-- -- The core's metrics ------------------------------------------------------------------

local zone_of -- the zone this process's server counts into, or nil
local own     -- this worker's block in it

-- Reads the route names slot `i` holds.
local function slot_names(z, i)
    local b = C.ms_metrics_slot(z, i)
    local n = tonumber(b.names_len)
    local names = {}
    if n > 0 then
        local text = ffi.string(ffi.cast("const char *", b) + tonumber(z.names_off), n)
        for name in text:gmatch("([^\n]*)\n") do
            names[#names + 1] = name
        end
    end
    return names
end

--- The app's routes, numbered from 1 the same way in every worker of one app: by their
-- label (name, else path pattern), sorted. Sets each route's metrics_ix; returns the names.
-- @local
function _M.number_routes(the_app)
    local labels, routes = {}, {}
    local function walk(a)
        local r = rawget(a, "router")
        if r and r.all then
            for _, route in ipairs(r.all) do
                local label = route.name or route.path
                routes[#routes + 1] = route
                labels[label] = true
            end
        end
    end
    walk(the_app)
    for _, site in pairs(rawget(the_app, "sites") or {}) do
        walk(site)
    end
    local names = {}
    for l in pairs(labels) do
        names[#names + 1] = l
    end
    sort(names)
    local ix = {}
    for i, n in ipairs(names) do
        ix[n] = i
    end
    for _, route in ipairs(routes) do
        route.metrics_ix = ix[route.name or route.path]
    end
    return names
end

--- The server `srv` counts into the zone it was given (srv:metrics): this worker's names go
-- into its slot. A slot an earlier worker of the same index wrote keeps its counts, moved
-- to where this worker's routes of the same names are (a reload may add or drop routes).
-- @local
function _M.attach(srv, slot, names)
    load_core()
    local home = ffi.cast("ms_server_t *", srv:pointer())
    local z = C.ms_server_metrics_zone(home)
    zone_of, own = z, C.ms_metrics_slot(z, slot)
    local max = tonumber(z.routes_max)
    if #names > max then
        require("moonserve.host.core.base").log(require("moonserve.host.core.base").LOG_WARN,
            format("metrics: %d routes, room for %d (the zone was made at the first start): "
                .. "the rest are counted as no route", #names, max))
        for i = max + 1, #names do
            names[i] = nil
        end
    end
    local old = slot_names(z, slot)
    local counts = C.ms_metrics_counts(z, slot)
    local per = NMETHODS * NCLASSES
    local same = #old == #names
    for i = 1, #names do
        same = same and old[i] == names[i]
    end
    if not same and #old > 0 then
        local keep = {}
        for i, n in ipairs(old) do
            local t = {}
            for k = 0, per - 1 do
                t[k] = counts[i * per + k]
                counts[i * per + k] = 0
            end
            keep[n] = t
        end
        for i, n in ipairs(names) do
            local t = keep[n]
            if t then
                for k = 0, per - 1 do
                    counts[i * per + k] = t[k]
                end
            end
        end
        -- (A route gone since is dropped: its counts would have no name.)
    end
    local text = #names > 0 and concat(names, "\n") .. "\n" or ""
    if #text > 1024 * 1024 then
        error("metrics: the route names take more than 1 MiB", 2)
    end
    ffi.copy(ffi.cast("char *", own) + tonumber(z.names_off), text, #text)
    own.nroutes = #names
    own.names_len = #text
    _M.update_lua()
end

--- Writes this worker's Lua heap into its slot (a timer does once a second).
-- @local
function _M.update_lua()
    if own then
        own.lua_bytes = math.floor(collectgarbage("count") * 1024)
    end
end

local function u(v)
    return tonumber(v)
end

-- One scalar series: name, kind, help, and how to read it from a block.
local SCALARS = {
    { "moonserve_connections_accepted_total", "counter", "Connections accepted.",
        function(b) return u(b.accepted) end },
    { "moonserve_connections_closed_total", "counter", "Connections closed.",
        function(b) return u(b.closed) end },
    { "moonserve_requests_in_flight", "gauge", "Requests in handlers now.",
        function(b) return u(b.in_flight) end },
    { "moonserve_requests_total", "counter", "Requests dispatched (static files too).",
        function(b) return u(b.requests) end },
    { "moonserve_bad_requests_total", "counter", "Requests and connections refused as malformed.",
        function(b) return u(b.bad_requests) end },
    { "moonserve_timeouts_total", "counter", "Connections and streams past a deadline.",
        function(b) return u(b.timeouts) end },
    { "moonserve_refused_connections_total", "counter",
        "Connections closed at accept: over the connections or per_source cap.",
        function(b) return u(b.refused_conns) end },
    { "moonserve_http_request_bytes_total", "counter", "Request heads and bodies, in bytes.",
        function(b) return u(b.bytes_in) end },
    { "moonserve_http_response_bytes_total", "counter", "Reply bodies, in bytes.",
        function(b) return u(b.bytes_out) end },
    { "moonserve_static_cache_hits_total", "counter", "Static files found in the cache.",
        function(b) return u(b.static_hits) end },
    { "moonserve_static_cache_misses_total", "counter", "Static files not in the cache.",
        function(b) return u(b.static_misses) end },
    { "moonserve_socket_pool_idle_connections", "gauge",
        "Outbound connections idle in the socket pools.",
        function(b) return u(b.pool_idle) end },
    { "moonserve_lua_memory_bytes", "gauge", "The Lua heap (collectgarbage 'count').",
        function(b) return u(b.lua_bytes) end },
}

local function pairs_sorted(t)
    local keys = {}
    for k in pairs(t) do
        keys[#keys + 1] = k
    end
    sort(keys)
    local i = 0
    return function()
        i = i + 1
        return keys[i], t[keys[i]]
    end
end

local function core_text(out)
    local z = zone_of
    local nslots = tonumber(z.nslots)
    _M.update_lua()
    -- The slots of each worker index that anyone ever wrote.
    local workers = {}
    local slots = {}
    for i = 0, nslots - 1 do
        local b = C.ms_metrics_slot(z, i)
        if b.pid ~= 0 or b.accepted ~= 0 or b.requests ~= 0 or b.names_len ~= 0 then
            local w = math.floor(i / GENERATIONS)
            workers[w] = workers[w] or {}
            local ws = workers[w]
            ws[#ws + 1] = b
            slots[#slots + 1] = i
        end
    end
    local function total(read, which)
        local s = 0
        for _, b in ipairs(which) do
            s = s + read(b)
        end
        return s
    end
    local all = {}
    for _, i in ipairs(slots) do
        all[#all + 1] = C.ms_metrics_slot(z, i)
    end
    for _, d in ipairs(SCALARS) do
        family(out, d[1], d[2], d[3])
        sample(out, d[1], "", total(d[4], all))
        local wname = gsub(d[1], "^moonserve_", "moonserve_worker_")
        family(out, wname, d[2], d[3] .. " Per worker.")
        for w, bs in pairs_sorted(workers) do
            sample(out, wname, 'worker="' .. w .. '"', total(d[4], bs))
        end
    end
    -- Open connections by protocol.
    local protos = { "http/1.1", "h2", "tls" }
    family(out, "moonserve_connections", "gauge",
        "Open connections by protocol (tls counts those under HTTP/1.1 or h2 too).")
    for k, p in ipairs(protos) do
        sample(out, "moonserve_connections", 'protocol="' .. p .. '"',
            total(function(b) return u(b.conns_proto[k - 1]) end, all))
    end
    family(out, "moonserve_worker_connections", "gauge", "Open connections, per worker.")
    for w, bs in pairs_sorted(workers) do
        sample(out, "moonserve_worker_connections", 'worker="' .. w .. '"',
            total(function(b) return u(b.conns) end, bs))
    end
    -- Refusals by status: the core's answers in a handler's place, each a cap or a rule.
    family(out, "moonserve_refused_requests_total", "counter",
        "Requests the core refused by itself, by status (503: the in_flight cap; 413: "
        .. "body_bytes; 431: head_bytes or headers; 414: target_bytes; 408: a deadline).")
    sample(out, "moonserve_refused_requests_total", 'status="503"',
        total(function(b) return u(b.refused_busy) end, all))
    for k, st in ipairs(REFUSALS) do
        sample(out, "moonserve_refused_requests_total", 'status="' .. st .. '"',
            total(function(b) return u(b.refused[k - 1]) end, all))
    end
    -- Latency: the whole server's, cumulative as the format wants.
    local name = "moonserve_http_request_duration_seconds"
    family(out, name, "histogram", "Time from dispatch to the reply's end.")
    local bounds = C.ms_metrics_buckets()
    local acc = 0
    for k = 0, NBUCKETS do
        acc = acc + total(function(b) return u(b.latency[k]) end, all)
        local le = k < NBUCKETS and num(bounds[k] / 1e6) or "+Inf"
        sample(out, name .. "_bucket", 'le="' .. le .. '"', acc)
    end
    sample(out, name .. "_sum", "", total(function(b) return u(b.latency_sum_us) end, all) / 1e6)
    sample(out, name .. "_count", "", acc)
    -- Requests by route, method and status class, summed by name over every slot.
    local per = NMETHODS * NCLASSES
    local sums = {}
    local labels = {}
    for _, i in ipairs(slots) do
        local names = slot_names(z, i)
        local counts = C.ms_metrics_counts(z, i)
        for r = 0, #names do
            local base = r * per
            local rname = r == 0 and "" or names[r]
            for k = 0, per - 1 do
                local c = counts[base + k]
                if c ~= 0 then
                    local key = rname .. "\1" .. k
                    if not sums[key] then
                        labels[#labels + 1] = key
                        sums[key] = 0
                    end
                    sums[key] = sums[key] + u(c)
                end
            end
        end
    end
    sort(labels)
    name = "moonserve_http_requests_total"
    family(out, name, "counter",
        "Requests answered, by route (\"\": none), method and status class.")
    for _, key in ipairs(labels) do
        local rname, k = key:match("^(.*)\1(%d+)$")
        k = tonumber(k)
        local m = METHODS[math.floor(k / NCLASSES) + 1]
        local cls = (k % NCLASSES) + 1
        out[#out + 1] = name .. '{route="' .. escape(rname) .. '",method="' .. m
            .. '",status="' .. cls .. 'xx"} ' .. num(sums[key]) .. "\n"
    end
    -- The shared dictionaries: one zone each, the same for every worker.
    store() -- (loads moonserve.shared's dictionaries into `dicts`)
    local dnames = {}
    for n in pairs(_M.dict_names or {}) do
        if dicts[n] then
            dnames[#dnames + 1] = n
        end
    end
    sort(dnames)
    family(out, "moonserve_shared_dict_capacity_bytes", "gauge", "A shared dictionary's size.")
    for _, n in ipairs(dnames) do
        sample(out, "moonserve_shared_dict_capacity_bytes", 'dict="' .. escape(n) .. '"',
            dicts[n]:capacity())
    end
    family(out, "moonserve_shared_dict_free_bytes", "gauge", "A shared dictionary's free space.")
    for _, n in ipairs(dnames) do
        sample(out, "moonserve_shared_dict_free_bytes", 'dict="' .. escape(n) .. '"',
            dicts[n]:free_space())
    end
end

--- The core's main numbers summed over the workers, for a page to show: requests (total),
-- in_flight, connections (open), accepted (total), bytes_in, bytes_out, workers (the
-- slots in use). nil while metrics are off.
function _M.totals()
    local z = zone_of
    if not z then
        return nil
    end
    local t = { requests = 0, in_flight = 0, connections = 0, accepted = 0, bytes_in = 0,
        bytes_out = 0, workers = 0 }
    for i = 0, tonumber(z.nslots) - 1 do
        local b = C.ms_metrics_slot(z, i)
        if b.pid ~= 0 or b.accepted ~= 0 or b.requests ~= 0 then
            t.requests = t.requests + u(b.requests)
            t.in_flight = t.in_flight + u(b.in_flight)
            t.connections = t.connections + u(b.conns)
            t.accepted = t.accepted + u(b.accepted)
            t.bytes_in = t.bytes_in + u(b.bytes_in)
            t.bytes_out = t.bytes_out + u(b.bytes_out)
            if b.pid ~= 0 then
                t.workers = t.workers + 1
            end
        end
    end
    return t
end

local sections = {} -- the framework's own families: fn(out, family, sample)

--- Adds fn(out, family, sample) to the scrape, once: a part of the framework with counters of
-- its own (moonserve/fanout.lua) writes its families with the two writers.
-- @local
function _M.section(fn)
    for _, f in ipairs(sections) do
        if f == fn then
            return
        end
    end
    sections[#sections + 1] = fn
end

--- The whole scrape, as text.
function _M.text()
    local out = {}
    if zone_of then
        core_text(out)
    end
    for _, fn in ipairs(sections) do
        fn(out, family, sample)
    end
    app_text(out)
    return concat(out)
end

_M.CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

--- A handler that answers with the scrape: app:get("/metrics", moonserve.metrics.handler).
-- The app's routes that have it turn the core's metrics on.
-- @usage app:get("/metrics", moonserve.metrics.handler)
function _M.handler(_, res)
    res:header("content-type", _M.CONTENT_TYPE)
    res:header("cache-control", "no-store")
    return res:send(_M.text())
end

return _M
