-- spec/lua/pg_listen_spec.lua: moonserve.pg.listen's checks, without a server (the rest is
-- spec/it/pg_listen_spec.lua's).
describe("moonserve.pg.listen", function()
    local listen = require "moonserve.pg.listen"
    local pg = require "moonserve.pg"

    it("quotes a channel's name as an identifier", function()
        assert.equal('"notes"', listen.quote("notes"))
        assert.equal('"we""ird ch"', listen.quote('we"ird ch'))
        assert.equal('"Mixed;DROP TABLE x"', listen.quote("Mixed;DROP TABLE x"))
    end)

    it("refuses a channel that is not a name, and a queue that is not a count", function()
        local db = pg.new{ url = "postgres://u@127.0.0.1:1/d" }
        for _, bad in ipairs({ "", 42, "a\0b" }) do
            assert.has_error(function() db:listen(bad) end,
                "bad argument #1 to 'listen' (a channel's name expected)")
        end
        assert.has_error(function() db:listen("x", { queue = 0 }) end,
            "bad queue (a positive number expected)")
        assert.has_error(function() db:notify(nil, "p") end,
            "bad argument #1 to 'notify' (a channel's name expected)")
    end)
end)
