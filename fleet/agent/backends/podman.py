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

import logging
import os

import docker.errors

from fleet.agent.backends.base import BackendError
from fleet.agent.backends.container import ContainerBackend

log = logging.getLogger("zoomies.agent")


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
    _cpu_factor_noted = False  # the warning below, once per backend

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

    def raise_memory(self, runner_id: int, limit_mb: int) -> None:
        """HOST-27 cannot be done here: Podman's compat API has no container update (404),
        so the valve says so as a refused raise and the runner keeps the limit it has."""
        raise BackendError(
            f"runner {runner_id}: Podman cannot raise a running container's memory limit "
            "(its API has no container update)"
        )

    def apply_cpu_factor(self, runner_id: int, factor: float) -> int:
        """HOST-20 is not applied on Podman: its compat API has no container update, and
        its own (libpod `containers/{name}/update`, Podman 4.3 here) answered 200 while the
        container's quota stayed as created, so a change could not be confirmed. A host's
        throttle still takes its slots (HOST-14); its runners keep their CPU figures."""
        if not self._cpu_factor_noted and factor < 1.0:
            self._cpu_factor_noted = True
            log.warning("podman: the CPU factor %.2f is not applied to running containers", factor)
        return 0
