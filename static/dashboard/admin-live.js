// The admin's live line: the event stream's frames over the websocket /ws/events
// (zoomies_site.consumers), shown as the latest change beside the site's name.
"use strict";
(function () {
  const box = document.getElementById("zoomies-live");
  const text = document.getElementById("zoomies-live-text");
  if (!box || !window.WebSocket) return;
  let delay = 1000;

  function describe(frame) {
    if (frame.event === "overview") {
      const busy = frame.data.runners_by_state.busy || 0;
      return `${frame.data.queued_jobs} queued, ${busy} busy`;
    }
    if (frame.event === "problems") return null;
    const o = frame.data.object;
    const name = o ? (o.name || o.github_id || frame.data.id) : frame.data.id;
    return `${frame.data.kind} ${name}`;
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + "/ws/events");
    socket.onopen = () => { box.dataset.state = "live"; delay = 1000; };
    socket.onmessage = (message) => {
      const line = describe(JSON.parse(message.data));
      if (line) text.textContent = line;
    };
    socket.onclose = () => {
      box.dataset.state = "offline";
      text.textContent = "reconnecting…";
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 30000);
    };
  }
  connect();
})();
