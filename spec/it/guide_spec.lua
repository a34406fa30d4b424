-- The guide's Lua examples (docs/guide/*.md) work as written. Every ```lua block compiles.
-- A block after <!-- example: define --> runs as the body of an app file (with `moonserve`
-- and `app` made for it), so every name it uses must exist. A block after
--   <!-- example: app
--   METHOD PATH [header:NAME=VALUE]... [body=TEXT] -> STATUS [header:NAME=VALUE]... [TEXT]
--   (a VALUE with spaces in double quotes)
--   -->
-- is an app file: a real server serves it, and each line's request must get that status,
-- those reply fields and a body holding TEXT.
local helper = require "helper"
local lfs = require "lfs"

local GUIDE = helper.root .. "/docs/guide"

-- { { page, line, kind, code, checks = { ... } } } of every ```lua block of the guide.
local function examples()
    local out = {}
    local names = {}
    for name in lfs.dir(GUIDE) do
        if name:match("%.md$") then
            names[#names + 1] = name
        end
    end
    table.sort(names)
    for _, name in ipairs(names) do
        local lines = {}
        for l in io.lines(GUIDE .. "/" .. name) do
            lines[#lines + 1] = l
        end
        local marker, i = nil, 1
        while i <= #lines do
            local l = lines[i]
            local kind = l:match("^<!%-%- example: (%a+)")
            if kind then
                marker = { kind = kind, checks = {} }
                if not l:match("%-%->%s*$") then
                    i = i + 1
                    while not lines[i]:match("^%-%->") do
                        marker.checks[#marker.checks + 1] = lines[i]
                        i = i + 1
                    end
                end
            elseif l:match("^```lua%s*$") then
                local first, code = i, {}
                i = i + 1
                while not lines[i]:match("^```%s*$") do
                    code[#code + 1] = lines[i]
                    i = i + 1
                end
                out[#out + 1] = { page = name, line = first, kind = marker and marker.kind,
                    checks = marker and marker.checks or {}, code = table.concat(code, "\n") }
                marker = nil
            elseif l:match("%S") then
                marker = nil -- a marker belongs to the block right after it
            end
            i = i + 1
        end
    end
    return out
end

-- One header:NAME=VALUE (VALUE in double quotes when it holds spaces) off the front of `s`:
-- name, value, the rest; nil when `s` does not start with one.
local function take_header(s)
    local k, v, rest = s:match('^header:([%w-]+)="(.-)"%s*(.*)$')
    if not k then
        k, v, rest = s:match("^header:([%w-]+)=(%S+)%s*(.*)$")
    end
    return k, v, rest
end

-- "GET /x header:a=b body=c -> 200 header:d=e text" as a request and what must come back.
local function parse_check(line)
    local req, want = line:match("^(.-)%s+%->%s+(.*)$")
    assert(req, "bad check line: " .. line)
    local method, path, rest = req:match("^(%u+)%s+(%S+)%s*(.*)$")
    local c = { method = method, path = path, headers = {}, want_headers = {} }
    local body_at = rest:find("body=", 1, true)
    if body_at then
        c.body = rest:sub(body_at + 5)
        rest = rest:sub(1, body_at - 1)
    end
    local k, v
    k, v, rest = take_header(rest)
    while k do
        c.headers[k:lower()] = v
        k, v, rest = take_header(rest)
    end
    c.status = tonumber(want:match("^(%d+)"))
    want = want:gsub("^%d+%s*", "")
    k, v, rest = take_header(want)
    while k do
        c.want_headers[k:lower()] = v
        want = rest
        k, v, rest = take_header(want)
    end
    c.text = want
    return c
end

local function request(port, c)
    local lines = { c.method .. " " .. c.path .. " HTTP/1.1" }
    local headers = { host = "guide.test", connection = "close" }
    for k, v in pairs(c.headers) do
        headers[k:lower()] = v
    end
    if c.body then
        headers["content-length"] = tostring(#c.body)
    end
    for k, v in pairs(headers) do
        lines[#lines + 1] = k .. ": " .. v
    end
    local raw = table.concat(lines, "\r\n") .. "\r\n\r\n" .. (c.body or "")
    return assert(helper.request(port, raw, c.method == "HEAD"))
end

describe("the guide's examples", function()
    local all = examples()
    -- A server takes a second or two to stop: each is told to at once, and waited for here.
    local stopping = {}
    teardown(function()
        for _, srv in ipairs(stopping) do
            srv:stop()
        end
    end)

    it("are there, and marked", function()
        local apps = 0
        for _, e in ipairs(all) do
            if e.kind == "app" then
                apps = apps + 1
            end
        end
        assert.truthy(#all >= 20, "only " .. #all .. " Lua blocks in docs/guide")
        assert.truthy(apps >= 12, "only " .. apps .. " served examples")
    end)

    for _, e in ipairs(all) do
        local where = e.page .. ":" .. e.line
        it("compile: " .. where, function()
            local fn, err = loadstring(e.code, "=" .. where)
            assert(fn, err)
        end)
        if e.kind == "define" then
            it("define an app: " .. where, function()
                local code = "local moonserve = require 'moonserve'\n"
                    .. "local app = moonserve.app()\n" .. e.code .. "\nreturn app"
                local fn = assert(loadstring(code, "=" .. where))
                local ok, app = pcall(fn)
                assert(ok, app)
                assert.equal("function", type(app.handle))
            end)
        elseif e.kind == "app" then
            it("serve what the page says: " .. where, function()
                local file = os.tmpname() .. ".lua"
                helper.write_file(file, e.code)
                local srv = helper.spawn_server { app = file }
                local ok, err = pcall(function()
                    for _, line in ipairs(e.checks) do
                        local c = parse_check(line)
                        local res = request(srv.port, c)
                        assert.equal(c.status, res.status, line .. "\n" .. res.raw_head
                            .. "\n\n" .. res.body)
                        for k, v in pairs(c.want_headers) do
                            assert.equal(v, res.headers[k], line)
                        end
                        if c.text ~= "" then
                            assert.truthy(res.body:find(c.text, 1, true),
                                line .. ": the body is\n" .. res.body)
                        end
                    end
                end)
                os.execute("kill -TERM " .. srv.pid .. " 2>/dev/null")
                stopping[#stopping + 1] = srv
                os.remove(file)
                assert(ok, err)
            end)
        end
    end
end)
