-- spec/it/threads_openresty_spec.lua: moonserve.run_worker_thread and moonserve.password in an
-- app served by Debian's nginx through moonserve.openresty, where jobs run through nginx's own
-- ngx.run_worker_thread on the thread pools of nginx.conf (docs/guide/threads.md, "Inside
-- nginx"). The app is the one spec/it/threads_spec.lua runs on the moonserve server.
local helper = require "helper"

local function esc(s)
    return (s:gsub("[^%w]", function(c) return string.format("%%%02X", c:byte()) end))
end

local function get(port, path, method)
    local res = assert(helper.request(port, (method or "GET") .. " " .. path
        .. " HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
    return res.body, res.status
end

-- The thread_pool line for "default" that the guide's nginx.conf declares.
local function guide_pool()
    local guide = helper.read_file(helper.root .. "/docs/guide/openresty.md")
    local conf = assert(guide:match("## Setting it up.-```nginx\n(.-)```"), "no nginx.conf")
    return assert(conf:match("\n(thread_pool default [^\n]-;)"), "the guide declares no "
        .. "thread_pool default")
end

describe("thread pools and passwords inside nginx through moonserve.openresty", function()
    local nginx

    setup(function()
        nginx = helper.nginx_app { app = "spec/fixtures/threads.lua",
            main = guide_pool() .. "\nthread_pool small threads=1 max_queue=1;\n" }
    end)

    teardown(function()
        if nginx then nginx.stop() end
    end)

    it("maps the default pool to the thread_pool the guide declares", function()
        assert.equal("thread_pool default threads=4 max_queue=1024;", guide_pool())
    end)

    it("runs a function in an nginx thread and returns its results", function()
        assert.equal("true 5", get(nginx.port, "/add"))
        assert.equal("true s true nil {1,one,y}", get(nginx.port, "/echo"))
        assert.equal("true 42", get(nginx.port, "/ngx")) -- nginx's own, as the app wrote it
    end)

    it("returns errors, never raises them: nginx's words for them", function()
        assert.equal("false boom in a thread", get(nginx.port, "/boom"))
        assert.equal("false invalid function", get(nginx.port, "/bad/func"))
        assert.matches("^false module 'no_such_module_here' not found",
            (get(nginx.port, "/bad/module")))
        assert.equal("false unsupported Lua type: LUA_TFUNCTION in the argument",
            get(nginx.port, "/bad/function"))
        assert.equal("false unsupported Lua type: LUA_TFUNCTION in the return value",
            get(nginx.port, "/bad/result"))
        local body, status = get(nginx.port, "/bad/pool")
        assert.equal(200, status)
        assert.equal("false no thread pool named 'nope' in nginx.conf (declare it in its main "
            .. "context: thread_pool nope threads=4 max_queue=1024;)", body)
    end)

    -- lua-nginx-module 0.10.23 ends the worker when nginx's queue is full (it frees the job it
    -- could not queue wrongly); the adapter counts the jobs it gave each pool and answers
    -- past app:thread_pool's max_queue itself (here 1: one job at a time, running or waiting).
    local full = "false queue full (thread pool 'small')"
    it("answers queue full past app:thread_pool's max_queue, and nginx goes on", function()
        for _ = 1, 2 do
            assert.equal(full .. "|" .. full .. "|true true", get(nginx.port, "/full"))
        end
        assert.equal("true 5", get(nginx.port, "/add"))
        assert.falsy(nginx.log():find("free()", 1, true), nginx.log())
    end)

    -- A job whose caller went away (its request ended under it) still runs, or waits in
    -- nginx's queue: its place comes back when its thread says it is over, not when the caller
    -- is collected, or nginx's queue would overflow (and the worker die, as above).
    it("keeps the place of a job whose caller nginx never resumes until the job is over",
        function()
        assert.equal("ended\n", get(nginx.port, "/abandon?ms=1500")) -- the one place
        assert.equal("collected", get(nginx.port, "/gc"))
        assert.equal(full .. "|" .. full .. "|" .. full, get(nginx.port, "/full"))
        -- Once it is over, its place is back.
        local body
        assert.truthy(helper.wait_for(function()
            body = get(nginx.port, "/full")
            return body == full .. "|" .. full .. "|true true"
        end, 10), body)
        assert.falsy(nginx.log():find("free()", 1, true), nginx.log())
    end)

    it("hashes and verifies passwords on the default pool", function()
        local hash, status = get(nginx.port, "/password/hash?pw=s3cret", "POST")
        assert.equal(200, status)
        assert.matches("^%$argon2id%$v=19%$m=19456,t=2,p=1%$[%w+/]+%$[%w+/]+$", hash)
        assert.not_equal(hash, (get(nginx.port, "/password/hash?pw=s3cret", "POST")))
        assert.equal("true false", get(nginx.port, "/password/verify?pw=s3cret&hash="
            .. esc(hash), "POST"))
        assert.equal("false", get(nginx.port, "/password/verify?pw=wrong&hash=" .. esc(hash),
            "POST"))
        local weak = get(nginx.port, "/password/weak?pw=s3cret", "POST")
        assert.equal("true true", get(nginx.port, "/password/verify?pw=s3cret&hash="
            .. esc(weak), "POST"))
        assert.matches("^nil ", (get(nginx.port, "/password/verify?pw=x&hash=nonsense", "POST")))
    end)

    it("never loads the core's shared object for its threads", function()
        local maps = helper.read_file("/proc/" .. nginx.pid .. "/maps")
        assert.truthy(maps:find("libargon2", 1, true), "no hash ran?")
        assert.falsy(maps:find("core.so", 1, true), maps)
    end)

    it("says which directive is missing when nginx.conf declares no default pool", function()
        local bare = helper.nginx_app { app = "spec/fixtures/threads.lua" }
        finally(function() bare.stop() end)
        local body, status = get(bare.port, "/password/hash?pw=x", "POST")
        assert.equal(500, status) -- the fixture asserts the hash
        assert.truthy(bare.log():find("no thread pool named 'default' in nginx.conf (declare "
            .. "it in its main context: thread_pool default threads=4 max_queue=1024;)", 1,
            true), bare.log())
        assert.equal("false no thread pool named 'default' in nginx.conf (declare it in its main "
            .. "context: thread_pool default threads=4 max_queue=1024;)",
            get(bare.port, "/add"))
        assert.truthy(body)
    end)
end)
