-- moonserve/server.lua: the public name of the core's runner (moonserve/host/core/runner.lua).
return require "moonserve.host.core.runner"
