// Overview: the counts and the queue-time chart, redrawn from "overview" frames.
"use strict";
(function () {
  const {esc} = Zoomies;

  function counts(id, map, extra) {
    const items = Object.entries(map).concat(extra || []);
    document.getElementById(id).innerHTML = items.map(([k, n]) =>
      `<div><dt>${esc(k)}</dt><dd>${esc(n)}</dd></div>`).join("");
  }

  function chart(points) {
    const width = 240, height = 48;
    const top = Math.max(0, ...points.filter((p) => p != null)) || 1;
    const step = width / Math.max(points.length - 1, 1);
    return points.map((p, i) =>
      `${(i * step).toFixed(1)},${(height - ((p || 0) / top) * (height - 4) - 2).toFixed(1)}`).join(" ");
  }

  function render(o) {
    document.getElementById("queued-jobs").textContent = o.queued_jobs;
    counts("runners-by-state", o.runners_by_state);
    counts("hosts-by-health", o.hosts_by_health, [["cordoned", o.cordoned_hosts]]);
    document.querySelector("#queue-chart polyline").setAttribute("points", chart(o.queue_time.points));
    const longest = o.queue_time.max_seconds == null ? "" : `, longest wait ${Math.round(o.queue_time.max_seconds)} s`;
    document.getElementById("queue-summary").textContent = `${o.queue_time.jobs_started} job(s) started${longest}.`;
  }

  Zoomies.on("overview", render);
  Zoomies.poll = async () => render(await Zoomies.api("overview"));
})();
