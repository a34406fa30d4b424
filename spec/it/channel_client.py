"""channel_client.py: the client of spec/it/channel_spec.lua.

Run by Debian's python3 as `channel_client.py PORT`: opens WebSockets to /ws/room until two
sit on two different workers (each says which in its first message), then checks that what
one publishes reaches both, in one order, and prints one line per fact as "name=value".
"""
import asyncio
import json
import sys
import time

import websockets

URL = "ws://127.0.0.1:%s/ws/room" % sys.argv[1]
ORIGIN = "http://127.0.0.1:%s" % sys.argv[1]


def say(name, value):
    print("%s=%s" % (name, value), flush=True)


async def recv(ws, timeout=5):
    return await asyncio.wait_for(ws.recv(), timeout)


async def until(ws, pred, timeout=5):
    """Messages up to and including the first for which pred holds."""
    got = []
    while True:
        m = await recv(ws, timeout)
        got.append(m)
        if pred(m):
            return got


async def main():
    by_worker, spare = {}, []
    for _ in range(40):
        ws = await websockets.connect(URL, origin=ORIGIN)
        _, wid, pid = (await recv(ws)).split()
        if wid in by_worker:
            spare.append(ws)
        else:
            by_worker[wid] = (ws, pid)
        if len(by_worker) == 2:
            break
    for ws in spare:
        await ws.close()
    say("workers", ",".join(sorted(by_worker)))
    say("pids", ",".join(sorted(p for _, p in by_worker.values())))
    if len(by_worker) < 2:
        return
    (a, _), (b, _) = [by_worker[k] for k in sorted(by_worker)]

    # One message each way reaches both sockets.
    await a.send("hello from a")
    say("a_got_a", await recv(a))
    say("b_got_a", await recv(b))
    await b.send("hello from b")
    say("a_got_b", await recv(a))
    say("b_got_b", await recv(b))

    # Both publish at once (fewer than the ring holds): both sockets see the same order.
    for i in range(3):
        await a.send("a%d" % i)
        await b.send("b%d" % i)
    seen_a = [await recv(a) for _ in range(6)]
    seen_b = [await recv(b) for _ in range(6)]
    say("same_order", seen_a == seen_b)
    say("all_six", sorted(seen_a) == sorted(["a%d" % i for i in range(3)] +
                                            ["b%d" % i for i in range(3)]))

    # A burst of 20 into a ring of 8: the publishing worker, which cannot look at the ring
    # while the burst runs, delivers the last 8 and counts 12 lost.
    await a.send("burst 20")
    got_a = await until(a, lambda m: m == "x20")
    got_b = await until(b, lambda m: m == "x20")
    say("burst_a", ",".join(got_a))
    say("burst_b_tail", ",".join(got_b[-8:]))
    say("burst_b_increasing", [int(m[1:]) for m in got_b] ==
        sorted(int(m[1:]) for m in got_b))
    await a.send("stats")
    stats = json.loads((await until(a, lambda m: m.startswith("{")))[-1])
    say("worker_lost_a", stats["worker_lost"])

    # A sequence number taken and never written: the next message waits for it, then it is
    # skipped (hole_wait) and counted lost.
    await b.send("hole")
    say("b_after_hole", await recv(b))
    say("a_after_hole", await recv(a))
    await b.send("stats")
    stats = json.loads((await until(b, lambda m: m.startswith("{")))[-1])
    say("published", stats["published"])
    say("lost_total", stats["lost"])
    say("subscribers_b", stats["subscribers"])
    # Latency from a publish on one worker to the other worker's subscriber, one at a time.
    times = []
    for i in range(40):
        t0 = time.monotonic()
        await a.send("t%d" % i)
        await until(b, lambda m, i=i: m == "t%d" % i)
        times.append((time.monotonic() - t0) * 1000)
    times.sort()
    say("latency_ms_median", "%.1f" % times[len(times) // 2])
    say("latency_ms_max", "%.1f" % times[-1])
    await a.close()
    await b.close()


asyncio.run(main())
