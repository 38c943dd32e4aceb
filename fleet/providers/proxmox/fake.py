"""A fake Proxmox VE cluster: a real HTTPS server as strict as the API (issue 24 item 3, FAKE-05).

Every request is checked against `api-subset.json` (the API's own description, shipped in
this package): an unknown parameter, a missing one, a wrong type or a value out of range is
answered 400 "Parameter verification failed." with the errors, as Proxmox answers, and the
log (`requests`) records each request and whether the schema refused it. Auth is an API
token (`PVEAPIToken=...`), and each call needs the privilege Proxmox asks for (403
"Permission check failed (path, priv)").

What makes it a hypervisor worth testing against: clone, start, stop and delete are tasks
that take time and can fail; a clone holds `lock: clone` on the new VM, and the template's
file lock while it starts, so parallel clones of one template can time out on it ("can't
lock file ... got timeout"); `/cluster/nextid` reserves nothing. On request it gives the
same id to several callers, loses an answer (the work done, the connection closed), holds
an answer past the client's timeout, hides a new clone for a while, lets a delete answer OK
while the VM stays, halts a guest on its first boot, and refuses a token a privilege.

`guests` (a fleet.providers.local.LocalProvider) makes it start a local agent process for a
VM when it starts, with the claim code its SMBIOS seed URL carries, so an end-to-end run has
a guest that joins. Run it alone with `python -m fleet.providers.proxmox.fake`.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import hashlib
import itertools
import json
import re
import ssl
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from fleet.providers.proxmox.schema import Schema, shipped

API = "/api2/json"
ALL_PRIVILEGES = frozenset({
    "VM.Audit", "VM.Clone", "VM.Allocate", "VM.Config.Cloudinit", "VM.Config.CPU",
    "VM.Config.Memory", "VM.Config.Network", "VM.Config.Options", "VM.Config.HWType",
    "VM.Config.Disk", "VM.PowerMgmt", "VM.GuestAgent.Audit", "VM.GuestAgent.Unrestricted",
    "Datastore.AllocateSpace",
    "Datastore.Audit", "Pool.Audit",
    "Pool.Allocate", "Sys.Audit", "Sys.Modify", "Permissions.Modify",
})  # fmt: skip
# Which privilege a config key needs (qemu-server's check_vm_modify_config_perm, abridged).
CONFIG_PRIVILEGE = {
    "cores": "VM.Config.CPU", "sockets": "VM.Config.CPU", "cpu": "VM.Config.CPU",
    "memory": "VM.Config.Memory", "balloon": "VM.Config.Memory",
    "ciuser": "VM.Config.Cloudinit", "sshkeys": "VM.Config.Cloudinit",
    "nameserver": "VM.Config.Cloudinit", "searchdomain": "VM.Config.Cloudinit",
    "cicustom": "VM.Config.Cloudinit", "cipassword": "VM.Config.Cloudinit",
    "smbios1": "VM.Config.HWType",
}  # fmt: skip
TOKEN = re.compile(r"^PVEAPIToken=(?P<id>[^=\s]+)=(?P<secret>\S+)$")
SEED = re.compile(r"ds=nocloud;s=(?P<url>\S+)")


class Answer(Exception):
    """An error answer: status, reason phrase, and the errors body for a 400."""

    def __init__(self, status: int, reason: str, errors: dict[str, str] | None = None):
        super().__init__(reason)
        self.status, self.reason, self.errors = status, reason, errors


@dataclass
class VM:
    vmid: int
    node: str
    name: str
    config: dict[str, str] = field(default_factory=dict)
    status: str = "stopped"
    template: bool = False
    pool: str = ""
    lock: str = ""
    started_at: float = 0.0
    hidden_for: int = 0  # resource listings still to leave it out of (a slow clone)
    halts: bool = False  # its guest powers off on its next boot
    joins_pool: str = ""  # the pool a clone in progress joins when it ends


@dataclass
class Task:
    upid: str
    node: str
    kind: str
    vmid: int
    user: str
    started: int
    status: str = "running"
    exitstatus: str = ""
    log: list[str] = field(default_factory=list)


@dataclass
class Faults:
    lose: list[tuple[str, str, bool]] = field(default_factory=list)  # method, path, after_task
    hang: list[tuple[str, str, float]] = field(default_factory=list)
    nextid_repeats: int = 0  # nextid answers the last id it gave again, this often
    lock_timeouts: int = 0  # clones refused on the template's lock, whatever the timing
    lying_deletes: int = 0
    failing_tasks: list[tuple[str, str]] = field(default_factory=list)  # (kind, message)
    hide_next_clone: int = 0  # the next clone is invisible for this many listings
    halt_first_boot: bool = False


class FakeProxmox:
    """The cluster's state and its API, over whatever transport calls `handle`."""

    def __init__(
        self,
        *,
        nodes: dict[str, int] | None = None,  # name -> memory in MiB
        token: str = "zoomies@pve!ctl",  # noqa: S107  # a fake cluster's own token
        secret: str = "5b1b7f9c-0d4e-4a8a-9e43-3f0c5f1e2a77",  # noqa: S107  # a fake's own
        task_seconds: float = 0.05,
        clone_seconds: float = 0.1,
        guest_agent_seconds: float = 0.0,
        schema: Schema | None = None,
        guests: Any = None,
    ) -> None:
        self.schema = schema or shipped()
        self.nodes = {n: m for n, m in (nodes or {"pve": 65536}).items()}
        self.node_down: set[str] = set()
        self.tokens = {token: (secret, set(ALL_PRIVILEGES))}
        self.vms: dict[int, VM] = {}
        self.pools: dict[str, str] = {"zoomies": "runner hosts"}
        self.storages = {"local": "iso,vztmpl,backup,snippets", "local-lvm": "images,rootdir"}
        self.tasks: dict[str, Task] = {}
        self.task_seconds = task_seconds
        self.clone_seconds = clone_seconds
        self.guest_agent_seconds = guest_agent_seconds
        self.faults = Faults()
        self.requests: list[dict[str, Any]] = []
        self.guests = guests
        self._lock = threading.RLock()
        self._file_locks: dict[int, float] = {}  # template vmid -> held until (monotonic)
        self._pids = itertools.count(0x1A2B00)
        self._last_nextid = 0
        self._at_once = 0
        self.most_at_once = 0
        first = next(iter(self.nodes))
        self.add_vm(9000, node=first, name="runner-template", template=True, pool="",
                    config={"cores": "2", "memory": "2048", "ide2": "local-lvm:cloudinit",
                            "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0",
                            "scsi0": "local-lvm:base-9000-disk-0,size=8G"})  # fmt: skip

    # -- the cluster, for tests --------------------------------------------------------------

    def add_vm(self, vmid: int, *, node: str = "", name: str, template: bool = False,
               pool: str = "", tags: str = "", status: str = "stopped",
               config: dict[str, str] | None = None) -> VM:  # fmt: skip
        with self._lock:
            vm = VM(vmid, node or next(iter(self.nodes)), name, dict(config or {}), status,
                    template, pool)  # fmt: skip
            vm.config["name"] = name
            if tags:
                vm.config["tags"] = tags
            if template:
                vm.config["template"] = "1"
            self.vms[vmid] = vm
            return vm

    def vm_named(self, name: str) -> VM | None:
        with self._lock:
            return next((v for v in self.vms.values() if v.name == name), None)

    def remove_named(self, name: str) -> None:
        with self._lock:
            for vmid in [v.vmid for v in self.vms.values() if v.name == name]:
                self._destroy(self.vms[vmid])

    def add_token(self, token_id: str, secret: str, privileges: set[str]) -> None:
        """A token as `pveum user token add` makes it, holding what its ACLs grant."""
        with self._lock:
            self.tokens[token_id] = (secret, set(privileges))

    def refuse_privilege(self, privilege: str, token: str = "") -> None:
        with self._lock:
            self.tokens[token or next(iter(self.tokens))][1].discard(privilege)

    def lose_next(self, method: str, path: str, *, after_task: bool = False) -> None:
        """The next `method` whose path matches the regex `path` is carried out, and its
        answer lost (the connection closed with no response); with `after_task`, only once
        the task it started has ended (the work done, then the answer lost)."""
        self.faults.lose.append((method, path, after_task))

    def hang_next(self, method: str, path: str, seconds: float) -> None:
        """The next matching request is carried out and answered after `seconds`."""
        self.faults.hang.append((method, path, seconds))

    @contextmanager
    def counting(self) -> Iterator[None]:
        """Counts requests being served at once (`most_at_once`: the client's bound seen)."""
        with self._lock:
            self._at_once += 1
            self.most_at_once = max(self.most_at_once, self._at_once)
        try:
            yield
        finally:
            with self._lock:
                self._at_once -= 1

    def wait_task(self, upid: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.tasks[upid].status != "stopped" and time.monotonic() < deadline:
            time.sleep(0.01)

    def refused_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["schema_errors"]]

    def count(self, method: str, path: str) -> int:
        return sum(1 for r in self.requests if r["method"] == method and re.search(path, r["path"]))

    # -- the wire ------------------------------------------------------------------------------

    def handle(self, method: str, path: str, params: dict[str, str], auth: str) -> tuple[
        int, str, Any, str
    ]:  # fmt: skip
        """One request: (status, reason, data or errors, fault) where fault is "" or
        "lose" (close without answering) or "hang:<seconds>"."""
        entry: dict[str, Any] = {"method": method, "path": path, "params": dict(params),
                                 "schema_errors": {}, "status": 0}  # fmt: skip
        with self._lock:
            self.requests.append(entry)
        fault = self._fault(method, path)
        try:
            user = self._authenticate(auth)
            relative = path.removeprefix(API)
            operation = self.schema.operation(method, relative)
            if operation is None:
                if not self.schema.known_path(relative):
                    raise Answer(501, f"Method '{method} {relative}' not implemented")
                raise Answer(501, f"Method '{method} {relative}' not implemented")
            errors = self.schema.check(operation, params)
            if errors:
                entry["schema_errors"] = errors
                raise Answer(400, "Parameter verification failed.", errors)
            merged = {**params, **operation.path_params}
            data = self._route(method, operation.template, merged, user)
            entry["status"] = 200
            return 200, "OK", data, fault
        except Answer as answer:
            entry["status"] = answer.status
            return (
                answer.status,
                answer.reason,
                answer.errors,
                fault if answer.status != 401 else "",
            )

    def _fault(self, method: str, path: str) -> str:
        with self._lock:
            for i, (m, pattern, after_task) in enumerate(self.faults.lose):
                if m == method and re.search(pattern, path):
                    del self.faults.lose[i]
                    return "lose-after-task" if after_task else "lose"
            for i, (m, pattern, seconds) in enumerate(self.faults.hang):
                if m == method and re.search(pattern, path):
                    del self.faults.hang[i]
                    return f"hang:{seconds}"
        return ""

    def _authenticate(self, auth: str) -> str:
        found = TOKEN.match(auth or "")
        held = self.tokens.get(found["id"]) if found else None
        if found is None or held is None or held[0] != found["secret"]:
            raise Answer(401, "authentication failure")
        return found["id"]

    def _need(self, user: str, path: str, privilege: str) -> None:
        if privilege not in self.tokens[user][1]:
            raise Answer(403, f"Permission check failed ({path}, {privilege})")

    def _need_any(self, user: str, path: str, privileges: tuple[str, ...]) -> None:
        if not set(privileges) & self.tokens[user][1]:
            raise Answer(403, f"Permission check failed ({path}, {'|'.join(privileges)})")

    # -- the API -------------------------------------------------------------------------------

    def _route(self, method: str, template: str, p: dict[str, str], user: str) -> Any:
        with self._lock:
            key = f"{method} {template}"
            if key == "GET /version":
                return {"version": "9.0.10", "release": "9.0", "repoid": "fake"}
            if key == "GET /cluster/resources":
                return self._resources(p.get("type"), self.tokens[user][1])
            if key == "GET /cluster/nextid":
                return self._nextid(p.get("vmid"))
            if key == "GET /nodes":
                return [self._node_entry(n) for n in self.nodes]
            if key == "GET /access/permissions":
                return {"/": {priv: 1 for priv in sorted(self.tokens[user][1])}}
            if key == "GET /pools/{poolid}":
                return self._pool(p["poolid"])
            if key == "GET /pools":
                return [{"poolid": name, "comment": c} for name, c in sorted(self.pools.items())]
            if template.startswith("/nodes/{node}"):
                node = p["node"]
                if node not in self.nodes:
                    raise Answer(500, f"hostname lookup '{node}' failed - no such node")
                if node in self.node_down:
                    raise Answer(595, f"Connection refused (node '{node}')")
                return self._node_route(key, template, p, user)
            raise Answer(501, f"Method '{key}' not implemented by the fake")

    def _node_route(self, key: str, template: str, p: dict[str, str], user: str) -> Any:
        node = p["node"]
        if key == "GET /nodes/{node}/status":
            return {"memory": {"total": self.nodes[node] * 1024 * 1024}, "uptime": 1000}
        if key == "GET /nodes/{node}/tasks/{upid}/status":
            task = self._task(p["upid"])
            return {"upid": task.upid, "node": task.node, "status": task.status,
                    "type": task.kind, "id": str(task.vmid), "user": task.user,
                    "pid": 1, "pstart": 1, "starttime": task.started,
                    **({"exitstatus": task.exitstatus} if task.status == "stopped"
                       else {})}  # fmt: skip
        if key == "GET /nodes/{node}/tasks/{upid}/log":
            return [{"n": i + 1, "t": line} for i, line in enumerate(self._task(p["upid"]).log)]
        if key == "GET /nodes/{node}/qemu":
            return [self._vm_entry(v) for v in self.vms.values() if v.node == node]
        vmid = int(p["vmid"])
        if key == "POST /nodes/{node}/qemu/{vmid}/clone":
            return self._clone(p, user)
        vm = self._vm(node, vmid)
        where = f"/vms/{vmid}"
        if key == "GET /nodes/{node}/qemu/{vmid}/config":
            self._need(user, where, "VM.Audit")
            # Proxmox's digest is a SHA-1 of the config file: a version stamp, not security.
            digest = hashlib.sha1(json.dumps(vm.config, sort_keys=True).encode())  # noqa: S324
            return {**vm.config, **({"lock": vm.lock} if vm.lock else {}),
                    "digest": digest.hexdigest()}  # fmt: skip
        if key == "GET /nodes/{node}/qemu/{vmid}/status/current":
            self._need(user, where, "VM.Audit")
            return {**self._vm_entry(vm), "qmpstatus": vm.status,
                    **({"agent": 1} if _enabled(vm.config.get("agent", "0")) else {})}  # fmt: skip
        if key in ("POST /nodes/{node}/qemu/{vmid}/config", "PUT /nodes/{node}/qemu/{vmid}/config"):
            return self._config(vm, p, user, key.startswith("POST"))
        if key == "POST /nodes/{node}/qemu/{vmid}/status/start":
            self._need(user, where, "VM.PowerMgmt")
            self._unlocked(vm)
            return self._task_for(vm, "qmstart", user, self.task_seconds, self._started)
        if key in ("POST /nodes/{node}/qemu/{vmid}/status/stop",
                   "POST /nodes/{node}/qemu/{vmid}/status/shutdown"):  # fmt: skip
            self._need(user, where, "VM.PowerMgmt")
            self._unlocked(vm)
            return self._task_for(vm, "qmstop", user, self.task_seconds, self._stopped)
        if key == "DELETE /nodes/{node}/qemu/{vmid}":
            self._need(user, where, "VM.Allocate")
            self._unlocked(vm)
            if vm.status == "running":
                raise Answer(500, f"VM {vmid} is running - destroy failed")
            return self._task_for(vm, "qmdestroy", user, self.task_seconds, self._deleted)
        if key in ("POST /nodes/{node}/qemu/{vmid}/agent/ping",
                   "GET /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces"):  # fmt: skip
            # PVE 9 (qemu-server's agent API): either guest-agent privilege will do.
            self._need_any(user, where, ("VM.GuestAgent.Audit", "VM.GuestAgent.Unrestricted"))
            up = vm.status == "running" and _enabled(vm.config.get("agent", "0"))
            if not up or time.monotonic() - vm.started_at < self.guest_agent_seconds:
                raise Answer(500, "QEMU guest agent is not running")
            if key.endswith("ping"):
                return None
            return {"result": [
                {"name": "lo", "ip-addresses": [{"ip-address": "127.0.0.1",
                                                 "ip-address-type": "ipv4", "prefix": 8}]},
                {"name": "eth0", "ip-addresses": [{"ip-address": _guest_address(vmid),
                                                   "ip-address-type": "ipv4", "prefix": 24}]},
            ]}  # fmt: skip
        raise Answer(501, f"Method '{key}' not implemented by the fake")

    def _resources(self, kind: str | None, held: set[str]) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        if kind in (None, "node"):  # a node's figures only with Sys.Audit (Cluster.pm)
            stats = ("maxmem", "mem", "maxcpu", "cpu")
            found += [{k: v for k, v in self._node_entry(n).items()
                       if "Sys.Audit" in held or k not in stats} for n in self.nodes]  # fmt: skip
        if kind in (None, "storage") and "Datastore.Audit" in held:
            found += [{"id": f"storage/{n}/{sid}", "type": "storage", "node": n, "storage": sid,
                       "content": content, "status": "available", "shared": 0}
                      for n in self.nodes for sid, content in self.storages.items()]  # fmt: skip
        if kind in (None, "vm"):
            for vm in list(self.vms.values()):
                if vm.hidden_for:
                    vm.hidden_for -= 1
                    continue
                found.append(self._vm_entry(vm))
        return found

    def _node_entry(self, node: str) -> dict[str, Any]:
        used = sum(int(_memory(v.config)) for v in self.vms.values()
                   if v.node == node and v.status == "running")  # fmt: skip
        return {"id": f"node/{node}", "type": "node", "node": node,
                "status": "offline" if node in self.node_down else "online",
                "maxmem": self.nodes[node] * 1024 * 1024, "mem": used * 1024 * 1024,
                "maxcpu": 16, "cpu": 0.05}  # fmt: skip

    def _vm_entry(self, vm: VM) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "id": f"qemu/{vm.vmid}", "type": "qemu", "vmid": vm.vmid, "node": vm.node,
            "name": vm.name, "status": vm.status, "template": 1 if vm.template else 0,
            "maxmem": int(_memory(vm.config)) * 1024 * 1024,
            "maxcpu": int(vm.config.get("cores", 1)),
            "uptime": int(time.monotonic() - vm.started_at) if vm.status == "running" else 0,
        }  # fmt: skip
        if vm.config.get("tags"):
            entry["tags"] = vm.config["tags"]
        if vm.pool:
            entry["pool"] = vm.pool
        if vm.lock:
            entry["lock"] = vm.lock
        return entry

    def _pool(self, poolid: str) -> dict[str, Any]:
        if poolid not in self.pools:
            raise Answer(500, f"pool '{poolid}' does not exist")
        members = [self._vm_entry(v) for v in self.vms.values() if v.pool == poolid]
        return {"poolid": poolid, "comment": self.pools[poolid], "members": members}

    def _nextid(self, asked: str | None) -> int:
        if asked is not None:
            if int(asked) in self.vms:
                raise Answer(400, "Parameter verification failed.",
                             {"vmid": f"VM {asked} already exists"})  # fmt: skip
            return int(asked)
        if self.faults.nextid_repeats and self._last_nextid:
            self.faults.nextid_repeats -= 1
            return self._last_nextid  # proposed again, though someone may have taken it
        vmid = 100
        while vmid in self.vms:
            vmid += 1
        self._last_nextid = vmid
        return vmid

    def _vm(self, node: str, vmid: int) -> VM:
        vm = self.vms.get(vmid)
        if vm is None or vm.node != node or vm.hidden_for:
            raise Answer(500, f"Configuration file 'nodes/{node}/qemu-server/{vmid}.conf' "
                              "does not exist")  # fmt: skip
        return vm

    def _unlocked(self, vm: VM) -> None:
        if vm.lock:
            raise Answer(500, f"VM is locked ({vm.lock})")

    def _clone(self, p: dict[str, str], user: str) -> str:
        node, source_id, newid = p["node"], int(p["vmid"]), int(p["newid"])
        source = self._vm(node, source_id)
        self._need(user, f"/vms/{source_id}", "VM.Clone")
        self._need(user, f"/vms/{newid}", "VM.Allocate")
        if p.get("pool"):
            self._need(user, f"/pool/{p['pool']}", "VM.Allocate")
            if p["pool"] not in self.pools:
                raise Answer(500, f"pool '{p['pool']}' does not exist")
        full = _enabled(p.get("full", "0")) or not source.template
        if full and p.get("storage"):
            self._need(user, f"/storage/{p['storage']}", "Datastore.AllocateSpace")
        target = p.get("target", node)
        if target not in self.nodes:
            raise Answer(500, f"no such cluster node '{target}'")
        self._template_lock(source_id)
        if newid in self.vms:
            raise Answer(500, f"unable to create VM {newid}: config file already exists")
        config = {k: v for k, v in source.config.items() if k not in ("template", "tags")}
        # A clone gets a system UUID of its own (qemu-server: "auto generate a new uuid").
        config["smbios1"] = f"uuid={uuid.UUID(int=newid)}"
        if "net0" in config:  # a clone gets its own MAC
            config["net0"] = re.sub(r"=([0-9A-F:]{17})", f"=BC:24:11:{newid % 256:02X}:00:02",
                                    config["net0"])  # fmt: skip
        name = p.get("name", f"Copy-of-VM-{source.name}")
        # The clone joins its pool only when its worker ends (qemu-server: add_vm_to_pool
        # after the copy), so a clone in progress is in no pool.
        vm = self.add_vm(newid, node=target, name=name, pool="", config=config)
        vm.joins_pool = p.get("pool", "")
        vm.lock = "clone"
        vm.halts = self.faults.halt_first_boot
        if self.faults.hide_next_clone:
            vm.hidden_for, self.faults.hide_next_clone = self.faults.hide_next_clone, 0
        # The clone holds its source's config lock until it ends (qemu-server's clone_vm).
        self._file_locks[source_id] = time.monotonic() + self.clone_seconds
        return self._task_for(vm, "qmclone", user, self.clone_seconds, self._cloned,
                              task_vmid=source_id)  # fmt: skip

    def _template_lock(self, source_id: int) -> None:
        """Proxmox takes the source's config lock with a short timeout: a clone of the same
        template that still holds it makes this one fail (qemu-server's lock_config_full)."""
        if self.faults.lock_timeouts:
            self.faults.lock_timeouts -= 1
            raise _lock_timeout(source_id)
        held_until = self._file_locks.get(source_id, 0.0)
        waited = time.monotonic() + 1.0  # the lock's timeout
        while time.monotonic() < held_until:
            if time.monotonic() >= waited:
                raise _lock_timeout(source_id)
            self._lock.release()
            try:
                time.sleep(0.02)
            finally:
                self._lock.acquire()
            held_until = self._file_locks.get(source_id, 0.0)

    def _config(self, vm: VM, p: dict[str, str], user: str, asynchronous: bool) -> Any:
        control = ("node", "vmid", "digest", "background_delay", "skiplock")
        changes = {k: v for k, v in p.items() if k not in control}
        for key in changes:
            stem = re.sub(r"\d+$", "", key)
            privilege = CONFIG_PRIVILEGE.get(key) or {
                "ipconfig": "VM.Config.Cloudinit", "net": "VM.Config.Network",
            }.get(stem, "VM.Config.Options")  # fmt: skip
            if privilege == "VM.Config.Cloudinit":
                # qemu-server's check_vm_modify_config_perm: a cloud-init key or an ipconfigN
                # is allowed by either of the two.
                self._need_any(user, f"/vms/{vm.vmid}",
                               ("VM.Config.Cloudinit", "VM.Config.Network"))  # fmt: skip
                continue
            self._need(user, f"/vms/{vm.vmid}", privilege)
        self._unlocked(vm)
        for key in (changes.pop("delete", "") or "").split(","):
            vm.config.pop(key.strip(), None)
        vm.config.update(changes)
        if "name" in changes:
            vm.name = changes["name"]
        if asynchronous:
            return self._task_for(vm, "qmconfig", user, self.task_seconds, lambda v: None)
        return None

    # -- tasks ---------------------------------------------------------------------------------

    def _task(self, upid: str) -> Task:
        task = self.tasks.get(upid)
        if task is None:
            raise Answer(500, f"no such task '{upid}'")
        return task

    def _task_for(self, vm: VM, kind: str, user: str, seconds: float, done: Any,
                  task_vmid: int | None = None) -> str:  # fmt: skip
        started = int(time.time())
        vmid = vm.vmid if task_vmid is None else task_vmid
        upid = f"UPID:{vm.node}:{next(self._pids):08X}:0012D687:{started:08X}:{kind}:{vmid}:{user}:"
        task = Task(upid, vm.node, kind, vmid, user, started)
        self.tasks[upid] = task
        failure = next((m for k, m in self.faults.failing_tasks if k == kind), None)
        if failure is not None:
            self.faults.failing_tasks.remove((kind, failure))

        def run() -> None:
            time.sleep(seconds)
            with self._lock:
                try:
                    if failure is not None:
                        raise Answer(500, failure)
                    done(vm)
                    task.exitstatus = "OK"
                except Answer as exc:
                    task.exitstatus = exc.reason
                    if kind == "qmclone":  # a failed clone leaves nothing behind
                        self.vms.pop(vm.vmid, None)
                task.log.append(f"TASK {task.exitstatus}")
                task.status = "stopped"

        threading.Thread(target=run, name=f"fake-pve-{kind}", daemon=True).start()
        return upid

    def _cloned(self, vm: VM) -> None:
        vm.lock = ""
        vm.pool, vm.joins_pool = vm.joins_pool, ""

    def _started(self, vm: VM) -> None:
        if vm.status == "running":
            raise Answer(500, f"VM {vm.vmid} already running")
        if vm.halts:  # the guest powers off at once (its first boot)
            vm.halts = False
            return
        vm.status, vm.started_at = "running", time.monotonic()
        if self.guests is not None:
            self._start_guest(vm)

    def _stopped(self, vm: VM) -> None:
        vm.status = "stopped"
        if self.guests is not None:
            self._stop_guest(vm)

    def _deleted(self, vm: VM) -> None:
        if self.faults.lying_deletes:
            self.faults.lying_deletes -= 1
            return  # answered OK; the VM stays
        self._destroy(vm)

    def _destroy(self, vm: VM) -> None:
        self.vms.pop(vm.vmid, None)
        if self.guests is not None:
            self._stop_guest(vm, delete=True)

    # -- guests: a local agent per running VM ----------------------------------------------------

    def seed_of(self, vm: VM) -> str:
        """The NoCloud seed URL in the VM's SMBIOS serial, or ""."""
        fields = dict(f.partition("=")[::2] for f in vm.config.get("smbios1", "").split(",") if f)
        serial = fields.get("serial", "")
        if _enabled(fields.get("base64", "0")):
            serial = base64.b64decode(serial).decode()
        found = SEED.search(serial)
        return found["url"] if found else ""

    def _start_guest(self, vm: VM) -> None:
        from fleet.providers.contract import MachineSpec, Mark  # noqa: PLC0415  # guests only

        seed = self.seed_of(vm)
        found = re.search(r"^(?P<controller>https?://[^/]+)/machines/seed/(?P<code>[^/]+)/", seed)
        if self.guests.inspect(vm.name) is not None:
            self.guests.start(vm.name)  # its agent kept its credentials: no code again
            return
        bootstrap = (
            {"controller_url": found["controller"], "claim_code": unquote(found["code"])}
            if found
            else {}
        )
        spec = MachineSpec(identity=vm.name, mark=Mark("fake-proxmox-guest"), bootstrap=bootstrap)
        threading.Thread(target=self.guests.create, args=(spec,), daemon=True).start()

    def _stop_guest(self, vm: VM, delete: bool = False) -> None:
        if self.guests.inspect(vm.name) is not None:
            (self.guests.delete if delete else self.guests.stop)(vm.name)


def _lock_timeout(vmid: int) -> Answer:
    return Answer(500, f"can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout")


def _guest_address(vmid: int) -> str:
    return f"10.0.{vmid // 250 % 250}.{vmid % 250 + 2}"


def _enabled(value: str) -> bool:
    first = (
        value.split(",")[0].partition("=")[2] if "=" in value.split(",")[0] else value.split(",")[0]
    )
    return first.strip().lower() in ("1", "true", "yes", "on")


def _memory(config: dict[str, str]) -> str:
    value = config.get("memory", "512").split(",")[0]
    return value.partition("=")[2] if "=" in value else value


# -- the transport: HTTPS ------------------------------------------------------------------------


@dataclass
class Certificates:
    ca_file: Path
    cert_file: Path
    key_file: Path
    fingerprint: str  # SHA-256 of the served certificate, colon-separated hex


def make_certificates(directory: Path, hostnames: tuple[str, ...] = ("localhost",)) -> Certificates:
    """A cluster CA (like pve-root-ca) and a node certificate it signs, for 127.0.0.1 too."""
    import ipaddress  # noqa: PLC0415  # only where TLS material is made

    from cryptography import x509  # noqa: PLC0415
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
    from cryptography.x509.oid import NameOID  # noqa: PLC0415

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Proxmox Virtual Environment")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(h) for h in hostnames]
    names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostnames[0])]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=700))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    paths = Certificates(directory / "pve-root-ca.pem", directory / "pve-ssl.pem",
                         directory / "pve-ssl.key", "")  # fmt: skip
    paths.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths.key_file.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))  # fmt: skip
    paths.key_file.chmod(0o600)
    digest = cert.fingerprint(hashes.SHA256()).hex().upper()
    paths.fingerprint = ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))
    return paths


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the fake's own log is `requests`

    def _serve(self) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        if body:
            if (self.headers.get("Content-Type") or "").startswith("application/json"):
                params.update({k: _json_wire(v) for k, v in json.loads(body).items()})
            else:
                params.update(parse_qsl(body.decode(), keep_blank_values=True))
        fake = self.server.fake
        with fake.counting():
            self._answer(fake, url.path, params)

    def _answer(self, fake: FakeProxmox, path: str, params: dict[str, str]) -> None:
        if path == "/_fake/log" and self.command == "GET":
            self._send(200, "OK", {"data": fake.requests})
            return
        status, reason, data, fault = fake.handle(
            self.command, unquote(path), params, self.headers.get("Authorization", "")
        )
        if fault.startswith("lose"):
            if fault == "lose-after-task" and isinstance(data, str) and data in fake.tasks:
                fake.wait_task(data)
            self.close_connection = True
            self.connection.shutdown(2)
            return
        if fault.startswith("hang:"):
            time.sleep(float(fault.split(":")[1]))
        if status == 200:
            payload: dict[str, Any] = {"data": data}
        else:
            payload = {"data": None, **({"errors": data} if data else {})}
        self._send(status, reason, payload)

    def _send(self, status: int, reason: str, payload: Any) -> None:
        raw = json.dumps(payload).encode()
        self.send_response(status, reason.replace("\n", " ").replace("\r", " "))
        self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = do_PUT = do_DELETE = _serve


def _json_wire(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: FakeProxmox


class FakeProxmoxServer:
    """`fake` served over HTTPS on 127.0.0.1. `pause()` closes the listener (the cluster
    cannot be reached) and `resume()` opens it again on the same port."""

    def __init__(
        self, fake: FakeProxmox, *, port: int = 0, certificates: Certificates | None = None
    ):
        self.fake = fake
        self.certificates = certificates or make_certificates(
            Path(tempfile.mkdtemp(prefix="fake-pve-"))
        )
        self.port = port
        self._server: _Server | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> FakeProxmoxServer:
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.fake = self.fake
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.certificates.cert_file, self.certificates.key_file)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, name="fake-pve", daemon=True).start()
        return self

    def pause(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    resume = start

    def stop(self) -> None:
        self.pause()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8006)
    parser.add_argument("--certs", type=Path, default=None, help="where to write the CA and cert")
    parser.add_argument("--node", action="append", default=[], help="NAME=MiB, repeatable")
    parser.add_argument("--clone-seconds", type=float, default=2.0)
    parser.add_argument("--task-seconds", type=float, default=0.5)
    args = parser.parse_args(argv)
    nodes = {n.split("=")[0]: int(n.split("=")[1]) for n in args.node} or None
    fake = FakeProxmox(
        nodes=nodes, clone_seconds=args.clone_seconds, task_seconds=args.task_seconds
    )
    certs = make_certificates(args.certs or Path(tempfile.mkdtemp(prefix="fake-pve-")))
    server = FakeProxmoxServer(fake, port=args.port, certificates=certs).start()
    token_id, (secret, _) = next(iter(fake.tokens.items()))
    print(json.dumps({"endpoint": server.url, "token": f"{token_id}={secret}",
                      "ca_file": str(certs.ca_file), "fingerprint": certs.fingerprint,
                      "template": 9000, "pool": "zoomies"}), flush=True)  # fmt: skip
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
