-- moonserve/base.lua: the public name of the core's FFI (moonserve/host/core/base.lua).
return require "moonserve.host.core.base"
