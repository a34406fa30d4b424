"""fanout_client.py: the WebSocket client of spec/it/fanout_spec.lua.

Run by Debian's python3 as `fanout_client.py CASE PORT...`; prints one line per fact as
"name=value". Each case first opens WebSockets to every port until each instance has sockets
on both its workers (their first message says "worker W PID").

  exact     every socket sends one message; each socket must get each message once
  listen S  holds the sockets S seconds and prints what each port's sockets got
  slow      sockets that never read sit beside readers while a port publishes big messages
"""
import asyncio
import socket
import sys
import time

import websockets

CASE = sys.argv[1]
ARGS = sys.argv[2:]


def say(name, value):
    print("%s=%s" % (name, value), flush=True)


async def recv(ws, timeout=5):
    return await asyncio.wait_for(ws.recv(), timeout)


async def open_all(ports, per_worker=1):
    """Sockets on every port, at least per_worker on each of its two workers."""
    socks = []  # (port, worker, ws)
    for port in ports:
        count = {}
        for _ in range(60):
            ws = await websockets.connect("ws://127.0.0.1:%s/ws" % port,
                                          max_size=2 ** 22, max_queue=None)
            _, wid, _ = (await recv(ws)).split()
            count[wid] = count.get(wid, 0) + 1
            socks.append((port, wid, ws))
            if len(count) == 2 and min(count.values()) >= per_worker:
                break
        say("workers_%s" % port, ",".join(sorted(count)))
    return socks


async def collect(socks, seconds):
    """What each socket got within `seconds`: {index: [messages]}."""
    got = {i: [] for i in range(len(socks))}

    async def one(i, ws):
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            try:
                got[i].append(await asyncio.wait_for(ws.recv(), left))
            except (asyncio.TimeoutError, websockets.ConnectionClosed):
                return

    await asyncio.gather(*(one(i, s[2]) for i, s in enumerate(socks)))
    return got


async def exact(ports):
    socks = await open_all(ports)
    await asyncio.sleep(0.3)  # (every worker's poller runs and its subscription is up)
    sent = []
    for i, (port, _, ws) in enumerate(socks):
        m = "m%d-%s" % (i, port)
        sent.append(m)
        await ws.send(m)
    got = await collect(socks, 4)
    bad = 0
    for i, msgs in got.items():
        for m in sent:
            if msgs.count(m) != 1:
                bad += 1
        bad += sum(1 for m in msgs if m not in sent)
    say("sockets", len(socks))
    say("messages", len(sent))
    say("deliveries", sum(len(v) for v in got.values()))
    say("wrong", bad)
    for ws in socks:
        await ws[2].close()


async def listen(ports, seconds):
    socks = await open_all(ports)
    say("ready", 1)
    got = await collect(socks, float(seconds))
    for port in ports:
        per = [sorted(set(got[i])) for i, s in enumerate(socks) if s[0] == port]
        say("got_%s" % port, "|".join(",".join(p) for p in per))
    for ws in socks:
        await ws[2].close()


async def slow(ports):
    port = ports[0]
    # Sockets that never read: raw TCP after the handshake, so the server's frames pile up.
    stuck = []
    for _ in range(6):
        s = socket.create_connection(("127.0.0.1", int(port)))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(("GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                   "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        stuck.append(s)
    socks = await open_all(ports)
    await asyncio.sleep(0.3)
    big = "y" * 30000
    t0 = time.monotonic()
    n = 100
    for i in range(n):
        await socks[0][2].send("big%d %s" % (i, big))
    got = await collect(socks, 6)
    full = sum(1 for msgs in got.values() if len(msgs) == n)
    say("readers", len(socks))
    say("readers_complete", full)
    # the workers still answer at once
    t1 = time.monotonic()
    for _ in range(10):
        c = socket.create_connection(("127.0.0.1", int(port)), timeout=2)
        c.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            b = c.recv(4096)
            if not b:
                break
            data += b
        c.close()
    say("hello_ms", int((time.monotonic() - t1) * 1000 / 10))
    say("elapsed_ms", int((t1 - t0) * 1000))
    for s in stuck:
        s.close()
    for ws in socks:
        await ws[2].close()


async def demo(ports):
    """The demo's /live on two instances: a count and a chat line reach both."""
    import json
    a = await websockets.connect("ws://127.0.0.1:%s/live" % ports[0],
                                 origin="http://127.0.0.1:%s" % ports[0])
    b = await websockets.connect("ws://127.0.0.1:%s/live" % ports[1],
                                 origin="http://127.0.0.1:%s" % ports[1])
    ha, hb = json.loads(await recv(a)), json.loads(await recv(b))
    say("hello_counts", "%s,%s" % (ha["count"], hb["count"]))
    await asyncio.sleep(0.3)
    await a.send(json.dumps({"op": "inc"}))
    say("a_count", json.loads(await recv(a))["count"])
    say("b_count", json.loads(await recv(b))["count"])
    await b.send(json.dumps({"op": "say", "text": "hello fleet"}))
    say("a_say", json.loads(await recv(a))["say"])
    say("b_say", json.loads(await recv(b))["say"])
    await a.close()
    await b.close()


if CASE == "demo":
    asyncio.run(demo(ARGS))
elif CASE == "exact":
    asyncio.run(exact(ARGS))
elif CASE == "listen":
    asyncio.run(listen(ARGS[1:], ARGS[0]))
elif CASE == "slow":
    asyncio.run(slow(ARGS))
