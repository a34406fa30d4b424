#!/usr/bin/python3
"""spec/it/load_client.py: steady load that counts every failure, for the upgrade specs.

load_client.py PORT SECONDS KEPT FRESH [PATH]: KEPT threads each on one keep-alive
connection, FRESH threads each on a new connection per request, GET PATH (default /) for
SECONDS. Every request has 2 s; a refused or reset connection, a connection closed under a
request, a timeout and a reply that is not 2xx each count as failed (a keep-alive connection
the server closed while idle, found closed before a request was sent, is reopened, as
browsers and balancers do). Prints one JSON line: requests, failed, refused, the bodies seen
and how often, and the first few errors.
"""
import http.client
import json
import socket
import sys
import threading
import time

port, seconds, kept, fresh = (int(a) for a in sys.argv[1:5])
path = sys.argv[5] if len(sys.argv) > 5 else "/"
lock = threading.Lock()
stats = {"requests": 0, "failed": 0, "refused": 0, "bodies": {}, "errors": []}
end = time.monotonic() + seconds


def record(body=None, error=None, refused=False):
    with lock:
        stats["requests"] += 1
        if error is not None:
            stats["failed"] += 1
            stats["refused"] += 1 if refused else 0
            if len(stats["errors"]) < 5:
                stats["errors"].append(error)
        else:
            stats["bodies"][body] = stats["bodies"].get(body, 0) + 1


def idle_closed(conn):
    """Whether the server closed this idle keep-alive connection (EOF waiting)."""
    if conn.sock is None:
        return True
    try:
        conn.sock.setblocking(False)
        data = conn.sock.recv(1, socket.MSG_PEEK)
        return data == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        if conn.sock is not None:
            conn.sock.setblocking(True)
            conn.sock.settimeout(2)


def one(conn, close):
    try:
        if conn.sock is None:
            conn.connect()
        conn.request("GET", path, headers={"Connection": "close"} if close else {})
        res = conn.getresponse()
        body = res.read().decode("utf-8", "replace")
        if res.status // 100 != 2:
            record(error="status %d" % res.status)
        else:
            record(body=body)
        if close or res.getheader("connection", "").lower() == "close":
            conn.close()
    except ConnectionRefusedError as e:
        record(error="refused: %s" % e, refused=True)
        conn.close()
    except (OSError, http.client.HTTPException) as e:
        record(error="%s: %s" % (type(e).__name__, e))
        conn.close()


def run(close):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    while time.monotonic() < end:
        if not close and conn.sock is not None and idle_closed(conn):
            conn.close()
        one(conn, close)
    conn.close()


threads = [threading.Thread(target=run, args=(False,)) for _ in range(kept)]
threads += [threading.Thread(target=run, args=(True,)) for _ in range(fresh)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(stats))
