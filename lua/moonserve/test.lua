--- moonserve/test.lua: a client for an app's own specs, with no socket: requests go as
-- HTTP/1.1 bytes through the engine's in-memory transport, the path a socket's bytes take
-- (limits, refusals, security headers), and the loop turns while a reply is under way.
-- @module moonserve.test
-- @usage local t = app:test()
-- local r = t:get("/notes?page=2", { headers = { accept = "application/json" } })
-- assert.equal(200, r.status); local notes = r:json()
local codec = require "moonserve.codec"
local crypto = require "moonserve.crypto"
local host = require "moonserve.host"
local json = require "moonserve.json"

local concat, format, lower = table.concat, string.format, string.lower
local type, tostring, tonumber, pairs, ipairs = type, tostring, tonumber, pairs, ipairs
local error, setmetatable, unpack = error, setmetatable, unpack

local _M = {}

local DEFAULT_TIMEOUT = 5

-- -- Replies ---------------------------------------------------------------------------

local Response = {}
Response.__index = Response

--- The body decoded as JSON; raises when it is not JSON.
function Response:json()
    local v, err = json.decode(self.body)
    if v == nil and err then
        error(format("the reply to %s is not JSON (%s): %s", self.request, err,
            self.body:sub(1, 200)), 2)
    end
    return v
end

--- A CSRF token the reply carries: a form's `_csrf` field, a `csrf-token` meta element, an
-- `x-csrf-token` field of the reply, or a JSON body's `csrf_token`; nil if none.
function Response:csrf_token()
    local h = self.headers["x-csrf-token"]
    if h then
        return h
    end
    local b = self.body
    for tag in b:gmatch("<input[^>]*>") do
        if tag:find("name%s*=%s*[\"']_csrf[\"']") then
            local v = tag:match("value%s*=%s*\"([^\"]*)\"") or tag:match("value%s*=%s*'([^']*)'")
            if v then
                return v
            end
        end
    end
    for tag in b:gmatch("<meta[^>]*>") do
        if tag:find("name%s*=%s*[\"']csrf%-token[\"']") then
            local v = tag:match("content%s*=%s*\"([^\"]*)\"")
                or tag:match("content%s*=%s*'([^']*)'")
            if v then
                return v
            end
        end
    end
    if (self.headers["content-type"] or ""):find("json", 1, true) then
        local v = json.decode(b)
        if type(v) == "table" and type(v.csrf_token) == "string" then
            return v.csrf_token
        end
    end
    return nil
end

--- The first log line of this request that matches the Lua pattern `pattern`, or nil.
function Response:logged(pattern)
    for _, line in ipairs(self.log) do
        if line:find(pattern) then
            return line
        end
    end
    return nil
end

-- Where a reply's head ends, and its parts: status, reason, headers (lowercase names; a
-- repeated field joined with ", "), the set-cookie lines. nil while the head is not whole.
local function parse_head(text)
    local stop = text:find("\r\n\r\n", 1, true)
    if not stop then
        return nil
    end
    local head = text:sub(1, stop - 1)
    local status, reason = head:match("^HTTP/1%.[01] (%d%d%d) ?([^\r]*)")
    if not status then
        error("not an HTTP/1.1 reply: " .. head:sub(1, 200), 0)
    end
    local headers, cookies = {}, {}
    for name, value in head:gmatch("\r\n([^:\r]+):[ \t]*([^\r]*)") do
        name = lower(name)
        if name == "set-cookie" then
            cookies[#cookies + 1] = value
        end
        headers[name] = headers[name] and headers[name] .. ", " .. value or value
    end
    return { status = tonumber(status), reason = reason, headers = headers,
        set_cookies = cookies, body_at = stop + 4 }
end

-- The body of a chunked reply from `at` (RFC 9112 7.1): the pieces joined, and whether the
-- last chunk and its trailers have come; the trailer fields into `trailers`.
local function dechunk(text, at, trailers)
    local parts = {}
    local pos = at
    while true do
        local size, data_at = text:match("^(%x+)[^\r\n]*\r\n()", pos)
        if not size then
            return concat(parts), false
        end
        size = tonumber(size, 16)
        if size == 0 then
            local stop = text:find("\r\n\r\n", data_at - 2, true)
            if not stop then
                return concat(parts), false
            end
            for name, value in text:sub(data_at - 2, stop):gmatch("\r\n([^:\r]+):[ \t]*([^\r]*)") do
                trailers[lower(name)] = value
            end
            return concat(parts), true
        end
        if #text < data_at + size + 1 then
            return concat(parts), false
        end
        parts[#parts + 1] = text:sub(data_at, data_at + size - 1)
        pos = data_at + size + 2
    end
end

-- The reply in `text` (interim 1xx replies skipped, but for 101): a table, whether it is
-- whole. `head_only`: the reply to a HEAD has no body.
local function parse_reply(text, closed, head_only)
    local at = 1
    while true do
        local h = parse_head(text:sub(at))
        if not h then
            return nil, false
        end
        if h.status >= 200 or h.status == 101 then
            h.body_at = h.body_at + at - 1
            local status = h.status
            local rest = text:sub(h.body_at)
            h.trailers = {}
            if head_only or status == 204 or status == 304 or status == 101 then
                h.body = ""
                return h, true
            end
            local te = h.headers["transfer-encoding"]
            if te and lower(te):find("chunked", 1, true) then
                local body, whole = dechunk(text, h.body_at, h.trailers)
                h.body = body
                return h, whole
            end
            local len = tonumber(h.headers["content-length"])
            if len then
                h.body = rest:sub(1, len)
                return h, #rest >= len
            end
            h.body = rest -- until the server closes (RFC 9112 6.3, item 8)
            return h, closed
        end
        at = at + h.body_at - 1 -- past a 100 Continue
    end
end

-- -- Requests --------------------------------------------------------------------------

-- A multipart/form-data body (RFC 7578) of `form` (name = value or list of values) and
-- `files` (name = { filename =, content_type =, data = }, or a list of such).
local function multipart(form, files)
    local boundary = "moonserve-test-" .. crypto.base64url_encode(crypto.random(12))
    local out = {}
    local function part(disposition, ctype, data)
        out[#out + 1] = "--" .. boundary .. "\r\nContent-Disposition: form-data; "
            .. disposition .. "\r\n" .. (ctype and "Content-Type: " .. ctype .. "\r\n" or "")
            .. "\r\n" .. data .. "\r\n"
    end
    local function sorted(t)
        local keys = {}
        for k in pairs(t or {}) do
            keys[#keys + 1] = k
        end
        table.sort(keys)
        return keys
    end
    for _, k in ipairs(sorted(form)) do
        local v = form[k]
        for _, x in ipairs(type(v) == "table" and v or { v }) do
            part(format('name="%s"', k), nil, tostring(x))
        end
    end
    for _, k in ipairs(sorted(files)) do
        local f = files[k]
        for _, x in ipairs(f[1] and f or { f }) do
            if type(x) ~= "table" or type(x.data) ~= "string" then
                error("bad file " .. k .. " ({ data = string, filename =, content_type = } "
                    .. "expected)", 4)
            end
            part(format('name="%s"; filename="%s"', k, x.filename or k), x.content_type
                or "application/octet-stream", x.data)
        end
    end
    out[#out + 1] = "--" .. boundary .. "--\r\n"
    return concat(out), "multipart/form-data; boundary=" .. boundary
end

-- A field value must be one line: the client writes what it is given, and a CR or LF would
-- make another field (or a request) of its own.
local function one_line(what, s)
    s = tostring(s)
    if s:find("[\r\n]") then
        error("bad " .. what .. " (CR or LF in it): " .. s, 4)
    end
    return s
end

local Client = {}
Client.__index = Client

-- The Cookie field for the jar's cookies, or nil.
local function cookie_field(jar)
    local names = {}
    for name in pairs(jar) do
        names[#names + 1] = name
    end
    if #names == 0 then
        return nil
    end
    table.sort(names)
    for i, name in ipairs(names) do
        names[i] = name .. "=" .. jar[name]
    end
    return concat(names, "; ")
end

-- Keeps the reply's cookies in the jar; one given Max-Age=0, or an Expires in the past
-- (cookie.lua's deletion: the epoch), leaves it.
local function keep_cookies(jar, lines)
    for _, line in ipairs(lines) do
        local name, value = line:match("^%s*([^=;%s]+)%s*=%s*([^;]*)")
        if name then
            local attrs = lower(line)
            local max_age = tonumber(attrs:match(";%s*max%-age%s*=%s*(%-?%d+)"))
            local gone = (max_age and max_age <= 0) or attrs:find(";%s*expires%s*=[^;]*1970")
            jar[name] = not gone and value or nil
        end
    end
end

--- Sends a request and returns the reply: `r.status`, `r.reason`, `r.headers` (lowercase
-- names), `r.body` (a chunked one decoded), `r.trailers`, `r.cookies` (the Set-Cookie
-- lines), `r.log` (the log lines while it ran, "error: ..."), `r.raw` (the bytes), and
-- `r:json()`, `r:csrf_token()`, `r:logged(pattern)`.
-- opts: headers ({ name = value }), query (a table, added to the path's query), body (a
-- string), form (urlencoded), json (a value), files (with form: multipart/form-data; each
-- `{ data =, filename =, content_type = }`), csrf (a token, sent as X-CSRF-Token), host,
-- timeout (seconds, the client's by default), partial (true: a reply not whole by the
-- timeout is returned with `r.complete = false` instead of raising).
function Client:request(method, path, opts)
    opts = opts or {}
    if type(method) ~= "string" or not method:find("^[%u%-]+$") then
        error("bad method (an uppercase token expected)", 2)
    end
    if type(path) ~= "string" or path:find("[%s%c]") then
        error("bad path (a request target without spaces or control bytes expected)", 2)
    end
    if opts.query then
        local q = codec.encode_form(opts.query)
        if q ~= "" then
            path = path .. (path:find("?", 1, true) and "&" or "?") .. q
        end
    end
    local headers, seen = {}, {}
    local function add(name, value)
        headers[#headers + 1] = one_line("field name", name) .. ": " .. one_line(name, value)
        seen[lower(name)] = true
    end
    for name, value in pairs(opts.headers or {}) do
        add(name, value)
    end
    local body, ctype = opts.body, nil
    if opts.files then
        body, ctype = multipart(opts.form, opts.files)
    elseif opts.form then
        body, ctype = codec.encode_form(opts.form), "application/x-www-form-urlencoded"
    elseif opts.json ~= nil then
        body, ctype = json.encode(opts.json), "application/json"
    end
    if body ~= nil and type(body) ~= "string" then
        error("bad body (string expected)", 2)
    end
    if ctype and not seen["content-type"] then
        add("Content-Type", ctype)
    end
    if opts.csrf then
        add("X-CSRF-Token", opts.csrf)
    end
    if not seen.host then
        add("Host", opts.host or self.host)
    end
    if not seen.cookie then
        local c = cookie_field(self.cookies)
        if c then
            add("Cookie", c)
        end
    end
    if body and not seen["content-length"] and not seen["transfer-encoding"] then
        add("Content-Length", #body)
    end
    if not seen.connection then
        -- The server ends the connection once the handler has returned: that is when the
        -- exchange is over, and the handler's log lines are all in.
        add("Connection", "close")
    end
    local raw = method .. " " .. path .. " HTTP/1.1\r\n" .. concat(headers, "\r\n") .. "\r\n\r\n"
        .. (body or "")
    local head_only = method == "HEAD"
    local timeout = opts.timeout or self.timeout
    local reply
    local out, whole, _, log = self.server:exchange(raw, function(text, closed)
        local r, done = parse_reply(text, closed, head_only)
        reply = r
        return done
    end, timeout, timeout)
    local what = method .. " " .. path
    if not whole then
        reply = parse_reply(out, true, head_only)
        if not opts.partial then
            error(format("moonserve.test: %s: no whole reply within %g s (%d bytes came%s)",
                what, timeout, #out, #log > 0 and "; log: " .. concat(log, " | ") or ""), 2)
        end
        reply = reply or { headers = {}, set_cookies = {}, trailers = {}, body = "" }
    end
    keep_cookies(self.cookies, reply.set_cookies)
    reply.cookies, reply.set_cookies, reply.body_at = reply.set_cookies, nil, nil
    reply.complete = whole
    reply.raw = out
    reply.log = log
    reply.request = what
    return setmetatable(reply, Response)
end

for _, m in ipairs({ "get", "head", "post", "put", "patch", "delete", "options" }) do
    local method = m:upper()
    Client[m] = function(self, path, opts)
        return self:request(method, path, opts)
    end
end

-- -- WebSocket ---------------------------------------------------------------------------

local bit = require "bit"
local band, bor, bxor, rshift = bit.band, bit.bor, bit.bxor, bit.rshift
local char, byte = string.char, string.byte

local OPCODES = { continuation = 0, text = 1, binary = 2, close = 8, ping = 9, pong = 10 }
local NAMES = { [0] = "continuation", "text", "binary", [8] = "close", [9] = "ping",
    [10] = "pong" }

-- A client's frame (RFC 6455 5.2): FIN set, masked (5.3: a client masks every frame).
local function frame(opcode, payload)
    local n = #payload
    local head
    if n < 126 then
        head = char(bor(0x80, opcode), bor(0x80, n))
    elseif n < 65536 then
        head = char(bor(0x80, opcode), 0x80 + 126, rshift(n, 8), band(n, 255))
    else
        local b = {}
        for i = 8, 1, -1 do
            b[i] = n % 256
            n = math.floor(n / 256)
        end
        head = char(bor(0x80, opcode), 0x80 + 127, unpack(b))
    end
    local key = crypto.random(4)
    local k = { byte(key, 1, 4) }
    local out = {}
    for i = 1, #payload do
        out[i] = char(bxor(byte(payload, i), k[(i - 1) % 4 + 1]))
    end
    return head .. key .. concat(out)
end

-- A server's frame at the front of `buf`: fin, opcode, payload, the rest; nil while not whole.
local function unframe(buf)
    if #buf < 2 then
        return nil
    end
    local b1, b2 = byte(buf, 1, 2)
    local n, at = band(b2, 127), 3
    if n == 126 then
        if #buf < 4 then
            return nil
        end
        n, at = byte(buf, 3) * 256 + byte(buf, 4), 5
    elseif n == 127 then
        if #buf < 10 then
            return nil
        end
        n = 0
        for i = 3, 10 do
            n = n * 256 + byte(buf, i)
        end
        at = 11
    end
    if band(b2, 0x80) ~= 0 then
        error("moonserve.test: the server sent a masked frame (RFC 6455 5.1)", 0)
    end
    if #buf < at + n - 1 then
        return nil
    end
    return band(b1, 0x80) ~= 0, band(b1, 15), buf:sub(at, at + n - 1), buf:sub(at + n)
end

local WebSocket = {}
WebSocket.__index = WebSocket

--- Sends a message: text (the default), or `kind` "binary", "ping", "pong".
function WebSocket:send(data, kind)
    local op = OPCODES[kind or "text"]
    if type(data) ~= "string" or not op or op == 0 or op == 8 then
        error("bad message (string, and kind text, binary, ping or pong expected)", 2)
    end
    self.conn:send(frame(op, data))
    return true
end

--- The next message: data and its kind ("text", "binary", "pong", or "close" with the
-- close code and reason as data: "1000 bye"), or nil and "timeout" or "closed". Pings are
-- answered with pongs; fragments are joined.
function WebSocket:receive(seconds)
    local parts, kind = {}, nil
    local msg, log = self.conn:wait(function(c)
        while true do
            local fin, op, payload, rest = unframe(c.buf)
            if fin == nil then
                return nil
            end
            c.buf = rest
            if op == 9 then
                c:send(frame(10, payload))
            elseif op == 8 then
                local code = #payload >= 2 and byte(payload, 1) * 256 + byte(payload, 2) or 1005
                if not self.closing then
                    c:send(frame(8, payload:sub(1, 2)))
                end
                self.closing = true
                return { data = code .. (#payload > 2 and " " .. payload:sub(3) or ""),
                    kind = "close" }
            else
                kind = kind or NAMES[op]
                parts[#parts + 1] = payload
                if fin then
                    return { data = concat(parts), kind = kind }
                end
            end
        end
    end, seconds or self.timeout)
    for _, line in ipairs(log) do
        self.log[#self.log + 1] = line
    end
    if msg then
        return msg.data, msg.kind
    end
    return nil, self.conn.closed and "closed" or "timeout"
end

--- Sends a close frame (`code`, 1000 by default) and waits for the server's.
function WebSocket:close(code, reason)
    if not self.conn.closed and not self.closing then
        self.closing = true
        code = code or 1000
        self.conn:send(frame(8, char(rshift(code, 8), band(code, 255)) .. (reason or "")))
        local data, kind = self:receive(self.timeout)
        while data and kind ~= "close" do
            data, kind = self:receive(self.timeout)
        end
    end
    self.conn:close()
end

--- Opens a WebSocket on `path` (the HTTP/1.1 handshake, RFC 6455 4.1, with the jar's
-- cookies and opts.headers; opts.protocols, a list for Sec-WebSocket-Protocol; opts.timeout).
-- Returns the socket (`ws:send(data[, kind])`, `ws:receive([seconds])`, `ws:close([code])`,
-- `ws.log`) and the handshake's reply, or nil and the reply when the server did not switch.
function Client:websocket(path, opts)
    opts = opts or {}
    if type(path) ~= "string" or path:find("[%s%c]") then
        error("bad path (a request target without spaces or control bytes expected)", 2)
    end
    local key = crypto.base64url_encode(crypto.random(16)):gsub("-", "+"):gsub("_", "/") .. "=="
    local lines = { "GET " .. path .. " HTTP/1.1", "Host: " .. one_line("host", opts.host
        or self.host), "Upgrade: websocket", "Connection: Upgrade",
        "Sec-WebSocket-Key: " .. key, "Sec-WebSocket-Version: 13" }
    if opts.protocols then
        lines[#lines + 1] = "Sec-WebSocket-Protocol: " .. one_line("protocols",
            concat(opts.protocols, ", "))
    end
    local c = cookie_field(self.cookies)
    if c then
        lines[#lines + 1] = "Cookie: " .. c
    end
    for name, value in pairs(opts.headers or {}) do
        lines[#lines + 1] = one_line("field name", name) .. ": " .. one_line(name, value)
    end
    local timeout = opts.timeout or self.timeout
    local conn = self.server:connect()
    conn:send(concat(lines, "\r\n") .. "\r\n\r\n")
    local reply, log = conn:wait(function(cn)
        local r, whole = parse_reply(cn.buf, cn.closed, false)
        if whole then
            return r
        end
    end, timeout)
    reply = reply or parse_reply(conn.buf, true, false)
    if not reply then
        conn:close()
        error(format("moonserve.test: WebSocket %s: no reply within %g s", path, timeout), 2)
    end
    keep_cookies(self.cookies, reply.set_cookies)
    reply.cookies, reply.set_cookies = reply.set_cookies, nil
    reply.log, reply.request, reply.complete = log, "GET " .. path, true
    setmetatable(reply, Response)
    if reply.status ~= 101 then
        conn:close()
        return nil, reply
    end
    conn.buf = conn.buf:sub(reply.body_at)
    reply.body_at = nil
    return setmetatable({ conn = conn, timeout = timeout, log = {} }, WebSocket), reply
end

--- Sends `bytes` as they are over a new in-memory connection; returns what the server wrote
-- until it closed or `seconds` (the client's timeout) went by, and the log lines.
function Client:raw(bytes, seconds)
    local out, _, _, log = self.server:exchange(bytes, function() return false end,
        seconds or self.timeout, 0)
    return out, log
end

--- Turns the loop for `seconds`, so that timers and other background work of the app run
-- while no request is under way; returns the log lines of the while.
function Client:run(seconds)
    return self.server:turn(seconds or 0)
end

--- The value of the jar's cookie `name`, or nil.
function Client:cookie(name)
    return self.cookies[name]
end

--- Ends the in-process server (its on_worker_stop hooks run).
function Client:close()
    self.server:close()
end

--- A client for `app`, served in this process. opts: host (the Host field, "localhost"),
-- timeout (seconds a reply may take, 5), limits (as app:run's), start_hooks (false: the
-- app's on_worker_start hooks do not run; they do by default, as in a worker), quiet (true:
-- the log's lines go only to the replies' `log`, not to standard error).
function _M.client(app, opts)
    opts = opts or {}
    if type(app) ~= "table" or type(app.handle) ~= "function" then
        error("bad app (moonserve.app() expected)", 2)
    end
    local server = host.module("inprocess").open(app, opts)
    return setmetatable({ app = app, server = server, host = opts.host or "localhost",
        timeout = opts.timeout or DEFAULT_TIMEOUT, cookies = {},
        start_log = server.start_log }, Client)
end

return _M
