-- moonserve/metrics.lua: the public name of metrics (moonserve/host/core/metrics.lua).
return require "moonserve.host.core.metrics"
