// The dashboard's live link: the event stream (GET /api/v1/events), and when it drops,
// polling that slows down in a hidden tab until the stream is back. Pages register
// handlers with Zoomies.on(event, fn) and a Zoomies.poll function that re-reads the API.
"use strict";
(function () {
  const handlers = {};
  const body = document.body;
  const liveBadge = document.getElementById("live");
  const POLL_VISIBLE = 3000, POLL_HIDDEN = 30000, STREAM_RETRY = 15000;
  let after = body.dataset.after || "0";
  let source = null, pollTimer = null, retryTimer = null;

  function esc(value) {
    return String(value == null ? "" : value).replace(/[&<>"']/g, (c) => (
      {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  }

  function csrf() {
    const m = document.cookie.match(/(?:^|; )csrftoken=([^;]+)/);
    return m ? decodeURIComponent(m[1]) : "";
  }

  async function api(path, options) {
    const opts = Object.assign({credentials: "same-origin", headers: {}}, options || {});
    opts.headers = Object.assign({"Accept": "application/json"}, opts.headers);
    if (opts.method && opts.method !== "GET") {
      opts.headers["X-CSRFToken"] = csrf();
      opts.headers["Content-Type"] = "application/json";
    }
    const response = await fetch("/api/v1/" + path, opts);
    const data = response.status === 204 ? null : await response.json().catch(() => null);
    if (!response.ok) {
      // A 400's body names its fields rather than a detail: kept on the error for forms.
      const error = new Error((data && data.detail) || ("HTTP " + response.status));
      error.status = response.status;
      error.data = data;
      throw error;
    }
    return data;
  }

  function dispatch(name, data) {
    (handlers[name] || []).forEach((fn) => fn(data));
  }

  function setBadge(text, state) {
    liveBadge.textContent = text;
    liveBadge.dataset.state = state;
  }

  function schedulePoll() {
    clearTimeout(pollTimer);
    pollTimer = setTimeout(pollOnce, document.hidden ? POLL_HIDDEN : POLL_VISIBLE);
  }

  async function pollOnce() {
    try {
      if (Zoomies.poll) await Zoomies.poll();
      // A list answers in pages; the drawer shows them all (the API's largest page).
      dispatch("problems", (await api("problems?limit=1000")).results);
      setBadge("polling", "polling");
    } catch (err) {
      setBadge("offline", "offline");
    }
    schedulePoll();
  }

  function connect() {
    clearTimeout(retryTimer);
    if (!window.EventSource) { schedulePoll(); return; }
    source = new EventSource("/api/v1/events?after=" + encodeURIComponent(after));
    source.onopen = () => {
      clearTimeout(pollTimer);
      pollTimer = null;
      setBadge("live", "live");
    };
    ["pool", "runner", "job", "host", "overview", "problems"].forEach((name) => {
      source.addEventListener(name, (event) => {
        if (event.lastEventId) after = event.lastEventId;
        dispatch(name, JSON.parse(event.data));
      });
    });
    source.addEventListener("reset", () => { if (Zoomies.poll) Zoomies.poll(); });
    source.onerror = () => {
      // The browser retries by itself; a stream that stays down is replaced by polling.
      if (source.readyState === EventSource.CLOSED || !pollTimer) {
        source.close();
        setBadge("polling", "polling");
        pollOnce();
        retryTimer = setTimeout(connect, STREAM_RETRY);
      }
    };
  }

  document.addEventListener("visibilitychange", () => { if (pollTimer) schedulePoll(); });

  // The problems drawer, kept current by "problems" frames.
  const drawer = document.getElementById("problems");
  const toggle = document.getElementById("problems-toggle");
  function showDrawer(open) {
    drawer.hidden = !open;
    toggle.setAttribute("aria-expanded", String(open));
  }
  toggle.addEventListener("click", () => showDrawer(drawer.hidden));
  document.getElementById("problems-close").addEventListener("click", () => showDrawer(false));
  function renderProblems(list) {
    document.getElementById("problems-count").textContent = list.length;
    toggle.classList.toggle("has-problems", list.length > 0);
    document.getElementById("problems-list").innerHTML = list.length ? list.map((p) =>
      `<li class="problem ${esc(p.severity)}" data-key="${esc(p.key)}"><strong>${esc(p.title)}</strong>` +
      `<p>${esc(p.detail || "")}</p><code>${esc(p.key)}</code></li>`).join("")
      : '<li class="empty">Nothing is wrong.</li>';
  }
  renderProblems(JSON.parse(document.getElementById("problems-data").textContent));

  // Replaces, inserts or removes one row of a table body, keyed by data-id.
  function upsertRow(tbody, id, html) {
    const old = tbody.querySelector(`tr[data-id="${id}"]`);
    if (!html) { if (old) old.remove(); return; }
    const tmp = document.createElement("tbody");
    tmp.innerHTML = html.trim();
    const row = tmp.firstElementChild;
    if (old) old.replaceWith(row); else tbody.prepend(row);
  }

  // Buttons with data-act call the page's action for their row's id.
  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-act]");
    if (!button || !Zoomies.act) return;
    const row = button.closest("tr[data-id]");
    button.disabled = true;
    try {
      await Zoomies.act(button.dataset.act, row ? row.dataset.id : null, button);
    } catch (err) {
      alert(err.message);
    } finally {
      button.disabled = false;
    }
  });

  window.Zoomies = {
    on(name, fn) { (handlers[name] = handlers[name] || []).push(fn); },
    api, esc, upsertRow,
    canOperate: body.dataset.canOperate === "1",
    data: JSON.parse(document.getElementById("page-data").textContent || "{}"),
    poll: null,
    act: null,
  };
  Zoomies.on("problems", renderProblems);
  // Started after the page's own script has registered its handlers.
  window.addEventListener("DOMContentLoaded", connect);
})();
