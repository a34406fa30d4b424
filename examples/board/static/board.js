// The board's live list: the notes others post (and their deletions) arrive over
// server-sent events from /events, on every worker; a reconnect gets what it missed
// (the browser sends Last-Event-ID; the first connection names the page's own point).
"use strict";
(function () {
  const list = document.getElementById("notes");
  if (!list) return;
  const state = document.body.dataset;
  const me = list.dataset.user;
  const token = document.querySelector("meta[name=csrf-token]").content;

  function item(n) {
    const li = document.createElement("li");
    li.dataset.id = String(n.id);
    if (n.has_avatar) {
      const img = document.createElement("img");
      img.className = "avatar";
      img.src = "/avatars/" + n.author_id;
      img.alt = "";
      img.width = img.height = 32;
      li.append(img);
    }
    const who = document.createElement("b");
    who.textContent = n.author;
    const body = document.createElement("span");
    body.className = "body";
    body.textContent = n.body;
    li.append(who, " ", body);
    if (me !== "" && String(n.author_id) === me) {
      const form = document.createElement("form");
      form.method = "post";
      form.action = "/notes/" + n.id + "/delete";
      form.className = "inline";
      const csrf = document.createElement("input");
      csrf.type = "hidden";
      csrf.name = "_csrf";
      csrf.value = token;
      const button = document.createElement("button");
      button.className = "link";
      button.textContent = "delete";
      form.append(csrf, button);
      li.append(" ", form);
    }
    return li;
  }

  function show(n) {
    if (list.querySelector('li[data-id="' + n.id + '"]')) return; // (replayed: shown already)
    list.prepend(item(n));
    state.received = (Number(state.received) || 0) + 1;
  }

  // The ring lost some of what this page missed: fetch the first page again.
  async function refetch() {
    const r = await fetch("/api/notes", { headers: { accept: "application/json" } });
    const page = await r.json();
    list.replaceChildren(...page.notes.map(item));
  }

  const live = document.getElementById("live-state");
  const source = new EventSource("/events?since=" + encodeURIComponent(list.dataset.since));
  source.onopen = () => {
    live.textContent = "live";
    state.live = "open";
  };
  source.onerror = () => {
    live.textContent = "reconnecting";
    state.live = "closed";
  };
  source.onmessage = (ev) => {
    const m = JSON.parse(ev.data);
    if (m.note) show(m.note);
    if (m.deleted !== undefined) {
      const li = list.querySelector('li[data-id="' + m.deleted + '"]');
      if (li) li.remove();
    }
  };
  source.addEventListener("reset", () => { refetch(); });
})();
