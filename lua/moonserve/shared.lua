-- moonserve/shared.lua: the public name of shared dictionaries (moonserve/host/core/shared.lua).
return require "moonserve.host.core.shared"
