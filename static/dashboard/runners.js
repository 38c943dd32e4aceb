// Runners: live rows from "runner" frames; a finished runner leaves the live table.
"use strict";
(function () {
  const {esc} = Zoomies;
  const live = document.querySelector("#runners tbody");
  const finished = document.querySelector("#finished tbody");
  const TERMINAL = ["failed", "removed"];

  function liveRow(r) {
    const drain = Zoomies.canOperate
      ? `<td>${r.state === "draining" ? "" : '<button type="button" data-act="drain">Drain</button>'}</td>` : "";
    return `<tr data-id="${r.id}" data-name="${esc(r.name)}" data-state="${esc(r.state)}">` +
      `<td data-label="Name">${esc(r.name)}</td><td data-label="Pool">${esc(r.pool)}</td>` +
      `<td data-label="Host">${esc(r.host)}</td><td data-label="State"><span class="badge ${esc(r.state)}">` +
      `${esc(r.state)}</span>${r.phase ? ` <small>${esc(r.phase)}</small>` : ""}` +
      `${r.state === "idle" && !r.online_at ? " <small>not yet online at GitHub</small>" : ""}</td>` +
      `<td data-label="Since"><time datetime="${esc(r.state_changed_at)}">${esc(r.state_changed_at)}</time></td>` +
      `<td data-label="Message" class="message">${esc(r.message)}</td>${drain}</tr>`;
  }

  function finishedRow(r) {
    const output = r.has_output_tail ? ' <button type="button" data-act="output">Output</button>' : "";
    return `<tr data-id="${r.id}"><td data-label="Name">${esc(r.name)}</td><td data-label="Pool">${esc(r.pool)}</td>` +
      `<td data-label="Host">${esc(r.host)}</td><td data-label="State"><span class="badge ${esc(r.state)}">${esc(r.state)}</span></td>` +
      `<td data-label="Finished"><time datetime="${esc(r.finished_at)}">${esc(r.finished_at)}</time></td>` +
      `<td data-label="Why" class="message">${esc(r.message)}${output}</td></tr>`;
  }

  function show(id, r) {
    const done = r && TERMINAL.includes(r.state);
    Zoomies.upsertRow(live, id, r && !done ? liveRow(r) : null);
    Zoomies.upsertRow(finished, id, done ? finishedRow(r) : null);
    document.getElementById("runners-empty").hidden = live.children.length > 0;
  }

  Zoomies.on("runner", (frame) => show(frame.id, frame.object));

  Zoomies.poll = async () => {
    const page = await Zoomies.api("runners?limit=500");
    const seen = new Set(page.results.map((r) => String(r.id)));
    page.results.forEach((r) => show(r.id, r));
    [live, finished].forEach((tbody) => tbody.querySelectorAll("tr[data-id]").forEach((tr) => {
      if (!seen.has(tr.dataset.id)) tr.remove();
    }));
    document.getElementById("runners-empty").hidden = live.children.length > 0;
  };

  Zoomies.act = async (act, id) => {
    if (act === "drain") {
      // RUN-12: a busy runner is drained only once the operator has said so.
      const row = tbody.querySelector(`tr[data-id="${id}"]`);
      let ask = "";
      if (row && row.dataset.state === "busy") {
        if (!confirm(`Runner ${row.dataset.name} is running a job. Drain it? The job gets the drain grace, then the runner is stopped.`)) return;
        ask = "?confirm=true";
      }
      show(id, await Zoomies.api(`runners/${id}/drain${ask}`, {method: "POST"}));
    } else if (act === "output") {
      const r = await Zoomies.api(`runners/${id}`);
      document.getElementById("output-title").textContent = `${r.name}: ${r.message}`;
      document.getElementById("output-text").textContent = r.output_tail || "(no output kept)";
      document.getElementById("output").showModal();
    }
  };
})();
