-- moonserve/websocket.lua: the public name of WebSocket (moonserve/host/core/websocket.lua).
return require "moonserve.host.core.websocket"
