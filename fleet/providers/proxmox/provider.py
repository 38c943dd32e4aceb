"""The Proxmox VE machine provider (issue 24 item 2, MACH-18).

A machine is a VM cloned from a template (linked or full, a setting) into our resource pool,
named by its identity, tagged with the controller's mark, on the node with the most free
memory among those with room (`/cluster/resources`); cloud-init gives it its user, SSH keys
and network, and its agent's claim code arrives without snippet storage: the SMBIOS serial
carries a NoCloud seed URL (`ds=nocloud;s=<controller>/machines/seed/<code>/`), which the
controller serves once. Then it is started. Every step is a task followed to its end.

Ownership is proved by the VM itself (MACH-16): its tags hold exactly one mark (a tag
starting with `mark_prefix`) and, when a pool is configured, it sits in that pool. A VM
with our name and anything less is reported with that mark (or none), so the lifecycle
quarantines it; start, stop and delete refuse to touch a VM that carries no mark.

Identities and VM ids: `/cluster/nextid` reserves nothing, so two callers can be given the
same id; the second clone fails ("already exists") and the id's owner is looked up before
another is chosen. A clone whose answer was lost is never repeated: the provider remembers
the id it asked for, and once that VM appears under our name and in our pool its next
inspect finishes the configuration the create could not (the tag first).
"""

from __future__ import annotations

import base64
import logging
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from fleet.providers.contract import (
    IDENTITY,
    MachineSpec,
    Mark,
    NotFound,
    Observed,
    OutcomeUnknown,
    Power,
    ProviderError,
    Refused,
)
from fleet.providers.proxmox.client import ApiError, Client, Endpoint, TaskFailed

log = logging.getLogger("zoomies.machines.proxmox")

# Aliases made before the class, whose `list` method would shadow the builtin inside it.
Resource = dict[str, Any]
Resources = list[Resource]
Names = list[str]

TAG_SEPARATORS = re.compile(r"[;, ]+")
MiB = 1024 * 1024
# The spec a check sizes its "is there room" question with; never created.
CHECK_MARK = Mark("zoomies-check")
# What the provider's token must hold (NOTES "The wire"): each is asked for by one call.
PRIVILEGES = (
    "VM.Audit",  # status, config, resources
    "VM.Clone",  # clone the template
    "VM.Allocate",  # the new VM, in the pool; its delete
    "VM.Config.Cloudinit",  # user, keys, network
    "VM.Config.CPU",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.Options",  # name, tags, agent
    "VM.Config.HWType",  # smbios1: the seed URL
    "VM.PowerMgmt",  # start, stop
    "VM.GuestAgent.Audit",  # the guest agent's ping and addresses (PVE 9)
    "Datastore.AllocateSpace",  # disks on the target storage
    "Datastore.Audit",  # the storages /cluster/resources lists (onboarding's discovery)
    "Pool.Audit",
    "Sys.Audit",  # a node's memory in /cluster/resources: without it, no room anywhere
)
# PVE 9 split VM.Monitor into the VM.GuestAgent.* privileges and dropped it (pve-devel,
# 2025-07, "privileges: drop VM.Monitor"): on PVE 8 the old name is what grants the same
# calls, and a role naming the new one cannot be made there.
PVE8_EQUIVALENT = {"VM.GuestAgent.Audit": "VM.Monitor"}
PRIVILEGES_PVE8 = tuple(PVE8_EQUIVALENT.get(p, p) for p in PRIVILEGES)


@dataclass(frozen=True)
class ProxmoxConfig:
    """What an operator configures for one Proxmox provider."""

    template: int  # the template's VM id
    pool: str = ""  # the resource pool our VMs go in (and ownership's second half)
    full_clone: bool = False
    storage: str = ""  # target storage of a full clone
    nodes: tuple[str, ...] = ()  # the nodes that may hold our VMs; empty: any online one
    cores: int = 2
    memory_mb: int = 2048
    bridge: str = ""  # net0's bridge; empty: the template's
    ipconfig: str = "ip=dhcp"
    ciuser: str = ""
    ssh_keys: tuple[str, ...] = ()
    nameserver: str = ""
    searchdomain: str = ""
    cicustom: str = ""  # where the operator has snippet storage, e.g. vendor=local:snippets/x
    seed_path: str = "/machines/seed/{claim_code}/"
    mark_prefix: str = "zoomies-"
    clone_attempts: int = 5  # ids taken under us, lock timeouts: each tried again this often
    lock_wait: float = 60.0  # a delete waits this long for a clone's lock to go

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> ProxmoxConfig:
        known = set(cls.__dataclass_fields__)
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"unknown Proxmox settings: {', '.join(sorted(unknown))}")
        values = dict(raw)
        for name in ("nodes", "ssh_keys"):
            if name in values:
                values[name] = tuple(values[name])
        return cls(**values)


@dataclass
class _Pending:
    """A clone whose answer was lost: the id asked for and what it still needs."""

    vmid: int
    node: str
    spec: MachineSpec = field(repr=False)


class ProxmoxProvider:
    def __init__(self, name: str, *, client: Client, config: ProxmoxConfig) -> None:
        self.name = name
        self.client = client
        self.config = config
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, name: str, raw: Mapping[str, Any]) -> ProxmoxProvider:
        """From a MachineProvider row's config: `endpoint`, `token` (or `token_file`),
        `ca_file`, `ca_pem` or `fingerprint`, the client's bounds, and the ProxmoxConfig
        fields. A sealed token is unsealed by the caller (capacity.machines), which knows
        the key; this module stays free of Django."""
        raw = dict(raw)
        token = raw.pop("token", "")
        token_file = raw.pop("token_file", "")
        if token_file:
            with open(token_file, encoding="utf-8") as handle:
                token = handle.read().strip()
        endpoint = Endpoint(
            url=raw.pop("endpoint"),
            token=token,
            ca_file=raw.pop("ca_file", ""),
            ca_pem=raw.pop("ca_pem", ""),
            fingerprint=raw.pop("fingerprint", ""),
            timeout=float(raw.pop("timeout", 30.0)),
        )
        client = Client(
            endpoint,
            name=name,
            max_in_flight=int(raw.pop("max_in_flight", 4)),
            clones_per_template=int(raw.pop("clones_per_template", 2)),
            task_wait=float(raw.pop("task_wait", 600.0)),
            poll_interval=float(raw.pop("poll_interval", 0.25)),
        )
        return cls(name, client=client, config=ProxmoxConfig.from_mapping(raw))

    # -- the contract --------------------------------------------------------------------

    def create(self, spec: MachineSpec) -> Observed:
        cfg = self.config
        with self.client.clone_slot(cfg.template):
            vms, nodes = self._resources()
            if any(v.get("name") == spec.identity for v in vms):
                raise Refused(f"a VM named {spec.identity} exists already")
            source = self._template(vms)
            node = self._node_with_room(nodes, spec)
            vmid = self._clone(spec, source, node)
        self._configure(spec, vmid, node)
        self._start(vmid, node)
        observed = self.inspect(spec.identity)
        if observed is None:
            raise OutcomeUnknown(f"{spec.identity} (VM {vmid}) vanished after its start")
        return observed

    def inspect(self, identity: str) -> Observed | None:
        vms, _ = self._resources()
        named = [v for v in vms if v.get("name") == identity and not v.get("template")]
        if not named:
            return None
        # Names are not unique in Proxmox: if any VM of this name is not provably ours,
        # report that one, so nothing acts on the name (MACH-16).
        named.sort(key=lambda v: self._mark(v) is not None)
        vm = named[0]
        vm = self._finish_pending(identity, vm)
        mark = self._mark(vm)
        power = self._power(vm)
        detail = f"VM {vm['vmid']} on {vm['node']}"
        if len(named) > 1:
            detail += f"; {len(named)} VMs share this name"
        address = ""
        if power == Power.RUNNING and mark is not None:
            address, guest = self._guest(vm)
            detail += f"; {guest}"
        return Observed(identity=identity, power=power, mark=mark, address=address, detail=detail)

    def list(self) -> list[Observed]:
        vms, _ = self._resources()
        found: list[Observed] = []
        for vm in vms:
            name = str(vm.get("name", ""))
            if vm.get("template") or not IDENTITY.match(name):
                continue
            mark = self._mark(vm)
            in_pool = bool(self.config.pool) and vm.get("pool") == self.config.pool
            if mark is not None or in_pool or self._mark_tags(vm):
                found.append(Observed(identity=name, power=self._power(vm), mark=mark,
                                      detail=f"VM {vm['vmid']} on {vm['node']}"))  # fmt: skip
        return found

    def start(self, identity: str) -> None:
        vm = self._ownable(identity)
        if vm.get("status") != "running":
            self._start(int(vm["vmid"]), str(vm["node"]))

    def stop(self, identity: str) -> None:
        vm = self._ownable(identity)
        if vm.get("status") == "running":
            self._stop(int(vm["vmid"]), str(vm["node"]))

    def delete(self, identity: str) -> None:
        """Stop, then delete with purge; returning proves nothing (MACH-09): the VM is gone
        only once an inspect cannot find it."""
        vm = self._ownable(identity)
        vmid, node = int(vm["vmid"]), str(vm["node"])
        vm = self._unlocked(identity, vm)
        if vm.get("status") == "running":
            self._stop(vmid, node)
        upid = self.client.delete(
            f"/nodes/{node}/qemu/{vmid}", purge=True, **{"destroy-unreferenced-disks": True}
        )
        self.client.wait_task(upid)
        with self._lock:
            self._pending.pop(identity, None)

    # -- beyond the contract ---------------------------------------------------------------

    def missing_privileges(self) -> Names:
        """The privileges the token lacks, by name (GET /access/permissions)."""
        return missing_privileges(self.client)

    def check(self) -> Names:
        """What would stop a create now, one sentence each; empty when nothing would (the
        Settings page's test of a saved provider). Reads only: three GETs."""
        cfg = self.config
        found = [f"the token lacks {p}" for p in self.missing_privileges()]
        everything = self.client.get("/cluster/resources") or []
        try:
            self._template([r for r in everything if r.get("type") == "qemu"])
        except Refused as exc:
            found.append(str(exc))
        if cfg.pool and cfg.pool not in {
            str(p.get("poolid")) for p in self.client.get("/pools") or []
        }:
            found.append(f"resource pool {cfg.pool} not found")
        storages = {str(r.get("storage")) for r in everything if r.get("type") == "storage"}
        if cfg.full_clone and cfg.storage and cfg.storage not in storages:
            found.append(f"storage {cfg.storage} not found")
        nodes = [r for r in everything if r.get("type") == "node"]
        try:
            self._node_with_room(nodes, MachineSpec(identity="zoomies-check", mark=CHECK_MARK))
        except Refused as exc:
            found.append(f"the cluster is full: {exc}")
        return found

    # -- the steps -------------------------------------------------------------------------

    def _resources(self) -> tuple[Resources, Resources]:
        everything = self.client.get("/cluster/resources") or []
        vms = [r for r in everything if r.get("type") == "qemu"]
        nodes = [r for r in everything if r.get("type") == "node"]
        return vms, nodes

    def _template(self, vms: Resources) -> dict[str, Any]:
        for vm in vms:
            if int(vm.get("vmid", 0)) == self.config.template:
                if not vm.get("template"):
                    raise Refused(f"VM {self.config.template} is not a template")
                return vm
        raise Refused(f"template {self.config.template} not found in the cluster")

    def _node_with_room(self, nodes: Resources, spec: MachineSpec) -> str:
        wanted = spec.size.get("memory_mb", self.config.memory_mb) * MiB
        allowed = set(self.config.nodes)
        online = [
            n for n in nodes
            if n.get("status") == "online" and (not allowed or n["node"] in allowed)
        ]  # fmt: skip
        free = {str(n["node"]): int(n.get("maxmem", 0)) - int(n.get("mem", 0)) for n in online}
        roomy = {n: f for n, f in free.items() if f >= wanted}
        if not roomy:
            # A token without Sys.Audit sees nodes without their memory (pve-manager's
            # Cluster.pm): say that, not "0 MiB free".
            blind = {str(n["node"]) for n in online if not n.get("maxmem")}
            seen = ", ".join(
                f"{n} memory not visible (does the token lack Sys.Audit?)" if n in blind
                else f"{n} {f // MiB} MiB free"
                for n, f in sorted(free.items())
            )  # fmt: skip
            raise Refused(f"no node has room for {wanted // MiB} MiB ({seen or 'no node online'})")
        return max(sorted(roomy), key=lambda n: roomy[n])

    def _clone(self, spec: MachineSpec, source: dict[str, Any], node: str) -> int:
        cfg = self.config
        source_node = str(source["node"])
        params: dict[str, Any] = {"name": spec.identity, "full": cfg.full_clone}
        if cfg.pool:
            params["pool"] = cfg.pool
        if cfg.full_clone and cfg.storage:
            params["storage"] = cfg.storage
        if node != source_node:
            params["target"] = node
        last: ProviderError | None = None
        for attempt in range(cfg.clone_attempts):
            vmid = int(self.client.get("/cluster/nextid"))
            try:
                upid = self.client.post(
                    f"/nodes/{source_node}/qemu/{cfg.template}/clone", newid=vmid, **params
                )
            except OutcomeUnknown:
                # Never clone again: remember the id; the VM it becomes is ours to finish.
                with self._lock:
                    self._pending[spec.identity] = _Pending(vmid, node, spec)
                raise
            except ApiError as exc:
                if _lock_timeout(exc) or _taken(exc):
                    last = exc
                    self._after_clash(vmid, spec, exc, attempt)
                    continue
                raise
            try:
                self.client.wait_task(upid)
            except TaskFailed as exc:
                if _lock_timeout(exc) or _taken(exc):
                    last = exc
                    self._after_clash(vmid, spec, exc, attempt)
                    continue
                raise
            except OutcomeUnknown:
                with self._lock:
                    self._pending[spec.identity] = _Pending(vmid, node, spec)
                raise
            return vmid
        raise Refused(f"no clone after {cfg.clone_attempts} attempts: {last}")

    def _after_clash(self, vmid: int, spec: MachineSpec, error: Exception, attempt: int) -> None:
        """Another caller took the id, or the template's lock timed out. Before another id
        is chosen, who owns this one? If it is a VM of our name, our own clone made it."""
        log.info("%s: clone of %s as VM %d: %s", self.name, spec.identity, vmid, error)
        vms, _ = self._resources()
        owner = next((v for v in vms if int(v.get("vmid", 0)) == vmid), None)
        if owner is not None and owner.get("name") == spec.identity:
            raise OutcomeUnknown(f"VM {vmid} carries our name {spec.identity} already")
        time.sleep(min(0.2 * (attempt + 1), 2.0))

    def _configure(self, spec: MachineSpec, vmid: int, node: str) -> None:
        try:
            self._apply_config(spec, vmid, node)
        except OutcomeUnknown:
            with self._lock:
                self._pending[spec.identity] = _Pending(vmid, node, spec)
            raise
        except ProviderError:
            # Refused: the clone stands untagged, so no sweep could ever prove it ours;
            # it is ours now (we made it in this call), so it goes now.
            self._discard(vmid, node)
            raise

    def _apply_config(self, spec: MachineSpec, vmid: int, node: str) -> None:
        cfg = self.config
        params: dict[str, Any] = {
            "tags": spec.mark.controller,
            "cores": spec.size.get("cpus", cfg.cores),
            "memory": spec.size.get("memory_mb", cfg.memory_mb),
            "agent": "1",
            "ipconfig0": cfg.ipconfig,
        }
        if cfg.bridge:
            params["net0"] = f"virtio,bridge={cfg.bridge}"
        for key, value in (
            ("ciuser", cfg.ciuser),
            ("nameserver", cfg.nameserver),
            ("searchdomain", cfg.searchdomain),
            ("cicustom", cfg.cicustom),
        ):
            if value:
                params[key] = value  # fmt: skip
        if cfg.ssh_keys:
            # Percent-encoded with spaces as %20 (what the API's `urlencoded` format wants).
            params["sshkeys"] = quote("\n".join(cfg.ssh_keys) + "\n", safe="")
        seed = self.seed_url(spec)
        if seed:
            serial = base64.b64encode(f"ds=nocloud;s={seed}".encode()).decode()
            # smbios1 is one value: keep the uuid PVE gave the clone, or every clone would
            # lose its own system UUID to this write.
            params["smbios1"] = f"{self._smbios_uuid(vmid, node)}serial={serial},base64=1"
        answer = self.client.post(f"/nodes/{node}/qemu/{vmid}/config", **params)
        if isinstance(answer, str) and answer.startswith("UPID:"):
            self.client.wait_task(answer)

    def _smbios_uuid(self, vmid: int, node: str) -> str:
        """The clone's `uuid=...,` field of smbios1 as PVE generated it, or ""."""
        current = self.client.get(f"/nodes/{node}/qemu/{vmid}/config") or {}
        for field_ in str(current.get("smbios1", "")).split(","):
            if field_.startswith("uuid="):
                return field_ + ","
        return ""

    def seed_url(self, spec: MachineSpec) -> str:
        """The NoCloud seed the guest's cloud-init reads its user-data from: the controller,
        behind the machine's single-use claim code. Empty when there is no code to give."""
        boot = spec.bootstrap
        if not boot.get("claim_code") or not boot.get("controller_url"):
            return ""
        path = self.config.seed_path.format(
            claim_code=quote(boot["claim_code"], safe=""), name=spec.identity
        )
        return boot["controller_url"].rstrip("/") + path

    def _discard(self, vmid: int, node: str) -> None:
        try:
            self.client.wait_task(self.client.delete(f"/nodes/{node}/qemu/{vmid}", purge=True))
        except ProviderError as exc:
            log.warning("%s: VM %d, made untagged, could not be removed: %s", self.name, vmid, exc)

    def _start(self, vmid: int, node: str) -> None:
        self.client.wait_task(self.client.post(f"/nodes/{node}/qemu/{vmid}/status/start"))

    def _stop(self, vmid: int, node: str) -> None:
        self.client.wait_task(self.client.post(f"/nodes/{node}/qemu/{vmid}/status/stop"))

    def _finish_pending(self, identity: str, vm: dict[str, Any]) -> dict[str, Any]:
        """A VM our lost clone made: once its clone is done, the configuration the create
        never applied (the tag first), then it is ours like any other. Only the id we asked
        for, under our name, in our pool and untagged qualifies."""
        with self._lock:
            pending = self._pending.get(identity)
        if pending is None or int(vm["vmid"]) != pending.vmid or self._mark_tags(vm):
            return vm
        if vm.get("lock") == "clone":
            # Still cloning: ours, busy. The mark is the one we asked for, and the pool the
            # one we asked for too: PVE adds a clone to its pool only as the clone ends
            # (qemu-server's clone worker), so a clone in progress is in none yet.
            return {**vm, "tags": pending.spec.mark.controller, "pool": self.config.pool}
        if self.config.pool and vm.get("pool") != self.config.pool:
            return vm
        if vm.get("lock"):
            return {**vm, "tags": pending.spec.mark.controller}
        self._apply_config(pending.spec, pending.vmid, str(vm["node"]))
        self._start(pending.vmid, str(vm["node"]))
        with self._lock:
            self._pending.pop(identity, None)
        refreshed = self._find(identity, pending.vmid)
        return refreshed or {**vm, "tags": pending.spec.mark.controller}

    def _find(self, identity: str, vmid: int) -> dict[str, Any] | None:
        vms, _ = self._resources()
        return next((v for v in vms if v.get("name") == identity and int(v["vmid"]) == vmid), None)

    def _mark_tags(self, vm: Mapping[str, Any]) -> Names:
        tags = TAG_SEPARATORS.split(str(vm.get("tags") or ""))
        return [t for t in tags if t.startswith(self.config.mark_prefix) and IDENTITY.match(t)]

    def _mark(self, vm: Mapping[str, Any]) -> Mark | None:
        marks = self._mark_tags(vm)
        if len(marks) != 1:
            return None  # no mark, or two controllers' marks: nobody's provably
        if self.config.pool and vm.get("pool") != self.config.pool:
            return None  # outside our pool: not ours, whatever its tag says
        return Mark(marks[0])

    @staticmethod
    def _power(vm: Mapping[str, Any]) -> Power:
        if vm.get("lock"):
            return Power.BUSY
        return {"running": Power.RUNNING, "stopped": Power.STOPPED}.get(
            str(vm.get("status")), Power.BUSY
        )

    def _guest(self, vm: Mapping[str, Any]) -> tuple[str, str]:
        """Readiness from the guest agent, where the VM has one: its address, and a line."""
        base = f"/nodes/{vm['node']}/qemu/{vm['vmid']}"
        current = self.client.get(f"{base}/status/current")
        if not current.get("agent"):
            return "", "no guest agent configured"
        try:
            self.client.post(f"{base}/agent/ping")
            interfaces = self.client.get(f"{base}/agent/network-get-interfaces")
        except ApiError as exc:
            if exc.status in (401, 403):
                # A privilege missing is not a guest still booting (NOTES lists the two apart).
                log.warning("%s: VM %s: the guest agent cannot be asked: %s",
                            self.name, vm["vmid"], exc)  # fmt: skip
                return "", f"guest agent not asked: {exc}"
            return "", "guest agent not up yet"  # not a fault: the guest is still booting
        for interface in (interfaces or {}).get("result", []):
            if interface.get("name") == "lo":
                continue
            for address in interface.get("ip-addresses", []):
                if address.get("ip-address-type") == "ipv4":
                    return str(address["ip-address"]), "guest agent up"
        return "", "guest agent up"

    def _ownable(self, identity: str) -> dict[str, Any]:
        vms, _ = self._resources()
        named = [v for v in vms if v.get("name") == identity and not v.get("template")]
        if not named:
            raise NotFound(f"no VM named {identity}")
        if len(named) > 1:
            raise Refused(f"{len(named)} VMs are named {identity}: none is touched")
        vm = self._finish_pending(identity, named[0])
        if self._mark(vm) is None:
            raise Refused(f"VM {vm['vmid']} ({identity}) carries no mark of ours: not touched")
        return vm

    def _unlocked(self, identity: str, vm: dict[str, Any]) -> dict[str, Any]:
        """Wait (bounded) for a clone's lock to go: a locked VM refuses to be deleted."""
        deadline = time.monotonic() + self.config.lock_wait
        while vm.get("lock") and time.monotonic() < deadline:
            time.sleep(0.2)
            found = self._find(identity, int(vm["vmid"]))
            if found is None:
                raise NotFound(f"no VM named {identity}")
            vm = found
        return vm


def missing_privileges(client: Client) -> Names:
    """Which of PRIVILEGES the client's token lacks, by name (GET /access/permissions)."""
    granted = client.get("/access/permissions")
    held: set[str] = set()
    for privileges in (granted or {}).values():
        held.update(p for p, v in privileges.items() if v)
    return [p for p in PRIVILEGES if p not in held and PVE8_EQUIVALENT.get(p) not in held]


def _lock_timeout(error: Exception) -> bool:
    return "got timeout" in str(error)


def _taken(error: Exception) -> bool:
    return "already exists" in str(error)
