-- ws.lua: the app bench/ws_compare runs on moonserve. /echo sends every message back
-- (/echo-cb the same from a message callback);
-- /broadcast keeps its sockets in one table, and a message from any of them sends a 1 KiB
-- text to all (moonserve.websocket.broadcast: one frame for every recipient).
local moonserve = require "moonserve"
local websocket = require "moonserve.websocket"
local app = moonserve.app()

app:get("/", function(req, res)
    res:send("hello world")
end)

app:websocket("/echo", function(ws)
    while true do
        local data, kind = ws:receive()
        if not data or kind == "close" then
            return
        end
        ws:send(data, kind)
    end
end)

-- The same with callbacks: an idle socket parks no coroutine.
app:websocket("/echo-cb", {
    message = function(ws, data, kind)
        ws:send(data, kind)
    end,
})

-- Context takeover: each socket keeps a zlib stream each way once it has compressed, at
-- zlib's defaults and in a window of 1 KiB with memLevel 2.
local function echo_cb(ws, data, kind)
    ws:send(data, kind)
end
app:websocket("/echo-kept", { message = echo_cb }, { deflate = { context_takeover = true } })
app:websocket("/echo-kept-small", { message = echo_cb },
    { deflate = { context_takeover = true, window_bits = 10, mem_level = 2 } })

local payload = string.rep("x", 1024)
local all = {}
app:websocket("/broadcast", function(ws)
    all[ws] = ws
    while true do
        local data, kind = ws:receive()
        if not data or kind == "close" then
            break
        end
        websocket.broadcast(all, payload)
    end
    all[ws] = nil
end)

return app
