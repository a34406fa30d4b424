"""board_browser.py: the board (examples/board) in headless Chromium, for spec/it/board_spec.lua.

Run by Debian's python3 as `board_browser.py CHROMIUM URL NAME`: starts Chromium headless
(the self-signed certificate of an https URL taken: --ignore-certificate-errors), signs up
as NAME in one tab, logs out and in again, opens the board in a second tab, posts a note
from the first, and waits for it to show in the second (the page's server-sent events).
Prints one line per fact the spec checks, as "name=value".
"""
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.request

import websockets

CHROMIUM, URL, NAME = sys.argv[1], sys.argv[2].rstrip("/"), sys.argv[3]


def say(name, value):
    print("%s=%s" % (name, value), flush=True)


class Tab:
    """One page target over the DevTools protocol: commands by id, load events, errors."""

    def __init__(self, ws):
        self.ws, self.next_id, self.pending, self.loads, self.errors = ws, 0, {}, 0, []
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
            if method == "Page.loadEventFired":
                self.loads += 1
            elif method == "Runtime.exceptionThrown":
                self.errors.append("exception: %s" % p.get("exceptionDetails", {}).get("text"))
            elif method == "Runtime.consoleAPICalled" and p.get("type") == "error":
                self.errors.append("console.error: %s" % " ".join(
                    str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
                self.errors.append("log: %s %s" % (p["entry"].get("text"),
                                                   p["entry"].get("url", "")))

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

    async def loaded_after(self, action):
        """Runs `action` (JavaScript that navigates) and waits for the next load."""
        loads = self.loads
        await self.js(action)
        for _ in range(200):
            if self.loads > loads:
                return True
            await asyncio.sleep(0.05)
        return False

    async def open(self, url):
        return await self.loaded_after("location.href = %s" % json.dumps(url))

    async def submit(self, form, fields):
        """Fills `fields` ({name: value}) of the form `form` (a selector) and submits it."""
        sets = "".join("f.querySelector('[name=%s]').value = %s;" % (k, json.dumps(v))
                       for k, v in fields.items())
        return await self.loaded_after(
            "(() => { const f = document.querySelector(%s); %s f.requestSubmit(); })()"
            % (json.dumps(form), sets))

    async def text(self, selector):
        return await self.js("(document.querySelector(%s) || {}).textContent || ''"
                             % json.dumps(selector))


async def new_tab(port):
    req = urllib.request.Request("http://127.0.0.1:%d/json/new?about:blank" % port,
                                 method="PUT")
    with urllib.request.urlopen(req, timeout=10) as r:
        target = json.load(r)
    tab = Tab(await websockets.connect(target["webSocketDebuggerUrl"], max_size=2**24))
    for domain in ("Page", "Runtime", "Log"):
        await tab.call(domain + ".enable")
    return tab


async def main(port):
    one = await new_tab(port)
    two = await new_tab(port)

    # Sign up: the welcome is a flash message on the page after the redirect.
    say("signup_loaded", await one.open(URL + "/signup"))
    await one.submit("#signup-form", {"name": NAME, "password": "correct horse"})
    say("after_signup", "%s %s" % (await one.js("location.pathname"),
                                   await one.text(".flash")))
    say("protocol", await one.js("performance.getEntriesByType('navigation')[0]"
                                 ".nextHopProtocol"))
    # Log out, and in again.
    await one.loaded_after("document.getElementById('logout').click()")
    say("after_logout", await one.text(".flash"))
    await one.open(URL + "/login")
    await one.submit("#login-form", {"name": NAME, "password": "correct horse"})
    say("after_login", "%s %s" % (await one.text(".flash"), await one.text("#me")))

    # The second tab follows the board live; a note posted in the first shows there.
    await two.open(URL + "/")
    say("second_live", await two.until("document.body.dataset.live === 'open'"))
    await one.submit("#note-form", {"body": "hello from the first tab"})
    say("first_shows", await one.text("#notes li .body"))
    say("second_shows", await two.until(
        "[...document.querySelectorAll('#notes li .body')].map(e => e.textContent)"
        ".find(t => t === 'hello from the first tab')"))
    say("second_received", await two.js("document.body.dataset.received"))
    say("second_author", await two.text("#notes li b"))

    say("console_errors", len(one.errors) + len(two.errors))
    for e in one.errors + two.errors:
        say("console_error", re.sub(r"\s+", " ", e))
    for tab in (one, two):
        await tab.ws.close()
        tab.reader.cancel()


def run():
    profile = tempfile.mkdtemp(prefix="moonserve-chromium-")
    proc = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--no-default-browser-check", "--disable-extensions", "--disable-sync",
         "--disable-background-networking", "--disable-component-update",
         "--disable-dev-shm-usage", "--no-proxy-server", "--mute-audio",
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
        asyncio.run(asyncio.wait_for(main(port), 60))
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


run()
