-- spec/lua/ngx_spec.lua: the ngx layer's functions that need no request, against OpenResty's
-- documented answers and known vectors; what `require` finds; the errors outside a request.
-- luacheck: globals ngx (OpenResty's global, which moonserve.ngx installs)
describe("moonserve.ngx", function()
    require "moonserve.ngx"

    local function hex(s)
        return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end))
    end

    it("installs one global ngx, whose functions taken at load stay valid", function()
        assert.is_table(ngx)
        local tcp, now = ngx.socket.tcp, ngx.now
        assert.equal(tcp, ngx.socket.tcp)
        assert.equal(now, ngx.now)
        assert.equal(ngx, require "moonserve.ngx")
    end)

    describe("codecs", function()
        it("base64 as nginx: padding, no_padding, nil as '', unpadded input, bad input nil",
            function()
            local cases = { [""] = "", f = "Zg==", fo = "Zm8=", foo = "Zm9v", foob = "Zm9vYg==",
                foobar = "Zm9vYmFy" }
            for plain, coded in pairs(cases) do
                assert.equal(coded, ngx.encode_base64(plain))
                assert.equal(plain, ngx.decode_base64(coded))
            end
            assert.equal("Zg", ngx.encode_base64("f", true))
            assert.equal("", ngx.encode_base64(nil))
            assert.equal("MTI=", ngx.encode_base64(12))
            assert.equal("foob", ngx.decode_base64("Zm9vYg"))
            assert.is_nil(ngx.decode_base64("Zm9vY"))
            assert.is_nil(ngx.decode_base64("Zm9v!"))
            assert.equal("\255\254", ngx.decode_base64(ngx.encode_base64("\255\254")))
            assert.has_error(function() ngx.decode_base64(nil) end, "string argument only")
            assert.has_error(function() ngx.encode_base64("x", 1) end,
                "bad no_padding: boolean expected, got number")
        end)

        it("md5, md5_bin, sha1_bin, hmac_sha1 against known vectors", function()
            assert.equal("d41d8cd98f00b204e9800998ecf8427e", ngx.md5(""))
            assert.equal("d41d8cd98f00b204e9800998ecf8427e", ngx.md5(nil))
            assert.equal("5d41402abc4b2a76b9719d911017c592", ngx.md5("hello"))
            assert.equal("5d41402abc4b2a76b9719d911017c592", hex(ngx.md5_bin("hello")))
            assert.equal("a9993e364706816aba3e25717850c26c9cd0d89d", hex(ngx.sha1_bin("abc")))
            assert.equal("de7c9b85b8b78aa6bc8a7a36f70a90701c9db4d9",
                hex(ngx.hmac_sha1("key", "The quick brown fox jumps over the lazy dog")))
            assert.has_error(function() ngx.hmac_sha1(nil, "x") end,
                "bad argument #1 to 'hmac_sha1' (string expected, got nil)")
        end)

        it("crc32_short and crc32_long give zlib's CRC-32", function()
            assert.equal(0x414fa339, ngx.crc32_short("The quick brown fox jumps over the lazy dog"))
            assert.equal(0x414fa339, ngx.crc32_long("The quick brown fox jumps over the lazy dog"))
            assert.equal(907060870, ngx.crc32_short("hello"))
            assert.equal(0, ngx.crc32_long(""))
        end)

        it("escapes URIs as a component (the default) or a whole URI (type 0)", function()
            assert.equal("a%20b%2Fc%3Fd%26e%3Df~._-%C3%A9", ngx.escape_uri("a b/c?d&e=f~._-é"))
            assert.equal("a%20b%23/c%3F%25", ngx.escape_uri("a b#/c?%", 0))
            assert.equal("", ngx.escape_uri(nil))
            assert.equal("b r56 7", ngx.unescape_uri("b%20r56+7"))
            assert.equal("%zz%4", ngx.unescape_uri("%zz%4"))
        end)

        it("encodes and decodes query arguments as OpenResty", function()
            assert.equal("b%20r=hello%20world&foo=3",
                ngx.encode_args({ foo = 3, ["b r"] = "hello world" }))
            assert.equal("a&c=1&c=2", ngx.encode_args({ a = true, b = false, c = { 1, 2 } }))
            assert.same({ a = { "1", "2" }, b = true, c = "", d = "x y" },
                ngx.decode_args("a=1&a=2&b&c=&=skipped&d=x+y"))
            local t = ngx.decode_args("a=1&b=2&c=3", 2)
            assert.same({ a = "1", b = "2" }, t)
            assert.has_error(function() ngx.encode_args({ a = {} , b = function() end }) end,
                "attempt to use function as query arg value")
        end)

        it("quotes SQL strings as MySQL literals", function()
            assert.equal([['a\'b\"c\\d\n\r\t\0\Z']], ngx.quote_sql_str("a'b\"c\\d\n\r\t\0\26"))
        end)

        it("has ngx.null, the NULL light userdata cjson.null is", function()
            assert.equal(require("cjson").null, ngx.null)
            assert.equal("userdata", type(ngx.null))
        end)
    end)

    describe("time", function()
        it("formats and parses HTTP and cookie times", function()
            assert.equal("Thu, 18 Nov 2010 11:27:35 GMT", ngx.http_time(1290079655))
            assert.equal("Thu, 18-Nov-10 11:27:35 GMT", ngx.cookie_time(1290079655))
            assert.equal("Fri, 01-Jan-2038 00:00:00 GMT", ngx.cookie_time(2145916800))
            assert.equal(1290079655, ngx.parse_http_time("Thu, 18 Nov 2010 11:27:35 GMT"))
            assert.equal(1290079655, ngx.parse_http_time("Thursday, 18-Nov-10 11:27:35 GMT"))
            assert.equal(1290079655, ngx.parse_http_time("Thu Nov 18 11:27:35 2010"))
            assert.is_nil(ngx.parse_http_time("yesterday"))
        end)

        it("reads the wall clock: now to the millisecond, time, today, localtime, utctime",
            function()
            local now, t = ngx.now(), ngx.time()
            assert.is_true(math.abs(now - os.time()) < 2)
            assert.equal(now, math.floor(now * 1000 + 0.5) / 1000)
            assert.is_true(t - os.time() <= 1)
            assert.matches("^%d%d%d%d%-%d%d%-%d%d$", ngx.today())
            assert.matches("^%d%d%d%d%-%d%d%-%d%d %d%d:%d%d:%d%d$", ngx.localtime())
            assert.equal(os.date("!%Y-%m-%d %H:%M", ngx.time()), ngx.utctime():sub(1, 16))
            assert.is_nil(ngx.update_time())
        end)
    end)

    describe("outside a request", function()
        it("is in the init phase, with a ctx of its own", function()
            assert.equal("init", ngx.get_phase())
            ngx.ctx.x = 1
            assert.equal(1, ngx.ctx.x)
        end)

        it("refuses the request API with OpenResty's message", function()
            assert.has_error(function() ngx.say("x") end,
                "API disabled in the context of init_by_lua*")
            assert.has_error(function() return ngx.var.uri end,
                "API disabled in the context of init_by_lua*")
            assert.has_error(function() ngx.header.x = 1 end,
                "API disabled in the context of init_by_lua*")
            assert.has_error(function() return ngx.req.get_headers() end,
                "API disabled in the context of init_by_lua*")
            assert.has_error(function() ngx.exit(200) end)
        end)

        it("logs with nginx's levels and refuses a bad one", function()
            assert.equal(0, ngx.STDERR)
            assert.equal(4, ngx.ERR)
            assert.equal(8, ngx.DEBUG)
            ngx.log(ngx.DEBUG, "spec: ", nil, " ", true, " ", ngx.null)
            assert.has_error(function() ngx.log(9, "x") end, "bad log level: 9")
            assert.has_error(function() ngx.log("x") end,
                "bad argument #1 to 'log' (number expected, got string)")
            assert.has_error(function() ngx.log(ngx.ERR, {}) end,
                "bad argument #2 to 'log' (expected table to have __tostring metamethod)")
        end)
    end)

    it("has OpenResty's constants and config", function()
        assert.equal(0, ngx.OK)
        assert.equal(-1, ngx.ERROR)
        assert.equal(-2, ngx.AGAIN)
        assert.equal(-4, ngx.DONE)
        assert.equal(-5, ngx.DECLINED)
        assert.equal(200, ngx.HTTP_OK)
        assert.equal(302, ngx.HTTP_MOVED_TEMPORARILY)
        assert.equal(404, ngx.HTTP_NOT_FOUND)
        assert.equal(503, ngx.HTTP_SERVICE_UNAVAILABLE)
        assert.equal(2, ngx.HTTP_GET)
        assert.equal("http", ngx.config.subsystem)
        assert.equal(10023, ngx.config.ngx_lua_version)
        assert.equal(1022001, ngx.config.nginx_version)
        assert.is_false(ngx.config.debug)
    end)

    describe("require", function()
        it("finds moonserve's resty.core and ngx.* ahead of Debian's lua-resty-core", function()
            assert.equal("0.1.25", require("resty.core").version)
            assert.is_true(require "resty.core.regex")
            assert.is_function(require("resty.core.base").new_tab)
            local sema = require "ngx.semaphore"
            assert.equal(1, sema.new(1):count())
            local process = require "ngx.process"
            assert.is_string(process.type())
            assert.is_number(process.get_master_pid())
            local errlog = require "ngx.errlog"
            assert.is_number(errlog.get_sys_filter_level())
            errlog.raw_log(ngx.DEBUG, "spec raw_log")
            assert.is_function(require("ngx.ssl").cert_pem_to_der)
            assert.has_error(function() require "ngx.ocsp" end,
                "module 'ngx.ocsp' is not supported by moonserve")
        end)

        it("resolves resty.X to Debian's nginx.X when only that is installed", function()
            local redis = require "resty.redis"
            assert.equal(require "nginx.redis", redis)
            assert.is_function(redis.new)
            assert.is_table(require "resty.lrucache") -- installed under its own name
            local ok, err = pcall(require, "resty.no_such_module")
            assert.is_false(ok)
            assert.matches("no module 'nginx.no_such_module'", err)
        end)

        it("makes ngx.re a clear error until moonserve.ngx.re exists", function()
            if package.searchpath("moonserve.ngx.re", package.path) then
                return -- the module is there: ngx.re is its own spec's
            end
            assert.has_error(function() return ngx.re.match end)
            local ok, err = pcall(function() return ngx.re end)
            assert.is_false(ok)
            assert.matches("ngx.re: not yet available", err)
        end)
    end)

    -- Every place the ngx layer and the framework turn a handler's strings into protocol
    -- text: each escapes as OpenResty does, or raises, so no string adds a field or a line.
    describe("strings that become protocol text", function()
        local helper = require "helper"
        local moonserve = require "moonserve"

        -- Serves `fn` as an ngx_content route (or a plain one) in memory: the raw reply.
        local function serve(fn, plain)
            local app = moonserve.app()
            if plain then
                app:get("/t", fn)
            else
                app:ngx_content("/t", fn)
            end
            return helper.memory_server(app)("GET /t HTTP/1.1\r\nHost: t\r\nX-In: in\r\n\r\n")
        end

        local function said(out)
            return out:match("\r\n\r\n(.*)$")
        end

        it("escapes CR, LF and NUL in ngx.header's names and values, as lua-nginx-module does",
            function()
                local out = serve(function()
                    ngx.header["X-A"] = "v\r\nSet-Cookie: evil=1"
                    ngx.header["X-B: 1\r\nX-Evil"] = "w"
                    ngx.header["X-C"] = { "a\0b", "c\td" }
                    ngx.say("ok")
                end)
                assert.matches("^HTTP/1.1 200", out)
                local head = out:match("^(.-\r\n)\r\n")
                assert.truthy(head:find("\r\nX-A: v%0D%0ASet-Cookie: evil=1\r\n", 1, true), head)
                assert.truthy(head:find("\r\nX-B%3A%201%0D%0AX-Evil: w\r\n", 1, true), head)
                assert.truthy(head:find("\r\nX-C: a%00b\r\nX-C: c\td\r\n", 1, true), head)
                assert.falsy(head:lower():find("\r\nset-cookie", 1, true), head)
                assert.falsy(head:lower():find("\r\nx-evil", 1, true), head)
            end)

        it("escapes what ngx.req.set_header sets, as ngx.req.get_headers, ngx.var and "
            .. "ngx.req.raw_header show it", function()
                local out = serve(function()
                    ngx.req.set_header("X-Q", "a\r\nX-Role: admin")
                    ngx.req.set_header("X-N:\r\nX-Role", "1")
                    local h = ngx.req.get_headers()
                    ngx.say(h["x-q"], "|", ngx.var.http_x_q, "|", tostring(h["x-role"]), "|",
                        ngx.req.raw_header(true))
                end)
                assert.equal("a%0D%0AX-Role: admin|a%0D%0AX-Role: admin|nil|Host: t\r\n"
                    .. "X-In: in\r\nX-Q: a%0D%0AX-Role: admin\r\nX-N%3A%0D%0AX-Role: 1\r\n\r\n\n",
                    said(out):gsub("X%-N.-\r\nX%-Q.-\r\n", function(two) -- (set order is a table's)
                        local q, n = two:match("^(X%-N.-\r\n)(X%-Q.-\r\n)$")
                        return n .. q
                    end))
            end)

        it("raises on nginx's unsafe bytes in ngx.redirect, with its message", function()
            local out = serve(function()
                local lines = {}
                for _, uri in ipairs { "/a\r\nSet-Cookie: evil=1", "/a\1\"\195\169" } do
                    local ok, err = pcall(ngx.redirect, uri)
                    lines[#lines + 1] = tostring(ok) .. " " .. err .. "\n"
                end
                ngx.print(lines)
            end)
            assert.equal("false unsafe byte \"0x0d\" in redirect uri \"/a\\x0D\\x0ASet-Cookie: "
                .. "evil=1\"\nfalse unsafe byte \"0x01\" in redirect uri \"/a\\x01\\x22\\xC3"
                .. "\\xA9\"\n", said(out))
        end)

        it("raises on a control byte in res:redirect, as its contract says", function()
            local out = serve(function(_, res)
                local ok, err = pcall(res.redirect, res, "/a\27[2Jb")
                local ok2, err2 = pcall(res.redirect, res, "/a\tjavascript:")
                return 200, tostring(ok) .. " " .. tostring(err) .. "\n" .. tostring(ok2) .. " "
                    .. tostring(err2)
            end, true)
            assert.matches("^HTTP/1.1 200", out)
            assert.equal("false bad redirect url (control characters)\n"
                .. "false bad redirect url (control characters)", said(out))
        end)

        it("raises on nginx's unsafe bytes in ngx.req.set_uri unless binary, with its message",
            function()
                local out = serve(function()
                    local ok, err = pcall(ngx.req.set_uri, "/a\r\nb")
                    ngx.say(tostring(ok), " ", err, " ", ngx.var.uri)
                    ngx.req.set_uri("/a\r\nb", false, true)
                    ngx.say(ngx.var.uri == "/a\r\nb")
                end)
                assert.equal("false unsafe byte \"0x0d\" in uri \"/a\\x0D\\x0Ab\" (maybe you "
                    .. "want to set the 'binary' argument?) /t\ntrue\n", said(out))
            end)
    end)
end)
