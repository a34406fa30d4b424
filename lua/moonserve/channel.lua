-- moonserve/channel.lua: the public name of channels across workers (moonserve/host/core/channel.lua).
return require "moonserve.host.core.channel"
