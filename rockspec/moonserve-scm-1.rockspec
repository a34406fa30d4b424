rockspec_format = "3.0"
package = "moonserve"
version = "scm-1"
source = {
   url = "file://.",
}
description = {
   summary = "A Lua-scriptable HTTP server: a C core on libuv, llhttp and nghttp2, the site in LuaJIT.",
   detailed = [[
moonserve runs web applications written in Lua. Accepting, parsing, limits, timers and
writing replies are C; routing, middleware and site logic are Lua, reached once per request
and talking to the core through LuaJIT's FFI.
]],
   license = "MIT",
   labels = { "http", "server", "web", "luajit" },
}
-- LuaJIT only: the framework talks to the core through the FFI. lua-cjson, OpenSSL (TLS
-- listeners in the core; libcrypto for sessions and CSRF tokens), PCRE2 (ngx.re) and libargon2
-- (moonserve.password) come from the system's packages (Debian lua-cjson, libssl-dev to build,
-- libssl3, libpcre2-8-0 and libargon2-1 to run).
dependencies = {
   "lua >= 5.1, < 5.2",
}
build = {
   type = "command",
   -- meson builds the core and the module; LuaRocks installs the files listed below.
   build_command = [[
      if [ -d build-rock ]; then meson setup --reconfigure build-rock --buildtype=release -Dlua_tests=false >/dev/null;
      else meson setup build-rock --buildtype=release -Dlua_tests=false >/dev/null; fi &&
      ninja -C build-rock modules/core.so
   ]],
   install_command = "true",
   install = {
      lua = {
         ["moonserve"] = "lua/moonserve/init.lua",
         ["moonserve.app"] = "lua/moonserve/app.lua",
         ["moonserve.base"] = "lua/moonserve/base.lua",
         ["moonserve.canon"] = "lua/moonserve/canon.lua",
         ["moonserve.channel"] = "lua/moonserve/channel.lua",
         ["moonserve.cli"] = "lua/moonserve/cli.lua",
         ["moonserve.codec"] = "lua/moonserve/codec.lua",
         ["moonserve.json"] = "lua/moonserve/json.lua",
         ["moonserve.validate"] = "lua/moonserve/validate.lua",
         ["moonserve.cookie"] = "lua/moonserve/cookie.lua",
         ["moonserve.crypto"] = "lua/moonserve/crypto.lua",
         ["moonserve.config"] = "lua/moonserve/config.lua",
         ["moonserve.cors"] = "lua/moonserve/cors.lua",
         ["moonserve.events"] = "lua/moonserve/events.lua",
         ["moonserve.fanout"] = "lua/moonserve/fanout.lua",
         ["moonserve.test"] = "lua/moonserve/test.lua",
         ["moonserve.password"] = "lua/moonserve/password.lua",
         ["moonserve.pg"] = "lua/moonserve/pg/init.lua",
         ["moonserve.pg.auth"] = "lua/moonserve/pg/auth.lua",
         ["moonserve.pg.conn"] = "lua/moonserve/pg/conn.lua",
         ["moonserve.pg.listen"] = "lua/moonserve/pg/listen.lua",
         ["moonserve.pg.migrate"] = "lua/moonserve/pg/migrate.lua",
         ["moonserve.pg.types"] = "lua/moonserve/pg/types.lua",
         ["moonserve.redis"] = "lua/moonserve/redis/init.lua",
         ["moonserve.redis.dict"] = "lua/moonserve/redis/dict.lua",
         ["moonserve.redis.resp"] = "lua/moonserve/redis/resp.lua",
         ["moonserve.redis.url"] = "lua/moonserve/redis/url.lua",
         ["moonserve.argon2"] = "lua/moonserve/argon2.lua",
         ["moonserve.csrf"] = "lua/moonserve/csrf.lua",
         ["moonserve.host"] = "lua/moonserve/host/init.lua",
         ["moonserve.host.contract"] = "lua/moonserve/host/contract.lua",
         ["moonserve.host.core"] = "lua/moonserve/host/core/init.lua",
         ["moonserve.host.core.base"] = "lua/moonserve/host/core/base.lua",
         ["moonserve.host.core.channel"] = "lua/moonserve/host/core/channel.lua",
         ["moonserve.host.core.cli"] = "lua/moonserve/host/core/cli.lua",
         ["moonserve.host.core.config"] = "lua/moonserve/host/core/config.lua",
         ["moonserve.host.core.coroutine"] = "lua/moonserve/host/core/coroutine.lua",
         ["moonserve.host.core.dispatcher"] = "lua/moonserve/host/core/dispatcher.lua",
         ["moonserve.host.core.live"] = "lua/moonserve/host/core/live.lua",
         ["moonserve.host.core.metrics"] = "lua/moonserve/host/core/metrics.lua",
         ["moonserve.host.core.request"] = "lua/moonserve/host/core/request.lua",
         ["moonserve.host.core.response"] = "lua/moonserve/host/core/response.lua",
         ["moonserve.host.core.runner"] = "lua/moonserve/host/core/runner.lua",
         ["moonserve.host.core.semaphore"] = "lua/moonserve/host/core/semaphore.lua",
         ["moonserve.host.core.shared"] = "lua/moonserve/host/core/shared.lua",
         ["moonserve.host.core.socket"] = "lua/moonserve/host/core/socket.lua",
         ["moonserve.host.core.timer"] = "lua/moonserve/host/core/timer.lua",
         ["moonserve.host.core.threads"] = "lua/moonserve/host/core/threads.lua",
         ["moonserve.host.core.inprocess"] = "lua/moonserve/host/core/inprocess.lua",
         ["moonserve.host.core.thread_runner"] = "lua/moonserve/host/core/thread_runner.lua",
         ["moonserve.host.core.tls_hook"] = "lua/moonserve/host/core/tls_hook.lua",
         ["moonserve.host.core.websocket"] = "lua/moonserve/host/core/websocket.lua",
         ["moonserve.host.core.worker"] = "lua/moonserve/host/core/worker.lua",
         ["moonserve.host.openresty"] = "lua/moonserve/host/openresty/init.lua",
         ["moonserve.host.openresty.request"] = "lua/moonserve/host/openresty/request.lua",
         ["moonserve.host.openresty.response"] = "lua/moonserve/host/openresty/response.lua",
         ["moonserve.host.openresty.services"] = "lua/moonserve/host/openresty/services.lua",
         ["moonserve.host.openresty.thread_job"] = "lua/moonserve/host/openresty/thread_job.lua",
         ["moonserve.log"] = "lua/moonserve/log.lua",
         ["moonserve.metrics"] = "lua/moonserve/metrics.lua",
         ["moonserve.multipart"] = "lua/moonserve/multipart.lua",
         ["moonserve.ngx"] = "lua/moonserve/ngx/init.lua",
         ["moonserve.ngx.capture"] = "lua/moonserve/ngx/capture.lua",
         ["moonserve.ngx.codec"] = "lua/moonserve/ngx/codec.lua",
         ["moonserve.ngx.context"] = "lua/moonserve/ngx/context.lua",
         ["moonserve.ngx.errlog"] = "lua/moonserve/ngx/errlog.lua",
         ["moonserve.ngx.loader"] = "lua/moonserve/ngx/loader.lua",
         ["moonserve.ngx.output"] = "lua/moonserve/ngx/output.lua",
         ["moonserve.ngx.phases"] = "lua/moonserve/ngx/phases.lua",
         ["moonserve.ngx.process"] = "lua/moonserve/ngx/process.lua",
         ["moonserve.ngx.re"] = "lua/moonserve/ngx/re.lua",
         ["moonserve.ngx.req"] = "lua/moonserve/ngx/req.lua",
         ["moonserve.ngx.reqsock"] = "lua/moonserve/ngx/reqsock.lua",
         ["moonserve.ngx.ssl"] = "lua/moonserve/ngx/ssl.lua",
         ["moonserve.ngx.time"] = "lua/moonserve/ngx/time.lua",
         ["moonserve.ngx.var"] = "lua/moonserve/ngx/var.lua",
         ["moonserve.openresty"] = "lua/moonserve/openresty.lua",
         ["moonserve.request_methods"] = "lua/moonserve/request_methods.lua",
         ["moonserve.response_methods"] = "lua/moonserve/response_methods.lua",
         ["moonserve.router"] = "lua/moonserve/router.lua",
         ["moonserve.security"] = "lua/moonserve/security.lua",
         ["moonserve.semaphore"] = "lua/moonserve/semaphore.lua",
         ["moonserve.server"] = "lua/moonserve/server.lua",
         ["moonserve.profile"] = "lua/moonserve/profile.lua",
         ["moonserve.ratelimit"] = "lua/moonserve/ratelimit.lua",
         ["moonserve.reconnect"] = "lua/moonserve/reconnect.lua",
         ["moonserve.session"] = "lua/moonserve/session.lua",
         ["moonserve.shared"] = "lua/moonserve/shared.lua",
         ["moonserve.socket"] = "lua/moonserve/socket.lua",
         ["moonserve.template"] = "lua/moonserve/template.lua",
         ["moonserve.timer"] = "lua/moonserve/timer.lua",
         ["moonserve.websocket"] = "lua/moonserve/websocket.lua",
         ["moonserve.worker"] = "lua/moonserve/worker.lua",
         ["moonserve.demo"] = "examples/demo.lua",
         -- The demo's files, beside it (moonserve/demo/): LuaRocks keeps the name of a file
         -- that is not Lua and puts it in the directory of the module name's prefix.
         ["moonserve.demo.static.css"] = "examples/demo/static/demo.css",
         ["moonserve.demo.static.js"] = "examples/demo/static/demo.js",
         ["moonserve.demo.static.svg"] = "examples/demo/static/moon.svg",
         ["moonserve.demo.views.index"] = "examples/demo/views/index.html",
         ["moonserve.demo.views.layout"] = "examples/demo/views/layout.html",
         ["moonserve.demo.views.slow"] = "examples/demo/views/slow.html",
      },
      lib = {
         ["moonserve.core"] = "build-rock/modules/core.so",
      },
      bin = {
         moonserve = "lua/bin/moonserve",
      },
   },
}
