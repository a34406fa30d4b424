#!/usr/bin/python3
"""resets_client.py: the client of bench/resets. Opens COUNT connections to a moonserve
server and resets each one (a TCP RST: SO_LINGER of 0, then close) at a random point of one
of its protocols, in turn:

  h1_head     in the middle of a request's head
  h1_body     in the middle of a request's body, which the handler is reading
  h1_reply    while a 1 MiB reply is under way
  h1_wait     while the handler waits on a socket (to this client's silent listener)
  tls_hello   in the middle of the TLS handshake (a piece of the ClientHello, or after it)
  tls_reply   over TLS, while a 1 MiB reply is under way
  h2_frame    in the middle of an HTTP/2 frame (prior knowledge: a GET, a POST's body)
  ws_message  in the middle of a WebSocket message (a frame cut, or a fragmented message)

Usage: resets_client.py HOST PLAIN_PORT TLS_PORT COUNT [SEED]
Prints one JSON object: connections reset by kind, and the seconds it took."""
import json
import os
import random
import socket
import ssl
import struct
import sys
import threading
import time

HOST, PLAIN, TLS, COUNT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
SEED = int(sys.argv[5]) if len(sys.argv) > 5 else 1
THREADS = 4

CTX = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
CTX.check_hostname = False
CTX.verify_mode = ssl.CERT_NONE


def connect(port):
    s = socket.create_connection((HOST, port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def reset(s):
    """Closes `s` with a reset, whatever state it is in."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    s.close()


def read_some(s, n, until=None):
    """Reads up to `n` bytes, or up to `until`; less if the peer closes, or sends nothing
    for 50 ms (1 s for the first byte)."""
    data = b""
    s.settimeout(1)
    try:
        while len(data) < n and not (until and until in data):
            b = s.recv(min(65536, n - len(data)))
            if not b:
                break
            data += b
            s.settimeout(0.05)
    except (OSError, ssl.SSLError):
        pass
    return data


def cut(data, rnd):
    """A proper prefix of `data` (at least one byte, never all of it)."""
    return data[:rnd.randrange(1, len(data))]


# -- a silent listener: /wait's handler connects here and waits for a line that never comes

silent = socket.socket()
silent.bind((HOST, 0))
silent.listen(1024)
SILENT_PORT = silent.getsockname()[1]


def hold():
    held = []
    while True:
        try:
            c, _ = silent.accept()
        except OSError:
            return
        held.append((time.time(), c))
        while held and held[0][0] < time.time() - 3:
            held.pop(0)[1].close()


threading.Thread(target=hold, daemon=True).start()

# -- the kinds

HEAD = b"GET / HTTP/1.1\r\nHost: r\r\nUser-Agent: resets\r\nAccept: */*\r\n\r\n"


def h1_head(rnd):
    s = connect(PLAIN)
    s.sendall(cut(HEAD, rnd))
    reset(s)


def h1_body(rnd):
    s = connect(PLAIN)
    s.sendall(b"POST /upload HTTP/1.1\r\nHost: r\r\nContent-Length: 65536\r\n\r\n")
    s.sendall(b"x" * rnd.randrange(0, 65536))
    reset(s)


def h1_reply(rnd):
    s = connect(PLAIN)
    s.sendall(b"GET /big HTTP/1.1\r\nHost: r\r\n\r\n")
    read_some(s, rnd.randrange(0, 200000))
    reset(s)


def h1_wait(rnd):
    s = connect(PLAIN)
    s.sendall(b"GET /wait?port=%d HTTP/1.1\r\nHost: r\r\n\r\n" % SILENT_PORT)
    time.sleep(rnd.random() * 0.02)
    reset(s)


def tls_hello(rnd):
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = CTX.wrap_bio(incoming, outgoing)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    hello = outgoing.read()
    s = connect(TLS)
    if rnd.random() < 0.5:
        s.sendall(cut(hello, rnd))
    else:
        # the whole ClientHello, then some of the server's flight
        s.sendall(hello)
        read_some(s, rnd.randrange(0, 2000))
    reset(s)


def tls_reply(rnd):
    raw = connect(TLS)
    s = CTX.wrap_socket(raw)
    s.sendall(b"GET /big HTTP/1.1\r\nHost: r\r\n\r\n")
    read_some(s, rnd.randrange(0, 200000))
    reset(s)


def frame(kind, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + \
        struct.pack(">I", stream) + payload


# HPACK: :method GET (2), :method POST (3), :path / (4), :scheme http (6), then :authority
# and :path as literals without indexing.
H2 = (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"") +
      frame(1, 0x5, 1, b"\x82\x84\x86\x01\x01r") +
      frame(1, 0x4, 3, b"\x83\x86\x01\x01r\x04\x07/upload") +
      frame(0, 0, 3, b"y" * 3000) + frame(0, 0, 3, b"y" * 3000) +
      frame(1, 0x5, 5, b"\x82\x86\x01\x01r\x04\x04/big"))


def h2_frame(rnd):
    s = connect(PLAIN)
    s.sendall(cut(H2, rnd))
    if rnd.random() < 0.3:
        read_some(s, rnd.randrange(0, 100000))
    reset(s)


WS_UPGRADE = (b"GET /ws HTTP/1.1\r\nHost: r\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")


def ws_frame(opcode, fin, payload):
    """A masked frame (a mask of zeros: the payload as it is)."""
    head = bytes([opcode | (0x80 if fin else 0)])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    else:
        head += bytes([0x80 | 126]) + struct.pack(">H", n)
    return head + b"\0\0\0\0" + payload


def ws_message(rnd):
    s = connect(PLAIN)
    s.sendall(WS_UPGRADE)
    read_some(s, 4096, b"\r\n\r\n")  # the 101's head
    if rnd.random() < 0.5:
        s.sendall(cut(ws_frame(1, True, b"m" * 4000), rnd))
    else:
        s.sendall(ws_frame(1, False, b"a" * 1000) + cut(ws_frame(0, True, b"b" * 1000), rnd))
    reset(s)


KINDS = [h1_head, h1_body, h1_reply, h1_wait, tls_hello, tls_reply, h2_frame, ws_message]
counts = {k.__name__: 0 for k in KINDS}
errors = {}
lock = threading.Lock()


def run(index, n):
    rnd = random.Random(SEED * 1000 + index)
    for i in range(n):
        kind = KINDS[(index + i * THREADS) % len(KINDS)]
        try:
            kind(rnd)
            with lock:
                counts[kind.__name__] += 1
        except (OSError, ssl.SSLError) as e:
            with lock:
                key = "%s: %s" % (kind.__name__, type(e).__name__)
                errors[key] = errors.get(key, 0) + 1


start = time.time()
threads = [threading.Thread(target=run, args=(t, COUNT // THREADS + (t < COUNT % THREADS)))
           for t in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"resets": counts, "errors": errors, "seconds": round(time.time() - start, 1)}))
sys.stdout.flush()
os._exit(0)
