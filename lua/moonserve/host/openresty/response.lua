--- moonserve/host/openresty/response.lua: the reply a handler builds inside nginx, over ngx.status,
-- ngx.header and ngx.print: the methods of moonserve's own (moonserve/host/core/response.lua).
--
-- Fields gather in the reply until its head leaves (an error page can still replace them),
-- then go to ngx.header at once. send() gives the length; write() streams (chunked on
-- HTTP/1.1, as nginx frames a reply without one).
-- @module moonserve.openresty.response

-- luacheck: globals ngx (nginx's Lua module gives it; this runs only inside nginx)
local host = require "moonserve.host"
local shared = require "moonserve.response_methods"

local ngx = ngx
local ngx_header = ngx.header
local lower, format, find = string.lower, string.format, string.find
local type, tostring, error, rawget, pairs = type, tostring, error, rawget, pairs
local text = shared.text

local Response = {}
Response.__index = Response

local _M = { methods = Response }

local DEFAULT_TYPE = "text/plain; charset=utf-8" -- as the core's, for a text body

--- The reply nginx sends for the request it is handling now.
-- @local
function _M.new()
    return setmetatable({ code = 200, names = {}, values = {}, n = 0, has_type = false,
        state = "open" }, Response)
end

--- Whether the reply head has left (after send, or the first write).
-- @treturn boolean
function Response:sent()
    return self.state ~= "open"
end

--- Whether the client has gone: nothing more reaches it (a print or flush nginx refused).
-- @treturn boolean
function Response:gone()
    return self.lost == true
end

--- Sets the status code.
-- @tparam integer code 100 to 999
-- @return the reply
function Response:status(code)
    if type(code) ~= "number" or code < 100 or code > 999 or code % 1 ~= 0 then
        error("bad status code (integer 100-999 expected, got " .. tostring(code) .. ")", 2)
    end
    self.code = code
    return self
end

--- The status code set so far (200 unless changed).
-- @treturn integer
function Response:get_status()
    return self.code
end

-- The fields the server frames the message with, which the handler may not set (the core's
-- MS_ERESERVED); "connection: close" is the one connection value it may.
local RESERVED = { ["content-length"] = true, ["transfer-encoding"] = true, date = true }

local TOKEN = "^[%w!#$%%&'*+%-%.^_`|~]+$" -- RFC 9110 5.1: a field name
local NOT_VALUE = "[\r\n%z]"               -- what a field value may not hold

-- Adds one field (`lname` its name in lowercase; `checked` when the framework checked the
-- line once already); returns nil and why not, as the core does.
local function add(self, name, value, lname, checked)
    if self.state ~= "open" then
        return nil, "reply already sent"
    end
    if not checked then
        lname = lower(name)
        if RESERVED[lname] or (lname == "connection" and lower(value) ~= "close") then
            return nil, "header is set by the server"
        end
        if not find(name, TOKEN) or find(value, NOT_VALUE) then
            return nil, "invalid header name or value"
        end
    end
    if lname == "content-type" then
        self.has_type = true
    end
    local n = self.n + 1
    self.n, self.names[n], self.values[n] = n, lname, value
    return true
end

local function add_or_raise(self, name, value, level)
    local ok, err = add(self, name, value)
    if not ok then
        error(format("bad header %q: %s", name, err), level + 1)
    end
end

-- One field for response_methods' header(), which raises at the caller of header().
function Response:_add_header(name, value)
    add_or_raise(self, name, value, 3)
end

-- Whole field lines ("name: value\r\n"...) as name, lowercase name, value..., split once
-- per distinct block (the framework's security fields are the same string every request).
local split = setmetatable({}, { __mode = "k" })

local function lines_of(lines)
    local t = split[lines]
    if not t then
        t = {}
        for name, value in lines:gmatch("([^:\r\n]+):[ \t]*([^\r\n]*)\r\n") do
            t[#t + 1] = name
            t[#t + 1] = lower(name)
            t[#t + 1] = value
        end
        split[lines] = t
    end
    return t
end

local function add_lines(self, lines, checked)
    if not checked and not host.fields_ok(lines) then
        error("cannot add fields: invalid header name or value", 3)
    end
    local t = lines_of(lines)
    for i = 1, #t, 3 do
        local ok, err = add(self, t[i], t[i + 2], t[i + 1], checked)
        if not ok then
            error("cannot add fields: " .. err, 3)
        end
    end
    return self
end

--- Adds whole field lines ("name: value\r\n"...) in one call; anything else raises.
function Response:fields(lines)
    return add_lines(self, lines, false)
end

function Response:_fields_checked(lines)
    return add_lines(self, lines, true)
end

function Response:_reset()
    if self.state ~= "open" then
        return false
    end
    self.code, self.n, self.names, self.values, self.has_type = 200, 0, {}, {}, false
    return true
end

local fire = shared.fire

-- The values of field `i` and the later fields of its name, as a list.
local function repeated(names, values, n, i)
    local name, list = names[i], { values[i] }
    for j = i + 1, n do
        if names[j] == name then
            list[#list + 1] = values[j]
        end
    end
    return list
end

-- The head goes to nginx: the status and the fields, a repeated name's values as a list.
-- (A reply has a handful of fields: looking back for a name is cheaper than a table.)
local function head(self, length, has_body)
    ngx.status = self.code
    local names, values, n = self.names, self.values, self.n
    for i = 1, n do
        local name, first = names[i], true
        for j = 1, i - 1 do
            if names[j] == name then
                first = false
                break
            end
        end
        if first then
            local value = values[i]
            for j = i + 1, n do
                if names[j] == name then
                    value = repeated(names, values, n, i)
                    break
                end
            end
            ngx_header[name] = value
        end
    end
    if has_body and not self.has_type then
        ngx_header["content-type"] = DEFAULT_TYPE
    end
    local code = self.code
    if length and code ~= 204 and code ~= 304 and code >= 200 then
        ngx_header["content-length"] = length
    end
end

-- What ngx.print or ngx.flush said: true, or nil and why, the client then taken as gone.
local function outcome(self, ok, err)
    if not ok then
        self.lost = true
        return nil, err
    end
    return true
end

--- Sends the reply: the head, then `body` with its length, and ends it.
-- @tparam[opt] string|table body a string, or a list of pieces sent without joining them
-- @return true, or nil and an error (the reply already went out)
function Response:send(body)
    if self.state ~= "open" then
        return nil, "reply already sent"
    end
    fire(self)
    local len
    if type(body) == "table" then
        len = 0
        for i = 1, #body do
            local p = body[i]
            if type(p) ~= "string" then
                error("bad body piece " .. i .. " (string expected, got " .. type(p) .. ")", 2)
            end
            len = len + #p
        end
    else
        body = body == nil and "" or text(body, "body")
        len = #body
    end
    head(self, len, len > 0)
    self.state = "done"
    if len == 0 then
        return true
    end
    return outcome(self, ngx.print(body))
end

--- Streams a piece of a reply whose length is not known (chunked on HTTP/1.1).
-- @tparam string chunk
-- @return true, or nil and an error
function Response:write(chunk)
    chunk = text(chunk, "chunk")
    if self.state == "done" then
        return nil, "reply already sent"
    end
    fire(self)
    if self.state == "open" then
        head(self, nil, true)
        self.state = "streaming"
    end
    return outcome(self, ngx.print(chunk))
end

--- Waits (the handler yields to nginx) until everything written so far has left.
-- @return true, or nil and an error
function Response:flush()
    return outcome(self, ngx.flush(true))
end

--- nginx's Lua module sends no trailers: raises (nginx.conf's add_trailer can).
function Response.trailer()
    error("res:trailer: nginx's Lua module cannot send trailers (nginx.conf's add_trailer can)", 2)
end

--- Files are nginx's to serve (a location with root or alias): raises.
function Response.file()
    error("res:file: inside nginx, serve files with a location (root or alias) and ngx.exec", 2)
end

-- A static mount with a hook: the location init_worker's opts.static names for it.
function Response:static_mount()
    local location = rawget(self, "_static_location")
    if not location then
        error("app:static: no nginx location serves this mount (init_worker's opts.static)", 2)
    end
    return ngx.exec(location)
end

-- The request was refused (a body past its limit): nothing of this reply goes out.
function Response:_refused()
    self.state, self.lost = "done", true
end

-- Whether a streamed reply has begun (an error now can only cut it off).
function Response:_streaming()
    return self.state == "streaming"
end

-- An app:ngx_content route's code answers with nginx's ngx itself: the status and fields
-- set so far (the security fields, middleware's) go to ngx.header first.
function Response:_ngx_begin()
    if self.state == "open" then
        fire(self)
        head(self, nil, false)
        self.state = "ngx"
    end
end

-- The handler is done: a reply it never sent goes out empty (nginx ends a stream as the
-- content handler returns).
function Response:_finish()
    if self.state == "open" or (self.state == "ngx" and not ngx.headers_sent) then
        self.state = "open"
        self:send("")
    end
end

-- json, redirect, cookie, before_send and render: over header(), status() and send().
for name, fn in pairs(shared.methods) do
    Response[name] = Response[name] or fn
end

return _M
