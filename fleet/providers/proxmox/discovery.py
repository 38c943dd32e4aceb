"""What an operator chooses from when a Proxmox provider is saved (issue 24 item 4, MACH-22):
the cluster's nodes, templates, storages and pools as the onboarded token sees them, and the
privileges it lacks. Read-only: nothing here changes the cluster.

A privilege-separated token sees only what its ACLs allow (PVE/API2/Cluster.pm): a node's
memory needs Sys.Audit, a storage Datastore.Audit, a VM VM.Audit, a pool Pool.Audit. So an
empty list may mean "none" or "not allowed to see": `missing_privileges` tells which.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fleet.providers.proxmox.client import Client
from fleet.providers.proxmox.provider import missing_privileges

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class Discovery:
    nodes: Rows = field(default_factory=list)  # name, status, memory
    templates: Rows = field(default_factory=list)  # vmid, name, node
    storages: Rows = field(default_factory=list)  # storage, node, content, shared
    pools: Rows = field(default_factory=list)  # pool, comment
    missing_privileges: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def discover(client: Client) -> Discovery:
    """One look at the cluster: four reads, each a GET the API description holds."""
    everything = client.get("/cluster/resources") or []
    nodes = [
        {"node": str(r["node"]), "status": str(r.get("status", "unknown")),
         "maxmem": int(r.get("maxmem", 0)), "mem": int(r.get("mem", 0))}
        for r in everything if r.get("type") == "node"
    ]  # fmt: skip
    templates = [
        {"vmid": int(r["vmid"]), "name": str(r.get("name", "")), "node": str(r["node"])}
        for r in everything
        if r.get("type") == "qemu" and r.get("template")
    ]
    storages = [
        {"storage": str(r["storage"]), "node": str(r.get("node", "")),
         "content": str(r.get("content", "")), "shared": bool(r.get("shared", 0))}
        for r in everything if r.get("type") == "storage"
    ]  # fmt: skip
    pools = [
        {"pool": str(p["poolid"]), "comment": str(p.get("comment", ""))}
        for p in client.get("/pools") or []
    ]
    return Discovery(
        nodes=sorted(nodes, key=lambda n: n["node"]),
        templates=sorted(templates, key=lambda t: t["vmid"]),
        storages=sorted(storages, key=lambda s: (s["storage"], s["node"])),
        pools=sorted(pools, key=lambda p: p["pool"]),
        missing_privileges=missing_privileges(client),
    )
