-- spec/lua/events_spec.lua: the framing of server-sent events (moonserve/events.lua).
local events = require "moonserve.events"

describe("moonserve.events framing", function()
    it("writes id, event, retry and one data line per line, then a blank line", function()
        assert.equal("id: 3\nevent: note\nretry: 1000\ndata: a\ndata: b\ndata: \ndata: c\n\n",
            events.frame { id = 3, event = "note", retry = 1000, data = "a\nb\r\n\rc" })
        assert.equal("data: \n\n", events.frame { data = "" })
        assert.equal("data: 12\n\n", events.frame { data = 12 })
        assert.equal("retry: 5\n\n", events.frame { retry = 5 })
    end)

    it("refuses CR or LF in an id or event name, NUL in an id, and a bad retry", function()
        assert.same({ nil, "bad id (no CR or LF allowed)" }, { events.frame { id = "1\n2" } })
        assert.same({ nil, "bad id (no CR or LF allowed)" }, { events.frame { id = "1\r" } })
        assert.same({ nil, "bad event (no CR or LF allowed)" },
            { events.frame { event = "a\rb", data = "x" } })
        assert.same({ nil, "bad id (no NUL allowed)" }, { events.frame { id = "1\0" } })
        assert.same({ nil, "bad retry (whole milliseconds expected)" },
            { events.frame { retry = 1.5 } })
        assert.same({ nil, "bad event (nothing to send)" }, { events.frame {} })
        assert.same({ nil, "bad data (string expected, got table)" },
            { events.frame { data = {} } })
    end)

    it("writes comments a line each, and an empty one as ':'", function()
        assert.equal(":\n\n", events.comment_frame(""))
        assert.equal(": one\n: two\n\n", events.comment_frame("one\ntwo"))
    end)
end)
