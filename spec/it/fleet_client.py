"""fleet_client.py: the clients of the fleet specs (spec/it/drain_spec.lua, fleet_spec.lua).

Run by Debian's python3:

  fleet_client.py load --h1 HOST:PORT:N --h2 HOST:PORT:N --ws HOST:PORT:N --stop-file F
                       [--seconds S]
      N keep-alive clients of each kind ask until F exists (or S seconds passed): HTTP/1.1
      (http.client, one connection each, reopened only when a reply said close), HTTP/2 with
      prior knowledge (the h2 library, one connection each, a new one after GOAWAY), and
      WebSocket echoes (the websockets library; a close 1001 is followed by a new connection
      and counts as no failure). Prints "kind_ok=N", "kind_failed=N" and one "failure=..."
      line for each of the first failures. A failure is a connection error, a reply that
      did not come whole, a 5xx, or a WebSocket that closed otherwise than with 1001.

      --users HOST:PORT:N --check-ports P1,P2,...   (the app's sessions: REDIS_URL set)
      Before the load starts, N users log in (POST /login?user=uK), each keeping its cookie;
      during the load a client asks GET /me with each cookie in turn ("me_ok", "me_failed"
      for connection errors and 5xx, "me_invalid" for a 401 or another user). Once the load
      has stopped, every cookie is tried on every port of --check-ports (each instance
      directly): "session_checked=N", "session_invalid=N".

      --chat HOST:PORT:N   (the app's chat over Redis)
      N WebSocket clients on /ws/chat, each reconnecting after a close 1001 (a new connection
      may land on another instance: the channel's sequence numbers are each instance's own,
      so there is nothing to resume from; a client only counts on what is posted while it is
      connected), and a poster that POSTs "chat K" to /chat every 50 ms on a keep-alive
      connection ("post_ok", "post_failed"). The posting stops with the load; the chat clients
      listen GRACE (0.5 s) longer. A message is due on a connection when it was posted (its
      POST sent) after the connection's "joined" came and its POST's reply came GRACE or more
      before the connection closed; "chat_due" counts these over every connection of every
      client, "chat_delivered" those that came on it, "chat_lost" the others, and
      "chat_duplicate" messages that came twice on one connection; "chat_cross_due" is the
      part of chat_due posted on another instance than the connection's. One "chat_client=..."
      line per client.

  fleet_client.py goaway PORT
      One HTTP/2 connection: GET /slow?s=1.5 on stream 1, prints "sent=1", then prints what
      comes: "goaway=LAST_STREAM_ID" for each GOAWAY, "status=..." and "ended=1" for the
      stream, "eof=1" when the server closes.

  fleet_client.py ws PORT
      One WebSocket on /ws/echo: prints "open=1" once an echo came back, then
      "close=CODE REASON" when the server closes it.

  fleet_client.py chat PORT SECONDS
      One WebSocket on /ws/chat: prints "joined=INSTANCE", then "msg=TEXT" for each message,
      for SECONDS, then "done=1".

  fleet_client.py agent-send PORT
      Three times: connects to an agent-check port, sends a line of its own (as HAProxy's
      agent-send does), and prints "end=REPLY fin" or "end=REPLY reset" by how the server
      ended the connection (luasocket reads a reset as a close too).
"""
import asyncio
import http.client
import os
import socket
import struct
import sys
import threading
import time

LOCK = threading.Lock()
COUNTS = {}
FAILURES = []


def say(name, value):
    print("%s=%s" % (name, value), flush=True)


def count(kind, ok, why=None):
    with LOCK:
        key = kind + ("_ok" if ok else "_failed")
        COUNTS[key] = COUNTS.get(key, 0) + 1
        if not ok and len(FAILURES) < 30:
            FAILURES.append("%.3f %s %s" % (time.time(), kind, why))


# -- HTTP/2 frames: the h2 library refuses frames after a GOAWAY (its connection is closed
# then), but a graceful GOAWAY lets the streams under way finish. So GOAWAY frames are taken
# out here, before the library sees the bytes, and everything else goes in.

class Frames:
    def __init__(self):
        self.buf = b""

    def feed(self, data):
        """Returns (bytes for the library, [last stream id of each GOAWAY])."""
        self.buf += data
        out, goaways = b"", []
        while len(self.buf) >= 9:
            length = int.from_bytes(self.buf[0:3], "big")
            if len(self.buf) < 9 + length:
                break
            frame, self.buf = self.buf[:9 + length], self.buf[9 + length:]
            if frame[3] == 7:  # GOAWAY (RFC 9113 6.8)
                goaways.append(struct.unpack(">I", frame[9:13])[0] & 0x7FFFFFFF)
            else:
                out += frame
        return out, goaways


def h2_connect(host, port):
    import h2.config
    import h2.connection
    sock = socket.create_connection((host, port), timeout=10)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                               header_encoding="utf-8"))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    return sock, conn, Frames()


def h2_get(sock, conn, frames, path, on_goaway=None):
    """One GET on a new stream. Returns (status, sid, goaway last id or None, eof)."""
    import h2.events
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "GET"), (":path", path), (":scheme", "http"),
                            (":authority", "fleet")], end_stream=True)
    sock.sendall(conn.data_to_send())
    status, last, ended = None, None, False
    while not ended:
        data = sock.recv(65536)
        if not data:
            return status, sid, last, True
        data, goaways = frames.feed(data)
        for g in goaways:
            last = g
            if on_goaway:
                on_goaway(g)
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == sid:
                status = int(dict(ev.headers)[":status"])
            elif isinstance(ev, h2.events.DataReceived):
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid:
                ended = True
            elif isinstance(ev, h2.events.StreamReset) and ev.stream_id == sid:
                raise IOError("stream reset, code %s" % ev.error_code)
        out = conn.data_to_send()
        if out:
            sock.sendall(out)
        # A final GOAWAY that does not cover the stream: it was never processed, and may be
        # sent again on a new connection (RFC 9113 6.8).
        if last is not None and last < sid and last != 0x7FFFFFFF:
            return None, sid, last, False
    return status, sid, last, False


# -- The load ---------------------------------------------------------------------------

def paths():
    n = 0
    while True:
        n += 1
        yield "/slow?s=0.3" if n % 10 == 0 else "/hello"


def h1_client(host, port, stop):
    conn = http.client.HTTPConnection(host, port, timeout=10)
    for path in paths():
        if stop.is_set():
            break
        try:
            conn.request("GET", path)
            res = conn.getresponse()
            res.read()
            count("h1", res.status < 500, "status %d" % res.status)
        except Exception as e:  # a connection error, or a reply not whole
            count("h1", False, "%s %r" % (path, e))
            conn.close()
            conn = http.client.HTTPConnection(host, port, timeout=10)
        time.sleep(0.01)
    conn.close()


def h2_client(host, port, stop):
    sock = conn = frames = None
    for path in paths():
        if stop.is_set():
            break
        try:
            if sock is None:
                sock, conn, frames = h2_connect(host, port)
            status, _, last, eof = h2_get(sock, conn, frames, path)
            if status is None and not eof:
                # not processed: asked again on the next connection, no failure
                sock.close()
                sock = None
                continue
            if status is None:
                raise IOError("connection closed under the request")
            count("h2", status < 500, "status %d" % status)
            if last is not None or eof:
                sock.close()
                sock = None
        except Exception as e:
            count("h2", False, "%s %r" % (path, e))
            if sock is not None:
                sock.close()
            sock = None
        time.sleep(0.01)
    if sock is not None:
        sock.close()


async def ws_client(host, port, stop):
    import websockets
    n = 0
    while not stop.is_set():
        try:
            async with websockets.connect("ws://%s:%d/ws/echo" % (host, port),
                                          open_timeout=10, close_timeout=2) as ws:
                while not stop.is_set():
                    n += 1
                    msg = "m%d" % n
                    await ws.send(msg)
                    got = await asyncio.wait_for(ws.recv(), 10)
                    count("ws", got == msg, "echo %r" % got)
                    await asyncio.sleep(0.02)
        except websockets.ConnectionClosed as e:
            if e.rcvd is not None and e.rcvd.code == 1001:
                count("ws_going_away", True)  # reconnects: no failure
            else:
                count("ws", False, "closed %r" % e)
        except Exception as e:
            count("ws", False, repr(e))
            await asyncio.sleep(0.05)


# -- Sessions ---------------------------------------------------------------------------

def cookie_of(res):
    for k, v in res.getheaders():
        if k.lower() == "set-cookie" and v.startswith("session="):
            return v.split(";", 1)[0]
    return None


def login(host, port, n):
    """Logs in users u1..uN; returns [(user, cookie)]. Raises if one fails."""
    users = []
    conn = http.client.HTTPConnection(host, port, timeout=10)
    for k in range(1, n + 1):
        user = "u%d" % k
        conn.request("POST", "/login?user=" + user, body=b"")
        res = conn.getresponse()
        res.read()
        cookie = cookie_of(res)
        if res.status != 200 or not cookie:
            raise IOError("login %s: status %d, cookie %r" % (user, res.status, cookie))
        users.append((user, cookie))
    conn.close()
    return users


def me(conn, user, cookie):
    """GET /me with the cookie: "ok", "invalid" (401 or another user) or "failed" (5xx)."""
    conn.request("GET", "/me", headers={"Cookie": cookie})
    res = conn.getresponse()
    body = res.read().decode()
    if res.status >= 500:
        return "failed", "status %d" % res.status
    if res.status == 200 and body == "user " + user:
        return "ok", None
    return "invalid", "%s: status %d %r" % (user, res.status, body)


def me_client(host, port, users, stop):
    conn = http.client.HTTPConnection(host, port, timeout=10)
    i = 0
    while not stop.is_set():
        user, cookie = users[i % len(users)]
        i += 1
        try:
            what, why = me(conn, user, cookie)
            if what == "invalid":
                with LOCK:
                    COUNTS["me_invalid"] = COUNTS.get("me_invalid", 0) + 1
                    if len(FAILURES) < 30:
                        FAILURES.append("%.3f me invalid %s" % (time.time(), why))
            else:
                count("me", what == "ok", why)
        except Exception as e:
            count("me", False, repr(e))
            conn.close()
            conn = http.client.HTTPConnection(host, port, timeout=10)
        time.sleep(0.02)
    conn.close()


def check_sessions(host, ports, users):
    checked = invalid = 0
    for port in ports:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        for user, cookie in users:
            checked += 1
            try:
                what, why = me(conn, user, cookie)
            except Exception as e:
                what, why = "failed", repr(e)
                conn.close()
                conn = http.client.HTTPConnection(host, port, timeout=10)
            if what != "ok":
                invalid += 1
                if len(FAILURES) < 30:
                    FAILURES.append("session on port %d %s" % (port, why))
        conn.close()
    say("session_checked", checked)
    say("session_invalid", invalid)


# -- The chat -----------------------------------------------------------------------------

GRACE = 0.5
POSTS = []  # (text, sent at, replied at, instance) of each post that got a 200


def poster(host, port, stop):
    conn = http.client.HTTPConnection(host, port, timeout=10)
    k = 0
    while not stop.is_set():
        k += 1
        text = "chat %d" % k
        sent = time.time()
        try:
            conn.request("POST", "/chat", body=text.encode(),
                         headers={"Content-Type": "text/plain"})
            res = conn.getresponse()
            body = res.read().decode()
            count("post", res.status == 200, "status %d %r" % (res.status, body))
            if res.status == 200:
                POSTS.append((text, sent, time.time(), body.split(" ", 1)[-1]))
        except Exception as e:
            count("post", False, repr(e))
            conn.close()
            conn = http.client.HTTPConnection(host, port, timeout=10)
        time.sleep(0.05)
    conn.close()


async def chat_client(host, port, stop, conns):
    """Appends one record per connection to `conns`: instance, joined, closed, messages."""
    import websockets
    while not stop.is_set():
        c = None
        try:
            async with websockets.connect("ws://%s:%d/ws/chat" % (host, port),
                                          open_timeout=10, close_timeout=2) as ws:
                hello = await asyncio.wait_for(ws.recv(), 10)
                if not hello.startswith("joined "):
                    raise IOError("no join: %r" % hello)
                c = {"instance": hello[7:], "joined": time.time(), "closed": None, "got": []}
                conns.append(c)
                while not stop.is_set():
                    try:
                        msg = await asyncio.wait_for(ws.recv(), 0.1)
                    except asyncio.TimeoutError:
                        continue
                    c["got"].append(msg)
                c["closed"] = time.time()
        except websockets.ConnectionClosed as e:
            if c is not None:
                c["closed"] = time.time()
            if e.rcvd is not None and e.rcvd.code == 1001:
                count("chat_going_away", True)  # reconnects: no failure
            else:
                count("chat_ws", False, "closed %r" % e)
        except Exception as e:
            if c is not None and c["closed"] is None:
                c["closed"] = time.time()
            count("chat_ws", False, repr(e))
            await asyncio.sleep(0.05)


def chat_report(clients):
    """Counts what was due on each connection against what came (see the header)."""
    totals = {"due": 0, "delivered": 0, "lost": 0, "duplicate": 0, "cross_due": 0}
    instances = set()
    for n, conns in enumerate(clients):
        per = {"due": 0, "delivered": 0, "lost": 0, "duplicate": 0, "cross_due": 0}
        for c in conns:
            instances.add(c["instance"])
            got = set(c["got"])
            per["duplicate"] += len(c["got"]) - len(got)
            for text, sent, replied, inst in POSTS:
                if sent >= c["joined"] and replied + GRACE <= c["closed"]:
                    per["due"] += 1
                    if inst != c["instance"]:
                        per["cross_due"] += 1
                    if text in got:
                        per["delivered"] += 1
                    else:
                        per["lost"] += 1
                        if len(FAILURES) < 30:
                            FAILURES.append("chat client %d on %s lost %r (posted on %s, "
                                            "%.3f-%.3f; connected %.3f-%.3f)"
                                            % (n + 1, c["instance"], text, inst, sent,
                                               replied, c["joined"], c["closed"]))
        say("chat_client", "%d connections=%d due=%d delivered=%d lost=%d duplicate=%d "
            "instances=%s" % (n + 1, len(conns), per["due"], per["delivered"], per["lost"],
                              per["duplicate"], ",".join(c["instance"] for c in conns)))
        for k in totals:
            totals[k] += per[k]
    say("chat_posted", len(POSTS))
    for k in ("due", "cross_due", "delivered", "lost", "duplicate"):
        say("chat_" + k, totals[k])
    say("chat_instances", ",".join(sorted(instances)))


def load(args):
    spec = {"--h1": [], "--h2": [], "--ws": [], "--users": [], "--chat": []}
    stop_file, seconds, check_ports = None, 600, []
    i = 0
    while i < len(args):
        if args[i] in spec:
            host, port, n = args[i + 1].rsplit(":", 2)
            spec[args[i]].append((host, int(port), int(n)))
        elif args[i] == "--check-ports":
            check_ports = [int(p) for p in args[i + 1].split(",")]
        elif args[i] == "--stop-file":
            stop_file = args[i + 1]
        elif args[i] == "--seconds":
            seconds = float(args[i + 1])
        i += 2
    stop = threading.Event()
    users = []
    for host, port, n in spec["--users"]:
        users = login(host, port, n)
    threads = []
    targets = [(fn, h, p, n) for kind, fn in (("--h1", h1_client), ("--h2", h2_client))
               for h, p, n in spec[kind]]
    targets += [(poster, h, p, 1) for h, p, _ in spec["--chat"]]
    if users:
        targets += [(lambda h, p, s: me_client(h, p, users, s), h, p, 1)
                    for h, p, _ in spec["--users"]]
    for fn, host, port, n in targets:
        for _ in range(n):
            t = threading.Thread(target=fn, args=(host, port, stop), daemon=True)
            t.start()
            threads.append(t)
    chats = [[] for h, p, n in spec["--chat"] for _ in range(n)]

    async def main():
        chat_stop = asyncio.Event()
        tasks = [asyncio.ensure_future(ws_client(h, p, stop))
                 for h, p, n in spec["--ws"] for _ in range(n)]
        chat_tasks = [asyncio.ensure_future(chat_client(h, p, chat_stop, chats[k]))
                      for k, (h, p) in enumerate((h, p) for h, p, n in spec["--chat"]
                                                 for _ in range(n))]
        end = time.time() + seconds
        while time.time() < end and not (stop_file and os.path.exists(stop_file)):
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
        # The last posts' messages are still on their way: the chat clients listen on.
        await asyncio.sleep(GRACE + 0.2)
        chat_stop.set()
        await asyncio.wait_for(asyncio.gather(*chat_tasks, return_exceptions=True), 20)

    say("started", 1)
    asyncio.run(main())
    for t in threads:
        t.join(20)
    if chats:
        chat_report(chats)
    if users:
        check_sessions("127.0.0.1", check_ports, users)
    for k in sorted(COUNTS):
        say(k, COUNTS[k])
    for f in FAILURES:
        say("failure", f)
    say("done", 1)


# -- The timeline's single clients ------------------------------------------------------

def goaway(port):
    sock, conn, frames = h2_connect("127.0.0.1", port)
    say("sent", 1)
    status, _, _, eof = h2_get(sock, conn, frames, "/slow?s=1.5",
                               on_goaway=lambda g: say("goaway", g))
    say("status", status)
    say("ended", 1)
    # The server closes once the stream is done.
    sock.settimeout(5)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            _, goaways = frames.feed(data)
            for g in goaways:
                say("goaway", g)
        say("eof", 1)
    except socket.timeout:
        say("eof", 0)


async def ws_one(port):
    import websockets
    async with websockets.connect("ws://127.0.0.1:%d/ws/echo" % port) as ws:
        await ws.send("hi")
        say("open", int(await ws.recv() == "hi"))
        try:
            await asyncio.wait_for(ws.recv(), 10)
        except websockets.ConnectionClosed as e:
            say("close", "%s %s" % (e.rcvd.code, e.rcvd.reason) if e.rcvd else "none")


async def chat_one(port, seconds):
    import websockets
    async with websockets.connect("ws://127.0.0.1:%d/ws/chat" % port) as ws:
        say("joined", (await ws.recv())[7:])
        end = time.time() + seconds
        while time.time() < end:
            try:
                say("msg", await asyncio.wait_for(ws.recv(), max(0.01, end - time.time())))
            except asyncio.TimeoutError:
                break
    say("done", 1)


def agent_send(port):
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"hello agent\n")
        time.sleep(0.1)  # (the server has answered and closed its side by now)
        got = b""
        try:
            while True:
                d = s.recv(100)
                if not d:
                    break
                got += d
            say("end", "%r fin" % got)
        except ConnectionResetError:
            say("end", "%r reset" % got)
        s.close()


if __name__ == "__main__":
    if sys.argv[1] == "load":
        load(sys.argv[2:])
    elif sys.argv[1] == "goaway":
        goaway(int(sys.argv[2]))
    elif sys.argv[1] == "ws":
        asyncio.run(ws_one(int(sys.argv[2])))
    elif sys.argv[1] == "chat":
        asyncio.run(chat_one(int(sys.argv[2]), float(sys.argv[3])))
    elif sys.argv[1] == "agent-send":
        agent_send(int(sys.argv[2]))
