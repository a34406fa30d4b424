-- spec/it/openresty_spec.lua: one app file (spec/fixtures/adapter.lua) on the moonserve server
-- and inside Debian's nginx with its Lua module through moonserve.openresty. Each case's status,
-- body and fields must be the same from both (not Server, Date or framing; an error page's
-- reference is each server's own request id), except the differences the guide lists
-- (docs/guide/openresty.md), which are asserted as such.
local helper = require "helper"

local function free_port()
    return helper.free_port()
end

-- Fields each server frames its messages with, which are not the app's.
local FRAMING = { server = true, date = true, connection = true, ["keep-alive"] = true,
    ["transfer-encoding"] = true }

local CASES = {
    { "GET", "/" },
    { "HEAD", "/" },
    { "GET", "/users/7" },
    { "POST", "/users", body = "" },
    { "GET", "/ctx" },
    { "GET", "/request?a=1&b=2", head = "User-Agent: spec\r\nX-Multi: 1\r\nX-Multi: 2\r\n"
        .. "Cookie: c1=v1; c2=v2\r\n" },
    { "GET", "/cookie" },
    { "GET", "/boom" },
    { "GET", "/empty" },
    -- nginx gives an empty reply with no type its default_type (the guide's table)
    { "GET", "/nothing", known = { "content-type" } },
    { "GET", "/redirect" },
    { "GET", "/render" },
    { "GET", "/accepts", head = "Accept: text/html;q=0.5, application/json\r\n" },
    { "GET", "/accepts", head = "Accept: image/png\r\n" },
    { "POST", "/form", body = "a=1&b=two%20words&c=", type = "application/x-www-form-urlencoded" },
    { "POST", "/form", body = "{}", type = "application/json" }, -- not a form: a 500
    { "POST", "/json", body = '{"x":[1,2]}', type = "application/json" },
    { "POST", "/json", body = "{bad", type = "application/json" },
    { "POST", "/read", body = string.rep("x", 300000) },
    -- chunked: nginx reads it whole first (past its buffer, into a temporary file)
    { "POST", "/read", body = string.rep("y", 300000), chunked = true },
    { "POST", "/small", body = "0123456789abc", chunked = true },
    { "POST", "/small", body = "0123456789" },
    { "POST", "/small", body = "0123456789abc" },
    { "GET", "/stream" },
    { "GET", "/sleep" },
    { "GET", "/threads" },
    { "GET", "/semaphore" },
    { "GET", "/shared" },
    { "GET", "/timer" },
    { "GET", "/socket?port=REDIS" },
    { "GET", "/coroutines" },
    -- nginx's default_type against the ngx layer's text/plain; charset=utf-8 (docs/ngx.md)
    -- and ngx.say streams (chunked) there, where the layer gathers a reply it can
    { "GET", "/ngx?v=1", known = { "content-type", "chunked" } },
    { "POST", "/nested", body = string.rep("n", 100000) },
    { "GET", "/api/who" },
    { "GET", "/missing" },
    { "POST", "/" , body = "" },                                   -- 405 and its Allow
    { "OPTIONS", "/users/7" },
    { "GET", "/users//7/?q=1" },                                   -- the canonical redirect
    { "GET", "/users/7/" },
    { "POST", "/users", body = "", head = "Origin: http://evil.test\r\n" }, -- cross-site
    { "POST", "/users", body = "", head = "Sec-Fetch-Site: cross-site\r\n" },
    { "GET", "/", host = "other.test" },
    -- a static mount: nginx's location serves the file, with its own fields (the guide's table)
    { "GET", "/views/login.html", known = { "content-type", "etag", "vary", "last-modified",
        "accept-ranges", "content-security-policy", "referrer-policy", "x-content-type-options",
        "x-frame-options" } },
    { "GET", "/s/count" },
    { "GET", "/s/login" },
}

local function raw_request(case, redis)
    local method, path = case[1], case[2]:gsub("REDIS", tostring(redis))
    local head = string.format("%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n%s",
        method, path, case.host or "127.0.0.1", case.head or "")
    local body = case.body or ""
    if case.chunked then
        local chunks = {}
        for at = 1, #body, 7000 do
            local piece = body:sub(at, at + 6999)
            chunks[#chunks + 1] = string.format("%x\r\n%s\r\n", #piece, piece)
        end
        head, body = head .. "Transfer-Encoding: chunked\r\n", table.concat(chunks) .. "0\r\n\r\n"
    elseif case.body then
        head = head .. "Content-Length: " .. #body .. "\r\n"
    end
    if case.type then
        head = head .. "Content-Type: " .. case.type .. "\r\n"
    end
    return head .. "\r\n" .. body, method == "HEAD"
end

local cjson = require "cjson"

-- A JSON value as text with its keys in order, so that two encoders' orders compare.
local function canonical(v)
    if type(v) ~= "table" then
        return cjson.encode(v)
    end
    if #v > 0 or next(v) == nil then
        local out = {}
        for i = 1, #v do
            out[i] = canonical(v[i])
        end
        return "[" .. table.concat(out, ",") .. "]"
    end
    local keys = {}
    for k in pairs(v) do
        keys[#keys + 1] = k
    end
    table.sort(keys)
    for i, k in ipairs(keys) do
        keys[i] = cjson.encode(k) .. ":" .. canonical(v[k])
    end
    return "{" .. table.concat(keys, ",") .. "}"
end

-- What the case's answer says, with each server's own parts taken out: framing, each
-- server's request id in an error page, the random parts of session cookies and form tokens,
-- JSON's key order; and the fields the case knows to differ.
local function answer(port, case, redis)
    local raw, head_only = raw_request(case, redis)
    local res = assert(helper.request(port, raw, head_only))
    local fields = {}
    for k, v in pairs(res.headers) do
        if not FRAMING[k] then
            fields[k] = v
        end
    end
    for _, k in ipairs(case.known or {}) do
        fields[k] = nil
    end
    local body = res.body
    local length = fields["content-length"]
    if length and not head_only then
        assert.equal(#body, tonumber(length), "content-length against the body")
    end
    fields["content-length"] = nil -- (an error page's reference is as long as its server's id)
    if fields["content-type"] == "application/json" then
        body = canonical(cjson.decode(body))
    end
    body = body:gsub("reference: %x+", "reference: REF"):gsub('name="_csrf" value="[^"]+"',
        'name="_csrf" value="TOKEN"')
    if fields["set-cookie"] then
        fields["set-cookie"] = fields["set-cookie"]:gsub("session=[^;]+", "session=SEALED")
    end
    local chunked = res.headers["transfer-encoding"] == "chunked"
    for _, k in ipairs(case.known or {}) do
        if k == "chunked" then
            chunked = nil
        end
    end
    return { status = res.status, body = body, fields = fields, chunked = chunked }
end

-- Where two answers differ, a line each ("" when they are the same).
local function differences(a, b)
    local out = {}
    local function differ(what, x, y)
        if x ~= y then
            out[#out + 1] = string.format("%s: moonserve %q, nginx %q", what, tostring(x),
                tostring(y))
        end
    end
    differ("status", a.status, b.status)
    differ("body", a.body, b.body)
    differ("chunked", a.chunked, b.chunked)
    local names = {}
    for k in pairs(a.fields) do names[k] = true end
    for k in pairs(b.fields) do names[k] = true end
    for k in pairs(names) do
        differ(k, a.fields[k], b.fields[k])
    end
    table.sort(out)
    return table.concat(out, "\n")
end

describe("a moonserve app inside nginx through moonserve.openresty", function()
    local srv, nginx, redis_pid, redis

    setup(function()
        redis = free_port()
        redis_pid = helper.background(string.format("%s --port %d --bind 127.0.0.1 --save '' "
            .. "--appendonly no", helper.sh_quote(helper.tool("redis-server")), redis))
        helper.wait_port(redis)
        srv = helper.spawn_server { app = "spec/fixtures/adapter.lua" }
        nginx = helper.nginx_app {
            app = "spec/fixtures/adapter.lua",
            http = "lua_shared_dict adapter 1m;\n",
            init = "{ static = { ['/views'] = '@views' } }",
            locations = "location @views { root " .. helper.root .. "/spec/fixtures; }",
        }
    end)

    teardown(function()
        if srv then srv:stop() end
        if nginx then nginx.stop() end
        helper.stop_pid(redis_pid)
    end)

    for _, case in ipairs(CASES) do
        local name = case[1] .. " " .. case[2] .. (case.host and (" on " .. case.host) or "")
            .. (case.chunked and " (chunked)" or "")
            .. (case.head and (" with " .. case.head:gsub("\r\n", "; ")) or "")
            .. (case.body and #case.body < 40 and (" " .. case.body) or "")
        it("answers " .. name .. " as the moonserve server does", function()
            local a = answer(srv.port, case, redis)
            local b = answer(nginx.port, case, redis)
            assert.equal("", differences(a, b))
        end)
    end

    it("reads a body over HTTP/2, which nginx reads whole first", function()
        local h2 = helper.nginx_app { app = "spec/fixtures/adapter.lua", http2 = true,
            http = "lua_shared_dict adapter 1m;\n", init = "{ static = { ['/views'] = '@views' } }",
            locations = "location @views { root " .. helper.root .. "/spec/fixtures; }" }
        local file = os.tmpname()
        helper.write_file(file, string.rep("z", 200000))
        local out = helper.curl("-s --http2-prior-knowledge -w ' %{http_version} %{http_code}' "
            .. "--data-binary @" .. file .. " http://127.0.0.1:" .. h2.port .. "/read")
        local small = helper.curl("-s --http2-prior-knowledge -w ' %{http_code}' "
            .. "--data-binary @" .. file .. " http://127.0.0.1:" .. h2.port .. "/small")
        os.remove(file)
        h2.stop()
        assert.equal("read 200000 bytes 2 200", out)
        assert.equal("413 Content Too Large\n 413", small)
    end)

    it("refuses OpenResty's phases as app hooks inside nginx, whose own directives run them",
        function()
        local file = os.tmpname()
        helper.write_file(file, [[
local app = require("moonserve").app()
app:ngx_access(function() end)
return app
]])
        local ok, err = pcall(helper.nginx_app, { app = file })
        os.remove(file)
        assert.falsy(ok)
        assert.truthy(tostring(err):find("ngx_access: inside nginx, give nginx.conf's "
            .. "access_by_lua_block the hook", 1, true), err)
    end)

    it("reads moonserve.config and moonserve.secret where init_by_lua loads the app", function()
        local dir = os.tmpname()
        os.remove(dir)
        assert(os.execute("mkdir -m 700 " .. dir .. " && mkdir -m 700 " .. dir .. "/secrets")
            == 0)
        finally(function() os.execute("rm -rf " .. dir) end)
        helper.write_file(dir .. "/config.lua", ([[return { common = { greeting = "hello" },
            production = { greeting = "from nginx", secrets_dir = %q } }]]):format(dir
            .. "/secrets"))
        helper.write_file(dir .. "/secrets/session", string.rep("k", 40) .. "\n")
        assert(os.execute("chmod 600 " .. dir .. "/secrets/session") == 0)
        helper.write_file(dir .. "/app.lua", ([[
require("moonserve.config").setup { file = %q, env = "production" }
local moonserve = require "moonserve"
local app = moonserve.app()
local secret = moonserve.secret("session")
app:get("/config", function(req, res)
    res:json { greeting = moonserve.config.greeting, env = moonserve.env, bytes = #secret }
end)
return app
]]):format(dir .. "/config.lua"))
        local own = helper.nginx_app { app = dir .. "/app.lua" }
        finally(function() own.stop() end)
        local res = assert(helper.request(own.port, "GET /config HTTP/1.1\r\nHost: x\r\n"
            .. "Connection: close\r\n\r\n"))
        assert.same({ greeting = "from nginx", env = "production", bytes = 40 },
            cjson.decode(res.body))
        -- Without the secret, nginx does not start, and says why.
        os.remove(dir .. "/secrets/session")
        local ok, err = pcall(helper.nginx_app, { app = dir .. "/app.lua" })
        assert.falsy(ok)
        assert.truthy(tostring(err):find('secret "session" not found in the production '
            .. "environment", 1, true), err)
    end)

    it("never loads the core's shared object inside nginx", function()
        local maps = helper.read_file("/proc/" .. nginx.pid .. "/maps")
        assert.truthy(maps:find("ngx_http_lua_module", 1, true), "not nginx's Lua module?")
        assert.falsy(maps:find("core.so", 1, true), maps)
        assert.falsy(maps:find("libms_core", 1, true), maps)
    end)

    it("runs the app's on_worker_start hooks and their timers in every nginx worker", function()
        local res = assert(helper.request(nginx.port, "GET /started HTTP/1.1\r\nHost: x\r\n"
            .. "Connection: close\r\n\r\n"))
        assert.same({ by = "on_worker_start", timer = true }, cjson.decode(res.body))
    end)

    it("logs a handler's error with its reference, through nginx's error log", function()
        local res = assert(helper.request(nginx.port, "GET /boom HTTP/1.1\r\nHost: x\r\n"
            .. "Connection: close\r\n\r\n"))
        local ref = res.body:match("reference: (%x+)")
        assert.truthy(ref, res.body)
        assert.truthy(nginx.log():find("%[" .. ref .. "%] GET /boom: [^\n]*kaboom"), nginx.log())
        assert(helper.request(nginx.port, "GET /log HTTP/1.1\r\nHost: x\r\nConnection: close"
            .. "\r\n\r\n"))
        assert.truthy(nginx.log():find("%[warn%][^\n]*adapter warns"), nginx.log())
    end)

    -- (nginx still holds the streamed piece when the error cuts the reply off: the client
    -- gets nothing there, and from the moonserve server what was written; never a whole reply)
    it("cuts off a streamed reply whose handler fails after the head left, as the core does", function()
        for _, port in ipairs({ srv.port, nginx.port }) do
            local s = helper.connect(port)
            assert(s:send("GET /boom_after_write HTTP/1.1\r\nHost: x\r\n\r\n"))
            local all, _, partial = s:receive("*a")
            all = all or partial or ""
            s:close()
            assert.falsy(all:find("\r\n0\r\n\r\n", 1, true), all) -- no last chunk
            assert.falsy(all:find(" 500 ", 1, true), all)
        end
        assert.truthy(nginx.log():find("kaboom late", 1, true))
    end)

    -- What nginx cannot do as the core does (docs/guide/openresty.md): asserted as it is.
    it("refuses trailers with a clear error (nginx's Lua module sends none)", function()
        local res = assert(helper.request(nginx.port, "GET /trailer HTTP/1.1\r\nHost: x\r\n"
            .. "Connection: close\r\n\r\n"))
        assert.equal(500, res.status)
        assert.truthy(nginx.log():find("res:trailer: nginx's Lua module cannot send trailers",
            1, true), nginx.log())
        res = assert(helper.request(srv.port, "GET /trailer HTTP/1.1\r\nHost: x\r\n"
            .. "Connection: close\r\n\r\n"))
        assert.equal(200, res.status)
    end)

    it("serves nothing but 500 when nginx.conf lacks a dictionary or a static mount's location",
        function()
        for _, case in ipairs({
            { conf = { init = "{ static = { ['/views'] = '@views' } }" },
                says = "lua_shared_dict adapter 1024k;" },
            { conf = { http = "lua_shared_dict adapter 1m;\n" }, says = 'app:static("/views")' },
        }) do
            case.conf.app = "spec/fixtures/adapter.lua"
            local bad = helper.nginx_app(case.conf)
            local res = assert(helper.request(bad.port, "GET / HTTP/1.1\r\nHost: x\r\n"
                .. "Connection: close\r\n\r\n"))
            local log = bad.log()
            bad.stop()
            assert.equal(500, res.status)
            assert.truthy(log:find("init_worker_by_lua error: [^\n]*" .. case.says:gsub("%p", "%%%0")), log)
            assert.truthy(log:find("the app is not served: [^\n]*" .. case.says:gsub("%p", "%%%0")), log)
        end
    end)
end)

describe("the guide's app and nginx.conf (docs/guide/openresty.md), as written", function()
    local nginx, work

    setup(function()
        local guide = helper.read_file(helper.root .. "/docs/guide/openresty.md")
        local app = assert(guide:match("## Setting it up.-```lua\n(.-)```"), "no app")
        local conf = assert(guide:match("## Setting it up.-```nginx\n(.-)```"), "no nginx.conf")
        work = helper.sh(helper.tool("mktemp") .. " -d"):gsub("%s+$", "")
        helper.write_file(work .. "/app.lua", app)
        local function put(from, to)
            local n
            conf, n = conf:gsub(from:gsub("%p", "%%%0"), (to:gsub("%%", "%%%%")))
            assert(n == 1, "the guide's nginx block has no " .. from)
        end
        put('"/srv/app.lua"', '"' .. work .. '/app.lua"')
        put("listen 80;", "listen 127.0.0.1:@PORT@;")
        -- (the spec's nginx has moonserve's tree on its path already)
        conf = conf:gsub("\n%s*lua_package_path [^\n]*", "")
        local main, http = conf:match("^(.-)http {\n(.*)}%s*$")
        assert(main and http, conf)
        require("ffi").C.setenv("SESSION_SECRET", string.rep("k", 32), 1)
        nginx = helper.nginx_lua { main = main,
            http = (http:gsub("%%", "%%%%"):gsub("@PORT@", "%%d")) }
    end)

    teardown(function()
        require("ffi").C.unsetenv("SESSION_SECRET")
        if nginx then nginx.stop() end
        if work then
            os.execute("rm -rf " .. helper.sh_quote(work))
        end
    end)

    it("serves the app's routes, its session and its shared dictionary's zone", function()
        local res = assert(helper.request(nginx.port, "GET / HTTP/1.1\r\nHost: x\r\n"
            .. "Connection: close\r\n\r\n"))
        assert.equal(200, res.status, nginx.log())
        assert.equal("hello", res.body)
        res = assert(helper.request(nginx.port, "GET /users/5 HTTP/1.1\r\nHost: x\r\n"
            .. "Connection: close\r\n\r\n"))
        assert.equal('{"id":"5"}', res.body)
        assert.falsy(nginx.log():find("error", 1, true), nginx.log())
    end)
end)
