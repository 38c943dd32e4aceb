"""The Podman backend: each runner is a container, over Podman's Docker-compatible API.

Podman serves the Docker API (`podman system service`), so this is the shared
ContainerBackend (container.py) with Podman's names where the two differ:

* the socket: /run/podman/podman.sock for root, $XDG_RUNTIME_DIR/podman/podman.sock for a
  rootless user (the agent's user decides which it is);
* the CLI an operator types to read a runner's log: `podman logs`;
* a container name already in use: Docker answers 409, Podman 4 answers 500 with "already
  in use" in the message, and both mean the runner already has its workload (AGENT-24).
"""

from __future__ import annotations

import os

import docker.errors

from fleet.agent.backends.container import ContainerBackend


def default_podman_url(environ: dict[str, str] | None = None, uid: int | None = None) -> str:
    environ = dict(os.environ) if environ is None else environ
    uid = os.getuid() if uid is None else uid
    if uid == 0:
        return "unix:///run/podman/podman.sock"
    runtime = environ.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
    return f"unix://{runtime}/podman/podman.sock"


class PodmanBackend(ContainerBackend):
    name = "podman"
    engine = "Podman"
    cli = "podman"

    @property
    def default_url(self) -> str:  # type: ignore[override]
        return default_podman_url()

    def _is_name_clash(self, exc: docker.errors.APIError) -> bool:
        if exc.status_code == 409:
            return True
        detail = exc.explanation or ""
        if isinstance(detail, bytes):
            detail = detail.decode(errors="replace")
        return bool(exc.status_code == 500 and "already in use" in detail)
