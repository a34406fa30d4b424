-- moonserve/openresty.lua: the public name of the framework inside nginx (moonserve/host/openresty/init.lua).
return require "moonserve.host.openresty"
