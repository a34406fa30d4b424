"""ws_client.py: the WebSocket conformance client of spec/it/websocket_spec.lua.

Run by Debian's python3 as `ws_client.py PORT CASE [PATH]`: each case talks to the server with the
websockets library (RFC 6455 as a browser speaks it) or, over HTTP/2, with the h2 library
and frames of our own (RFC 8441's extended CONNECT), and prints one line per fact the spec
checks, as "name=value".
"""
import asyncio
import os
import socket
import ssl
import struct
import sys

PORT = int(sys.argv[1])
CASE = sys.argv[2]
PATH = sys.argv[3] if len(sys.argv) > 3 else "kept"  # the endpoint of the "kept" cases
URL = "ws://127.0.0.1:%d" % PORT


def say(name, value):
    print("%s=%s" % (name, value), flush=True)


# -- Over HTTP/1.1, with the websockets library -------------------------------------------

async def echo():
    import websockets
    async with websockets.connect(URL + "/ws/echo", subprotocols=["chat.v1", "chat.v2"]) as ws:
        say("protocol", ws.subprotocol)
        await ws.send("hello \u00e9\U0001F600")
        say("text", await ws.recv() == "hello \u00e9\U0001F600")
        await ws.send(b"\x00\x01\xff")
        say("binary", await ws.recv() == b"\x00\x01\xff")
        big = os.urandom(60000)
        await ws.send(big)
        say("big", await ws.recv() == big)
        # a fragmented message, as the library sends an iterable
        await ws.send(["frag", "ment", "ed"])
        say("fragmented", await ws.recv())
        pong = await ws.ping(b"are you there")
        await asyncio.wait_for(pong, 5)
        say("pong", "yes")
    say("close_code", ws.close_code)


async def no_protocol():
    import websockets
    async with websockets.connect(URL + "/ws/echo", subprotocols=["other"]) as ws:
        say("protocol", ws.subprotocol)


async def client_close():
    import websockets
    ws = await websockets.connect(URL + "/ws/echo")
    await ws.close(4000, "bye now")
    say("close_code", ws.close_code)
    say("close_reason", ws.close_reason)


async def server_close():
    import websockets
    async with websockets.connect(URL + "/ws/closer") as ws:
        await ws.send("3001 going away now")
        try:
            await ws.recv()
        except websockets.ConnectionClosed as e:
            say("close_code", e.rcvd.code)
            say("close_reason", e.rcvd.reason)


async def too_big():
    import websockets
    async with websockets.connect(URL + "/ws/echo", max_size=None) as ws:
        await ws.send(b"z" * 70000)
        try:
            await ws.recv()
        except websockets.ConnectionClosed as e:
            say("close_code", e.rcvd.code)


async def timeout():
    import websockets
    async with websockets.connect(URL + "/ws/timeout") as ws:
        say("said", await ws.recv())


async def room():
    import websockets
    a = await websockets.connect(URL + "/ws/room")
    b = await websockets.connect(URL + "/ws/room")
    say("a_joined", await a.recv())
    say("b_joined", await b.recv())
    await a.send("to everyone")
    say("a_got", await a.recv())
    say("b_got", await b.recv())
    big = "B" * 5000  # over the size copied into the queue: referenced by both writes
    await b.send(big)
    say("a_big", await a.recv() == big)
    say("b_big", await b.recv() == big)
    await a.close()
    await b.close()


async def wait_stop():
    import websockets
    async with websockets.connect(URL + "/ws/wait") as ws:
        say("said", await ws.recv())
        try:
            await asyncio.wait_for(ws.recv(), 10)
        except websockets.ConnectionClosed as e:
            say("close_code", e.rcvd.code)


async def private():
    import websockets
    try:
        async with websockets.connect(URL + "/ws/private"):
            say("status", 101)
    except websockets.InvalidStatusCode as e:
        say("status", e.status_code)
    async with websockets.connect(URL + "/ws/private?token=let-me-in") as ws:
        await ws.send("in")
        say("echo", await ws.recv())


async def deflate():
    import websockets
    async with websockets.connect(URL + "/ws/ext") as ws:
        say("extensions", ws.response_headers.get("Sec-WebSocket-Extensions"))
        say("agreed", await ws.recv())
        for i, m in enumerate(["short", "x" * 50000, "\u00e9" * 3000]):
            await ws.send(m)
            say("echo%d" % i, await ws.recv() == m)
        big = bytes(range(256)) * 200
        await ws.send(big)
        say("binary", await ws.recv() == big)


async def big_deflated():
    """A message of the default cap (1 MiB) of bytes that do not shrink, sent compressed: its
    frame is a little larger than the message, and must pass."""
    import websockets
    async with websockets.connect(URL + "/ws/size") as ws:
        say("extensions", ws.response_headers.get("Sec-WebSocket-Extensions"))
        big = os.urandom(1 << 20)
        await ws.send(big)
        say("echo", await ws.recv())
        say("want", "%d %d" % (len(big), sum(big[i] for i in range(0, len(big), 4096)) % 65536))
        await ws.send(big + b"!")  # one byte more: over the cap
        try:
            await ws.recv()
        except websockets.ConnectionClosed as e:
            say("close_code", e.rcvd.code if e.rcvd else None)


def raw_connect(path, extra=""):
    """A raw connection upgraded on `path` (`extra`: more header lines, each ending in CRLF):
    the socket, the response's head and the bytes read past it."""
    import base64
    sock = socket.create_connection(("127.0.0.1", PORT), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                  "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                  "Sec-WebSocket-Version: 13\r\n%s\r\n" % (path, key, extra)).encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(4096)
    head, buf = buf.split(b"\r\n\r\n", 1)
    return sock, head, buf


def flood():
    """Raw frames: a text message opened, then empty continuations without end (PATH:
    "fragments"), or pings without end ("pings"). Sends up to COUNT frames at once and reads
    what the server answers until its close."""
    sock, head, buf = raw_connect("/ws/echo")
    say("status", head.split(b" ")[1].decode())
    count = int(os.environ.get("COUNT", "5000"))
    if PATH == "pings":
        frames = mask_frame(0x89, b"p") * count
    else:
        frames = mask_frame(0x01, b"a") + mask_frame(0x00, b"") * count
    try:
        sock.sendall(frames)
    except OSError as e:
        say("send_error", e.errno)
    close = None
    pongs = 0
    while close is None:
        try:
            data = sock.recv(65536)
        except OSError:
            break
        if not data:
            break
        buf += data
        fs, buf = parse_frames(buf)
        for op, body in fs:
            if op == 0xA:
                pongs += 1
            elif op == 8:
                close = struct.unpack(">H", body[:2])[0] if len(body) >= 2 else 1005
                say("reason", body[2:].decode())
    say("pongs", pongs)
    say("close", close)
    sock.close()


async def kept():
    """The websockets library keeps its context (it offers client_max_window_bits and neither
    no_context_takeover): many similar messages each way, some of them long."""
    import websockets
    path = "/ws/" + PATH
    async with websockets.connect(URL + path) as ws:
        say("extensions", ws.response_headers.get("Sec-WebSocket-Extensions"))
        say("agreed", await ws.recv())
        ok = True
        for i in range(200):
            m = '{"seq":%d,"symbol":"MOON","price":%d.25,"note":"%s"}' % (i, i * 7, "ab" * (i % 50))
            if i % 40 == 39:
                m = m * 400  # past a 1 KiB window: references reach back as far as it allows
            await ws.send(m)
            ok = ok and await ws.recv() == m
        say("echoes", ok)
        big = os.urandom(3000) + bytes(5000)
        await ws.send(big)
        say("binary", await ws.recv() == big)


def kept_raw():
    """Raw frames with a zlib stream of our own, so the sizes on the wire are seen: the same
    message twice each way; the second goes in far fewer bytes when the context is kept."""
    import zlib
    offer = "permessage-deflate; client_max_window_bits"  # as browsers offer it
    sock, head, buf = raw_connect("/ws/" + PATH, "Sec-WebSocket-Extensions: %s\r\n" % offer)
    ext = [l.split(b":", 1)[1].strip().decode() for l in head.split(b"\r\n")
           if l.lower().startswith(b"sec-websocket-extensions:")]
    say("extensions", ext[0] if ext else "")
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    d = zlib.decompressobj(-15)
    state = {"buf": buf}

    def next_message():
        """The next data frame from the server: (compressed, bytes on the wire, message)."""
        while True:
            b = state["buf"]
            if len(b) >= 2:
                n, h = b[1] & 0x7F, 2
                if n == 126 and len(b) >= 4:
                    n, h = struct.unpack(">H", b[2:4])[0], 4
                if n < 126 and len(b) >= h + n:
                    b0, body, state["buf"] = b[0], b[h:h + n], b[h + n:]
                    if b0 & 0x40:  # every compressed message goes through the one stream
                        return True, n, d.decompress(body + b"\x00\x00\xff\xff")
                    return False, n, body
            state["buf"] += sock.recv(4096)

    say("agreed", next_message()[2].decode())
    text = ('{"type":"tick","symbol":"MOON","price":12.5,"volume":1000,"pad":"%s"}'
            % ("xy" * 20)).encode()
    ok = True
    for i in range(3):
        z = c.compress(text) + c.flush(zlib.Z_SYNC_FLUSH)
        sock.sendall(mask_frame(0xC1, z[:-4]))
        say("sent%d" % i, len(z) - 4)
        compressed, n, m = next_message()
        say("rsv1_%d" % i, compressed)
        say("got%d" % i, n)
        ok = ok and m == text
    say("echoes", ok)
    sock.close()


def deflate_bomb():
    """Raw frames: 16 MiB of zeros in about 16 KiB, to an endpoint capped at 64 KiB."""
    import zlib
    sock, head, rest = raw_connect("/ws/echo", "Sec-WebSocket-Extensions: permessage-deflate\r\n")
    say("extension", b"permessage-deflate" in head)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    z = c.compress(b"\0" * (16 << 20)) + c.flush(zlib.Z_SYNC_FLUSH)
    say("compressed_bytes", len(z) - 4)
    sock.sendall(mask_frame(0xC2, z[:-4]))
    buf = rest
    while True:
        fs, _ = parse_frames(buf)
        if fs:
            break
        data = sock.recv(65536)
        if not data:
            break
        buf += data
    say("close", struct.unpack(">H", fs[0][1][:2])[0] if fs and fs[0][0] == 8 else None)


# -- Over HTTP/2, extended CONNECT with the h2 library ------------------------------------

def mask_frame(b0, payload):
    key = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = bytes([b0, 0x80 | n])
    elif n < 65536:
        head = bytes([b0, 0x80 | 126]) + struct.pack(">H", n)
    else:
        head = bytes([b0, 0x80 | 127]) + struct.pack(">Q", n)
    return head + key + bytes(c ^ key[i % 4] for i, c in enumerate(payload))


def parse_frames(buf):
    """Server frames (unmasked) in buf: a list of (opcode, payload) and the rest."""
    out = []
    while len(buf) >= 2:
        n = buf[1] & 0x7F
        h = 2
        if n == 126:
            if len(buf) < 4:
                break
            n, h = struct.unpack(">H", buf[2:4])[0], 4
        elif n == 127:
            if len(buf) < 10:
                break
            n, h = struct.unpack(">Q", buf[2:10])[0], 10
        if len(buf) < h + n:
            break
        out.append((buf[0] & 0x0F, buf[h:h + n]))
        buf = buf[h + n:]
    return out, buf


class H2:
    """An HTTP/2 connection with the h2 library, over TLS with h2 by ALPN when WS_TLS_CA
    names the CA to trust (as a browser speaks it), else h2c with prior knowledge; WebSockets
    are opened on it with extended CONNECT (RFC 8441)."""

    def __init__(self):
        import h2.config
        import h2.connection
        sock = socket.create_connection(("127.0.0.1", PORT), timeout=10)
        ca = os.environ.get("WS_TLS_CA")
        self.scheme, self.authority = "http", "127.0.0.1:%d" % PORT
        if ca:
            ctx = ssl.create_default_context(cafile=ca)
            ctx.set_alpn_protocols(["h2"])
            sock = ctx.wrap_socket(sock, server_hostname="localhost")
            say("alpn", sock.selected_alpn_protocol())
            self.scheme, self.authority = "https", "localhost:%d" % PORT
        self.sock = sock
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        sock.sendall(self.conn.data_to_send())
        self.enabled = None
        self.streams = {}
        self.pump(lambda: self.enabled is not None)
        say("enable_connect_protocol", self.enabled)

    def pump(self, until):
        import h2.events
        import h2.settings
        conn, streams = self.conn, self.streams
        while not until():
            data = self.sock.recv(65536)
            if not data:
                return False
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.RemoteSettingsChanged):
                    s = ev.changed_settings.get(h2.settings.SettingCodes.ENABLE_CONNECT_PROTOCOL)
                    if s is not None:
                        self.enabled = s.new_value
                elif isinstance(ev, h2.events.ResponseReceived):
                    streams.setdefault(ev.stream_id, {})["headers"] = dict(ev.headers)
                elif isinstance(ev, h2.events.DataReceived):
                    st = streams.setdefault(ev.stream_id, {})
                    st["data"] = st.get("data", b"") + ev.data
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                    streams.setdefault(ev.stream_id, {})["ended"] = True
            self.sock.sendall(conn.data_to_send())
        return True

    def open_ws(self, path, extra=()):
        conn = self.conn
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "CONNECT"), (":protocol", "websocket"),
                                (":scheme", self.scheme), (":path", path),
                                (":authority", self.authority),
                                ("sec-websocket-version", "13")] + list(extra))
        self.sock.sendall(conn.data_to_send())
        self.pump(lambda: "headers" in self.streams.get(sid, {}))
        return sid

    def status(self, sid):
        return self.streams[sid]["headers"].get(b":status", b"").decode()

    def send(self, sid, frame):
        self.conn.send_data(sid, frame)
        self.sock.sendall(self.conn.data_to_send())

    def frames(self, sid, count):
        while True:
            st = self.streams.setdefault(sid, {})
            fs, rest = parse_frames(st.get("data", b""))
            if len(fs) >= count or st.get("ended"):
                st["data"] = rest
                return fs
            had = len(st.get("data", b""))
            if not self.pump(lambda: len(st.get("data", b"")) > had or st.get("ended")):
                return fs


def h2_csrf():
    """WebSockets over HTTP/2 behind sessions and moonserve.csrf with form tokens (the
    documented stack, spec/fixtures/ws_csrf.lua), as a browser's page opens them: its own
    Origin, a cookie-less first visit; on the app (/live) and in a mounted app (/chat/live)."""
    c = H2()
    own = [("origin", "%s://%s" % (c.scheme, c.authority))]
    for name, path in (("app", "/live"), ("mounted", "/chat/live")):
        sid = c.open_ws(path, own)
        say(name + "_status", c.status(sid))
        if c.status(sid) == "200":
            c.send(sid, mask_frame(0x81, ("hello " + name).encode()))
            fs = c.frames(sid, 1)
            say(name + "_echo", fs[0][1].decode() if fs else None)
    # the handshake still checks the Origin: a cross-site page's socket is refused
    bad = c.open_ws("/live", [("origin", "https://evil.example")])
    say("cross_status", c.status(bad))
    c.sock.close()


def h2_case():
    c = H2()
    scheme, authority, streams = c.scheme, c.authority, c.streams
    open_ws, send, frames, sock = c.open_ws, c.send, c.frames, c.sock

    sid = open_ws("/ws/echo", [("sec-websocket-protocol", "chat.v1")])
    h = streams[sid]["headers"]
    say("status", h.get(b":status", b"").decode())
    say("protocol", h.get(b"sec-websocket-protocol", b"").decode())
    send(sid, mask_frame(0x81, "über h2".encode()))
    (op, payload), = frames(sid, 1)
    say("echo", payload.decode())
    # a second WebSocket on the same connection, and a bad frame on it: 1002 on that stream
    other = open_ws("/ws/echo")
    send(other, mask_frame(0xC1, b"rsv"))
    fs = frames(other, 1)
    say("other_close", struct.unpack(">H", fs[0][1][:2])[0] if fs and fs[0][0] == 8 else None)
    # the first still works
    send(sid, mask_frame(0x89, b"hi"))
    fs = frames(sid, 1)
    say("pong", fs[0][1].decode() if fs and fs[0][0] == 10 else None)
    send(sid, mask_frame(0x88, struct.pack(">H", 1000)))
    fs = frames(sid, 1)
    say("close", struct.unpack(">H", fs[0][1][:2])[0] if fs and fs[0][0] == 8 else None)
    # callbacks: the same over a stream
    cb = open_ws("/ws/cb")
    send(cb, mask_frame(0x81, b"cb over h2"))
    fs = frames(cb, 2)
    say("cb", " ".join(f[1].decode() for f in fs))
    # the page's own origin is taken; a cross-site page's CONNECT is refused as the HTTP/1.1
    # upgrade is
    own = open_ws("/ws/echo", [("origin", "%s://%s" % (scheme, authority))])
    say("own_origin_status", streams[own]["headers"].get(b":status", b"").decode())
    bad = open_ws("/ws/echo", [("origin", "https://evil.example")])
    say("cross_status", streams[bad]["headers"].get(b":status", b"").decode())
    sock.close()


async def resty_echo():
    """resty.websocket.server's echo on the ngx layer (spec/fixtures/ngx_socket_cases.lua),
    and the same handler on nginx: each frame comes back as it went."""
    import websockets
    async with websockets.connect(URL + "/resty_echo", compression=None) as ws:
        await ws.send("hello \u00e9")
        say("text", await ws.recv())
        await ws.send(b"\x00\x01\xff")
        say("binary", (await ws.recv()).hex())
        big = bytes(range(256)) * 250
        await ws.send(big)
        say("big", await ws.recv() == big)
        await ws.send(["frag", "ment", "ed"])
        say("fragmented", await ws.recv())
        pong = await ws.ping(b"are you there")
        await asyncio.wait_for(pong, 5)
        say("pong", "yes")
        await ws.close(4000, "done")
    say("close_code", ws.close_code)
    say("close_reason", ws.close_reason)


def raw_close():
    """Raw frames: a close with a code and a reason, then one with no code; what the server's
    close frame says to each."""
    for name, payload in (("coded", struct.pack(">H", 4001) + "raw bye \u00e9".encode()),
                          ("empty", b"")):
        sock, head, buf = raw_connect("/ws/closing")
        say(name + "_status", head.split(b" ")[1].decode())
        sock.sendall(mask_frame(0x88, payload))
        while True:
            fs, _ = parse_frames(buf)
            if fs:
                break
            data = sock.recv(65536)
            if not data:
                break
            buf += data
        op, body = fs[0] if fs else (None, b"")
        say(name + "_op", op)
        say(name + "_code", struct.unpack(">H", body[:2])[0] if len(body) >= 2 else "none")
        say(name + "_eof", sock.recv(16) == b"")  # and the server ends the connection
        sock.close()


CASES = {
    "resty_echo": resty_echo,
    "echo": echo, "no_protocol": no_protocol, "client_close": client_close,
    "server_close": server_close, "too_big": too_big, "timeout": timeout, "room": room,
    "wait_stop": wait_stop, "private": private, "deflate": deflate, "kept": kept,
    "big_deflated": big_deflated,
}

if CASE == "h2":
    h2_case()
elif CASE == "h2_csrf":
    h2_csrf()
elif CASE == "deflate_bomb":
    deflate_bomb()
elif CASE == "flood":
    flood()
elif CASE == "kept_raw":
    kept_raw()
elif CASE == "raw_close":
    raw_close()
else:
    asyncio.run(CASES[CASE]())
