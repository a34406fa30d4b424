-- moonserve/timer.lua: the public name of timers (moonserve/host/core/timer.lua).
return require "moonserve.host.core.timer"
