-- moonserve/cli.lua: the public name of the command line (moonserve/host/core/cli.lua).
return require "moonserve.host.core.cli"
