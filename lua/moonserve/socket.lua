-- moonserve/socket.lua: the public name of the core's sockets (moonserve/host/core/socket.lua).
return require "moonserve.host.core.socket"
