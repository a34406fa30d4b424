-- moonserve/semaphore.lua: the public name of semaphores (moonserve/host/core/semaphore.lua).
return require "moonserve.host.core.semaphore"
