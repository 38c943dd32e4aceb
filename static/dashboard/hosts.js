// Hosts: live rows from "host" frames; cordon, uncordon, drain and join tokens via the API.
"use strict";
(function () {
  const {esc} = Zoomies;
  const tbody = document.querySelector("#hosts tbody");

  // How old the usage sample the throttle and the holds read is (HOST-12: a failed sample
  // keeps the last one, so its age is what says whether it is still news).
  function sampledAgo(at) {
    const seconds = Math.max(0, Math.round((Date.now() - Date.parse(at)) / 1000));
    return seconds < 120 ? `${seconds} s ago` : `${Math.round(seconds / 60)} min ago`;
  }

  function row(h) {
    const cordon = h.cordoned
      ? '<button type="button" data-act="uncordon">Uncordon</button>'
      : '<button type="button" data-act="cordon">Cordon</button>';
    const buttons = Zoomies.canOperate
      ? `<td class="actions">${cordon} <button type="button" data-act="drain">Drain</button> ` +
        '<button type="button" data-act="check">Check</button></td>' : "";
    const check = h.last_check || {};
    return `<tr data-id="${h.id}"><td data-label="Name">${esc(h.name)}${h.embedded ? " <small>embedded</small>" : ""}</td>` +
      `<td data-label="Health"><span class="badge ${esc(h.health)}">${esc(h.health)}</span>` +
      `${h.cordoned ? ' <span class="badge paused">cordoned</span>' : ""}` +
      `${h.throttle_level ? ` <span class="badge paused" title="${esc(h.throttle_reason)}">throttled ${esc(h.throttle_level)}</span>` : ""}` +
      `${h.pressure_hold ? ` <small class="hold">holding starts: ${esc(h.pressure_hold)}</small>` : ""}` +
      `${check.state ? ` <small class="check">check ${esc(check.state)}${check.error ? `: ${esc(check.error)}` : ""}</small>` : ""}</td>` +
      `<td data-label="Runners">${esc(h.runners)} / ${esc(h.effective_capacity)}` +
      `${h.effective_capacity !== h.capacity ? ` <small>of ${esc(h.capacity)}</small>` : ""}</td>` +
      `<td data-label="CPUs / memory">${esc(h.cpus ?? "?")} / ${esc(h.memory_mb ?? "?")} MB` +
      `${h.lent_memory_mb ? ` <small class="lent">${esc(h.lent_memory_mb)} MB lent</small>` : ""}</td>` +
      `<td data-label="Disk free">${esc(h.disk_free_mb ?? "?")} MB</td>` +
      `<td data-label="Last heartbeat"><time datetime="${esc(h.last_heartbeat_at)}">${esc(h.last_heartbeat_at || "never")}</time>` +
      `${h.usage_at ? ` <small class="sampled">sampled ${esc(sampledAgo(h.usage_at))}</small>` : ""}</td>${buttons}</tr>`;
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
      // The token is the value of the line's first word (NAME=value): the placeholder's
      // text also occurs in the variable's name, so it is not searched for.
      const command = document.getElementById("join-command");
      const line = command.dataset.template;
      const eq = line.indexOf("=");
      command.textContent = line.slice(0, eq + 1) + token.secret + line.slice(line.indexOf(" ", eq));
    });
  }
})();
