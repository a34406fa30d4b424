-- spec/it/h2_spec.lua: a real moonserve speaking HTTP/2 with prior knowledge over loopback:
-- real clients (curl, nghttp, h2load), and frames written by hand for what clients never send.
local helper = require "helper"
local socket = require "socket"
local bit = require "bit"

local q = helper.sh_quote
local band, rshift = bit.band, bit.rshift
local char, byte, concat = string.char, string.byte, table.concat

-- -- Frames ---------------------------------------------------------------------------------

local PREFACE = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
local T = { DATA = 0x0, HEADERS = 0x1, PRIORITY = 0x2, RST_STREAM = 0x3, SETTINGS = 0x4,
    PUSH_PROMISE = 0x5, PING = 0x6, GOAWAY = 0x7, WINDOW_UPDATE = 0x8, CONTINUATION = 0x9 }
local E = { NO_ERROR = 0x0, PROTOCOL_ERROR = 0x1, INTERNAL_ERROR = 0x2, FLOW_CONTROL_ERROR = 0x3,
    STREAM_CLOSED = 0x5, FRAME_SIZE_ERROR = 0x6, REFUSED_STREAM = 0x7, CANCEL = 0x8,
    COMPRESSION_ERROR = 0x9, ENHANCE_YOUR_CALM = 0xb }
local END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
local MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_HEADER_LIST_SIZE = 0x3, 0x4, 0x6
local NO_RFC7540_PRIORITIES = 0x9

local function u32(n)
    return char(band(rshift(n, 24), 255), band(rshift(n, 16), 255), band(rshift(n, 8), 255),
        band(n, 255))
end

local function get_u32(s, i)
    local a, b, c, d = byte(s, i, i + 3)
    return ((a * 256 + b) * 256 + c) * 256 + d
end

-- One frame: the 9-byte header (length, type, flags, stream) and the payload.
local function frame(ftype, flags, stream, payload)
    payload = payload or ""
    local n = #payload
    return char(band(rshift(n, 16), 255), band(rshift(n, 8), 255), band(n, 255), ftype, flags)
        .. u32(stream) .. payload
end

-- SETTINGS from a list of identifier, value, identifier, value...
local function settings(list)
    local out = {}
    for i = 1, #list, 2 do
        out[#out + 1] = char(0, list[i]) .. u32(list[i + 1])
    end
    return frame(T.SETTINGS, 0, 0, concat(out))
end

local function data(stream, payload, flags)
    return frame(T.DATA, flags or 0, stream, payload)
end

local function rst(stream, code)
    return frame(T.RST_STREAM, 0, stream, u32(code))
end

local function ping(opaque)
    return frame(T.PING, 0, 0, opaque or "12345678")
end

-- -- HPACK: literal fields without indexing and without Huffman coding, and enough of a
-- decoder for the server's replies (the static and dynamic tables; Huffman-coded strings
-- are left coded, which :status and short numbers never are).

local function hpack_int(prefix_bits, first, n)
    local max = 2 ^ prefix_bits - 1
    if n < max then
        return char(first + n)
    end
    local out = { char(first + max) }
    n = n - max
    while n >= 128 do
        out[#out + 1] = char(n % 128 + 128)
        n = math.floor(n / 128)
    end
    out[#out + 1] = char(n)
    return concat(out)
end

local function literal(name, value)
    return "\0" .. hpack_int(7, 0, #name) .. name .. hpack_int(7, 0, #value) .. value
end

-- A literal field with incremental indexing (the "01" prefix): the server's decoder adds it to
-- its dynamic table. `name` is a new name, or the table index of an entry whose name it takes.
local function literal_indexed(name, value)
    local head = type(name) == "number" and hpack_int(6, 0x40, name)
        or "\64" .. hpack_int(7, 0, #name) .. name
    return head .. hpack_int(7, 0, #value) .. value
end

-- A dynamic table size update (the "001" prefix), which only the start of a block may hold.
local function table_size_update(n)
    return hpack_int(5, 0x20, n)
end

-- A request's header block: the pseudo-fields, then `extra` ({ name, value } pairs).
local function request(method, path, extra)
    local out = { literal(":method", method), literal(":scheme", "http"), literal(":path", path),
        literal(":authority", "127.0.0.1") }
    for _, f in ipairs(extra or {}) do
        out[#out + 1] = literal(f[1], f[2])
    end
    return concat(out)
end

local function headers(stream, block, flags)
    return frame(T.HEADERS, flags or END_HEADERS, stream, block)
end

local STATIC = { { ":authority" }, { ":method", "GET" }, { ":method", "POST" }, { ":path", "/" },
    { ":path", "/index.html" }, { ":scheme", "http" }, { ":scheme", "https" }, { ":status", "200" },
    { ":status", "204" }, { ":status", "206" }, { ":status", "304" }, { ":status", "400" },
    { ":status", "404" }, { ":status", "500" }, { "accept-charset" },
    { "accept-encoding", "gzip, deflate" }, { "accept-language" }, { "accept-ranges" },
    { "accept" }, { "access-control-allow-origin" }, { "age" }, { "allow" }, { "authorization" },
    { "cache-control" }, { "content-disposition" }, { "content-encoding" }, { "content-language" },
    { "content-length" }, { "content-location" }, { "content-range" }, { "content-type" },
    { "cookie" }, { "date" }, { "etag" }, { "expect" }, { "expires" }, { "from" }, { "host" },
    { "if-match" }, { "if-modified-since" }, { "if-none-match" }, { "if-range" },
    { "if-unmodified-since" }, { "last-modified" }, { "link" }, { "location" }, { "max-forwards" },
    { "proxy-authenticate" }, { "proxy-authorization" }, { "range" }, { "referer" }, { "refresh" },
    { "retry-after" }, { "server" }, { "set-cookie" }, { "strict-transport-security" },
    { "transfer-encoding" }, { "user-agent" }, { "vary" }, { "via" }, { "www-authenticate" } }

local function decode_int(s, i, prefix_bits)
    local max = 2 ^ prefix_bits - 1
    local n = band(byte(s, i), max)
    i = i + 1
    if n < max then
        return n, i
    end
    local m = 0
    repeat
        local b = byte(s, i)
        i = i + 1
        n = n + band(b, 127) * 2 ^ m
        m = m + 7
    until b < 128
    return n, i
end

local HUFFMAN = "(huffman)"
local function decode_str(s, i)
    local huffman = band(byte(s, i), 0x80) ~= 0
    local n
    n, i = decode_int(s, i, 7)
    return huffman and HUFFMAN or s:sub(i, i + n - 1), i + n
end

-- The decoder's state is the connection's: its dynamic table.
local function table_entry(c, index)
    if index <= #STATIC then
        return STATIC[index][1], STATIC[index][2]
    end
    local e = assert(c.dyn[index - #STATIC], "HPACK index out of range: " .. index)
    return e[1], e[2]
end

local function table_evict(c)
    while c.dyn_size > c.dyn_max do
        local e = table.remove(c.dyn)
        c.dyn_size = c.dyn_size - e[3]
    end
end

local function table_add(c, name, value)
    local size = #name + #value + 32
    table.insert(c.dyn, 1, { name, value, size })
    c.dyn_size = c.dyn_size + size
    table_evict(c)
end

local function decode_block(c, s)
    local out, i = {}, 1
    while i <= #s do
        local b = byte(s, i)
        local name, value
        if b >= 0x80 then -- indexed
            local index
            index, i = decode_int(s, i, 7)
            name, value = table_entry(c, index)
        elseif b >= 0x40 or b < 0x20 then -- literal: with indexing, or without/never
            local index
            index, i = decode_int(s, i, b >= 0x40 and 6 or 4)
            if index == 0 then
                name, i = decode_str(s, i)
            else
                name = table_entry(c, index)
            end
            value, i = decode_str(s, i)
            if b >= 0x40 then
                table_add(c, name, value)
            end
        else -- dynamic table size update
            c.dyn_max, i = decode_int(s, i, 5)
            table_evict(c)
        end
        if name then
            out[#out + 1] = { name, value }
        end
    end
    return out
end

-- -- A client connection ---------------------------------------------------------------------

local Conn = {}
Conn.__index = Conn

-- Opens a connection. opts.auto_ack = false: do not acknowledge the server's SETTINGS (by
-- default, reading them sends the ACK); opts.rcvbuf: a small receive buffer, so that what the
-- server sends backs up as soon as the client stops reading.
local function connect(port, opts)
    opts = opts or {}
    local s = assert(socket.tcp4())
    if opts.rcvbuf then
        assert(s:setoption("recv-buffer-size", opts.rcvbuf))
    end
    s:settimeout(5)
    assert(s:connect("127.0.0.1", port))
    return setmetatable({ s = s, buf = "", dyn = {}, dyn_size = 0, dyn_max = 4096,
        auto_ack = opts.auto_ack ~= false, streams = {} }, Conn)
end

function Conn:send(...)
    self.s:settimeout(10)
    return self.s:send(concat { ... })
end

-- The preface and an empty SETTINGS.
function Conn:hello()
    return assert(self:send(PREFACE, settings {}))
end

function Conn:close()
    self.s:close()
end

-- Fills the read buffer to `n` bytes, by `deadline`; nil, "timeout" or "closed" if not.
function Conn:fill(n, deadline)
    while #self.buf < n do
        local left = deadline - socket.gettime()
        if left <= 0 then
            return nil, "timeout"
        end
        self.s:settimeout(left)
        local got, err, partial = self.s:receive(n - #self.buf)
        got = got or partial
        if got and #got > 0 then
            self.buf = self.buf .. got
        end
        if err and err ~= "timeout" and #self.buf < n then
            return nil, "closed"
        end
    end
    return true
end

-- What a frame says, as fields of the frame; the stream's record keeps what its frames said.
function Conn:interpret(f)
    local p = f.payload
    if f.type == T.GOAWAY then
        f.last_stream = band(get_u32(p, 1), 0x7fffffff)
        f.code = get_u32(p, 5)
        f.debug = p:sub(9)
    elseif f.type == T.RST_STREAM then
        f.code = get_u32(p, 1)
    elseif f.type == T.SETTINGS then
        f.settings = {}
        for i = 1, #p, 6 do
            f.settings[byte(p, i) * 256 + byte(p, i + 1)] = get_u32(p, i + 2)
        end
        if band(f.flags, ACK) == 0 and self.auto_ack then
            self:send(frame(T.SETTINGS, ACK, 0, ""))
        end
    elseif f.type == T.WINDOW_UPDATE then
        f.increment = band(get_u32(p, 1), 0x7fffffff)
    elseif f.type == T.DATA and band(f.flags, PADDED) ~= 0 then
        f.payload = p:sub(2, #p - byte(p, 1))
    elseif f.type == T.HEADERS or f.type == T.CONTINUATION then
        if f.type == T.HEADERS then
            local from, to = 1, #p
            if band(f.flags, PADDED) ~= 0 then
                from, to = 2, #p - byte(p, 1)
            end
            if band(f.flags, PRIORITY) ~= 0 then
                from = from + 5
            end
            self.fragment = p:sub(from, to)
        else
            self.fragment = self.fragment .. p
        end
        if band(f.flags, END_HEADERS) ~= 0 then
            f.fields = {}
            for _, kv in ipairs(decode_block(self, self.fragment)) do
                f.fields[kv[1]] = kv[2]
            end
            f.status = tonumber(f.fields[":status"])
        end
    end
    if f.stream == 0 then
        return
    end
    local st = self.streams[f.stream] or { parts = {} }
    self.streams[f.stream] = st
    if f.status and not st.status then
        st.status, st.fields = f.status, f.fields
    elseif f.type == T.DATA then
        st.parts[#st.parts + 1] = f.payload
    elseif f.type == T.RST_STREAM then
        st.rst = f.code
    end
    if (f.type == T.HEADERS or f.type == T.DATA) and band(f.flags, END_STREAM) ~= 0 then
        st.ended = true
    end
end

-- The frame whose header starts at `pos` in `b`, if `b` holds all of it.
local function parse_frame(b, pos)
    if pos + 8 > #b then
        return nil
    end
    local len = byte(b, pos) * 65536 + byte(b, pos + 1) * 256 + byte(b, pos + 2)
    if pos + 8 + len > #b then
        return nil
    end
    return { type = byte(b, pos + 3), flags = byte(b, pos + 4),
        stream = band(get_u32(b, pos + 5), 0x7fffffff), len = len,
        payload = b:sub(pos + 9, pos + 8 + len) }
end

-- The next frame by `deadline`; nil, "timeout" or "closed" if none.
function Conn:read_frame(deadline)
    local ok, err = self:fill(9, deadline)
    if not ok then
        return nil, err
    end
    ok, err = self:fill(9 + byte(self.buf, 1) * 65536 + byte(self.buf, 2) * 256
        + byte(self.buf, 3), deadline)
    if not ok then
        return nil, err
    end
    local f = parse_frame(self.buf, 1)
    self.buf = self.buf:sub(10 + f.len)
    self:interpret(f)
    return f
end

-- Reads until the server closes or `timeout` passes, then parses all that came: for floods,
-- answered with many thousands of frames. Returns the frames and "closed" or "timeout".
function Conn:drain(timeout)
    local deadline = socket.gettime() + timeout
    local parts, why = { self.buf }, "timeout"
    while socket.gettime() < deadline do
        self.s:settimeout(deadline - socket.gettime())
        local got, err, partial = self.s:receive(1048576)
        got = got or partial
        if got and #got > 0 then
            parts[#parts + 1] = got
        end
        if err and err ~= "timeout" then
            why = "closed"
            break
        end
    end
    local all, pos, frames = concat(parts), 1, {}
    while true do
        local f = parse_frame(all, pos)
        if not f then
            break
        end
        self:interpret(f)
        frames[#frames + 1] = f
        pos = pos + 9 + f.len
    end
    self.buf = all:sub(pos)
    return frames, why
end

local function is_goaway(f)
    return f.type == T.GOAWAY
end

-- Reads frames until stop(frame) says so (by default: a GOAWAY), the connection closes, or
-- `timeout` seconds pass. Returns the frames and why it stopped: "stop", "closed", "timeout".
function Conn:collect(timeout, stop)
    stop = stop or is_goaway
    local deadline = socket.gettime() + (timeout or 5)
    local frames = {}
    while true do
        local f, err = self:read_frame(deadline)
        if not f then
            return frames, err
        end
        frames[#frames + 1] = f
        if stop(f) then
            return frames, "stop"
        end
    end
end

-- What a stream got: { status, fields, body, ended, rst }.
function Conn:stream(id)
    local st = self.streams[id] or { parts = {} }
    st.body = concat(st.parts)
    return st
end

-- A stop condition: every stream of `ids` has ended or was reset.
function Conn:until_done(...)
    local ids = { ... }
    return function()
        for _, id in ipairs(ids) do
            local st = self.streams[id]
            if not (st and (st.ended or st.rst)) then
                return false
            end
        end
        return true
    end
end

-- Whether the server closes the connection within `timeout` (frames before that are read).
function Conn:closes(timeout)
    local _, why = self:collect(timeout or 3, function() return false end)
    return why == "closed"
end

-- The frames as lines ("GOAWAY[0] code=0xb 'reason'"), for failure messages.
local NAMES = {}
for k, v in pairs(T) do
    NAMES[v] = k
end
local function describe_frames(frames)
    local out = {}
    for _, f in ipairs(frames) do
        local s = ("%s[%d] flags=0x%x len=%d"):format(NAMES[f.type] or f.type, f.stream, f.flags,
            f.len)
        if f.code then
            s = s .. (" code=0x%x"):format(f.code)
        end
        if f.last_stream then
            s = s .. " last=" .. f.last_stream
        end
        if f.status then
            s = s .. " :status=" .. f.status
        end
        if f.debug and #f.debug > 0 then
            s = s .. " '" .. f.debug .. "'"
        end
        out[#out + 1] = s
    end
    return concat(out, "\n")
end

local function find(frames, ftype)
    for _, f in ipairs(frames) do
        if f.type == ftype then
            return f
        end
    end
end

local function count(frames, ftype, flags)
    local n = 0
    for _, f in ipairs(frames) do
        if f.type == ftype and (flags == nil or f.flags == flags) then
            n = n + 1
        end
    end
    return n
end

-- -- Other helpers ---------------------------------------------------------------------------

local write, sh = helper.write_file, helper.sh

local function occurrences(text, plain)
    local n, pos = 0, 1
    while true do
        local s, e = text:find(plain, pos, true)
        if not s then
            return n
        end
        n, pos = n + 1, e + 1
    end
end

-- The resident memory of process `pid`, in KiB.
local function rss_kib(pid)
    local status = helper.read_file("/proc/" .. pid .. "/status")
    return tonumber((assert(status:match("VmRSS:%s*(%d+) kB"), "no VmRSS for " .. pid)))
end

-- A plain GET / on a new connection: the server still serves.
local function serves(port)
    local c = connect(port)
    c:hello()
    c:send(headers(1, request("GET", "/"), END_HEADERS + END_STREAM))
    local frames = c:collect(5, c:until_done(1))
    c:close()
    local st = c:stream(1)
    assert.equal(200, st.status, describe_frames(frames))
    assert.equal("hello", st.body)
end

local twice = helper.twice(it)

-- -- The server with its default limits ---------------------------------------------------------

describe("moonserve over HTTP/2", function()
    local tmp, srv, base

    setup(function()
        tmp = os.tmpname()
        os.remove(tmp)
        sh("mkdir -p " .. q(tmp .. "/files"))
        -- An odd size, so the last DATA frame is a short one.
        sh("head -c 1048579 /dev/urandom > " .. q(tmp .. "/files/blob.bin"))
        write(tmp .. "/app.lua", ([[
local app = dofile(%q)
app:static("/files", %q)
return app
]]):format(helper.root .. "/spec/fixtures/h2app.lua", tmp .. "/files"))
        srv = helper.spawn_server { app = tmp .. "/app.lua" }
        base = "http://127.0.0.1:" .. srv.port
    end)

    teardown(function()
        assert.is_true(srv:stop(), "the server must stop on SIGTERM")
        sh("rm -rf " .. q(tmp))
    end)

    describe("with real clients", function()
        setup(function()
            helper.tool("curl")
            helper.tool("nghttp")
            helper.tool("h2load")
        end)

        local function curl(args)
            return helper.curl("--http2-prior-knowledge " .. args)
        end

        twice("answers a GET with :status, the standard fields and the body", function()
            local out = curl("-D - " .. base .. "/")
            local head, body = out:match("^(.-)\r\n\r\n(.*)$")
            assert.truthy(head, out)
            assert.equal("HTTP/2 200", (head:match("^[^\r\n]*"):gsub("%s+$", "")))
            local fields = {}
            for k, v in head:gmatch("\r\n([^:\r\n]+): ([^\r\n]*)") do
                fields[k] = v
            end
            assert.equal("text/plain; charset=utf-8", fields["content-type"])
            assert.equal("moonserve", fields["server"])
            assert.truthy(fields["date"] and fields["date"]:match(
                "^%a%a%a, %d%d %a%a%a %d%d%d%d %d%d:%d%d:%d%d GMT$"), head)
            assert.equal("5", fields["content-length"])
            assert.is_nil(fields["connection"])
            assert.equal("hello", body)
        end)

        twice("gives the handler version 2 and Host from :authority", function()
            local out = curl("-H 'x-probe: yes' " .. base .. "/whoami")
            assert.equal("2 127.0.0.1:" .. srv.port .. " yes", out)
        end)

        twice("echoes a POST body", function()
            local out = curl("--data-binary 'hello over h2' -w ' %{http_version}' "
                .. base .. "/echo")
            assert.equal("hello over h2 2", out)
        end)

        twice("echoes a 2 MiB body that takes many frames and window updates", function()
            local file = tmp .. "/upload.bin"
            sh("head -c 2097152 /dev/urandom > " .. q(file))
            local out = curl(("-o %s -w '%%{http_code} %%{size_upload} %%{size_download}' "
                .. "-H 'content-type: application/octet-stream' --data-binary @%s %s/echo")
                :format(q(file .. ".out"), q(file), base))
            assert.equal("200 2097152 2097152", out)
            assert.is_true(helper.read_file(file) == helper.read_file(file .. ".out"),
                "the echo differs from the upload")
            os.remove(file)
            os.remove(file .. ".out")
        end)

        -- A reply made before the body was read (here by middleware) leaves the stream open
        -- while the client sends the rest, which is dropped: a reset would make curl drop the
        -- reply with "(92) Stream error in the HTTP/2 framing layer".
        twice("answers a 4 MiB POST it does not read with 403, and curl takes the reply", function()
            local file = tmp .. "/upload.bin"
            sh("head -c 4194304 /dev/zero > " .. q(file))
            local out = curl(("-o %s -w '%%{http_code} %%{exitcode}' --data-binary @%s %s/admin/x")
                :format(q(file .. ".out"), q(file), base))
            assert.equal("403 0", out)
            assert.equal("forbidden", helper.read_file(file .. ".out"))
            os.remove(file)
            os.remove(file .. ".out")
        end)

        local function streamed(path)
            local out = curl("--max-time 5 -D - " .. base .. path)
            local head, body = out:match("^(.-)\r\n\r\n(.*)$")
            assert.truthy(head, out)
            assert.truthy(head:match("^HTTP/2 200"), head)
            assert.is_nil(head:lower():find("content-length", 1, true), head)
            assert.is_nil(head:lower():find("transfer-encoding", 1, true), head)
            assert.equal("one\ntwo\nthree\n", body)
        end

        twice("streams a reply written in pieces, without content-length", function()
            streamed("/stream")
        end)

        -- Ten times over: a handler that flushes hung when the socket took a piece at once
        -- (the handler woken by that write replied again, and the turn that would frame it
        -- waited for the next event), about one time in four.
        it("streams a reply whose handler flushes after each piece", function()
            for _ = 1, 10 do
                streamed("/flushed")
            end
        end)

        twice("serves a static file byte for byte", function()
            local file = tmp .. "/files/blob.bin"
            local out = curl(("-o %s -w '%%{http_code} %%{size_download} %%{content_type}' %s")
                :format(q(tmp .. "/blob.out"), base .. "/files/blob.bin"))
            assert.equal("200 1048579 application/octet-stream", out)
            assert.is_true(helper.read_file(file) == helper.read_file(tmp .. "/blob.out"),
                "the download differs from the file")
            os.remove(tmp .. "/blob.out")
        end)

        twice("answers 50 concurrent streams on one connection (nghttp)", function()
            local out = helper.run("timeout 20 " .. helper.tool("nghttp") .. " -nv -m 50 "
                .. base .. "/ 2>&1")
            local ids, n = {}, 0
            for id, status in out:gmatch("recv %(stream_id=(%d+)%) :status: (%d+)") do
                assert.equal("200", status)
                assert.is_nil(ids[id], "stream " .. id .. " answered twice")
                ids[id] = true
                n = n + 1
            end
            assert.equal(50, n, out:sub(-2000))
            assert.equal(1, occurrences(out, "] Connected"))
            assert.equal(50, occurrences(out, "recv DATA frame <length=5, flags=0x01"))
        end)

        it("answers 5000 requests over 4 connections, 16 streams each (h2load)", function()
            local out = helper.run("timeout 30 " .. helper.tool("h2load") .. " -n 5000 -c 4 -m 16 "
                .. base .. "/ 2>&1")
            assert.truthy(out:find("5000 succeeded, 0 failed, 0 errored", 1, true), out)
            assert.truthy(out:find("status codes: 5000 2xx, 0 3xx, 0 4xx, 0 5xx", 1, true), out)
        end)

        twice("upgrades a GET from HTTP/1.1 (h2c)", function()
            local out = helper.curl("--http2 -w ' %{http_version}' " .. base .. "/whoami")
            assert.equal("2 127.0.0.1:" .. srv.port .. " - 2", out)
        end)

        it("still speaks HTTP/1.1 on the same listener", function()
            local res = helper.request(srv.port, "GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            assert.equal(200, res.status)
            assert.equal("hello", res.body)
        end)
    end)

    describe("frame by frame", function()
        twice("advertises its settings first", function()
            local c = connect(srv.port)
            c:hello()
            local frames = c:collect(5, function(f)
                return f.type == T.SETTINGS and band(f.flags, ACK) == 0
            end)
            c:close()
            local f = frames[1]
            assert.equal(T.SETTINGS, f and f.type, describe_frames(frames))
            assert.equal(100, f.settings[MAX_CONCURRENT_STREAMS])
            assert.equal(256 * 1024, f.settings[INITIAL_WINDOW_SIZE])
            assert.equal(32 * 1024, f.settings[MAX_HEADER_LIST_SIZE]) -- head_bytes
            assert.equal(1, f.settings[NO_RFC7540_PRIORITIES])
        end)

        twice("reads a body with trailers whole", function()
            local c = connect(srv.port)
            c:hello()
            c:send(headers(1, request("POST", "/echo")), data(1, "hello "), data(1, "world"),
                headers(1, literal("x-checksum", "abc") .. literal("x-more", "1"),
                    END_HEADERS + END_STREAM))
            local frames = c:collect(5, c:until_done(1))
            c:close()
            local st = c:stream(1)
            assert.equal(200, st.status, describe_frames(frames))
            assert.equal("hello world", st.body)
            assert.is_true(st.ended)
            assert.is_nil(st.rst)
        end)

        twice("answers a bad preface over HTTP/1.1 with 400 and closes, with no frame", function()
            local s = helper.connect(srv.port, 5)
            assert(s:send("PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"))
            local all, err, partial = s:receive("*a")
            s:close()
            all = all or partial
            assert.is_true(err == nil or err == "closed", err)
            -- one HTTP/1.1 reply and nothing after it: no SETTINGS, no frame at all
            local head, body = all:match("^(.-)\r\n\r\n(.*)$")
            assert.truthy(head and head:match("^HTTP/1%.1 400 "), all)
            assert.truthy(head:find("\r\nconnection: close", 1, true), head)
            assert.truthy(head:find("\r\ncontent-length: 16", 1, true), head)
            assert.equal("400 Bad Request\n", body)
            serves(srv.port)
        end)

        twice("ends the connection with PROTOCOL_ERROR when SETTINGS does not follow the preface",
            function()
                local c = connect(srv.port)
                c:send(PREFACE, ping())
                local frames = c:collect(5)
                local g = find(frames, T.GOAWAY)
                assert.truthy(g, describe_frames(frames))
                assert.equal(E.PROTOCOL_ERROR, g.code, describe_frames(frames))
                assert.equal(0, count(frames, T.PING))
                assert.is_true(c:closes())
                c:close()
            end)

        -- RFC 9113 5.1: a stream both sides ended is closed; DATA or HEADERS on it is a
        -- connection error, though nghttp2 has forgotten the stream.
        for _, late in ipairs { "DATA", "HEADERS" } do
            twice("answers " .. late .. " on a stream both sides ended with GOAWAY STREAM_CLOSED",
                function()
                    local c = connect(srv.port)
                    c:hello()
                    c:send(headers(1, request("GET", "/"), END_HEADERS + END_STREAM))
                    c:collect(5, c:until_done(1))
                    assert.equal(200, c:stream(1).status)
                    c:send(late == "DATA" and data(1, "late")
                        or headers(1, request("GET", "/"), END_HEADERS + END_STREAM))
                    local frames = c:collect(5)
                    local g = find(frames, T.GOAWAY)
                    assert.truthy(g, describe_frames(frames))
                    assert.equal(E.STREAM_CLOSED, g.code)
                    assert.is_true(c:closes())
                    c:close()
                    serves(srv.port)
                end)
        end

        twice("ignores DATA on a stream it reset, and goes on serving", function()
            local c = connect(srv.port)
            c:hello()
            c:send(headers(1, request("GET", "/", { { "X-Upper", "1" } }), END_HEADERS))
            local frames = c:collect(5, function(f)
                return f.stream == 1 and f.type == T.RST_STREAM
            end)
            assert.equal(E.PROTOCOL_ERROR, c:stream(1).rst, describe_frames(frames))
            c:send(data(1, "sent before the client saw the reset"))
            local why
            frames, why = c:collect(0.5)
            assert.equal("timeout", why, describe_frames(frames))
            assert.equal(0, #frames, describe_frames(frames))
            c:send(headers(3, request("GET", "/"), END_HEADERS + END_STREAM))
            frames = c:collect(5, c:until_done(3))
            c:close()
            assert.equal(200, c:stream(3).status, describe_frames(frames))
            assert.equal("hello", c:stream(3).body)
        end)

        twice("answers DATA on a stream the client reset with RST_STREAM STREAM_CLOSED", function()
            local c = connect(srv.port)
            c:hello()
            c:send(headers(1, request("POST", "/"), END_HEADERS), rst(1, E.CANCEL), data(1, "x"))
            local frames = c:collect(5, function(f)
                return f.stream == 1 and f.type == T.RST_STREAM
            end)
            assert.equal(E.STREAM_CLOSED, c:stream(1).rst, describe_frames(frames))
            c:send(headers(3, request("GET", "/"), END_HEADERS + END_STREAM))
            frames = c:collect(5, c:until_done(3))
            c:close()
            assert.equal(200, c:stream(3).status, describe_frames(frames))
            assert.equal(0, count(frames, T.GOAWAY), describe_frames(frames))
        end)

        twice("answers HEADERS on a stream id below one already used with GOAWAY PROTOCOL_ERROR",
            function()
                local c = connect(srv.port)
                c:hello()
                c:send(headers(5, request("GET", "/"), END_HEADERS + END_STREAM),
                    headers(3, request("GET", "/"), END_HEADERS + END_STREAM))
                local frames = c:collect(5)
                local g = find(frames, T.GOAWAY)
                assert.truthy(g, describe_frames(frames))
                assert.equal(E.PROTOCOL_ERROR, g.code)
                assert.is_nil(c.streams[3] and c.streams[3].status)
                c:close()
            end)

        -- RFC 9113 6.3 and 5.3.1; nghttp2 drops PRIORITY frames unread once priorities are off,
        -- and a reset of an idle stream unsent.
        for name, bytes in pairs { ["on stream 0"] = frame(T.PRIORITY, 0, 0, u32(1) .. "\16"),
            ["making an idle stream depend on itself"] = frame(T.PRIORITY, 0, 9,
                u32(9) .. "\16") } do
            twice("answers PRIORITY " .. name .. " with GOAWAY PROTOCOL_ERROR", function()
                local c = connect(srv.port)
                c:hello()
                c:send(bytes)
                local frames = c:collect(5)
                local g = find(frames, T.GOAWAY)
                assert.truthy(g, describe_frames(frames))
                assert.equal(E.PROTOCOL_ERROR, g.code)
                assert.is_true(c:closes())
                c:close()
            end)
        end

        -- What h2spec's flow-control and malformed-request cases meet after an early reply: a
        -- stream still open, whose frames nghttp2 checks.
        twice("checks what a client sends after an early reply: a window over 2^31-1, a "
            .. "content-length the DATA does not match, a zero WINDOW_UPDATE", function()
                local c = connect(srv.port)
                c:hello()
                c:send(headers(1, request("POST", "/admin/x"), END_HEADERS),
                    headers(3, request("POST", "/admin/x", { { "content-length", "10" } }),
                        END_HEADERS),
                    headers(5, request("POST", "/admin/x"), END_HEADERS))
                c:collect(5, c:until_done(1, 3, 5))
                c:send(frame(T.WINDOW_UPDATE, 0, 1, u32(0x7fffffff)), data(3, "12345", END_STREAM))
                local frames = c:collect(5, function()
                    return c.streams[1] and c.streams[1].rst and c.streams[3]
                        and c.streams[3].rst
                end)
                for _, id in ipairs { 1, 3, 5 } do
                    assert.equal(403, c:stream(id).status, describe_frames(frames))
                end
                assert.equal(E.FLOW_CONTROL_ERROR, c:stream(1).rst, describe_frames(frames))
                assert.equal(E.PROTOCOL_ERROR, c:stream(3).rst)
                c:send(frame(T.WINDOW_UPDATE, 0, 5, u32(0)))
                frames = c:collect(5)
                local g = find(frames, T.GOAWAY)
                assert.truthy(g, describe_frames(frames))
                assert.equal(E.PROTOCOL_ERROR, g.code)
                c:close()
            end)

        twice("answers DATA after END_STREAM, while the reply is pending, with GOAWAY " ..
            "STREAM_CLOSED", function()
                local c = connect(srv.port)
                c:hello()
                c:send(headers(1, request("GET", "/sleep?s=0.3"), END_HEADERS + END_STREAM))
                socket.sleep(0.1) -- the handler sleeps: the stream is half-closed (remote)
                c:send(data(1, "late"))
                local frames = c:collect(5)
                local g = frames[#frames]
                assert.equal(T.GOAWAY, g and g.type, describe_frames(frames))
                assert.equal(E.STREAM_CLOSED, g.code)
                assert.equal("DATA: stream in half-closed(remote)", g.debug)
                assert.equal(1, g.last_stream)
                assert.is_true(c:closes())
                c:close()
                serves(srv.port)
            end)

        twice("resets a stream with an invalid field, and serves the next", function()
            local c = connect(srv.port)
            c:hello()
            -- an uppercase name, and a connection-specific field: both invalid in HTTP/2
            c:send(headers(1, request("GET", "/", { { "X-Upper", "1" } }), END_HEADERS + END_STREAM),
                headers(3, request("GET", "/", { { "connection", "close" } }),
                    END_HEADERS + END_STREAM),
                headers(5, request("GET", "/"), END_HEADERS + END_STREAM))
            local frames = c:collect(5, c:until_done(1, 3, 5))
            for _, id in ipairs { 1, 3 } do
                local st = c:stream(id)
                assert.is_nil(st.status, describe_frames(frames))
                assert.equal(E.PROTOCOL_ERROR, st.rst, describe_frames(frames))
            end
            assert.equal(200, c:stream(5).status, describe_frames(frames))
            c:close()
        end)

        twice("answers a frame larger than 16384 bytes with GOAWAY FRAME_SIZE_ERROR", function()
            local c = connect(srv.port)
            c:hello()
            c:send(headers(1, request("POST", "/wait")), data(1, ("x"):rep(16385)))
            local frames = c:collect(5)
            local g = frames[#frames]
            assert.equal(T.GOAWAY, g and g.type, describe_frames(frames))
            assert.equal(E.FRAME_SIZE_ERROR, g.code)
            assert.equal(1, g.last_stream)
            assert.is_nil(c.streams[1] and c.streams[1].status)
            assert.is_true(c:closes())
            c:close()
            serves(srv.port)
        end)

        -- nghttp2 enforces MAX_CONCURRENT_STREAMS in two ways: before the client acknowledges
        -- the server's SETTINGS, a stream over it is refused; after, it is a connection error.
        local function open_101(c)
            local out = {}
            for i = 1, 101 do
                out[i] = headers(2 * i - 1, request("POST", "/wait"))
            end
            assert(c:send(concat(out)))
        end

        twice("ends a connection that opens a 101st stream after the SETTINGS ACK", function()
            local c = connect(srv.port)
            c:hello()
            c:collect(5, function(f)
                return f.type == T.SETTINGS and band(f.flags, ACK) == 0
            end) -- and acknowledged
            open_101(c)
            local frames = c:collect(5)
            local g = frames[#frames]
            assert.equal(T.GOAWAY, g and g.type, describe_frames(frames))
            assert.equal(E.PROTOCOL_ERROR, g.code)
            assert.equal("request HEADERS: max concurrent streams exceeded", g.debug)
            assert.equal(199, g.last_stream)
            assert.equal(0, count(frames, T.HEADERS), describe_frames(frames))
            assert.is_true(c:closes())
            c:close()
            serves(srv.port)
        end)

        twice("refuses a 101st stream opened before the SETTINGS ACK, and serves the 100",
            function()
                local c = connect(srv.port, { auto_ack = false })
                c:hello()
                open_101(c)
                local frames = c:collect(5, function(f) return f.type == T.RST_STREAM end)
                local r = frames[#frames]
                assert.equal(T.RST_STREAM, r and r.type, describe_frames(frames))
                assert.equal(201, r.stream)
                assert.equal(E.REFUSED_STREAM, r.code)
                assert.equal(0, count(frames, T.GOAWAY))
                c:send(data(1, "abc", END_STREAM), data(199, "de", END_STREAM))
                frames = c:collect(5, c:until_done(1, 199))
                c:close()
                assert.equal("got 3", c:stream(1).body, describe_frames(frames))
                assert.equal("got 2", c:stream(199).body)
                assert.equal(200, c:stream(199).status)
            end)

        twice("ends a Rapid Reset (2000 streams opened and cancelled) with GOAWAY", function()
            local c = connect(srv.port)
            c:hello()
            local out = {}
            for i = 1, 2000 do
                out[#out + 1] = headers(2 * i - 1, request("POST", "/wait"))
                out[#out + 1] = rst(2 * i - 1, E.CANCEL)
            end
            c:send(concat(out)) -- may fail part way: the server has had enough
            local frames = c:collect(5)
            local g = frames[#frames]
            assert.equal(T.GOAWAY, g and g.type, describe_frames(frames))
            -- nghttp2's stream reset rate limit answers INTERNAL_ERROR
            assert.equal(E.INTERNAL_ERROR, g.code)
            -- the burst (1000 resets) passes, the 1001st (stream 2001) does not; the
            -- refill (33/s) could let a few more through if a second turns meanwhile
            assert.is_true(g.last_stream >= 2001 and g.last_stream < 2001 + 2 * 66,
                describe_frames(frames))
            assert.equal(0, count(frames, T.HEADERS), describe_frames(frames))
            assert.is_true(c:closes())
            c:close()
            serves(srv.port)
        end)

        twice("ends a CONTINUATION flood (20 after HEADERS) with GOAWAY PROTOCOL_ERROR", function()
            local before = occurrences(srv:log(), "Too many CONTINUATION frames")
            local c = connect(srv.port)
            c:hello()
            local out = { headers(1, request("GET", "/"), END_STREAM) } -- no END_HEADERS
            for i = 1, 20 do
                out[#out + 1] = frame(T.CONTINUATION, 0, 1, literal("x-c" .. i, "v"))
            end
            assert(c:send(concat(out)))
            local frames = c:collect(5)
            local g = frames[#frames]
            assert.equal(T.GOAWAY, g and g.type, describe_frames(frames))
            assert.equal(E.PROTOCOL_ERROR, g.code)
            assert.equal(0, count(frames, T.HEADERS), describe_frames(frames))
            assert.is_true(c:closes())
            c:close()
            assert.equal(before + 1, occurrences(srv:log(), "Too many CONTINUATION frames"))
            serves(srv.port)
        end)

        -- What the core sends when nghttp2 reports a flood of acknowledgements to send.
        local FLOOD_CODE = E.ENHANCE_YOUR_CALM
        local FLOODING = "HTTP/2: Flooding was detected"

        -- Frames that each want an acknowledgement, sent by a client that does not read (and
        -- has a small receive buffer), 1000 at a time until the server ends the connection or
        -- 500000 have gone. The acknowledgements back up in the server, nghttp2 refuses to
        -- hold more than 1000, and the server sends GOAWAY and closes. Then the client reads:
        -- a close while it still sent may have reset the connection and lost the GOAWAY.
        local function flood(one, ack_type)
            local before = occurrences(srv:log(), FLOODING)
            local c = connect(srv.port, { auto_ack = false, rcvbuf = 4096 })
            c:hello()
            local batch, sent, refused = one:rep(1000), 0, false
            while sent < 500000 do
                c.s:settimeout(5)
                local ok, err = c.s:send(batch)
                if not ok then
                    refused = err ~= "timeout"
                    break
                end
                sent = sent + 1000
            end
            local frames, why = c:drain(10)
            c:close()
            assert.equal("closed", why, "the server must end the connection")
            local g = find(frames, T.GOAWAY)
            assert.is_true(refused or g ~= nil, "no GOAWAY after " .. sent .. " frames")
            if g then
                assert.equal(FLOOD_CODE, g.code, describe_frames { g })
                assert.equal(0, g.last_stream)
                assert.equal(T.GOAWAY, frames[#frames].type, "GOAWAY comes last")
            end
            local acks = count(frames, ack_type, ACK)
            assert.is_true(acks < sent + 1000, ("acks: %d of %d"):format(acks, sent + 1000))
            assert.equal(before + 1, occurrences(srv:log(), FLOODING))
            serves(srv.port)
        end

        twice("ends a PING flood from a client that does not read", function()
            flood(ping(), T.PING)
        end)

        twice("ends a SETTINGS flood from a client that does not read", function()
            flood(settings {}, T.SETTINGS)
        end)

        twice("ends a connection whose SETTINGS has 33 entries with ENHANCE_YOUR_CALM", function()
            local c = connect(srv.port)
            local list = {}
            for _ = 1, 33 do
                list[#list + 1] = INITIAL_WINDOW_SIZE
                list[#list + 1] = 65535
            end
            c:send(PREFACE, settings(list))
            local frames = c:collect(5)
            local g = frames[#frames]
            assert.equal(T.GOAWAY, g and g.type, describe_frames(frames))
            assert.equal(E.ENHANCE_YOUR_CALM, g.code)
            assert.equal("SETTINGS: too many setting entries", g.debug)
            assert.is_true(c:closes())
            c:close()
        end)

        twice("ends a flood of empty DATA frames with ENHANCE_YOUR_CALM and one log line",
            function()
                local line = "HTTP/2: GOAWAY after 1000 protocol glitches"
                local before = occurrences(srv:log(), line)
                local c = connect(srv.port)
                c:hello()
                local out = { headers(1, request("POST", "/wait")) }
                for i = 2, 1501 do
                    out[i] = data(1, "")
                end
                assert(c:send(concat(out)))
                local frames = c:collect(5)
                local g = frames[#frames]
                assert.equal(T.GOAWAY, g and g.type, describe_frames(frames))
                assert.equal(E.ENHANCE_YOUR_CALM, g.code)
                assert.equal(1, g.last_stream)
                assert.is_nil(c.streams[1] and c.streams[1].status)
                assert.is_true(c:closes())
                c:close()
                assert.equal(before + 1, occurrences(srv:log(), line))
                serves(srv.port)
            end)

        twice("ends a connection whose HPACK table size update exceeds 4096 with " ..
            "COMPRESSION_ERROR", function()
                -- An update up to the 4096 bytes of SETTINGS_HEADER_TABLE_SIZE is the client's
                -- right, so it is the size that is refused, not the update.
                local c = connect(srv.port)
                c:hello()
                c:send(headers(1, table_size_update(4096) .. request("GET", "/"),
                    END_HEADERS + END_STREAM))
                local frames = c:collect(5, c:until_done(1))
                c:close()
                assert.equal(200, c:stream(1).status, describe_frames(frames))
                c = connect(srv.port)
                c:hello()
                -- 0x3f, then 65536 - 31 in continuation bytes: 0xe1 0xff 0x03
                c:send(headers(1, table_size_update(65536) .. request("GET", "/"),
                    END_HEADERS + END_STREAM))
                frames = c:collect(5)
                local g = frames[#frames]
                assert.equal(T.GOAWAY, g and g.type, describe_frames(frames))
                assert.equal(E.COMPRESSION_ERROR, g.code, describe_frames(frames))
                assert.equal(0, count(frames, T.HEADERS), describe_frames(frames))
                assert.is_true(c:closes())
                c:close()
                serves(srv.port)
            end)

        -- Request `i` of a connection to /whoami adds to the server's decoder table x-probe
        -- (v<i>), its name taken from the oldest entry, the x-probe of the request before; then
        -- FILLS fields of about 100 bytes (131 in the table), each with a name never sent
        -- before. A request's entries come to 3974 of the 4096 bytes the table holds, so each
        -- request evicts all that the one before added, and a table out of step shows in the
        -- answer. 2000 requests send 60000 entries, 7.9 MB by the table's count: a server that
        -- kept them would grow by more than that.
        local FILLS, fills = 30, 0
        local function probing(i)
            local out = { request("GET", "/whoami"), i == 1 and literal_indexed("x-probe", "v1")
                or literal_indexed(#STATIC + FILLS + 1, "v" .. i) }
            for _ = 1, FILLS do
                fills = fills + 1
                out[#out + 1] = literal_indexed(("x-fill-%06d"):format(fills), ("f"):rep(86))
            end
            return headers(2 * i - 1, concat(out), END_HEADERS + END_STREAM)
        end

        -- Requests from..to of `probing` at once, each answered with its own probe.
        local function probe(c, from, to)
            local out, ids = {}, {}
            for i = from, to do
                out[#out + 1] = probing(i)
                ids[#ids + 1] = 2 * i - 1
            end
            assert(c:send(concat(out)))
            local frames, why = c:collect(5, c:until_done(unpack(ids)))
            assert.equal("stop", why, why ~= "stop" and describe_frames(frames) or nil)
            for i = from, to do
                local st = c:stream(2 * i - 1)
                if st.status ~= 200 or st.body ~= "2 127.0.0.1 v" .. i then
                    error(("request %d: %s %q\n%s"):format(i, tostring(st.status), st.body,
                        describe_frames(frames)))
                end
            end
        end

        twice("serves 2000 requests that each fill its HPACK table anew, in bounded memory",
            function()
                local c = connect(srv.port)
                c:hello()
                probe(c, 1, 50) -- the table is full, and the server warm
                local before = rss_kib(srv.pid)
                for from = 51, 2050, 50 do
                    probe(c, from, from + 49)
                end
                local grew = rss_kib(srv.pid) - before
                c:close()
                assert.is_true(grew < 8 * 1024, ("VmRSS grew by %d KiB over 2000 requests of %d "
                    .. "new fields each"):format(grew, FILLS))
            end)

        -- A request whose fields name another scheme: nghttp2 checks :path for http and https
        -- only, so ":path: Xadmin/secret" reached the app, whose middleware saw
        -- "Xadmin/secret" while the router served /admin/secret.
        local function scheme_request(scheme, method, path)
            return concat { literal(":method", method), literal(":scheme", scheme),
                literal(":path", path), literal(":authority", "127.0.0.1") }
        end

        twice("resets a stream whose :path lacks its leading slash or whose :scheme is not http",
            function()
                local c = connect(srv.port)
                c:hello()
                c:send(headers(1, scheme_request("foo", "GET", "Xadmin/secret"),
                        END_HEADERS + END_STREAM),
                    headers(3, scheme_request("foo", "GET", "/admin/secret"),
                        END_HEADERS + END_STREAM),
                    headers(5, scheme_request("http", "OPTIONS", "*"), END_HEADERS + END_STREAM),
                    headers(7, scheme_request("https", "GET", "/admin/secret"),
                        END_HEADERS + END_STREAM))
                local frames = c:collect(5, c:until_done(1, 3, 5, 7))
                c:close()
                for _, id in ipairs { 1, 3 } do
                    local st = c:stream(id)
                    assert.is_nil(st.status, describe_frames(frames))
                    assert.equal(E.PROTOCOL_ERROR, st.rst, describe_frames(frames))
                end
                assert.equal(204, c:stream(5).status, describe_frames(frames))
                assert.equal(403, c:stream(7).status, describe_frames(frames)) -- the guard ran
                assert.equal(0, count(frames, T.GOAWAY), describe_frames(frames))
                assert.truthy(srv:log():find("HTTP/2 stream 1: reset: a :scheme other than http",
                    1, true), srv:log():sub(-1500))
            end)

        -- RFC 9113 8.1: a complete reply may be followed by RST_STREAM(NO_ERROR), so that a
        -- stream the client never ends holds nothing (it had no deadline at all).
        twice("wakes a handler that replied and waits for the body when the client resets",
            function()
                local c = connect(srv.port)
                c:hello()
                c:send(headers(1, request("POST", "/reply-then-body"), END_HEADERS))
                local frames = c:collect(5, function(f)
                    return f.stream == 1 and band(f.flags, END_STREAM) ~= 0
                end)
                assert.equal(200, c:stream(1).status, describe_frames(frames))
                c:send(rst(1, E.CANCEL))
                socket.sleep(0.2)
                c:close()
                assert.truthy(srv:log():find("reply-then-body: the body did not come: ECLOSED",
                    1, true), srv:log():sub(-1500))
            end)

        -- RFC 9113 5.3.1: a stream that depends on itself is a stream error. nghttp2 1.52,
        -- with priorities off, drops PRIORITY frames unread and does not look.
        twice("resets a stream that a PRIORITY frame makes depend on itself, and goes on",
            function()
                local c = connect(srv.port)
                c:hello()
                c:send(headers(1, request("POST", "/wait"), END_HEADERS))
                -- split across two reads, inside its stream dependency
                local p = frame(T.PRIORITY, 0, 1, u32(1) .. char(15))
                c:send(p:sub(1, 11))
                socket.sleep(0.1)
                c:send(p:sub(12))
                local frames = c:collect(5, c:until_done(1))
                assert.equal(E.PROTOCOL_ERROR, c:stream(1).rst, describe_frames(frames))
                c:send(headers(3, request("GET", "/"), END_HEADERS + END_STREAM))
                local more = c:collect(5, c:until_done(3))
                c:close()
                assert.equal(200, c:stream(3).status, describe_frames(more))
                assert.equal(0, count(more, T.GOAWAY), describe_frames(more))
            end)

        twice("resets, unserved, a stream whose HEADERS make it depend on itself", function()
            local c = connect(srv.port)
            c:hello()
            -- PADDED and PRIORITY: pad length 3, stream 1 on 1, weight 16, the block, padding
            local block = request("GET", "/")
            c:send(frame(T.HEADERS, END_HEADERS + END_STREAM + PADDED + PRIORITY, 1,
                    char(3) .. u32(0x80000001) .. char(15) .. block .. "\0\0\0"),
                headers(3, request("GET", "/"), END_HEADERS + END_STREAM))
            local frames = c:collect(5, c:until_done(1, 3))
            c:close()
            assert.is_nil(c:stream(1).status, describe_frames(frames))
            assert.equal(E.PROTOCOL_ERROR, c:stream(1).rst, describe_frames(frames))
            assert.equal(200, c:stream(3).status, describe_frames(frames))
            assert.equal(0, count(frames, T.GOAWAY), describe_frames(frames))
        end)

        twice("refuses field lines that are not whole with an error to Lua, and still replies",
            function()
                local c = connect(srv.port)
                c:hello()
                c:send(headers(1, request("GET", "/fields"), END_HEADERS + END_STREAM))
                local frames = c:collect(5, c:until_done(1))
                c:close()
                local st = c:stream(1)
                assert.equal(200, st.status, describe_frames(frames))
                assert.truthy(st.body:find("refused: cannot add fields: EBADHEADER", 1, true),
                    st.body)
                assert.equal("1", st.fields["x-ok"])
                assert.is_nil(st.fields["x-a"])
            end)

        -- The server has RFC 7540 priorities off (SETTINGS_NO_RFC7540_PRIORITIES = 1) and does
        -- not fall back to them for a client that does not send the setting, so nghttp2 (1.52)
        -- checks a PRIORITY frame's length and skips it: no callback, no idle stream, no
        -- dependency tree. A chain of them on idle streams costs a skip each.
        twice("ignores 20000 PRIORITY frames on idle streams, each depending on the last",
            function()
                local errors = occurrences(srv:log(), "] error: ")
                local c = connect(srv.port)
                c:hello()
                local n = 0
                for _ = 1, 20 do
                    local out = {}
                    for i = 1, 1000 do
                        n = n + 1
                        -- stream 2n + 1 depends (not exclusively) on 2n - 1, weight 16
                        out[i] = frame(T.PRIORITY, 0, 2 * n + 1, u32(2 * n - 1) .. char(15))
                    end
                    assert(c:send(concat(out)))
                end
                local id = 2 * n + 3
                local t0 = socket.gettime()
                c:send(headers(id, request("GET", "/"), END_HEADERS + END_STREAM))
                local frames = c:collect(5, c:until_done(id))
                local took = socket.gettime() - t0
                assert.equal(200, c:stream(id).status, describe_frames(frames))
                assert.equal("hello", c:stream(id).body)
                assert.is_true(took < 2, "took " .. took .. " s")
                -- the connection is still up: it serves the next stream
                c:send(headers(id + 2, request("GET", "/"), END_HEADERS + END_STREAM))
                local more = c:collect(5, c:until_done(id + 2))
                c:close()
                for _, f in ipairs(more) do
                    frames[#frames + 1] = f
                end
                assert.equal(200, c:stream(id + 2).status, describe_frames(frames))
                assert.equal(0, count(frames, T.GOAWAY), describe_frames(frames))
                assert.equal(0, count(frames, T.RST_STREAM), describe_frames(frames))
                assert.equal(errors, occurrences(srv:log(), "] error: "), srv:log():sub(-2000))
            end)
    end)
end)

-- -- Limits -----------------------------------------------------------------------------------

describe("moonserve over HTTP/2 with small limits", function()
    local srv

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/h2app.lua",
            args = "--limit head_bytes=4096 --limit header_count=20 --limit body_bytes=1000 "
                .. "--limit in_flight=1 --limit discard_bytes=2000" }
    end)

    teardown(function()
        assert.is_true(srv:stop(), "the server must stop on SIGTERM")
    end)

    local function twice_on_one_connection(name, fn)
        it(name, function()
            local c = connect(srv.port)
            c:hello()
            fn(c, 1)
            fn(c, 101)
            c:close()
        end)
    end

    twice_on_one_connection("answers a head over head_bytes with 431, then serves the next",
        function(c, id)
            c:send(headers(id, request("GET", "/", { { "x-big", ("b"):rep(5000) } }),
                END_HEADERS + END_STREAM))
            local frames = c:collect(5, c:until_done(id))
            local st = c:stream(id)
            assert.equal(431, st.status, describe_frames(frames))
            assert.equal("431 Request Header Fields Too Large\n", st.body)
            assert.is_true(st.ended)
            c:send(headers(id + 2, request("GET", "/"), END_HEADERS + END_STREAM))
            frames = c:collect(5, c:until_done(id + 2))
            assert.equal(200, c:stream(id + 2).status, describe_frames(frames))
            assert.equal("hello", c:stream(id + 2).body)
            assert.truthy(srv:log():find("HTTP/2 stream " .. id
                .. ": 431 Request Header Fields Too Large: head larger than head_bytes or header_count",
                1, true))
        end)

    twice_on_one_connection("answers a head with more fields than header_count with 431",
        function(c, id)
            local many = {}
            for i = 1, 21 do
                many[i] = { "x-f" .. i, "v" }
            end
            c:send(headers(id, request("GET", "/", many), END_HEADERS + END_STREAM))
            local frames = c:collect(5, c:until_done(id))
            assert.equal(431, c:stream(id).status, describe_frames(frames))
            assert.equal("431 Request Header Fields Too Large\n", c:stream(id).body)
        end)

    twice_on_one_connection("answers a declared body over body_bytes with 413", function(c, id)
        c:send(headers(id, request("POST", "/echo", { { "content-length", "1500" } })),
            data(id, ("y"):rep(1500), END_STREAM))
        local frames = c:collect(5, c:until_done(id))
        assert.equal(413, c:stream(id).status, describe_frames(frames))
        assert.equal("413 Content Too Large\n", c:stream(id).body)
    end)

    twice_on_one_connection("answers a body that grows over body_bytes with 413, drops what "
        .. "follows up to discard_bytes, then RST_STREAM", function(c, id)
            c:send(headers(id, request("POST", "/echo")))
            socket.sleep(0.05) -- the handler waits for the body
            c:send(data(id, ("y"):rep(1500)))
            local frames = c:collect(5, c:until_done(id))
            local st = c:stream(id)
            assert.equal(413, st.status, describe_frames(frames))
            assert.equal("413 Content Too Large\n", st.body)
            assert.is_nil(st.rst, describe_frames(frames)) -- the rest of the body may come
            c:send(data(id, ("y"):rep(1500)))
            frames = c:collect(0.3)
            assert.equal(0, count(frames, T.RST_STREAM), describe_frames(frames))
            -- (more would follow: RST_STREAM(NO_ERROR) tells the client to stop; one that has
            -- ended its stream needs no such word)
            c:send(data(id, ("y"):rep(1500)))
            frames = c:collect(5, function(f)
                return f.stream == id and f.type == T.RST_STREAM
            end)
            assert.equal(E.NO_ERROR, st.rst, describe_frames(frames))
        end)

    twice_on_one_connection("answers a stream over in_flight with 503", function(c, id)
        c:send(headers(id, request("GET", "/sleep?s=0.3"), END_HEADERS + END_STREAM),
            headers(id + 2, request("GET", "/"), END_HEADERS + END_STREAM))
        local frames = c:collect(5, c:until_done(id, id + 2))
        assert.equal(503, c:stream(id + 2).status, describe_frames(frames))
        -- the one refusal every protocol makes: HTTP/1.1's body and retry-after
        assert.equal("503 Service Unavailable\n", c:stream(id + 2).body)
        assert.equal("1", c:stream(id + 2).fields["retry-after"])
        assert.equal(200, c:stream(id).status)
        assert.equal("slept", c:stream(id).body)
        -- the 503 went first: it did not wait for the sleeper
        local first
        for _, f in ipairs(frames) do
            if f.type == T.HEADERS then
                first = first or f.stream
            end
        end
        assert.equal(id + 2, first)
    end)
end)

-- -- Deadlines -----------------------------------------------------------------------------------

describe("moonserve over HTTP/2 with short deadlines", function()
    local srv

    setup(function()
        srv = helper.spawn_server { app = "spec/fixtures/h2app.lua",
            args = "--limit head_timeout=1 --limit body_timeout=1 --limit send_timeout=1 "
                .. "--limit body_min_rate=3 --limit discard_timeout=1" }
    end)

    teardown(function()
        assert.is_true(srv:stop(), "the server must stop on SIGTERM")
    end)

    twice("resets, at discard_timeout, 100 answered streams with 16 KB heads that the client "
        .. "never ends", function()
            local c = connect(srv.port)
            c:hello()
            local big = ("v"):rep(16000)
            local out, ids = {}, {}
            for i = 1, 100 do
                ids[i] = 2 * i - 1
                out[i] = headers(ids[i], request("GET", "/", { { "x-big", big } }),
                    END_HEADERS)
            end
            c:send(concat(out))
            local frames = c:collect(10, function()
                for _, id in ipairs(ids) do
                    if not c.streams[id] or not c.streams[id].rst then
                        return false
                    end
                end
                return true
            end)
            for _, id in ipairs(ids) do
                local st = c:stream(id)
                assert.equal(200, st.status, describe_frames(frames))
                assert.equal("hello", st.body)
                assert.equal(E.NO_ERROR, st.rst, "stream " .. id)
            end
            assert.equal(0, count(frames, T.GOAWAY), describe_frames(frames))
            -- all 100 are gone: a 101st stream is not refused
            c:send(headers(201, request("GET", "/"), END_HEADERS + END_STREAM))
            frames = c:collect(5, c:until_done(201))
            c:close()
            assert.equal(200, c:stream(201).status, describe_frames(frames))
        end)

    -- Sends `frame` after the preface, then expects GOAWAY NO_ERROR and a close within about a
    -- second, and one log line saying why.
    local function ends_within_a_second(bytes, why)
        local before = occurrences(srv:log(), why)
        -- (no SETTINGS ack: inside a header block it would be a protocol error of ours)
        local c = connect(srv.port, { auto_ack = false })
        c:hello()
        local t0 = socket.gettime()
        c:send(bytes)
        local frames = c:collect(4)
        local g = find(frames, T.GOAWAY)
        assert.equal(T.GOAWAY, g and g.type, describe_frames(frames))
        assert.equal(E.NO_ERROR, g.code, describe_frames(frames))
        assert.is_true(c:closes(2))
        local took = socket.gettime() - t0
        assert.is_true(took > 0.8 and took < 3, "took " .. took .. " s")
        c:close()
        socket.sleep(0.1)
        assert.equal(before + 1, occurrences(srv:log(), why))
    end

    it("ends a connection whose header block does not end within head_timeout", function()
        ends_within_a_second(headers(1, request("GET", "/"), 0),
            "HTTP/2: closed: head not complete within head_timeout")
    end)

    -- HTTP/1.1's rule, per stream: past body_timeout a body may go on while it keeps
    -- body_min_rate (here 3 bytes a second) on average; a stream that does not gets 408 and
    -- RST_STREAM, and the connection and its other streams go on.
    local function late_body(drip)
        local why = "408 Request Timeout: body not complete within body_timeout at body_min_rate"
        local before = occurrences(srv:log(), why)
        local c = connect(srv.port)
        c:hello()
        local t0 = socket.gettime()
        c:send(headers(1, request("POST", "/echo", { { "content-length", "100000" } }),
            END_HEADERS))
        local frames = {}
        local function got(f)
            frames[#frames + 1] = f
            return c.streams[1] ~= nil and c.streams[1].rst ~= nil
        end
        for _ = 1, 8 do -- a byte every half second (2 a second), for at most 4 s
            local _, why_stop = c:collect(0.5, got)
            if why_stop == "stop" then
                break
            end
            if drip then
                c:send(data(1, "x"))
            end
        end
        local took = socket.gettime() - t0
        local st = c:stream(1)
        assert.equal(408, st.status, describe_frames(frames))
        assert.equal(E.NO_ERROR, st.rst, describe_frames(frames))
        assert.is_true(took > 0.8 and took < 2.5, "took " .. took .. " s")
        c:send(headers(3, request("GET", "/"), END_HEADERS + END_STREAM))
        local more = c:collect(3, c:until_done(3))
        c:close()
        assert.equal(200, c:stream(3).status, describe_frames(more))
        assert.equal(0, count(frames, T.GOAWAY) + count(more, T.GOAWAY), describe_frames(frames))
        socket.sleep(0.1)
        assert.equal(before + 1, occurrences(srv:log(), why))
    end

    it("answers a body dripped a byte at a time with 408 and a reset, and goes on", function()
        late_body(true)
    end)

    it("answers an awaited body that does not come with 408 and a reset, and goes on", function()
        late_body(false)
    end)

    it("lets a body that keeps body_min_rate take longer than body_timeout", function()
        local c = connect(srv.port)
        c:hello()
        c:send(headers(1, request("POST", "/echo"), END_HEADERS))
        for _ = 1, 4 do
            socket.sleep(0.5)
            c:send(frame(T.DATA, 0, 1, "abcd"))
        end
        c:send(frame(T.DATA, END_STREAM, 1, "!"))
        local frames = c:collect(3, c:until_done(1))
        assert.equal(200, c:stream(1).status, describe_frames(frames))
        assert.equal(("abcd"):rep(4) .. "!", c:stream(1).body)
        c:close()
    end)

    it("ends a connection whose client opens no window within send_timeout", function()
        local why = "HTTP/2: closed: the client took no reply bytes for send_timeout"
        local before = occurrences(srv:log(), why)
        local c = connect(srv.port)
        local t0 = socket.gettime()
        -- A window of 0 for every stream, and no WINDOW_UPDATE ever: the server may send the
        -- reply's HEADERS, but not one byte of its body.
        c:send(PREFACE, settings { INITIAL_WINDOW_SIZE, 0 },
            headers(1, request("GET", "/"), END_HEADERS + END_STREAM))
        local frames = c:collect(0.8, function(f)
            return f.stream == 1 and f.type == T.HEADERS
        end)
        assert.equal(200, c:stream(1).status, describe_frames(frames))
        serves(srv.port) -- meanwhile, another client is served
        local more, how = c:collect(4, function() return false end)
        local took = socket.gettime() - t0
        c:close()
        for _, f in ipairs(more) do
            frames[#frames + 1] = f
        end
        assert.equal("closed", how, describe_frames(frames))
        assert.is_true(took > 0.8 and took < 3, "took " .. took .. " s")
        assert.equal(0, count(frames, T.DATA), describe_frames(frames))
        assert.is_nil(c:stream(1).ended)
        socket.sleep(0.1)
        assert.equal(before + 1, occurrences(srv:log(), why))
    end)
end)

-- -- Stopping -----------------------------------------------------------------------------------

describe("moonserve over HTTP/2 stopping", function()
    it("sends GOAWAY on SIGTERM and lets the stream in its handler finish", function()
        local srv = helper.spawn_server { app = "spec/fixtures/h2app.lua" }
        finally(function()
            srv:stop()
        end)
        local c = connect(srv.port)
        c:hello()
        c:send(headers(1, request("GET", "/sleep?s=1"), END_HEADERS + END_STREAM))
        local frames = c:collect(5, function(f)
            return f.type == T.SETTINGS and band(f.flags, ACK) ~= 0
        end)
        socket.sleep(0.2) -- the handler sleeps
        assert(os.execute("kill -TERM " .. srv.pid) == 0)
        local more = c:collect(5, c:until_done(1))
        for _, f in ipairs(more) do
            frames[#frames + 1] = f
        end
        local notice, headers_at
        for i, f in ipairs(frames) do
            if f.type == T.GOAWAY then
                notice = notice or i
            elseif f.type == T.HEADERS then
                headers_at = headers_at or i
            end
        end
        -- First a notice (any stream the client sent meanwhile is still taken), then, since
        -- this client does not answer the notice's PING, the last GOAWAY a second later.
        assert.truthy(notice, describe_frames(frames))
        assert.equal(E.NO_ERROR, frames[notice].code)
        assert.equal(0x7fffffff, frames[notice].last_stream)
        assert.truthy(headers_at and notice < headers_at, describe_frames(frames))
        local st = c:stream(1)
        assert.equal(200, st.status)
        assert.equal("slept", st.body)
        assert.is_true(st.ended)
        local last = c:collect(3, is_goaway)
        assert.equal(T.GOAWAY, last[#last] and last[#last].type, describe_frames(last))
        assert.equal(1, last[#last].last_stream)
        assert.is_true(c:closes())
        c:close()
        for _ = 1, 40 do -- it exits by itself within 2 s
            if not srv:alive() then
                break
            end
            socket.sleep(0.05)
        end
        assert.is_false(srv:alive(), "the server must have exited by itself")
    end)
end)
