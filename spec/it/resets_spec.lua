-- spec/it/resets_spec.lua: CI's short run of bench/resets: connections reset by the client at
-- random points of every protocol (mid-head, mid-body, mid-reply, while a handler waits on a
-- socket, mid-TLS handshake, over TLS, mid-HTTP/2 frame, mid-WebSocket message) leave the
-- worker holding what it held before them: descriptors, connections, requests, the
-- dispatcher's slots and timers, the Lua heap. The long run (100,000) is in PERFORMANCE.md.
local helper = require "helper"

describe("connections reset at random points of every protocol", function()
    it("leave nothing behind in the worker (2,400 of them)", function()
        local out, status = helper.with_env({ MOONSERVE = helper.bin }, function()
            return helper.run(helper.root .. "/bench/resets 2400 7 2>&1")
        end)
        assert.equal(0, status, out)
        assert.matches("nothing left behind", out)
        -- every kind was reset, none failed on the client's side
        for _, kind in ipairs({ "h1_head", "h1_body", "h1_reply", "h1_wait", "tls_hello",
            "tls_reply", "h2_frame", "ws_message" }) do
            assert.matches('"' .. kind .. '": 300', out)
        end
        assert.matches('"errors": {}', out)
    end)
end)
