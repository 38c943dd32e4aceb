// Settings, for admins: the machine providers (a connection test, a Proxmox provider's
// settings changed in place, removal) and Proxmox onboarding: start a setup, show the one
// command the cluster's root runs, wait for its enrollment, ask the cluster (on the server,
// with the staged token) what it holds, and save. The page never sees the token.
"use strict";
(function () {
  const {esc, api} = Zoomies;
  const list = document.querySelector("#provider-list tbody");
  const testLine = document.getElementById("provider-test");
  const start = document.getElementById("proxmox-start");
  const enrollBox = document.getElementById("proxmox-enroll");
  const statusLine = document.getElementById("proxmox-status");
  const form = document.getElementById("proxmox-settings");
  const errorsLine = document.getElementById("proxmox-errors");
  const privilegesLine = document.getElementById("proxmox-privileges");
  const WAIT_MS = 2000;
  let providers = {};   // id -> the provider as GET /api/v1/providers shows it
  let setup = null;     // the setup being walked: {id, name}
  let editing = null;   // or the saved provider whose settings the form changes
  let waitTimer = null;

  function state(p) {
    if (!p.enabled) return '<span class="badge paused">disabled</span>';
    if (p.down_since) {
      return `<span class="badge failed">unreachable</span> <small>${esc(p.last_error)}</small>`;
    }
    return '<span class="badge healthy">enabled</span>';
  }

  function row(p) {
    const edit = p.kind === "proxmox" ? ' <button type="button" data-act="edit">Edit settings</button>' : "";
    return `<tr data-id="${p.id}"><td data-label="Name">${esc(p.name)}</td>` +
      `<td data-label="Kind">${esc(p.kind)}</td>` +
      `<td data-label="Pools">${esc((p.pools || []).join(", ") || "none")}</td>` +
      `<td data-label="Machines at most">${esc(p.max_machines)} <small>(${esc(p.max_per_pool)} a pool)</small></td>` +
      `<td data-label="Status">${state(p)}</td>` +
      `<td class="actions"><button type="button" data-act="test">Test connection</button>${edit} ` +
      '<button type="button" data-act="remove">Remove</button></td></tr>';
  }

  async function loadProviders() {
    const page = await api("providers?limit=500");
    providers = Object.fromEntries(page.results.map((p) => [p.id, p]));
    list.innerHTML = page.results.length ? page.results.map(row).join("")
      : '<tr><td colspan="6" class="muted">No provider yet: nothing is rented.</td></tr>';
  }

  function options(select, rows, value, label, chosen) {
    select.innerHTML = rows.map((r) => `<option value="${esc(value(r))}"` +
      `${(chosen || []).includes(value(r)) ? " selected" : ""}>${esc(label(r))}</option>`).join("");
  }

  async function loadPools(chosen) {
    const page = await api("pools?limit=500");
    options(form.elements.pools, page.results, (p) => p.name, (p) => p.name, chosen);
  }

  function fillDiscovery(found) {
    const fill = (id, rows, value, label) => {
      document.getElementById(id).innerHTML = rows.map((r) =>
        `<option value="${esc(value(r))}">${esc(label(r))}</option>`).join("");
    };
    fill("proxmox-templates", found.templates, (t) => t.vmid, (t) => `${t.name} on ${t.node}`);
    fill("proxmox-pools", found.pools, (p) => p.pool, (p) => p.comment || p.pool);
    const images = found.storages.filter((s) => s.content.split(",").includes("images"));
    const unique = [...new Map(images.map((s) => [s.storage, s])).values()];
    fill("proxmox-storages", unique, (s) => s.storage, (s) => s.shared ? "shared" : s.node);
    options(form.elements.nodes, found.nodes, (n) => n.node,
      (n) => `${n.node} (${n.status}, ${Math.round((n.maxmem - n.mem) / 1048576)} MB free)`);
    if (found.templates.length === 1) form.elements.template.value = found.templates[0].vmid;
    if (found.pools.length === 1) form.elements.pool.value = found.pools[0].pool;
    privilegesLine.hidden = !found.missing_privileges.length;
    privilegesLine.textContent = `The token lacks ${found.missing_privileges.join(", ")}: ` +
      "a provider saved now fails its creates until the role on the cluster grants them.";
  }

  function selected(select) {
    return [...select.selectedOptions].map((o) => o.value);
  }

  function collect() {
    const f = form.elements;
    const config = {
      template: Number(f.template.value), cores: Number(f.cores.value),
      memory_mb: Number(f.memory_mb.value), full_clone: f.full_clone.checked,
    };
    for (const name of ["pool", "storage", "bridge", "ciuser", "ipconfig", "nameserver",
      "searchdomain", "cicustom"]) {
      if (f[name].value.trim()) config[name] = f[name].value.trim();
    }
    const nodes = selected(f.nodes);
    if (nodes.length) config.nodes = nodes;
    const keys = f.ssh_keys.value.split("\n").map((k) => k.trim()).filter(Boolean);
    if (keys.length) config.ssh_keys = keys;
    return {
      pools: selected(f.pools), max_machines: Number(f.max_machines.value),
      max_per_pool: Number(f.max_per_pool.value),
      slots_per_machine: Number(f.slots_per_machine.value), config,
    };
  }

  function showErrors(err) {
    const fields = err.data && !err.data.detail ? Object.entries(err.data) : [];
    errorsLine.textContent = fields.length
      ? fields.map(([field, messages]) => `${field}: ${[].concat(messages).join(" ")}`).join("; ")
      : err.message;
    errorsLine.hidden = false;
  }

  function reset() {
    clearTimeout(waitTimer);
    setup = null;
    editing = null;
    form.hidden = true;
    enrollBox.hidden = true;
    errorsLine.hidden = true;
    privilegesLine.hidden = true;
    form.reset();
    start.hidden = false;
  }

  async function discover() {
    statusLine.textContent = "Enrolled. Asking the cluster what it holds…";
    try {
      fillDiscovery(await api(`provider-setups/${setup.id}/discover`, {method: "POST"}));
    } catch (err) {
      const why = err.data && err.data.reason ? ` (${err.data.reason})` : "";
      statusLine.innerHTML = `The cluster could not be asked${esc(why)}: ${esc(err.message)} ` +
        '<button type="button" id="proxmox-retry">Ask again</button>';
      document.getElementById("proxmox-retry").addEventListener("click", discover);
      return;
    }
    await loadPools([]);
    statusLine.textContent = `Enrolled from ${setup.endpoint}. Choose what to rent, then save.`;
    form.querySelector("button[type=submit]").textContent = `Save ${setup.name}`;
    form.hidden = false;
  }

  async function waitForEnrollment() {
    let shown;
    try {
      shown = await api(`provider-setups/${setup.id}`);
    } catch (err) {
      if (err.status === 404) {
        statusLine.textContent = "This setup expired before the cluster enrolled: start another.";
        start.hidden = false;
        return;
      }
      waitTimer = setTimeout(waitForEnrollment, WAIT_MS * 2);  // the controller restarting
      return;
    }
    if (!shown.ready) {
      waitTimer = setTimeout(waitForEnrollment, WAIT_MS);
      return;
    }
    setup.endpoint = shown.endpoint;
    await discover();
  }

  start.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = start.querySelector("button");
    button.disabled = true;
    try {
      const started = await api("provider-setups", {
        method: "POST", body: JSON.stringify({name: start.elements.name.value.trim()}),
      });
      reset();
      setup = {id: started.id, name: started.name};
      document.getElementById("proxmox-command").textContent = started.command;
      document.getElementById("proxmox-expires").textContent = new Date(started.expires_at).toLocaleTimeString();
      statusLine.textContent = "Waiting for the cluster to run it…";
      start.hidden = true;
      enrollBox.hidden = false;
      waitTimer = setTimeout(waitForEnrollment, WAIT_MS);
    } catch (err) {
      const name = err.data && err.data.name ? err.data.name.join(" ") : err.message;
      alert(`No setup was started: ${name}`);
    } finally {
      button.disabled = false;
    }
  });

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    errorsLine.hidden = true;
    const values = collect();
    try {
      if (editing) {
        await api(`providers/${editing.id}`, {method: "PATCH", body: JSON.stringify(values)});
        testLine.textContent = `${editing.name}: settings saved.`;
      } else {
        await api("providers", {method: "POST", body: JSON.stringify(
          {...values, kind: "proxmox", name: setup.name, setup: setup.id})});
        testLine.textContent = `${setup.name} saved: it rents machines when queued jobs find no room.`;
      }
    } catch (err) {
      showErrors(err);
      return;
    }
    reset();
    await loadProviders();
  });
  document.getElementById("proxmox-cancel").addEventListener("click", reset);

  async function edit(provider) {
    reset();
    editing = provider;
    const c = provider.config || {};
    const f = form.elements;
    for (const name of ["template", "pool", "storage", "bridge", "ciuser", "cores", "memory_mb",
      "ipconfig", "nameserver", "searchdomain", "cicustom"]) {
      if (c[name] !== undefined) f[name].value = c[name];
    }
    f.full_clone.checked = Boolean(c.full_clone);
    f.ssh_keys.value = (c.ssh_keys || []).join("\n");
    options(f.nodes, (c.nodes || []).map((n) => ({node: n})), (n) => n.node, (n) => n.node, c.nodes);
    for (const name of ["max_machines", "max_per_pool", "slots_per_machine"]) f[name].value = provider[name];
    await loadPools(provider.pools);
    form.querySelector("button[type=submit]").textContent = `Save ${provider.name}'s settings`;
    start.hidden = true;
    form.hidden = false;
  }

  Zoomies.act = async (act, id) => {
    const provider = providers[id];
    if (act === "edit") return edit(provider);
    if (act === "remove") {
      if (!confirm(`Remove provider ${provider.name}? Only a provider with no machine left can be.`)) return;
      await api(`providers/${id}`, {method: "DELETE"});
      return loadProviders();
    }
    testLine.textContent = `Asking ${provider.name}…`;
    try {
      const answer = await api(`providers/${id}/test`, {method: "POST"});
      testLine.textContent = answer.ok ? `${provider.name}: ready to rent a machine.`
        : `${provider.name} could not rent a machine now: ${answer.findings.join("; ")}.`;
    } catch (err) {
      const why = err.data && err.data.reason ? ` (${err.data.reason})` : "";
      testLine.textContent = `${provider.name} could not be asked${why}: ${err.message}`;
    }
  };
  loadProviders().catch((err) => { list.innerHTML = `<tr><td colspan="6" class="error">${esc(err.message)}</td></tr>`; });
})();
