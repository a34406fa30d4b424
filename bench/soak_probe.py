#!/usr/bin/python3
"""soak_probe.py: the sampler of bench/soak. Every INTERVAL seconds for MINUTES minutes it
writes one line to OUT (tab-separated): seconds since the start, the RSS (KiB) and open
descriptors of the server's processes (the master PID and its workers), the Lua heap of
its workers (the metrics listener's moonserve_lua_memory_bytes), the p50 and p99 latency
(ms) of the probe's requests in the interval, the probe's failed requests, and the
WebSocket echoes done. The probe asks GET / 50 times a second, every tenth on a new
connection; WS WebSocket clients each echo a message every 50 ms (and connect again when a
reload closes them).

Usage: soak_probe.py PID PORT METRICS_PORT MINUTES INTERVAL OUT [WS]"""
import os
import socket
import struct
import sys
import threading
import time

PID, PORT, METRICS = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
MINUTES, INTERVAL, OUT = float(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
WS = int(sys.argv[7]) if len(sys.argv) > 7 else 8
lock = threading.Lock()
latencies, failed, echoes = [], 0, 0
stop = False


def processes():
    kids = []
    try:
        with open("/proc/%d/task/%d/children" % (PID, PID)) as f:
            kids = [int(p) for p in f.read().split()]
    except OSError:
        pass
    return [PID] + kids


def rss_and_fds():
    rss = fds = 0
    for p in processes():
        try:
            with open("/proc/%d/status" % p) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1])
            fds += len(os.listdir("/proc/%d/fd" % p))
        except OSError:
            pass
    return rss, fds


def lua_bytes():
    try:
        s = socket.create_connection(("127.0.0.1", METRICS), timeout=2)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
        s.close()
        for line in data.decode(errors="replace").splitlines():
            if line.startswith("moonserve_lua_memory_bytes "):
                return int(float(line.split()[1]))
    except OSError:
        pass
    return -1


class Unanswered(OSError):
    """The connection closed before any byte of the reply came."""


def read_reply(s):
    """Reads one HTTP/1.1 reply with a Content-Length; returns its status, and whether the
    server said it closes the connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            b = s.recv(4096)
        except ConnectionResetError:
            b = b""
        if not b:
            raise Unanswered("closed") if not data else OSError("closed mid-reply")
        data += b
    head, _, body = data.partition(b"\r\n\r\n")
    length, close = 0, False
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        k = k.strip().lower()
        if k == b"content-length":
            length = int(v)
        elif k == b"connection" and v.strip().lower() == b"close":
            close = True
    while len(body) < length:
        b = s.recv(4096)
        if not b:
            raise OSError("closed mid-reply")
        body += b
    return int(head.split(b" ")[1]), close


def ask(s):
    try:
        s.sendall(b"GET / HTTP/1.1\r\nHost: soak\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        raise Unanswered("closed")
    return read_reply(s)


def probe():
    """A keep-alive connection that the server closed while it was idle (a reload's old
    worker lets its connections go), found closed before any byte of the reply came, is
    opened again and the request sent again, as browsers and balancers do; any other
    failure counts."""
    global failed
    s = None
    n = 0
    while not stop:
        t0 = time.time()
        try:
            fresh = s is None or n % 10 == 0
            if fresh:
                if s:
                    s.close()
                s = socket.create_connection(("127.0.0.1", PORT), timeout=5)
            try:
                status, close = ask(s)
            except Unanswered:
                if fresh:
                    raise
                s.close()
                s = socket.create_connection(("127.0.0.1", PORT), timeout=5)
                status, close = ask(s)
            with lock:
                if status == 200:
                    latencies.append((time.time() - t0) * 1000)
                else:
                    failed += 1
            if close:
                s.close()
                s = None
        except OSError:
            with lock:
                failed += 1
            s = None
        n += 1
        time.sleep(max(0, 0.02 - (time.time() - t0)))


def ws_client():
    global echoes
    msg = b"soak " * 20
    frame = bytes([0x81, 0x80 | len(msg)]) + b"\0\0\0\0" + msg
    while not stop:
        try:
            s = socket.create_connection(("127.0.0.1", PORT), timeout=5)
            s.sendall(b"GET /ws HTTP/1.1\r\nHost: soak\r\nUpgrade: websocket\r\n"
                      b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                      b"Sec-WebSocket-Version: 13\r\n\r\n")
            data = b""
            while b"\r\n\r\n" not in data:
                b = s.recv(4096)
                if not b:
                    raise OSError("closed")
                data += b
            while not stop:
                s.sendall(frame)
                got = b""
                while len(got) < 2 + len(msg):
                    b = s.recv(4096)
                    if not b:
                        raise OSError("closed")
                    got += b
                with lock:
                    echoes += 1
                time.sleep(0.05)
        except OSError:
            time.sleep(0.1)


def pct(sorted_values, p):
    if not sorted_values:
        return -1
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * p))]


threading.Thread(target=probe, daemon=True).start()
for _ in range(WS):
    threading.Thread(target=ws_client, daemon=True).start()
start = time.time()
with open(OUT, "w") as out:
    out.write("seconds\trss_kb\tfds\tlua_bytes\tp50_ms\tp99_ms\tfailed\techoes\n")
    while time.time() - start < MINUTES * 60:
        time.sleep(INTERVAL)
        with lock:
            lat, latencies = sorted(latencies), []
            f, failed = failed, 0
            e, echoes = echoes, 0
        rss, fds = rss_and_fds()
        out.write("%.0f\t%d\t%d\t%d\t%.3f\t%.3f\t%d\t%d\n" % (
            time.time() - start, rss, fds, lua_bytes(), pct(lat, 0.5), pct(lat, 0.99), f, e))
        out.flush()
stop = True
