-- spec/it/browser_spec.lua: the demo site in headless Chromium (Debian's chromium), driven
-- over the DevTools protocol by spec/it/browser.py: two tabs, a desktop one and a phone one,
-- on a server of two workers. The screenshots go to a temporary directory, or to
-- MOONSERVE_SCREENSHOTS when it names one (docs/demo.png is made that way).
local helper = require "helper"

local function q(s)
    return "'" .. s:gsub("'", "'\\''") .. "'"
end

-- A PNG's width and height, from its IHDR chunk.
local function png_size(path)
    local data = helper.read_file(path)
    assert(data:sub(1, 8) == "\137PNG\r\n\26\n", path .. " is not a PNG")
    local function u32(at)
        local a, b, c, d = data:byte(at, at + 3)
        return ((a * 256 + b) * 256 + c) * 256 + d
    end
    return u32(17), u32(21)
end

-- Over cleartext (HTTP/1.1, as in development) and over TLS (HTTP/2 by ALPN, as in
-- production: there Chromium opens the page's WebSocket with an extended CONNECT on the
-- page's connection, through the demo's sessions and CSRF middleware).
for _, over in ipairs { "cleartext", "TLS" } do

describe("the demo site in headless Chromium over " .. over, function()
    local srv, facts, dir, keep, certs, access

    setup(function()
        keep = os.getenv("MOONSERVE_SCREENSHOTS")
        keep = keep and over == "cleartext" and keep or nil
        dir = keep or helper.run("mktemp -d"):gsub("%s+$", "")
        os.execute("mkdir -p " .. q(dir))
        local url
        if over == "TLS" then
            certs = helper.run("mktemp -d"):gsub("%s+$", "")
            helper.sh(string.format("%s req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
                .. "-nodes -keyout %s -out %s -days 2 -subj /CN=localhost "
                .. "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 2>&1",
                helper.tool("openssl"), q(certs .. "/demo.key"), q(certs .. "/demo.pem")))
            access = certs .. "/access.log"
            srv = helper.spawn_server { args = string.format("--workers 2 --listen 127.0.0.1:0 "
                .. "--tls-cert %s --tls-key %s --access-log %s", q(certs .. "/demo.pem"),
                q(certs .. "/demo.key"), q(access)) }
            url = "https://127.0.0.1:" .. srv.ports[2]
        else
            srv = helper.spawn_server { args = "--workers 2" }
            url = "http://127.0.0.1:" .. srv.port
        end
        local out = helper.run(q(helper.tool("websockets")) .. " "
            .. q(helper.root .. "/spec/it/browser.py") .. " " .. q(helper.tool("chromium"))
            .. " " .. url .. " " .. q(dir) .. " 2>&1")
        facts = { _out = out, errors = {} }
        for k, v in out:gmatch("([%w_]+)=([^\n]*)") do
            if k == "console_error" then
                facts.errors[#facts.errors + 1] = v
            else
                facts[k] = v
            end
        end
    end)

    teardown(function()
        srv:stop()
        if not keep then
            os.execute("rm -rf " .. q(dir))
        end
        if certs then
            os.execute("rm -rf " .. q(certs))
        end
    end)

    it("loads the page, its stylesheet, script, live numbers and socket, with no console error",
        function()
            assert.equal("True", facts.desktop_loaded, facts._out)
            assert.equal("True", facts.desktop_live)
            assert.equal("True", facts.stylesheet)
            assert.equal("True", facts.stats_shown)
            assert.equal("0", facts.console_errors, table.concat(facts.errors, "\n"))
        end)

    it("posts the guestbook form with its CSRF token, and the session keeps the name", function()
        assert.equal("/#guestbook", facts.after_post_url, facts._out)
        assert.equal("Ada Lovelace", facts.signed)
        assert.equal("Ada Lovelace", facts.session_name)
        assert.equal("True", facts.desktop_live_again)
    end)

    it("lays the page out in one column on a phone and three on a desktop, never wider",
        function()
            assert.equal("1", facts.phone_columns, facts._out)
            assert.equal("3", facts.desktop_columns)
            assert.equal("False", facts.phone_overflow)
            assert.equal("False", facts.desktop_overflow)
        end)

    if over == "TLS" then
        it("speaks HTTP/2, its live socket an extended CONNECT that the CSRF middleware lets by",
            function()
                assert.equal("h2", facts.page_protocol, facts._out)
                -- the access log's line comes when the socket ends (the browser has gone)
                local line
                helper.wait_for(function()
                    line = helper.read_file(access):match('[^\n]*"CONNECT /live HTTP/2"[^\n]*')
                    return line
                end, 5)
                assert.truthy(line, helper.read_file(access))
                assert.matches('"CONNECT /live HTTP/2" 200 ', line)
            end)
    end

    it("carries a counter click and chat messages between two tabs" .. (over == "TLS" and ""
        or " on two workers"), function()
        local a, b = (facts.workers or ""):match("^(%d),(%d)$")
        assert.truthy(a, facts._out)
        if over ~= "TLS" then -- (over HTTP/2 the two tabs share one connection, and a worker)
            assert.are_not.equal(a, b, facts._out)
        end
        local after, before = facts.count_step:match("^(%d+)-(%d+)$")
        assert.equal(tonumber(before) + 1, tonumber(after), facts._out)
        assert.matches("^Ada Lovelace %(worker " .. b .. "%): hello from the phone$", facts.chat)
        assert.equal("True", facts.chat_on_phone)
        assert.equal("True", facts.chat_back)
    end)

    it("writes a screenshot of each tab, at 1280 and 375 pixels wide", function()
        assert.equal("yes", facts.screenshots, facts._out)
        assert.same({ 1280, 960 }, { png_size(dir .. "/demo-desktop.png") })
        assert.same({ 375, 812 }, { png_size(dir .. "/demo-phone.png") })
    end)
end)

end
