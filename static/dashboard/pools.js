// Pools: live rows from "pool" frames; pause, resume and delete through the API.
"use strict";
(function () {
  const {esc} = Zoomies;
  const tbody = document.querySelector("#pools tbody");

  // SCHED-29: a pool the controller keeps from its hosts says so, with its size class;
  // one whose hosts are all gone is kept, retired, until they come back.
  function automatic(p) {
    if (!p.auto_key) return "";
    const size = p.size_class && p.size_class !== "unsized" ? `, ${esc(p.size_class)}` : "";
    return ` <span class="badge auto" title="kept by the controller from its hosts (${esc(p.auto_key)})">automatic${size}</span>`;
  }

  function row(p) {
    const retired = p.auto_key && !p.auto_active;
    const state = retired ? "retired: no host" : p.paused ? "paused" : "active";
    const verb = p.paused ? "resume" : "pause";
    const button = Zoomies.canOperate
      ? `<td class="actions"><button type="button" data-act="${verb}">${p.paused ? "Resume" : "Pause"}</button> ` +
        `<a href="/pools/${p.id}/edit">Edit</a> <button type="button" data-act="delete">Delete</button></td>` : "";
    return `<tr data-id="${p.id}" data-name="${esc(p.name)}"><td data-label="Name">${esc(p.name)}${automatic(p)}</td>` +
      `<td data-label="Labels">${esc((p.labels || []).join(", "))}</td><td data-label="Backend">${esc(p.backend)}</td>` +
      `<td data-label="Runs"><code>${esc(p.runs)}</code></td>` +
      `<td data-label="Warm / max">${esc(p.warm)} / ${esc(p.max_runners)}</td>` +
      `<td data-label="State"><span class="badge ${p.paused || retired ? "paused" : "healthy"}">${state}</span></td>${button}</tr>`;
  }

  Zoomies.on("pool", (frame) => Zoomies.upsertRow(tbody, frame.id, frame.object && row(frame.object)));
  Zoomies.poll = async () => {
    const page = await Zoomies.api("pools?limit=500");
    tbody.innerHTML = page.results.map(row).join("");
  };
  Zoomies.act = async (act, id) => {
    if (act === "delete") {
      const name = tbody.querySelector(`tr[data-id="${id}"]`).dataset.name;
      if (!confirm(`Delete pool ${name}? Its finished runners' rows go with it.`)) return;
      await Zoomies.api(`pools/${id}`, {method: "DELETE"});
      Zoomies.upsertRow(tbody, id, null);
      return;
    }
    const pool = await Zoomies.api(`pools/${id}/${act}`, {method: "POST"});
    Zoomies.upsertRow(tbody, id, row(pool));
  };
})();
