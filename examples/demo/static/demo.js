// The demo page's script: the live numbers from /api/status every two seconds, and the
// shared counter and the chat over the WebSocket at /live (reconnecting if it drops).
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const state = document.body.dataset;

  function show(id, v) {
    if (v !== undefined && v !== null) $(id).textContent = String(v);
  }

  async function stats() {
    try {
      const r = await fetch("/api/status", { cache: "no-store" });
      const s = await r.json();
      show("n-requests", s.requests);
      show("n-connections", s.connections);
      show("n-in-flight", s.in_flight);
      show("n-workers", s.workers);
      state.stats = (Number(state.stats) || 0) + 1;
    } catch (e) {
      // (the numbers stay as they were until the next try)
    }
  }
  stats();
  setInterval(stats, 2000);

  let ws = null;
  function say(m) {
    const li = document.createElement("li");
    const who = document.createElement("b");
    who.textContent = m.from + " (worker " + m.worker + ")";
    li.append(who, ": " + m.say);
    const log = $("chat-log");
    log.append(li);
    log.scrollTop = log.scrollHeight;
    state.said = (Number(state.said) || 0) + 1;
  }
  function connect() {
    const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/live";
    ws = new WebSocket(url);
    ws.onopen = () => {
      $("inc").disabled = false;
      show("ws-state", "connected");
    };
    ws.onmessage = (ev) => {
      const m = JSON.parse(ev.data);
      if (m.hello) {
        show("ws-worker", m.worker);
        state.worker = m.worker;
        state.live = "open";
      }
      if (m.count !== undefined) {
        show("count", m.count);
        state.count = m.count;
      }
      if (m.say !== undefined) say(m);
    };
    ws.onclose = () => {
      $("inc").disabled = true;
      show("ws-state", "reconnecting");
      state.live = "closed";
      setTimeout(connect, 1000);
    };
  }
  connect();

  $("inc").addEventListener("click", () => ws.send(JSON.stringify({ op: "inc" })));
  $("chat-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const input = $("chat-text");
    if (input.value.trim() !== "" && ws.readyState === WebSocket.OPEN) {
      ws.send(JSON.stringify({ op: "say", text: input.value }));
      input.value = "";
    }
  });
})();
