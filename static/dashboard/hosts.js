// Hosts: live rows from "host" frames; cordon, uncordon, drain and join tokens via the API.
"use strict";
(function () {
  const {esc} = Zoomies;
  const tbody = document.querySelector("#hosts tbody");

  function row(h) {
    const cordon = h.cordoned
      ? '<button type="button" data-act="uncordon">Uncordon</button>'
      : '<button type="button" data-act="cordon">Cordon</button>';
    const buttons = Zoomies.canOperate
      ? `<td class="actions">${cordon} <button type="button" data-act="drain">Drain</button></td>` : "";
    return `<tr data-id="${h.id}"><td data-label="Name">${esc(h.name)}${h.embedded ? " <small>embedded</small>" : ""}</td>` +
      `<td data-label="Health"><span class="badge ${esc(h.health)}">${esc(h.health)}</span>` +
      `${h.cordoned ? ' <span class="badge paused">cordoned</span>' : ""}</td>` +
      `<td data-label="Runners">${esc(h.runners)} / ${esc(h.capacity)}</td>` +
      `<td data-label="CPUs / memory">${esc(h.cpus ?? "?")} / ${esc(h.memory_mb ?? "?")} MB</td>` +
      `<td data-label="Disk free">${esc(h.disk_free_mb ?? "?")} MB</td>` +
      `<td data-label="Last heartbeat"><time datetime="${esc(h.last_heartbeat_at)}">${esc(h.last_heartbeat_at || "never")}</time></td>${buttons}</tr>`;
  }

  Zoomies.on("host", (frame) => Zoomies.upsertRow(tbody, frame.id, frame.object && row(frame.object)));
  Zoomies.poll = async () => {
    const page = await Zoomies.api("hosts?limit=500");
    tbody.innerHTML = page.results.map(row).join("");
  };
  // A host's runner count and heartbeat change without a host event: re-read the list
  // shortly after any runner moves, and every half minute for the heartbeats.
  let soon = null;
  Zoomies.on("runner", () => {
    clearTimeout(soon);
    soon = setTimeout(() => Zoomies.poll().catch(() => {}), 1000);
  });
  setInterval(() => { if (!document.hidden) Zoomies.poll().catch(() => {}); }, 30000);
  Zoomies.act = async (act, id) => {
    const answer = await Zoomies.api(`hosts/${id}/${act}`, {method: "POST"});
    Zoomies.upsertRow(tbody, id, row(answer.host));
  };
  const mint = document.getElementById("mint-join-token");
  if (mint) {
    mint.addEventListener("click", async () => {
      const token = await Zoomies.api("join-tokens", {method: "POST", body: "{}"});
      document.getElementById("join-token-secret").textContent = token.secret;
    });
  }
})();
