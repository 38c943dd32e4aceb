"""The NoCloud seed a rented machine's cloud-init reads (issue 24 item 2): a Proxmox guest
is given `ds=nocloud;s=<controller>/machines/seed/<claim code>/` in its SMBIOS serial, and
fetches `meta-data` and `user-data` there. The user-data starts the template's agent with
the machine's claim code, which it spends when it joins (capacity.machines).

The code is the only key: it is single-use, bound to the machine's name, and only its hash
is stored; a machine past bootstrapping (or one whose code was spent) has no seed.
"""

from __future__ import annotations

import json
from datetime import datetime

from capacity.machines import controller_url
from fleet.machines import claim_hash
from fleet.models import Machine
from fleet.states import MachineState as M
from runners.models import Pool

# The states in which a guest may still be booting and asking for its seed.
SEEDING = (M.CREATING, M.STARTING, M.BOOTSTRAPPING)
AGENT_ENV_FILE = "/etc/zoomies/agent.env"
DEFAULT_AGENT_BACKENDS = ("docker",)


def machine_for_seed(code: str) -> Machine | None:
    """The machine whose unspent claim code this is, while its guest may ask; else None."""
    if not code or len(code) > 200:
        return None
    return (
        Machine.objects.filter(claim_hash=claim_hash(code), state__in=SEEDING)
        .exclude(claim_hash="")
        .first()
    )


def meta_data(machine: Machine) -> str:
    """NoCloud's meta-data: the instance id cloud-init keys its once-per-instance work on."""
    return f"instance-id: {machine.name}\nlocal-hostname: {machine.name}\n"


def agent_backends(machine: Machine) -> list[str]:
    """The runner backend the guest's agent offers: that of the pool it was rented for
    (a template for rented hosts carries the engine), else Docker."""
    backend = Pool.objects.filter(pk=machine.pool_id).values_list("backend", flat=True).first()
    return [backend] if backend else list(DEFAULT_AGENT_BACKENDS)


def user_data(machine: Machine, code: str, *, now: datetime | None = None) -> str:
    """`#cloud-config` that starts the template's `zoomies-agent` as a transient systemd
    unit, joining with the claim code from a root-only environment file (never on a
    command line, where `ps` shows it). JSON is YAML, so the document is written as JSON."""
    argv = ["zoomies-agent", "--controller", controller_url(), "--name", machine.name]
    for backend in agent_backends(machine):
        argv += ["--backend", backend]
    config = {
        "hostname": machine.name,
        "write_files": [
            {
                "path": AGENT_ENV_FILE,
                "permissions": "0600",
                "owner": "root:root",
                "content": f"ZOOMIES_CLAIM_CODE={code}\n",
            }
        ],
        "runcmd": [
            [
                "systemd-run",
                "--unit=zoomies-agent",
                "--collect",
                f"--property=EnvironmentFile={AGENT_ENV_FILE}",
                *argv,
            ]  # fmt: skip
        ],
    }
    return "#cloud-config\n" + json.dumps(config, indent=2) + "\n"
