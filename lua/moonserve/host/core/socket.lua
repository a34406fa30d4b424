--- moonserve/host/core/socket.lua: moonserve.socket.tcp() and udp(), OpenResty's cosockets over the
-- core's socket engine (core/client/sock.h). Reading, matching and buffering are in C; a call that
-- must wait parks the calling coroutine on its slot (dispatcher.waiter) and the engine's
-- completion wakes it (modules/ms_sock_ffi.c), so every wait works inside pcall, xpcall,
-- coroutine.wrap and iterators. A socket belongs to the request, timer or hook that made
-- it (dispatcher.owner), is usable from any of its light threads, and is closed when that
-- owner ends.
--
-- `Tcp`: A TCP socket (moonserve.socket.tcp()), as OpenResty's cosocket.
-- @module moonserve.socket
local ffi = require "ffi"
local base = require "moonserve.host.core.base"
local dispatcher = require "moonserve.host.core.dispatcher"
local coro = require "moonserve.host.core.coroutine"

local C = base.C
local ffi_str, ffi_gc = ffi.string, ffi.gc
local type, error, tostring, tonumber, setmetatable, getmetatable = type, error, tostring,
    tonumber, setmetatable, getmetatable
local floor = math.floor
local ceil, min = math.ceil, math.min
local concat = table.concat
local byte, sub = string.byte, string.sub
local owner_now, waiter, coro_check, coro_park = dispatcher.owner, dispatcher.waiter, coro.check,
    coro.park

ffi.cdef [[
typedef struct ms_sock_view_s {
    const char *data;
    size_t len;
    uint32_t reused;
    int32_t slot;
    uint8_t connected;
} ms_sock_view_t;
typedef struct ms_ffi_buf_s { const char *base; size_t len; } ms_ffi_buf_t;
typedef struct ms_sock_until_s ms_sock_until_t;
typedef struct ms_ffi_sock_s {
    ms_sock_view_t *view;
    void *s;
    void *u;
    ms_server_t *srv;
    int32_t rslot, wslot;
    int32_t index;
} ms_ffi_sock_t;
void ms_ffi_sock_init(ms_ffi_sock_t *g, ms_server_t *srv);
void ms_ffi_udp_init(ms_ffi_sock_t *g, ms_server_t *srv);
void ms_ffi_sock_release(ms_ffi_sock_t *g);
void ms_ffi_sock_settimeouts(ms_ffi_sock_t *g, double c, double s, double r);
int ms_ffi_sock_connect(ms_ffi_sock_t *g, const char *host, size_t len, int port,
                        const char *pool, size_t pool_len, int pool_size, int backlog,
                        int fresh);
int ms_ffi_sock_send(ms_ffi_sock_t *g, const ms_ffi_buf_t *bufs, unsigned n);
int ms_ffi_sock_receive(ms_ffi_sock_t *g, int pattern, double n);
int ms_ffi_sock_receiveuntil(ms_ffi_sock_t *g, ms_sock_until_t *u, double size);
int ms_ffi_sock_setkeepalive(ms_ffi_sock_t *g, double idle_ms, int pool_size);
int ms_ffi_sock_close(ms_ffi_sock_t *g);
int ms_ffi_sock_setoption(ms_ffi_sock_t *g, const char *name, int value);
int ms_ffi_sock_fd(ms_ffi_sock_t *g);
int ms_ffi_sock_errmsg(ms_ffi_sock_t *g, int err, char *buf, size_t len);
ms_sock_until_t *ms_ffi_until_new(const char *p, size_t len, int inclusive);
void ms_ffi_until_free(ms_sock_until_t *u);
int ms_ffi_udp_setpeername(ms_ffi_sock_t *g, const char *host, size_t len, int port);
int ms_ffi_udp_send(ms_ffi_sock_t *g, const ms_ffi_buf_t *bufs, unsigned n);
int ms_ffi_udp_receive(ms_ffi_sock_t *g, double size);
typedef struct ms_tls_session_s ms_tls_session_t;
int ms_ffi_sock_sslhandshake(ms_ffi_sock_t *g, ms_tls_session_t *sess, const char *name,
                             size_t name_len, int verify, int ocsp);
ms_tls_session_t *ms_ffi_sock_session(ms_ffi_sock_t *g);
void ms_ffi_tls_session_free(ms_tls_session_t *sess);
int ms_ffi_sock_sslinfo(ms_ffi_sock_t *g, const char **version, const char **cipher);
int ms_ffi_sock_setclientcert(ms_ffi_sock_t *g, const char *cert, size_t cert_len,
                              const char *key, size_t key_len, char *err, size_t errlen);
int ms_ffi_tls_trust(ms_server_t *srv, const char *file, char *err, size_t errlen);
]]

local PENDING, DONE, END = 0, 1, 2
local LINE, ALL, BYTES, ANY = 0, 1, 2, 3
local EOF = -4095 -- UV_EOF: "closed"
local ETLSPOOL = -10111 -- MS_SOCK_ETLSPOOL (core/client/sock.h): a pooled connection of other TLS wishes
local READ, WRITE = 1, 2

local msgbuf = ffi.new("char[512]")
local session_ct = ffi.typeof("ms_tls_session_t *")
local info_out = ffi.new("const char *[2]")
local bufs_cap = 64
local bufs = ffi.new("ms_ffi_buf_t[?]", bufs_cap) -- the engine copies the array at once

local _M = {}

local Tcp, Udp = {}, {}
Tcp.__index, Udp.__index = Tcp, Udp
Tcp.__tostring = function() return "moonserve.socket.tcp" end
Udp.__tostring = function() return "moonserve.socket.udp" end

local function errmsg(g, rc)
    local n = C.ms_ffi_sock_errmsg(g, rc, msgbuf, 512)
    return ffi_str(msgbuf, n)
end

-- The engine's socket of `self`, checked: the running code must be of the socket's owner.
-- nil once the owner ended (or never: the socket was released).
local function check(self, mt, what)
    if getmetatable(self) ~= mt then
        error("bad self to '" .. what .. "' (a " .. (mt == Tcp and "tcp" or "udp") .. " socket expected; use "
            .. "sock:" .. what .. "(...))", 3)
    end
    local o = owner_now(what, 3, "socket:")
    if o ~= self.owner then
        error("socket:" .. what .. ": the socket belongs to another request, timer or hook", 3)
    end
    local g = self.g
    if g.view == nil then
        return nil
    end
    return g
end

-- A wait of the other side, woken on the next turn of the loop with "closed" (a close from
-- a thread that is not the waiter's must not resume the waiter inside the close).
local function close_deferred(self, g)
    local r, w = g.rslot, g.wslot
    g.rslot, g.wslot = -1, -1
    local rc = C.ms_ffi_sock_close(g)
    if r >= 0 then
        C.ms_ffi_wake_after(g.srv, r, 0, EOF)
    end
    if w >= 0 then
        C.ms_ffi_wake_after(g.srv, w, 0, EOF)
    end
    self.reading, self.writing = false, false
    return rc
end

-- A killed light thread's wait is void: the socket closes (the engine cannot take back a
-- read or write half done), and whoever else waits on it hears "closed". (Made apart from
-- await: a closure there would leave upvalues for every return of await to close, which
-- LuaJIT does not compile.)
local function canceller(self, g, side)
    return function()
        if side == READ then g.rslot = -1 else g.wslot = -1 end
        close_deferred(self, g)
    end
end

-- After a call that returned `rc`: parks the running code until the engine's completion
-- when it is PENDING. Returns the final status.
local function await(self, g, rc, side, what)
    if rc ~= PENDING then
        return rc
    end
    local w = waiter(what)
    if side == READ then
        g.rslot = w.slot
        self.reading = true
    else
        g.wslot = w.slot
        self.writing = true
    end
    local t = w.task
    if t then
        t.cancel = canceller(self, g, side)
    end
    local status = coro_park()
    if t then
        t.cancel = nil
    end
    w.woken = true
    if side == READ then self.reading = false else self.writing = false end
    if type(status) ~= "number" then
        -- resumed by something other than the engine: give the wait up
        if side == READ then g.rslot = -1 else g.wslot = -1 end
        close_deferred(self, g)
        return EOF
    end
    return status
end

local function read_result(g, rc)
    local v = g.view
    if rc == DONE then
        local s = ffi_str(v.data, v.len)
        return s -- (no tail call: a trace cannot return from one to a built-in)
    elseif rc == END then
        return nil, nil, nil -- (lua-nginx-module's three)
    end
    local partial = ""
    if v ~= nil and v.data ~= nil and v.len > 0 then
        partial = ffi_str(v.data, v.len)
    end
    return nil, errmsg(g, rc), partial
end

-- Data to send as a flat list of strings (numbers as tostring), tables nested.
local function flatten(data, parts, n, total)
    local t = type(data)
    if t == "string" then
        n = n + 1
        parts[n] = data
        return n, total + #data
    elseif t == "number" then
        local s = tostring(data)
        n = n + 1
        parts[n] = s
        return n, total + #s
    elseif t == "table" then
        for i = 1, #data do
            n, total = flatten(data[i], parts, n, total)
        end
        return n, total
    end
    error("bad data argument to 'send' (string, number or table of them expected, got "
        .. t .. ")", 4)
end

-- Data to send into `bufs`: the count of buffers, the bytes, and what keeps them alive. A
-- string is one buffer; so is a flat table of strings and numbers (a driver's command:
-- lua-resty-redis sends { "*2\r\n", "$", 3, "\r\n", "GET", ... }), joined in C, which
-- costs less than a buffer per piece; nested tables are flattened.
local function gather(data)
    local t = type(data)
    if t == "table" then
        local flat = true
        for i = 1, #data do
            local ti = type(data[i])
            if ti ~= "string" and ti ~= "number" then
                flat = false
                break
            end
        end
        if flat then
            data, t = concat(data), "string"
        end
    end
    if t == "string" then
        local len = #data
        bufs[0].base, bufs[0].len = data, len
        return data, 1, len
    end
    local parts = {}
    local n, total = flatten(data, parts, 0, 0)
    if n > bufs_cap then
        while bufs_cap < n do
            bufs_cap = bufs_cap * 2
        end
        bufs = ffi.new("ms_ffi_buf_t[?]", bufs_cap)
    end
    for i = 1, n do
        local s = parts[i]
        bufs[i - 1].base, bufs[i - 1].len = s, #s
    end
    return parts, n, total
end

-- The glue is Lua's memory, with no finaliser: the owner holds the socket until it ends and
-- releases it (dispatcher.adopt), which frees the engine's socket; a finaliser a socket
-- would cost a malloc, and GC steps that run finalisers abort the trace being recorded.
local glue_ct = ffi.typeof("ms_ffi_sock_t")

local function new_socket(mt, init, what)
    local o = owner_now(what, 3)
    local g = glue_ct()
    init(g, o.srv)
    -- All its keys at once, connect's too: a key added later costs a rehash (past eight).
    local self = setmetatable({ g = g, owner = o, reading = false, writing = false,
        openresty = false, sending = false, peer_host = false, peer_port = false,
        peer_pool = false, peer_pool_size = false, peer_backlog = false }, mt)
    dispatcher.adopt(o, self)
    return self
end

local function release(self)
    local g = self.g
    g.rslot, g.wslot = -1, -1
    C.ms_ffi_sock_release(g)
end
Tcp._release, Udp._release = release, release

-- OpenResty's sockets (ngx.socket.*) take a timeout as nginx's C does: lua_tonumber's number
-- (anything else is 0), truncated, and 0 is the configured default (socket_*_timeout; -1 for
-- the core). A TCP socket's must fit 31 bits; a UDP socket's is not checked (a negative one is
-- the default here).
local function ngx_timeout_arg(ms, class)
    ms = tonumber(ms) or 0
    ms = ms < 0 and ceil(ms) or floor(ms)
    if class == Tcp and (ms < 0 or ms >= 2147483648) then
        error("bad timeout value", 0) -- (as nginx's C raises it: with no position)
    end
    return ms <= 0 and -1 or min(ms, 4294967294)
end

local function timeout_arg(ms, i, what, self, class)
    if self.openresty then
        return ngx_timeout_arg(ms, class)
    end
    if ms == nil then
        return 0
    end
    if type(ms) ~= "number" or ms < 0 then
        error("bad argument #" .. i .. " to '" .. what .. "' (a non-negative number of ms "
            .. "expected)", 3)
    end
    return floor(ms)
end

-- -- TCP ------------------------------------------------------------------------------------

--- A TCP socket, as OpenResty's ngx.socket.tcp(): connect it, then send and receive.
-- Its waits park the calling coroutine; it belongs to the request, timer or hook that made it.
-- @treturn Tcp
-- @usage local sock = moonserve.socket.tcp()
-- assert(sock:connect("127.0.0.1", 6379))
function _M.tcp()
    return new_socket(Tcp, C.ms_ffi_sock_init, "moonserve.socket.tcp")
end

--- ngx.socket.tcp() of the ngx layer: the same socket, with OpenResty's default of no
-- certificate verification unless sslhandshake asks for it.
function _M.ngx_tcp()
    local self = new_socket(Tcp, C.ms_ffi_sock_init, "ngx.socket.tcp")
    self.openresty = true
    return self
end

--- Connects to `host` and `port` (a name is resolved without blocking), or to "unix:PATH",
-- taking an idle connection from the pool when there is one.
-- @tparam string host
-- @tparam[opt] number port
-- @tparam[opt] table opts pool, pool_size, backlog
-- @return 1, or nil and an error ("connection refused", "timeout", ...)
function Tcp:connect(host, port, opts)
    local g = check(self, Tcp, "connect")
    if type(host) ~= "string" then
        error("bad argument #1 to 'connect' (string expected)", 2)
    end
    if type(port) == "table" and opts == nil then
        port, opts = nil, port
    end
    if byte(host, 1) == 117 and sub(host, 1, 5) == "unix:" then -- (a string made for "u..." only)
        port = 0
    else
        port = tonumber(port)
        if not port or port < 0 or port > 65535 or port % 1 ~= 0 then
            error("bad argument #2 to 'connect' (a port number expected)", 2)
        end
    end
    local pool, pool_size, backlog
    if opts ~= nil then
        if type(opts) ~= "table" then
            error("bad argument #3 to 'connect' (table expected)", 2)
        end
        pool, pool_size, backlog = opts.pool, opts.pool_size, opts.backlog
        if pool ~= nil and type(pool) ~= "string" then
            error("bad \"pool\" option to 'connect' (string expected)", 2)
        end
        if pool_size ~= nil and (type(pool_size) ~= "number" or pool_size < 1) then
            error("bad \"pool_size\" option to 'connect' (a positive number expected)", 2)
        end
        if backlog ~= nil and (type(backlog) ~= "number" or backlog < 0) then
            error("bad \"backlog\" option to 'connect' (a non-negative number expected)", 2)
        end
    end
    if g == nil then
        return nil, "closed"
    end
    coro_check("socket:connect", "wait", 2)
    -- (kept for sslhandshake, which connects anew when a pooled connection was set up with
    -- other TLS wishes)
    self.peer_host, self.peer_port, self.peer_pool = host, port, pool
    self.peer_pool_size, self.peer_backlog = pool_size, backlog
    local rc = C.ms_ffi_sock_connect(g, host, #host, port, pool, pool and #pool or 0,
        pool_size or 0, backlog or 0, 0)
    rc = await(self, g, rc, READ, "socket:connect")
    if rc == DONE then
        return 1
    end
    return nil, errmsg(g, rc)
end

--- Sends a string, a number or a nested table of them (gathered, not joined).
-- @return the bytes sent, or nil and an error ("timeout" closes the socket)
function Tcp:send(data)
    local g = check(self, Tcp, "send")
    local parts, n, total = gather(data)
    if g == nil then
        return nil, "closed"
    end
    if self.writing then
        return nil, "socket busy writing"
    end
    coro_check("socket:send", "wait", 2)
    local rc = C.ms_ffi_sock_send(g, bufs, n)
    if rc == PENDING then
        self.sending = parts -- the engine writes from these strings until it calls back
        rc = await(self, g, rc, WRITE, "socket:send")
        self.sending = nil
    end
    if rc == DONE then
        return total
    end
    return nil, errmsg(g, rc)
end

local function receive_with(self, g, kind, n, what)
    if g == nil then
        return nil, "closed", ""
    end
    coro_check(what, "wait", 3)
    local rc = C.ms_ffi_sock_receive(g, kind, n)
    rc = await(self, g, rc, READ, what)
    return read_result(g, rc)
end

--- Receives a line ("*l", the default, without its CR LF), everything until the peer
-- closes ("*a"), or a number of bytes.
-- @return the data, or nil, an error and the partial data ("timeout" keeps the socket)
function Tcp:receive(pattern)
    local g = check(self, Tcp, "receive")
    local kind, n = LINE, 0
    if pattern == nil or pattern == "*l" then
        kind = LINE
    elseif pattern == "*a" then
        kind = ALL
    elseif type(pattern) == "number" or (type(pattern) == "string" and tonumber(pattern)) then
        n = tonumber(pattern)
        if n < 0 then
            error("bad argument #1 to 'receive' (a non-negative size expected)", 2)
        end
        kind, n = BYTES, floor(n)
    else
        error("bad argument #1 to 'receive' (\"*l\", \"*a\" or a number expected)", 2)
    end
    return receive_with(self, g, kind, n, "socket:receive")
end

--- Receives whatever has arrived, at most `max` bytes, waiting until something has.
-- @return the data, or nil and an error
function Tcp:receiveany(max)
    local g = check(self, Tcp, "receiveany")
    if type(max) ~= "number" or max < 1 then
        error("bad argument #1 to 'receiveany' (a positive number expected)", 2)
    end
    return receive_with(self, g, ANY, floor(max), "socket:receiveany")
end

--- An iterator that reads until `pattern` (not included unless opts.inclusive):
-- it([size]) returns the data, or nil, an error and the partial data.
function Tcp:receiveuntil(pattern, opts)
    check(self, Tcp, "receiveuntil")
    if type(pattern) ~= "string" or #pattern == 0 then
        error("bad argument #1 to 'receiveuntil' (a non-empty string expected)", 2)
    end
    local inclusive = type(opts) == "table" and opts.inclusive and 1 or 0
    local u = ffi_gc(C.ms_ffi_until_new(pattern, #pattern, inclusive), C.ms_ffi_until_free)
    return function(size)
        local g = check(self, Tcp, "receiveuntil")
        if size ~= nil and (type(size) ~= "number" or size < 0) then
            error("bad argument #1 to the receiveuntil iterator (a size expected)", 2)
        end
        if g == nil then
            return nil, "closed", ""
        end
        coro_check("socket:receiveuntil", "wait", 2)
        local rc = C.ms_ffi_sock_receiveuntil(g, u, size and floor(size) or 0)
        rc = await(self, g, rc, READ, "socket:receiveuntil")
        return read_result(g, rc)
    end
end

-- settimeout(ms): one timeout for every wait of a socket of `class` (Tcp, Udp). It returns 1;
-- OpenResty's return nothing.
local function settimeout_of(class)
    return function(self, ms)
        local g = check(self, class, "settimeout")
        ms = timeout_arg(ms, 1, "settimeout", self, class)
        if g then
            C.ms_ffi_sock_settimeouts(g, ms, ms, ms)
        end
        if not self.openresty then
            return 1
        end
    end
end

--- Sets the connect, send and read timeouts at once, in milliseconds.
-- @function Tcp:settimeout
Tcp.settimeout = settimeout_of(Tcp)

--- Sets the connect, send and read timeouts, in milliseconds.
function Tcp:settimeouts(connect, send, read)
    local g = check(self, Tcp, "settimeouts")
    connect = timeout_arg(connect, 1, "settimeouts", self, Tcp)
    send = timeout_arg(send, 2, "settimeouts", self, Tcp)
    read = timeout_arg(read, 3, "settimeouts", self, Tcp)
    if g then
        C.ms_ffi_sock_settimeouts(g, connect, send, read)
    end
    if not self.openresty then
        return 1
    end
end

--- Puts the connection back in its pool, kept at most `idle_ms` (0: forever), the pool
-- holding at most `pool_size` idle ones.
-- @return 1, or nil and an error (unread data, a read in progress)
function Tcp:setkeepalive(idle_ms, pool_size)
    local g = check(self, Tcp, "setkeepalive")
    if idle_ms ~= nil and (type(idle_ms) ~= "number" or idle_ms < 0) then
        error("bad argument #1 to 'setkeepalive' (a non-negative number of ms expected)", 2)
    end
    if pool_size ~= nil and (type(pool_size) ~= "number" or pool_size < 1) then
        error("bad argument #2 to 'setkeepalive' (a positive number expected)", 2)
    end
    if g == nil then
        return nil, "closed"
    end
    if self.reading then
        return nil, "socket busy reading"
    elseif self.writing then
        return nil, "socket busy writing"
    end
    local rc = C.ms_ffi_sock_setkeepalive(g, idle_ms and floor(idle_ms) or -1,
        pool_size and floor(pool_size) or 0)
    if rc == DONE then
        return 1
    end
    return nil, errmsg(g, rc)
end

--- sslhandshake(reused_session, server_name, verify, send_status_req), as OpenResty's: the
-- session (to pass to a later handshake with the same server), or true when reused_session is
-- false; nil and "handshake failed", "certificate host mismatch", "20: unable to get local
-- issuer certificate", "timeout" (the connect timeout) otherwise, the socket then closed.
-- verify is on unless false (on an ngx.socket.tcp() socket: off unless true).
function Tcp:sslhandshake(reused_session, server_name, verify, send_status_req)
    local g = check(self, Tcp, "sslhandshake")
    local sess = nil
    if reused_session ~= nil and reused_session ~= false then
        if type(reused_session) ~= "cdata" or not ffi.istype(session_ct, reused_session) then
            error("bad argument #1 to 'sslhandshake' (a session from sslhandshake, nil or "
                .. "false expected)", 2)
        end
        sess = reused_session
    end
    if server_name ~= nil and type(server_name) ~= "string" then
        error("bad argument #2 to 'sslhandshake' (string expected)", 2)
    end
    if verify ~= nil and type(verify) ~= "boolean" then
        error("bad argument #3 to 'sslhandshake' (boolean expected)", 2)
    end
    local on
    if self.openresty then
        on = verify == true
    else
        on = verify ~= false
    end
    if g == nil then
        return nil, "closed"
    end
    if self.reading or self.writing then
        return nil, self.reading and "socket busy reading" or "socket busy writing"
    end
    coro_check("socket:sslhandshake", "wait", 2)
    local rc = C.ms_ffi_sock_sslhandshake(g, sess, server_name,
        server_name and #server_name or 0, on and 1 or 0, send_status_req and 1 or 0)
    if rc == ETLSPOOL then
        -- The connection came from the pool set up for another name, verification or client
        -- certificate (OpenResty hands it over as it is): the engine closed it, and this
        -- handshake gets a new connection of its own (not counted as reused).
        local host = self.peer_host
        rc = C.ms_ffi_sock_connect(g, host, #host, self.peer_port, self.peer_pool or nil,
            self.peer_pool and #self.peer_pool or 0, self.peer_pool_size or 0,
            self.peer_backlog or 0, 1)
        rc = await(self, g, rc, READ, "socket:sslhandshake")
        if rc ~= DONE then
            return nil, errmsg(g, rc)
        end
        rc = C.ms_ffi_sock_sslhandshake(g, sess, server_name,
            server_name and #server_name or 0, on and 1 or 0, send_status_req and 1 or 0)
    end
    rc = await(self, g, rc, READ, "socket:sslhandshake")
    if rc ~= DONE then
        return nil, errmsg(g, rc)
    end
    if reused_session == false then
        return true
    end
    local out = C.ms_ffi_sock_session(g)
    if out == nil then
        return true
    end
    return ffi_gc(out, C.ms_ffi_tls_session_free)
end

--- A moonserve addition: what the TLS of the connection is, { protocol = "TLSv1.3", cipher =
-- "TLS_AES_256_GCM_SHA384", session_reused = bool }, or nil and "closed" (no TLS).
function Tcp:sslinfo()
    local g = check(self, Tcp, "sslinfo")
    if g == nil then
        return nil, "closed"
    end
    local r = C.ms_ffi_sock_sslinfo(g, info_out, info_out + 1)
    if r < 0 then
        return nil, "closed"
    end
    return { protocol = ffi_str(info_out[0]), cipher = ffi_str(info_out[1]),
        session_reused = r == 1 }
end

--- setclientcert(cert, key): the chain (PEM text, leaf first) and its key (PEM), presented by
-- the next handshakes when the server asks; (nil, nil) stops. OpenResty takes ngx.ssl's
-- parsed objects; moonserve takes the PEM text they are parsed from.
function Tcp:setclientcert(cert, key)
    local g = check(self, Tcp, "setclientcert")
    if cert == nil and key == nil then
        if g then
            C.ms_ffi_sock_setclientcert(g, nil, 0, nil, 0, msgbuf, 512)
        end
        return 1
    end
    if type(cert) ~= "string" then
        error("bad argument #1 to 'setclientcert' (PEM text expected)", 2)
    end
    if type(key) ~= "string" then
        error("bad argument #2 to 'setclientcert' (PEM text expected)", 2)
    end
    if g == nil then
        return nil, "closed"
    end
    msgbuf[0] = 0
    local rc = C.ms_ffi_sock_setclientcert(g, cert, #cert, key, #key, msgbuf, 512)
    if rc ~= 0 then
        return nil, ffi.string(msgbuf)
    end
    return 1
end

--- The worker trusts the CA certificates of a PEM file too, besides the system's store
-- (app:run{ ssl_trusted_certificate = FILE }). srv: the worker's ms_server_t *.
-- @local
function _M.trust(srv, file)
    msgbuf[0] = 0
    if C.ms_ffi_tls_trust(srv, file, msgbuf, 512) ~= 0 then
        return nil, ffi.string(msgbuf)
    end
    return true
end

--- How many times the connection came from the pool (0: a new one).
function Tcp:getreusedtimes()
    local g = check(self, Tcp, "getreusedtimes")
    if g == nil or g.view.connected == 0 then
        return nil, "closed"
    end
    return tonumber(g.view.reused)
end

--- A moonserve addition: the connection's file descriptor. It stays the same while a pooled
-- connection lives, so a driver can keep what it knows of a session by it (moonserve.pg does).
-- @return the descriptor, or nil and "closed"
function Tcp:getfd()
    local g = check(self, Tcp, "getfd")
    if g == nil then
        return nil, "closed"
    end
    local fd = C.ms_ffi_sock_fd(g)
    if fd < 0 then
        return nil, "closed"
    end
    return fd
end

local OPTIONS = { keepalive = true, ["tcp-nodelay"] = true, sndbuf = true, rcvbuf = true }

--- Sets "keepalive", "tcp-nodelay", "sndbuf" or "rcvbuf" on the connection.
-- @return true, or nil and "unsupported option NAME"
function Tcp:setoption(name, value)
    local g = check(self, Tcp, "setoption")
    if type(name) ~= "string" then
        error("bad argument #1 to 'setoption' (string expected)", 2)
    end
    if not OPTIONS[name] then
        return nil, "unsupported option " .. name
    end
    local v
    if type(value) == "boolean" then
        v = value and 1 or 0
    elseif type(value) == "number" then
        v = floor(value)
    else
        error("bad argument #2 to 'setoption' (boolean or number expected)", 2)
    end
    if g == nil then
        return nil, "closed"
    end
    local rc = C.ms_ffi_sock_setoption(g, name, v)
    if rc == 0 then
        return 1
    end
    return nil, errmsg(g, rc)
end

--- Closes the connection (it does not go to the pool).
-- @return 1, or nil and "closed"
function Tcp:close()
    local g = check(self, Tcp, "close")
    if g == nil or close_deferred(self, g) ~= DONE then
        return nil, "closed"
    end
    return 1
end

-- -- UDP ------------------------------------------------------------------------------------

--- A UDP socket, as OpenResty's ngx.socket.udp(): setpeername, then send and receive.
-- @treturn Udp
function _M.udp()
    return new_socket(Udp, C.ms_ffi_udp_init, "moonserve.socket.udp")
end

--- ngx.socket.udp() of the ngx layer: the same socket, taking timeouts as OpenResty does.
function _M.ngx_udp()
    local self = new_socket(Udp, C.ms_ffi_udp_init, "ngx.socket.udp")
    self.openresty = true
    return self
end

--- Sets the peer all datagrams go to and come from (a name is resolved without blocking).
-- @return 1, or nil and an error
function Udp:setpeername(host, port)
    local g = check(self, Udp, "setpeername")
    if type(host) ~= "string" then
        error("bad argument #1 to 'setpeername' (string expected)", 2)
    end
    port = tonumber(port)
    if not port or port < 0 or port > 65535 or port % 1 ~= 0 then
        error("bad argument #2 to 'setpeername' (a port number expected)", 2)
    end
    if g == nil then
        return nil, "closed"
    end
    coro_check("socket:setpeername", "wait", 2)
    local rc = C.ms_ffi_udp_setpeername(g, host, #host, port)
    rc = await(self, g, rc, READ, "socket:setpeername")
    if rc == DONE then
        return 1
    end
    return nil, errmsg(g, rc)
end

--- Sends one datagram.
-- @return 1, or nil and an error
function Udp:send(data)
    local g = check(self, Udp, "send")
    local _, n = gather(data)
    if g == nil then
        return nil, "closed"
    end
    local rc = C.ms_ffi_udp_send(g, bufs, n)
    if rc == DONE then
        return 1
    end
    return nil, errmsg(g, rc)
end

--- Receives one datagram of at most `size` bytes (default 8192).
-- @return the data, or nil and an error ("timeout")
function Udp:receive(size)
    local g = check(self, Udp, "receive")
    if size ~= nil and (type(size) ~= "number" or size < 1) then
        error("bad argument #1 to 'receive' (a positive size expected)", 2)
    end
    if g == nil then
        return nil, "closed"
    end
    coro_check("socket:receive", "wait", 2)
    local rc = C.ms_ffi_udp_receive(g, size and floor(size) or 0)
    rc = await(self, g, rc, READ, "socket:receive")
    if rc == DONE then
        local v = g.view
        local s = ffi_str(v.data, v.len)
        return s -- (no tail call: a trace cannot return from one to a built-in)
    end
    return nil, errmsg(g, rc)
end

--- Sets the receive timeout, in milliseconds.
-- @function Udp:settimeout
Udp.settimeout = settimeout_of(Udp)

--- Closes the socket.
function Udp:close()
    local g = check(self, Udp, "close")
    if g == nil then
        return nil, "closed"
    end
    local r = g.rslot
    g.rslot = -1
    local rc = C.ms_ffi_sock_close(g)
    if r >= 0 then
        C.ms_ffi_wake_after(g.srv, r, 0, EOF)
    end
    if rc == DONE then
        return 1
    end
    return nil, "closed"
end

return _M
