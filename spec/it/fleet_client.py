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

  fleet_client.py goaway PORT
      One HTTP/2 connection: GET /slow?s=1.5 on stream 1, prints "sent=1", then prints what
      comes: "goaway=LAST_STREAM_ID" for each GOAWAY, "status=..." and "ended=1" for the
      stream, "eof=1" when the server closes.

  fleet_client.py ws PORT
      One WebSocket on /ws/echo: prints "open=1" once an echo came back, then
      "close=CODE REASON" when the server closes it.
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


def load(args):
    spec = {"--h1": [], "--h2": [], "--ws": []}
    stop_file, seconds = None, 600
    i = 0
    while i < len(args):
        if args[i] in spec:
            host, port, n = args[i + 1].rsplit(":", 2)
            spec[args[i]].append((host, int(port), int(n)))
        elif args[i] == "--stop-file":
            stop_file = args[i + 1]
        elif args[i] == "--seconds":
            seconds = float(args[i + 1])
        i += 2
    stop = threading.Event()
    threads = []
    for kind, fn in (("--h1", h1_client), ("--h2", h2_client)):
        for host, port, n in spec[kind]:
            for _ in range(n):
                t = threading.Thread(target=fn, args=(host, port, stop), daemon=True)
                t.start()
                threads.append(t)

    async def main():
        tasks = [asyncio.ensure_future(ws_client(h, p, stop))
                 for h, p, n in spec["--ws"] for _ in range(n)]
        end = time.time() + seconds
        while time.time() < end and not (stop_file and os.path.exists(stop_file)):
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)

    say("started", 1)
    asyncio.run(main())
    for t in threads:
        t.join(20)
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


if __name__ == "__main__":
    if sys.argv[1] == "load":
        load(sys.argv[2:])
    elif sys.argv[1] == "goaway":
        goaway(int(sys.argv[2]))
    elif sys.argv[1] == "ws":
        asyncio.run(ws_one(int(sys.argv[2])))
