-- moonserve/worker.lua: the public name of which worker this is (moonserve/host/core/worker.lua).
return require "moonserve.host.core.worker"
