-- moonserve/ngx/phases.lua: OpenResty's phases around moonserve's handling of a request, for
-- the app's ngx_access, ngx_header_filter, ngx_body_filter and ngx_log hooks (app.lua).
--
-- access runs in the request's handler before the routes (and before a static mount it
-- guards), where ngx.exit ends the hook alone: ngx.OK goes on to the routes, 2xx ends the
-- request with what was printed, 300 and more with the error page. The filters run on the
-- reply as Lua makes it (res:send, res:write and what is built on them: ngx.say and the rest,
-- error pages, res:json): the header filter once, just before the head leaves, on the
-- reply's fields as ngx.header; the body filter on each piece, as ngx.arg[1] and ngx.arg[2].
-- Files the core sends (static mounts, res:file) pass no filter. log runs from the loop once
-- the reply has left, on a copy of what it may read (ngx.var, the request's fields, the
-- status), and never holds the reply up. Subrequests (ngx.location.capture) skip access and
-- log, as nginx's do.
local ffi = require "ffi"
local bit = require "bit"
local context = require "moonserve.ngx.context"
local output = require "moonserve.ngx.output"
local req_api = require "moonserve.ngx.req"
local var = require "moonserve.ngx.var"
local coro = require "moonserve.host.core.coroutine"
local base = require "moonserve.host.core.base"
local dispatcher = require "moonserve.host.core.dispatcher"
local Response = require("moonserve.host.core.response").methods

local C = base.C
local band = bit.band
local concat, lower, sub, type, tostring, pairs, error, pcall, xpcall = table.concat,
    string.lower, string.sub, type, tostring, pairs, error, pcall, xpcall
local ffi_str = ffi.string
local HEAD_SENT, DONE = base.REQ_HEAD_SENT, base.REQ_DONE

if not pcall(function() return C.ms_ffi_res_fields_get end) then
    ffi.cdef [[ int64_t ms_ffi_res_fields_get(ms_req_view_t *r, const char **out); ]]
end

local _M = {}

local DEFAULT_TYPE = "text/plain; charset=utf-8" -- what the core adds to a text reply
local ERROR = -1

local function append(list, more)
    if not more then
        return list
    end
    list = list or {}
    for i = 1, #more do
        list[#list + 1] = more[i]
    end
    return list
end

-- The reply's fields as they stand, as name, value, name, value...
local fields_out = ffi.new("const char *[1]")
local function reply_fields(res)
    local n = tonumber(C.ms_ffi_res_fields_get(res.r, fields_out))
    local list = {}
    if n > 0 then
        local text = ffi_str(fields_out[0], n)
        for name, value in text:gmatch("([^:\r\n]+):[ \t]*([^\r\n]*)\r\n") do
            list[#list + 1] = name
            list[#list + 1] = value
        end
    end
    return list
end

-- Runs a filter's or hook's function; where the running code can wait, in a coroutine of its
-- own, so that ngx.exit ends it alone (coro.phase). Returns false when it exited.
local function run(fn)
    if coroutine.isyieldable() then
        return coro.phase(fn)
    end
    fn()
    return true
end

-- -- The header filter ----------------------------------------------------------------------

-- Runs the header filters on the reply's head, before it leaves; `text` when the core would
-- add its default Content-Type. Returns the status of an ngx.exit that replaces the reply.
local function header_filter(res, st, text)
    st.hf_done = true
    local list = reply_fields(res)
    if text and not res.has_type then
        list[#list + 1] = "content-type"
        list[#list + 1] = DEFAULT_TYPE
    end
    output.reopen(st, list)
    local prev = st.phase
    st.phase = "header_filter"
    local fns = st.hf
    local ok, err = true, nil
    for i = 1, #fns do
        local went
        ok, went = pcall(run, fns[i])
        if not ok then
            err = went
            break
        elseif not went then -- ngx.exit: the header filter phase is over
            break
        end
    end
    st.phase = prev
    st.head = true
    local r = res.r
    local status = r.status
    C.ms_ffi_res_reset(r)
    r.status = status
    local lines = output.lines(st)
    if lines ~= "" then
        local rc = C.ms_ffi_res_fields(r, lines, #lines)
        if rc < 0 and ok then
            local _, why = base.fail(rc)
            ok, err = false, "header filter: the reply's fields: " .. why
        end
    end
    res.has_type = st.hvals["content-type"] ~= nil
    if not ok then
        error(err, 0)
    end
    local code = st.filter_exit
    st.filter_exit = nil
    if code and (code >= 300 or code == ERROR or code == 444) then
        return code
    end
end

-- The reply is replaced by what an ngx.exit in the header filter asked for.
local function replace(res, st, code)
    local req = st.req
    if code == ERROR or code == 444 then
        st.eof = true
        C.ms_ffi_req_fail(res.r)
        return true
    end
    res:_reset()
    local app = rawget(req, "_app")
    if app then
        app:secure_reply(req, res)
        app:error(req, res, { status = code })
    else
        res:status(code):send(code .. " Error\n")
    end
    st.eof = true
    return true
end

-- -- The body filter ------------------------------------------------------------------------

-- Runs the body filters on a piece of the body: returns what goes out, and whether the body
-- ends with it (ngx.arg[2] set by a filter ends it early: the rest is dropped).
local function body_filter(st, chunk, eof)
    local arg = { chunk, eof }
    local prev = st.phase
    st.arg, st.phase = arg, "body_filter"
    local fns = st.bf
    for i = 1, #fns do
        local ok, err = pcall(fns[i])
        if ok then
            local v = arg[1]
            if type(v) ~= "string" then
                ok, v = pcall(output.text, "ngx.arg", false, v == nil and "" or v)
                arg[1] = v
            end
            err = v
        end
        if not ok then
            st.arg, st.phase = nil, prev
            error(err, 0)
        end
    end
    st.arg, st.phase = nil, prev
    local last = arg[2] and true or false
    if last then
        st.bf_done = true
    end
    return arg[1], last
end

-- -- The reply, filtered --------------------------------------------------------------------

local Filtered = setmetatable({}, { __index = Response })
Filtered.__index = Filtered

-- A whole body as text, or nil for what res:send refuses (it raises there).
local function whole(body)
    local t = type(body)
    if t == "string" then
        return body
    elseif body == nil then
        return ""
    elseif t == "number" then
        return tostring(body)
    elseif t == "table" then
        for i = 1, #body do
            if type(body[i]) ~= "string" then
                return nil
            end
        end
        return concat(body)
    end
end

function Filtered:send(body)
    local st = rawget(self, "_ngx")
    local text = whole(body)
    if text == nil or not self.r or band(self.r.flags, HEAD_SENT) ~= 0 then
        return Response.send(self, body) -- its error
    end
    self:_fire()
    if st.hf and not st.hf_done then
        local code = header_filter(self, st, text ~= "")
        if code then
            return replace(self, st, code)
        end
    end
    if st.bf and not st.bf_done then
        text = body_filter(st, text, true)
    end
    return Response.send(self, text)
end

function Filtered:write(chunk)
    local st = rawget(self, "_ngx")
    local t = type(chunk)
    if (t ~= "string" and t ~= "number") or not self.r then
        return Response.write(self, chunk) -- its error
    end
    self:_fire()
    if st.hf and not st.hf_done and band(self.r.flags, HEAD_SENT) == 0 then
        local code = header_filter(self, st, true)
        if code then
            return replace(self, st, code)
        end
    end
    if not st.bf then
        return Response.write(self, chunk)
    elseif st.bf_done then
        return true -- the filter ended the body: the rest is dropped
    end
    st.bf_open = true -- a stream through the filter: its end gets the last call
    local out, last = body_filter(st, tostring(chunk), false)
    local ok, err, name = Response.write(self, out)
    if ok and last then
        Response._close(self)
    end
    return ok, err, name
end

-- The end of a streamed reply: the body filter's last call (ngx.arg[2] true) first.
function Filtered:_close()
    local st = rawget(self, "_ngx")
    if st.bf and not st.bf_done and self.r and band(self.r.flags, DONE) == 0 then
        local out = body_filter(st, "", true)
        if out ~= "" then
            self:_put(out)
        end
    end
    return Response._close(self)
end

-- -- The log phase --------------------------------------------------------------------------

-- A request as the log phase reads it: what ngx.var and ngx.req need, copied before the core
-- reuses the request.
local Saved = {}
Saved.__index = Saved

function Saved:header(name)
    local f = self._fields
    name = lower(name)
    for i = 1, #f, 2 do
        if lower(f[i]) == name then
            return f[i + 1]
        end
    end
end

local function saved(st)
    local req, res = st.req, st.res
    local fields = {}
    req_api.each_field(st, function(name, value)
        fields[#fields + 1] = name
        fields[#fields + 1] = value
    end)
    local copy = { kind = "request", phase = "log", ctx = st.ctx, vars = st.vars, uri = st.uri,
        args = st.args, start = st.start, fields = fields, status = res.r.status,
        head = true, eof = true, nb = 0, size = 0 }
    local addr, port = var.address(st, false)
    local laddr, lport = var.address(st, true)
    copy.addrs = { { addr, port }, { laddr, lport } }
    copy.req = setmetatable({ r = false, method = req.method, path = req.path,
        target = req.target, query_string = req.query_string, scheme = req.scheme,
        http_version = req.http_version, id = req.id, _body = rawget(req, "_body"),
        _app = rawget(req, "_app"), _fields = fields }, Saved)
    copy.res = { r = false, sent = function() return true end }
    output.reopen(copy, reply_fields(res))
    copy.head = true
    return copy
end

local traceback = debug.traceback

local function run_logs(fns)
    for i = 1, #fns do
        local ok, err = xpcall(fns[i], traceback)
        if not ok then
            base.log(base.LOG_ERR, "ngx_log hook failed: " .. tostring(err))
        end
    end
end

-- The request is over (the dispatcher's last word, before the core finishes it): a reply
-- nothing sent goes through the filters, a stream left open gets the body filter's last
-- call, and the log hooks are queued with their copy.
local function finish(frame)
    local st = frame.ngx
    if not st or not st.res.r then
        return
    end
    local res = st.res
    local flags = res.r.flags
    if st.hf or st.bf then
        if band(flags, HEAD_SENT) == 0 then
            res:send("")
        elseif band(flags, DONE) == 0 and st.bf_open and not st.bf_done then
            res:_close()
        end
    end
    local logs = st.logs
    if logs then
        local copy = saved(st)
        dispatcher.soon("ngx_log", function()
            dispatcher.run_as("ngx_log", copy, function()
                run_logs(logs)
            end)
        end)
    end
end

-- -- The app's hooks ------------------------------------------------------------------------

local Phases = {}
Phases.__index = Phases

-- The hooks a request through an app meets: { access = {fn...}, header_filter = {...},
-- body_filter = {...}, log = {...} } (each list may be missing), and `statics`: the static
-- mounts it serves from Lua because an access hook guards them (app:static_mounts).
function _M.new(hooks, statics)
    local p = setmetatable({}, Phases)
    for k, v in pairs(hooks) do
        p[k] = v
    end
    p.statics = statics
    return p
end

-- Runs an access hook: true when the request is answered (it exited with a status of 200 or
-- more, or printed: OpenResty ends the request with what an access handler sent).
local function access(st, fn)
    st.phase = "access"
    local ok, err = pcall(run, fn)
    st.phase = "content"
    if not ok then
        error(err, 0)
    end
    local res = st.res
    if st.eof or not res.r or band(res.r.flags, HEAD_SENT) ~= 0 then
        return true
    end
    if st.head or st.nb > 0 then
        output.finish(st)
        return true
    end
    return false
end

local function under(path, prefix)
    local n = #prefix
    return sub(path, 1, n) == prefix and (#path == n or sub(path, n + 1, n + 1) == "/")
end

-- A request through the app, before its routes: sets up the filters and the log, runs the
-- access hooks, then serves a guarded static file. Returns true when the request is
-- answered. `path` is the request's path within the app (its site's base stripped).
function Phases:enter(req, res, path)
    local st = context.state()
    local seen = st.entered
    if not seen then
        seen = {}
        st.entered = seen
    elseif seen[self] then
        return false
    end
    seen[self] = true
    local hf, bf = self.header_filter, self.body_filter
    if hf or bf then
        st.hf, st.bf = append(st.hf, hf), append(st.bf, bf)
        setmetatable(res, Filtered)
    end
    if self.log and not st.sub then
        st.logs = append(st.logs, self.log)
    end
    if (hf or bf or st.logs) and not st.frame.finish then
        st.frame.finish = finish
    end
    local acc = self.access
    if acc and not st.sub then
        for i = 1, #acc do
            if access(st, acc[i]) then
                return true
            end
        end
    end
    local statics = self.statics
    if statics then
        local full = (rawget(req, "base_path") or "") .. path
        for i = 1, #statics do
            local m = statics[i]
            if under(full, m.prefix) then
                if not m.hooked and m.mount.id and res:static_mount(m.mount.id) then
                    return true
                end
                break -- the longest prefix decides, as in the core; a miss goes on to the routes
            end
        end
    end
    return false
end

return _M
