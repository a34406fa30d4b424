-- spec/it/redis_dict_spec.lua: shared dictionaries on Redis (spec/fixtures/redis_dict.lua)
-- served by two moonserve instances and by nginx through the adapter, against a real
-- redis-server with an ACL user; a second Redis with a replica and a Sentinel for a failover.
local helper = require "helper"

local BIN = os.getenv("MOONSERVE_BIN") or (helper.root .. "/lua/bin/moonserve")
local socket = require "socket"

local function q(s)
    return "'" .. s:gsub("'", "'\\''") .. "'"
end

describe("a shared dictionary on Redis", function()
    local redis_server = helper.tool("redis-server")
    local rport, url
    local pids = {}
    local a, b, dir

    local function start_redis(port, args)
        return (helper.redis_server(port, args, dir))
    end

    -- The primary: the spec's own connections log in as the default user (no password); the
    -- instances as "fleet", an ACL user with a password.
    local function start_primary()
        pids.primary = start_redis(rport, "--user fleet on " .. q(">fleet-pw") .. " '~spec:*' '&*' "
            .. "'+@all'")
        helper.wait_port(rport)
    end

    local function spawn(args, env)
        env = env or {}
        env.REDIS_URL = env.REDIS_URL or url
        return helper.spawn_server { app = "spec/fixtures/redis_dict.lua", env = env,
            args = args }
    end

    setup(function()
        dir = helper.sh(helper.tool("mktemp") .. " -d"):gsub("%s+$", "")
        rport = helper.free_port()
        url = "redis://fleet:fleet-pw@127.0.0.1:" .. rport
        start_primary()
        a = spawn()
        b = spawn("--limit redis_value_bytes=100")
    end)

    teardown(function()
        for _, s in ipairs { a, b } do
            s:stop()
        end
        for _, pid in pairs(pids) do
            helper.stop_pid(pid)
        end
        os.execute(helper.tool("rm") .. " -rf " .. q(dir))
    end)

    local function get(srv, path)
        local out = helper.curl("-w '\\n%{http_code}' " .. q("http://127.0.0.1:" .. srv.port
            .. path))
        local body, code = out:match("^(.*)\n(%d+)$")
        assert(body, out)
        return tonumber(code), body
    end

    local function redis(line, port)
        return helper.redis_cmd(port or rport, line)
    end

    local function calls(cmd)
        return tonumber(redis("INFO commandstats"):match("cmdstat_" .. cmd .. ":calls=(%d+)"))
            or 0
    end

    it("answers every method as a local dictionary does", function()
        for _ = 1, 2 do -- (twice: what the first run leaves must not change the second)
            local code, near = get(a, "/all?d=near")
            assert.equal(200, code, near)
            local fleet
            code, fleet = get(a, "/all?d=fleet")
            assert.equal(200, code, fleet)
            -- The one documented difference: Redis frees a value when it expires, so there is
            -- never a stale one to give.
            assert.matches("\nget_stale expired: soon nil true\n", near, 1, true)
            assert.matches("\nget_stale expired: nil nil\n", fleet, 1, true)
            assert.equal((near:gsub("\nget_stale expired: [^\n]*", "")),
                (fleet:gsub("\nget_stale expired: [^\n]*", "")))
            assert.matches("get table: {n=3,name=ada,roles={1=admin,2=ops}} nil\n", fleet, 1,
                true)
        end
        -- logged in as the ACL user, and kept its connections
        assert.matches("user=fleet", redis("CLIENT LIST"))
    end)

    it("is one dictionary for both instances, ngx.shared included", function()
        assert.equal("true nil", select(2, get(a, "/set?k=shared&v=from%20a")))
        assert.equal("from a", select(2, get(b, "/get?k=shared")))
        assert.equal("true via ngx.shared", select(2, get(b, "/ngx")))
        assert.equal("via ngx.shared", select(2, get(a, "/get?k=from_ngx")))
        -- (the values live in Redis under the prefix, tagged)
        assert.equal("sfrom a\r\n", redis("GET spec:fleet:shared"))
    end)

    it("counts exactly under concurrent incr from both instances", function()
        redis("DEL spec:fleet:load")
        local h2load = helper.tool("h2load")
        local runs = {}
        for i, srv in ipairs { a, b } do
            runs[i] = io.popen(string.format("%s --h1 -n 3000 -c 16 -t 1 %s 2>&1", h2load,
                q("http://127.0.0.1:" .. srv.port .. "/incr?k=load")))
        end
        local done = 0
        for _, p in ipairs(runs) do
            local out = p:read("*a")
            p:close()
            local ok = tonumber(out:match("status codes: (%d+) 2xx"))
            assert.equal(3000, ok, out)
            done = done + ok
        end
        assert.equal(done .. "\r\n", redis("GET spec:fleet:load"))
    end)

    it("refuses keys and values beyond the limits before sending anything", function()
        local sets = calls("set")
        assert.equal("false key too long (65536 bytes; redis_key_bytes is 65535)",
            select(2, get(a, "/set?kn=65536&v=x")))
        assert.equal("false value too large (1048577 bytes stored; redis_value_bytes is 1048576)",
            select(2, get(a, "/set?k=big&n=1048576")))
        -- --limit redis_value_bytes=100 on b
        assert.equal("false value too large (201 bytes stored; redis_value_bytes is 100)",
            select(2, get(b, "/set?k=big&n=200")))
        assert.equal(sets, calls("set"))
        assert.equal("true nil", select(2, get(a, "/set?k=big&n=200")))
        assert.equal(sets + 1, calls("set"))
    end)

    it("keeps a local cache coherent across instances, and purges it after an outage",
        function()
        local c1 = spawn(nil, { REDIS_CACHE = "1" })
        local c2 = spawn(nil, { REDIS_CACHE = "1" })
        assert.equal("true nil", select(2, get(c1, "/set?d=cached&k=ck&v=one")))
        socket.sleep(1) -- (the write's own invalidation reaches c2 first)
        assert.equal("one", select(2, get(c2, "/get?d=cached&k=ck")))
        -- served from c2's cache: no GET reaches Redis, and a write behind the
        -- dictionary's back is not seen (for up to the cache's ttl)
        local gets = calls("get")
        redis("SET spec:cached:ck stwo")
        for _ = 1, 3 do
            assert.equal("one", select(2, get(c2, "/get?d=cached&k=ck")))
        end
        assert.equal(gets, calls("get"))
        -- a write through the dictionary on c1 reaches c2's cache at once
        local t0 = socket.gettime()
        assert.equal("true nil", select(2, get(c1, "/set?d=cached&k=ck&v=three")))
        assert.is_true(helper.wait_for(function()
            return select(2, get(c2, "/get?d=cached&k=ck")) == "three"
        end, 2), c2:log():sub(-500))
        local took = socket.gettime() - t0
        assert.is_true(took < 1, "took " .. took)
        -- after an outage every worker empties its cache (invalidations may have been lost)
        redis("SET spec:cached:ck sfour")
        assert.equal("three", select(2, get(c2, "/get?d=cached&k=ck")))
        helper.stop_pid(pids.primary)
        start_primary()
        redis("SET spec:cached:ck sfive")
        assert.is_true(helper.wait_for(function()
            return select(2, get(c2, "/get?d=cached&k=ck")) == "five"
        end, 10), c2:log():sub(-500))
        for _, c in ipairs { c1, c2 } do
            assert.is_true(c:alive())
            c:stop()
        end
    end)

    it("fails within its timeout while Redis is down, and recovers when it returns", function()
        local c = spawn(nil, { REDIS_TIMEOUT = "0.5" })
        assert.equal(200, (get(c, "/incr?k=down")))
        -- load while Redis dies and comes back
        local load = io.popen(string.format("%s -t1 -c4 -d3s %s 2>&1", helper.tool("wrk"),
            q("http://127.0.0.1:" .. c.port .. "/incr?k=down")))
        socket.sleep(0.5)
        helper.stop_pid(pids.primary)
        local t0 = socket.gettime()
        local code, body = get(c, "/incr?k=down")
        local took = socket.gettime() - t0
        assert.equal(503, code, body)
        assert.is_true(took < 1.5, "took " .. took)
        socket.sleep(0.5)
        start_primary()
        local back
        helper.wait_for(function()
            code, body = get(c, "/incr?k=down")
            back = code == 200
            return back
        end, 3)
        assert.is_true(back, body)
        local out = load:read("*a")
        load:close()
        assert.matches("requests in", out)
        assert.is_true(c:alive())
        assert.is_nil(c:log():find("traceback", 1, true))
        c:stop()
        -- a and b find it again too (the pooled connections died with the old Redis)
        assert.equal(200, (get(a, "/incr?k=after")))
        assert.equal(200, (get(b, "/incr?k=after")))
    end)

    it("follows a Sentinel failover to the new primary", function()
        local p1, p2, sp = helper.free_port(), helper.free_port(), helper.free_port()
        pids.p1 = start_redis(p1)
        pids.p2 = start_redis(p2, "--replicaof 127.0.0.1 " .. p1)
        helper.write_file(dir .. "/sentinel.conf", string.format("port %d\nbind 127.0.0.1\n"
            .. "sentinel monitor mm 127.0.0.1 %d 1\nsentinel down-after-milliseconds mm 1000\n"
            .. "sentinel failover-timeout mm 5000\n", sp, p1))
        pids.sentinel = helper.background(string.format("%s %s --sentinel", redis_server,
            q(dir .. "/sentinel.conf")))
        helper.wait_port(sp)
        helper.wait_port(p2)
        -- (Sentinel knows of the replica once it has asked the primary)
        assert.is_true(helper.wait_for(function()
            return redis("SENTINEL REPLICAS mm", sp):find("^%*1") ~= nil
        end, 10))
        local c = spawn(nil, { REDIS_URL = "redis+sentinel://127.0.0.1:" .. sp .. "/mm",
            REDIS_TIMEOUT = "0.5" })
        for _ = 1, 5 do
            assert.equal(200, (get(c, "/incr?k=fo")))
        end
        assert.matches("^%+OK", redis("SENTINEL FAILOVER mm", sp))
        -- Sentinel's own part (it promotes the replica) is timed apart from the app's: under
        -- load the promotion alone can take seconds.
        assert.is_true(helper.wait_for(function()
            local ok, info = pcall(redis, "INFO replication", p2)
            return ok and info:find("role:master", 1, true) ~= nil
        end, 30), "Sentinel did not promote the replica")
        local t0 = socket.gettime()
        local followed
        helper.wait_for(function()
            -- the write lands on the new primary (a busy server may not answer the spec's own
            -- probe at once: asked again)
            if get(c, "/incr?k=fo") == 200 then
                local got, v = pcall(redis, "GET spec:fleet:fo", p2)
                local n = got and tonumber(v:match("^(%d+)"))
                followed = n and n > 5
            end
            return followed
        end, 15)
        local took = socket.gettime() - t0
        assert.is_true(followed, c:log():sub(-600))
        assert.is_true(took < 5, "took " .. took)
        assert.is_true(c:alive())
        c:stop()
    end)

    it("fails --check and the start with one line for a bad Redis URL or option", function()
        local app = helper.root .. "/spec/fixtures/redis_dict.lua"
        -- { REDIS_URL, REDIS_TIMEOUT, what the one line says } (nil: unset)
        local cases = {
            { "redis://u:hunter2@127.0.0.1/x", nil,
                "shared dictionary 'fleet': redis: bad URL \"redis://u:***@127.0.0.1/x\": db "
                .. "must be a non%-negative integer" },
            { "redis+sentinel://127.0.0.1:1", nil, "MASTER expected" },
            { "redis://127.0.0.1?timeout=soon", nil, "timeout must be a number" },
            { "redis://127.0.0.1", "-1", "timeout must be more than 0" },
            { nil, nil, "shared dictionary 'fleet': redis is nil" },
        }
        finally(function()
            helper.setenv("REDIS_URL", nil)
            helper.setenv("REDIS_TIMEOUT", nil)
        end)
        for _, c in ipairs(cases) do
            helper.setenv("REDIS_URL", c[1])
            helper.setenv("REDIS_TIMEOUT", c[2])
            for _, mode in ipairs { "--check", "--listen 127.0.0.1:0 --workers 0" } do
                local out = helper.run(BIN .. " " .. q(app) .. " " .. mode
                    .. " 2>&1; echo \"exit=$?\"")
                assert.matches(c[3], out)
                assert.matches("exit=[1-9]", out)
                assert.not_matches("hunter2", out)
                assert.not_matches("traceback", out)
                -- one line, then the exit status
                local _, lines = out:gsub("\n", "")
                assert.equal(2, lines, out)
            end
        end
    end)

    it("is the same dictionary inside nginx, through the adapter, its cache kept coherent "
        .. "with the instances'", function()
        local env = { REDIS_URL = url, REDIS_CACHE = "1" }
        local nginx = helper.with_env(env, function()
            return helper.nginx_app { app = "spec/fixtures/redis_dict.lua",
                main = "env REDIS_URL;\nenv REDIS_CACHE;\n", http = "lua_shared_dict near 1m;\n"
                    .. "lua_shared_dict moonserve_fanout 8m;\n"
                    .. "lua_shared_dict moonserve_fanout_state 256k;\n" }
        end)
        local c = spawn(nil, { REDIS_CACHE = "1" })
        local pass, err = pcall(function()
            local code, body = get(nginx, "/all?d=fleet")
            assert.equal(200, code, body .. nginx.log())
            local _, here = get(a, "/all?d=fleet")
            assert.equal(here, body)
            assert.equal("true nil", select(2, get(nginx, "/set?k=nginx&v=from%20nginx")))
            assert.equal("from nginx", select(2, get(a, "/get?k=nginx")))
            -- nginx's worker caches what it reads (a write behind the dictionary's back is
            -- not seen), and a write through an instance's dictionary reaches it
            assert.equal("true nil", select(2, get(c, "/set?d=cached&k=nk&v=one")))
            socket.sleep(1) -- (the write's own invalidation reaches nginx first)
            assert.equal("one", select(2, get(nginx, "/get?d=cached&k=nk")))
            redis("SET spec:cached:nk sbehind")
            assert.equal("one", select(2, get(nginx, "/get?d=cached&k=nk")))
            assert.equal("true nil", select(2, get(c, "/set?d=cached&k=nk&v=two")))
            assert.is_true(helper.wait_for(function()
                return select(2, get(nginx, "/get?d=cached&k=nk")) == "two"
            end, 3), nginx.log())
        end)
        nginx.stop()
        c:stop()
        assert(pass, err)
    end)
end)
