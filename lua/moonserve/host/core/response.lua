--- moonserve/host/core/response.lua: the reply a handler builds, written by the core.
--
-- `Response`: The reply a handler builds. Header and status setters chain; the first send or
--   write sends the head.
-- @module moonserve.response
local ffi = require "ffi"
local bit = require "bit"
local base = require "moonserve.host.core.base"
local coro = require "moonserve.host.core.coroutine"

local C = base.C
local band = bit.band
local lower, format, type, tostring = string.lower, string.format, type, tostring
local HEAD_SENT, ABORTED, PEER_EOF = base.REQ_HEAD_SENT, base.REQ_ABORTED, base.REQ_PEER_EOF
local check, park = coro.check_request, coro.park
local shared = require "moonserve.response_methods"
local text = shared.text

local anchors = base.anchors -- Lua strings the core still writes from, by slot

local Response = {}
Response.__index = Response

local _M = { methods = Response }

--- The reply object over the core's request `r` (the dispatcher makes one per request).
-- @local
function _M.new(r)
    -- hook1 and _ngx (before_send's and the ngx layer's) are made with the table, false: a
    -- key added later costs a search for a free slot, past the table's size a rehash. (A
    -- key made nil in a constructor is not kept.)
    local t = setmetatable({ r = r, has_type = false, hook1 = false, _ngx = false }, Response)
    return t -- (not `return setmetatable(...)`: a trace cannot return from that tail call)
end

local function view(self)
    local r = self.r
    if not r then
        error("request is finished: its reply can no longer change", 3)
    end
    return r
end

--- Whether the reply head has left (after send, or the first write).
-- @treturn boolean
function Response:sent()
    return band(view(self).flags, HEAD_SENT) ~= 0
end

--- Whether the client has gone (its connection or stream closed): nothing more reaches it.
-- @treturn boolean
function Response:gone()
    return band(view(self).flags, ABORTED) ~= 0
end

-- Whether the server is draining or stopping (ms_server_drain): a long-lived reply (an event
-- stream) should end now, cleanly, so that its connection does not hold the stop.
function Response:_server_stopping()
    return C.ms_ffi_server_stopping(view(self)) ~= 0
end

-- Whether the client shut its side of an HTTP/1.1 connection while the handler ran: it may
-- still read (a half-close), but no browser does that; an event stream takes it as leaving.
function Response:_peer_eof()
    return band(view(self).flags, PEER_EOF) ~= 0
end

--- Sets the status code.
-- @tparam integer code 100 to 999 (anything else raises)
-- @return the reply, to chain: `res:status(404):send("no")`
function Response:status(code)
    if type(code) ~= "number" or code < 100 or code > 999 or code % 1 ~= 0 then
        error("bad status code (integer 100-999 expected, got " .. tostring(code) .. ")", 2)
    end
    view(self).status = code
    return self
end

--- The status code set so far (200 unless changed).
-- @treturn integer
function Response:get_status()
    return view(self).status
end

--- The status the core answered with in the handler's place (413 for a body over the limit,
-- 408 for one too slow, ...), or nil. Once it has, every method of the reply is a harmless
-- no-op: setters still chain, the ones that send return nil and an error.
-- @treturn ?integer
function Response:refused()
    local status = C.ms_ffi_req_refused(view(self))
    return status ~= 0 and status or nil
end

-- The error of a call that failed with `rc`: after the core refused the request, nil and
-- "ESENT: the core answered 413 in the handler's place"; else base.fail's.
local function fail(r, rc)
    local refused = C.ms_ffi_req_refused(r)
    if refused ~= 0 then
        return nil, format("ESENT: the core answered %d in the handler's place", refused), "ESENT"
    end
    return base.fail(rc)
end

local CTYPE_LEN = #"content-type"

local function add_header(self, name, value, level)
    local r = view(self)
    local rc = C.ms_ffi_res_header(r, name, #name, value, #value)
    if rc < 0 then
        if C.ms_ffi_req_refused(r) ~= 0 then
            return -- the core answered already: a field for a reply that is gone changes nothing
        end
        local _, err = base.fail(rc)
        error(format("bad header %q: %s", name, err), level + 1)
    end
    if #name == CTYPE_LEN and lower(name) == "content-type" then
        self.has_type = true
    end
end

local function add_fields(self, add, lines)
    local r = view(self)
    local rc = add(r, lines, #lines)
    if rc < 0 then
        if C.ms_ffi_req_refused(r) ~= 0 then
            return self
        end
        local _, err = base.fail(rc)
        error("cannot add fields: " .. err, 2) -- the callers below tail-call: 2 is theirs
    end
    return self
end

--- Adds whole field lines ("name: value\r\n"...) in one call; anything else raises.
function Response:fields(lines)
    return add_fields(self, C.ms_ffi_res_fields, lines)
end

-- The framework's fixed lines, checked once when they were built (security.compile), and
-- not again per request.
function Response:_fields_checked(lines)
    return add_fields(self, C.ms_ffi_res_fields_checked, lines)
end

-- Drops the fields set so far and the status (back to 200), before the head has left: for
-- an error page in place of a reply that failed. Returns false once the head is out.
function Response:_reset()
    local r = view(self)
    if C.ms_ffi_res_reset(r) < 0 then
        return false
    end
    self.has_type = false
    return true
end

-- An app:ngx_content route's code takes the reply over (moonserve/ngx/output.lua writes it
-- through this object already): the ngx layer, which alone makes such routes, puts its own
-- here when it loads (moonserve/ngx/init.lua).
function Response._ngx_begin()
    error("app:ngx_content needs the ngx layer: require \"moonserve.ngx\"", 2)
end

-- One field for response_methods' header(), which raises at the caller of header().
function Response:_add_header(name, value)
    add_header(self, name, value, 3)
end

local released = ffi.new("int32_t[256]")

local function drain_more(r, n)
    while true do
        for i = 0, n - 1 do
            anchors[released[i]] = nil
        end
        if n < 256 then
            return
        end
        n = C.ms_ffi_anchor_drain(r, released, 256)
    end
end

--- Lets go of the strings whose writes are done. Called per request and per anchored
-- write, so a long stream of large pieces does not pile them up. Usually there are none:
-- the loop lives apart, so the JIT compiles this call into the request's trace.
-- @local
function _M.drain(r)
    local n = C.ms_ffi_anchor_drain(r, released, 256)
    if n > 0 then
        drain_more(r, n)
    end
end
local drain = _M.drain

local function anchor(rc, s, r)
    if rc > 0 then
        anchors[rc - 1] = s -- the core writes from this string: keep it alive until then
        drain(r)
        return true
    elseif rc < 0 then
        return fail(r, rc)
    end
    return true
end

-- Sends a body given as a list of string pieces (a template's output) without joining
-- them: the head says the total length, small pieces are copied next to it, large ones are
-- referenced.
local function send_chain(self, r, pieces)
    local total = 0
    for i = 1, #pieces do
        local p = pieces[i]
        if type(p) ~= "string" then
            error("bad body piece " .. i .. " (string expected, got " .. type(p) .. ")", 3)
        end
        total = total + #p
    end
    local rc = C.ms_ffi_res_begin(r, total, self.has_type and 0 or 1)
    if rc < 0 then
        return fail(r, rc)
    end
    for i = 1, #pieces do
        local p = pieces[i]
        anchor(C.ms_ffi_res_piece(r, p, #p), p, r)
    end
    rc = C.ms_ffi_res_end(r)
    if rc < 0 then
        return fail(r, rc)
    end
    return true
end

local fire = shared.fire

-- For the layers above (the ngx phases): the before_send hooks now; the end of a streamed
-- reply; a streamed piece that never waits (from outside the handler's coroutine).
function Response:_fire()
    fire(self)
end

function Response:_close()
    return C.ms_ffi_res_close(view(self))
end

function Response:_put(chunk)
    local r = view(self)
    return anchor(C.ms_ffi_res_write(r, chunk, #chunk, self.has_type and 0 or 1), chunk, r)
end

--- Sends the reply: the head, then `body` with its length, and ends it.
-- @tparam[opt] string|table body a string, or a list of pieces sent without joining them
-- @return true, or nil and an error (the reply already went out)
-- @usage res:status(201):header("location", "/items/7"):send("made")
function Response:send(body)
    local r = view(self)
    fire(self)
    if type(body) == "table" then
        return send_chain(self, r, body)
    end
    body = body == nil and "" or text(body, "body")
    return anchor(C.ms_ffi_res_send(r, body, #body, self.has_type and 0 or 1), body, r)
end

--- Adds a trailer field, sent after a body streamed with res:write (on HTTP/2 after any
-- body). Returns res; raises on a bad or framing field, or once the reply is complete.
-- @tparam string name
-- @tparam string value
-- @return the reply
function Response:trailer(name, value)
    name, value = tostring(name), tostring(value)
    local r = view(self)
    local rc = C.ms_ffi_res_trailer(r, name, #name, value, #value)
    if rc < 0 then
        if C.ms_ffi_req_refused(r) ~= 0 then
            return self
        end
        local _, err = base.fail(rc)
        error(format("bad trailer %q: %s", name, err), 2)
    end
    return self
end

--- Sends the file at `path` as the reply, from the core: Content-Type from its name (unless
-- set), ETag and Last-Modified, 304 and 412 for conditional requests, ranges, and a
-- precompressed or compressed form when the client takes one. The path is the handler's
-- own, not confined to a directory. Returns true, or nil and an error ("ENOENT: ...") with
-- nothing sent.
-- @tparam string path
-- @return true, or nil and an error
-- @usage app:get("/report", function(req, res) return res:file("/srv/reports/latest.pdf") end)
function Response:file(path)
    local r = view(self)
    if type(path) ~= "string" then
        error("bad file path (string expected, got " .. type(path) .. ")", 2)
    end
    fire(self)
    local rc = C.ms_ffi_static_file(r, path, #path, self.has_type and 1 or 0)
    if rc < 0 then
        return fail(r, rc)
    end
    return true
end

--- For app:static with a hook: sends the file the request names under mount `id`. Returns
-- true, or false when there is none (nothing sent).
-- @local
function Response:static_mount(id)
    local r = view(self)
    fire(self)
    return C.ms_ffi_static_serve(r, id) == 0
end

-- Whether `url` holds none of the bytes a Location must escape (response_methods.redirect):
-- in C, for the redirect every canonical path takes.
function Response._url_check(_, url)
    return C.ms_ffi_url_check(url, #url)
end

--- Streams a piece of a reply whose length is not known (chunked on HTTP/1.1). Waits (parks
-- the handler) while the client reads slower than the handler writes.
-- @tparam string chunk
-- @return true, or nil and an error (the client has gone)
function Response:write(chunk)
    local r = view(self)
    chunk = text(chunk, "chunk")
    fire(self)
    local ok, err, name = anchor(C.ms_ffi_res_write(r, chunk, #chunk, self.has_type and 0 or 1),
        chunk, r)
    if not ok then
        return nil, err, name
    end
    if C.ms_ffi_res_congested(r) ~= 0 then
        check("res:write", "wait", 2) -- before the core arms the wait
        local rc = C.ms_ffi_req_wait_drain(r, 0)
        if rc == 0 then
            park()
        elseif rc < 0 then
            return fail(r, rc)
        end
    end
    return true
end

--- Waits (parks the handler) until everything written so far has left for the client:
-- for event streams and long polls that must not sit in a buffer.
-- @return true, or nil and an error
function Response:flush()
    local r = view(self)
    check("res:flush", "wait", 2)
    local rc = C.ms_ffi_req_wait_drain(r, 1)
    if rc == 0 then
        park()
    elseif rc < 0 then
        return base.fail(rc)
    end
    return true
end

-- json, redirect, cookie, before_send and render: over header(), status() and send(), the
-- same for every host.
for name, fn in pairs(shared.methods) do
    Response[name] = Response[name] or fn
end

return _M
