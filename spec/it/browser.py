"""browser.py: headless Chromium over the DevTools protocol, for spec/it/browser_spec.lua.

Run by Debian's python3 as `browser.py CHROMIUM URL OUTDIR`: starts Chromium headless (an
https URL's self-signed certificate taken: --ignore-certificate-errors), then
opens the demo's page in two tabs (a desktop one, 1280 px wide, and a phone one, 375 px),
posts the guestbook form from the first, sends a counter increment and a chat message from
one tab to the other over the page's WebSocket, writes a screenshot of each tab to OUTDIR
and prints one line per fact the spec checks, as "name=value".
"""
import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import websockets

CHROMIUM, URL, OUTDIR = sys.argv[1], sys.argv[2].rstrip("/"), sys.argv[3]


T0 = time.monotonic()


def say(name, value):
    print("%s=%s" % (name, value), flush=True)
    if os.environ.get("BROWSER_TIMES"):
        print("  %.2f s" % (time.monotonic() - T0), flush=True)


class Tab:
    """One page target: commands by id, events kept for the checks."""

    def __init__(self, name, ws):
        self.name, self.ws, self.next_id = name, ws, 0
        self.pending, self.events, self.errors = {}, [], []
        self.reader = asyncio.ensure_future(self.read())

    async def read(self):
        async for raw in self.ws:
            m = json.loads(raw)
            if "id" in m:
                fut = self.pending.pop(m["id"], None)
                if fut and not fut.done():
                    fut.set_result(m)
                continue
            method, p = m.get("method"), m.get("params", {})
            self.events.append(method)
            # Everything the console would show in red: console.error, an uncaught
            # exception, and the browser's own errors (a refused resource, a CSP violation).
            if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                self.errors.append("console.%s: %s" % (p["type"], " ".join(
                    str(a.get("value", a.get("description", ""))) for a in p.get("args", []))))
            elif method == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                self.errors.append("exception: %s" % d.get("exception", {}).get(
                    "description", d.get("text")))
            elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
                e = p["entry"]
                self.errors.append("log: %s %s" % (e.get("text"), e.get("url", "")))

    async def call(self, method, **params):
        self.next_id += 1
        fut = asyncio.get_event_loop().create_future()
        self.pending[self.next_id] = fut
        await self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        m = await asyncio.wait_for(fut, 20)
        if "error" in m:
            raise RuntimeError("%s: %s" % (method, m["error"]))
        return m["result"]

    async def js(self, expr):
        r = await self.call("Runtime.evaluate", expression=expr, returnByValue=True,
                            awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError("%s: %s" % (expr, r["exceptionDetails"]))
        return r["result"].get("value")

    async def until(self, expr, timeout=10):
        """Polls `expr` in the page until it is truthy; returns it, or None at the timeout."""
        for _ in range(int(timeout / 0.05)):
            try:
                v = await self.js(expr)
            except RuntimeError:
                v = None  # (the page is between two documents)
            if v:
                return v
            await asyncio.sleep(0.05)
        return None

    async def open(self, url):
        loads = self.events.count("Page.loadEventFired")
        await self.call("Page.navigate", url=url)
        for _ in range(200):
            if self.events.count("Page.loadEventFired") > loads:
                return True
            await asyncio.sleep(0.05)
        return False

    async def screenshot(self, path):
        r = await self.call("Page.captureScreenshot", format="png")
        with open(path, "wb") as f:
            f.write(base64.b64decode(r["data"]))


async def new_tab(port, name, width, height, mobile):
    req = urllib.request.Request("http://127.0.0.1:%d/json/new?about:blank" % port,
                                 method="PUT")
    with urllib.request.urlopen(req, timeout=10) as r:
        target = json.load(r)
    ws = await websockets.connect(target["webSocketDebuggerUrl"], max_size=64 * 2**20)
    tab = Tab(name, ws)
    for domain in ("Page", "Runtime", "Log"):
        await tab.call(domain + ".enable")
    await tab.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                   deviceScaleFactor=1, mobile=mobile)
    return tab


async def main(port):
    desk = await new_tab(port, "desktop", 1280, 960, False)
    phone = await new_tab(port, "phone", 375, 812, True)

    # The page loads, with its script, stylesheet and socket, and no console error.
    say("desktop_loaded", await desk.open(URL + "/"))
    say("desktop_live", await desk.until("document.body.dataset.live === 'open'"))
    # (h2 over TLS, where the page's WebSocket is an extended CONNECT on that connection)
    say("page_protocol", await desk.js(
        "performance.getEntriesByType('navigation')[0].nextHopProtocol"))
    say("stylesheet", await desk.js(
        "getComputedStyle(document.querySelector('.hero')).backgroundImage.includes('gradient')"))
    say("stats_shown", await desk.until(
        "/^[0-9]+$/.test(document.getElementById('n-requests').textContent)"))

    # The guestbook form posts with its CSRF token, and the session remembers the name.
    await desk.js("document.querySelector('#sign-form [name=name]').value = 'Ada Lovelace'")
    loads = desk.events.count("Page.loadEventFired")
    await desk.js("document.getElementById('sign-form').requestSubmit()")
    for _ in range(200):
        if desk.events.count("Page.loadEventFired") > loads:
            break
        await asyncio.sleep(0.05)
    say("after_post_url", await desk.js("location.pathname + location.hash"))
    say("signed", await desk.until("document.querySelector('#posts li') && "
                                   "document.querySelector('#posts li').textContent"))
    say("session_name", await desk.js("document.getElementById('who').textContent"))
    say("desktop_live_again", await desk.until("document.body.dataset.live === 'open'"))

    # The phone tab on the other worker than the desktop one (a new socket each load). Over
    # HTTP/2 both tabs' pages and sockets share the browser's one connection, and so its
    # worker: a reload moves nothing.
    desk_worker = await desk.js("document.body.dataset.worker")
    phone_worker = None
    for _ in range(1 if URL.startswith("https:") else 12):
        await phone.open(URL + "/")
        await phone.until("document.body.dataset.live === 'open'")
        phone_worker = await phone.js("document.body.dataset.worker")
        if phone_worker != desk_worker:
            break
    say("workers", "%s,%s" % (desk_worker, phone_worker))
    say("phone_overflow", await phone.js("document.documentElement.scrollWidth > innerWidth"))
    say("desktop_overflow", await desk.js("document.documentElement.scrollWidth > innerWidth"))
    say("phone_columns", await phone.js(
        "getComputedStyle(document.querySelector('main')).gridTemplateColumns.split(' ').length"))
    say("desktop_columns", await desk.js(
        "getComputedStyle(document.querySelector('main')).gridTemplateColumns.split(' ').length"))

    # A click on one tab's counter shows on the other's; a chat message goes the other way.
    before = int(await phone.js("document.getElementById('count').textContent"))
    await desk.js("document.getElementById('inc').click()")
    say("count_step", (await phone.until(
        "document.getElementById('count').textContent !== '%d' && "
        "document.getElementById('count').textContent" % before) or "none") + "-%d" % before)
    await phone.js("document.getElementById('chat-text').value = 'hello from the phone'")
    await phone.js("document.getElementById('chat-form').requestSubmit()")
    say("chat", await desk.until(
        "[...document.querySelectorAll('#chat-log li')].map(l => l.textContent)"
        ".find(t => t.includes('hello from the phone'))"))
    say("chat_on_phone", bool(await phone.until(
        "document.getElementById('chat-log').textContent.includes('hello from the phone')")))
    await desk.js("document.getElementById('chat-text').value = 'and back from the desk'")
    await desk.js("document.getElementById('chat-form').requestSubmit()")
    say("chat_back", bool(await phone.until(
        "document.getElementById('chat-log').textContent.includes('and back from the desk')")))
    await desk.until("Number(document.body.dataset.stats) >= 2")

    await desk.screenshot(os.path.join(OUTDIR, "demo-desktop.png"))
    await phone.screenshot(os.path.join(OUTDIR, "demo-phone.png"))
    say("screenshots", "yes")

    say("console_errors", len(desk.errors) + len(phone.errors))
    for e in desk.errors + phone.errors:
        say("console_error", re.sub(r"\s+", " ", e))
    for tab in (desk, phone):
        await tab.ws.close()
        tab.reader.cancel()


def run():
    profile = tempfile.mkdtemp(prefix="moonserve-chromium-")
    proc = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--no-default-browser-check", "--disable-extensions", "--disable-sync",
         "--disable-background-networking", "--disable-component-update",
         "--disable-dev-shm-usage", "--no-proxy-server", "--mute-audio", "--hide-scrollbars",
         "--ignore-certificate-errors",
         "--user-data-dir=" + profile, "--remote-debugging-port=0", "about:blank"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True)
    try:
        port = None
        for line in proc.stderr:
            m = re.search(rb"DevTools listening on ws://[^:]+:(\d+)/", line)
            if m:
                port = int(m.group(1))
                break
        if port is None:
            say("chromium", "did not start")
            return
        # (Chromium keeps writing to stderr: drain it so that it never blocks.)
        threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
        asyncio.run(asyncio.wait_for(main(port), 50))
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
        if os.environ.get("BROWSER_TIMES"):
            print("  %.2f s: done" % (time.monotonic() - T0), flush=True)


run()
