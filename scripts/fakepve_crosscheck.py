#!/usr/bin/env python
"""A second opinion on our fake Proxmox: the Proxmox provider against fakepve (issue 24).

fakepve (PyPI, AGPL-3.0) is an independent fake of the Proxmox VE 9 API on aiohttp. This
script serves it on 127.0.0.1 (a free port) with its own certificate, which the provider
verifies (as a CA file; one step pins its SHA-256 fingerprint instead), and gives it what the
provider expects: node pve1, template 9000 with a cloud-init drive, the resource pool
"zoomies", an API token holding PRIVILEGES (those the fake's PVE knows), and a foreign VM in
our pool named like ours but without our mark. Then it drives ProxmoxProvider through
missing_privileges, check, create, inspect, list, stop, start and delete. The same steps run
against our own fake (fleet/providers/proxmox/fake.py), set up the same way.

It prints a table per fake (each step, its outcome, and every refusal the fake answered:
status, reason and body, or a task's exit status), then every difference between the two:
a step's outcome, or the answer one call got from fakepve and from ours.

fakepve stays out of the project's environment; it runs from a venv of its own:

    python3 -m venv /tmp/fakepve-venv
    /tmp/fakepve-venv/bin/pip install 'fakepve[crypto]==0.5.0' httpx
    PYTHONPATH=. /tmp/fakepve-venv/bin/python scripts/fakepve_crosscheck.py
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fakepve import FakePve
from fakepve.certs import make_cert
from fakepve.shapes import PRIVILEGES as KNOWN_TO_FAKEPVE

from fleet.providers.contract import MachineSpec, Mark, Observed, Power, Refused
from fleet.providers.proxmox.fake import FakeProxmox, FakeProxmoxServer, make_certificates
from fleet.providers.proxmox.provider import PRIVILEGES, ProxmoxProvider

NODE = "pve1"
TEMPLATE = 9000
POOL = "zoomies"
USER = "zoomies@pve"
TOKEN_ID = f"{USER}!ctl"
SECRET = "5b1b7f9c-0d4e-4a8a-9e43-3f0c5f1e2a77"
MARK = Mark("zoomies-abc123")
OURS = "zoomies-x1"
FOREIGN = "zoomies-stray"
FOREIGN_VMID = 150
FOREIGN_TAGS = "other-team"
SPEC = MachineSpec(
    identity=OURS,
    mark=MARK,
    bootstrap={"controller_url": "https://zoomies.example", "claim_code": "claim-0123"},
    size={"cpus": 2, "memory_mb": 2048},
)
GiB = 1024**3
# The template as a node stores it: a linked clone needs a base volume, cloud-init its drive.
TEMPLATE_CONFIG = {
    "cores": "2",
    "memory": "2048",
    "agent": "1",
    "ide2": "local-lvm:vm-9000-cloudinit,media=cdrom",
    "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0",
    "scsi0": "local-lvm:base-9000-disk-0,size=8G",
    "scsihw": "virtio-scsi-pci",
    "boot": "order=scsi0",
}
# What a create sets or a clone makes, read back from the VM's config.
CONFIG_KEYS = ("tags", "cores", "memory", "agent", "net0", "ide2", "ipconfig0", "ciuser", "sshkeys",
               "smbios1")  # fmt: skip
PATH_PARTS = (
    (re.compile(r"^/api2/json"), ""),
    (re.compile(r"/nodes/[^/]+"), "/nodes/{node}"),
    (re.compile(r"/qemu/\d+"), "/qemu/{vmid}"),
    (re.compile(r"/tasks/[^/]+"), "/tasks/{upid}"),
    (re.compile(r"/pools/[^/]+"), "/pools/{poolid}"),
)


class Unexpected(Exception):
    """A step ran, but its answer is not what the contract asks for."""


@dataclass(frozen=True)
class Call:
    """One answer the provider's client got: `reason` is the refusal's, or a failed task's
    exit status; empty for a plain success."""

    method: str
    path: str
    status: int
    reason: str
    body: str

    @property
    def refused(self) -> bool:
        return bool(self.reason)

    def __str__(self) -> str:
        return f"{self.method} {self.path} -> {self.status} {self.reason} {self.body}".rstrip()


@dataclass
class Row:
    step: str
    outcome: str  # "ok", "error" (the step raised) or "unexpected" (a wrong answer)
    detail: str
    calls: list[Call]


class Recorder:
    """Every answer a provider's client receives (an httpx response hook)."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def __call__(self, response: httpx.Response) -> None:
        response.read()
        path = response.request.url.path
        for pattern, replacement in PATH_PARTS:
            path = pattern.sub(replacement, path)
        reason, body = _refusal(response)
        self.calls.append(Call(response.request.method, path, response.status_code, reason, body))

    def since(self, start: int) -> list[Call]:
        return self.calls[start:]


def _refusal(response: httpx.Response) -> tuple[str, str]:
    if response.status_code != 200:
        return response.reason_phrase or "(no reason)", response.text.strip()[:300]
    data = response.json().get("data")
    ended = isinstance(data, dict) and data.get("status") == "stopped"
    if "/tasks/" in response.url.path and ended:
        exitstatus = str(data.get("exitstatus", ""))
        if exitstatus != "OK" and not exitstatus.startswith("WARNINGS"):
            return f"task ended: {exitstatus}", ""
    return "", ""


# -- the two fakes -------------------------------------------------------------------------


def set_up_fakepve(pve: FakePve) -> list[str]:
    """The cluster our provider expects; returns the PRIVILEGES fakepve's PVE does not know
    (a role cannot hold them, so the token is not granted them)."""
    lvm = pve.storages["local-lvm"].setdefault("volumes", {})
    lvm["base-9000-disk-0"] = {"content": "images", "format": "raw", "size": 8 * GiB,
                               "vmid": TEMPLATE, "ctime": 0}  # fmt: skip
    pve.add_vm(TEMPLATE, "runner-template", node=NODE, template=True,
               config={**TEMPLATE_CONFIG, "template": 1})  # fmt: skip
    pve.pools[POOL] = set()
    pve.pool_info[POOL] = {"comment": "runner hosts", "storage": set()}
    pve.add_vm(FOREIGN_VMID, FOREIGN, node=NODE, pool=POOL,
               config={"tags": FOREIGN_TAGS, "memory": "512"})  # fmt: skip
    pve.apitokens[TOKEN_ID] = SECRET
    granted = [p for p in PRIVILEGES if p in KNOWN_TO_FAKEPVE]
    pve.grant(USER, "/", *granted)  # a privilege-separated token: its user and itself
    pve.grant(TOKEN_ID, "/", *granted)
    return [p for p in PRIVILEGES if p not in KNOWN_TO_FAKEPVE]


@contextmanager
def fakepve_served(folder: Path) -> Iterator[dict[str, Any]]:
    """fakepve on an event loop of its own in a thread (it is asyncio; our client is not)."""
    folder.mkdir()
    certfile, keyfile, der = make_cert(str(folder), hosts=("127.0.0.1",))
    pve = FakePve(host="127.0.0.1", port=0)
    pve.time_scale = 0.01  # tasks end after their answer, as on a node
    unknown = set_up_fakepve(pve)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fakepve", daemon=True)
    thread.start()

    def run(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(30)

    try:
        run(pve.start(certfile, keyfile))
        yield {"endpoint": pve.url, "ca_file": certfile, "fingerprint": _pin(der),
               "unknown": unknown}  # fmt: skip
    finally:
        run(pve.stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@contextmanager
def ours_served(folder: Path) -> Iterator[dict[str, Any]]:
    """Our fake, set up as fakepve is."""
    fake = FakeProxmox(nodes={NODE: 8192}, token=TOKEN_ID, secret=SECRET,
                       task_seconds=0.02, clone_seconds=0.05)  # fmt: skip
    fake.add_token(TOKEN_ID, SECRET, set(PRIVILEGES))
    fake.vms[TEMPLATE].config.update(TEMPLATE_CONFIG)
    fake.add_vm(FOREIGN_VMID, name=FOREIGN, pool=POOL, tags=FOREIGN_TAGS,
                config={"memory": "512"})  # fmt: skip
    certificates = make_certificates(folder)
    server = FakeProxmoxServer(fake, certificates=certificates).start()
    try:
        yield {"endpoint": server.url, "ca_file": str(certificates.ca_file),
               "fingerprint": certificates.fingerprint, "unknown": []}  # fmt: skip
    finally:
        server.stop()


def _pin(der: bytes) -> str:
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def connect(served: dict[str, Any], recorder: Recorder, *, pinned: bool = False) -> ProxmoxProvider:
    trust = {"fingerprint": served["fingerprint"]} if pinned else {"ca_file": served["ca_file"]}
    made = ProxmoxProvider.from_config("crosscheck", {
        "endpoint": served["endpoint"], "token": f"{TOKEN_ID}={SECRET}", **trust,
        "template": TEMPLATE, "pool": POOL, "bridge": "vmbr0", "ciuser": "runner",
        "ssh_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOps operator@example"],
        "poll_interval": 0.02, "timeout": 10.0, "task_wait": 30.0,
    })  # fmt: skip
    # The client's own httpx.Client: where every answer can be seen, the client unchanged.
    made.client._http.event_hooks["response"].append(recorder)
    return made


# -- the steps -----------------------------------------------------------------------------


def steps(pve: ProxmoxProvider, pinned: ProxmoxProvider) -> list[tuple[str, Callable[[], str]]]:
    return [
        ("tls: pinned fingerprint", lambda: str(pinned.client.get("/version")["version"])),
        ("missing_privileges()", lambda: _none_expected(pve.missing_privileges())),
        ("check()", lambda: _none_expected(pve.check())),
        (f"create({OURS})", lambda: _describe(_ours(pve.create(SPEC), Power.RUNNING))),
        (f"inspect({OURS})", lambda: _describe(_ours(pve.inspect(OURS), Power.RUNNING))),
        (f"config of {OURS} (read back)", lambda: _config(pve)),
        ("list()", lambda: _listed(pve.list())),
        (f"stop({OURS})", lambda: _then(pve.stop, pve, Power.STOPPED)),
        (f"start({OURS})", lambda: _then(pve.start, pve, Power.RUNNING)),
        (f"delete({FOREIGN}) refused", lambda: _refused(pve.delete, FOREIGN)),
        (f"inspect({FOREIGN}) still there", lambda: _describe(_foreign(pve.inspect(FOREIGN)))),
        (f"delete({OURS})", lambda: _gone_after(pve)),
    ]


def _none_expected(problems: list[str]) -> str:
    if problems:
        raise Unexpected("; ".join(problems))
    return "none"


def _ours(observed: Observed | None, power: Power) -> Observed:
    if observed is None or not observed.ours(MARK) or observed.power != power:
        raise Unexpected(f"wanted ours and {power}, got {observed}")
    return observed


def _foreign(observed: Observed | None) -> Observed:
    if observed is None or observed.ours(MARK):
        raise Unexpected(f"wanted the foreign VM, not ours, got {observed}")
    return observed


def _describe(observed: Observed) -> str:
    mark = observed.mark.controller if observed.mark else "no mark"
    return f"{observed.power}, {mark}, address {observed.address or '-'}; {observed.detail}"


def _config(pve: ProxmoxProvider) -> str:
    """What the fake stored for the keys the create sets (and the clone's own MAC and uuid)."""
    vm = next(v for v in pve.client.get("/cluster/resources", type="vm") if v["name"] == OURS)
    config = pve.client.get(f"/nodes/{vm['node']}/qemu/{vm['vmid']}/config")
    return ", ".join(f"{key}={config.get(key, '-')}" for key in CONFIG_KEYS)


def _listed(found: list[Observed]) -> str:
    ours = {o.identity: o.ours(MARK) for o in found}
    if ours.get(OURS) is not True or ours.get(FOREIGN) is not False:
        raise Unexpected(f"wanted {OURS} ours and {FOREIGN} not ours, got {ours}")
    return ", ".join(f"{o.identity} {'ours' if o.ours(MARK) else 'NOT ours'} {o.power}"
                     for o in found)  # fmt: skip


def _then(action: Callable[[str], None], pve: ProxmoxProvider, power: Power) -> str:
    action(OURS)
    return _describe(_ours(pve.inspect(OURS), power))


def _refused(action: Callable[[str], None], identity: str) -> str:
    try:
        action(identity)
    except Refused as exc:
        return f"refused: {exc}"
    raise Unexpected(f"{identity} is not ours, and the call went through")


def _gone_after(pve: ProxmoxProvider) -> str:
    pve.delete(OURS)
    left = pve.inspect(OURS)
    if left is not None:
        raise Unexpected(f"still there: {left}")
    return "inspect: None"


def run_steps(served: dict[str, Any]) -> list[Row]:
    recorder = Recorder()
    pve, pinned = connect(served, recorder), connect(served, recorder, pinned=True)
    rows = []
    try:
        for name, step in steps(pve, pinned):
            start = len(recorder.calls)
            try:
                outcome, detail = "ok", step()
            except Unexpected as exc:
                outcome, detail = "unexpected", str(exc)
            except Exception as exc:  # every failure is a row of the table
                outcome, detail = "error", f"{type(exc).__name__}: {exc}"
            rows.append(Row(name, outcome, detail, recorder.since(start)))
    finally:
        pve.client.close()
        pinned.client.close()
    return rows


# -- the report ----------------------------------------------------------------------------


def table(title: str, rows: list[Row]) -> None:
    print(f"\n## {title}\n")
    print("| step | outcome | detail | refusals the fake answered |")
    print("|---|---|---|---|")
    for row in rows:
        refusals = "<br>".join(str(c) for c in row.calls if c.refused) or "-"
        print(f"| {row.step} | {row.outcome} | {row.detail} | {refusals} |")


def answers(calls: list[Call]) -> dict[str, set[str]]:
    """Each call's answers in one step: 'METHOD /path' -> {'200', '403 Permission ...'}."""
    found: dict[str, set[str]] = {}
    for call in calls:
        found.setdefault(f"{call.method} {call.path}", set()).add(
            f"{call.status} {call.reason}".rstrip()
        )
    return found


def differences(theirs: list[Row], ours: list[Row]) -> list[str]:
    found = []
    for their, our in zip(theirs, ours, strict=True):
        if (their.outcome, their.detail) != (our.outcome, our.detail):
            found.append(f"{their.step}: fakepve {their.outcome}: {their.detail}\n"
                         f"    ours    {our.outcome}: {our.detail}")  # fmt: skip
        a, b = answers(their.calls), answers(our.calls)
        for call in sorted(set(a) | set(b)):
            if a.get(call) != b.get(call):
                found.append(f"{their.step}: {call}: fakepve {_set(a.get(call))}; "
                             f"ours {_set(b.get(call))}")  # fmt: skip
    return found


def _set(answered: set[str] | None) -> str:
    return " / ".join(sorted(answered)) if answered else "not asked"


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="fakepve-crosscheck-") as folder:
        with fakepve_served(Path(folder) / "fakepve") as served:
            unknown = served["unknown"]
            theirs = run_steps(served)
        with ours_served(Path(folder) / "ours") as served:
            ours = run_steps(served)
    if unknown:
        print(f"fakepve (PVE 9) knows no privilege {', '.join(unknown)}: not granted there.")
    table("fakepve 0.5.0", theirs)
    table("our fake (fleet/providers/proxmox/fake.py)", ours)
    print("\n## Differences (fakepve, then ours)\n")
    for line in differences(theirs, ours) or ["none"]:
        print(f"- {line}")


if __name__ == "__main__":
    main()
