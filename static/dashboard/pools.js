// Pools: live rows from "pool" frames; pause, resume and delete through the API.
"use strict";
(function () {
  const {esc} = Zoomies;
  const tbody = document.querySelector("#pools tbody");

  function row(p) {
    const state = p.paused ? "paused" : "active";
    const verb = p.paused ? "resume" : "pause";
    const button = Zoomies.canOperate
      ? `<td class="actions"><button type="button" data-act="${verb}">${p.paused ? "Resume" : "Pause"}</button> ` +
        `<a href="/pools/${p.id}/edit">Edit</a> <button type="button" data-act="delete">Delete</button></td>` : "";
    return `<tr data-id="${p.id}"><td data-label="Name">${esc(p.name)}</td>` +
      `<td data-label="Labels">${esc((p.labels || []).join(", "))}</td><td data-label="Backend">${esc(p.backend)}</td>` +
      `<td data-label="Runs"><code>${esc(p.runs)}</code></td>` +
      `<td data-label="Warm / max">${esc(p.warm)} / ${esc(p.max_runners)}</td>` +
      `<td data-label="State"><span class="badge ${p.paused ? "paused" : "healthy"}">${state}</span></td>${button}</tr>`;
  }

  Zoomies.on("pool", (frame) => Zoomies.upsertRow(tbody, frame.id, frame.object && row(frame.object)));
  Zoomies.poll = async () => {
    const page = await Zoomies.api("pools?limit=500");
    tbody.innerHTML = page.results.map(row).join("");
  };
  Zoomies.act = async (act, id) => {
    if (act === "delete") {
      const name = tbody.querySelector(`tr[data-id="${id}"] td`).textContent;
      if (!confirm(`Delete pool ${name}? Its finished runners' rows go with it.`)) return;
      await Zoomies.api(`pools/${id}`, {method: "DELETE"});
      Zoomies.upsertRow(tbody, id, null);
      return;
    }
    const pool = await Zoomies.api(`pools/${id}/${act}`, {method: "POST"});
    Zoomies.upsertRow(tbody, id, row(pool));
  };
})();
