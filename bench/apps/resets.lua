-- The app of bench/resets: routes whose connections the client resets at every point of
-- every protocol (a head, a body read, a reply under way, a handler waiting on a socket, a
-- WebSocket message), and /census, what the worker holds, for the counts before and after.
local moonserve = require "moonserve"
local dispatcher = require "moonserve.host.core.dispatcher"
local app = moonserve.app()

app:get("/", function()
    return 200, "hello"
end)

app:post("/upload", function(req)
    return 200, tostring(#(req:body() or ""))
end)

-- A reply far larger than the socket's buffers: a reset comes while it is under way.
local big = string.rep("b", 1048576)
app:get("/big", function()
    return 200, big
end)

-- The handler waits on a socket to the client's silent listener (?port=N), at most 1 s.
app:get("/wait", function(req)
    local sock = moonserve.socket.tcp()
    sock:settimeout(1000)
    local ok, err = sock:connect("127.0.0.1", tonumber(req.query.port))
    if not ok then
        return 502, tostring(err)
    end
    local line
    line, err = sock:receive("*l")
    sock:close()
    return 200, tostring(line or err)
end)

app:websocket("/ws", function(ws)
    while true do
        local data = ws:receive()
        if not data then
            return
        end
        ws:send(data)
    end
end)

-- What the worker holds, after a full collection: its dispatcher's counts and Lua heap.
app:get("/census", function(_, res)
    collectgarbage()
    collectgarbage()
    local c = dispatcher.census()
    c.lua_bytes = math.floor(collectgarbage("count") * 1024)
    return res:json(c)
end)

return app
