--- moonserve/multipart.lua: a streaming multipart/form-data parser (RFC 7578, RFC 2046 5.1).
--
-- Two layers. `parser(boundary, opts)` is fed bytes in pieces of any size and hands out
-- events through `p:next()`:
--   { type = "part", name = , filename = , content_type = , headers = { lowercase = value } }
--   { type = "data", data = string }   -- never empty; a part's body, as it arrives
--   { type = "part_end" }
--   { type = "end" }                    -- after the close delimiter; the epilogue is ignored
-- `next()` returns nil when it needs more input, and nil, err for a malformed body (the same
-- error on every later call). Call it until it returns nil after each `feed(chunk)`; after
-- `finish()` it returns what is left, then nil, err if the close delimiter never came.
-- Data is passed on as it comes: at most the delimiter ("CRLF--" .. boundary) is held back.
-- opts: max_header_bytes (a part's header section, default 8192), max_parts (default 1000).
--
-- `parts(req, opts)` is the loop for handlers, reading the body with `req:read()`:
--   local parts, err = multipart.parts(req)   -- nil, err: not multipart/form-data
--   for part in parts do                       -- or: for part in assert(multipart.parts(req))
--       if part.filename then part:save(path) else fields[part.name] = part:body() end
--   end
-- A part has name, filename, content_type and headers; part:read() returns its next piece or
-- nil at its end, part:body() the rest as a string, part:save(path) streams the rest to a file.
-- What the caller leaves unread is skipped when the loop moves on. The loop raises
-- "bad multipart body: ..." for a malformed body: wrap it in pcall to answer 400 rather than
-- 500. When `req:read()` fails (the core refused the body, 413 or 408, or the client left),
-- nothing raises: the loop ends (its iterator returns nil, "reading the multipart body
-- failed: ..."), and part:read(), part:body() and part:save() return nil and that error.
-- req:parts() on a request the core refused already returns nil and an error.
--
-- `Part`: A part of a multipart/form-data body (req:parts()): `name`, `filename`,
--   `content_type`, `headers`.
-- @module moonserve.multipart
local codec = require "moonserve.codec"

local byte, char, find, gsub, lower, match, sub =
    string.byte, string.char, string.find, string.gsub, string.lower, string.match, string.sub
local concat, floor, max = table.concat, math.floor, math.max
local unescape = codec.unescape

local CR, HT, SP, DASH, QUOTE, BACKSLASH, SEMI = 13, 9, 32, 45, 34, 92, 59

-- Patterns built once: a token (RFC 9110 5.6.2), a header line, a parameter's key.
local TOKEN = "[%w!#$%%&'*+%-.^_`|~]+"
local HEADER_LINE = "^(" .. TOKEN .. "):[ \t]*(.-)[ \t]*$"
local PARAM_KEY = "^(" .. TOKEN .. ")[ \t]*=[ \t]*()"
local PARAM_TOKEN = "^(" .. TOKEN .. ")()"
local KIND = "^[ \t]*(" .. TOKEN .. ")()"

local _M = {}

-- -- Header values ----------------------------------------------------------

-- Reads a quoted string whose opening quote is just before `at`. Returns its value and the
-- position after the closing quote. A backslash escapes only `"` and `\`: a Windows path sent
-- as a filename must keep its other backslashes (browsers send a quote as %22 anyway).
local function quoted(s, at)
    local out, n = {}, 0
    while true do
        local q = find(s, '["\\]', at)
        if not q then
            return nil, "unterminated quoted string"
        end
        n = n + 1
        if byte(s, q) == QUOTE then
            out[n] = sub(s, at, q - 1)
            return concat(out, "", 1, n), q + 1
        end
        local e = byte(s, q + 1)
        if e == QUOTE or e == BACKSLASH then
            out[n] = sub(s, at, q - 1) .. char(e)
            at = q + 2
        else
            out[n] = sub(s, at, q)
            at = q + 1
        end
    end
end

-- Parses "; key=value" parameters from `at` on into { lowercase key = value }; a value is a
-- token or a quoted string. A repeated key is an error: parsers keeping different copies
-- would disagree about what the part is.
local function parse_params(s, at)
    local params, len = {}, #s
    while true do
        at = match(s, "^[ \t]*()", at)
        if at > len then
            return params
        end
        if byte(s, at) ~= SEMI then
            return nil, "bad parameter list"
        end
        at = match(s, "^[ \t]*()", at + 1)
        if at <= len then -- else a trailing ";", harmless
            local key, vat = match(s, PARAM_KEY, at)
            if not key then
                return nil, "bad parameter"
            end
            local value
            if byte(s, vat) == QUOTE then
                value, at = quoted(s, vat + 1)
                if not value then
                    return nil, at
                end
            else
                value, at = match(s, PARAM_TOKEN, vat)
                if not value then
                    return nil, "bad parameter value"
                end
            end
            key = lower(key)
            if params[key] ~= nil then
                return nil, "repeated parameter " .. key
            end
            params[key] = value
        end
    end
end

local function latin1_to_utf8(c)
    local b = byte(c)
    return char(0xC0 + floor(b / 64), 0x80 + b % 64)
end

-- Decodes an RFC 5987 ext-value: charset'language'percent-encoded. Returns the text in
-- UTF-8, or false for a charset we cannot decode, or nil for a malformed value.
local function ext_value(v)
    local charset, text = match(v, "^([^']*)'[^']*'(.*)$")
    if not charset then
        return nil
    end
    charset = lower(charset)
    if charset == "utf-8" then
        return unescape(text)
    elseif charset == "iso-8859-1" then -- RFC 5987 3.2.1: recipients must support both
        return (gsub(unescape(text), "[\128-\255]", latin1_to_utf8))
    end
    return false
end

-- Returns the part's name and filename from its Content-Disposition value, or nil, err.
local function parse_disposition(v)
    local kind, at = match(v, KIND)
    if not kind or lower(kind) ~= "form-data" then
        return nil, "Content-Disposition is not form-data"
    end
    local params, err = parse_params(v, at)
    if not params then
        return nil, "bad Content-Disposition: " .. err
    end
    if not params.name then
        return nil, "part without a name"
    end
    local filename = params.filename
    if params["filename*"] then
        local decoded = ext_value(params["filename*"])
        if decoded == nil then
            return nil, "bad filename*"
        end
        -- An unknown charset leaves the plain filename standing (RFC 6266 4.3).
        filename = decoded or filename
    end
    return params.name, filename
end

-- Parses a part's header section: the rest of the delimiter line (transport padding), then
-- "name: value" lines, each ending in CRLF. A repeated field is joined with ", ", so a second
-- Content-Disposition makes the first unparsable rather than silently winning.
local function parse_headers(head)
    local at = match(head, "^[ \t]*\r\n()")
    if not at then
        return nil, "bad delimiter line"
    end
    local headers, last = {}, nil
    while at <= #head do
        local eol = find(head, "\r\n", at, true)
        local line = sub(head, at, eol - 1)
        at = eol + 2
        if find(line, "[%z\1-\8\10-\31\127]") then
            return nil, "control character in part header"
        end
        local c = byte(line, 1)
        if c == SP or c == HT then -- a folded line (RFC 5322 2.2.3) continues the last field
            if not last then
                return nil, "bad part header line"
            end
            local more, old = match(line, "^[ \t]*(.-)[ \t]*$"), headers[last]
            headers[last] = old == "" and more or old .. " " .. more
        else
            local name, value = match(line, HEADER_LINE)
            if not name then
                return nil, "bad part header line"
            end
            name = lower(name)
            local old = headers[name]
            headers[name] = old and old .. ", " .. value or value
            last = name
        end
    end
    return headers
end

-- RFC 2046 5.1.1: 1 to 70 bchars, the last one not a space.
local function valid_boundary(b)
    return #b <= 70 and find(b, "^[%w'()+_,%-./:=? ]+$") ~= nil and byte(b, -1) ~= SP
end

--- The boundary from a Content-Type value, or nil, err when it is not multipart/form-data
-- with a valid boundary.
function _M.boundary(content_type)
    if type(content_type) ~= "string" then
        return nil, "not multipart/form-data (no content-type)"
    end
    local media, at = match(content_type, "^[ \t]*([^ \t;]*)()")
    if lower(media) ~= "multipart/form-data" then
        return nil, "not multipart/form-data (content-type is " .. media .. ")"
    end
    local params, err = parse_params(content_type, at)
    if not params then
        return nil, "bad content-type: " .. err
    end
    local b = params.boundary
    if not b then
        return nil, "no boundary in content-type"
    end
    if not valid_boundary(b) then
        return nil, "invalid boundary in content-type"
    end
    return b
end

-- -- The parser --------------------------------------------------------------

local Parser = {}
Parser.__index = Parser

--- A push parser for a multipart body with that boundary.
-- @local
function _M.parser(boundary, opts)
    if type(boundary) ~= "string" or not valid_boundary(boundary) then
        error("bad boundary (1 to 70 boundary characters expected)", 2)
    end
    opts = opts or {}
    local delim = "\r\n--" .. boundary
    return setmetatable({
        delim = delim,
        dlen = #delim,
        -- The first delimiter may open the body with no CRLF before it (RFC 2046 5.1.1):
        -- starting with one lets the same search find it.
        buf = "\r\n",
        pos = 1, -- buf[pos..] is not parsed yet
        state = "preamble",
        scanned = 0, -- header section bytes already searched for its end
        parts = 0,
        max_header_bytes = opts.max_header_bytes or 8192,
        max_parts = opts.max_parts or 1000,
        eof = false,
        err = nil,
    }, Parser)
end

--- Gives the parser the next piece of the body.
-- @local
function Parser:feed(chunk)
    if type(chunk) ~= "string" then
        error("bad chunk (string expected)", 2)
    end
    if self.eof then
        error("feed after finish", 2)
    end
    if self.err or self.state == "done" then
        return -- nothing more will be parsed: keep nothing
    end
    -- Drop what is parsed, so a big chunk is not copied again for every event taken from it.
    local buf, pos = self.buf, self.pos
    self.buf = pos > #buf and chunk or sub(buf, pos) .. chunk
    self.pos = 1
end

--- Marks the end of the input.
function Parser:finish()
    self.eof = true
end

-- Finds the next delimiter from pos on: "CRLF--boundary" followed by "-", a space, a tab or
-- CR. Followed by anything else, it is data, as the RFC forbids it in a body but senders can
-- still produce it. Returns its position, or nil and the position before which there is
-- surely no delimiter: at most the delimiter's length is held back, and only from a CR on.
local function find_delim(self)
    local buf, delim, dlen = self.buf, self.delim, self.dlen
    local i = find(buf, delim, self.pos, true)
    while i do
        local c = byte(buf, i + dlen)
        if c == nil then
            return nil, i -- the byte that decides has not come yet
        end
        if c == DASH or c == SP or c == HT or c == CR then
            return i
        end
        i = find(buf, delim, i + 1, true)
    end
    local cr = find(buf, "\r", max(self.pos, #buf - dlen + 2), true)
    return nil, cr or #buf + 1
end

-- One step per state. A step returns an event; or false when it moved to another state;
-- or nil when it needs more input; or nil, err.
local steps = {}

function steps.preamble(self)
    local i, safe = find_delim(self)
    if not i then
        self.pos = safe -- the preamble is ignored (RFC 2046 5.1.1)
        return nil
    end
    self.pos = i + self.dlen
    self.state = "delim"
    return false
end

function steps.data(self)
    local i, safe = find_delim(self)
    local pos = self.pos
    local stop = i or safe
    if stop > pos then
        self.pos = stop
        return { type = "data", data = sub(self.buf, pos, stop - 1) }
    end
    if not i then
        return nil
    end
    self.pos = i + self.dlen
    self.state = "delim"
    return { type = "part_end" }
end

-- Just after "--boundary": "--" closes the body, anything else starts a part's headers.
function steps.delim(self)
    local buf, pos = self.buf, self.pos
    if byte(buf, pos) == DASH then
        local c = byte(buf, pos + 1)
        if c == nil then
            return nil
        end
        if c ~= DASH then
            return nil, "bad close delimiter"
        end
        self.state = "done"
        return { type = "end" }
    end
    if self.parts >= self.max_parts then
        return nil, "more than " .. self.max_parts .. " parts"
    end
    self.parts = self.parts + 1
    self.state = "headers"
    self.scanned = 0
    return false
end

function steps.headers(self)
    local buf, pos, limit = self.buf, self.pos, self.max_header_bytes
    -- Resume the search where the last one stopped: fed a byte at a time, a header section
    -- would otherwise be searched again from its start for every byte.
    local e = find(buf, "\r\n\r\n", pos + self.scanned, true)
    if not e then
        local have = #buf - pos + 1
        if have > limit then
            return nil, "part header section over " .. limit .. " bytes"
        end
        self.scanned = max(0, have - 3)
        return nil
    end
    if e + 4 - pos > limit then
        return nil, "part header section over " .. limit .. " bytes"
    end
    local headers, err = parse_headers(sub(buf, pos, e + 1))
    if not headers then
        return nil, err
    end
    local cd = headers["content-disposition"]
    if not cd then
        return nil, "part without Content-Disposition"
    end
    local name, filename = parse_disposition(cd)
    if not name then
        return nil, filename
    end
    self.pos = e + 4
    self.state = "data"
    return {
        type = "part",
        name = name,
        filename = filename,
        content_type = headers["content-type"] or "text/plain", -- RFC 7578 4.4
        headers = headers,
    }
end

function steps.done(self)
    self.buf, self.pos = "", 1 -- the epilogue is ignored (RFC 2046 5.1.1)
    return nil
end

--- The next event, or nil when more input is needed, or nil, err.
function Parser:next()
    if self.err then
        return nil, self.err
    end
    local ev, err = steps[self.state](self)
    if ev then
        return ev
    end
    if ev == false then
        -- A tail call, not a loop: the JIT aborts a trace of the caller's read loop that
        -- meets an inner loop. The state changes at most twice before an event.
        return self:next()
    end
    if not err and self.eof and self.state ~= "done" then
        err = "body ended before the close delimiter"
    end
    if err then
        self.err, self.buf, self.pos = err, "", 1
    end
    return nil, err
end

-- -- Parts of a request ------------------------------------------------------

local Part = {}
Part.__index = Part

--- The next piece of the part's body, or nil at its end.
function Part:read()
    if self._done then
        return nil
    end
    local ev, err = self._pull()
    if not ev then -- the body could not be read (the core refused it, the client left)
        self._done = true
        return nil, err
    end
    if ev.type == "data" then
        return ev.data
    end
    self._done = true -- part_end: the parser emits nothing else inside a part
    return nil
end

--- The part's body (what read() has not taken yet) as one string.
function Part:body()
    if self._body then
        return self._body
    end
    local pieces, n = {}, 0
    while true do
        local data, err = self:read()
        if not data then
            if err then
                return nil, err
            end
            break
        end
        n = n + 1
        pieces[n] = data
    end
    self._body = concat(pieces, "", 1, n)
    return self._body
end

local function copy(part, f)
    local size = 0
    while true do
        local data, rerr = part:read()
        if not data then
            if rerr then
                return nil, rerr
            end
            return size
        end
        local ok, err = f:write(data)
        if not ok then
            return nil, err
        end
        size = size + #data
    end
end

--- Streams the part's body (what read() has not taken yet) into a new file at `path`.
-- Returns the bytes written, or nil, err when the file cannot be written.
function Part:save(path)
    local f, err = io.open(path, "wb")
    if not f then
        return nil, err
    end
    -- A malformed body raises while we copy: close the file before passing that on.
    local ok, size, werr = pcall(copy, self, f)
    local closed, cerr = f:close()
    if not ok then
        error(size, 0)
    end
    if not size then
        return nil, werr
    end
    if not closed then
        return nil, cerr
    end
    return size
end

--- An iterator over the request's parts, or nil, err when the request is not
-- multipart/form-data. See the top of this file for what it raises.
function _M.parts(req, opts)
    local boundary, err = _M.boundary(req:header("content-type"))
    if not boundary then
        return nil, err
    end
    local refused = type(req.refused) == "function" and req:refused()
    if refused then
        return nil, "the core answered " .. refused .. " in the handler's place"
    end
    local p = _M.parser(boundary, opts)

    -- The next event, reading the body as the parser needs it; nil and why once the body
    -- could not be read, then and on every later call.
    local failed
    local function pull()
        if failed then
            return nil, failed
        end
        while true do
            local ev, perr = p:next()
            if ev then
                return ev
            end
            if perr then
                error("bad multipart body: " .. perr, 0)
            end
            local piece, rerr = req:read()
            if piece then
                p:feed(piece)
            elseif rerr then
                -- (the core refused the body, or the client left: no error of the handler's)
                failed = "reading the multipart body failed: " .. tostring(rerr)
                return nil, failed
            else
                p:finish()
            end
        end
    end

    local current, finished
    return function()
        if finished then
            return nil
        end
        if current then
            while current:read() do end -- skip what the caller left unread
        end
        local ev, rerr = pull()
        if not ev then -- the body could not be read: the loop ends, with why
            finished, current = true, nil
            return nil, rerr
        end
        if ev.type == "end" then
            finished, current = true, nil
            return nil
        end
        current = setmetatable({
            name = ev.name,
            filename = ev.filename,
            content_type = ev.content_type,
            headers = ev.headers,
            _pull = pull,
        }, Part)
        return current
    end
end

return _M
