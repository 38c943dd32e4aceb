"""A fake Proxmox cluster over real HTTPS and a provider pointed at it, for the tests of
issue 24 (MACH-18, FAKE-05). The certificates are made once per test session."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from fleet.providers.proxmox.fake import (
    Certificates,
    FakeProxmox,
    FakeProxmoxServer,
    make_certificates,
)
from fleet.providers.proxmox.provider import ProxmoxProvider

TOKEN_ID = "zoomies@pve!ctl"
SECRET = "5b1b7f9c-0d4e-4a8a-9e43-3f0c5f1e2a77"
TOKEN = f"{TOKEN_ID}={SECRET}"
FAST = {"task_seconds": 0.02, "clone_seconds": 0.05}


@cache
def certificates() -> Certificates:
    """Made once per process; their folder goes when the process ends."""
    folder = Path(tempfile.mkdtemp(prefix="test-pve-"))
    atexit.register(shutil.rmtree, folder, True)
    return make_certificates(folder)


def serve(**fake_options: Any) -> FakeProxmoxServer:
    fake = FakeProxmox(token=TOKEN_ID, secret=SECRET, **{**FAST, **fake_options})
    return FakeProxmoxServer(fake, certificates=certificates()).start()


def config(server: FakeProxmoxServer, **overrides: Any) -> dict[str, Any]:
    return {
        "endpoint": server.url,
        "token": TOKEN,
        "ca_file": str(server.certificates.ca_file),
        "template": 9000,
        "pool": "zoomies",
        "bridge": "vmbr0",
        "ciuser": "runner",
        "ssh_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOps operator@example"],
        "poll_interval": 0.02,
        "timeout": 5.0,
        **overrides,
    }


def provider(server: FakeProxmoxServer, cls: type[ProxmoxProvider] = ProxmoxProvider,
             **overrides: Any) -> ProxmoxProvider:  # fmt: skip
    return cls.from_config("pve", config(server, **overrides))
