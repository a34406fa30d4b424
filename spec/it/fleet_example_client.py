"""fleet_example_client.py: the browsers' side of spec/it/fleet_example_spec.lua.

Run by Debian's python3 as `fleet_example_client.py PORT`: three WebSockets to the demo's /live
through HAProxy (round robin over two instances, so the second lands on the other instance
than the first and third); the first says something in the chat and counts one up, and every
one must see both. Prints one line per fact, as "name=value".
"""
import asyncio
import json
import sys

URL = "ws://127.0.0.1:%d/live" % int(sys.argv[1])


def say(name, value):
    print("%s=%s" % (name, value), flush=True)


async def until(ws, pred):
    while True:
        m = json.loads(await asyncio.wait_for(ws.recv(), 5))
        if pred(m):
            return m


async def main():
    import websockets
    socks = []
    for _ in range(3):
        ws = await websockets.connect(URL)
        hello = json.loads(await asyncio.wait_for(ws.recv(), 5))
        socks.append((ws, hello["count"]))
    a = socks[0][0]
    await a.send(json.dumps({"op": "say", "text": "hello fleet"}))
    for i, (ws, _) in enumerate(socks):
        try:
            await until(ws, lambda m: m.get("say") == "hello fleet")
            say("chat%d" % i, "ok")
        except asyncio.TimeoutError:
            say("chat%d" % i, "missing")
    await a.send(json.dumps({"op": "inc"}))
    for i, (ws, before) in enumerate(socks):
        try:
            m = await until(ws, lambda m: "count" in m and "say" not in m)
            say("count%d" % i, "ok" if m["count"] == before + 1 else "was %s" % m["count"])
        except asyncio.TimeoutError:
            say("count%d" % i, "missing")
    for ws, _ in socks:
        await ws.close()


asyncio.run(main())
