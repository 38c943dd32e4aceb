// Jobs: live rows from "job" frames: status, queue time, runner, and why a job waits.
"use strict";
(function () {
  const {esc} = Zoomies;
  const tbody = document.querySelector("#jobs tbody");

  function row(j) {
    const queue = j.queue_seconds == null ? "waiting" : `${Math.round(j.queue_seconds)} s`;
    const failure = j.fleet_failure ? ` <small class="bad">${esc(j.fleet_failure)}</small>` : "";
    return `<tr data-id="${j.id}" data-status="${esc(j.status)}"><td data-label="Job">${esc(j.name || j.github_id)}</td>` +
      `<td data-label="Repository">${esc(j.repository)}</td><td data-label="Labels">${esc((j.labels || []).join(", "))}</td>` +
      `<td data-label="Status"><span class="badge ${esc(j.status)}">${esc(j.status)}</span>${failure}</td>` +
      `<td data-label="Queue time">${queue}</td><td data-label="Runner">${esc(j.runner_name)}</td>` +
      `<td data-label="Why it waits" class="message">${esc(j.wait_reason)}</td></tr>`;
  }

  Zoomies.on("job", (frame) => Zoomies.upsertRow(tbody, frame.id, frame.object && row(frame.object)));
  Zoomies.poll = async () => {
    const page = await Zoomies.api("jobs?limit=300");
    tbody.innerHTML = page.results.map(row).join("");
  };
})();
