-- spec/it/check_spec.lua: `moonserve --check` and the options every start checks: an app and
-- its options are loaded and checked, nothing listens, and a mistake is named.
local helper = require "helper"

local BIN = os.getenv("MOONSERVE_BIN") or (helper.root .. "/lua/bin/moonserve")

local function moonserve(args)
    return helper.run(BIN .. " " .. args .. " 2>&1")
end

local APP = helper.sh_quote(helper.root .. "/spec/fixtures/app.lua")

describe("moonserve --check", function()
    it("says an app and its options are valid, and exits 0 without listening", function()
        local out, status = moonserve(APP .. " --check --listen 127.0.0.1:1 --workers 4")
        assert.equal(0, status, out)
        assert.matches("app.lua: the app and its options are valid\n$", out)
    end)

    it("names what is wrong and exits 2", function()
        local cases = {
            { "--limit bogus=1", "unknown limit bogus %(the limits: connections, " },
            { "--limit idle_timeout=-1", "bad limit idle_timeout %(out of range: 0 to " },
            { "--listen nohost", "bad listen address nohost %(HOST:PORT expected%)" },
            { "--access-log /nonexistent/dir/a.log", "bad access_log /nonexistent/dir/a.log: " ..
                "ENOENT" },
            { "--log /nonexistent/dir/e.log", "cannot open log /nonexistent/dir/e.log" },
            { "--log-level loud", "%-%-log%-level needs debug, info, warn or error" },
            { "--trusted-proxy 10.0.0.0/99", "bad trusted proxy 10.0.0.0/99" },
            { "--readyz ready", "%-%-readyz needs a path starting with /" },
            { "--ssl-trusted-certificate /nonexistent/ca.pem", "bad ssl_trusted_certificate: " ..
                "cannot load the trusted certificates in /nonexistent/ca.pem" },
        }
        for _, c in ipairs(cases) do
            local out, status = moonserve(APP .. " --check " .. c[1])
            assert.equal(2, status, c[1] .. ": " .. out)
            assert.matches("^moonserve: " .. c[2], out)
        end
        -- An app whose static mount's directory is missing.
        local app = os.tmpname()
        finally(function() os.remove(app) end)
        helper.write_file(app, 'local a = require("moonserve").app()\n' ..
            'a:static("/files", "/nonexistent/dir")\nreturn a\n')
        local out, status = moonserve(helper.sh_quote(app) .. " --check")
        assert.equal(2, status, out)
        assert.matches("cannot serve /nonexistent/dir at /files/", out)
    end)
end)

describe("app:run", function()
    it("refuses an option it does not know, naming those it does", function()
        local app = require("moonserve").app()
        local ok, err = pcall(app.run, app, { listn = "127.0.0.1:0", workers = 0 })
        assert.is_false(ok)
        assert.matches("unknown option listn %(accepted: access_log, ", err)
        ok, err = pcall(app.run, app, { workers = 1.5 })
        assert.is_false(ok)
        assert.matches("bad workers %(a whole number expected%)", err)
    end)
end)
